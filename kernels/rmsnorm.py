"""RMSNorm over the last dim: forward and backward (Zhang & Sennrich 2019, arXiv:1910.07467).

Forward, per row of x (M rows of N): rstd = 1 / sqrt(sum(x^2) / N + eps), y = x * rstd * w.
A program normalises BLOCK_M rows held whole in registers (BLOCK_N = next_pow2(N), masked)
and saves rstd (float32) for the backward.

Backward, with xhat = x * rstd and g = w * dy: dx = rstd * (g - xhat * mean(xhat * g)),
dw = sum over rows of dy * xhat. dW is reduced in two stages as in kernels/layernorm.py:
each of GROUP_SIZE_M programs owns a slice of rows and its own row of a (programs, N) float32
buffer (no locks or atomics, bitwise reproducible), then the buffer's columns are summed.

Forward: FLOPs ~ 4 M N; minimum bytes = (2 M N + N) * element size (x, y, w).
Backward: FLOPs ~ 9 M N; minimum bytes = (3 M N + 2 N) * element size + 4 M (x, dy, dx,
w, dw and rstd).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from tunesvc.kernels.layernorm import as_rows
from tunesvc.kernels.layernorm import check_norm_args
from tunesvc.kernels.layernorm import column_sum_kernel as column_sum_kernel  # hashed in rmsnorm_bwd's version
from tunesvc.kernels.layernorm import launch_column_sum
from tunesvc.kernels.layernorm import split_config
from tunesvc.serving.launch import direct_launch
from tunesvc.serving.ops import kernel_op
from tunesvc.serving.ops import replayed
from tunesvc.serving.runtime import default_runtime
from tunesvc.space import Config

# the template (torch-free, in tunesvc.templates) and its names, importable from here as before
from tunesvc.templates.rmsnorm import BWD_TEMPLATE as BWD_TEMPLATE
from tunesvc.templates.rmsnorm import TEMPLATE as TEMPLATE
from tunesvc.templates.rmsnorm import RMSNormBwdTemplate as RMSNormBwdTemplate
from tunesvc.templates.rmsnorm import RMSNormTemplate as RMSNormTemplate


@triton.jit
def _rmsnorm_fwd_kernel(
    X, Y, W, Rstd,
    M, N, stride_x, stride_y, eps,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    r64 = rows.to(tl.int64)  # row offsets in 64 bits: M * N may pass 2**31 elements
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < M
    col_mask = cols < N
    mask = row_mask[:, None] & col_mask[None, :]
    x = tl.load(X + r64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)  # with the row: its latency overlaps
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)
    y = x * rstd[:, None] * w[None, :]
    tl.store(Y + r64[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    tl.store(Rstd + rows, rstd, mask=row_mask)


@triton.jit
def _rmsnorm_bwd_kernel(
    X, W, DY, DX, Rstd, Partial,
    M, N, stride_x, stride_dy, stride_dx, rows_per_program,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    for start in range(row_start, row_end, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        r64 = rows.to(tl.int64)  # row offsets in 64 bits: M * N may pass 2**31 elements
        row_mask = rows < row_end
        mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(X + r64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + r64[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(Rstd + rows, mask=row_mask, other=0.0)
        xhat = x * rstd[:, None]
        g = w[None, :] * dy
        c = tl.sum(xhat * g, axis=1) / N
        dx = (g - xhat * c[:, None]) * rstd[:, None]
        tl.store(DX + r64[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        dw += dy * xhat
    tl.store(Partial + pid * N + cols, tl.sum(dw, axis=0), mask=col_mask)


def launch_rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float, config: Config) -> tuple[torch.Tensor, torch.Tensor]:
    """y, rstd for x (M, N) with unit stride along N; one explicit config (no lookup)."""
    M, N = x.shape
    y = torch.empty((M, N), device=x.device, dtype=x.dtype)
    rstd = torch.empty(M, device=x.device, dtype=torch.float32)
    meta, options = split_config(config)
    grid = (triton.cdiv(M, meta["BLOCK_M"]),)
    _rmsnorm_fwd_kernel[grid](x, y, w, rstd, M, N, x.stride(0), y.stride(0), eps, **meta, **options)
    return y, rstd


def launch_rmsnorm_bwd(
    x: torch.Tensor,
    w: torch.Tensor,
    dy: torch.Tensor,
    rstd: torch.Tensor,
    config: Config,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """dx, dw with one explicit config (no lookup).

    ``out``, when given, is one flat buffer of M N + N elements of x's dtype (w's dtype must
    match) that receives dx and dw back to back; otherwise they are allocated.
    """
    M, N = x.shape
    if out is None:
        dx = torch.empty((M, N), device=x.device, dtype=x.dtype)
        dw = torch.empty(N, device=x.device, dtype=w.dtype)
    else:
        dx, dw = out[: M * N].view(M, N), out[M * N :]
    meta, options = split_config(config)
    rows_per_program = triton.cdiv(M, meta.pop("GROUP_SIZE_M"))
    programs = triton.cdiv(M, rows_per_program)
    partial = torch.empty((programs, N), device=x.device, dtype=torch.float32)
    _rmsnorm_bwd_kernel[(programs,)](
        x, w, dy, dx, rstd, partial,
        M, N, x.stride(0), dy.stride(0), dx.stride(0), rows_per_program,
        **meta, **options,
    )  # fmt: skip
    launch_column_sum(partial, dw)
    return dx, dw


# a hit launches the compiled kernel directly (tunesvc.serving.launch); the templates hash the same sources
_rmsnorm_fwd_kernel = direct_launch(_rmsnorm_fwd_kernel)
_rmsnorm_bwd_kernel = direct_launch(_rmsnorm_bwd_kernel)


def _rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The op tunesvc::rmsnorm on rows x (M, N): y and rstd with the tuned config."""
    runtime = default_runtime()
    key = (TEMPLATE, x.shape, x.dtype, index := x.get_device())
    config = runtime.launch_configs.get(key) or runtime.tuned(
        key, index, TEMPLATE, M=x.shape[0], N=x.shape[1], dtype=x.dtype
    )
    return launch_rmsnorm(x, w, eps, config)


def _rmsnorm_bwd(
    x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The op tunesvc::rmsnorm_bwd: dx and dw with the tuned config."""
    runtime = default_runtime()
    key = (BWD_TEMPLATE, x.shape, x.dtype, index := x.get_device())
    config = runtime.launch_configs.get(key) or runtime.tuned(
        key, index, BWD_TEMPLATE, M=x.shape[0], N=x.shape[1], dtype=x.dtype
    )
    return launch_rmsnorm_bwd(x, w, dy, rstd, config)


def _rmsnorm_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    x, w, _ = inputs
    ctx.save_for_backward(x, w, output[1])
    # rstd is for the backward, not the caller: no gradient flows into it
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)


def _rmsnorm_backward(ctx: Any, dy: torch.Tensor, *_: Any) -> tuple[torch.Tensor | None, ...]:
    x, w, rstd = ctx.saved_tensors
    dx, dw = _rmsnorm_bwd_op.call(x, w, as_rows(dy), rstd)
    return dx, dw, None


_rmsnorm_op = kernel_op(
    "rmsnorm",
    _rmsnorm,
    lambda x, w, eps: (x.new_empty(x.shape), x.new_empty(x.shape[0], dtype=torch.float32)),
)
_rmsnorm_bwd_op = kernel_op(
    "rmsnorm_bwd",
    _rmsnorm_bwd,
    lambda x, w, dy, rstd: (x.new_empty(x.shape), w.new_empty(x.shape[1])),
)
_rmsnorm_op.register_autograd(_rmsnorm_backward, _rmsnorm_setup)


@replayed
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """torch.nn.functional.rms_norm(x, (N,), weight, eps) with tuned configs, autograd included.

    x is (..., N) in float16, bfloat16 or float32; weight is (N,) on x's device (any float
    dtype; its gradient comes back in it). Forward and backward each look up their own tuned
    config (templates "rmsnorm" and "rmsnorm_bwd").
    """
    check_norm_args("rms_norm", x, weight)
    x2 = as_rows(x)
    y, _ = _rmsnorm_op.call(x2, weight.contiguous(), eps, grad_inputs=(x2, weight))
    return y if y.shape == x.shape else y.view(x.shape)
