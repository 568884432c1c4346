"""Fused bias + activation + residual: y = act(x + bias) + residual, in one read of each input.

x and residual are (M, N), bias is (N,). Each program owns a BLOCK_M x BLOCK_N tile, loads the
BLOCK_N slice of bias once for all its rows, and computes in float32. The activation is a
problem option, fixed at compile time:

- gelu: the exact erf form 0.5 z (1 + erf(z / sqrt 2)), torch's default (approximate="none");
- silu: z sigmoid(z);
- relu: max(z, 0).

The backward ("bias_act_residual_bwd", tuned on its own) recomputes z = x + bias and gives
dx = dy act'(z), dbias = sum over rows of dx (each program sums ROWS rows of a column block into
a float32 partial row, then a torch sum over the few partial rows) and dresidual = dy itself.

Minimum bytes = (3 M N + N) * element size (x, residual and y once, bias once); backward the same
(x and dy read, dx written).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from tunesvc.serving.launch import direct_launch
from tunesvc.serving.ops import config_arg
from tunesvc.serving.ops import config_of
from tunesvc.serving.ops import kernel_op
from tunesvc.serving.ops import replayed
from tunesvc.serving.runtime import default_runtime
from tunesvc.space import LAUNCH_OPTIONS
from tunesvc.space import Config

# the template (torch-free, in tunesvc.templates) and its names, importable from here as before
from tunesvc.templates.pointwise import ACTIVATIONS as ACTIVATIONS
from tunesvc.templates.pointwise import BWD_TEMPLATE as BWD_TEMPLATE
from tunesvc.templates.pointwise import TEMPLATE as TEMPLATE
from tunesvc.templates.pointwise import BiasActResidualBwdTemplate as BiasActResidualBwdTemplate
from tunesvc.templates.pointwise import BiasActResidualTemplate as BiasActResidualTemplate


@triton.jit
def _bias_act_residual_kernel(
    x_ptr, bias_ptr, res_ptr, y_ptr,
    M, N,
    stride_xm, stride_rm, stride_ym,
    ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(axis=0)
    pid_n = tl.program_id(axis=1)
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    mask = (offs_m[:, None] < M) & mask_n[None, :]

    bias = tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
    r = tl.load(res_ptr + offs_m[:, None] * stride_rm + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
    z = x + bias[None, :]
    if ACT == "gelu":
        a = 0.5 * z * (1.0 + tl.erf(z * 0.7071067811865476))
    elif ACT == "silu":
        a = z * tl.sigmoid(z)
    else:
        a = tl.maximum(z, 0.0)
    y = a + r
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def launch_bias_act_residual(
    x: torch.Tensor,
    bias: torch.Tensor,
    residual: torch.Tensor,
    act: str,
    config: Config,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """act(x + bias) + residual with one explicit config (no lookup); x, residual (M, N) with unit column stride."""
    M, N = x.shape
    y = torch.empty((M, N), device=x.device, dtype=x.dtype) if out is None else out
    meta = {k: v for k, v in config.items() if k not in LAUNCH_OPTIONS}
    options = {k: v for k, v in config.items() if k in LAUNCH_OPTIONS}
    grid = (triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(N, meta["BLOCK_N"]))
    _bias_act_residual_kernel[grid](
        x, bias, residual, y, M, N, x.stride(0), residual.stride(0), y.stride(0), ACT=act, **meta, **options
    )
    return y


@triton.jit
def _bias_act_residual_bwd_kernel(
    x_ptr, bias_ptr, dy_ptr, dx_ptr, partial_ptr,
    M, N,
    stride_xm, stride_dym, stride_dxm,
    ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(axis=0)
    pid_n = tl.program_id(axis=1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    bias = tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    dbias = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for row in range(pid_m * ROWS, min(pid_m * ROWS + ROWS, M), BLOCK_M):
        offs_m = (row + tl.arange(0, BLOCK_M)).to(tl.int64)
        mask = (offs_m[:, None] < M) & mask_n[None, :]
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offs_m[:, None] * stride_dym + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
        z = x + bias[None, :]
        if ACT == "gelu":
            # d/dz [z Phi(z)] = Phi(z) + z phi(z)
            grad = 0.5 * (1.0 + tl.erf(z * 0.7071067811865476)) + z * 0.3989422804014327 * tl.exp(-0.5 * z * z)
        elif ACT == "silu":
            sig = tl.sigmoid(z)
            grad = sig * (1.0 + z * (1.0 - sig))
        else:
            grad = tl.where(z > 0.0, 1.0, 0.0)
        dx = dy * grad  # masked elements have dy = 0
        tl.store(dx_ptr + offs_m[:, None] * stride_dxm + offs_n[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dbias += tl.sum(dx, axis=0)
    tl.store(partial_ptr + pid_m * N + offs_n, dbias, mask=mask_n)


def launch_bias_act_residual_bwd(
    x: torch.Tensor,
    bias: torch.Tensor,
    dy: torch.Tensor,
    act: str,
    config: Config,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """dx and dbias (dresidual is dy) with one explicit config; x, dy (M, N) with unit column stride.

    ``out``, a flat buffer of M N + N elements, receives dx then dbias back to back.
    """
    M, N = x.shape
    out = torch.empty(M * N + N, device=x.device, dtype=x.dtype) if out is None else out
    dx, dbias = out[: M * N].view(M, N), out[M * N :]
    meta = {k: v for k, v in config.items() if k not in LAUNCH_OPTIONS}
    options = {k: v for k, v in config.items() if k in LAUNCH_OPTIONS}
    groups = triton.cdiv(M, meta["ROWS"])
    partial = torch.empty((groups, N), device=x.device, dtype=torch.float32)
    grid = (groups, triton.cdiv(N, meta["BLOCK_N"]))
    _bias_act_residual_bwd_kernel[grid](
        x, bias, dy, dx, partial, M, N, x.stride(0), dy.stride(0), dx.stride(0), ACT=act, **meta, **options
    )
    dbias.copy_(partial.sum(dim=0))
    return dx, dbias


# a hit launches the compiled kernel directly (tunesvc.serving.launch); the templates hash the same sources
_bias_act_residual_kernel = direct_launch(_bias_act_residual_kernel)
_bias_act_residual_bwd_kernel = direct_launch(_bias_act_residual_bwd_kernel)


def bias_act_residual_reference(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor, act: str) -> torch.Tensor:
    """The torch formula, in the caller's dtype: the reference and the benchmark's eager peer."""
    z = x + bias
    if act == "gelu":
        a = torch.nn.functional.gelu(z)
    elif act == "silu":
        a = torch.nn.functional.silu(z)
    else:
        a = torch.relu(z)
    return a + residual


@replayed
def bias_act_residual(
    x: torch.Tensor,
    bias: torch.Tensor,
    residual: torch.Tensor,
    act: str = "gelu",
    *,
    config: Config | None = None,
    bwd_config: Config | None = None,
) -> torch.Tensor:
    """act(x + bias) + residual over the last dimension, with the tuned config for this shape.

    x and residual have one shape (..., N), bias is (N,), all one dtype (float16, bfloat16 or
    float32) on one device; act is "gelu" (erf form), "silu" or "relu". Differentiable in x, bias
    and residual: the backward launches the tuned "bias_act_residual_bwd" kernel.
    """
    if act not in ACTIVATIONS:
        raise ValueError(f"bias_act_residual: act={act!r} is not one of {', '.join(ACTIVATIONS)}")
    if x.ndim < 1 or x.shape != residual.shape or bias.shape != x.shape[-1:]:
        raise ValueError(
            f"bias_act_residual needs x and residual of one shape (..., N) and bias (N,); got "
            f"{tuple(x.shape)}, {tuple(residual.shape)} and {tuple(bias.shape)}"
        )
    if x.numel() == 0:
        raise ValueError("bias_act_residual needs a non-empty x")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"bias_act_residual needs float16, bfloat16 or float32 tensors; got {x.dtype}")
    if not (x.dtype == bias.dtype == residual.dtype):
        raise ValueError(f"bias_act_residual needs one dtype; got {x.dtype}, {bias.dtype} and {residual.dtype}")
    n = x.shape[-1]
    # the kernel walks columns with unit stride; reshape copies only where it must
    rows, res_rows = x.reshape(-1, n), residual.reshape(-1, n)
    rows = rows if rows.stride(1) == 1 else rows.contiguous()
    res_rows = res_rows if res_rows.stride(1) == 1 else res_rows.contiguous()
    y = _bias_act_residual_op.call(
        rows,
        bias.contiguous(),
        res_rows,
        act,
        config_arg(config),
        config_arg(bwd_config),
        grad_inputs=(rows, bias, res_rows),
    )
    return y.reshape(x.shape)


def _bias_act_residual(
    x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor, act: str, config: str, bwd_config: str
) -> torch.Tensor:
    """The op tunesvc::bias_act_residual: the tuned config (config "") or the given one, launched."""
    explicit = config_of(config)
    if explicit is None:
        runtime = default_runtime()
        key = (TEMPLATE, x.shape, act, x.dtype, index := x.get_device())
        explicit = runtime.launch_configs.get(key) or runtime.tuned(
            key, index, TEMPLATE, M=x.shape[0], N=x.shape[1], act=act, dtype=x.dtype
        )
    return launch_bias_act_residual(x, bias, residual, act, explicit)


def _bias_act_residual_bwd(
    x: torch.Tensor, bias: torch.Tensor, dy: torch.Tensor, act: str, config: str
) -> torch.Tensor:
    """The op tunesvc::bias_act_residual_bwd: dx and dbias back to back in one flat buffer (an
    op's outputs may not be views of one buffer, so the caller takes them apart)."""
    explicit = config_of(config)
    if explicit is None:
        runtime = default_runtime()
        key = (BWD_TEMPLATE, x.shape, act, x.dtype, index := x.get_device())
        explicit = runtime.launch_configs.get(key) or runtime.tuned(
            key, index, BWD_TEMPLATE, M=x.shape[0], N=x.shape[1], act=act, dtype=x.dtype
        )
    out = x.new_empty(x.numel() + x.shape[1])
    launch_bias_act_residual_bwd(x, bias, dy, act, explicit, out=out)
    return out


def _bias_act_residual_setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    x, bias, _, act, _, bwd_config = inputs
    ctx.save_for_backward(x, bias)
    ctx.act, ctx.bwd_config = act, bwd_config


def _bias_act_residual_backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    x, bias = ctx.saved_tensors
    dy_rows = dy if dy.stride(1) == 1 else dy.contiguous()
    grads = _bias_act_residual_bwd_op.call(x, bias, dy_rows, ctx.act, ctx.bwd_config)
    M, N = x.shape
    # d/dresidual is dy itself
    return grads[: M * N].view(M, N), grads[M * N :], dy, None, None, None


_bias_act_residual_op = kernel_op(
    "bias_act_residual",
    _bias_act_residual,
    lambda x, bias, residual, act, config, bwd_config: x.new_empty(x.shape),
)
_bias_act_residual_bwd_op = kernel_op(
    "bias_act_residual_bwd",
    _bias_act_residual_bwd,
    lambda x, bias, dy, act, config: x.new_empty(x.numel() + x.shape[1]),
)
_bias_act_residual_op.register_autograd(_bias_act_residual_backward, _bias_act_residual_setup)
