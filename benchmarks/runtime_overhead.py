"""Host cost of the runtime: launches through tunesvc vs direct launches vs triton.autotune.

    python benchmarks/runtime_overhead.py            # on a GPU: launch overhead + lookup + bundle
    python benchmarks/runtime_overhead.py --cpu-only # bundle load and lookup only

Launch overhead: a tiny GEMM (64x64x64 fp16, cache hit), N launches timed on the host clock
with no sync between them (the launch path is what is measured), median of repeats: the shipped
``tunesvc.kernels.matmul`` against ``launch_matmul`` with the same fixed config, and the same
``@triton.jit`` kernel three ways: ``kernel[grid]`` with a fixed config, under
``@tunesvc.autotune`` (config from a bundle) and under ``triton.autotune`` (both on a hit). Bundle:
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
import triton

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


#: one config of the grouped kernel (_matmul_kernel) that suits a 64x64x64 GEMM
GROUPED = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 1, "num_warps": 4, "num_stages": 3}


def kernel_launchers(config: dict, bundle: Path):
    """kernel[grid](...) with a fixed config, the same call through @tunesvc.autotune (keyed like
    triton.autotune on M, N, K; configs from ``bundle``), and the decorated kernel.

    Both build the output and the grid the same way as benchmarks/matmul.py's triton.autotune
    peer, so the three differ only in how the config is chosen.
    """
    from tunesvc.kernels.matmul import _matmul_kernel

    decorated = tunesvc.autotune([config], key=["M", "N", "K"], name="matmul_decorated", bundle=bundle)(_matmul_kernel)
    fixed = dict(config)

    def grid(meta):
        return (triton.cdiv(meta["M"], meta["BLOCK_M"]) * triton.cdiv(meta["N"], meta["BLOCK_N"]),)

    def direct(a, b):
        M, K = a.shape
        N = b.shape[1]
        c = torch.empty((M, N), device=a.device, dtype=a.dtype)
        _matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                             c.stride(0), c.stride(1), DOT_IN_FP32=False, **fixed)
        return c

    def through_tunesvc(a, b):
        M, K = a.shape
        N = b.shape[1]
        c = torch.empty((M, N), device=a.device, dtype=a.dtype)
        decorated[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                        c.stride(0), c.stride(1), DOT_IN_FP32=False)
        return c

    return direct, through_tunesvc, decorated


def synthetic_bundle(path: Path, device, n: int, extra: dict | None = None, kernel: str = "matmul",
                     version: str | None = None) -> None:
    config = TEMPLATE.heuristic(TEMPLATE.problem(M=4096, N=4096, K=4096), device)
    winners = {f"M={1 << (i % 14)},N={64 + i},K=4096,dtype=bfloat16": {"config": config, "time_ms": 0.1} for i in range(n)}
    winners.update({key: {"config": c, "time_ms": 0.1} for key, c in (extra or {}).items()})
    bundle = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "device": {"hardware_id": device.hardware_id, "name": device.name, "capability": device.capability, "sm_count": device.sm_count},
        "kernels": {kernel: {"version": version or TEMPLATE.version, "torch": "", "triton": "", "winners": winners}},
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
            path = Path(tmp) / "decorated.json"
            run_direct, run_decorated, decorated = kernel_launchers(GROUPED, path)
            # the bundle is read at the first miss, so it may be written after the decoration
            synthetic_bundle(path, device, 0, kernel="matmul_decorated", version=decorated.template.version,
                             extra={"M=64,N=64,K=64,dtype=float16": GROUPED})
            run_decorated(a, b)  # the miss: looks the key up in the bundle once
            assert decorated.last.source == "exact", decorated.last
        run_autotuned, _ = autotuned_matmul()
        run_autotuned(a, b)  # tunes once; later calls are autotune cache hits
        run_direct(a, b)  # compiles the fixed config
        matmul(a, b)
        sync = torch.cuda.synchronize
        direct = per_call_us(lambda: launch_matmul(a, b, config), 2000, sync=sync)
        ours = per_call_us(lambda: matmul(a, b), 2000, sync=sync)
        autotuned = per_call_us(lambda: run_autotuned(a, b), 2000, sync=sync)
        raw = per_call_us(lambda: run_direct(a, b), 2000, sync=sync)
        through_decorator = per_call_us(lambda: run_decorated(a, b), 2000, sync=sync)
        rows.append(("launch: direct launch_matmul, fixed config", f"{direct:.1f} us", ""))
        rows.append(("launch: tunesvc.kernels.matmul (hit)", f"{ours:.1f} us", f"{ours / direct:.3f}x direct (<= 1.05x)"))
        rows.append(("launch: kernel[grid](...), fixed config", f"{raw:.1f} us", ""))
        rows.append(("launch: @tunesvc.autotune kernel (hit)", f"{through_decorator:.1f} us", f"{through_decorator / raw:.3f}x kernel[grid] (<= 1.05x)"))
        rows.append(("launch: triton.autotune kernel (hit)", f"{autotuned:.1f} us", f"{autotuned / raw:.3f}x kernel[grid]"))
    print(f"\n{device.name}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}\n")
    print("| what | measured | target |")
    print("|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
