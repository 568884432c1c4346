"""Softmax over the rows of a 2-D tensor: y[i, j] = exp(x[i, j] - max_i) / sum_j exp(x[i, j] - max_i).

Each program owns BLOCK_M rows. When a whole row fits one BLOCK_N block it is read once, reduced
in registers and written once (Triton tutorial 02, "Fused softmax"). When it does not, the row
is walked twice: an online pass keeps a running max m and a running sum s, rescaling s by
exp(m_old - m_new) whenever the max grows (Milakov and Gimelshein, "Online normalizer
calculation for softmax", 2018), then a normalising pass re-reads the row and writes
exp(x - m) / s. The path is chosen automatically from BLOCK_N >= N; BLOCK_N is a space
parameter, so the search picks one-pass or multi-block per shape.

The backward ("softmax_bwd", tuned on its own) is dx = y * (dy - sum_j y dy) from the saved
output y, one-pass or two-pass (the row's sum of y dy, then dx) by the same BLOCK_N rule.

FLOPs ~ 4 M N (max, subtract, exp, divide); minimum bytes = 2 M N * element size; backward
3 M N * element size (y and dy read, dx written).
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
from tunesvc.templates.softmax import BWD_TEMPLATE as BWD_TEMPLATE
from tunesvc.templates.softmax import TEMPLATE as TEMPLATE
from tunesvc.templates.softmax import SoftmaxBwdTemplate as SoftmaxBwdTemplate
from tunesvc.templates.softmax import SoftmaxTemplate as SoftmaxTemplate


@triton.jit
def _softmax_kernel(
    x_ptr, y_ptr,
    M, N,
    stride_xm, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ONE_PASS: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(axis=0)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    # rows past M wrap (modulo) so every loaded row holds real numbers; their stores are masked
    rows = (offs_m % M).to(tl.int64)
    row_mask = offs_m < M
    offs_n = tl.arange(0, BLOCK_N)
    x_rows = x_ptr + rows[:, None] * stride_xm
    y_rows = y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym

    if ONE_PASS:
        mask = offs_n[None, :] < N
        x = tl.load(x_rows + offs_n[None, :], mask=mask, other=-float("inf")).to(tl.float32)
        # base 2 throughout: exp2(x log2 e - max) is exp(x - max), and exp2 is the hardware's ex2
        x = x * 1.4426950408889634
        z = x - tl.max(x, axis=1)[:, None]
        num = tl.exp2(z)
        y = num / tl.sum(num, axis=1)[:, None]
        tl.store(y_rows + offs_n[None, :], y.to(y_ptr.dtype.element_ty), mask=row_mask[:, None] & mask)
    else:
        m_i = tl.full((BLOCK_M,), -float("inf"), dtype=tl.float32)
        s_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            cols = start + offs_n
            mask = cols[None, :] < N
            x = tl.load(x_rows + cols[None, :], mask=mask, other=-float("inf")).to(tl.float32) * 1.4426950408889634
            m_new = tl.maximum(m_i, tl.max(x, axis=1))
            s_i = s_i * tl.exp2(m_i - m_new) + tl.sum(tl.exp2(x - m_new[:, None]), axis=1)
            m_i = m_new
        inv_s = 1.0 / s_i
        for start in range(0, N, BLOCK_N):
            cols = start + offs_n
            mask = cols[None, :] < N
            x = tl.load(x_rows + cols[None, :], mask=mask, other=-float("inf")).to(tl.float32) * 1.4426950408889634
            y = tl.exp2(x - m_i[:, None]) * inv_s[:, None]
            tl.store(y_rows + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=row_mask[:, None] & mask)


def launch_softmax(x: torch.Tensor, config: Config, out: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax of each row of the 2-D x (unit column stride) with one explicit config (no lookup)."""
    M, N = x.shape
    y = torch.empty((M, N), device=x.device, dtype=x.dtype) if out is None else out
    meta = {k: v for k, v in config.items() if k not in LAUNCH_OPTIONS}
    options = {k: v for k, v in config.items() if k in LAUNCH_OPTIONS}
    grid = (triton.cdiv(M, meta["BLOCK_M"]),)
    _softmax_kernel[grid](x, y, M, N, x.stride(0), y.stride(0), **meta, ONE_PASS=meta["BLOCK_N"] >= N, **options)  # type: ignore[operator]
    return y


@triton.jit
def _softmax_bwd_kernel(
    y_ptr, dy_ptr, dx_ptr,
    M, N,
    stride_ym, stride_dym, stride_dxm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ONE_PASS: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(axis=0)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    # rows past M wrap (modulo) so loads stay in bounds; their stores are masked
    rows = (offs_m % M).to(tl.int64)
    row_mask = offs_m < M
    offs_n = tl.arange(0, BLOCK_N)
    y_rows = y_ptr + rows[:, None] * stride_ym
    dy_rows = dy_ptr + rows[:, None] * stride_dym
    dx_rows = dx_ptr + offs_m.to(tl.int64)[:, None] * stride_dxm

    if ONE_PASS:
        mask = offs_n[None, :] < N
        y = tl.load(y_rows + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_rows + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
        dx = y * (dy - tl.sum(y * dy, axis=1)[:, None])
        tl.store(dx_rows + offs_n[None, :], dx.to(dx_ptr.dtype.element_ty), mask=row_mask[:, None] & mask)
    else:
        dot = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            cols = start + offs_n
            mask = cols[None, :] < N
            y = tl.load(y_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            dot += tl.sum(y * dy, axis=1)
        for start in range(0, N, BLOCK_N):
            cols = start + offs_n
            mask = cols[None, :] < N
            y = tl.load(y_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            dx = y * (dy - dot[:, None])
            tl.store(dx_rows + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=row_mask[:, None] & mask)


def launch_softmax_bwd(
    y: torch.Tensor, dy: torch.Tensor, config: Config, out: torch.Tensor | None = None
) -> torch.Tensor:
    """dx of the row softmax from its output y and dy (2-D, unit column stride), one explicit config."""
    M, N = y.shape
    dx = torch.empty((M, N), device=y.device, dtype=y.dtype) if out is None else out
    meta = {k: v for k, v in config.items() if k not in LAUNCH_OPTIONS}
    options = {k: v for k, v in config.items() if k in LAUNCH_OPTIONS}
    grid = (triton.cdiv(M, meta["BLOCK_M"]),)
    _softmax_bwd_kernel[grid](
        y, dy, dx,
        M, N,
        y.stride(0), dy.stride(0), dx.stride(0),
        **meta, ONE_PASS=meta["BLOCK_N"] >= N, **options,  # type: ignore[operator]
    )  # fmt: skip
    return dx


# a hit launches the compiled kernel directly (tunesvc.serving.launch); the templates hash the same sources
_softmax_kernel = direct_launch(_softmax_kernel)
_softmax_bwd_kernel = direct_launch(_softmax_bwd_kernel)


def _softmax(rows: torch.Tensor, config: str, bwd_config: str) -> torch.Tensor:
    """The op tunesvc::softmax: the tuned config (config "") or the given one, launched."""
    explicit = config_of(config)
    if explicit is None:
        runtime = default_runtime()
        key = (TEMPLATE, rows.shape, rows.dtype, index := rows.get_device())
        explicit = runtime.launch_configs.get(key) or runtime.tuned(
            key, index, TEMPLATE, M=rows.shape[0], N=rows.shape[1], dtype=rows.dtype
        )
    return launch_softmax(rows, explicit)


def _softmax_bwd(y: torch.Tensor, dy: torch.Tensor, config: str) -> torch.Tensor:
    """The op tunesvc::softmax_bwd: dx from the forward's output y and dy."""
    explicit = config_of(config)
    if explicit is None:
        runtime = default_runtime()
        key = (BWD_TEMPLATE, y.shape, y.dtype, index := y.get_device())
        explicit = runtime.launch_configs.get(key) or runtime.tuned(
            key, index, BWD_TEMPLATE, M=y.shape[0], N=y.shape[1], dtype=y.dtype
        )
    return launch_softmax_bwd(y, dy, explicit)


def _softmax_setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.save_for_backward(output)
    ctx.bwd_config = inputs[2]


def _softmax_backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, None, None]:
    (y,) = ctx.saved_tensors
    dy = dy if dy.stride(1) == 1 else dy.contiguous()
    return _softmax_bwd_op.call(y, dy, ctx.bwd_config), None, None


_softmax_op = kernel_op("softmax", _softmax, lambda rows, config, bwd_config: rows.new_empty(rows.shape))
_softmax_bwd_op = kernel_op("softmax_bwd", _softmax_bwd, lambda y, dy, config: y.new_empty(y.shape))
_softmax_op.register_autograd(_softmax_backward, _softmax_setup)


@replayed
def softmax(x: torch.Tensor, *, config: Config | None = None, bwd_config: Config | None = None) -> torch.Tensor:
    """Softmax over the last dimension of x with the tuned configs for this device and shape.

    x is float16, bfloat16 or float32 with at least one dimension; the result has x's shape
    and dtype. Differentiable: the backward launches the tuned "softmax_bwd" kernel.
    """
    if x.ndim < 1 or x.numel() == 0:
        raise ValueError(f"softmax needs a non-empty tensor with at least one dimension; got shape {tuple(x.shape)}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"softmax needs a float16, bfloat16 or float32 tensor; got {x.dtype}")
    rows = x if x.ndim == 2 else x.reshape(-1, x.shape[-1])  # a 2-D x as it is: no view per call
    if rows.stride(1) != 1:
        rows = rows.contiguous()  # the kernel walks columns with unit stride
    y = _softmax_op.call(rows, config_arg(config), config_arg(bwd_config), grad_inputs=(rows,))
    return y if y.shape == x.shape else y.reshape(x.shape)
