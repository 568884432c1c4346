"""Where `tune sweep --gpus` spends the time from the command's start to its first stored trial.

    python benchmarks/startup.py --gpus 0,1                       # the GEMM job set's first shapes, budget 32
    python benchmarks/startup.py --gpus 0 --shape 37x45x29 --budget 2 --runs 2   # CPU (interpreter)

Runs the command ``--runs`` times (each into a fresh SQLite file; the first may find Triton's
cache cold, later ones find it warm) with ``TUNESVC_TIMELINE`` set, so every process of the sweep
(the command, its workers, their compile and measuring processes) logs its milestones
(tunesvc/timeline.py). Prints, per run, each milestone's time from the command's start (the
earliest process to reach it) and the step from the milestone before, then the first stored
trial's time against the target (:data:`TARGET_S` on a warm host, issue 55), and appends the
rows to benchmarks/results/startup.csv (kernel "sweep start-up", shape "<role>: <milestone>",
ours_ms = ms from the command's start, timing_method "timeline, run N"), with one row per run
whose shape is "first trial stored", peer "target" and peer_ms the target (ratio above 1: met).

A warm host is one where a sweep ran before: its resident process (tunesvc/cli/_resident.py) has
torch, Triton and the kernels imported. The runs start on a host without one (a socket folder of
their own); the first starts it, and each later run waits until it listens, then goes through it
("resident process" in timing_method). ``--no-resident`` runs every one in a fresh process.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time

from _common import record

from tunesvc.timeline import ENV
from tunesvc.timeline import read

#: the first shapes of benchmarks/multi_gpu_sweep.py's GEMM job set
SHAPES = ["4096x4096x4096", "8192x8192x8192"]
#: seconds from `tune sweep`'s start to its first stored trial that a warm host should not exceed
TARGET_S = 5.0
#: the milestone of the first trial in the database (tunesvc/tuning/sweep.py)
FIRST_TRIAL = "first trials stored"
#: seconds a run waits for the resident process the run before it started (its imports: seconds)
RESIDENT_WAIT_S = 120.0


def command_for(args: argparse.Namespace, db: str) -> list[str]:
    command = [sys.executable, "-m", "tunesvc", "sweep", args.kernel, "--gpus", args.gpus, "--db", db, "--json"]
    command += ["--budget", str(args.budget)]
    for shape in args.shape or SHAPES:
        command += ["--shape", shape]
    if args.workers is not None:
        command += ["--workers", str(args.workers)]
    return command


def run_timed(command: list[str], log: str, env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """Run ``command`` with its timeline in ``log``; returns its start and end (unix time) and stdout."""
    start = time.time()
    out = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {}), ENV: log})
    end = time.time()
    if out.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{out.stderr[-3000:]}")
    return start, end, out.stdout


def wait_for_resident(folder: str) -> bool:
    """Whether a resident process listens under ``folder`` (the runs' XDG_RUNTIME_DIR), waiting for it."""
    deadline = time.monotonic() + RESIDENT_WAIT_S
    while time.monotonic() < deadline:
        if glob.glob(os.path.join(folder, "tunesvc-*", "resident-*.sock")):
            return True
        if glob.glob(os.path.join(folder, "tunesvc-*", "resident-*.failed")):
            return False
        time.sleep(0.2)
    return False


def breakdown(log: str, start: float, end: float) -> list[dict]:
    """Each (process role, milestone) at the earliest time any process of that role reached it."""
    first: dict[tuple[str, str], float] = {}
    pids: dict[tuple[str, str], set[int]] = {}
    for e in read(log):
        key = (e["role"], e["event"])
        first.setdefault(key, e["t"] - start)
        pids.setdefault(key, set()).add(e["pid"])
    rows = [
        {"role": role, "event": event, "at_s": at, "processes": len(pids[(role, event)])}
        for (role, event), at in sorted(first.items(), key=lambda item: item[1])
    ]
    rows.append({"role": "command", "event": "exited", "at_s": end - start, "processes": 1})
    return rows


def print_breakdown(title: str, rows: list[dict]) -> None:
    print(f"\n### {title}\n")
    print("| process | milestone | s from start | step s | processes |")
    print("|---|---|---|---|---|")
    previous = 0.0
    for r in rows:
        print(f"| {r['role']} | {r['event']} | {r['at_s']:.2f} | {r['at_s'] - previous:+.2f} | {r['processes']} |")
        previous = max(previous, r["at_s"])


def first_trial_s(rows: list[dict]) -> float | None:
    """Seconds from the command's start to the first trial stored by any worker (None: none was)."""
    return min((r["at_s"] for r in rows if r["event"] == FIRST_TRIAL), default=None)


def verdict(first_s: float | None) -> str:
    if first_s is None:
        return "no trial stored"
    if first_s <= TARGET_S:
        return f"first trial stored at {first_s:.2f} s (target {TARGET_S:g} s: met)"
    return f"first trial stored at {first_s:.2f} s (target {TARGET_S:g} s: {first_s - TARGET_S:.2f} s over)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="0", help="as tune sweep --gpus [0]")
    parser.add_argument("--kernel", default="matmul")
    parser.add_argument("--shape", action="append", help=f"repeatable [{' '.join(SHAPES)}]")
    parser.add_argument("--budget", type=int, default=32)
    parser.add_argument("--workers", type=int, help="tune sweep --workers (compile processes per worker)")
    parser.add_argument("--runs", type=int, default=2, help="runs in a row (the first may compile cold) [2]")
    parser.add_argument("--label", default="", help="added to the CSV rows' timing_method (e.g. the code measured)")
    parser.add_argument("--no-resident", action="store_true", help="every run in a fresh process (TUNESVC_RESIDENT=0)")
    args = parser.parse_args()
    csv_rows = []
    firsts: list[float | None] = []
    with tempfile.TemporaryDirectory() as folder:
        runtime = os.path.join(folder, "runtime")
        os.mkdir(runtime, 0o700)
        # the resident process exits within a minute of the runs, its socket gone with this folder
        env = {"XDG_RUNTIME_DIR": runtime, "TUNESVC_RESIDENT": "0" if args.no_resident else "1"}
        for index in range(1, args.runs + 1):
            resident = index > 1 and not args.no_resident and wait_for_resident(runtime)
            log = os.path.join(folder, f"run{index}.jsonl")
            start, end, _ = run_timed(command_for(args, os.path.join(folder, f"run{index}.db")), log, env)
            rows = breakdown(log, start, end)
            if resident and not any(r["event"] == "resident process forked" for r in rows):
                raise SystemExit(f"run {index}: a resident process listened, but the sweep did not run in it")
            command = f"tune sweep {args.kernel} --gpus {args.gpus} --budget {args.budget}"
            print_breakdown(f"run {index}: {command}", rows)
            first_s = first_trial_s(rows)
            print(f"\nrun {index}: {verdict(first_s)}")
            how = "resident process" if resident else "fresh process"
            method = f"timeline, run {index}, {how}" + (f", {args.label}" if args.label else "")
            for r in rows:
                csv_rows.append(
                    {
                        "kernel": "sweep start-up",
                        "shape": f"{r['role']}: {r['event']} ({command})",
                        "ours_ms": round(r["at_s"] * 1e3, 1),
                        "timing_method": method,
                    }
                )
            if first_s is not None:
                csv_rows.append(
                    {
                        "kernel": "sweep start-up",
                        "shape": f"first trial stored ({command})",
                        "ours_ms": round(first_s * 1e3, 1),
                        "peer": "target",
                        "peer_ms": TARGET_S * 1e3,
                        "ratio": round(TARGET_S / first_s, 3),
                        "timing_method": method,
                    }
                )
            firsts.append(first_s)
    record("startup", csv_rows)
    measured = [f for f in firsts if f is not None]
    if measured:
        print(
            f"first trial stored: {', '.join(f'{f:.2f}' for f in measured)} s over {len(firsts)} runs; target {TARGET_S:g} s"
        )


if __name__ == "__main__":
    main()
