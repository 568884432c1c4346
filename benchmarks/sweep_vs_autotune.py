"""Tuning wall time: a tunesvc sweep vs a plain triton.autotune over the same 16 configs.

    python benchmarks/sweep_vs_autotune.py

Per shape, each tuner runs in a fresh process with an empty Triton cache (TRITON_CACHE_DIR), so
both compile everything: triton.autotune's first call (compile + time every config in turn)
against tunesvc's grid sweep of the same list into a fresh database (constraints prune the
configs that cannot fit the device before compiling; the rest compile in parallel worker
processes, each checked against the reference and timed as soon as it is compiled). Both clocks
start with torch imported and the device read (autotune's inputs made); the sweep's clock
includes creating the database. Then the two picked configs are timed side by side here,
interleaved, with do_bench.

The sweep runs twice: with the workers' server (a forkserver that imports torch, triton and
tunesvc, seconds) started inside its clock ("cold", as a fresh ``tune sweep`` process), and
started before the clock ("warm": ``tunesvc.start_forkserver(wait=True)`` at process start, as a
long-lived process would, in the way autotune's side has torch and CUDA ready before its clock).

A second table splits the sweep's wall time into its phases (``ProblemResult.phases``, plus
opening the store): what the sweep waited on. "like autotune" leaves out the work autotune does
not do (the database, the finalists' re-measurement, timing the torch peer).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

from _common import print_table
from _common import require_gpu

import torch
import triton.testing

from tunesvc.sweep import PHASES

SHAPES = [(4096, 4096, 4096), (128, 14336, 4096), (2048, 4096, 14336)]
#: phases of the sweep that triton.autotune's first call has no counterpart for
EXTRA = ("store open", "finalists", "torch peer")

AUTOTUNE = """
import json, sys, time, torch
sys.path.insert(0, {bench!r})
from matmul import autotuned_matmul
m, n, k = {shape}
a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16); b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
run, kernel = autotuned_matmul()
torch.cuda.synchronize(); start = time.perf_counter(); run(a, b); torch.cuda.synchronize()
wall = time.perf_counter() - start
c = kernel.best_config
print(json.dumps({{"wall": wall, "config": {{**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages}}}}))
"""

SWEEP = """
import json, sys, time
sys.path.insert(0, {bench!r})
from matmul import TUTORIAL
from tunesvc.bench import start_forkserver
from tunesvc.device import current_device
from tunesvc.kernels.matmul import TEMPLATE
from tunesvc.store import Store
from tunesvc.sweep import run_sweep
m, n, k = {shape}
configs = [{{**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages}} for c in TUTORIAL]
problem = TEMPLATE.problem(M=m, N=n, K=k, dtype="{dtype}")
current_device()  # read before the clock, as autotune's side makes its inputs before its own
if {warm!r}:  # the workers' server started with the process, as a long-lived process would
    start_forkserver(wait=True)
start = time.perf_counter()
start_forkserver()  # as `tune sweep` does: the workers' server imports torch while the store is made
store = Store({db!r})
opened = time.perf_counter() - start
[r] = run_sweep(TEMPLATE, [problem], store, strategy="grid", candidates=configs, workers={workers})
wall = time.perf_counter() - start
print(json.dumps({{"wall": wall, "config": r.winner, "trials": r.trials_stored,
                  "phases": {{"store open": opened, **r.phases}}}}))
"""


def fresh_process(code: str) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TRITON_CACHE_DIR": cache}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def sweep_in_fresh_process(shape: tuple[int, int, int], workers: int, dtype: str = "bfloat16", warm: bool = False) -> dict:
    """tunesvc's side: the grid sweep of the tutorial's configs, in a fresh process and database;
    ``warm``: the workers' server was started (and had imported torch) before the clock."""
    bench_dir = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as tmp:
        return fresh_process(SWEEP.format(bench=bench_dir, shape=shape, db=f"{tmp}/t.db", workers=workers, dtype=dtype,
                                          warm=warm))


def phase_columns() -> list[str]:
    return ["store open", *PHASES]


def table_rows(shape: tuple[int, int, int], at: dict, cold: dict, warm: dict, times: dict[str, float]) -> tuple[list, list]:
    """One shape's row of each table, from the tuners' results and the picked configs' times (ms)."""
    name = "x".join(map(str, shape))
    row = [name, at["wall"]]
    for sw in (cold, warm):
        like = sw["wall"] - sum(sw["phases"].get(p, 0.0) for p in EXTRA)
        row += [sw["wall"], f"{sw['wall'] / at['wall']:.2f}x", f"{like / at['wall']:.2f}x"]
    row.append(f"{times['autotune']:.4f}")
    for side, sw in (("cold", cold), ("warm", warm)):
        same = " (same config)" if at["config"] == sw["config"] else ""
        row.append(f"{times[side]:.4f} = {times[side] / times['autotune']:.3f}x{same}")
    phase_rows = [[f"{name} ({side})", sw["trials"], at["wall"], sw["wall"], *(f"{sw['phases'].get(p, 0.0):.2f}" for p in phase_columns())]
                  for side, sw in (("cold", cold), ("warm", warm))]
    return row, phase_rows


def main() -> int:
    from tunesvc.kernels.matmul import launch_matmul

    require_gpu("benchmarks/sweep_vs_autotune.py")
    bench_dir = os.path.dirname(os.path.abspath(__file__))
    workers = min(16, os.cpu_count() or 1)
    rows, phase_rows = [], []
    for shape in SHAPES:
        results = {
            "autotune": fresh_process(AUTOTUNE.format(bench=bench_dir, shape=shape)),
            "cold": sweep_in_fresh_process(shape, workers),
            "warm": sweep_in_fresh_process(shape, workers, warm=True),
        }
        m, n, k = shape
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        samples: dict[str, list[float]] = {name: [] for name in results}
        for _ in range(3):  # interleaved, so drift hits all alike
            for name, result in results.items():
                samples[name].append(triton.testing.do_bench(lambda: launch_matmul(a, b, result["config"]), quantiles=[0.5]))
        times = {name: statistics.median(s) for name, s in samples.items()}
        print(shape, json.dumps(results), json.dumps(times), flush=True)
        row, phase_row = table_rows(shape, results["autotune"], results["cold"], results["warm"], times)
        rows.append(row)
        phase_rows += phase_row
    print_table(
        f"Tuning time against triton.autotune (16 tutorial configs, bf16, {workers} compile workers)",
        ["M x N x K", "autotune 1st call s", "sweep, server cold s", "cold / autotune", "like autotune, cold",
         "sweep, server warm s", "warm / autotune", "like autotune, warm", "picked: autotune ms",
         "picked: cold ms", "picked: warm ms"],
        rows,
    )
    print_table("Where the sweep's wall time went (s; what the sweep process waited on)",
                ["M x N x K", "trials", "autotune s", "sweep s", *phase_columns()], phase_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
