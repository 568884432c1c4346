"""Host cost of the runtime: launches through tunesvc vs direct launches vs triton.autotune.

    python benchmarks/runtime_overhead.py            # on a GPU: launch overhead + lookup + bundle
    python benchmarks/runtime_overhead.py --cpu-only # bundle load and lookup only

Launch overhead: a tiny GEMM (64x64x64 fp16, cache hit), N launches timed on the host clock
with no sync between them (the launch path is what is measured), median of repeats. Bundle:
a synthetic bundle of 10,000 winners written to disk, then loaded by a fresh Runtime (time and
memory measured with tracemalloc).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import torch

import tunesvc
from tunesvc.device import current_device
from tunesvc.export import FORMAT
from tunesvc.export import FORMAT_VERSION
from tunesvc.kernels.matmul import TEMPLATE
from tunesvc.kernels.matmul import launch_matmul
from tunesvc.runtime import Runtime


def per_call_us(fn, calls: int, repeats: int = 7, sync=None) -> float:
    samples = []
    for _ in range(repeats):
        if sync:
            sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if sync:
            sync()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def synthetic_bundle(path: Path, device, n: int, extra: dict | None = None) -> None:
    config = TEMPLATE.heuristic(TEMPLATE.problem(M=4096, N=4096, K=4096), device)
    winners = {f"M={1 << (i % 14)},N={64 + i},K=4096,dtype=bfloat16": {"config": config, "time_ms": 0.1} for i in range(n)}
    winners.update({key: {"config": c, "time_ms": 0.1} for key, c in (extra or {}).items()})
    bundle = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "device": {"hardware_id": device.hardware_id, "name": device.name, "capability": device.capability, "sm_count": device.sm_count},
        "kernels": {"matmul": {"version": TEMPLATE.version, "torch": "", "triton": "", "winners": winners}},
    }
    path.write_text(json.dumps(bundle, indent=2, sort_keys=True))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu-only", action="store_true")
    args = parser.parse_args()
    device = current_device()
    rows = []

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bundle.json"
        synthetic_bundle(path, device, 10_000)
        start = time.perf_counter()
        runtime = Runtime(bundle=path, device=device)
        hit = runtime.lookup("matmul", M=4096, N=76, K=4096, dtype="bfloat16")
        load_ms = (time.perf_counter() - start) * 1e3
        tracemalloc.start()  # a second load, for memory: tracemalloc slows allocation down
        Runtime(bundle=path, device=device).lookup("matmul", M=4096, N=76, K=4096, dtype="bfloat16")
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert hit.source == "exact", hit
        rows.append(("load a 10,000-winner bundle + first lookup", f"{load_ms:.1f} ms", "<= 50 ms"))
        rows.append(("memory while loading it (tracemalloc peak)", f"{peak / 2**20:.1f} MB", "<= 20 MB"))
        lookup_us = per_call_us(lambda: runtime.lookup("matmul", M=4096, N=76, K=4096, dtype="bfloat16"), 2000)
        rows.append(("lookup() on a hit", f"{lookup_us:.2f} us", "<= 1 us"))
        memo_us = per_call_us(lambda: runtime.config_for(TEMPLATE, M=4096, N=76, K=4096, dtype=torch.bfloat16), 20000)
        rows.append(("config_for() on a hit (the launch path)", f"{memo_us:.2f} us", "<= 1 us"))

    if not args.cpu_only and device.is_gpu:
        # the autotune peer is the one benchmarks/matmul.py uses (same kernel, tutorial configs)
        from matmul import autotuned_matmul

        from tunesvc.kernels import matmul

        a = torch.randn(64, 64, device="cuda", dtype=torch.float16)
        b = torch.randn(64, 64, device="cuda", dtype=torch.float16)
        problem = TEMPLATE.problem(M=64, N=64, K=64)
        config = TEMPLATE.heuristic(problem, device)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "tiny.json"
            synthetic_bundle(path, device, 0, extra={str(TEMPLATE.key(problem)): config})
            tunesvc.configure(bundle=path)
            assert tunesvc.lookup("matmul", **problem).source == "exact"
        run_autotuned, _ = autotuned_matmul()
        run_autotuned(a, b)  # tunes once; later calls are autotune cache hits
        sync = torch.cuda.synchronize
        direct = per_call_us(lambda: launch_matmul(a, b, config), 2000, sync=sync)
        ours = per_call_us(lambda: matmul(a, b), 2000, sync=sync)
        autotuned = per_call_us(lambda: run_autotuned(a, b), 2000, sync=sync)
        rows.append(("launch: direct, fixed config", f"{direct:.1f} us", ""))
        rows.append(("launch: tunesvc.kernels.matmul (hit)", f"{ours:.1f} us", f"{ours / direct:.3f}x direct (<= 1.05x)"))
        rows.append(("launch: triton.autotune (hit)", f"{autotuned:.1f} us", f"{autotuned / direct:.3f}x direct"))
    print(f"\n{device.name}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}\n")
    print("| what | measured | target |")
    print("|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
