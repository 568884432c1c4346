"""LayerNorm over the last dim: forward and backward, after Triton tutorial 05 (layer-norm).

Forward, per row of x (M rows of N): mean = sum(x) / N, var = sum((x - mean)^2) / N,
rstd = 1 / sqrt(var + eps), y = (x - mean) * rstd * w + b. A program normalises BLOCK_M rows
held whole in registers (BLOCK_N = next_pow2(N), masked), so x is read once; it saves mean and
rstd (float32) for the backward.

Backward, with xhat = (x - mean) * rstd and g = w * dy:
dx = rstd * (g - xhat * mean(xhat * g) - mean(g)), dw = sum over rows of dy * xhat,
db = sum over rows of dy. dW/dB are reduced in two stages: GROUP_SIZE_M programs each own a
contiguous slice of rows and write their partial sums to their own row of a (programs, 2N)
float32 buffer; a second kernel sums that buffer's columns. The tutorial instead adds into
GROUP_SIZE_M shared rows under spin locks; owning a row needs no locks or atomics and makes
dW/dB bitwise reproducible from run to run.

Forward: FLOPs ~ 8 M N; minimum bytes = (2 M N + 2 N) * element size (x, y, w, b).
Backward: FLOPs ~ 13 M N; minimum bytes = (3 M N + 3 N) * element size + 8 M (x, dy, dx,
w, dw, db, mean and rstd).

:class:`RowNormTemplate` is shared with kernels/rmsnorm.py: both are (M, N) row problems.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from tunesvc.serving.launch import direct_launch
from tunesvc.serving.ops import kernel_op
from tunesvc.serving.ops import replayed
from tunesvc.serving.runtime import default_runtime
from tunesvc.space import LAUNCH_OPTIONS
from tunesvc.space import Config

# the template (torch-free, in tunesvc.templates) and its names, importable from here as before
from tunesvc.templates.layernorm import BWD_TEMPLATE as BWD_TEMPLATE
from tunesvc.templates.layernorm import MAX_ROW_BYTES as MAX_ROW_BYTES
from tunesvc.templates.layernorm import TEMPLATE as TEMPLATE
from tunesvc.templates.layernorm import LayerNormBwdTemplate as LayerNormBwdTemplate
from tunesvc.templates.layernorm import LayerNormTemplate as LayerNormTemplate
from tunesvc.templates.layernorm import RowNormTemplate as RowNormTemplate


@triton.jit
def _layernorm_fwd_kernel(
    X, Y, W, B, Mean, Rstd,
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
    # issued with the row, not after its reductions: their latency then overlaps the row's
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=col_mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / N
    xc = tl.where(mask, x - mean[:, None], 0.0)
    var = tl.sum(xc * xc, axis=1) / N
    rstd = 1.0 / tl.sqrt(var + eps)
    y = xc * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(Y + r64[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    tl.store(Mean + rows, mean, mask=row_mask)
    tl.store(Rstd + rows, rstd, mask=row_mask)


@triton.jit
def _layernorm_bwd_kernel(
    X, W, DY, DX, Mean, Rstd, Partial,
    M, N, stride_x, stride_dy, stride_dx, rows_per_program,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    db = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    for start in range(row_start, row_end, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        r64 = rows.to(tl.int64)  # row offsets in 64 bits: M * N may pass 2**31 elements
        row_mask = rows < row_end
        mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(X + r64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + r64[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(Mean + rows, mask=row_mask, other=0.0)
        rstd = tl.load(Rstd + rows, mask=row_mask, other=0.0)
        xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        g = w[None, :] * dy
        c1 = tl.sum(xhat * g, axis=1) / N
        c2 = tl.sum(g, axis=1) / N
        dx = (g - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
        tl.store(DX + r64[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        dw += dy * xhat
        db += dy
    # this program's own partial row: [dw | db]
    tl.store(Partial + pid * 2 * N + cols, tl.sum(dw, axis=0), mask=col_mask)
    tl.store(Partial + pid * 2 * N + N + cols, tl.sum(db, axis=0), mask=col_mask)


@triton.jit
def column_sum_kernel(Partial, Out, num_rows, width, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Out[j] = sum_i Partial[i, j] for a (num_rows, width) float32 buffer: the second stage."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < width
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, num_rows, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        mask = (rows[:, None] < num_rows) & col_mask[None, :]
        acc += tl.load(Partial + rows[:, None] * width + cols[None, :], mask=mask, other=0.0)
    tl.store(Out + cols, tl.sum(acc, axis=0).to(Out.dtype.element_ty), mask=col_mask)


# a hit launches the compiled kernel directly (tunesvc.serving.launch); the templates hash the same sources
_layernorm_fwd_kernel = direct_launch(_layernorm_fwd_kernel)
_layernorm_bwd_kernel = direct_launch(_layernorm_bwd_kernel)
column_sum_kernel = direct_launch(column_sum_kernel)


def split_config(config: Config) -> tuple[dict[str, int], dict[str, int]]:
    """A config as (kernel meta-parameters, launch options)."""
    # the row-norm spaces hold integers only
    meta = {k: int(v) for k, v in config.items() if k not in LAUNCH_OPTIONS}
    options = {k: int(v) for k, v in config.items() if k in LAUNCH_OPTIONS}
    return meta, options


def launch_column_sum(partial: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out = partial.sum(0) for a contiguous (rows, width) float32 buffer, in out's dtype."""
    rows, width = partial.shape
    # narrow blocks for narrow rows so that enough programs share the work
    block_n = 32 if width <= 8192 else 128
    column_sum_kernel[(triton.cdiv(width, block_n),)](
        partial, out, rows, width, BLOCK_M=32, BLOCK_N=block_n, num_warps=4
    )
    return out


def launch_layernorm(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float, config: Config
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """y, mean, rstd for x (M, N) with unit stride along N; one explicit config (no lookup)."""
    M, N = x.shape
    y = torch.empty((M, N), device=x.device, dtype=x.dtype)
    mean = torch.empty(M, device=x.device, dtype=torch.float32)
    rstd = torch.empty(M, device=x.device, dtype=torch.float32)
    meta, options = split_config(config)
    grid = (triton.cdiv(M, meta["BLOCK_M"]),)
    _layernorm_fwd_kernel[grid](x, y, w, b, mean, rstd, M, N, x.stride(0), y.stride(0), eps, **meta, **options)
    return y, mean, rstd


def launch_layernorm_bwd(
    x: torch.Tensor,
    w: torch.Tensor,
    dy: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    config: Config,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dx, dw, db with one explicit config (no lookup).

    ``out``, when given, is one flat buffer of M N + 2 N elements of x's dtype (w's dtype must
    match) that receives dx, dw and db back to back; otherwise they are allocated.
    """
    M, N = x.shape
    if out is None:
        dx = torch.empty((M, N), device=x.device, dtype=x.dtype)
        dwdb = torch.empty(2 * N, device=x.device, dtype=w.dtype)
    else:
        dx, dwdb = out[: M * N].view(M, N), out[M * N :]
    meta, options = split_config(config)
    rows_per_program = triton.cdiv(M, meta.pop("GROUP_SIZE_M"))
    programs = triton.cdiv(M, rows_per_program)
    partial = torch.empty((programs, 2 * N), device=x.device, dtype=torch.float32)
    _layernorm_bwd_kernel[(programs,)](
        x, w, dy, dx, mean, rstd, partial,
        M, N, x.stride(0), dy.stride(0), dx.stride(0), rows_per_program,
        **meta, **options,
    )  # fmt: skip
    launch_column_sum(partial, dwdb)
    return dx, dwdb[:N], dwdb[N:]


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """x as (M, N) with unit stride along N, copying only when a view cannot give that."""
    x2 = x if x.ndim == 2 else x.reshape(-1, x.shape[-1])  # a 2-D x is used as it is: no view per call
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def check_norm_args(fn: str, x: torch.Tensor, *params: torch.Tensor | None) -> None:
    """One ValueError sentence for tensors a norm cannot take."""
    if x.ndim < 1 or x.numel() == 0:
        raise ValueError(f"{fn} needs a non-empty x of shape (..., N); got {tuple(x.shape)}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"{fn} needs x in float16, bfloat16 or float32; got {x.dtype}")
    n, index = x.shape[-1], x.get_device()  # ints (-1 off CUDA): no torch.device made per call on the GPU
    for p in params:
        if p is not None and (
            p.ndim != 1 or p.shape[0] != n or p.get_device() != index or (index < 0 and p.device != x.device)
        ):
            raise ValueError(
                f"{fn} needs weight and bias of shape ({x.shape[-1]},) on {x.device}; got {tuple(p.shape)} on {p.device}"
            )


def _layernorm(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The op tunesvc::layernorm on rows x (M, N): y, mean, rstd with the tuned config."""
    runtime = default_runtime()
    key = (TEMPLATE, x.shape, x.dtype, index := x.get_device())
    config = runtime.launch_configs.get(key) or runtime.tuned(
        key, index, TEMPLATE, M=x.shape[0], N=x.shape[1], dtype=x.dtype
    )
    return launch_layernorm(x, w, b, eps, config)


def _layernorm_bwd(
    x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The op tunesvc::layernorm_bwd: dx, and dw and db back to back in one (2 N,) tensor."""
    runtime = default_runtime()
    key = (BWD_TEMPLATE, x.shape, x.dtype, index := x.get_device())
    config = runtime.launch_configs.get(key) or runtime.tuned(
        key, index, BWD_TEMPLATE, M=x.shape[0], N=x.shape[1], dtype=x.dtype
    )
    dx, dw, db = launch_layernorm_bwd(x, w, dy, mean, rstd, config)
    # dw and db are the two halves of one (2 N,) buffer, and an op's outputs may not alias each
    # other: return the whole buffer, seen from dw (a copy would cost a launch per backward)
    N = x.shape[1]
    assert db.data_ptr() == dw.data_ptr() + N * dw.element_size()
    return dx, dw.as_strided((2 * N,), (1,))


def _layernorm_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    x, w, _, _ = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, w, mean, rstd)
    # mean and rstd are for the backward, not the caller: no gradient flows into them
    ctx.mark_non_differentiable(mean, rstd)
    ctx.set_materialize_grads(False)


def _layernorm_backward(ctx: Any, dy: torch.Tensor, *_: Any) -> tuple[torch.Tensor | None, ...]:
    x, w, mean, rstd = ctx.saved_tensors
    dx, dwdb = _layernorm_bwd_op.call(x, w, as_rows(dy), mean, rstd)
    N = x.shape[1]
    return dx, dwdb[:N], dwdb[N:], None


def _layernorm_fake(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> tuple[torch.Tensor, ...]:
    stats = x.new_empty(x.shape[0], dtype=torch.float32)
    return x.new_empty(x.shape), stats, torch.empty_like(stats)


_layernorm_op = kernel_op("layernorm", _layernorm, _layernorm_fake)
_layernorm_bwd_op = kernel_op(
    "layernorm_bwd",
    _layernorm_bwd,
    lambda x, w, dy, mean, rstd: (x.new_empty(x.shape), w.new_empty(2 * x.shape[1])),
)
_layernorm_op.register_autograd(_layernorm_backward, _layernorm_setup)


@replayed
def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """torch.nn.functional.layer_norm(x, (N,), weight, bias, eps) with tuned configs, autograd included.

    x is (..., N) in float16, bfloat16 or float32; weight and bias are (N,) on x's device (any
    float dtype; their gradients come back in it). Forward and backward each look up their own
    tuned config (templates "layernorm" and "layernorm_bwd").
    """
    check_norm_args("layer_norm", x, weight, bias)
    x2 = as_rows(x)
    y, _, _ = _layernorm_op.call(x2, weight.contiguous(), bias.contiguous(), eps, grad_inputs=(x2, weight, bias))
    return y if y.shape == x.shape else y.view(x.shape)
