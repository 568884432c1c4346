"""A sweep's fixed costs, the ones no kernel pays for: on the CPU (interpreter) or a GPU.

    python benchmarks/sweep_overhead.py [--runs 3]

Each probe runs in a fresh process, --runs times (min / median / max): importing torch, then
tunesvc (with triton); creating and migrating a fresh SQLite store; the measuring process ready
(its inputs and reference made) with the workers' forkserver cold (it imports torch and triton
first) and warm; a compile pool of 2 with its first candidate compiled, cold; the wall time of
measuring one candidate of a tiny GEMM in this process and in the measuring process (their
difference is what isolation costs per candidate). Last, a tiny isolated sweep of 8 candidates
with 2 compile workers and its phases (``ProblemResult.phases``). Load from other processes
moves every figure: run it on an idle machine, and note ``uptime``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

PROBES = ("imports", "store", "worker-cold", "worker-warm", "pool-cold", "per-candidate", "sweep")
SHAPE = {"M": 16, "N": 64, "K": 128, "dtype": "float32"}  # the heuristic fits: no enumeration of the space
CANDIDATES = 8


def probe(name: str) -> dict[str, float]:
    """Run one probe in this (fresh) process; figure name -> seconds."""
    start = time.perf_counter()
    import torch  # noqa: F401

    imported = time.perf_counter()
    import tunesvc.kernels  # noqa: F401  (sets TRITON_INTERPRET without a GPU, before it imports triton)
    from tunesvc.bench import Bench
    from tunesvc.bench import Compiler
    from tunesvc.bench import Worker
    from tunesvc.bench import start_forkserver
    from tunesvc.device import current_device
    from tunesvc.kernels.matmul import TEMPLATE
    from tunesvc.store import Store
    from tunesvc.sweep import run_sweep

    if name == "imports":
        return {"import torch": imported - start, "import tunesvc (triton, kernels, store, sweep)": time.perf_counter() - imported}
    device = current_device()
    problem = TEMPLATE.problem(**SHAPE)
    configs = TEMPLATE.feasible(problem, device)[:CANDIDATES]
    tmp = tempfile.mkdtemp()
    tick = time.perf_counter()
    if name == "store":
        Store(f"{tmp}/t.db").close()
        return {"fresh store: create + migrate": time.perf_counter() - tick}
    if name == "worker-cold":
        with Worker(TEMPLATE, problem, device) as worker:
            worker.wait_ready()
            return {"measuring process ready, forkserver cold": time.perf_counter() - tick}
    if name == "worker-warm":
        start_forkserver()
        with Worker(TEMPLATE, problem, device) as worker:
            worker.wait_ready()
        tick = time.perf_counter()
        with Worker(TEMPLATE, problem, device) as worker:
            worker.wait_ready()
            return {"measuring process ready, forkserver warm": time.perf_counter() - tick}
    if name == "pool-cold":
        with Compiler(2, template=TEMPLATE, problem=problem) as compiler:
            started = time.perf_counter() - tick
            next(compiler.compile_each(TEMPLATE, problem, configs[:1]))
            return {"Compiler(2) returns": started, "compile pool: first candidate compiled, cold": time.perf_counter() - tick}
    if name == "per-candidate":
        figures = {}
        for label, measurer in (("in process", Bench(TEMPLATE, problem, device)), ("in the measuring process", Worker(TEMPLATE, problem, device))):
            measurer.measure(configs[0])  # the first launch pays for the process's own warm-up
            walls = []
            for config in configs:
                tick = time.perf_counter()
                m = measurer.measure(config)
                assert m.ok, m.message
                walls.append(time.perf_counter() - tick)
            if isinstance(measurer, Worker):
                measurer.close()
            figures[f"measuring a candidate (check + timing), {label}"] = statistics.median(walls)
        return figures
    assert name == "sweep"
    store = Store(f"{tmp}/t.db")
    [result] = run_sweep(TEMPLATE, [problem], store, strategy="grid", candidates=configs, workers=2, isolate=True,
                         finalists=3, device=device)
    store.close()
    return {"sweep of 8 (isolated, 2 compile workers)": time.perf_counter() - tick,
            **{f"  phase: {phase}": seconds for phase, seconds in result.phases.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--probe", choices=PROBES, help=argparse.SUPPRESS)  # one probe, in this process
    args = parser.parse_args()
    if args.probe:
        print(json.dumps(probe(args.probe)))
        return 0
    figures: dict[str, list[float]] = {}
    for _ in range(args.runs):
        for name in PROBES:  # interleaved, so load drift hits every probe alike
            out = subprocess.run([sys.executable, __file__, "--probe", name], capture_output=True, text=True, timeout=600)
            if out.returncode != 0:
                raise RuntimeError(out.stderr[-3000:])
            for figure, seconds in json.loads(out.stdout.strip().splitlines()[-1]).items():
                figures.setdefault(figure, []).append(seconds)
    from tunesvc.device import current_device

    print(f"\n{current_device().name}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} (1 min) at the end, "
          f"{time.strftime('%Y-%m-%d')}\n")
    print("| fixed cost | runs | min s | median s | max s |\n|---|---|---|---|---|")
    for figure, values in figures.items():
        print(f"| {figure} | {len(values)} | {min(values):.3f} | {statistics.median(values):.3f} | {max(values):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
