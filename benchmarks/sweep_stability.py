"""Stability: the same sweep twice picks winners within 2% of each other in measured time.

    python benchmarks/sweep_stability.py --db stability.db [--budget 30]

Per GEMM shape, two Optuna sweeps with the same seed and budget run into two fresh databases
(nothing is shared but Triton's compile cache), each ending with its finalists re-measured.
Their two winners are then timed side by side here, interleaved, with do_bench; the table gives
both winners' times and their difference (target: at most 2%); on a GPU also replayed from CUDA
graphs (GPU time alone: for a kernel of a few us, do_bench times the host's launch).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import tunesvc.kernels  # noqa: F401  (first: without a GPU it sets TRITON_INTERPRET before triton loads)

sys.path.insert(0, str(Path(__file__).parent))
from _common import bench_graph_ms
from _common import bench_ms
from _common import print_table
from _common import require_gpu

from tunesvc.device import current_device
from tunesvc.kernels.matmul import TEMPLATE
from tunesvc.store import Store
from tunesvc.tuning.sweep import run_sweep

SHAPES = [(4096, 4096, 4096), (1000, 3000, 777)]
CHECK_SHAPES = [(37, 45, 29)]
TARGET = 0.02
ROUNDS = 5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default="stability.db", help="base path: the two sweeps write NAME-1.db and NAME-2.db")
    parser.add_argument("--budget", type=int, default=30)
    parser.add_argument("--check", action="store_true", help="a tiny shape in the interpreter, budget 3")
    args = parser.parse_args()
    if not args.check:
        require_gpu("sweep_stability.py")
    device = current_device()
    shapes, budget = (CHECK_SHAPES, 3) if args.check else (SHAPES, args.budget)
    dtype = "float16" if args.check else "bfloat16"
    rows = []
    for m, n, k in shapes:
        problem = TEMPLATE.problem(M=m, N=n, K=k, dtype=dtype)
        winners, seconds = [], []
        for run in (1, 2):
            base = Path(args.db)
            path = base.with_name(f"{base.stem}-{run}{base.suffix or '.db'}")
            path.unlink(missing_ok=True)  # a fresh store, and so a fresh Optuna study (it lives in the file)
            store = Store(str(path))
            start = time.perf_counter()
            try:
                [result] = run_sweep(
                    TEMPLATE, [problem], store, strategy="optuna", budget=budget, seed=0, device=device
                )
            finally:
                store.close()
            seconds.append(time.perf_counter() - start)
            if result.winner is None:
                raise SystemExit(f"run {run} {result.shape_key}: no correct config in {budget} trials; see {path}.")
            winners.append(result.winner)
            print(
                f"run {run} {result.shape_key}: {result.winner} {result.winner_ms:.4g} ms in {seconds[-1]:.0f} s",
                flush=True,
            )
        first, second = _interleaved(problem, winners, device, bench_ms)
        diff = abs(first - second) / min(first, second)
        same = "same config" if winners[0] == winners[1] else "different configs"
        row = [f"{m}x{n}x{k}", first, second, f"{diff:.1%}", "yes" if diff <= TARGET else "no"]
        if device.is_gpu:  # GPU time alone: a kernel of a few us is timed as a launch by do_bench
            try:
                g1, g2 = _interleaved(problem, winners, device, bench_graph_ms)
                row += [g1, g2, f"{abs(g1 - g2) / min(g1, g2):.1%}"]
            except Exception as exc:  # a launch that cannot be captured
                row += ["-", "-", f"no graph: {type(exc).__name__}"]
        rows.append(row + [same, f"{seconds[0]:.0f} / {seconds[1]:.0f}"])
    graph = ["winner 1 graph ms", "winner 2 graph ms", "graph difference"] if device.is_gpu else []
    print_table(
        f"Same sweep twice (optuna, budget {budget}, seed 0): winners' times, interleaved (plain launches, then CUDA-graph replays)",
        ["M x N x K", "winner 1 ms", "winner 2 ms", "difference", f"<= {TARGET:.0%}", *graph, "configs", "sweep s"],
        rows,
    )


def _interleaved(problem, winners, device, timer) -> tuple[float, float]:
    """Median of ROUNDS alternating timings (``timer``) of the two winners on the same inputs."""
    inputs = TEMPLATE.make_inputs(problem, device)
    times: list[list[float]] = [[], []]
    for _ in range(ROUNDS):
        for i, config in enumerate(winners):
            if device.is_gpu:
                times[i].append(timer(lambda c=config: TEMPLATE.launch(inputs, c)))
            else:
                start = time.perf_counter()
                TEMPLATE.launch(inputs, config)
                times[i].append((time.perf_counter() - start) * 1e3)
    if device.is_gpu:
        torch.cuda.synchronize()
    return statistics.median(times[0]), statistics.median(times[1])


if __name__ == "__main__":
    main()
