"""GEMM: C = A @ B with grouped ("super-grouped") ordering of output tiles.

Each program computes one BLOCK_M x BLOCK_N tile of C, walking K in BLOCK_K steps with a
float32 accumulator. Programs are numbered so that GROUP_M consecutive tile-rows are swept
column by column: the A and B tiles a group needs stay in L2 instead of being re-read from
device memory (Triton tutorial 03, "L2 cache optimizations"). Masks make any M, N, K valid.

FLOPs = 2 M N K; minimum bytes = (M K + K N + M N) * element size.
"""

from __future__ import annotations



import torch
import triton
import triton.language as tl

from tunesvc.device import Device
from tunesvc.device import interpreting
from tunesvc.space import LAUNCH_OPTIONS
from tunesvc.space import Config
from tunesvc.template import Cost
from tunesvc.template import Problem
from tunesvc.template import ShapeKey
from tunesvc.template import Template
from tunesvc.template import pow2_bucket


@triton.jit
def _matmul_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N, K,
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
):
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    # Rows/columns past the edge wrap (modulo) so loads stay in bounds without a mask on M/N;
    # the store below is masked, so the wrapped values are never written.
    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_remaining = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_remaining, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_remaining, other=0.0)
        if DOT_IN_FP32:
            # Triton's CPU interpreter computes bf16 dots wrongly (seen with Triton 3.9);
            # only the interpreter sets this flag.
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    c = acc.to(c_ptr.dtype.element_ty)
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, c, mask=mask)


def launch_matmul(a: torch.Tensor, b: torch.Tensor, config: Config, out: torch.Tensor | None = None) -> torch.Tensor:
    """Run the kernel with one explicit config (no lookup)."""
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype) if out is None else out
    meta = {k: v for k, v in config.items() if k not in LAUNCH_OPTIONS}
    options = {k: v for k, v in config.items() if k in LAUNCH_OPTIONS}
    grid = (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)
    _matmul_kernel[grid](
        a, b, c, M, N, K,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        **meta,
        DOT_IN_FP32=interpreting() and a.dtype == torch.bfloat16,
        **options,
    )
    return c


class MatmulTemplate(Template):
    name = "matmul"
    dims = ("M", "N", "K")
    kernel_sources = (_matmul_kernel, launch_matmul)
    presets = {
        # the foundation issue's H100 problem set
        "llm": [
            {"M": 4096, "N": 4096, "K": 4096},
            {"M": 8192, "N": 8192, "K": 8192},
            {"M": 16, "N": 4096, "K": 4096},
            {"M": 128, "N": 14336, "K": 4096},
            {"M": 2048, "N": 4096, "K": 14336},
            {"M": 1000, "N": 3000, "K": 777},
        ],
        # small and odd on purpose: runs in the CPU interpreter in seconds
        "tiny": [
            {"M": 37, "N": 45, "K": 29},
            {"M": 100, "N": 70, "K": 50},
        ],
    }

    # The Triton matmul tutorial's CUDA autotune list (python/tutorials/03-matrix-multiplication.py),
    # less its two num_warps=2 entries, which lie outside this space.
    known_good = tuple(
        {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8, "num_warps": w, "num_stages": s}
        for m, n, k, s, w in (
            (128, 256, 64, 3, 8), (64, 256, 32, 4, 4), (128, 128, 32, 4, 4), (128, 64, 32, 4, 4),
            (64, 128, 32, 4, 4), (128, 32, 32, 4, 4), (128, 256, 128, 3, 8), (256, 128, 128, 3, 8),
            (256, 64, 128, 4, 4), (64, 256, 128, 4, 4), (128, 128, 128, 4, 4), (128, 64, 64, 4, 4),
            (64, 128, 64, 4, 4), (128, 32, 64, 4, 4),
        )
    )

    def key(self, problem: Problem) -> ShapeKey:
        # M (tokens, batch) varies at run time and shares configs by power-of-two bucket;
        # N and K come from weights and are kept exact.
        return ShapeKey.make(
            {"M": pow2_bucket(problem["M"]), "N": problem["N"], "K": problem["K"]},
            {"dtype": problem["dtype"]},
        )

    def make_inputs(self, problem: Problem, device: Device) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = getattr(torch, problem["dtype"])
        where = "cuda" if device.is_gpu else "cpu"
        a = torch.randn(problem["M"], problem["K"], device=where, dtype=dtype)
        b = torch.randn(problem["K"], problem["N"], device=where, dtype=dtype)
        return a, b

    def launch(self, inputs: tuple[torch.Tensor, torch.Tensor], config: Config) -> torch.Tensor:
        return launch_matmul(*inputs, config)

    def reference(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        a, b = inputs
        return a.float() @ b.float()

    def heuristic(self, problem: Problem, device: Device) -> Config:
        m = problem["M"]
        if m <= 16:
            config = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 1, "num_warps": 4, "num_stages": 4}
        elif m <= 64:
            block_m = max(16, pow2_bucket(m))  # 32 or 64: no tile taller than the problem
            config = {"BLOCK_M": block_m, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 4}
        else:
            config = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}
        if triton.cdiv(m, config["BLOCK_M"]) == 1:
            config["GROUP_M"] = 1  # a single tile-row has nothing to group
        if self.violations(config, problem, device):
            # small problems: the smallest feasible tiles
            config = self.feasible(problem, device)[0]
        return config

    def cost(self, problem: Problem) -> Cost:
        m, n, k = problem["M"], problem["N"], problem["K"]
        size = torch.empty((), dtype=getattr(torch, problem["dtype"])).element_size()
        return Cost(flops=2.0 * m * n * k, bytes=float((m * k + k * n + m * n) * size))


TEMPLATE = MatmulTemplate()


def matmul(a: torch.Tensor, b: torch.Tensor, *, config: Config | None = None) -> torch.Tensor:
    """C = A @ B with the tuned config for this device and shape (see :func:`tunesvc.lookup`).

    A is (M, K), B is (K, N), both float16, bfloat16 or float32 on the same device; any strides.
    """
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul needs A (M, K) and B (K, N); got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.dtype != b.dtype:
        raise ValueError(f"matmul needs A and B of one dtype; got {a.dtype} and {b.dtype}")
    if config is None:
        from tunesvc.runtime import default_runtime

        config = default_runtime().config_for(TEMPLATE, M=a.shape[0], N=b.shape[1], K=a.shape[1], dtype=a.dtype)
    return launch_matmul(a, b, config)


