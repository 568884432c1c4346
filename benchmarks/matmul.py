"""GEMM on the GPU: tuned tunesvc kernel vs cuBLAS (torch.matmul) vs triton.autotune.

    python benchmarks/matmul.py --db tune.db --sweep --strategy optuna --budget 40

With --sweep, first tunes the shapes into --db (resuming whatever is stored there) and reports
the sweep's wall time per shape. Then, per shape and in one process: the tuned kernel (config
from the runtime lookup), torch.matmul and a plain triton.autotune over the Triton tutorial's
16 configs (its first call, i.e. its tuning time, is reported too) are timed with
triton.testing.do_bench (median, L2 flushed) on the same random bf16 inputs.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import triton
import triton.testing

from tunesvc.device import current_device
from tunesvc.kernels.matmul import TEMPLATE
from tunesvc.kernels.matmul import _matmul_kernel
from tunesvc.kernels.matmul import launch_matmul
from tunesvc.runtime import Runtime
from tunesvc.store import Store
from tunesvc.sweep import run_sweep

SHAPES = [(p["M"], p["N"], p["K"]) for p in TEMPLATE.presets["llm"]]

# Triton tutorial 03's CUDA list, verbatim (16 configs, num_warps=2 ones included).
TUTORIAL = [
    triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8}, num_stages=s, num_warps=w)
    for m, n, k, s, w in (
        (128, 256, 64, 3, 8), (64, 256, 32, 4, 4), (128, 128, 32, 4, 4), (128, 64, 32, 4, 4),
        (64, 128, 32, 4, 4), (128, 32, 32, 4, 4), (64, 32, 32, 5, 2), (32, 64, 32, 5, 2),
        (128, 256, 128, 3, 8), (256, 128, 128, 3, 8), (256, 64, 128, 4, 4), (64, 256, 128, 4, 4),
        (128, 128, 128, 4, 4), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (128, 32, 64, 4, 4),
    )
]


def autotuned_matmul():
    kernel = triton.autotune(configs=TUTORIAL, key=["M", "N", "K"])(_matmul_kernel)

    def run(a, b):
        M, K = a.shape
        N = b.shape[1]
        c = torch.empty((M, N), device=a.device, dtype=a.dtype)
        grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)
        kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                     c.stride(0), c.stride(1), DOT_IN_FP32=False)
        return c

    return run, kernel


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="tune.db")
    parser.add_argument("--sweep", action="store_true", help="tune the shapes first")
    parser.add_argument("--strategy", default="optuna")
    parser.add_argument("--budget", type=int, default=40)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--no-autotune", action="store_true")
    args = parser.parse_args()

    device = current_device()
    if not device.is_gpu:
        print("benchmarks/matmul.py needs a CUDA GPU.", file=sys.stderr)
        return 1
    problems = [TEMPLATE.problem(M=m, N=n, K=k, dtype=args.dtype) for m, n, k in SHAPES]
    sweep_seconds = {}
    if args.sweep:
        store = Store(args.db)
        for problem in problems:
            [result] = run_sweep(TEMPLATE, [problem], store, strategy=args.strategy, budget=args.budget)
            sweep_seconds[result.shape_key] = result.wall_seconds
            print(f"swept {result.shape_key}: {result.trials_stored} trials (+{result.trials_new}) "
                  f"in {result.wall_seconds:.1f} s, best {result.winner_ms} ms {result.winner}", flush=True)
        store.close()

    runtime = Runtime(db=args.db)
    dtype = getattr(torch, args.dtype)
    rows = []
    for problem in problems:
        m, n, k = problem["M"], problem["N"], problem["K"]
        a = torch.randn(m, k, device="cuda", dtype=dtype)
        b = torch.randn(k, n, device="cuda", dtype=dtype)
        found = runtime.lookup(TEMPLATE, **problem)
        ref = a.float() @ b.float()
        out = launch_matmul(a, b, found.config)
        err = ((out.float() - ref).norm() / ref.norm()).item()
        flops = 2.0 * m * n * k
        ours = triton.testing.do_bench(lambda: launch_matmul(a, b, found.config), quantiles=[0.5])
        cublas = triton.testing.do_bench(lambda: torch.matmul(a, b), quantiles=[0.5])
        row = {
            "shape": f"{m}x{n}x{k}", "source": found.source, "config": found.config, "rel_err": err,
            "ours_tflops": flops / ours / 1e9, "cublas_tflops": flops / cublas / 1e9,
            "sweep_s": sweep_seconds.get(found.key),
        }
        if not args.no_autotune:
            run, kernel = autotuned_matmul()
            torch.cuda.synchronize()
            start = time.perf_counter()
            run(a, b)
            torch.cuda.synchronize()
            row["autotune_first_call_s"] = time.perf_counter() - start
            at = triton.testing.do_bench(lambda: run(a, b), quantiles=[0.5])
            row["autotune_tflops"] = flops / at / 1e9
        rows.append(row)
        print(row, flush=True)

    print(f"\n{device.name}, torch {torch.__version__}, triton {triton.__version__}, {args.dtype}, "
          f"{time.strftime('%Y-%m-%d')}\n")
    header = "| M x N x K | tunesvc TFLOP/s | cuBLAS TFLOP/s | tunesvc / cuBLAS | autotune / cuBLAS | sweep s | autotune 1st call s | lookup |"
    print(header)
    print("|---|---|---|---|---|---|---|---|")
    ratios = []
    for r in rows:
        ratio = r["ours_tflops"] / r["cublas_tflops"]
        ratios.append(ratio)
        at = f"{r['autotune_tflops'] / r['cublas_tflops']:.2f}x" if "autotune_tflops" in r else "-"
        at_s = f"{r['autotune_first_call_s']:.1f}" if "autotune_first_call_s" in r else "-"
        sw = f"{r['sweep_s']:.1f}" if r["sweep_s"] is not None else "-"
        print(f"| {r['shape']} | {r['ours_tflops']:.0f} | {r['cublas_tflops']:.0f} | {ratio:.2f}x | {at} | {sw} | {at_s} | {r['source']} |")
    geo = 1.0
    for x in ratios:
        geo *= x
    print(f"\ngeometric mean tunesvc / cuBLAS: {geo ** (1 / len(ratios)):.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
