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

from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

from tunesvc.device import Device
from tunesvc.launch import direct_launch
from tunesvc.ops import config_arg
from tunesvc.ops import config_of
from tunesvc.ops import kernel_op
from tunesvc.ops import replayed
from tunesvc.runtime import default_runtime
from tunesvc.space import LAUNCH_OPTIONS
from tunesvc.space import Config
from tunesvc.template import Cost
from tunesvc.template import Problem
from tunesvc.template import ShapeKey
from tunesvc.template import Template
from tunesvc.template import pow2_bucket


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


# a hit launches the compiled kernel directly (tunesvc.launch); the templates hash the same sources
_softmax_kernel = direct_launch(_softmax_kernel)
_softmax_bwd_kernel = direct_launch(_softmax_bwd_kernel)


class SoftmaxTemplate(Template):
    name = "softmax"
    dims = ("M", "N")
    kernel_sources = (_softmax_kernel, launch_softmax)
    presets = {
        # LLM activations: square, wide (16k tokens x 8k hidden) and tall (32k tokens x 1k)
        "llm": [
            {"M": 4096, "N": 4096},
            {"M": 16384, "N": 8192},
            {"M": 32768, "N": 1024},
        ],
        # small and odd on purpose: runs in the CPU interpreter in seconds
        "tiny": [
            {"M": 37, "N": 45},
            {"M": 5, "N": 300},
        ],
    }

    def key(self, problem: Problem) -> ShapeKey:
        # M (tokens) varies at run time and shares configs by power-of-two bucket; N is a model dim
        return ShapeKey.make({"M": pow2_bucket(problem["M"]), "N": problem["N"]}, {"dtype": problem["dtype"]})

    def make_inputs(self, problem: Problem, device: Device) -> torch.Tensor:
        where = "cuda" if device.is_gpu else "cpu"
        # scaled so rows have a real spread of probabilities, not a near-uniform one
        return 3.0 * torch.randn(problem["M"], problem["N"], device=where, dtype=getattr(torch, problem["dtype"]))

    def launch(self, inputs: torch.Tensor, config: Config) -> torch.Tensor:
        return launch_softmax(inputs, config)

    def reference(self, inputs: torch.Tensor) -> torch.Tensor:
        return torch.softmax(inputs.double(), dim=-1)

    peer_name = "torch.softmax"

    def peer(self, inputs: torch.Tensor) -> Callable[[], torch.Tensor]:
        return lambda: torch.softmax(inputs, dim=-1)

    def heuristic(self, problem: Problem, device: Device) -> Config:
        n = pow2_bucket(problem["N"])
        if n <= 8192:
            # one pass; a few rows per program when rows are short, so each moves >= 8 KB
            block_n = max(16, n)
            block_m = max(1, min(16, 4096 // block_n, pow2_bucket(problem["M"])))
            warps = 4 if block_m * block_n <= 2048 else 8 if block_m * block_n <= 4096 else 16
            config: Config = {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": warps, "num_stages": 1}
        else:
            config = {"BLOCK_M": 1, "BLOCK_N": 4096, "num_warps": 8, "num_stages": 2}
        if self.violations(config, problem, device):
            config = self.feasible(problem, device)[0]
        return config

    def cost(self, problem: Problem) -> Cost:
        m, n = problem["M"], problem["N"]
        size = getattr(torch, problem["dtype"]).itemsize
        return Cost(flops=4.0 * m * n, bytes=float(2 * m * n * size))


TEMPLATE = SoftmaxTemplate()


class SoftmaxBwdTemplate(SoftmaxTemplate):
    """The backward: its own kernel, space and tuned configs, on the forward's shapes and key."""

    # inherits the forward's shapes, key and heuristic, not its inputs: the ignores below mark
    # the overrides that take the backward's inputs (mypy reads them as Liskov violations)
    name = "softmax_bwd"
    kernel_sources = (_softmax_bwd_kernel, launch_softmax_bwd)  # type: ignore[assignment]

    def make_inputs(self, problem: Problem, device: Device) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        x = super().make_inputs(problem, device)
        return torch.softmax(x.float(), dim=-1).to(x.dtype), torch.randn_like(x)

    def launch(self, inputs: tuple[torch.Tensor, torch.Tensor], config: Config) -> torch.Tensor:  # type: ignore[override]
        return launch_softmax_bwd(*inputs, config)

    def reference(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:  # type: ignore[override]
        y, dy = (t.double() for t in inputs)
        return y * (dy - (y * dy).sum(dim=-1, keepdim=True))

    peer_name = "torch softmax backward (aten._softmax_backward_data)"

    def peer(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> Callable[[], torch.Tensor]:  # type: ignore[override]
        # the op autograd runs for softmax's backward, called directly: no graph to keep alive
        y, dy = inputs
        return lambda: torch.ops.aten._softmax_backward_data(dy, y, -1, y.dtype)

    def cost(self, problem: Problem) -> Cost:
        m, n = problem["M"], problem["N"]
        size = getattr(torch, problem["dtype"]).itemsize
        return Cost(flops=4.0 * m * n, bytes=float(3 * m * n * size))


BWD_TEMPLATE = SoftmaxBwdTemplate()


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
