"""A sibling GPU model's winners on a new one: transferred configs against configs tuned here, and cuBLAS.

    python benchmarks/transfer.py                  # 24 held-out GEMMs, 12-trial sweeps, ~7 min on an H200 (estimated)
    python benchmarks/transfer.py --quick          # 12 GEMMs, 8-trial sweeps, ~4 min (estimated)
    python benchmarks/transfer.py --served-only    # 36 GEMMs, no sweeps: served, heuristic, transferred, cuBLAS; ~2-3 min
    python benchmarks/transfer.py --list           # print the shapes; no GPU needed

Run on a GPU model that is a sibling of the one --db was tuned on (same compute capability and
SM count, another hardware id): tune.db.example holds matmul's current winners of an H200 (sm_90,
132 SMs; its H100 SXM rows are of an older matmul version), so run it on an H100 SXM with the
default --db. --db is copied first; nothing is written to it.

The shapes are GEMMs of the attention and MLP projections of current models (benchmarks/heldout.py's
MODELS: Llama-3-70B, Qwen2.5-7B, Qwen2.5-32B, Mixtral-8x7B) at M from 1 to 8192 tokens, bf16: per
M, one projection of each model, the projections rotating with M. None has a shape key of a
preset (heldout.py's check) nor one that --db holds winners of, on any device: every transferred
answer is the sibling's winner of its nearest tuned key, not of the same key.

Per shape, in this order: (1) before anything is tuned here, what the runtime launches on this
GPU in mode lookup (``served``: the sibling's winner where the sibling's own trials say it beat
the heuristic there, else the heuristic; see tunesvc.serving.transfer), the sibling's winner it
considered (``transferred``: what the chain served blind before that rule, with the sibling and
its key) and the heuristic; (2) a short sweep of the
shape on this GPU (Optuna TPE, --budget trials and at most --time-budget seconds, warm-started
as every sweep is: the runtime's untuned answer first), into the copy; (3) once every shape is swept, this GPU's own nearest answer,
each shape left out in turn: the winner tuned here of the nearest other held-out key (what the
chain would launch before ``transferred`` once this GPU has keys of its own: the measurement that
decides the tier's place); (4) the served config, the transferred one, that nearest answer, the
heuristic, the tuned config and cuBLAS (torch.matmul), checked against the reference and timed from CUDA graphs
over copies of the inputs that exceed L2 twice, in interleaved rounds (heldout.py's
``time_shape``). Rows go to benchmarks/results/transfer.csv, one per (shape, config), the config
in the kernel column (``matmul [served]``, ``matmul [transferred]``, ``matmul [nearest tuned
here]``, ``matmul [heuristic]``, ``matmul [tuned]``), cuBLAS as the peer; ``python
benchmarks/results_page.py`` then writes the targets (transferred within 5% of tuned on 80% of
the shapes, never below 0.85x; served at least 0.95x the heuristic on every shape and 1.0x on
average, geometric mean) into RESULTS.md. Sweeps stop starting once --deadline seconds have
passed, and the shapes left unswept are not timed, so a run ends within the device's time limit.

--served-only skips (2) and (3): per shape, the served config, the transferred one, the heuristic
and cuBLAS only, on the held-out shapes and as many again at Ms of other buckets (SERVED_M), none
of whose keys the sibling tuned either: the rule's thresholds were chosen from the sibling's
winners at their own keys (benchmarks/data/verify_h100_winners_on_h200.csv), so these shapes are
held out from it. Timing stops once --deadline seconds have passed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE.parent / "tune.db.example"

#: the labels of the configs timed per shape, as the CSV's kernel column names them
TRANSFERRED, NEAREST_HERE, HEURISTIC, TUNED = "transferred", "nearest tuned here", "heuristic", "tuned"
SERVED = "served"
#: --served-only's further Ms: buckets (64, 512, 2048) no M of heldout.GEMM_M falls in
SERVED_M = (48, 333, 1500)
#: served against the heuristic: at least this on every shape, and this geometric mean
SERVED_FLOOR, SERVED_MEAN = 0.95, 1.0


def held_out_gemms(quick: bool, ms: tuple[int, ...] | None = None) -> list[dict[str, int]]:
    """Per M of ``ms`` (heldout.GEMM_M by default), one projection of each model (--quick: of the
    first two), the projection rotating with M: every model and every projection kind appears at
    several M. In the order of the models, each over every M: a run cut short by --deadline loses
    a model's last shapes, not every shape of the largest M."""
    from heldout import GEMM_M
    from heldout import MODELS
    from heldout import PRESET_KEYS

    shapes = []
    for t, (_, hidden, inter, hq, hkv, d) in enumerate(MODELS[: 2 if quick else 4]):
        for i, m in enumerate(GEMM_M if ms is None else ms):
            projections = ((hq * d + 2 * hkv * d, hidden), (hidden, hidden), (2 * inter, hidden), (hidden, inter))
            n, k = projections[(i + t) % 4]
            if (m, n, k) not in PRESET_KEYS:
                shapes.append({"M": m, "N": n, "K": k})
    return shapes


def problems(db: str, quick: bool, served_only: bool = False) -> list[dict[str, Any]]:
    """The held-out problems, bf16 (``served_only``: with those at SERVED_M), without any whose
    shape key --db holds a winner of (any device) or a preset tunes."""
    from heldout import assert_disjoint

    from tunesvc.store import Store
    from tunesvc.template import get_template

    template = get_template("matmul")
    shapes = held_out_gemms(quick) + (held_out_gemms(quick, SERVED_M) if served_only else [])
    every = [template.problem(**shape, dtype="bfloat16") for shape in shapes]
    assert_disjoint(template, every)
    store = Store(db, readonly=True)
    try:
        stored = {w.shape_key for w in store.winners(kernel="matmul")}
    finally:
        store.close()
    kept = [p for p in every if str(template.key(p)) not in stored]
    for p in every:
        if p not in kept:
            print(f"left out {template.key(p)}: {db} holds a winner of that key", flush=True)
    return kept


def untuned(db: str, shapes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Shape key -> the runtime's answer on this GPU in mode lookup before anything is tuned here
    ("answer", served), the sibling's winner that the chain considered ("transferred": the
    config, None where no sibling's winner fits) and the heuristic."""
    import warnings

    from tunesvc.device import current_device
    from tunesvc.serving import transfer as transfers
    from tunesvc.serving.runtime import Runtime
    from tunesvc.serving.source import DatabaseSource
    from tunesvc.template import get_template

    template = get_template("matmul")
    device = current_device()
    runtime = Runtime(db=db, mode="lookup", strict=True)
    found_sibling = DatabaseSource(db, device).sibling(template)
    table = None if found_sibling is None else found_sibling.sibling()
    parsed = [] if table is None else table.parsed()
    out = {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="tunesvc: no tuned config")
        for problem in shapes:
            found = runtime.lookup(template, **problem)
            key = template.key(template.problem(**problem))
            moved = None if table is None else transfers.transferred(template, problem, key, table, parsed, device)
            out[found.key] = {
                "answer": found,
                "transferred": None if moved is None else moved.config,
                "heuristic": template.heuristic(problem, device),
            }
            print(f"{found.key}: {found.source}: {found.reason}", flush=True)
    if not any(a["transferred"] is not None for a in out.values()):
        raise SystemExit(
            f"No shape has a sibling's winner to transfer on {device.name} ({device.hardware_id}) from {db}: run this "
            "on a sibling of the GPU model that tuned the kernel's current version (same compute capability and "
            "SM count: an H100 SXM for tune.db.example's H200 matmul winners), with TUNESVC_TRANSFER unset."
        )
    return out


def served_summary(served: dict[str, float], transferred: dict[str, float]) -> list[str]:
    """Lines on served / heuristic (shape key -> ratio, heuristic time / served time), its targets
    and transferred / heuristic beside it."""
    from _common import geomean

    lines = []
    for label, ratios in ((SERVED, served), (TRANSFERRED, transferred)):
        if ratios:
            worst = min(ratios, key=ratios.__getitem__)
            below = sum(v < SERVED_FLOOR for v in ratios.values())
            lines.append(
                f"{label} / heuristic: worst {ratios[worst]:.3f}x at {worst}, below {SERVED_FLOOR}x on {below} of "
                f"{len(ratios)} shapes, geometric mean {geomean(list(ratios.values())):.3f}x"
            )
    if served:
        met = min(served.values()) >= SERVED_FLOOR and geomean(list(served.values())) >= SERVED_MEAN
        lines.append(
            f"targets (served >= {SERVED_FLOOR}x the heuristic on every shape, >= {SERVED_MEAN}x geometric mean): "
            f"{'met' if met else 'missed'}"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=str(EXAMPLE), help="the sibling's database (copied first) [tune.db.example]")
    parser.add_argument("--quick", action="store_true", help="12 shapes and 8-trial sweeps instead of 24 and 12")
    parser.add_argument("--budget", type=int, default=None, help="trials per sweep, at most 16 [12; --quick: 8]")
    parser.add_argument("--time-budget", type=float, default=8.0, help="seconds per sweep at most [8]")
    parser.add_argument(
        "--deadline", type=float, default=270.0, help="seconds after which no further sweep starts [270]"
    )
    parser.add_argument(
        "--served-only",
        action="store_true",
        help="no sweeps: time what the chain serves, the transferred config, the heuristic and cuBLAS (~2-3 min)",
    )
    parser.add_argument("--list", action="store_true", help="print the held-out shapes and exit")
    parser.add_argument("--run", default="", help="stamp the rows with this run (default: this process's start)")
    args = parser.parse_args()
    budget = args.budget if args.budget is not None else (8 if args.quick else 12)
    if not 1 <= budget <= 16:
        parser.error("--budget must be between 1 and 16")
    if not os.path.isfile(args.db):
        parser.error(f"--db {args.db}: no such file; give a copy of tune.db.example (the sibling's winners)")
    started = time.monotonic()
    scratch = tempfile.mkdtemp(prefix="transfer-")
    db = os.path.join(scratch, "transfer.db")
    shutil.copyfile(args.db, db)
    shapes = problems(db, args.quick, args.served_only)
    if args.list:
        for i, p in enumerate(shapes):
            print(i, ",".join(f"{k}={v}" for k, v in p.items()))
        print(f"{len(shapes)} shapes, none a preset's key or a key {args.db} holds")
        shutil.rmtree(scratch, ignore_errors=True)
        return 0

    import _common
    from _common import geomean
    from _common import print_table
    from _common import require_gpu
    from heldout import time_shape

    from tunesvc.device import current_device
    from tunesvc.store import Store
    from tunesvc.template import get_template
    from tunesvc.tuning import selector_fit
    from tunesvc.tuning.sweep import compile_pool
    from tunesvc.tuning.sweep import measuring_process
    from tunesvc.tuning.sweep import run_sweep

    require_gpu("benchmarks/transfer.py")
    if args.run:
        _common.RUN = args.run
    template = get_template("matmul")
    device = current_device()
    picks = untuned(db, shapes)
    if args.served_only:
        served_only(template, shapes, picks, started, args.deadline)
        shutil.rmtree(scratch, ignore_errors=True)
        return 0

    swept: dict[str, dict[str, Any]] = {}
    # one compile pool and one measuring process for every sweep: their start is paid once
    compiler = compile_pool(template, shapes[0], strategy="optuna", budget=budget)
    measurer = measuring_process(template, shapes[0])
    store = Store(db)
    try:
        for problem in shapes:
            key = str(template.key(problem))
            if time.monotonic() - started > args.deadline:
                print(f"{key}: not swept, the --deadline of {args.deadline:.0f} s has passed; not timed", flush=True)
                continue
            [result] = run_sweep(
                template,
                [problem],
                store,
                strategy="optuna",
                budget=budget,
                time_budget=args.time_budget,
                refit_selector=False,
                compiler=compiler,
                measurer=measurer,
            )
            print(f"{key}: swept {result.trials_stored} trials in {result.wall_seconds:.1f} s", flush=True)
            if result.winner is not None:
                swept[key] = result.winner
    finally:
        store.close()
        for process in (compiler, measurer):
            if process is not None:
                process.close()

    store = Store(db, readonly=True)
    try:
        here = selector_fit.tuned_winners(store, template, device.hardware_id)
    finally:
        store.close()
    table, ratios = [], {label: [] for label in (SERVED, TRANSFERRED, NEAREST_HERE, HEURISTIC)}
    vs_peer: dict[str, list[float]] = {label: [] for label in (SERVED, TRANSFERRED, NEAREST_HERE, HEURISTIC, TUNED)}
    served_ratios: dict[str, float] = {}
    transferred_ratios: dict[str, float] = {}
    for problem in shapes:
        key = str(template.key(problem))
        if key not in swept:
            continue
        answer = picks[key]["answer"]
        configs = {SERVED: answer.config, HEURISTIC: picks[key]["heuristic"], TUNED: swept[key]}
        if picks[key]["transferred"] is not None:
            configs[TRANSFERRED] = picks[key]["transferred"]
        others = {k: c for k, c in here.items() if k != key and k in swept}  # the other held-out keys tuned here
        source, matched, nearest = selector_fit.nearest_pick(others, key, template, problem, device)
        if source == "nearest":
            configs[NEAREST_HERE] = nearest
        print(f"{key}: timing {', '.join(configs)} and cuBLAS (nearest here: {matched})", flush=True)
        peer_name, times = time_shape(template, problem, configs)
        peer_ms = times.get("peer")
        _record_shape(template, problem, configs, peer_name, times)
        tuned_ms = times.get(TUNED)
        served_vs(key, times, served_ratios, transferred_ratios)
        for label in ratios:
            if tuned_ms and times.get(label):
                ratios[label].append(tuned_ms / times[label])
        for label in vs_peer:
            if peer_ms and times.get(label):
                vs_peer[label].append(peer_ms / times[label])
        cells = [f"{tuned_ms / times[label]:.3f}" if tuned_ms and times.get(label) else "-" for label in ratios]
        table.append(
            [key, answer.matched_key or "-", *cells, f"{peer_ms / tuned_ms:.3f}" if peer_ms and tuned_ms else "-"]
        )
    print_table(
        f"Transferred from the sibling's winners, bf16 GEMMs held out, GPU ms from CUDA graphs "
        f"(sweeps here: Optuna, {budget} trials, at most {args.time_budget:.0f} s)",
        [
            "shape key",
            "sibling's key",
            "served / tuned",
            "transferred / tuned",
            "nearest here / tuned",
            "heuristic / tuned",
            "cuBLAS / tuned",
        ],
        table,
    )
    for label, values in ratios.items():
        if values:
            within = sum(v >= 1 / 1.05 for v in values) / len(values)
            print(
                f"{label}: within 5% of tuned on {within:.0%} of {len(values)} shapes, worst {min(values):.3f}x, "
                f"geometric mean {geomean(values):.3f}x of tuned",
                flush=True,
            )
    for label, values in vs_peer.items():
        if values:
            print(f"{label} / cuBLAS: geometric mean {geomean(values):.3f}x over {len(values)} shapes", flush=True)
    for line in served_summary(served_ratios, transferred_ratios):
        print(line, flush=True)
    print(f"{len(swept)} of {len(shapes)} shapes timed in {time.monotonic() - started:.0f} s", flush=True)
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


def served_vs(
    key: str, times: dict[str, float | None], served: dict[str, float], transferred: dict[str, float]
) -> None:
    """Add this shape's heuristic time / served time and / transferred time, where both were timed."""
    heuristic_ms = times.get(HEURISTIC)
    for label, into in ((SERVED, served), (TRANSFERRED, transferred)):
        if heuristic_ms and (ms := times.get(label)):
            into[key] = heuristic_ms / ms


def served_only(
    template: Any, shapes: list[dict[str, Any]], picks: dict[str, dict[str, Any]], started: float, deadline: float
) -> None:
    """--served-only: per shape, the served config, the transferred one, the heuristic and cuBLAS,
    timed together; rows to transfer.csv; a table and the targets' summary printed."""
    from _common import print_table
    from heldout import time_shape

    served, transferred, table = {}, {}, []
    timed = 0
    for problem in shapes:
        key = str(template.key(problem))
        if time.monotonic() - started > deadline:
            print(f"{key}: not timed, the --deadline of {deadline:.0f} s has passed", flush=True)
            continue
        answer = picks[key]["answer"]
        configs = {SERVED: answer.config, HEURISTIC: picks[key]["heuristic"]}
        if picks[key]["transferred"] is not None:
            configs[TRANSFERRED] = picks[key]["transferred"]
        peer_name, times = time_shape(template, problem, configs)
        peer_ms = times.get("peer")
        if _record_shape(template, problem, configs, peer_name, times):
            timed += 1
        served_vs(key, times, served, transferred)
        cells = [f"{d[key]:.3f}" if key in d else "-" for d in (served, transferred)]
        vs_peer = f"{peer_ms / times[SERVED]:.3f}" if peer_ms and times.get(SERVED) else "-"
        table.append([key, answer.source, *cells, vs_peer, answer.reason])
        print(f"{key}: {answer.source}, served / heuristic {cells[0]}, transferred / heuristic {cells[1]}", flush=True)
    print_table(
        "What the chain serves in mode lookup from a sibling's winners, bf16 GEMMs held out, GPU ms from CUDA graphs",
        ["shape key", "served", "served / heuristic", "transferred / heuristic", "cuBLAS / served", "why"],
        table,
    )
    for line in served_summary(served, transferred):
        print(line, flush=True)
    print(f"{timed} of {len(shapes)} shapes timed in {time.monotonic() - started:.0f} s", flush=True)


def _record_shape(
    template: Any, problem: dict[str, Any], configs: dict[str, Any], peer_name: str, times: dict[str, float | None]
) -> list[dict[str, Any]]:
    """One shape's rows ("matmul [label]" against the peer, each timed config), appended to
    transfer.csv at once: a run stopped by a time limit keeps what it timed."""
    from _common import record
    from _common import result_row

    peer_ms = times.get("peer")
    rows = [
        {
            **result_row(template, problem, peer=peer_name, ours_ms=ms, peer_ms=peer_ms, timing_method="cuda_graph"),
            "kernel": f"matmul [{label}]",
        }
        for label in configs
        if (ms := times.get(label)) is not None and peer_ms is not None
    ]
    if rows:
        record("transfer", rows)
    return rows


if __name__ == "__main__":
    sys.exit(main())
