"""Tuning wall time: a tunesvc sweep vs a plain triton.autotune over the same 16 configs.

    python benchmarks/sweep_vs_autotune.py

Per shape, each tuner runs in a fresh process with an empty Triton cache (TRITON_CACHE_DIR), so
both compile everything: triton.autotune's first call (compile + time every config in turn)
against tunesvc's grid sweep of the same list (constraints prune the configs that cannot fit
the device before compiling; the rest compile in parallel worker processes, then each is checked
against the reference and timed). Then the two picked configs are timed side by side here,
interleaved, with do_bench.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import triton.testing

SHAPES = [(4096, 4096, 4096), (128, 14336, 4096), (2048, 4096, 14336)]

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
from tunesvc.kernels.matmul import TEMPLATE
from tunesvc.store import Store
from tunesvc.sweep import run_sweep
m, n, k = {shape}
configs = [{{**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages}} for c in TUTORIAL]
problem = TEMPLATE.problem(M=m, N=n, K=k, dtype="bfloat16")
store = Store({db!r})
start = time.perf_counter()
[r] = run_sweep(TEMPLATE, [problem], store, strategy="grid", candidates=configs, workers={workers})
wall = time.perf_counter() - start
print(json.dumps({{"wall": wall, "config": r.winner, "trials": r.trials_stored,
                  "compile": r.compile_seconds, "measure": r.measure_seconds}}))
"""


def fresh_process(code: str) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TRITON_CACHE_DIR": cache}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    from tunesvc.kernels.matmul import launch_matmul

    bench_dir = os.path.dirname(os.path.abspath(__file__))
    workers = min(16, os.cpu_count() or 1)
    rows = []
    for shape in SHAPES:
        at = fresh_process(AUTOTUNE.format(bench=bench_dir, shape=shape))
        with tempfile.TemporaryDirectory() as tmp:
            sw = fresh_process(SWEEP.format(bench=bench_dir, shape=shape, db=f"{tmp}/t.db", workers=workers))
        m, n, k = shape
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        times = {"autotune": [], "tunesvc": []}
        for _ in range(3):  # interleaved, so drift hits both alike
            for name, result in (("autotune", at), ("tunesvc", sw)):
                times[name].append(triton.testing.do_bench(lambda: launch_matmul(a, b, result["config"]), quantiles=[0.5]))
        t_at, t_sw = statistics.median(times["autotune"]), statistics.median(times["tunesvc"])
        rows.append((shape, at["wall"], sw, t_at, t_sw))
        print(shape, at, sw, t_at, t_sw, flush=True)
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, bf16, "
          f"{workers} compile workers, {time.strftime('%Y-%m-%d')}\n")
    print("| M x N x K | autotune 1st call s | tunesvc sweep s (compile wait + check & time) | sweep / autotune | picked: autotune ms | picked: tunesvc ms | tunesvc / autotune time |")
    print("|---|---|---|---|---|---|---|")
    for shape, w_at, sw, t_at, t_sw in rows:
        w_sw = sw["wall"]
        print(f"| {'x'.join(map(str, shape))} | {w_at:.1f} | {w_sw:.1f} ({sw['compile']:.1f} + {sw['measure']:.1f}) | "
              f"{w_sw / w_at:.2f}x | {t_at:.4f} | {t_sw:.4f} | {t_sw / t_at:.3f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
