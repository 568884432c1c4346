"""A fixed set of GEMM jobs swept on one GPU, then on two: wall time, winners, lost or duplicated trials.

    python benchmarks/multi_gpu_sweep.py           # needs 2 GPUs (nvidia-h200-x2)
    python benchmarks/multi_gpu_sweep.py --check   # 2 small shapes, budget 2: checks the script

Runs `tune sweep matmul --gpus 0` and `tune sweep matmul --gpus 0,1` into two fresh SQLite files
(the GEMM benchmark's 11 shapes, or --six, grid strategy, the same --budget, so both measure the
same configs), prints each worker's jobs with the time each finished, and one
table: wall time of each, the ratio (target: 2 GPUs <= 0.6x one GPU), trials stored and
distinct per run (none lost or duplicated: both equal shapes x budget), and how many shapes have
the same winner, or one within 3% of the one-GPU run's time (measurement noise).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import UTC
from datetime import datetime

#: the GEMM benchmark's shapes (benchmarks/matmul.py: the matmul template's "llm" and "skinny" presets)
SHAPES = [
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
#: the six shapes of the first 2-GPU runs (--six)
SIX = SHAPES[:2] + ["16x4096x4096", "128x14336x4096", "2048x4096x14336", "1000x3000x777"]
CHECK_SHAPES = ["37x45x29", "100x70x50"]  # tiny: also runs in the CPU interpreter


def sweep(db: str, gpus: str, shapes: list[str], budget: int) -> tuple[float, list[dict]]:
    command = [
        sys.executable,
        "-m",
        "tunesvc",
        "sweep",
        "matmul",
        "--budget",
        str(budget),
        "--gpus",
        gpus,
        "--db",
        db,
        "--json",
    ]
    for shape in shapes:
        command += ["--shape", shape]
    start = time.perf_counter()
    out = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if out.returncode:
        raise SystemExit(f"tune sweep --gpus {gpus} failed:\n{out.stderr[-3000:]}")
    return wall, json.loads(out.stdout)


def timeline(db: str, start: datetime) -> list[str]:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=32, help="configs per shape (grid order) [32]")
    parser.add_argument("--six", action="store_true", help="only the six shapes of the first runs")
    parser.add_argument("--check", action="store_true", help="2 small shapes, budget 2")
    args = parser.parse_args()
    shapes, budget = (CHECK_SHAPES, 2) if args.check else (SIX if args.six else SHAPES, args.budget)
    with tempfile.TemporaryDirectory() as folder:
        one_db, two_db = os.path.join(folder, "one.db"), os.path.join(folder, "two.db")
        starts = [datetime.now(UTC).replace(tzinfo=None)]  # the jobs table's clock: naive UTC
        one_s, one = sweep(one_db, "0", shapes, budget)
        starts.append(datetime.now(UTC).replace(tzinfo=None))
        two_s, two = sweep(two_db, "0,1", shapes, budget)
        one_counts, two_counts = trial_counts(one_db), trial_counts(two_db)
        for name, db, start in (("1 GPU", one_db, starts[0]), ("2 GPUs", two_db, starts[1])):
            print(f"{name}:", *timeline(db, start), sep="\n  ")
    by_key = {r["shape_key"]: r for r in one}
    same = sum(
        r["winner"] == by_key[r["shape_key"]]["winner"]
        or (r["winner_ms"] is not None and abs(r["winner_ms"] / by_key[r["shape_key"]]["winner_ms"] - 1) <= 0.03)
        for r in two
    )
    expected = len(shapes) * budget
    print(
        "| run | wall s | ratio 2 GPUs / 1 (target <= 0.6) | trials stored / distinct (expected) | same winner (within 3%) |"
    )
    print("|---|---|---|---|---|")
    print(f"| 1 GPU | {one_s:.1f} | | {one_counts[0]} / {one_counts[1]} ({expected}) | |")
    print(
        f"| 2 GPUs | {two_s:.1f} | {two_s / one_s:.2f} | {two_counts[0]} / {two_counts[1]} ({expected}) | {same} of {len(two)} |"
    )


if __name__ == "__main__":
    main()
