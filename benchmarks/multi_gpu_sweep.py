"""A fixed set of GEMM jobs swept on one GPU (cold and warm Triton cache, and again from an empty
database), then on N: wall time, where it went, how busy the GPU was, first-trial latency,
winners, lost or duplicated trials, and the winners timed side by side.

    python benchmarks/multi_gpu_sweep.py                          # one GPU: the GEMM benchmark's 11 shapes, budget 32
    python benchmarks/multi_gpu_sweep.py --gpus 2                 # and the same on two GPUs
    python benchmarks/multi_gpu_sweep.py --baseline-db old.db     # winners of an earlier tree's sweep, re-timed beside
    python benchmarks/multi_gpu_sweep.py --jobs check             # 2 tiny shapes, budget 2: checks the script (CPU too)

Runs of `tune sweep matmul --strategy grid --budget B --gpus ...`, each into a fresh SQLite file,
all sharing one fresh Triton cache folder: one GPU with that cache cold (it compiles every
config), one GPU with it warm (a warm host: its kernels compiled before), one GPU again from an
empty database (a re-tune: does it pick the same winners?), and with ``--gpus N`` (N > 1) N GPUs,
warm. Targets on one H200: the warm one-GPU run at most 80 s, the cold one 120 s, the first trial
measured 5 s after the command starts on a warm host, the GPU busy 70% of the run or more
(nvidia-smi's utilization, sampled every 100 ms), N GPUs at most 1 / (0.9 N) of one GPU's time.

Each run's seconds are split as its sweeps split them (the ``swept KEY`` timeline events of
tunesvc.tuning.sweep: compile, check and time, re-time, store, start-up; summed over the
workers) after the command's import. Then, in this process, every shape's winners of each run
(and of ``--baseline-db``) and the five fastest trials of the warm run are checked and timed side
by side (``Bench.time_together``, 200 ms each, twice, the order reversed the second time): each
run's winner against the fastest of them (target: within 1%), and the re-tune's winner against the
warm run's (the same config, or a time within its noise interval: the target is 95% of shapes).
Appends the figures to benchmarks/results/multi_gpu_sweep.csv.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from datetime import UTC
from datetime import datetime

from _common import record
from startup import breakdown
from startup import print_breakdown
from startup import run_timed

from tunesvc.timeline import read

#: the GEMM benchmark's shapes (benchmarks/matmul.py: the matmul template's "llm" and "skinny" presets)
GEMM = [
    "4096x4096x4096",
    "8192x8192x8192",
    "16x4096x4096",
    "128x14336x4096",
    "2048x4096x14336",
    "1000x3000x777",
    "1x4096x4096",
    "1x14336x4096",
    "16x14336x4096",
    "64x4096x4096",
    "64x14336x4096",
]
JOB_SETS = {
    "gemm": GEMM,
    "six": GEMM[:2] + ["16x4096x4096", "128x14336x4096", "2048x4096x14336", "1000x3000x777"],
    "check": ["37x45x29", "100x70x50"],  # tiny: also runs in the CPU interpreter
}
#: targets: first-trial latency on a warm host, the one-GPU sweep's wall time warm and cold (s),
#: the share of the run the GPU is busy
FIRST_TRIAL_S = 5.0
WARM_S, COLD_S = 80.0, 120.0
BUSY = 0.70
#: a winner within this fraction of the fastest one timed beside it is as good as it
WITHIN = 0.01
#: the side-by-side check: ms of samples per config and pass, and how many of the warm run's fastest trials join
CHECK_MS = 200.0
CHECK_TOP = 5
#: the issue's names for a sweep's phases (tunesvc.tuning.sweep.PHASES)
GROUPS = {
    "compile": ("waiting for compiles",),
    "check and time": ("checking and timing",),
    "re-time": ("finalists",),
    "store": ("trial writes", "winner"),
    "start-up": ("start", "set-up", "measurer start", "measurer stop"),
    "other": ("search", "torch peer"),
}


@contextlib.contextmanager
def gpu_busy(samples: list[float]) -> Iterator[None]:
    """Sample nvidia-smi's GPU utilization (percent of the time a kernel ran, GPU 0) every 100 ms
    into ``samples`` (fractions) while the block runs; nothing where there is no nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        yield
        return
    command = [smi, "-i", "0", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "100"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)

    def drain() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with contextlib.suppress(ValueError):
                samples.append(float(line.strip()) / 100)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        yield
    finally:
        proc.terminate()
        proc.wait()
        reader.join(timeout=5)


def sweep(folder: str, name: str, gpus: str, shapes: list[str], budget: int, cache: str) -> dict:
    db, log = os.path.join(folder, f"{name}.db"), os.path.join(folder, f"{name}.jsonl")
    command = [sys.executable, "-m", "tunesvc", "sweep", "matmul", "--strategy", "grid", "--budget", str(budget)]
    command += ["--gpus", gpus, "--db", db, "--json"]
    for shape in shapes:
        command += ["--shape", shape]
    started = datetime.now(UTC).replace(tzinfo=None)  # the jobs table's clock: naive UTC
    busy: list[float] = []
    with gpu_busy(busy):
        # each run in a fresh process, as its figures have always been: its import is part of them
        start, end, _ = run_timed(command, log, {"TRITON_CACHE_DIR": cache, "TUNESVC_RESIDENT": "0"})
    rows = [r for r in breakdown(log, start, end) if not r["event"].startswith("swept ")]
    measured = [r["at_s"] for r in rows if r["event"] == "first trial measured"]
    stored = [r["at_s"] for r in rows if r["event"] == "first trials stored"]
    imported = [r["at_s"] for r in rows if r["event"] == "kernel imported"]
    return {
        "name": name,
        "gpus": gpus,
        "db": db,
        "wall_s": end - start,
        "first_trial_s": min(measured) if measured else float("nan"),
        "first_stored_s": min(stored) if stored else float("nan"),
        "import_s": min(imported) if imported else float("nan"),
        "phases": phase_totals(log),
        "busy": sum(busy) / len(busy) if busy else None,
        "breakdown": rows,
        "timeline": job_timeline(db, started),
        "trials": trial_counts(db),
        "winners": winners(db),
    }


def phase_totals(log: str) -> dict[str, float]:
    """Seconds per GROUPS name, summed over every key any worker swept (the timeline's ``swept`` events)."""
    totals = dict.fromkeys(GROUPS, 0.0)
    for event in read(log):
        if not event["event"].startswith("swept "):
            continue
        for phase, seconds in event.get("phases", {}).items():
            group = next((g for g, names in GROUPS.items() if phase in names), "other")
            totals[group] += seconds
    return totals


def job_timeline(db: str, start: datetime) -> list[str]:
    """Each worker's jobs in the order it finished them, with the seconds from the command's start."""
    con = sqlite3.connect(db)
    try:
        rows = con.execute("SELECT worker, shape_key, finished_at FROM tunesvc_jobs ORDER BY finished_at").fetchall()
    finally:
        con.close()
    lines: dict[str, list[str]] = {}
    for worker, key, finished in rows:
        at = (datetime.fromisoformat(finished) - start).total_seconds() if finished else float("nan")
        lines.setdefault(worker, []).append(f"{key} done at {at:.1f} s")
    return [f"{worker}: " + ", ".join(jobs) for worker, jobs in lines.items()]


def trial_counts(db: str) -> tuple[int, int]:
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT count(*), count(DISTINCT shape_key || config_hash) FROM tunesvc_trials").fetchone()
    finally:
        con.close()


def winners(db: str) -> dict[str, tuple[str, float | None, dict]]:
    """shape key -> (winning config's hash, its time in ms, the config)."""
    import json

    con = sqlite3.connect(db)
    try:
        rows = con.execute("SELECT shape_key, config_hash, time_ms, config FROM tunesvc_winners").fetchall()
    finally:
        con.close()
    return {key: (h, ms, json.loads(config)) for key, h, ms, config in rows}


def fastest_trials(db: str, key: str, count: int) -> list[dict]:
    import json

    con = sqlite3.connect(db)
    try:
        rows = con.execute(
            "SELECT config FROM tunesvc_trials WHERE shape_key = ? AND status = 'ok' ORDER BY time_ms LIMIT ?",
            (key, count),
        ).fetchall()
    finally:
        con.close()
    return [json.loads(c) for (c,) in rows]


def side_by_side(shapes: list[str], runs: list[dict], reference: dict) -> list[dict]:
    """Per shape: every run's winner and the reference run's fastest trials, checked and timed
    side by side twice (the order reversed the second time); each config's median time and noise."""
    from tunesvc import current_device
    from tunesvc import get_template
    from tunesvc.bench import Bench
    from tunesvc.space import config_hash

    template, device = get_template("matmul"), current_device()
    rows = []
    for shape in shapes:
        m, n, k = (int(x) for x in shape.split("x"))
        problem = template.problem(M=m, N=n, K=k)
        key = str(template.key(problem))
        configs: dict[str, dict] = {}
        for run in runs:
            if key in run["winners"]:
                configs.setdefault(run["winners"][key][0], run["winners"][key][2])
        for config in fastest_trials(reference["db"], key, CHECK_TOP):
            configs.setdefault(config_hash(config), config)
        bench = Bench(template, problem, device, rep_ms=CHECK_MS)
        checked = {h: c for h, c in configs.items() if bench.measure(c).ok}
        hashes = list(checked)
        first = bench.time_together([checked[h] for h in hashes], CHECK_MS)
        second = bench.time_together([checked[h] for h in reversed(hashes)], CHECK_MS)[::-1]
        timed = {}
        for h, a, b in zip(hashes, first, second):
            if a.ok and b.ok and a.time_ms and b.time_ms:
                timed[h] = ((a.time_ms + b.time_ms) / 2, max(a.noise or 0.0, b.noise or 0.0))
        best = min((t for t, _ in timed.values()), default=None)
        rows.append(
            {"shape": shape, "key": key, "timed": timed, "best": best, "note": first[0].message if first else ""}
        )
        del bench
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1, help="GPUs of the N-GPU run (0 to N-1; 1: no N-GPU run) [1]")
    parser.add_argument(
        "--jobs",
        default="gemm",
        help=f"the job set: {', '.join(JOB_SETS)} (gemm: the GEMM benchmark's 11 shapes), or shapes such as 4096x4096x4096,16x4096x4096 [gemm]",
    )
    parser.add_argument("--budget", type=int, help="configs per shape, in grid order [32; check: 2]")
    parser.add_argument(
        "--baseline-db", help="a database of the same sweep by an earlier tree: its winners join the side-by-side check"
    )
    parser.add_argument("--keep", help="a folder to copy the runs' databases and timelines into")
    parser.add_argument("--cache", help="the Triton cache folder the runs share (default: a fresh one, removed after)")
    parser.add_argument(
        "--from", dest="source", help="no sweeps: the side-by-side check of the runs kept in this folder (--keep)"
    )
    args = parser.parse_args()
    shapes = JOB_SETS.get(args.jobs) or [s.strip() for s in args.jobs.split(",") if s.strip()]
    budget = args.budget or (2 if args.jobs == "check" else 32)
    if args.source:
        return check_only(args, shapes)
    with tempfile.TemporaryDirectory() as folder:
        cache = args.cache or os.path.join(folder, "triton-cache")
        cold = sweep(folder, "1 GPU, cold Triton cache", "0", shapes, budget, cache)
        one = sweep(folder, "1 GPU", "0", shapes, budget, cache)
        again = sweep(folder, "1 GPU again", "0", shapes, budget, cache)
        runs = [cold, one, again]
        parallel = None
        if args.gpus > 1:
            parallel = sweep(
                folder, f"{args.gpus} GPUs", ",".join(str(i) for i in range(args.gpus)), shapes, budget, cache
            )
            runs.append(parallel)
        baseline = None
        if args.baseline_db:
            baseline = {"name": "baseline", "db": args.baseline_db, "winners": winners(args.baseline_db)}
        checked = side_by_side(shapes, runs + ([baseline] if baseline else []), one)
        if args.keep:
            os.makedirs(args.keep, exist_ok=True)
            for name in os.listdir(folder):
                if name.endswith((".db", ".jsonl")):
                    shutil.copy(os.path.join(folder, name), args.keep)
    report(args, shapes, budget, runs, one, cold, again, parallel, baseline, checked)


def check_only(args, shapes: list[str]) -> None:
    """The side-by-side check of kept runs (and the baseline), printed; nothing recorded."""
    names = ["1 GPU, cold Triton cache", "1 GPU", "1 GPU again"]
    runs = [
        {
            "name": n,
            "db": os.path.join(args.source, f"{n}.db"),
            "winners": winners(os.path.join(args.source, f"{n}.db")),
        }
        for n in names
    ]
    baseline = (
        {"name": "baseline", "db": args.baseline_db, "winners": winners(args.baseline_db)} if args.baseline_db else None
    )
    checked = side_by_side(shapes, runs + ([baseline] if baseline else []), runs[1])
    print_winners(runs, runs[1], runs[2], baseline, checked)


def report(args, shapes, budget, runs, one, cold, again, parallel, baseline, checked) -> None:
    for run in runs:
        print_breakdown(f"{run['name']}: start-up (--gpus {run['gpus']})", run["breakdown"])
        print(f"\n{run['name']}, jobs:", *run["timeline"], sep="\n  ")
    expected = len(shapes) * budget
    print(f"\n### {len(shapes)} matmul shapes x {budget} configs (grid), --jobs {args.jobs}\n")
    names = list(GROUPS)
    print(
        f"| run | wall s | import s | {' | '.join(names)} | GPU busy (target >= {BUSY:.0%}) "
        f"| first trial s (target <= {FIRST_TRIAL_S:g}, warm) | trials stored / distinct (expected) |"
    )
    print("|---|---|---|" + "---|" * len(names) + "---|---|---|")
    for run in runs:
        busy = f"{run['busy']:.0%}" if run["busy"] is not None else "-"
        phases = " | ".join(f"{run['phases'][n]:.1f}" for n in names)
        print(
            f"| {run['name']} | {run['wall_s']:.1f} | {run['import_s']:.1f} | {phases} | {busy} "
            f"| {run['first_trial_s']:.2f} | {run['trials'][0]} / {run['trials'][1]} ({expected}) |"
        )
    print(
        f"\nTargets: warm one-GPU run <= {WARM_S:g} s ({one['wall_s']:.1f}), cold <= {COLD_S:g} s ({cold['wall_s']:.1f})."
    )

    side_by_side = print_winners(runs, one, again, baseline, checked)
    record_rows(args, shapes, budget, runs, one, cold, parallel, side_by_side)


def print_winners(runs, one, again, baseline, checked) -> list[dict]:
    """The winners timed side by side: each run's against the fastest; the re-tune's against the
    warm run's. Returns them as rows: per shape and run, the fastest winner's time over this run's
    (1: it is the fastest); per shape, whether the re-tune agrees (ratio: warm run's time over the
    re-tune's, config "same", "within noise" or "differs")."""
    sources = [*runs, *([baseline] if baseline else [])]
    print(f"\n### Winners timed side by side ({checked[0]['note'] if checked else ''}): time / fastest of them\n")
    print("| shape | " + " | ".join(r["name"] for r in sources) + " | re-tune same or within noise |")
    print("|---|" + "---|" * len(sources) + "---|")
    within = {r["name"]: 0 for r in sources}
    same = 0
    rows: list[dict] = []
    for row in checked:
        cells = []
        for run in sources:
            w = run["winners"].get(row["key"])
            t = row["timed"].get(w[0]) if w else None
            if t is None or row["best"] is None:
                cells.append("-")
                continue
            ratio = t[0] / row["best"]
            within[run["name"]] += ratio <= 1 + WITHIN
            cells.append(f"{ratio:.3f}")
            if run is not baseline:
                shape = f"{row['shape']} ({run['name']})"
                rows.append(_side_row(shape, "fastest winner of the runs", row["best"] / t[0], row["note"]))
        a, b = one["winners"].get(row["key"]), again["winners"].get(row["key"])
        ta = row["timed"].get(a[0]) if a else None
        tb = row["timed"].get(b[0]) if b else None
        agree = bool(a and b and (a[0] == b[0] or (ta and tb and abs(tb[0] / ta[0] - 1) <= max(ta[1], 0.01))))
        same += agree
        if ta and tb:
            verdict = "same" if a[0] == b[0] else ("within noise" if agree else "differs")
            rows.append(
                _side_row(f"{row['shape']} (re-tune)", "warm run's winner", ta[0] / tb[0], row["note"], verdict)
            )
        print(f"| {row['shape']} | " + " | ".join(cells) + f" | {'yes' if agree else 'no'} |")
    print(
        "\nWithin 1% of the fastest: "
        + ", ".join(f"{name} {n} of {len(checked)}" for name, n in within.items())
        + f"; the re-tune agrees on {same} of {len(checked)} (target >= 95%)."
    )
    if baseline:
        better = sum(
            1
            for row in checked
            if (w := one["winners"].get(row["key"]))
            and (b := baseline["winners"].get(row["key"]))
            and (tw := row["timed"].get(w[0]))
            and (tb := row["timed"].get(b[0]))
            and tw[0] <= tb[0] * (1 + WITHIN)
        )
        changed = sum(
            1
            for row in checked
            if one["winners"].get(row["key"], ("",))[0] != baseline["winners"].get(row["key"], ("-",))[0]
        )
        print(
            f"Against the baseline's winners: {better} of {len(checked)} within 1% or faster; {changed} winners changed."
        )
    return rows


def _side_row(shape: str, peer: str, ratio: float, note: str, config: str = "") -> dict:
    return {
        "kernel": "matmul sweep winner",
        "shape": shape,
        "ours_ms": "",
        "peer": peer,
        "ratio": round(ratio, 4),
        "timing_method": note,
        "config": config,
    }


def record_rows(args, shapes, budget, runs, one, cold, parallel, side_by_side) -> None:
    job_set = f"{args.jobs}: {len(shapes)} shapes x {budget} configs, grid"
    rows = [
        {
            "kernel": "matmul sweep",
            "shape": job_set,
            "ours_ms": round(one["wall_s"] * 1e3),
            "peer": "target",
            "peer_ms": WARM_S * 1e3,
            "ratio": round(WARM_S / one["wall_s"], 3),
            "timing_method": "wall clock, 1 GPU, Triton cache warm",
        },
        {
            "kernel": "matmul sweep",
            "shape": job_set,
            "ours_ms": round(cold["wall_s"] * 1e3),
            "peer": "target",
            "peer_ms": COLD_S * 1e3,
            "ratio": round(COLD_S / cold["wall_s"], 3),
            "timing_method": "wall clock, 1 GPU, Triton cache cold",
        },
    ]
    if parallel is not None:
        rows.append(
            {
                "kernel": "matmul sweep",
                "shape": job_set,
                "ours_ms": round(parallel["wall_s"] * 1e3),
                "peer": "1 GPU",
                "peer_ms": round(one["wall_s"] * 1e3),
                "ratio": round(one["wall_s"] / parallel["wall_s"], 3),
                "timing_method": f"wall clock, {args.gpus} GPUs against 1, Triton cache warm",
            }
        )
    for run in runs:
        rows.append(
            {
                "kernel": "sweep start-up",
                "shape": f"first trial measured, --gpus {run['gpus']} ({job_set})",
                "ours_ms": round(run["first_trial_s"] * 1e3),
                "peer": "target",
                "peer_ms": FIRST_TRIAL_S * 1e3,
                "ratio": round(FIRST_TRIAL_S / run["first_trial_s"], 3) if run["first_trial_s"] > 0 else "",
                "timing_method": "timeline, " + ("Triton cache cold" if run is cold else "Triton cache warm"),
            }
        )
        if run["busy"] is not None:
            rows.append(
                {
                    "kernel": "sweep GPU busy",
                    "shape": f"{run['name']} ({job_set})",
                    "ours_ms": "",
                    "peer": "target share",
                    "ratio": round(run["busy"] / BUSY, 3),
                    "timing_method": f"nvidia-smi utilization every 100 ms: {run['busy']:.0%} of the run",
                }
            )
    rows += side_by_side
    record("multi_gpu_sweep", [r for r in rows if not (isinstance(r["ours_ms"], float) and math.isnan(r["ours_ms"]))])


if __name__ == "__main__":
    main()
