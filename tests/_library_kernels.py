"""triton.autotune kernels of real libraries (fla-core, liger-kernel, torchao), launched unmodified.

Each case calls a library's own launch function (or launches its jitted kernel exactly as the
library does) on small random tensors of odd sizes (CPU, or the GPU when there is one), and returns the output beside a float64
torch reference. Run as a script (``python tests/_library_kernels.py CASE ...``) it prints one
JSON line per case: the kernel's stored name, the config its launch used (``best_config``, as
library code reads it) and the output's relative error. It imports no tunesvc: in a process
started with ``TUNESVC_CAPTURE=1`` only the interpreter-start hook can route these kernels.
"""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Callable
from typing import Any

import torch

#: where the cases run: the GPU when there is one (test_gpu_capture), else Triton's interpreter
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.to(out.device).double()  # some references are computed on the CPU
    return ((out.double() - ref).norm() / ref.norm()).item()


def fla_softmax(dtype: torch.dtype = torch.float32) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """fla's row softmax (six num_warps configs, key D, keyword launch)."""
    from fla.ops.utils.softmax import softmax_fwd
    from fla.ops.utils.softmax import softmax_fwd_kernel

    x = torch.randn(7, 45, dtype=dtype, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    return softmax_fwd_kernel, softmax_fwd(x, dtype=dtype), torch.softmax(x.double(), -1)


def fla_logsumexp() -> tuple[Any, torch.Tensor, torch.Tensor]:
    """fla's logsumexp (@triton.heuristics above the autotuner, a scale that may be None)."""
    from fla.ops.utils.logsumexp import logsumexp_fwd
    from fla.ops.utils.logsumexp import logsumexp_fwd_kernel

    x = torch.randn(5, 83, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    out = logsumexp_fwd(x, scale=0.5)
    return logsumexp_fwd_kernel, out.squeeze(-1), torch.logsumexp(0.5 * x.double(), -1)


def fla_cumsum_reverse() -> tuple[Any, torch.Tensor, torch.Tensor]:
    """fla's chunked global cumsum (48 configs; keys B, H, a bool REVERSE and IS_VARLEN, which a
    heuristic above the autotuner sets)."""
    from fla.ops.utils.cumsum import chunk_global_cumsum
    from fla.ops.utils.cumsum import chunk_global_cumsum_scalar_kernel

    s = torch.randn(1, 37, 1, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    out = chunk_global_cumsum(s, reverse=True)
    return chunk_global_cumsum_scalar_kernel, out, s.double().flip(1).cumsum(1).flip(1)


def fla_conv_update() -> tuple[Any, torch.Tensor, torch.Tensor]:
    """fla's causal-conv1d decode step: rolls its cache in place (restore_value=['cache']) and
    runs on fla's own Autotuner subclass, whose run() overrides Triton's (24 configs)."""
    from fla.modules.causal_conv1d.ops import causal_conv1d_update
    from fla.modules.causal_conv1d.ops import causal_conv1d_update_kernel

    gen = torch.Generator().manual_seed(5)
    N, D, W = 3, 45, 4
    x, cache = torch.randn(N, D, generator=gen), torch.randn(N, D, W, generator=gen)
    weight, bias = torch.randn(D, W, generator=gen), torch.randn(D, generator=gen)
    rolled = torch.cat([cache[..., 1:], x[..., None]], -1).double()
    expected = (rolled * weight.double()).sum(-1) + bias.double()
    x, cache, weight, bias = (t.to(DEVICE) for t in (x, cache, weight, bias))
    y, cache = causal_conv1d_update(x, cache, weight=weight, bias=bias)
    return (
        causal_conv1d_update_kernel,
        torch.cat([y.flatten(), cache.flatten()]),
        torch.cat([expected.flatten(), rolled.flatten()]),
    )


def _gather_inputs(T: int, K: int, H: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(4)
    Y = torch.randn(T * K, H, generator=gen)
    weights = torch.rand(T * K, generator=gen)
    reverse_scatter = torch.randperm(T * K, generator=gen).to(torch.int32)
    return Y.to(DEVICE), weights.to(DEVICE), reverse_scatter.to(DEVICE)


def _gather_reference(Y, weights, reverse_scatter, T, K) -> torch.Tensor:
    rows = Y.double()[reverse_scatter.long()].view(T, K, -1)
    return (rows * (1 if weights is None else weights.double().view(T, K, 1))).sum(1)


def liger_gather() -> tuple[Any, torch.Tensor, torch.Tensor]:
    """liger's MoE token gather-sum (40 configs; keys H_dim, K_dim and the bool w_is_None), by
    liger's own ``_token_aggregation``."""
    from liger_kernel.ops.fused_moe import _token_aggregation
    from liger_kernel.ops.fused_moe_kernels import _token_gather_weighted_sum_kernel

    T, K, H = 3, 2, 37
    Y, weights, reverse_scatter = _gather_inputs(T, K, H)
    out = _token_aggregation(Y, weights, reverse_scatter, T, K, H)
    return _token_gather_weighted_sum_kernel, out, _gather_reference(Y, weights, reverse_scatter, T, K)


def liger_gather_unweighted() -> tuple[Any, torch.Tensor, torch.Tensor]:
    """The same kernel as liger's backward launches it: no weights (w_ptr None, w_is_None True)."""
    from liger_kernel.ops.fused_moe_kernels import _token_gather_weighted_sum_kernel

    T, K, H = 3, 2, 37
    Y, _, reverse_scatter = _gather_inputs(T, K, H)
    out = torch.empty(T, H, device=DEVICE)
    _token_gather_weighted_sum_kernel[(T,)](
        Y,
        None,
        reverse_scatter,
        out,
        H_dim=H,
        K_dim=K,
        stride_Y_TK=Y.stride(0),
        stride_Y_H=Y.stride(1),
        stride_out_T=out.stride(0),
        stride_out_H=out.stride(1),
        w_is_None=True,
    )
    return _token_gather_weighted_sum_kernel, out, _gather_reference(Y, None, reverse_scatter, T, K)


def torchao_int8_mm() -> tuple[Any, torch.Tensor, torch.Tensor]:
    """torchao's scaled int8 GEMM (27 configs, two of them listed twice; keys M, N, K and two
    strides; @triton.heuristics below the autotuner; a column-major B), by the function torchao
    registers as the op's CUDA kernel."""
    from torchao.prototype.quantized_training.int8_mm import _scaled_int8_mm_kernel
    from torchao.prototype.quantized_training.int8_mm import scaled_int8_mm_cuda

    gen = torch.Generator().manual_seed(6)
    M, K, N = 37, 70, 45
    A = torch.randint(-128, 128, (M, K), dtype=torch.int8, generator=gen)
    B = torch.randint(-128, 128, (N, K), dtype=torch.int8, generator=gen)
    row, col = torch.rand(M, generator=gen) + 0.5, torch.rand(N, generator=gen) + 0.5
    ref = (A.double() @ B.double().T) * row.double()[:, None] * col.double()[None, :]
    A, B, row, col = (t.to(DEVICE) for t in (A, B, row, col))
    return _scaled_int8_mm_kernel, scaled_int8_mm_cuda(A, B.T, row, col), ref


CASES: dict[str, Callable[[], tuple[Any, torch.Tensor, torch.Tensor]]] = {
    "fla_softmax": fla_softmax,
    "fla_softmax_f64": lambda: fla_softmax(torch.float64),
    "fla_logsumexp": fla_logsumexp,
    "fla_cumsum_reverse": fla_cumsum_reverse,
    "fla_conv_update": fla_conv_update,
    "liger_gather": liger_gather,
    "liger_gather_unweighted": liger_gather_unweighted,
    "torchao_int8_mm": torchao_int8_mm,
}

#: distinct configs each case's kernel lists (all survive pruning: none of these kernels prunes)
CONFIGS = {
    "fla_softmax": 6,
    "fla_softmax_f64": 6,
    "fla_logsumexp": 6,
    "fla_cumsum_reverse": 48,
    "fla_conv_update": 24,
    "liger_gather": 40,
    "liger_gather_unweighted": 40,
    "torchao_int8_mm": 25,
}


def stored_name(kernel: Any) -> str:
    """``module:qualname`` of the kernel's Python function (found by walking ``.fn``)."""
    while not inspect.isfunction(kernel):
        kernel = kernel.fn
    return f"{kernel.__module__}:{kernel.__qualname__}"


def launched_config(kernel: Any) -> dict[str, Any]:
    while not hasattr(kernel, "best_config"):
        kernel = kernel.fn
    config = kernel.best_config
    return {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}


def run(name: str) -> dict[str, Any]:
    kernel, out, ref = CASES[name]()
    return {
        "case": name,
        "kernel": stored_name(kernel),
        "config": launched_config(kernel),
        "rel_error": _rel(out, ref),
    }


if __name__ == "__main__":
    for case in sys.argv[1:]:
        print(json.dumps(run(case)), flush=True)
