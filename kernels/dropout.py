"""Seeded dropout: y = x / (1 - p) where u >= p, else 0, with u ~ U[0, 1) drawn by Philox.

The uniform number of element i is a pure function of (seed, i): no mask tensor is stored, the
same seed gives the same output on any config, and the backward regenerates the forward's mask
from the seed (Triton tutorial 04, "Low-memory dropout"). One Philox-4x32 call yields four
numbers (tl.rand4x), so element i takes output i % 4 of the call whose counter is i // 4: a
quarter of the integer work of one tl.rand call per element (Philox's rounds are the kernel's
only real arithmetic).
Offsets are int32 below 2^31 elements and int64 above; the two give different streams.

Minimum bytes = 2 * numel * element size (x read once, y written once).
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
from tunesvc.serving.runtime import default_runtime
from tunesvc.space import LAUNCH_OPTIONS
from tunesvc.space import Config

# the template (torch-free, in tunesvc.templates) and its names, importable from here as before
from tunesvc.templates.dropout import SWEEP_P as SWEEP_P
from tunesvc.templates.dropout import TEMPLATE as TEMPLATE
from tunesvc.templates.dropout import DropoutTemplate as DropoutTemplate

#: the drop probability that sweeps measure with; speed does not depend on it
#: largest block the space offers: offsets switch to int64 before a block could overflow int32
_MAX_BLOCK = 1 << 16


@triton.jit
def _uniform(seed, start, BLOCK: tl.constexpr):
    """U[0, 1) for elements start .. start + BLOCK - 1 (start a multiple of 4), as a 1-D block."""
    counters = start // 4 + tl.arange(0, BLOCK // 4)
    r0, r1, r2, r3 = tl.rand4x(seed, counters)
    # element 4 j + l takes output l of call j: interleaving twice lays them out in that order
    return tl.interleave(tl.interleave(r0, r2), tl.interleave(r1, r3))


@triton.jit
def _uniform_lanes(seed, start, BLOCK: tl.constexpr):
    """The same numbers as _uniform, as a [BLOCK // 4, 4] tile: row j holds call j's four outputs."""
    counters = start // 4 + tl.arange(0, BLOCK // 4)
    r0, r1, r2, r3 = tl.rand4x(seed, counters)
    lane = tl.arange(0, 4)[None, :]
    u23 = tl.where(lane == 2, r2[:, None], r3[:, None])
    return tl.where(lane == 0, r0[:, None], tl.where(lane == 1, r1[:, None], u23))


@triton.jit
def _dropout_kernel(
    x_ptr, y_ptr,
    n_elements, seed, p, scale,
    BLOCK: tl.constexpr, LANES_2D: tl.constexpr, INT64_OFFSETS: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(axis=0)
    if INT64_OFFSETS:
        start = pid.to(tl.int64) * BLOCK
    else:
        start = pid * BLOCK
    # two layouts of one stream, a tunable choice: a 1-D block (long vector loads, the numbers
    # shuffled into place by interleave) or a [BLOCK // 4, 4] tile (each thread's numbers already
    # where they belong, loads of 4 elements)
    if LANES_2D:
        offs = start + (4 * tl.arange(0, BLOCK // 4))[:, None] + tl.arange(0, 4)[None, :]
        u = _uniform_lanes(seed, start, BLOCK)
    else:
        offs = start + tl.arange(0, BLOCK)
        u = _uniform(seed, start, BLOCK)
    mask = offs < n_elements
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    keep = u >= p
    y = tl.where(keep, x.to(tl.float32) * scale, 0.0)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _keep_mask_kernel(keep_ptr, n_elements, seed, p, BLOCK: tl.constexpr, INT64_OFFSETS: tl.constexpr):
    """The keep mask as int8, for the reference: one fixed config, independent of any tuned one."""
    pid = tl.program_id(axis=0)
    if INT64_OFFSETS:
        start = pid.to(tl.int64) * BLOCK
    else:
        start = pid * BLOCK
    offs = start + tl.arange(0, BLOCK)
    keep = _uniform(seed, start, BLOCK) >= p
    tl.store(keep_ptr + offs, keep.to(tl.int8), mask=offs < n_elements)


# a hit launches the compiled kernel directly (tunesvc.serving.launch); the templates hash the same sources
_dropout_kernel = direct_launch(_dropout_kernel)
_keep_mask_kernel = direct_launch(_keep_mask_kernel)


def _int64_offsets(n_elements: int) -> bool:
    return n_elements + _MAX_BLOCK > 2**31 - 1


def launch_dropout(
    x: torch.Tensor, p: float, seed: int, config: Config, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Dropout of the contiguous x with one explicit config (no lookup); element i's mask is that of offset i."""
    n = x.numel()
    y = torch.empty_like(x) if out is None else out
    meta = {k: v for k, v in config.items() if k not in LAUNCH_OPTIONS}
    options = {k: v for k, v in config.items() if k in LAUNCH_OPTIONS}
    grid = (triton.cdiv(n, meta["BLOCK"]),)
    _dropout_kernel[grid](x, y, n, seed, p, 1.0 / (1.0 - p), **meta, INT64_OFFSETS=_int64_offsets(n), **options)
    return y


def keep_mask(numel: int, p: float, seed: int, device: torch.device | str) -> torch.Tensor:
    """The boolean mask (True = kept) that dropout(x, p, seed) applies to a tensor of numel elements."""
    keep = torch.empty(numel, device=device, dtype=torch.int8)
    block = 1024
    grid = (triton.cdiv(numel, block),)
    _keep_mask_kernel[grid](keep, numel, seed, p, BLOCK=block, INT64_OFFSETS=_int64_offsets(numel))
    return keep.bool()


def _dropout(x: torch.Tensor, p: float, seed: int, config: str) -> torch.Tensor:
    """The op tunesvc::dropout on a contiguous x: the tuned config (config "") or the given one."""
    explicit = config_of(config)
    if explicit is None:
        runtime = default_runtime()
        key = (TEMPLATE, x.numel(), x.dtype, index := x.get_device())
        explicit = runtime.launch_configs.get(key) or runtime.tuned(
            key, index, TEMPLATE, numel=x.numel(), dtype=x.dtype
        )
    return launch_dropout(x, p, seed, explicit)


def _dropout_setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    _, ctx.p, ctx.seed, ctx.config = inputs


def _dropout_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
    # d(x * keep / (1 - p)) / dx = keep / (1 - p): dropout of the gradient with the same seed
    dx = _dropout_op.call(grad.contiguous(), ctx.p, ctx.seed, ctx.config)
    return dx.view(grad.shape), None, None, None


_dropout_op = kernel_op("dropout", _dropout, lambda x, p, seed, config: torch.empty_like(x), replay=False)
_dropout_op.register_autograd(_dropout_backward, _dropout_setup)


def dropout(x: torch.Tensor, p: float, seed: int, *, config: Config | None = None) -> torch.Tensor:
    """Zero each element of x with probability p and scale the rest by 1 / (1 - p), with autograd.

    The mask is a function of (seed, element index in x's logical row-major order) only: the
    same seed and shape give the same mask, and nothing is stored for the backward. x is
    float16, bfloat16 or float32; 0 <= p < 1; seed is an integer in [0, 2^63).
    """
    if x.numel() == 0:
        raise ValueError("dropout needs a non-empty tensor")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"dropout needs a float16, bfloat16 or float32 tensor; got {x.dtype}")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout needs 0 <= p < 1; got p={p}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ValueError(f"dropout needs an integer seed in [0, 2^63); got {seed!r}")
    y = _dropout_op.call(x.contiguous(), float(p), seed, config_arg(config), grad_inputs=(x,))
    return y.view(x.shape)
