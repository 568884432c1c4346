"""Triton kernel templates shipped with tunesvc, one family per module, importable as
``tunesvc.kernels``. Each module defines its ``@triton.jit`` kernels, a ``TEMPLATE`` and the
user-facing function that launches with the tuned config (e.g. ``tunesvc.kernels.matmul``).
"""

from __future__ import annotations

# Importing tunesvc (the parent package) has already chosen Triton's CPU interpreter where
# there is no GPU: see tunesvc.device.use_interpreter_without_gpu.
from tunesvc.kernels.matmul import matmul

__all__ = ["matmul"]
