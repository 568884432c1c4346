"""A sweep's fixed costs, the ones no kernel pays for: on the CPU (interpreter) or a GPU.

    python benchmarks/sweep_overhead.py [--runs 3]

Each probe runs in a fresh process, --runs times (min / median / max): importing torch, then
tunesvc (with triton); creating and migrating a fresh SQLite store; the measuring process ready
(its inputs and reference made) with the workers' forkserver cold (it imports torch and triton
first) and warm; a compile pool of 2 with its first candidate compiled, cold; the wall time of
measuring one candidate of a tiny GEMM in this process and in the measuring process (their
difference is what isolation costs per candidate). Last, a tiny isolated sweep of 8 candidates
with 2 compile workers and its phases (``ProblemResult.phases``). On a GPU, a compile worker's
steps (CUDA context, inputs, first compile) forked from a warm server, alone and 16 at once. Load from other processes
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

PROBES = ("imports", "store", "worker-cold", "worker-warm", "pool-cold", "per-candidate", "sweep", "pool-stages")
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
        return {
            "import torch": imported - start,
            "import tunesvc (triton, kernels, store, sweep)": time.perf_counter() - imported,
        }
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
            return {
                "Compiler(2) returns": started,
                "compile pool: first candidate compiled, cold": time.perf_counter() - tick,
            }
    if name == "per-candidate":
        figures = {}
        for label, measurer in (
            ("in process", Bench(TEMPLATE, problem, device)),
            ("in the measuring process", Worker(TEMPLATE, problem, device)),
        ):
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
    if name == "pool-stages":
        return pool_stages(device) if device.is_gpu else {}
    assert name == "sweep"
    store = Store(f"{tmp}/t.db")
    [result] = run_sweep(
        TEMPLATE,
        [problem],
        store,
        strategy="grid",
        candidates=configs,
        workers=2,
        isolate=True,
        finalists=3,
        device=device,
    )
    store.close()
    return {
        "sweep of 8 (isolated, 2 compile workers)": time.perf_counter() - tick,
        **{f"  phase: {phase}": seconds for phase, seconds in result.phases.items()},
    }


def _stages(template, problem, config, second=None) -> dict[str, float]:
    """In a compile worker: how long its CUDA context, its inputs, its first compile and (given
    ``second``) a second config's compile take."""
    import torch

    from tunesvc.device import current_device

    t0 = time.time()
    device = current_device()
    torch.empty(1, device="cuda")  # the context, for sure
    t1 = time.time()
    inputs = template.make_inputs(problem, device)
    torch.cuda.synchronize()
    t2 = time.time()
    if config is not None:  # None: a worker with nothing to compile (a sweep starts one per core)
        template.launch(inputs, config)
        torch.cuda.synchronize()
    t3 = time.time()
    if second is not None:
        template.launch(inputs, second)
        torch.cuda.synchronize()
    return {
        "started": t0,
        "CUDA context": t1 - t0,
        "inputs": t2 - t1,
        "first compile + launch": t3 - t2,
        "second compile + launch": time.time() - t3,
        "compiled": config is not None,
    }


def pool_stages(device) -> dict[str, float]:
    """A compile worker's steps, forked from a warm server, alone and with 15 others at once
    (the tutorial's GEMM configs at 4096^3, each compiled from an empty Triton cache)."""
    from concurrent.futures import ProcessPoolExecutor

    from matmul import TUTORIAL

    from tunesvc.bench import _forkserver
    from tunesvc.bench import start_forkserver
    from tunesvc.kernels.matmul import TEMPLATE

    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()  # before the server starts: its workers inherit it
    start_forkserver(wait=True)
    problem = TEMPLATE.problem(M=4096, N=4096, K=4096, dtype="bfloat16")
    configs = [{**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages} for c in TUTORIAL]
    configs = [c for c in configs if not TEMPLATE.violations(c, problem, device)]  # as the sweep prunes them
    figures = {}
    for n, batch in (
        (1, configs[:1]),
        (16, [*configs[2:], *[None] * (18 - len(configs))]),
    ):  # the 1-worker pool compiled the first two
        with ProcessPoolExecutor(n, mp_context=_forkserver()) as pool:
            submitted = time.time()
            second = configs[1] if n == 1 else None
            results = [f.result() for f in [pool.submit(_stages, TEMPLATE, problem, c, second) for c in batch]]
            done = time.time() - submitted
        label = f"{n} worker{'s' if n > 1 else ''}"
        figures[f"pool of {label}: fork to worker start (max)"] = max(r["started"] for r in results) - submitted
        for stage in ("CUDA context", "inputs", "first compile + launch"):
            values = [r[stage] for r in results if r["compiled"] or stage != "first compile + launch"]
            figures[f"pool of {label}: {stage} (median of workers)"] = statistics.median(values)
            figures[f"pool of {label}: {stage} (max)"] = max(values)
        if n == 1:
            figures["pool of 1 worker: second compile + launch"] = results[0]["second compile + launch"]
        figures[f"pool of {label}: all compiled"] = done
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--probe", choices=PROBES, help=argparse.SUPPRESS)  # one probe, in this process
    parser.add_argument("--only", nargs="+", choices=PROBES, help="run these probes only")
    args = parser.parse_args()
    if args.probe:
        print(json.dumps(probe(args.probe)))
        return 0
    figures: dict[str, list[float]] = {}
    for _ in range(args.runs):
        for name in args.only or PROBES:  # interleaved, so load drift hits every probe alike
            out = subprocess.run(
                [sys.executable, __file__, "--probe", name], capture_output=True, text=True, timeout=600
            )
            if out.returncode != 0:
                raise RuntimeError(out.stderr[-3000:])
            for figure, seconds in json.loads(out.stdout.strip().splitlines()[-1]).items():
                figures.setdefault(figure, []).append(seconds)
    from tunesvc.device import current_device

    print(
        f"\n{current_device().name}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} (1 min) at the end, "
        f"{time.strftime('%Y-%m-%d')}\n"
    )
    print("| fixed cost | runs | min s | median s | max s |\n|---|---|---|---|---|")
    for figure, values in figures.items():
        print(f"| {figure} | {len(values)} | {min(values):.3f} | {statistics.median(values):.3f} | {max(values):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
