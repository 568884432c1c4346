"""Writes benchmarks/RESULTS.md from the CSV files in benchmarks/results/ (one per benchmark script).

    python benchmarks/results_page.py            # rewrite RESULTS.md and the README's performance table
    python benchmarks/results_page.py --check    # exit 1 when either differs from the CSVs

Reads the CSVs with the standard library only, so it runs anywhere (no torch, no GPU); the
README table's last column reads tune.db.example through tunesvc's report (tunesvc installed).
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from collections import Counter
from collections import defaultdict
from collections.abc import Collection
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS_DIR = HERE / "results"
#: benchmarks/conformance.py's rows: its own layout (per library and run, not per kernel and shape)
CONFORMANCE_CSV = HERE / "data" / "conformance.csv"
REJECTIONS_CSV = HERE / "data" / "conformance_rejections.csv"
PAGE = HERE / "RESULTS.md"
README = HERE.parent / "README.md"
COMMAND = "python benchmarks/results_page.py"
#: the database whose `tune report` the README's table quotes beside the CSVs
EXAMPLE_DB = HERE.parent / "tune.db.example"

#: one row per (kernel, shape, peer, timing method) measured in one run; ratio = peer_ms / ours_ms
#: (> 1: tunesvc is faster). The *_rate columns hold the throughput a table reported (TFLOP/s or
#: GB/s) where a run recorded that instead of, or beside, the times. ``run`` names the script
#: invocation that wrote the row (its UTC start time), so two runs of one date stay apart; rows
#: from before the column have none, and their date stands for their run. ``tiles_per_sm``: the
#: output tiles of the timed config per SM (a GEMM's cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N) / SMs);
#: ``roofline``: the fraction of its roofline that ours reached (the bound's time / ours_ms);
#: ``config``: the config timed. Files written before those three have none (EARLIER_COLUMNS).
COLUMNS = (
    "date",
    "gpu",
    "driver",
    "torch",
    "triton",
    "kernel",
    "shape",
    "ours_ms",
    "peer",
    "peer_ms",
    "ratio",
    "timing_method",
    "ours_rate",
    "peer_rate",
    "rate_unit",
    "run",
    "tiles_per_sm",
    "roofline",
    "config",
)
#: the layout before tiles_per_sm, roofline and config: read with those empty, appended to as it is
EARLIER_COLUMNS = COLUMNS[: COLUMNS.index("run") + 1]

#: what each timing_method value means
TIMING_METHODS = {
    "do_bench": "`triton.testing.do_bench`: CUDA events around plain launches, L2 flushed before each, median",
    "cuda_graph": "launches replayed from a CUDA graph over copies of the inputs that together exceed L2 twice "
    "(`tunesvc.bench.graph_time`): GPU time, no host launch cost, no L2 hits between calls",
    "host_per_call": "host time per eager call: a loop of calls with no synchronisation inside it, on the "
    "host clock, median of interleaved rounds (benchmarks/launch_cost.py)",
    "eager_sync": "eager end to end per call: the same loop followed by a synchronisation (benchmarks/launch_cost.py)",
    "gpu_time": "GPU time of one call replayed back to back from a CUDA graph (`triton.testing.do_bench_cudagraph`), "
    "inputs as in the eager loop (benchmarks/launch_cost.py)",
    "bench_graph": "a sweep's graph timing (`tunesvc.bench.Bench`, timing graph): two configs' CUDA graphs over input "
    "copies replayed in turn, median (benchmarks/timing_modes.py)",
    "bench_eager": "a sweep's eager timing (`tunesvc.bench.Bench`, timing eager): two configs' loops of ordinary "
    "launches over input copies, one synchronisation per loop, taking turns, median (benchmarks/timing_modes.py)",
}


def columns_of(path: Path) -> tuple[str, ...]:
    """The layout of a results file: COLUMNS or EARLIER_COLUMNS; one sentence for any other."""
    with path.open(newline="") as f:
        header = tuple(next(csv.reader(f), ()))
    if header not in (COLUMNS, EARLIER_COLUMNS):
        raise SystemExit(f"{path}: columns {list(header)} are not {list(COLUMNS)}.")
    return header


def read_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a results file, each with every one of COLUMNS (those its layout lacks empty)."""
    columns_of(path)
    with path.open(newline="") as f:
        return [{**dict.fromkeys(COLUMNS, ""), **row} for row in csv.DictReader(f)]


def ratio_of(row: dict[str, str]) -> float | None:
    if row["ratio"]:
        return float(row["ratio"])
    if row["ours_ms"] and row["peer_ms"]:
        return float(row["peer_ms"]) / float(row["ours_ms"])
    return None


def _number(text: str) -> str:
    """A stored figure shown to 4 significant digits (the CSV keeps it whole)."""
    return f"{float(text):.4g}" if text else ""


def _ratio_text(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def _summary(files: dict[str, list[dict[str, str]]]) -> list[str]:
    """Per (kernel, peer, timing method): the ratios of its most recent date, over its shapes."""
    groups: dict[tuple[str, str, str], list[dict[str, str]]] = defaultdict(list)
    for rows in files.values():
        for row in rows:
            groups[(row["kernel"], row["peer"], row["timing_method"])].append(row)
    lines = [
        "| kernel | peer | timing | ratio: lowest / median / highest | rows | GPU | date |",
        "|---|---|---|---|---|---|---|",
    ]
    for (kernel, peer, method), rows in sorted(groups.items()):
        latest = max(r["date"] for r in rows)
        recent = [r for r in rows if r["date"] == latest]
        ratios = [v for v in (ratio_of(r) for r in recent) if v is not None]
        if not ratios:
            continue
        gpus = ", ".join(sorted({r["gpu"] for r in recent}))
        spread = " / ".join(_ratio_text(v) for v in (min(ratios), statistics.median(ratios), max(ratios)))
        lines.append(f"| {kernel} | {peer} | {method} | {spread} | {len(ratios)} | {gpus} | {latest} |")
    return lines


def _table(rows: list[dict[str, str]]) -> list[str]:
    # tiles per SM, roofline and config: only in the tables of files whose rows record them
    extra = any(r["tiles_per_sm"] or r["roofline"] or r["config"] for r in rows)
    lines = [
        "| date | kernel | shape | timing | ours ms | peer | peer ms | ratio | ours | peer's | GPU, driver, torch, Triton |"
        + (" tiles/SM | roofline | config |" if extra else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if extra else ""),
    ]
    for r in sorted(rows, key=lambda r: (r["kernel"], r["shape"], r["peer"], r["timing_method"], r["date"])):
        unit = f" {r['rate_unit']}" if r["rate_unit"] else ""
        ours_rate = f"{_number(r['ours_rate'])}{unit}" if r["ours_rate"] else ""
        peer_rate = f"{_number(r['peer_rate'])}{unit}" if r["peer_rate"] else ""
        lines.append(
            f"| {r['date']} | {r['kernel']} | {r['shape']} | {r['timing_method']} | {_number(r['ours_ms'])} | {r['peer']} "
            f"| {_number(r['peer_ms'])} | {_ratio_text(ratio_of(r))} | {ours_rate} | {peer_rate} "
            f"| {r['gpu']}, {r['driver']}, {r['torch']}, {r['triton']} |"
            + (f" {_number(r['tiles_per_sm'])} | {_share(r['roofline'])} | {r['config']} |" if extra else "")
        )
    return lines


def _share(text: str) -> str:
    return f"{float(text):.0%}" if text else ""


#: the held-out GEMM set's targets (benchmarks/gemm_heldout.py): geometric mean and lowest
GEMM_HELDOUT_TARGETS = (1.0, 0.9)


def _gemm_heldout(results_dir: Path) -> list[str]:
    """Per run of gemm_heldout.py (GPU time from CUDA graphs, shapes tuned in its database): the
    geometric mean and lowest against the targets, and each shape below the lowest target with the
    winner's tiles per SM and its roofline fraction (and cuBLAS's: ours times the ratio)."""
    path = results_dir / "gemm_heldout.csv"
    if not path.exists():
        return []
    runs: dict[tuple[str, str], list[dict[str, str]]] = defaultdict(list)
    for row in read_rows(path):
        if row["kernel"] == "matmul [held-out, exact]" and row["timing_method"] == "cuda_graph":
            runs[(row["run"] or row["date"], row["gpu"])].append(row)
    mean_target, low_target = GEMM_HELDOUT_TARGETS
    lines: list[str] = []
    for (run, gpu), rows in sorted(runs.items()):
        ratios = [v for v in (ratio_of(r) for r in rows) if v is not None]
        if not ratios:
            continue
        mean = statistics.geometric_mean(ratios)
        lines.append(
            f"- run {run}, {gpu}: {len(ratios)} shapes, cuBLAS / tuned geometric mean {mean:.3f}x "
            f"(target >= {mean_target}), lowest {min(ratios):.3f}x (target >= {low_target})"
        )
        for r in sorted(rows, key=lambda r: ratio_of(r) or 0.0):
            ratio = ratio_of(r)
            if ratio is None or ratio >= low_target:
                continue
            roofline = (
                f"reached {_share(r['roofline'])} of its roofline, cuBLAS {float(r['roofline']) / ratio:.0%}"
                if r["roofline"]
                else "recorded no roofline"
            )
            lines.append(
                f"  - {r['shape']}: {ratio:.3f}x; the winner ({r['config'] or 'config not recorded'}) has "
                f"{r['tiles_per_sm'] or '?'} output tiles per SM and {roofline}"
            )
    return lines


#: issue targets on held-out shapes: tuned / peer geometric mean and lowest, per kernel
HELDOUT_TARGETS = {"matmul": (1.0, 0.9), "decode": (1.0, 1.0), "attention": (0.9, 0.9)}
#: the runtime's untuned pick: within 5% of the tuned best on this share of shapes, never below
PICK_WITHIN, PICK_FLOOR = 0.9, 0.85


def _targets(results_dir: Path) -> list[str]:
    """The held-out targets against what heldout.csv and evaluate/*.csv measured, and by how much
    each is missed, with the shape that decides it."""
    lines: list[str] = []
    path = results_dir / "heldout.csv"
    if path.exists():
        rows = read_rows(path)
        runs = _by_run(rows)
        # per kernel and GPU model, its latest run there of those that tuned the most shapes (a
        # run of a few shapes, e.g. a ceiling's, does not stand for the set): tuned configs are
        # per model, so an untuned pick on a model the database holds no key of is the heuristic's
        gpu_of = {(kernel, run): next(iter(roles.values()))["gpu"] for (kernel, _, run), roles in runs.items()}
        tuned = Counter((kernel, run) for (kernel, _, run), roles in runs.items() if "tuned" in roles)
        latest: dict[tuple[str, str], tuple[str, str]] = {}
        for (kernel, run), gpu in gpu_of.items():
            held = latest.get((kernel, gpu))
            if held is None or (tuned[kernel, run], run) > (tuned[kernel, held], held):
                latest[kernel, gpu] = run
        by = {
            (kernel, gpu_of[kernel, run], shape): roles
            for (kernel, shape, run), roles in runs.items()
            if run == latest[kernel, gpu_of[kernel, run]]
        }
        misses: list[str] = []
        reasons_path = results_dir / "heldout_reasons.csv"
        reasons = read_rows(reasons_path) if reasons_path.exists() else []
        lines += [
            "Held-out shapes (`heldout.csv`, each kernel's latest run per GPU model): tuned / peer and the runtime's",
            "untuned pick (the selector's where it predicts, else the nearest tuned key's winner; none on a GPU",
            "model the database holds no tuned key of) / tuned, in GPU time.",
            "",
            "| kernel | run | GPU | shapes | tuned / peer: geomean (target) | lowest (target), at | pick within 5% of"
            f" tuned (target {PICK_WITHIN:.0%}) | worst pick / tuned (target {PICK_FLOOR}), at |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for kernel, gpu in sorted(latest):
            shapes = {
                shape: roles for (k, g, shape), roles in by.items() if (k, g) == (kernel, gpu) and "tuned" in roles
            }
            speed = {shape: float(r["tuned"]["peer_ms"]) / float(r["tuned"]["ours_ms"]) for shape, r in shapes.items()}
            pick = {
                shape: float(r["tuned"]["ours_ms"]) / float((r.get("selector") or r["nearest"])["ours_ms"])
                for shape, r in shapes.items()
                if "selector" in r or "nearest" in r
            }
            if not speed:
                continue
            mean_target, low_target = HELDOUT_TARGETS.get(kernel, (None, None))
            low_shape = min(speed, key=speed.__getitem__)
            worst_shape = min(pick, key=pick.__getitem__) if pick else None
            within = _share_within_5pct(pick.values()) if pick else None
            mean = statistics.geometric_mean(speed.values())
            best = {
                shape: float(r["tuned"]["ours_ms"]) / float(r["best candidate"]["ours_ms"])
                for shape, r in shapes.items()
                if "best candidate" in r
            }
            reach = (
                f"; the fastest of the selector's candidates was within 5% of tuned on {_share_within_5pct(best.values()):.0%}"
                f" of the {len(best)} shapes it was timed on (`heldout.py --candidates`)"
                if best
                else ""
            )
            low = shapes[low_shape]["tuned"]
            worst = (
                f"; the fastest of the selector's candidates ran at {best[worst_shape]:.3f} of tuned there"
                if worst_shape in best
                else ""
            )
            ceiling = _ceiling_notes([r for r in rows if r["gpu"] == gpu])
            why = _reasons(
                reasons,
                kernel,
                latest[kernel, gpu],
                speed,
                low_shape,
                (float(low["ours_ms"]), float(low["peer_ms"])),
                low_target,
            )
            checks = [
                ("tuned / peer geometric mean", mean, mean_target, why["mean"]),
                (
                    "lowest tuned / peer",
                    speed[low_shape],
                    low_target,
                    f" at {low_shape}{_bound_of(low)}{ceiling.get((kernel, low_shape), '')}{why['lowest']}",
                ),
                ("share of picks within 5% of tuned", within, PICK_WITHIN, reach),
                (
                    "worst pick / tuned",
                    pick[worst_shape] if worst_shape else None,
                    PICK_FLOOR,
                    f" at {worst_shape}{worst}",
                ),
            ]
            misses += [
                _missed(kernel, gpu, what, value, goal, where)
                for what, value, goal, where in checks
                if value is not None and goal is not None and value < goal
            ]
            lines.append(
                f"| {kernel} | {_run_text(latest[kernel, gpu])} | {gpu} | {len(speed)} "
                f"| {mean:.3f}x ({_goal(mean_target)}) "
                f"| {speed[low_shape]:.3f}x ({_goal(low_target)}), {low_shape} "
                f"| {'-' if within is None else f'{within:.0%}'} "
                f"| {'-' if worst_shape is None else f'{pick[worst_shape]:.3f}, {worst_shape}'} |"
            )
        for gpu in sorted({g for _, g in latest}):
            if (row := _forward_backward(by, latest, gpu)) is not None:
                line, missed = row
                lines.append(line)
                misses += missed
        lines.append("")
        if misses:
            lines += [
                "Missed, and by how much (a ceiling run says whether the space or the short search falls short):",
                "",
            ]
            lines += [*misses, ""]
        lines += _ceilings(rows)
    for path in sorted((results_dir / "evaluate").glob("*.csv")) if (results_dir / "evaluate").is_dir() else []:
        with path.open(newline="") as f:  # `tune evaluate --csv`'s own layout
            rows = list(csv.DictReader(f))
        last_date = max(r["timestamp"][:10] for r in rows)
        # the file keeps every run; the page shows the last date's, the last row per key (a key
        # measured twice that date, by two runs, counts once: as the later run measured it)
        rows = list({(r["kernel"], r["shape_key"]): r for r in rows if r["timestamp"][:10] == last_date}.values())
        lines += [
            f"Leave one tuned shape out (`evaluate/{path.name}`, `tune evaluate`, run of "
            f"{last_date}): the held-out key's tuned best / the pick, measured.",
            "",
            "| kernel | held out | selector within 5% | selector worst, at | nearest within 5% | nearest worst, at |",
            "|---|---|---|---|---|---|",
        ]
        for kernel in sorted({r["kernel"] for r in rows}):
            mine = [r for r in rows if r["kernel"] == kernel]
            cells = []
            for side in ("selector", "nearest"):
                ratios = {r["shape_key"]: float(r[f"{side}_ratio"]) for r in mine if r[f"{side}_ratio"]}
                worst = min(ratios, key=ratios.__getitem__)
                cells += [
                    f"{_share_within_5pct(ratios.values()):.0%}",
                    f"{ratios[worst]:.3f}, {worst}",
                ]
            lines.append(f"| {kernel} | {len(mine)} | {' | '.join(cells)} |")
        lines.append("")
    return lines


#: transferred configs (benchmarks/transfer.py): within 5% of the config tuned on the GPU itself on
#: this share of the held-out shapes, never below this fraction of it
TRANSFER_WITHIN, TRANSFER_FLOOR = 0.8, 0.85
#: what the chain serves in mode lookup from a sibling's winners (benchmarks/transfer.py's "served"):
#: at least this fraction of the heuristic's speed on every held-out shape, and this geometric mean
SERVED_FLOOR, SERVED_MEAN = 0.95, 1.0


def _transfer_targets(results_dir: Path) -> list[str]:
    """transfer.csv's latest run per GPU model: the transferred config, this GPU's own nearest
    answer and the heuristic against the config tuned there, and each against cuBLAS; the
    targets and by how much each is missed; and how often the transferred config beat the
    nearest one, the measurement that places the tier after or before this GPU's own answers."""
    path = results_dir / "transfer.csv"
    if not path.exists():
        return []
    runs = _by_run(read_rows(path))
    latest: dict[str, tuple[str, str]] = {}
    for (_, _, run), roles in runs.items():
        if "tuned" in roles:  # a --served-only run tunes nothing: its own section below
            gpu = next(iter(roles.values()))["gpu"]
            latest[gpu] = max(latest.get(gpu, run), run)
    served = _served_targets(runs)
    if not latest:
        return served
    lines = [
        "A sibling GPU model's winners on a new one (`transfer.csv`, `benchmarks/transfer.py`, each GPU model's latest",
        "run): per held-out GEMM, the time of the config a short sweep tuned on that GPU / the config's time",
        "(1: as fast as tuned), and cuBLAS's time / the config's (geometric means). Targets: transferred within 5% of",
        f"tuned on {TRANSFER_WITHIN:.0%} of the shapes, never below {TRANSFER_FLOOR}.",
        "",
        "| GPU | run | shapes | config | within 5% of tuned | worst / tuned, at | geomean / tuned | geomean vs cuBLAS |",
        "|---|---|---|---|---|---|---|---|",
    ]
    misses, order = [], []
    for gpu, run in sorted(latest.items()):
        shapes = {
            shape: roles
            for (_, shape, r), roles in runs.items()
            if r == run and "tuned" in roles and next(iter(roles.values()))["gpu"] == gpu
        }
        for role in ("transferred", "nearest tuned here", "heuristic", "tuned"):
            mine = {shape: roles for shape, roles in shapes.items() if role in roles}
            if not mine:
                continue
            ms = {shape: float(roles[role]["ours_ms"]) for shape, roles in mine.items()}
            vs_tuned = {shape: float(roles["tuned"]["ours_ms"]) / ms[shape] for shape, roles in mine.items()}
            vs_peer = [float(roles[role]["peer_ms"]) / ms[shape] for shape, roles in mine.items()]
            worst = min(vs_tuned, key=vs_tuned.__getitem__)
            within = _share_within_5pct(vs_tuned.values())
            lines.append(
                f"| {gpu} | {_run_text(run)} | {len(mine)} | {role} "
                f"| {'-' if role == 'tuned' else f'{within:.0%}'} "
                f"| {'-' if role == 'tuned' else f'{vs_tuned[worst]:.3f}, {worst}'} "
                f"| {statistics.geometric_mean(vs_tuned.values()):.3f}x "
                f"| {statistics.geometric_mean(vs_peer):.3f}x |"
            )
            if role == "transferred":
                if within < TRANSFER_WITHIN:
                    misses.append(
                        f"- {gpu}, transferred within 5% of tuned: {within:.0%} of the shapes, "
                        f"{within / TRANSFER_WITHIN:.0%} of the target {TRANSFER_WITHIN:.0%}"
                    )
                if vs_tuned[worst] < TRANSFER_FLOOR:
                    misses.append(
                        f"- {gpu}, worst transferred / tuned: {vs_tuned[worst]:.3f} at {worst}, "
                        f"{vs_tuned[worst] / TRANSFER_FLOOR:.0%} of the target {TRANSFER_FLOOR}"
                    )
        both = [roles for roles in shapes.values() if "transferred" in roles and "nearest tuned here" in roles]
        if both:
            faster = sum(
                float(r["transferred"]["ours_ms"]) < float(r["nearest tuned here"]["ours_ms"]) / 1.02 for r in both
            )
            slower = sum(
                float(r["nearest tuned here"]["ours_ms"]) < float(r["transferred"]["ours_ms"]) / 1.02 for r in both
            )
            ratio = statistics.geometric_mean(
                float(r["nearest tuned here"]["ours_ms"]) / float(r["transferred"]["ours_ms"]) for r in both
            )
            order.append(
                f"- {gpu}: of {len(both)} shapes with both, the transferred config ran more than 2% faster than "
                f"this GPU's own nearest answer on {faster} and more than 2% slower on {slower} (nearest / "
                f"transferred time, geometric mean {ratio:.3f}); the runtime asks its own nearest key first"
            )
    lines.append("")
    if misses:
        lines += ["Missed, and by how much:", "", *misses, ""]
    if order:
        lines += ["Transferred against this GPU's own nearest answer (the order of the two tiers):", "", *order, ""]
    return lines + served


def _served_targets(runs: dict[tuple[str, str, tuple[str, str]], dict[str, dict[str, str]]]) -> list[str]:
    """transfer.csv's latest run per GPU model with "served" rows: what the chain serves in mode
    lookup, and the sibling's winner served blind ("transferred"), against the heuristic, per
    held-out GEMM; the targets and by how much each is missed."""
    latest: dict[str, tuple[str, str]] = {}
    for (_, _, run), roles in runs.items():
        if "served" in roles and "heuristic" in roles:
            gpu = roles["served"]["gpu"]
            latest[gpu] = max(latest.get(gpu, run), run)
    if not latest:
        return []
    lines = [
        "What the chain serves in mode lookup from a sibling's winners (`transfer.csv`, `benchmarks/transfer.py`,",
        "each GPU model's latest run with it): per held-out GEMM, the heuristic's time / the config's (1: as fast as",
        "the heuristic). `served`: the sibling's winner where the sibling's own trials say it beat the heuristic",
        "there, else the heuristic; `transferred`: the sibling's winner, served blind. Targets: served at least",
        f"{SERVED_FLOOR}x the heuristic on every shape and {SERVED_MEAN}x on average (geometric mean).",
        "",
        "| GPU | run | shapes | config | worst / heuristic, at | below the floor | geomean / heuristic |",
        "|---|---|---|---|---|---|---|",
    ]
    misses = []
    for gpu, run in sorted(latest.items()):
        shapes = {
            shape: roles
            for (_, shape, r), roles in runs.items()
            if r == run and "served" in roles and "heuristic" in roles and roles["served"]["gpu"] == gpu
        }
        for role in ("served", "transferred"):
            vs = {
                shape: float(roles["heuristic"]["ours_ms"]) / float(roles[role]["ours_ms"])
                for shape, roles in shapes.items()
                if role in roles
            }
            if not vs:
                continue
            worst = min(vs, key=vs.__getitem__)
            mean = statistics.geometric_mean(vs.values())
            below = sum(v < SERVED_FLOOR for v in vs.values())
            lines.append(
                f"| {gpu} | {_run_text(run)} | {len(vs)} | {role} | {vs[worst]:.3f}, {worst} | {below} | {mean:.3f}x |"
            )
            if role == "served" and vs[worst] < SERVED_FLOOR:
                misses.append(
                    f"- {gpu}, worst served / heuristic: {vs[worst]:.3f} at {worst}, "
                    f"{vs[worst] / SERVED_FLOOR:.0%} of the target {SERVED_FLOOR}"
                )
            if role == "served" and mean < SERVED_MEAN:
                misses.append(
                    f"- {gpu}, served / heuristic geometric mean: {mean:.3f}, {mean / SERVED_MEAN:.0%} of the "
                    f"target {SERVED_MEAN}"
                )
    lines.append("")
    if misses:
        lines += ["Missed, and by how much:", "", *misses, ""]
    return lines


#: adopt.csv's targets: adopted within 3% of the config tuned here on 90% of the keys, never below
#: 0.9x of it; the 8-trial warm-started sweep within 2% of the exhaustive best on 80% of its keys;
#: the whole adoption (adopt_runs.csv) in at most 180 s
ADOPT_WITHIN, ADOPT_SHARE, ADOPT_FLOOR, WARM_WITHIN, WARM_SHARE, ADOPT_SECONDS = 0.03, 0.9, 0.9, 0.02, 0.8, 180.0
ADOPT_RUNS_CSV = HERE / "data" / "adopt_runs.csv"


def _adopt_targets(results_dir: Path, runs_csv: Path = ADOPT_RUNS_CSV) -> list[str]:
    """adopt.csv per GPU model, each key as its latest run timed it (runs of a few kernels, each
    resuming the steps, re-time some keys and add others): per label (adopted, the sibling's
    winner served blind, the heuristic, the 8-trial sweep), how many keys lie within the target of
    the config tuned here, the worst, the geometric mean; adopt_runs.csv's latest wall time; what
    is missed. Each ratio is of one run's side-by-side timing."""
    path = results_dir / "adopt.csv"
    if not path.exists() and not runs_csv.exists():
        return []
    rows = read_rows(path) if path.exists() else []
    # (GPU, labelled kernel, shape) -> the row of the latest run that timed it
    keyed: dict[tuple[str, str, str], dict[str, str]] = {}
    for r in rows:
        at = (r["gpu"], r["kernel"], r["shape"])
        if at not in keyed or _run_of(r) >= _run_of(keyed[at]):
            keyed[at] = r
    lines = [
        "Another GPU model's winners on a new one (`benchmarks/adopt.py`, `adopt.csv`, each key as its latest",
        "run timed it): per key, the time of the config tuned on this GPU (every feasible config where there",
        "are at most 100, else 32 Optuna trials) / the labelled config's time, timed side by side in one run",
        f"(1: as fast as tuned here). Targets: adopted within {ADOPT_WITHIN:.0%} on {ADOPT_SHARE:.0%} of the keys and never",
        f"below {ADOPT_FLOOR}x; the 8-trial sweep (keys swept whole only) within {WARM_WITHIN:.0%} on {WARM_SHARE:.0%} of them;",
        f"the whole adoption in at most {ADOPT_SECONDS:.0f} s.",
        "",
    ]
    if rows:
        lines += [
            "| GPU | runs (latest) | config | keys | within target | worst, at | geomean |",
            "|---|---|---|---|---|---|---|",
        ]
    else:
        lines.append("No key has been timed side by side yet (`adopt.csv` holds no rows).")
    misses = []
    for gpu in sorted({g for g, _, _ in keyed}):
        mine = [r for (g, _, _), r in keyed.items() if g == gpu]
        for label in dict.fromkeys(r["kernel"].partition(" [")[2].rstrip("]") for r in mine):
            labelled = [r for r in mine if r["kernel"].endswith(f"[{label}]") and r["ratio"]]
            ratios = {f"{r['kernel'].partition(' [')[0]} {r['shape']}": float(r["ratio"]) for r in labelled}
            if not ratios:
                continue
            runs = {_run_of(r) for r in labelled}
            within = WARM_WITHIN if label == "8 trials" else ADOPT_WITHIN
            share = sum(v >= 1 / (1 + within) for v in ratios.values()) / len(ratios)
            worst = min(ratios, key=ratios.__getitem__)
            lines.append(
                f"| {gpu} | {len(runs)} ({_run_text(max(runs))}) | {label} | {len(ratios)} "
                f"| {share:.0%} within {within:.0%} "
                f"| {ratios[worst]:.3f}, {worst} | {statistics.geometric_mean(ratios.values()):.3f} |"
            )
            if label == "adopted" and share < ADOPT_SHARE:
                misses.append(
                    f"- {gpu}, adopted within {ADOPT_WITHIN:.0%}: {share:.0%} of the keys, target {ADOPT_SHARE:.0%}"
                )
            if label == "adopted" and ratios[worst] < ADOPT_FLOOR:
                misses.append(
                    f"- {gpu}, worst adopted / tuned here: {ratios[worst]:.3f} at {worst}, target {ADOPT_FLOOR}"
                )
            if label == "8 trials" and share < WARM_SHARE:
                misses.append(
                    f"- {gpu}, 8 trials within {WARM_WITHIN:.0%}: {share:.0%} of the keys, target {WARM_SHARE:.0%}"
                )
    lines.append("")
    if runs_csv.exists():
        with runs_csv.open(newline="") as f:
            walls = list(csv.DictReader(f))
        for gpu in sorted({w["gpu"] for w in walls}):
            w = [x for x in walls if x["gpu"] == gpu][-1]
            lines.append(
                f"`tune adopt` of {w['keys']} keys on the {gpu} ({w['date']}, from the {w['from_device']}, Triton cache "
                f"{w['triton_cache']}): {w['adopted']} adopted, {w['candidates']} candidates measured, {float(w['seconds']):.0f} s."
            )
            if float(w["seconds"]) > ADOPT_SECONDS:
                misses.append(f"- {gpu}, the whole adoption: {float(w['seconds']):.0f} s, target {ADOPT_SECONDS:.0f} s")
        lines.append("")
    if misses:
        lines += ["Missed, and by how much:", "", *misses, ""]
    return lines


#: launch cost: a shipped kernel's host time per eager call at most 1.2x its torch peer's, a
#: @tunesvc.autotune hit at most 1.0x a bare kernel[grid] launch (ratio = peer / ours)
LAUNCH_TARGETS = {"@tunesvc.autotune hit": 1.0, "@tunesvc.autotune(space=) hit": 1.0}
LAUNCH_FAMILY_TARGET = 1 / 1.2


def _launch_targets(results_dir: Path) -> list[str]:
    """Host time per eager call against the launch-cost targets, per kernel: judged on the latest
    run (the targets ask for one run), with the lowest and median peer / ours ratio over the runs
    of that run's date beside it (runs of an earlier launch path included), and by how much a
    target is missed."""
    path = results_dir / "launch_cost.csv"
    if not path.exists():
        return []
    rows = [r for r in read_rows(path) if r["timing_method"] == "host_per_call"]
    if not rows:
        return []
    run = max(_run_of(r) for r in rows)
    latest: dict[str, float] = {}
    day: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if _run_of(r)[0] == run[0] and (value := ratio_of(r)) is not None:
            day[r["kernel"]].append(value)
            if _run_of(r) == run:
                latest[r["kernel"]] = value
    lines = [
        f"Host time per eager call (run {_run_text(run)}, `launch_cost.csv`, `host_per_call`): peer / ours in that",
        f"run, and the lowest and median over the runs of {run[0]}; the target is ours at most 1.2x the torch",
        "peer's host time (ratio >= 0.833), and a @tunesvc.autotune hit at most a bare `kernel[grid]` launch's (ratio >= 1).",
        "",
        "| kernel | this run | runs of the date | lowest | median | target | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for kernel, value in sorted(latest.items()):
        if kernel == "DirectLaunch hit":
            continue  # a component of the hits above, not a target of its own
        target = LAUNCH_TARGETS.get(kernel, LAUNCH_FAMILY_TARGET)
        values = day[kernel]
        verdict = "yes" if value >= target else f"no: {value / target:.0%} of the target"
        lines.append(
            f"| {kernel} | {value:.3f} | {len(values)} | {min(values):.3f} | {statistics.median(values):.3f} "
            f"| >= {target:.3f} | {verdict} |"
        )
    return [*lines, "", *_eager_targets(results_dir, run)]


#: eager end to end at least 0.9x the torch peer wherever GPU time is at parity (within 5%)
EAGER_TARGET, GPU_PARITY = 0.9, 0.95


def _eager_targets(results_dir: Path, run: tuple[str, str]) -> list[str]:
    """Eager end to end (``eager_sync``) against its target in ``run``, beside the GPU-time ratio
    of the same run (``gpu_time``), which says whether the target applies, and the lowest eager
    ratio over the runs of its date."""
    rows = [r for r in read_rows(results_dir / "launch_cost.csv") if _run_of(r)[0] == run[0]]
    by: dict[tuple[str, str], float] = {}
    day: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if r["timing_method"] in ("eager_sync", "gpu_time") and (value := ratio_of(r)) is not None:
            if _run_of(r) == run:
                by[r["kernel"], r["timing_method"]] = value
            if r["timing_method"] == "eager_sync":
                day[r["kernel"]].append(value)
    kernels = sorted({k for k, m in by if m == "gpu_time" and (k, "eager_sync") in by})
    if not kernels:
        return []
    lines = [
        f"Eager end to end (`eager_sync`) and GPU time (`gpu_time`), peer / ours in run {_run_text(run)}, and the",
        f"lowest eager ratio over the runs of {run[0]}; the target is eager at least {EAGER_TARGET}x the peer where",
        f"GPU time is at parity (ratio >= {GPU_PARITY}).",
        "",
        "| kernel | GPU time | at parity | eager end to end | lowest of the date | met |",
        "|---|---|---|---|---|---|",
    ]
    for kernel in kernels:
        gpu, eager = by[kernel, "gpu_time"], by[kernel, "eager_sync"]
        parity = gpu >= GPU_PARITY
        if not parity:
            verdict = "not applicable"
        else:
            verdict = "yes" if eager >= EAGER_TARGET else f"no: {eager / EAGER_TARGET:.0%} of the target"
        lines.append(
            f"| {kernel} | {gpu:.3f} | {'yes' if parity else 'no'} | {eager:.3f} | {min(day[kernel]):.3f} | {verdict} |"
        )
    return [*lines, ""]


def _run_of(row: dict[str, str]) -> tuple[str, str]:
    """The run that wrote a row, in the order runs happened: (the run's date, run), so that a run
    past midnight stays one; a row from before the run column has an empty run, so its date's
    runs count as one, older than that date's named ones."""
    return row["run"][:10] or row["date"], row["run"]


def _run_text(run: tuple[str, str]) -> str:
    return run[1] or run[0]


#: attention's forward+backward against SDPA's, on every held-out shape (issue 57)
FORWARD_BACKWARD_FLOOR = 0.8


def _forward_backward(
    by: dict[tuple[str, str, str], dict[str, dict[str, str]]], latest: dict[tuple[str, str], tuple[str, str]], gpu: str
) -> tuple[str, list[str]] | None:
    """The held-out table's row for attention forward+backward on ``gpu``: per shape whose forward
    and backward were both tuned and timed in one run (the latest of each), the peers' summed
    time over ours; with the miss of its floor, if any. None where no run timed both."""
    run = latest.get(("attention", gpu))
    if run is None or latest.get(("attention_bwd", gpu)) != run:
        return None
    speed = {}
    for (kernel, g, shape), roles in by.items():
        backward = by.get(("attention_bwd", g, shape), {}).get("tuned")
        if kernel == "attention" and g == gpu and "tuned" in roles and backward is not None:
            forward = roles["tuned"]
            peer = float(forward["peer_ms"]) + float(backward["peer_ms"])
            speed[shape] = peer / (float(forward["ours_ms"]) + float(backward["ours_ms"]))
    if not speed:
        return None
    low = min(speed, key=speed.__getitem__)
    mean = statistics.geometric_mean(speed.values())
    line = (
        f"| attention forward+backward | {_run_text(run)} | {gpu} | {len(speed)} | {mean:.3f}x (-) "
        f"| {speed[low]:.3f}x ({_goal(FORWARD_BACKWARD_FLOOR)}), {low} | - | - |"
    )
    floor = FORWARD_BACKWARD_FLOOR
    missed = [_missed("attention forward+backward", gpu, "lowest tuned / peer", speed[low], floor, f" at {low}")]
    return line, missed if speed[low] < floor else []


def _by_run(rows: list[dict[str, str]]) -> dict[tuple[str, str, tuple[str, str]], dict[str, dict[str, str]]]:
    """heldout.csv's rows by (kernel, shape, run), then by pick: its kernel column reads
    "matmul [tuned]", "matmul [selector]" ..."""
    by: dict[tuple[str, str, tuple[str, str]], dict[str, dict[str, str]]] = defaultdict(dict)
    for r in rows:
        base, _, role = r["kernel"].partition(" [")
        by[(base, r["shape"], _run_of(r))][role.rstrip("]")] = r
    return by


def _ceiling_runs(rows: list[dict[str, str]]) -> list[tuple[str, str, str, str, float, float, str]]:
    """(kernel, shape, run, trials, tuned / peer, space best / peer, GPU) of each 'space best of
    N' row (heldout.py --ceiling) beside its run's tuned row, oldest first."""
    runs = []
    for (kernel, shape, run), roles in sorted(_by_run(rows).items(), key=lambda item: (item[0][2], item[0][:2])):
        for role, r in roles.items():
            if role.startswith("space best of ") and "tuned" in roles:
                tuned = float(roles["tuned"]["peer_ms"]) / float(roles["tuned"]["ours_ms"])
                best = float(r["peer_ms"]) / float(r["ours_ms"])
                trials = role.removeprefix("space best of ")
                runs.append((kernel, shape, _run_text(run), trials, tuned, best, r["gpu"]))
    return runs


def _ceilings(rows: list[dict[str, str]]) -> list[str]:
    """Shapes with a 'space best of N' row (heldout.py --ceiling), from any run: the short sweep's
    winner and the best of N trials of the space, each / the peer, in the same run."""
    lines = [
        f"| {kernel} | {date} | {gpu} | {shape} | {tuned:.3f}x | {best:.3f}x | {trials} |"
        for kernel, shape, date, trials, tuned, best, gpu in sorted(_ceiling_runs(rows))
    ]
    if not lines:
        return []
    return [
        "What the space holds (`heldout.py --ceiling`): the short sweep's winner and the best of a random",
        "sweep of many more trials of the same space, each / the peer, timed in the same run.",
        "",
        "| kernel | run | GPU | shape | tuned / peer | space best / peer | trials |",
        "|---|---|---|---|---|---|---|",
        *lines,
        "",
    ]


def _ceiling_notes(rows: list[dict[str, str]]) -> dict[tuple[str, str], str]:
    """Per (kernel, shape) with a ceiling run in ``rows`` (the latest): what the best of its many
    random trials reached against the short sweep's winner, as a clause for a missed target."""
    return {
        (kernel, shape): f"; the best of {trials} random trials of the space reached {best:.3f}x there, "
        f"the short sweep's winner {tuned:.3f}x ({date})"
        for kernel, shape, date, trials, tuned, best, _ in _ceiling_runs(rows)
    }


def _reasons(
    rows: list[dict[str, str]],
    kernel: str,
    run: tuple[str, str],
    speed: dict[str, float],
    low_shape: str,
    low_ms: tuple[float, float],
    low_target: float | None,
) -> dict[str, str]:
    """Clauses from heldout_reasons.csv (rows of the held-out table's own run) for a missed
    target: "mean", the tuned kernel against each named peer (e.g. each SDPA backend) as a
    geometric mean over the run's shapes, and tuned / peer (``speed``, by shape) with each
    shape's M rounded up to its tuned config's BLOCK_M where it was timed so; "lowest", the
    tuned config and the peer at the lowest shape's M rounded up to the config's BLOCK_M,
    against their times at the shape itself (``low_ms``: ours, the peer's), and whether padding
    alone explains missing ``low_target``; both also give tuned / peer as the sweeps timed them,
    where they were recorded (whether the sweep's timing agreed with this run's)."""
    mine = [r for r in rows if _run_of(r) == run and r["kernel"].partition(" [")[0] == kernel]
    by_peer: dict[str, list[float]] = defaultdict(list)
    ran: set[str] = set()
    rounded_up: dict[str, tuple[dict[str, str], float]] = {}  # held-out shape -> (row, ratio) at M rounded up
    swept: dict[str, float] = {}  # held-out shape -> tuned / peer as its sweep timed them
    for r in mine:
        role = r["kernel"].partition(" [")[2].rstrip("]")
        if (ratio := ratio_of(r)) is None:
            continue
        if role == "tuned, as its sweep timed it" and r["shape"] in speed:
            swept[r["shape"]] = ratio
        elif role == "tuned" and r["peer"].startswith("torch SDPA, default: "):
            ran.add(r["peer"].removeprefix("torch SDPA, default: "))
        elif role == "tuned":
            by_peer[r["peer"]].append(ratio)
        elif role.endswith("rounded up to BLOCK_M"):
            rounded_up.update((shape, (r, ratio)) for shape in speed if _rounded_of(r["shape"], shape, role))
    rounded = ""
    if low_shape in rounded_up:
        r, ratio = rounded_up[low_shape]
        padded, own = r["shape"].split(",")[0], low_shape.split(",")[0]
        slower = (float(r["ours_ms"]) / low_ms[0], float(r["peer_ms"]) / low_ms[1])
        rest = (
            "so the padding rows its tiles compute, which the peer's do not, account for the miss"
            if low_target is None or ratio >= low_target
            else f"so its tiles compute the padding rows, and below {low_target} at {padded} too, the rest"
            " of the gap is the kernel's at that size"
        )
        rounded = (
            f"; with M rounded up to the tuned config's BLOCK_M ({padded}), the same config ran at"
            f" {ratio:.3f}x the peer in that run, taking {slower[0]:.2f}x its time at {own} and the peer"
            f" {slower[1]:.2f}x: {rest}"
        )
    if low_shape in swept:
        rounded += f"; its sweep had timed the same config at {swept[low_shape]:.3f}x the peer"
    mean = "; ".join(f"{peer} {statistics.geometric_mean(v):.3f}x" for peer, v in sorted(by_peer.items()))
    if mean:
        mean = f"; tuned / {mean} (geometric means, same run)"
        if ran:
            mean += f", SDPA's default ran {', '.join(sorted(ran))}"
    if rounded_up:
        padded_speed = [rounded_up[s][1] if s in rounded_up else v for s, v in speed.items()]
        mean += (
            f"; with M rounded up to the tuned config's BLOCK_M ({len(rounded_up)} of the {len(speed)} shapes; the"
            f" rest as they are), tuned / peer geometric mean {statistics.geometric_mean(padded_speed):.3f}x"
            f" in that run, against {statistics.geometric_mean(speed.values()):.3f}x: the difference is what"
            " computing the padding rows costs ours against the peer"
        )
    if swept:
        mean += (
            f"; as the sweeps timed them, tuned / peer geometric mean {statistics.geometric_mean(swept.values()):.3f}x"
            f" over {len(swept)} of the {len(speed)} shapes, against"
            f" {statistics.geometric_mean(speed[s] for s in swept):.3f}x timed here"
        )
    return {"mean": mean, "lowest": rounded}


def _missed(kernel: str, gpu: str, what: str, value: float, goal: float, where: str) -> str:
    """A held-out miss line; its share of the target rounded down, so a miss never reads as 100%."""
    return f"- {kernel} ({gpu}), {what}: {value:.3f}, {math.floor(100 * value / goal)}% of the target {goal}{where}"


def _bound_of(row: dict[str, str]) -> str:
    """How near its bound a held-out row's tuned kernel and the peer ran (heldout.csv's roofline:
    the bound's time, its FLOPs at the bf16 peak or its bytes at the copy bandwidth, over ours),
    and its tiles per SM where the row records them."""
    if not row.get("roofline"):
        return ""
    ours = float(row["roofline"])
    peer = ours * float(row["ours_ms"]) / float(row["peer_ms"])
    tiles = f", {float(row['tiles_per_sm']):.2f} tiles per SM" if row.get("tiles_per_sm") else ""
    return f" (ours at {ours:.0%} of the roofline, the peer at {peer:.0%}{tiles})"


def _rounded_of(shape: str, held_out: str, role: str) -> bool:
    """Whether ``shape`` is ``held_out`` with only M rounded up, as the role's "M=<m> rounded up" says."""
    first, _, rest = held_out.partition(",")
    mine_first, _, mine_rest = shape.partition(",")
    return rest == mine_rest and role.startswith(f"tuned, {first} ") and mine_first != first


def _share_within_5pct(ratios: Collection[float]) -> float:
    """The share of pick / tuned ratios within 5% of the tuned best."""
    # the pick runs at most 5% longer than the tuned best, as `tune evaluate` and heldout.py count
    return sum(v >= 1 / 1.05 for v in ratios) / len(ratios)


def _goal(target: float | None) -> str:
    return "-" if target is None else f">= {target}"


def _conformance(path: Path) -> list[str]:
    """Per library and device, the latest run of its own test suite: plain, under capture on a
    fresh database, and again on it (benchmarks/conformance.py)."""
    if not path.exists():
        return []
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    latest: dict[tuple[str, str], dict[str, str]] = {}
    for row in rows:
        held = latest.get((row["library"], row["device"]))
        if held is None or row["timestamp"] >= held["timestamp"]:
            latest[row["library"], row["device"]] = row
    lines = [
        "Each library's own tests (a selection, at the release its pinned version was built from), run",
        "three times: without capture, with `TUNESVC_CAPTURE=1` on a fresh database, and again on that",
        "database (`benchmarks/conformance.py`, `benchmarks/data/conformance.csv`; the latest run per",
        "library and device). Conforming: the same outcome for every test in the three runs, and no",
        "trial stored by the third. Wall times of the whole pytest process; in parentheses, / the",
        "run without capture (the first run under capture should take no longer).",
        "",
        "| library | version | device | date | tests: passed / failed / skipped | same outcome | without s"
        " | first capture s | second capture s | trials stored by the first | new in the second | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def seconds(row: dict[str, str], column: str) -> str:
        if not row[column]:
            return ""
        plain = float(row["run_plain_s"])
        share = f" ({float(row[column]) / plain:.2f})" if plain > 0 and column != "run_plain_s" else ""
        return f"{float(row[column]):.1f}{share}"

    for (library, device), r in sorted(latest.items()):
        counts = f"{r['tests']}: {r['passed']} / {r['failed']} / {r['skipped']}" if r["tests"] else ""
        same = {"True": "yes", "False": "**no**"}.get(r["same_outcome"], "")
        new = r["trials_second_new"]
        lines.append(
            f"| {library} | {r['version']} | {device} | {r['timestamp'][:10]} | {counts} | {same} "
            f"| {seconds(r, 'run_plain_s')} | {seconds(r, 'run_capture_first_s')} | {seconds(r, 'run_capture_second_s')} "
            f"| {r['trials_first']} | {new if new in ('', '0') else f'**{new}**'} | {r['status']} |"
        )
    differing = [(r["library"], r["device"], r["differing"]) for r in latest.values() if r["differing"]]
    if differing:
        lines += ["", "Tests whose outcome differed between the runs:", ""]
        lines += [f"- {library} ({device}): {tests}" for library, device, tests in sorted(differing)]
    return lines


def _rejections(path: Path) -> list[str]:
    """Per device, library and captured kernel: the candidates that run (b) of the conformance
    suite measured and those stored as ``wrong_result``, for each tunesvc tree it ran with (the
    latest run of each library per tree), then every rejection's reasons."""
    if not path.exists():
        return []
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    # (device, tree commit, library) -> that library's rows of its latest run with that tree
    latest: dict[tuple[str, str, str], list[dict[str, str]]] = {}
    for row in rows:
        at = (row["device"], row["tunesvc_commit"], row["library"])
        held = latest.get(at)
        if held is None or row["run"] > held[0]["run"]:
            latest[at] = [row]
        elif row["run"] == held[0]["run"]:
            held.append(row)
    lines = [
        "Run (b) of `benchmarks/conformance.py` (capture on a fresh database) stores every candidate it",
        "measures as a trial, and a candidate whose outputs differ from the first valid config's as a",
        "`wrong_result` trial with the reason (`benchmarks/data/conformance_rejections.csv`, read through",
        "`Store.rejected_trials`). Per tunesvc tree (its commit; `--tunesvc` runs another tree, e.g.",
        "the one before the slot-aware check, f744484^), candidates measured / rejected as wrong, from",
        "the latest run of each library with that tree.",
    ]
    for device in sorted({d for d, _, _ in latest}):
        trees = sorted(
            {c for d, c, _ in latest if d == device},
            key=lambda c: min(r["run"] for (d, cc, _), rs in latest.items() if (d, cc) == (device, c) for r in rs),
        )
        kernels: dict[tuple[str, str], dict[str, dict[str, str]]] = {}
        for (d, commit, library), held in latest.items():
            if d != device:
                continue
            for row in held:
                kernels.setdefault((library, row["kernel"]), {})[commit] = row
        lines += ["", f"{device}:", ""]
        lines.append("| library | kernel | " + " | ".join(f"tunesvc {c}" for c in trees) + " |")
        lines.append("|---|---|" + "---|" * len(trees))

        def cell(row: dict[str, str] | None) -> str:
            if row is None:
                return ""
            if not row["kernel"]:
                return row["status"] or "no kernel captured"
            rejected = row["rejected"]
            return f"{row['candidates']} / {rejected if rejected == '0' else f'**{rejected}**'}"

        for (library, kernel), by_tree in sorted(kernels.items()):
            lines.append(
                f"| {library} | {kernel or '(none)'} | " + " | ".join(cell(by_tree.get(c)) for c in trees) + " |"
            )
        for commit in trees:
            said = [
                f"- {library} `{kernel}`: {row['reasons']}"
                for (library, kernel), by_tree in sorted(kernels.items())
                if (row := by_tree.get(commit)) is not None and row["reasons"]
            ]
            if said:
                lines += ["", f"Rejections with tunesvc {commit} on {device} (trials x reason: a message):", "", *said]
        # a run stopped early counts only the kernels it reached
        stopped = sorted(
            f"- {library} with tunesvc {commit}: {held[0]['status']}; the counts are of the kernels it reached"
            for (d, commit, library), held in latest.items()
            if d == device and held[0]["kernel"] and held[0]["status"] not in ("", "ok")
        )
        if stopped:
            lines += ["", f"Runs on {device} that did not finish:", "", *stopped]
    return lines


def render(
    results_dir: Path = RESULTS_DIR, conformance_csv: Path = CONFORMANCE_CSV, rejections_csv: Path = REJECTIONS_CSV
) -> str:
    files = {path.stem: read_rows(path) for path in sorted(results_dir.glob("*.csv"))}
    lines = [
        "# Benchmark results",
        "",
        f"Generated by `{COMMAND}` from `benchmarks/results/*.csv`; edit the CSVs or rerun a",
        "benchmark, never this page. Each benchmark script appends one row per kernel, shape, peer and",
        "timing method to its CSV (`benchmarks/_common.py`, `record`).",
        "",
        "ratio = peer time / tunesvc time: above 1, tunesvc's kernel is faster. Ratios and throughputs",
        "are kept in the CSVs as each run reported them (shown here to 4 significant digits); a ratio",
        "the CSV leaves empty is shown as peer ms / ours ms.",
        "",
        "Timing methods:",
        "",
        *(f"- `{name}`: {text}" for name, text in TIMING_METHODS.items()),
        "",
        "## Summary",
        "",
        "Per kernel, peer and timing method, over the shapes of its most recent date:",
        "",
        *_summary(files),
    ]
    targets = _targets(results_dir)
    if targets:
        lines += ["", "## Targets on shapes outside the presets", "", *targets]
    transfer = _transfer_targets(results_dir)
    if transfer:
        lines += ["", "## Targets of transferred configs", "", *transfer]
    adopted = _adopt_targets(results_dir)
    if adopted:
        lines += ["", "## Targets of adopted winners", "", *adopted]
    gemm = _gemm_heldout(results_dir)
    if gemm:
        lines += ["", "## Held-out GEMM set (`benchmarks/gemm_heldout.py`)", "", *gemm]
    launch = _launch_targets(results_dir)
    if launch:
        lines += ["", "## Launch cost targets", "", *launch]
    conformance = _conformance(conformance_csv)
    if conformance:
        lines += ["", "## Libraries' own test suites under capture", "", *conformance]
    rejections = _rejections(rejections_csv)
    if rejections:
        lines += ["", "## Candidates rejected as wrong in the libraries' test suites", "", *rejections]
    for name, rows in files.items():
        lines += ["", f"## {name}", "", f"`benchmarks/{name}.py`, `benchmarks/results/{name}.csv`:", "", *_table(rows)]
    return "\n".join(lines) + "\n"


#: the README's performance table: per row, its kernel ("{shapes}": the shape count), the peer as the
#: README names it, and the (CSV kernel, CSV peer, timing_method) groups it quotes, " / " between them;
#: each group's lowest-highest ratio over the shapes of its most recent date, as the Summary above
README_ROWS: tuple[tuple[str, str, tuple[tuple[str, str, str], ...]], ...] = (
    ("`matmul` ({shapes} shapes)", "cuBLAS", (("matmul", "cuBLAS (torch.matmul)", "cuda_graph"),)),
    (
        "`attention` forward / backward",
        "SDPA",
        (("attention", "torch SDPA", "do_bench"), ("attention_bwd", "torch SDPA", "do_bench")),
    ),
    ("`decode_attention`", "SDPA", (("decode", "torch SDPA", "cuda_graph"),)),
    (
        "`layer_norm` forward / backward",
        "torch.compile / eager",
        (("layernorm", "torch.compile", "do_bench"), ("layernorm_bwd", "torch eager (autograd.grad)", "do_bench")),
    ),
    (
        "`rms_norm` forward / backward",
        "torch.compile / eager",
        (("rmsnorm", "torch.compile", "do_bench"), ("rmsnorm_bwd", "torch eager (autograd.grad)", "do_bench")),
    ),
    (
        "`softmax` forward / backward",
        "torch.compile",
        (("softmax", "torch.compile", "do_bench"), ("softmax_bwd", "torch.compile", "do_bench")),
    ),
    (
        "`bias_act_residual` forward / backward",
        "torch.compile / eager",
        (
            ("bias_act_residual", "torch.compile", "do_bench"),
            ("bias_act_residual_bwd", "torch eager (autograd.grad)", "do_bench"),
        ),
    ),
    ("`dropout`", "torch.compile", (("dropout", "torch.compile", "do_bench"),)),
)
#: how the README's table names a timing method
README_TIMING = {"cuda_graph": "CUDA graph", "do_bench": "do_bench"}
README_HEADER = "| kernel | peer | ratio | timing | GPU | date | `tune report` |"


def report_ranges(db: Path = EXAMPLE_DB) -> dict[str, tuple[float, float]]:
    """Per kernel, the worst and best speed-up over its peer that `tune report --db DB` shows in
    its Summary (the versions lookups use; every device), read by the report's own code."""
    from tunesvc.report import collect
    from tunesvc.store import Store

    store = Store(str(db), readonly=True)
    try:
        sections = collect(store)
    finally:
        store.close()
    ranges: dict[str, tuple[float, float]] = {}
    for section in sections:
        ratios = [value for value, _ in section.peer_speedups]
        if section.current and ratios:
            low, high = ranges.get(section.kernel, (min(ratios), max(ratios)))
            ranges[section.kernel] = (min(low, *ratios), max(high, *ratios))
    return ranges


def report_range_text(ranges: dict[str, tuple[float, float]], kernel: str) -> str:
    """A kernel's range as the report writes a speed-up (3 significant digits), "-" where no sweep timed its peer."""
    if kernel not in ranges:
        return "-"
    low, high = ranges[kernel]
    return f"{low:.3g}-{high:.3g}x"


def readme_table(results_dir: Path = RESULTS_DIR, example_db: Path = EXAMPLE_DB) -> list[str]:
    """The README's performance table, computed from the CSVs as the Summary of RESULTS.md is,
    and its last column from ``example_db`` as `tune report` computes its Summary."""
    rows = [row for path in sorted(results_dir.glob("*.csv")) for row in read_rows(path)]
    lines = [README_HEADER, "|---|---|---|---|---|---|---|"]
    ranges = report_ranges(example_db)
    for label, peer, groups in README_ROWS:
        spreads, shapes, methods, gpus, dates = [], set(), [], set(), set()
        for kernel, csv_peer, method in groups:
            matching = [r for r in rows if (r["kernel"], r["peer"], r["timing_method"]) == (kernel, csv_peer, method)]
            if not matching:
                raise SystemExit(f"README_ROWS: no {kernel} / {csv_peer} / {method} rows in {results_dir}.")
            latest = max(r["date"] for r in matching)
            recent = [r for r in matching if r["date"] == latest and ratio_of(r) is not None]
            ratios = [v for v in (ratio_of(r) for r in recent) if v is not None]
            spreads.append(f"{min(ratios):.2f}-{max(ratios):.2f}x")
            shapes |= {r["shape"] for r in recent}
            methods.append(README_TIMING.get(method, method))
            gpus |= {_gpu_short(r["gpu"]) for r in recent}
            dates.add(latest)
        timing = " / ".join(dict.fromkeys(methods))
        report = " / ".join(report_range_text(ranges, kernel) for kernel, _, _ in groups)
        lines.append(
            f"| {label.format(shapes=len(shapes))} | {peer} | {' / '.join(spreads)} | {timing} "
            f"| {', '.join(sorted(gpus))} | {max(dates)} | {report} |"
        )
    return lines


def _gpu_short(name: str) -> str:
    """ "NVIDIA H100 80GB HBM3" as the README writes it: H100."""
    return next((word for word in name.split() if word[:1] in "HABL" and word[1:].isdigit()), name)


def readme_with_table(readme: str, results_dir: Path = RESULTS_DIR, example_db: Path = EXAMPLE_DB) -> str:
    """``readme`` with its performance table (the lines from its header to the first line that is
    not a table row) replaced by :func:`readme_table`."""
    lines = readme.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("| kernel | peer | ratio |"))
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join([*lines[:start], *readme_table(results_dir, example_db), *lines[end:]])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when RESULTS.md or the README's table is stale; write nothing"
    )
    args = parser.parse_args()
    page = render()
    readme = README.read_text()
    table = readme_with_table(readme)
    if args.check:
        stale = [
            name
            for name, ok in (
                ("benchmarks/RESULTS.md", PAGE.exists() and PAGE.read_text() == page),
                ("README.md's performance table", readme == table),
            )
            if not ok
        ]
        for name in stale:
            print(f"{name} is stale; regenerate it with `{COMMAND}`.", file=sys.stderr)
        return 1 if stale else 0
    PAGE.write_text(page)
    README.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
