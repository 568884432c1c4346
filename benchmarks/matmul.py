"""GEMM on the GPU: the tuned tunesvc kernel (every VARIANT) against cuBLAS (torch.matmul).

    python benchmarks/matmul.py --db tune.db --sweep            # tune, then time (~5 min on an H100)
    python benchmarks/matmul.py --db tune.db                    # time what the db holds
    python benchmarks/matmul.py --check                         # one small shape per variant, seconds

Shapes: preset "llm" (six LLM GEMMs) and M in {1, 16, 64} x (N, K) in
{(4096, 4096), (14336, 4096)} (preset "skinny"), bf16. With --sweep, first tunes every shape into
--db (Optuna TPE, resuming what is stored there, compiles in parallel workers). Then per shape,
in one process and on the same random inputs: the tuned kernel (config from the runtime lookup,
as a user gets it) and torch.matmul, timed with triton.testing.do_bench (median, L2 flushed), and
again replayed from a CUDA graph cycling through copies of the inputs that together exceed L2
twice (GPU time alone, no L2 hits between calls: where a launch costs the host more than the
kernel takes, as for the TMA variant on small problems, do_bench times the host); the tuned output's relative error against the float32 reference is checked before timing. Roofline:
the H100's listed dense bf16 peak (989 TFLOP/s SXM) for FLOPs, or the copy bandwidth measured in
this run for the bytes, whichever bound is the lower time.
"""

from __future__ import annotations

import argparse
import sys

import torch
import triton
from _common import bench_graph_ms
from _common import bench_ms
from _common import copies
from _common import copy_bandwidth
from _common import geomean
from _common import print_table
from _common import record
from _common import require_gpu
from _common import result_row
from _common import sweep
from _common import tuned_runtime

from tunesvc.bench import relative_error as rel_error
from tunesvc.kernels.matmul import TEMPLATE
from tunesvc.kernels.matmul import VARIANTS
from tunesvc.kernels.matmul import _matmul_kernel
from tunesvc.kernels.matmul import launch_matmul

# Triton tutorial 03's CUDA list, verbatim (16 configs): the peer tuner of the other benchmarks
# (sweep_vs_autotune.py, runtime_overhead.py) runs it through a plain triton.autotune.
TUTORIAL = [
    triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8}, num_stages=s, num_warps=w)
    for m, n, k, s, w in (
        (128, 256, 64, 3, 8),
        (64, 256, 32, 4, 4),
        (128, 128, 32, 4, 4),
        (128, 64, 32, 4, 4),
        (64, 128, 32, 4, 4),
        (128, 32, 32, 4, 4),
        (64, 32, 32, 5, 2),
        (32, 64, 32, 5, 2),
        (128, 256, 128, 3, 8),
        (256, 128, 128, 3, 8),
        (256, 64, 128, 4, 4),
        (64, 256, 128, 4, 4),
        (128, 128, 128, 4, 4),
        (128, 64, 64, 4, 4),
        (64, 128, 64, 4, 4),
        (128, 32, 64, 4, 4),
    )
]


def autotuned_matmul():
    """The grouped kernel under a plain triton.autotune over TUTORIAL, keyed on M, N, K."""
    kernel = triton.autotune(configs=TUTORIAL, key=["M", "N", "K"])(_matmul_kernel.kernel)  # Triton's JITFunction

    def run(a, b):
        M, K = a.shape
        N = b.shape[1]
        c = torch.empty((M, N), device=a.device, dtype=a.dtype)
        grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)
        kernel[grid](
            a,
            b,
            c,
            M,
            N,
            K,
            N,  # NB: B's columns wrap modulo its own width, N where B is not padded
            a.stride(0),
            a.stride(1),
            b.stride(0),
            b.stride(1),
            c.stride(0),
            c.stride(1),
            DOT_IN_FP32=False,
        )
        return c

    return run, kernel


#: NVIDIA H100 SXM datasheet, dense bf16 tensor-core peak
PEAK_TFLOPS = 989.0


def shapes() -> list[tuple[int, int, int]]:
    seen: list[tuple[int, int, int]] = []
    for p in TEMPLATE.presets["llm"] + TEMPLATE.presets["skinny"]:
        shape = (p["M"], p["N"], p["K"])
        if shape not in seen:  # 16x4096x4096 is in both
            seen.append(shape)
    return seen


def check(dtype: torch.dtype) -> int:
    """Every variant once on an odd shape, against the float32 reference."""
    a = torch.randn(100, 777, device="cuda", dtype=dtype)
    b = torch.randn(777, 300, device="cuda", dtype=dtype)
    ref = a.float() @ b.float()
    failed = 0
    for variant in VARIANTS:
        config = {
            "VARIANT": variant,
            "BLOCK_M": 64,
            "BLOCK_N": 64,
            "BLOCK_K": 64,
            "GROUP_M": 1,
            "SPLIT_K": 4 if variant == "splitk" else 1,
            "num_warps": 4,
            "num_stages": 3,
        }
        err = rel_error(launch_matmul(a, b, config), ref)
        ok = err < 2e-2
        failed += not ok
        print(f"{variant}: rel error {err:.2e} {'ok' if ok else 'WRONG'}", flush=True)
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="tune.db")
    parser.add_argument("--sweep", action="store_true", help="tune the shapes into --db first")
    parser.add_argument("--budget", type=int, default=24, help="trials per shape (warm start included)")
    parser.add_argument(
        "--sweep-shapes",
        default=None,
        metavar="MxNxK,...",
        help="with --sweep, tune only these of the shapes (the table still times all)",
    )
    parser.add_argument(
        "--strategy",
        default="optuna",
        help="search strategy of --sweep (grid with a budget above the space's size: the whole space)",
    )
    parser.add_argument("--workers", type=int, default=None, help="parallel compile workers (default: up to 8)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--check", action="store_true", help="only check every variant once, quickly")
    args = parser.parse_args()

    require_gpu("benchmarks/matmul.py")
    dtype = getattr(torch, args.dtype)
    if args.check:
        return check(dtype)
    problems = [TEMPLATE.problem(M=m, N=n, K=k, dtype=args.dtype) for m, n, k in shapes()]
    if args.sweep:
        chosen = problems
        if args.sweep_shapes:
            wanted = {tuple(int(v) for v in s.lower().split("x")) for s in args.sweep_shapes.split(",")}
            chosen = [p for p in problems if (p["M"], p["N"], p["K"]) in wanted]
            if len(chosen) != len(wanted):
                parser.error(f"--sweep-shapes must be among {', '.join('x'.join(map(str, s)) for s in shapes())}")
        sweep(TEMPLATE, chosen, args.db, strategy=args.strategy, budget=args.budget, workers=args.workers)

    bandwidth = copy_bandwidth()
    runtime = tuned_runtime(args.db)
    rows, ratios, graph_ratios, wrong = [], [], [], 0
    csv_rows = []
    for problem in problems:
        m, n, k = problem["M"], problem["N"], problem["K"]
        a = torch.randn(m, k, device="cuda", dtype=dtype)
        b = torch.randn(k, n, device="cuda", dtype=dtype)
        found = runtime.lookup(TEMPLATE, **problem)
        err = rel_error(launch_matmul(a, b, found.config), a.float() @ b.float())
        if err > TEMPLATE.tolerance(problem):
            wrong += 1
        ours = bench_ms(lambda: launch_matmul(a, b, found.config))
        peer = bench_ms(lambda: torch.matmul(a, b))
        sets = copies(
            (a, b),
            lambda: (torch.randn(m, k, device="cuda", dtype=dtype), torch.randn(k, n, device="cuda", dtype=dtype)),
        )
        ours_graph = bench_graph_ms([lambda x=x, y=y: launch_matmul(x, y, found.config) for x, y in sets])
        peer_graph = bench_graph_ms([lambda x=x, y=y: torch.matmul(x, y) for x, y in sets])
        del sets
        cost = TEMPLATE.cost(problem)
        bound_ms = max(cost.flops / (PEAK_TFLOPS * 1e12), cost.bytes / bandwidth) * 1e3
        ratio = peer / ours
        ratios.append(ratio)
        graph_ratios.append(peer_graph / ours_graph)
        peer_name = "cuBLAS (torch.matmul)"
        csv_rows += [
            result_row(
                TEMPLATE,
                problem,
                peer=peer_name,
                ours_ms=ours,
                peer_ms=peer,
                timing_method="do_bench",
                rate_unit="TFLOP/s",
                work=cost.flops,
            ),
            result_row(
                TEMPLATE,
                problem,
                peer=peer_name,
                ours_ms=ours_graph,
                peer_ms=peer_graph,
                timing_method="cuda_graph",
                rate_unit="TFLOP/s",
                work=cost.flops,
            ),
        ]
        config = found.config
        rows.append(
            [
                f"{m}x{n}x{k}",
                f"{cost.flops / ours / 1e9:.0f} TFLOP/s",
                f"{cost.flops / peer / 1e9:.0f} TFLOP/s",
                f"{ratio:.2f}x",
                f"{peer_graph / ours_graph:.2f}x",
                f"{100 * bound_ms / ours:.0f}%",
                f"{config.get('VARIANT', 'grouped')} {config['BLOCK_M']}x{config['BLOCK_N']}x{config['BLOCK_K']}"
                + (f"/{config['SPLIT_K']}" if config.get("VARIANT") == "splitk" else ""),
                found.source,
                f"{err:.1e}",
            ]
        )
    print_table(
        f"GEMM {args.dtype}: tunesvc vs cuBLAS (copy bandwidth {bandwidth / 1e12:.2f} TB/s in this run)",
        [
            "M x N x K",
            "tunesvc",
            "cuBLAS",
            "ours / cuBLAS",
            "same, CUDA graph",
            "% of roofline",
            "variant tile/split",
            "config",
            "rel err",
        ],
        rows,
    )
    print(
        f"geometric mean ours / cuBLAS: {geomean(ratios):.3f}x plain, {geomean(graph_ratios):.3f}x CUDA graph; "
        f"lowest {min(ratios):.2f}x plain, {min(graph_ratios):.2f}x CUDA graph (targets: >= 1.0x and no shape below 0.9x)"
    )
    record("matmul", csv_rows)
    if wrong:
        print(f"{wrong} shape(s) exceeded the tolerance against the reference", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
