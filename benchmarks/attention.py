"""Flash attention on the GPU: tuned tunesvc forward and backward vs torch SDPA.

    python benchmarks/attention.py --db tune.db --sweep --budget 24
    python benchmarks/attention.py --db tune.db --sweep --strategy grid --budget 66 --bwd-budget 24
    python benchmarks/attention.py --check

With --sweep, first tunes the forward ("attention") and backward ("attention_bwd") templates on
preset "b4h32s4096d128" (bf16, B4 H32 S4096 D128, causal and not) into --db, resuming what is stored
there (the second form: every feasible forward config, 66 at the non-causal setting on an H100,
and 24 backward trials). Then, per setting and in one process, times with
triton.testing.do_bench (median, L2 flushed) on the same random bf16 inputs:

- forward: the tuned kernel (config from the runtime lookup on --db) vs
  F.scaled_dot_product_attention;
- backward: the tuned backward kernels (Delta preprocess + dK/dV/dQ) vs SDPA's backward through
  torch.autograd.grad (which adds only microseconds of autograd overhead to milliseconds of work).

FLOPs: forward 4 B H S^2 D, halved when causal; backward 2.5x the forward. Roofline: the GPU's
listed dense bf16 peak. The tuned outputs are checked against a float32 reference (relative
error). --check runs small ragged shapes through both directions quickly, with no sweep and
no timing, and exits 1 when an error is over tolerance.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from _common import bench_ms
from _common import print_table
from _common import record
from _common import require_gpu
from _common import result_row
from _common import sweep
from _common import tuned_runtime

from tunesvc.bench import relative_error as rel_error
from tunesvc.device import current_device
from tunesvc.kernels.attention import BWD_TEMPLATE
from tunesvc.kernels.attention import TEMPLATE
from tunesvc.kernels.attention import launch_attention
from tunesvc.kernels.attention import launch_attention_bwd
from tunesvc.kernels.attention import reference_attention

PRESET = "b4h32s4096d128"

# Listed dense (no sparsity) bf16 tensor-core peaks, TFLOP/s: NVIDIA H100 SXM5 and H200 datasheets.
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0}


def peak_tflops() -> float | None:
    name = current_device().name
    return next((peak for gpu, peak in PEAK_TFLOPS.items() if gpu in name), None)


def inputs(problem: dict) -> tuple[torch.Tensor, ...]:
    shape = (problem["B"], problem["H"], problem["S"], problem["D"])
    dtype = getattr(torch, problem["dtype"])
    return tuple(torch.randn(shape, device="cuda", dtype=dtype) for _ in range(4))  # q, k, v, dO


def label(problem: dict) -> str:
    causal = "causal" if problem["causal"] else "full"
    return f"B{problem['B']} H{problem['H']} S{problem['S']} D{problem['D']} {causal}"


def check(runtime) -> int:
    """Small ragged shapes through both directions with the configs the runtime picks."""
    rows, failures = [], 0
    for D in (64, 128):
        for causal in (False, True):
            problem = TEMPLATE.problem(B=2, H=3, S=1000, D=D, causal=causal, dtype="bfloat16")
            q, k, v, do = inputs(problem)
            fwd = runtime.lookup(TEMPLATE, **problem)
            bwd = runtime.lookup(BWD_TEMPLATE, **problem)
            o, lse = launch_attention(q, k, v, fwd.config, causal=causal)
            grads = launch_attention_bwd(q, k, v, o, lse, do, bwd.config, causal=causal)
            ref_o, _ = reference_attention(q, k, v, causal=causal)
            ref_grads = torch.stack(reference_attention(q, k, v, causal=causal, do=do))
            errors = (rel_error(o, ref_o), rel_error(grads, ref_grads))
            tolerance = TEMPLATE.tolerance(problem)
            ok = all(e <= tolerance for e in errors)
            failures += not ok
            rows.append([label(problem), f"{errors[0]:.2e}", f"{errors[1]:.2e}", "ok" if ok else "WRONG"])
    print_table("attention --check (bf16)", ["shape", "forward rel err", "backward rel err", "status"], rows)
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="tune.db")
    parser.add_argument("--sweep", action="store_true", help="tune the forward and backward first")
    parser.add_argument("--strategy", default="optuna")
    parser.add_argument("--budget", type=int, default=24, help="trials per template and setting (4 sweeps)")
    parser.add_argument("--bwd-budget", type=int, default=None, help="trials per backward sweep [--budget]")
    parser.add_argument("--check", action="store_true", help="only check small shapes for correctness")
    args = parser.parse_args()

    require_gpu("benchmarks/attention.py")
    runtime = tuned_runtime(args.db)
    if args.check:
        return check(runtime)
    problems = [TEMPLATE.problem(**p) for p in TEMPLATE.presets[PRESET]]
    if args.sweep:
        sweep(TEMPLATE, problems, args.db, strategy=args.strategy, budget=args.budget)
        sweep(BWD_TEMPLATE, problems, args.db, strategy=args.strategy, budget=args.bwd_budget or args.budget)
        runtime = tuned_runtime(args.db)

    peak = peak_tflops()
    rows, csv_rows = [], []
    for problem in problems:
        causal = problem["causal"]
        q, k, v, do = inputs(problem)
        fwd = runtime.lookup(TEMPLATE, **problem)
        bwd = runtime.lookup(BWD_TEMPLATE, **problem)
        o, lse = launch_attention(q, k, v, fwd.config, causal=causal)
        grads = launch_attention_bwd(q, k, v, o, lse, do, bwd.config, causal=causal)
        ref_o, _ = reference_attention(q, k, v, causal=causal)
        ref_grads = torch.stack(reference_attention(q, k, v, causal=causal, do=do))
        errors = (rel_error(o, ref_o), rel_error(grads, ref_grads))
        del ref_o, ref_grads

        ours_fwd = bench_ms(lambda: launch_attention(q, k, v, fwd.config, causal=causal))
        peer_fwd = bench_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
        ours_bwd = bench_ms(lambda: launch_attention_bwd(q, k, v, o, lse, do, bwd.config, causal=causal))
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        peer_out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
        peer_bwd = bench_ms(lambda: torch.autograd.grad(peer_out, (qg, kg, vg), do, retain_graph=True))
        del peer_out

        for direction, template, ours, peer, err, found in (
            ("forward", TEMPLATE, ours_fwd, peer_fwd, errors[0], fwd),
            ("backward", BWD_TEMPLATE, ours_bwd, peer_bwd, errors[1], bwd),
        ):
            flops = template.cost(problem).flops
            ours_tflops, peer_tflops = flops / ours / 1e9, flops / peer / 1e9
            csv_rows.append(
                result_row(
                    template,
                    problem,
                    peer="torch SDPA",
                    ours_ms=ours,
                    peer_ms=peer,
                    timing_method="do_bench",
                    rate_unit="TFLOP/s",
                    work=flops,
                )
            )
            rows.append(
                [
                    label(problem),
                    direction,
                    ours_tflops,
                    peer_tflops,
                    f"{peer / ours:.2f}x",
                    f"{100 * ours_tflops / peak:.0f}%" if peak else "-",
                    f"{err:.1e}",
                    found.source,
                    found.config,
                ]
            )
        torch.cuda.empty_cache()

    print_table(
        "Flash attention (bf16): tunesvc vs torch SDPA",
        ["shape", "pass", "ours TFLOP/s", "SDPA TFLOP/s", "ours / SDPA", "% of peak", "rel err", "config", "values"],
        rows,
    )
    record("attention", csv_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
