"""Triton kernel templates shipped with tunesvc, one family per module, importable as
``tunesvc.kernels``. Each module defines its ``@triton.jit`` kernels, a ``TEMPLATE`` and the
user-facing function that launches with the tuned config (e.g. ``tunesvc.kernels.matmul``).
The families share a few underscore helpers among themselves (``matmul._use_torch_allocator``),
never outside this package.

Under any other name this package is empty: with the source folder on ``sys.path``
(``PYTHONPATH=$PWD``) it is importable as a top-level ``kernels``, the name of an unrelated
package that other libraries probe for (transformers' hub kernels). There it imports nothing
(no torch, no Triton, no second copy of the templates) and offers nothing, so a probe finds a
package without a version or any of that package's names, which transformers counts as absent.
"""

from __future__ import annotations

if __name__ == "tunesvc.kernels":
    # Importing tunesvc (the parent package) has already chosen Triton's CPU interpreter where
    # there is no GPU: see tunesvc.device.use_interpreter_without_gpu.
    from tunesvc.kernels.attention import attention
    from tunesvc.kernels.decode import decode_attention
    from tunesvc.kernels.dropout import dropout
    from tunesvc.kernels.layernorm import layer_norm
    from tunesvc.kernels.matmul import matmul
    from tunesvc.kernels.pointwise import bias_act_residual
    from tunesvc.kernels.rmsnorm import rms_norm
    from tunesvc.kernels.softmax import softmax

    __all__ = [
        "attention",
        "bias_act_residual",
        "decode_attention",
        "dropout",
        "layer_norm",
        "matmul",
        "rms_norm",
        "softmax",
    ]
