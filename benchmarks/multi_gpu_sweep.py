"""A fixed set of GEMM jobs swept on one GPU, then on N: wall time, first-trial latency, winners,
lost or duplicated trials.

    python benchmarks/multi_gpu_sweep.py --gpus 2                 # the GEMM benchmark's 11 shapes, budget 32
    python benchmarks/multi_gpu_sweep.py --gpus 4 --jobs six --budget 16
    python benchmarks/multi_gpu_sweep.py --gpus 2 --jobs check    # 2 tiny shapes, budget 2: checks the script (CPU too)

Three runs of `tune sweep matmul --strategy grid --budget B --gpus ...`, each into a fresh SQLite
file, all sharing one fresh Triton cache folder: one GPU with that cache cold (it compiles
every config), then N GPUs and one GPU again, both with it warm (a warm host: its kernels
compiled before). The speed-up is the warm one-GPU run's wall time over the N-GPU run's (target:
N-GPU time at most 1 / (0.9 N) of one GPU's, 0.55x on two). Prints each run's start-up
breakdown (tunesvc/timeline.py; benchmarks/startup.py), each worker's jobs with the time each
finished, the first trial's latency from the command's start (target: 5 s on a warm host),
trials stored and distinct per run (none lost or duplicated: both equal shapes x budget), and how
many shapes have the same winner as the warm one-GPU run, or one within 3% of its time. The
first trial's latency is until it is measured; its batch is stored in one transaction once the
whole batch is measured (the "first batch stored" column). Appends
the wall times and latencies to benchmarks/results/multi_gpu_sweep.csv.
"""

from __future__ import annotations

import argparse
import math
import os
import sqlite3
import sys
import tempfile
from datetime import UTC
from datetime import datetime

from _common import record
from startup import breakdown
from startup import print_breakdown
from startup import run_timed

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
#: target first-trial latency on a warm host, seconds
FIRST_TRIAL_S = 5.0


def sweep(folder: str, name: str, gpus: str, shapes: list[str], budget: int, cache: str) -> dict:
    db, log = os.path.join(folder, f"{name}.db"), os.path.join(folder, f"{name}.jsonl")
    command = [sys.executable, "-m", "tunesvc", "sweep", "matmul", "--strategy", "grid", "--budget", str(budget)]
    command += ["--gpus", gpus, "--db", db, "--json"]
    for shape in shapes:
        command += ["--shape", shape]
    started = datetime.now(UTC).replace(tzinfo=None)  # the jobs table's clock: naive UTC
    start, end, _ = run_timed(command, log, {"TRITON_CACHE_DIR": cache})
    rows = breakdown(log, start, end)
    measured = [r["at_s"] for r in rows if r["event"] == "first trial measured"]
    stored = [r["at_s"] for r in rows if r["event"] == "first trials stored"]
    return {
        "name": name,
        "gpus": gpus,
        "db": db,
        "wall_s": end - start,
        "first_trial_s": min(measured) if measured else float("nan"),
        "first_stored_s": min(stored) if stored else float("nan"),
        "breakdown": rows,
        "timeline": job_timeline(db, started),
        "trials": trial_counts(db),
        "winners": winners(db),
    }


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


def winners(db: str) -> dict[str, tuple[str, float | None]]:
    """shape key -> (winning config's hash, its time in ms)."""
    con = sqlite3.connect(db)
    try:
        rows = con.execute("SELECT shape_key, config_hash, time_ms FROM tunesvc_winners").fetchall()
    finally:
        con.close()
    return {key: (h, ms) for key, h, ms in rows}


def same_winners(run: dict, reference: dict) -> int:
    """Shapes whose winner is the reference run's, or within 3% of its time."""
    same = 0
    for key, (h, ms) in run["winners"].items():
        ref = reference["winners"].get(key)
        if ref is not None and (h == ref[0] or (ms is not None and ref[1] and abs(ms / ref[1] - 1) <= 0.03)):
            same += 1
    return same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=2, help="GPUs of the N-GPU run (0 to N-1) [2]")
    parser.add_argument(
        "--jobs",
        default="gemm",
        help=f"the job set: {', '.join(JOB_SETS)} (gemm: the GEMM benchmark's 11 shapes), or shapes such as 4096x4096x4096,16x4096x4096 [gemm]",
    )
    parser.add_argument("--budget", type=int, help="configs per shape, in grid order [32; check: 2]")
    args = parser.parse_args()
    shapes = JOB_SETS.get(args.jobs) or [s.strip() for s in args.jobs.split(",") if s.strip()]
    budget = args.budget or (2 if args.jobs == "check" else 32)
    many = ",".join(str(i) for i in range(args.gpus))
    with tempfile.TemporaryDirectory() as folder:
        cache = os.path.join(folder, "triton-cache")
        runs = [
            sweep(folder, "1 GPU, cold Triton cache", "0", shapes, budget, cache),
            sweep(folder, f"{args.gpus} GPUs", many, shapes, budget, cache),
            sweep(folder, "1 GPU", "0", shapes, budget, cache),
        ]
    cold, parallel, one = runs
    for run in runs:
        print_breakdown(f"{run['name']}: start-up (--gpus {run['gpus']})", run["breakdown"])
        print(f"\n{run['name']}, jobs:", *run["timeline"], sep="\n  ")
    expected = len(shapes) * budget
    ratio = parallel["wall_s"] / one["wall_s"]
    target = math.floor(100 / (0.9 * args.gpus)) / 100  # 1 / (0.9 N), rounded down: 0.55 on two
    print(f"\n### {len(shapes)} matmul shapes x {budget} configs (grid), --jobs {args.jobs}\n")
    print(
        f"| run | wall s | / 1 GPU (target <= {target:.2f}) | first trial measured s (target <= {FIRST_TRIAL_S:g}, warm) "
        "| first batch stored s | trials stored / distinct (expected) | same winner as 1 GPU (within 3%) |"
    )
    print("|---|---|---|---|---|---|---|")
    for run in runs:
        share = f"{run['wall_s'] / one['wall_s']:.2f}" if run is parallel else ""
        same = f"{same_winners(run, one)} of {len(run['winners'])}" if run is not one else ""
        print(
            f"| {run['name']} | {run['wall_s']:.1f} | {share} | {run['first_trial_s']:.2f} | {run['first_stored_s']:.2f} "
            f"| {run['trials'][0]} / {run['trials'][1]} ({expected}) | {same} |"
        )
    job_set = f"{args.jobs}: {len(shapes)} shapes x {budget} configs, grid"
    rows = [
        {
            "kernel": "matmul sweep",
            "shape": job_set,
            "ours_ms": round(parallel["wall_s"] * 1e3),
            "peer": "1 GPU",
            "peer_ms": round(one["wall_s"] * 1e3),
            "ratio": round(1 / ratio, 3),
            "timing_method": f"wall clock, {args.gpus} GPUs against 1, Triton cache warm",
        },
        {
            "kernel": "matmul sweep",
            "shape": job_set,
            "ours_ms": round(cold["wall_s"] * 1e3),
            "timing_method": "wall clock, 1 GPU, Triton cache cold",
        },
    ]
    for run in runs:
        rows.append(
            {
                "kernel": "sweep start-up",
                "shape": f"first trial measured, --gpus {run['gpus']} ({job_set})",
                "ours_ms": round(run["first_trial_s"] * 1e3),
                "peer": "target",
                "peer_ms": FIRST_TRIAL_S * 1e3,
                "ratio": round(FIRST_TRIAL_S / run["first_trial_s"], 3),
                "timing_method": "timeline, " + ("Triton cache cold" if run is cold else "Triton cache warm"),
            }
        )
    record("multi_gpu_sweep", rows)


if __name__ == "__main__":
    main()
