"""Shipped kernels as torch custom ops, so ``torch.compile`` calls them without a graph break.

Dynamo cannot trace a Triton launch behind a Python dict lookup; a ``torch.library`` custom op
is opaque to it: the op's fake implementation gives output shapes while tracing, and the real
one (lookup + launch) runs when the compiled graph runs. In eager mode the op's dispatcher
would only add host time per call, so a kernel's entry calls the Python function directly there
and goes through the op only while torch.compile traces (``torch.compiler.is_compiling()``).

A kernel family uses it like this (see ``tunesvc.kernels.matmul``)::

    def _layernorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        ...  # validate, look up the tuned config, launch

    def _layernorm_fake(x, w, eps):
        return torch.empty_like(x)

    layernorm_op = kernel_op("layernorm", _layernorm, _layernorm_fake)
    # a backward, if any: layernorm_op.op.register_autograd(backward, setup_context=...)

    def layernorm(x, w, eps=1e-5):
        if torch.compiler.is_compiling():
            return layernorm_op.op(x, w, eps)
        return _layernorm(x, w, eps)

The op's arguments must be types torch.library accepts (tensors, ints, floats, bools, strings,
optionals and lists of them): keep configs and other dicts out of its signature. A hit of the
tuned-config lookup does no host synchronisation, so the op may be captured in a CUDA graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class KernelOp:
    """``fn`` registered as the custom op ``tunesvc::<name>`` (``.op``); ``.fn`` is the eager path."""

    def __init__(
        self, name: str, fn: Callable[..., Any], fake: Callable[..., Any], mutates_args: tuple[str, ...] = ()
    ) -> None:
        self.name = name
        self.fn = fn
        self.op = torch.library.custom_op(f"tunesvc::{name}", fn, mutates_args=mutates_args)
        self.op.register_fake(fake)


def kernel_op(
    name: str, fn: Callable[..., Any], fake: Callable[..., Any], mutates_args: tuple[str, ...] = ()
) -> KernelOp:
    """Register ``fn`` (type-annotated) as ``tunesvc::<name>`` with ``fake`` as its shape function."""
    return KernelOp(name, fn, fake, mutates_args)
