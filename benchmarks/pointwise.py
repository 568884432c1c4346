"""Memory-bound kernels on the GPU: tuned softmax, bias+GELU+residual (+ backwards), dropout vs torch.

    python benchmarks/pointwise.py --db tune.db --sweep --budget 6
    python benchmarks/pointwise.py --check

With --sweep, first tunes "softmax", "softmax_bwd", "bias_act_residual" and
"bias_act_residual_bwd" (act=gelu) and "dropout" (p=0.1) on the bf16 shapes of preset "llm"
(4096x4096, 16384x8192 and 32768x1024) into --db, resuming what is stored there. Then, per
kernel and shape and in one process, times with triton.testing.do_bench (median, L2 flushed)
on the same random bf16 inputs: the tuned kernel (config from the runtime lookup on --db), the
torch eager peer and torch.compile of the same torch code (dynamic=False, so every shape gets
its own specialised Inductor kernel). The fused pointwise backward's peer is torch autograd's
backward of the eager code (dx and dbias); it has no torch.compile peer.

Bandwidth counts each kernel's minimum bytes (template cost: softmax and dropout 2 M N, softmax
backward 3 M N, the fused pointwise and its backward 3 M N + N elements); the roofline is the
device-to-device copy bandwidth measured in the same run. Each tuned output is checked against
its template's reference (relative error; the script exits 1 when one is over tolerance).
--check runs small ragged shapes through all five, including the multi-block softmax, with no
sweep and no timing, and exits 1 when an error is over tolerance.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from _common import bench_ms
from _common import copy_bandwidth
from _common import print_table
from _common import record
from _common import require_gpu
from _common import result_row
from _common import sweep
from _common import tuned_runtime

from tunesvc.bench import relative_error as rel_error
from tunesvc.kernels.dropout import TEMPLATE as DROPOUT
from tunesvc.kernels.dropout import dropout
from tunesvc.kernels.dropout import launch_dropout
from tunesvc.kernels.pointwise import BWD_TEMPLATE as BIAS_ACT_RESIDUAL_BWD
from tunesvc.kernels.pointwise import TEMPLATE as BIAS_ACT_RESIDUAL
from tunesvc.kernels.pointwise import bias_act_residual_reference
from tunesvc.kernels.pointwise import launch_bias_act_residual
from tunesvc.kernels.softmax import BWD_TEMPLATE as SOFTMAX_BWD
from tunesvc.kernels.softmax import TEMPLATE as SOFTMAX
from tunesvc.kernels.softmax import launch_softmax
from tunesvc.kernels.softmax import launch_softmax_bwd
from tunesvc.serving.runtime import Runtime
from tunesvc.template import Problem
from tunesvc.template import Template

SHAPES = [(p["M"], p["N"]) for p in SOFTMAX.presets["llm"]]
DTYPE = "bfloat16"
ACT = "gelu"
P = 0.1
SEED = 1234


def eager_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def eager_softmax_bwd(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten._softmax_backward_data(dy, y, -1, y.dtype)


def eager_bias_gelu_residual(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    return bias_act_residual_reference(x, bias, residual, ACT)


def autograd_bias_gelu_residual_bwd(
    out: torch.Tensor, x: torch.Tensor, bias: torch.Tensor, dy: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    return torch.autograd.grad(out, (x, bias), dy, retain_graph=True)


def eager_dropout(x: torch.Tensor) -> torch.Tensor:
    return F.dropout(x, P, training=True)


def shape_problem(template: Template, m: int, n: int) -> dict:
    """The benchmark's (M, N) shape as the template's problem fields."""
    if template is DROPOUT:
        return {"numel": m * n, "dtype": DTYPE}
    if template in (BIAS_ACT_RESIDUAL, BIAS_ACT_RESIDUAL_BWD):
        return {"M": m, "N": n, "act": ACT, "dtype": DTYPE}
    return {"M": m, "N": n, "dtype": DTYPE}


@dataclass
class Case:
    """One kernel on one shape: its problem, inputs, the tuned launch and the torch peer's arguments."""

    template: Template
    problem: Problem
    inputs: Any
    peer_args: tuple
    launch: Callable[[Any, dict], torch.Tensor]


def cases(m: int, n: int) -> list[Case]:
    dtype = getattr(torch, DTYPE)
    x = torch.randn(m, n, device="cuda", dtype=dtype)
    bias = torch.randn(n, device="cuda", dtype=dtype)
    residual = torch.randn(m, n, device="cuda", dtype=dtype)
    y = torch.softmax(x.float(), dim=-1).to(dtype)
    x_grad, bias_grad = x.detach().requires_grad_(), bias.detach().requires_grad_()
    graph = eager_bias_gelu_residual(x_grad, bias_grad, residual)
    return [
        Case(
            SOFTMAX,
            SOFTMAX.problem(**shape_problem(SOFTMAX, m, n)),
            x,
            (x,),
            lambda inputs, config: launch_softmax(inputs, config),
        ),
        Case(
            SOFTMAX_BWD,
            SOFTMAX_BWD.problem(**shape_problem(SOFTMAX_BWD, m, n)),
            (y, residual),
            (residual, y),
            lambda inputs, config: launch_softmax_bwd(*inputs, config),
        ),
        Case(
            BIAS_ACT_RESIDUAL,
            BIAS_ACT_RESIDUAL.problem(**shape_problem(BIAS_ACT_RESIDUAL, m, n)),
            (x, bias, residual, ACT),
            (x, bias, residual),
            lambda inputs, config: launch_bias_act_residual(*inputs, config),
        ),
        Case(
            BIAS_ACT_RESIDUAL_BWD,
            BIAS_ACT_RESIDUAL_BWD.problem(**shape_problem(BIAS_ACT_RESIDUAL_BWD, m, n)),
            (x, bias, residual, ACT),
            (graph, x_grad, bias_grad, residual),
            BIAS_ACT_RESIDUAL_BWD.launch,
        ),
        Case(
            DROPOUT,
            DROPOUT.problem(**shape_problem(DROPOUT, m, n)),
            (x, P, SEED),
            (x,),
            lambda inputs, config: launch_dropout(*inputs, config),
        ),
    ]


PEERS: dict[str, Callable] = {
    "softmax": eager_softmax,
    "softmax_bwd": eager_softmax_bwd,
    "bias_act_residual": eager_bias_gelu_residual,
    "bias_act_residual_bwd": autograd_bias_gelu_residual_bwd,
    "dropout": eager_dropout,
}
COMPILED = ("softmax", "softmax_bwd", "bias_act_residual", "dropout")


def check(runtime: Runtime) -> int:
    """Small ragged shapes (and a row too long for one block) with the configs the runtime picks."""
    rows, failures = [], 0
    for m, n in ((1000, 1000), (37, 4500), (3, 70000)):
        for case in cases(m, n):
            found = runtime.lookup(case.template, **case.problem)
            err = rel_error(case.launch(case.inputs, found.config), case.template.reference(case.inputs))
            ok = err <= case.template.tolerance(case.problem)
            failures += not ok
            rows.append([case.template.name, f"{m}x{n}", f"{err:.2e}", found.config, "ok" if ok else "WRONG"])
    # dropout by its properties too: keep fraction within 5 binomial standard deviations of 1 - p
    x = torch.randn(1 << 20, device="cuda", dtype=torch.bfloat16)
    kept = (dropout(x, P, SEED) != 0).double().mean().item()
    ok = abs(kept - (1 - P)) < 5 * (P * (1 - P) / x.numel()) ** 0.5
    failures += not ok
    rows.append(["dropout keep fraction", "1048576", f"{kept:.5f}", f"expected {1 - P}", "ok" if ok else "WRONG"])
    print_table("pointwise --check (bf16)", ["kernel", "shape", "rel err", "config", "status"], rows)
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="tune.db")
    parser.add_argument("--sweep", action="store_true", help="tune the five templates on the shapes first")
    parser.add_argument("--strategy", default="optuna")
    parser.add_argument("--budget", type=int, default=6, help="trials per template and shape (15 sweeps)")
    parser.add_argument(
        "--templates",
        default=None,
        metavar="NAME,...",
        help="with --sweep, tune only these templates (the table still times all five)",
    )
    parser.add_argument("--check", action="store_true", help="only check small shapes for correctness")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile peers")
    args = parser.parse_args()

    require_gpu("benchmarks/pointwise.py")
    runtime = tuned_runtime(args.db)
    if args.check:
        return check(runtime)
    if args.sweep:
        templates = (SOFTMAX, SOFTMAX_BWD, BIAS_ACT_RESIDUAL, BIAS_ACT_RESIDUAL_BWD, DROPOUT)
        if args.templates:
            names = args.templates.split(",")
            if not set(names) <= {t.name for t in templates}:
                parser.error(f"--templates must be among {', '.join(t.name for t in templates)}")
            templates = tuple(t for t in templates if t.name in names)
        for template in templates:
            problems = [template.problem(**shape_problem(template, m, n)) for m, n in SHAPES]
            sweep(template, problems, args.db, strategy=args.strategy, budget=args.budget)
        runtime = tuned_runtime(args.db)

    compiled = {name: torch.compile(PEERS[name], dynamic=False) for name in COMPILED}
    bandwidth = copy_bandwidth()
    rows, csv_rows, failures = [], [], 0
    for m, n in SHAPES:
        for case in cases(m, n):
            name = case.template.name
            found = runtime.lookup(case.template, **case.problem)
            err = rel_error(case.launch(case.inputs, found.config), case.template.reference(case.inputs))
            failures += not err <= case.template.tolerance(case.problem)
            gbytes = case.template.cost(case.problem).bytes / 1e9
            ours = bench_ms(lambda: case.launch(case.inputs, found.config))
            eager = bench_ms(lambda: PEERS[name](*case.peer_args))
            if args.no_compile or name not in compiled:
                compile_ms = None
            else:
                compiled[name](*case.peer_args)  # compile outside the timing
                compile_ms = bench_ms(lambda: compiled[name](*case.peer_args))
            ours_gbs = gbytes / (ours * 1e-3)
            eager_name = "torch eager (autograd.grad)" if name == "bias_act_residual_bwd" else "torch eager"
            for peer_name, peer_ms in ((eager_name, eager), ("torch.compile", compile_ms)):
                if peer_ms:
                    csv_rows.append(
                        result_row(
                            case.template,
                            case.problem,
                            peer=peer_name,
                            ours_ms=ours,
                            peer_ms=peer_ms,
                            timing_method="do_bench",
                            rate_unit="GB/s",
                            work=gbytes * 1e9,
                        )
                    )
            rows.append(
                [
                    name,
                    f"{m}x{n}",
                    ours_gbs,
                    f"{100 * ours_gbs * 1e9 / bandwidth:.0f}%",
                    gbytes / (eager * 1e-3),
                    f"{eager / ours:.2f}x",
                    gbytes / (compile_ms * 1e-3) if compile_ms else "-",
                    f"{compile_ms / ours:.2f}x" if compile_ms else "-",
                    f"{err:.1e}" if err <= case.template.tolerance(case.problem) else f"{err:.1e} WRONG",
                    found.source,
                    found.config,
                ]
            )
        torch.cuda.empty_cache()

    print_table(
        f"Softmax, bias + {ACT} + residual (and backwards), dropout p={P} ({DTYPE}): tunesvc vs torch eager "
        f"and torch.compile; "
        f"copy bandwidth {bandwidth / 1e9:.0f} GB/s",
        [
            "kernel",
            "shape",
            "ours GB/s",
            "% of copy",
            "eager GB/s",
            "ours / eager",
            "compile GB/s",
            "ours / compile",
            "rel err",
            "config",
            "values",
        ],
        rows,
    )
    record("pointwise", csv_rows)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
