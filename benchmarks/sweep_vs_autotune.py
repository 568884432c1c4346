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

The sweep runs three times. "fork", as ``tune sweep`` and ``run_sweep`` now run: the process
reads its device in a forked child (``fork_safe_current_device``), so CUDA stays uninitialised
in it and its compile and measuring workers are forked from it, with everything imported.
"server, cold": the process has initialised CUDA before the clock (a process that already used
the GPU), so the workers come from a forkserver that imports torch, triton and tunesvc (seconds)
inside the clock; "server, warm": that server was started before the clock
(``tunesvc.start_forkserver(wait=True)``), as a long-lived process would.

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

import torch
import triton.testing
from _common import print_table
from _common import require_gpu

from tunesvc.tuning.sweep import PHASES

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
from tunesvc.device import current_device, fork_safe_current_device
from tunesvc.kernels.matmul import TEMPLATE
from tunesvc.store import Store
from tunesvc.tuning.sweep import run_sweep
m, n, k = {shape}
configs = [{{**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages}} for c in TUTORIAL]
problem = TEMPLATE.problem(M=m, N=n, K=k, dtype="{dtype}")
# the device read before the clock, as autotune's side makes its inputs before its own
read = time.perf_counter()
fork_safe_current_device() if {mode!r} == "fork" else current_device()
read = time.perf_counter() - read
if {mode!r} == "warm":  # the workers' server started with the process, as a long-lived process would
    start_forkserver(wait=True)
start = time.perf_counter()
if {mode!r} == "cold":
    start_forkserver()  # the workers' server imports torch while the store is made
store = Store({db!r})
opened = time.perf_counter() - start
[r] = run_sweep(TEMPLATE, [problem], store, strategy="grid", candidates=configs, workers={workers})
wall = time.perf_counter() - start
print(json.dumps({{"wall": wall, "config": r.winner, "trials": r.trials_stored, "device read": read,
                  "phases": {{"store open": opened, **r.phases}}}}))
"""

MODES = {"fork": "fork", "cold": "server, cold", "warm": "server, warm"}


def fresh_process(code: str) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TRITON_CACHE_DIR": cache}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def sweep_in_fresh_process(shape: tuple[int, int, int], workers: int, mode: str, dtype: str = "bfloat16") -> dict:
    """tunesvc's side: the grid sweep of the tutorial's configs, in a fresh process and database,
    its workers forked from it or from a server started inside ("cold") or before ("warm") the clock."""
    bench_dir = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as tmp:
        return fresh_process(
            SWEEP.format(bench=bench_dir, shape=shape, db=f"{tmp}/t.db", workers=workers, dtype=dtype, mode=mode)
        )


def phase_columns() -> list[str]:
    return ["store open", *PHASES]


def table_rows(shape: tuple[int, int, int], results: dict[str, dict], times: dict[str, float]) -> tuple[list, list]:
    """One shape's row of each table, from the tuners' results and the picked configs' times (ms)."""
    name = "x".join(map(str, shape))
    at = results["autotune"]
    row = [name, at["wall"]]
    for mode in MODES:
        sw = results[mode]
        like = sw["wall"] - sum(sw["phases"].get(p, 0.0) for p in EXTRA)
        row += [sw["wall"], f"{sw['wall'] / at['wall']:.2f}x", f"{like / at['wall']:.2f}x"]
    row.append(f"{times['autotune']:.4f}")
    for mode in MODES:
        same = " (same config)" if at["config"] == results[mode]["config"] else ""
        row.append(f"{times[mode]:.4f} = {times[mode] / times['autotune']:.3f}x{same}")
    phase_rows = [
        [
            f"{name} ({title})",
            results[mode]["trials"],
            f"{results[mode]['device read']:.2f}",
            at["wall"],
            results[mode]["wall"],
            *(f"{results[mode]['phases'].get(p, 0.0):.2f}" for p in phase_columns()),
        ]
        for mode, title in MODES.items()
    ]
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
            **{mode: sweep_in_fresh_process(shape, workers, mode) for mode in MODES},
        }
        m, n, k = shape
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        samples: dict[str, list[float]] = {name: [] for name in results}
        for _ in range(3):  # interleaved, so drift hits all alike
            for name, result in results.items():
                samples[name].append(
                    triton.testing.do_bench(lambda: launch_matmul(a, b, result["config"]), quantiles=[0.5])
                )
        times = {name: statistics.median(s) for name, s in samples.items()}
        print(shape, json.dumps(results), json.dumps(times), flush=True)
        row, phase_row = table_rows(shape, results, times)
        rows.append(row)
        phase_rows += phase_row
    print_table(
        f"Tuning time against triton.autotune (16 tutorial configs, bf16, {workers} compile workers)",
        [
            "M x N x K",
            "autotune 1st call s",
            *(f"{title}{column}" for title in MODES.values() for column in (" s", " / autotune", ", like autotune")),
            "picked: autotune ms",
            *(f"picked: {title} ms" for title in MODES.values()),
        ],
        rows,
    )
    print_table(
        "Where the sweep's wall time went (s; what the sweep process waited on; device read: before the clock)",
        ["M x N x K", "trials", "device read", "autotune s", "sweep s", *phase_columns()],
        phase_rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
