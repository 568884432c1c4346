"""LayerNorm and RMSNorm on the GPU, forward and backward: tuned tunesvc kernels vs torch.

    python benchmarks/norms.py --db tune.db --sweep --budget 16
    python benchmarks/norms.py --check

With --sweep, first tunes the four templates (layernorm, layernorm_bwd, rmsnorm, rmsnorm_bwd)
on preset "llm" of each template into --db (resuming what is stored there). Then, per op and shape, in one
process and on the same random inputs: the tuned kernel (config from the runtime lookup on
--db), torch eager and, for the forwards, torch.compile'd torch.nn.functional.layer_norm /
rms_norm are timed with triton.testing.do_bench (median, L2 flushed); each forward and its
torch.compile peer in --rounds interleaved rounds (the table gives the medians, and the
per-round ratios' lowest and highest). Backwards are timed as
the kernels alone for tunesvc and as torch.autograd.grad of the eager forward for torch. One
table: GB/s over the template's minimum bytes, % of the copy bandwidth measured in this run,
speed ratios (>1: tunesvc is faster), the relative error against a float32 torch reference,
and where the config came from (exact / nearest / heuristic).

--check only runs every op once on the shapes plus an odd one through the user-facing autograd
functions and compares with float32 torch autograd; it exits 1 on any wrong result.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from _common import bench_ms
from _common import copy_bandwidth
from _common import interleaved_ms
from _common import print_table
from _common import record
from _common import require_gpu
from _common import result_row
from _common import sweep

from tunesvc.bench import relative_error as rel_error
from tunesvc.kernels import layer_norm
from tunesvc.kernels import layernorm
from tunesvc.kernels import rms_norm
from tunesvc.kernels import rmsnorm
from tunesvc.serving.runtime import configure

SHAPES = [(p["M"], p["N"]) for p in layernorm.TEMPLATE.presets["llm"]]
TEMPLATES = [layernorm.TEMPLATE, layernorm.BWD_TEMPLATE, rmsnorm.TEMPLATE, rmsnorm.BWD_TEMPLATE]
LN_EPS, RMS_EPS = 1e-5, 1e-6
TOL = {"float16": 5e-3, "bfloat16": 2e-2, "float32": 1e-4}


def inputs(M: int, N: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    x = (torch.randn(M, N, device="cuda") * 2 + 0.5).to(dtype)
    w = (torch.randn(N, device="cuda") + 1).to(dtype)
    b = torch.randn(N, device="cuda").to(dtype)
    dy = torch.randn(M, N, device="cuda").to(dtype)
    return x, w, b, dy


def reference(op: str, x, w, b, dy) -> tuple[torch.Tensor, ...]:
    """Float32 torch autograd: (y, dx, dw[, db])."""
    x32, w32, b32 = (t.float().requires_grad_(True) for t in (x, w, b))
    params = (w32, b32) if op == "layer_norm" else (w32,)
    y = (
        F.layer_norm(x32, (x.shape[1],), w32, b32, LN_EPS)
        if op == "layer_norm"
        else F.rms_norm(x32, (x.shape[1],), w32, RMS_EPS)
    )
    grads = torch.autograd.grad(y, (x32, *params), dy.float())
    return (y.detach(), *grads)


def check(dtype: str) -> int:
    """Every op through the user-facing autograd functions; 1 if any result is wrong."""
    failures = 0
    for M, N in [(1023, 777), *SHAPES]:
        x, w, b, dy = inputs(M, N, getattr(torch, dtype))
        for op in ("layer_norm", "rms_norm"):
            xs, ws, bs = (t.clone().requires_grad_(True) for t in (x, w, b))
            params = (ws, bs) if op == "layer_norm" else (ws,)
            y = layer_norm(xs, ws, bs, LN_EPS) if op == "layer_norm" else rms_norm(xs, ws, RMS_EPS)
            ours = (y.detach(), *torch.autograd.grad(y, (xs, *params), dy))
            errors = [rel_error(o, r) for o, r in zip(ours, reference(op, x, w, b, dy))]
            ok = max(errors) <= TOL[dtype]
            failures += not ok
            print(
                f"{'ok ' if ok else 'BAD'} {op} {M}x{N} {dtype}: relative errors (y, dx, dw[, db]) "
                + ", ".join(f"{e:.2e}" for e in errors),
                flush=True,
            )
    return 1 if failures else 0


def compiled(fn):
    """fn under torch.compile, or None where compiling fails on this install."""
    try:
        return torch.compile(fn, dynamic=False)
    except Exception as exc:  # the peer is optional: the table says n/a
        print(f"torch.compile unavailable: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


def time_or_none(fn) -> float | None:
    try:
        return bench_ms(fn)
    except Exception as exc:  # a failing peer (e.g. an Inductor error) is reported, not fatal
        print(f"peer failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", file=sys.stderr)
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="tune.db")
    parser.add_argument("--sweep", action="store_true", help="tune the four templates on the shapes first")
    parser.add_argument(
        "--budget", type=int, default=16, help="trials per template and shape (12 sweeps: keep it small)"
    )
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(TOL))
    parser.add_argument("--check", action="store_true", help="only check correctness, quickly")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    parser.add_argument(
        "--rounds", type=int, default=5, help="interleaved rounds of the forwards against torch.compile"
    )
    args = parser.parse_args()
    require_gpu("benchmarks/norms.py")
    runtime = configure(db=args.db)
    if args.check:
        return check(args.dtype)

    if args.sweep:
        for template in TEMPLATES:
            sweep(
                template, [template.problem(M=m, N=n, dtype=args.dtype) for m, n in SHAPES], args.db, budget=args.budget
            )
        runtime = configure(db=args.db)  # read the winners just stored

    bandwidth = copy_bandwidth()
    dtype = getattr(torch, args.dtype)
    peers_compiled = (
        {}
        if args.no_compile
        else {
            "layer_norm": compiled(lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, LN_EPS)),
            "rms_norm": compiled(lambda x, w: F.rms_norm(x, (x.shape[-1],), w, RMS_EPS)),
        }
    )
    rows, csv_rows = [], []
    for M, N in SHAPES:
        x, w, b, dy = inputs(M, N, dtype)
        for op, module in (("layer_norm", layernorm), ("rms_norm", rmsnorm)):
            ref = reference(op, x, w, b, dy)
            problem = {"M": M, "N": N, "dtype": args.dtype}
            fwd = runtime.lookup(module.TEMPLATE, **problem)
            bwd = runtime.lookup(module.BWD_TEMPLATE, **problem)
            if op == "layer_norm":
                y, mean, rstd = layernorm.launch_layernorm(x, w, b, LN_EPS, fwd.config)
                run_fwd = lambda: layernorm.launch_layernorm(x, w, b, LN_EPS, fwd.config)
                grads = layernorm.launch_layernorm_bwd(x, w, dy, mean, rstd, bwd.config)
                run_bwd = lambda: layernorm.launch_layernorm_bwd(x, w, dy, mean, rstd, bwd.config)
                eager_fwd = lambda: F.layer_norm(x, (N,), w, b, LN_EPS)
                leaves = (x, w, b)
                peer = peers_compiled.get(op)
                compiled_fwd = peer and (lambda: peer(x, w, b))
            else:
                y, rstd = rmsnorm.launch_rmsnorm(x, w, RMS_EPS, fwd.config)
                run_fwd = lambda: rmsnorm.launch_rmsnorm(x, w, RMS_EPS, fwd.config)
                grads = rmsnorm.launch_rmsnorm_bwd(x, w, dy, rstd, bwd.config)
                run_bwd = lambda: rmsnorm.launch_rmsnorm_bwd(x, w, dy, rstd, bwd.config)
                eager_fwd = lambda: F.rms_norm(x, (N,), w, RMS_EPS)
                leaves = (x, w)
                peer = peers_compiled.get(op)
                compiled_fwd = peer and (lambda: peer(x, w))
            fwd_err = rel_error(y, ref[0])
            bwd_err = max(rel_error(g, r) for g, r in zip(grads, ref[1:]))
            fwd_bytes = module.TEMPLATE.cost(module.TEMPLATE.problem(**problem)).bytes
            bwd_bytes = module.BWD_TEMPLATE.cost(module.BWD_TEMPLATE.problem(**problem)).bytes

            eager_fwd_ms = bench_ms(eager_fwd)
            # a peer that fails is reported and left out; a first timing also compiles it outside the rounds
            compiled_fwd = compiled_fwd if compiled_fwd and time_or_none(compiled_fwd) else None
            if compiled_fwd:
                # ours and torch.compile tie at the copy roofline: rounds, so that the ratio is one
                ours_fwd, compiled_fwd_ms, ratios = interleaved_ms(run_fwd, compiled_fwd, args.rounds)
                spread = f"{ratios[0]:.3f}-{ratios[-1]:.3f}x"
            else:
                ours_fwd, compiled_fwd_ms, spread = bench_ms(run_fwd), None, "-"
            rows.append(
                row(
                    f"{op} fwd",
                    M,
                    N,
                    fwd_bytes,
                    bandwidth,
                    ours_fwd,
                    eager_fwd_ms,
                    compiled_fwd_ms,
                    fwd_err,
                    fwd.source,
                )
                + [spread]
            )

            fwd_problem = module.TEMPLATE.problem(**problem)
            csv_rows.append(
                result_row(
                    module.TEMPLATE,
                    fwd_problem,
                    peer="torch eager",
                    ours_ms=ours_fwd,
                    peer_ms=eager_fwd_ms,
                    timing_method="do_bench",
                    rate_unit="GB/s",
                    work=fwd_bytes,
                )
            )
            if compiled_fwd_ms:
                csv_rows.append(
                    result_row(
                        module.TEMPLATE,
                        fwd_problem,
                        peer="torch.compile",
                        ours_ms=ours_fwd,
                        peer_ms=compiled_fwd_ms,
                        timing_method="do_bench",
                        rate_unit="GB/s",
                        work=fwd_bytes,
                    )
                )

            ts = [t.detach().requires_grad_(True) for t in leaves]
            y_torch = (
                F.layer_norm(ts[0], (N,), *ts[1:], LN_EPS)
                if op == "layer_norm"
                else F.rms_norm(ts[0], (N,), ts[1], RMS_EPS)
            )
            eager_bwd_ms = bench_ms(lambda: torch.autograd.grad(y_torch, ts, dy, retain_graph=True))
            ours_bwd = bench_ms(run_bwd)
            csv_rows.append(
                result_row(
                    module.BWD_TEMPLATE,
                    module.BWD_TEMPLATE.problem(**problem),
                    peer="torch eager (autograd.grad)",
                    ours_ms=ours_bwd,
                    peer_ms=eager_bwd_ms,
                    timing_method="do_bench",
                    rate_unit="GB/s",
                    work=bwd_bytes,
                )
            )
            rows.append(
                row(f"{op} bwd", M, N, bwd_bytes, bandwidth, ours_bwd, eager_bwd_ms, None, bwd_err, bwd.source) + ["-"]
            )
            print(
                f"timed {op} {M}x{N}: fwd {ours_fwd * 1e3:.0f} us ({fwd.source}), bwd {ours_bwd * 1e3:.0f} us ({bwd.source})",
                flush=True,
            )
            del y_torch, grads, y, ref

    print(f"\ncopy bandwidth measured now: {bandwidth / 1e9:.0f} GB/s (read + write)")
    print_table(
        f"LayerNorm / RMSNorm, {args.dtype}: tunesvc vs torch (ratios > 1: tunesvc is faster)",
        [
            "op",
            "M x N",
            "ours GB/s",
            "% of copy",
            "eager GB/s",
            "compile GB/s",
            "ours / eager",
            "ours / compile",
            "rel err",
            "config",
            "ours / compile, each round",
        ],
        rows,
    )
    record("norms", csv_rows)
    return 0


def row(op, M, N, nbytes, bandwidth, ours_ms, eager_ms, compiled_ms, err, source) -> list:
    gbs = lambda ms: nbytes / (ms * 1e-3) / 1e9
    return [
        op,
        f"{M}x{N}",
        gbs(ours_ms),
        f"{100 * gbs(ours_ms) * 1e9 / bandwidth:.0f}%",
        gbs(eager_ms),
        gbs(compiled_ms) if compiled_ms else "-",
        f"{eager_ms / ours_ms:.2f}x",
        f"{compiled_ms / ours_ms:.2f}x" if compiled_ms else ("n/a" if op.endswith("fwd") else "-"),
        f"{err:.1e}",
        source,
    ]


if __name__ == "__main__":
    sys.exit(main())
