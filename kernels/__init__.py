"""Triton kernel templates shipped with tunesvc, one family per module, importable as
``tunesvc.kernels``. Each module defines its ``@triton.jit`` kernels, a ``TEMPLATE`` and the
user-facing function that launches with the tuned config (e.g. ``tunesvc.kernels.matmul``).
"""

from __future__ import annotations

import os

import torch

# Without a GPU the kernels run in Triton's interpreter; the flag must be set before any
# @triton.jit decorator runs, which is why it lives here, ahead of the kernel modules.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tunesvc.kernels.matmul import matmul  # noqa: E402

__all__ = ["matmul"]
