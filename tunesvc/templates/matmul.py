"""The GEMM template: shapes, keys, heuristics, costs.

What tuning and lookups need to know about the kernel, without importing torch or Triton:
the kernels themselves and their launches are in :mod:`tunesvc.kernels.matmul`, which the methods
that make inputs, launch and check import when first called.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from tunesvc.template import ELEMENT_BYTES
from tunesvc.template import Cost
from tunesvc.template import Problem
from tunesvc.template import ShapeKey
from tunesvc.template import cdiv
from tunesvc.template import pow2_bucket
from tunesvc.templates._shipped import ShippedTemplate

if TYPE_CHECKING:
    import torch

    from tunesvc.device import Device
    from tunesvc.space import Config


def tail_split(tiles: int, k_steps: int, block_k: int, sms: int) -> tuple[int, int]:
    """(whole tiles, slices) of the splittail variant: the tiles run whole, one per program,
    except the partial last wave's, or the last full wave's and the partial one's, which run
    as ``slices`` slices of K each (2 to 8, at most 3 per SM in all). It picks whichever ends
    first, where that is at least 3% sooner than the whole tiles alone, counting each slice's
    float32 tile, written and read back, as 1600 / BLOCK_K K steps more (fitted to an H100's
    times of five shapes of 16 to 432 K steps of 64: partial waves cut into slices of 14 to 144
    steps ran 4-7% faster, except where they saved a quarter of a wave, 10% slower; slices of
    5 steps ran 2.3x slower)."""
    waves = math.ceil(tiles / sms)
    extra = 1600 / block_k
    best = (0.97 * waves * k_steps, tiles, 1)
    for whole in ((waves - 1) * sms, max(waves - 2, 0) * sms):
        rest = tiles - whole
        for slices in range(2, 9):
            if rest * slices > 3 * sms:
                break
            span = whole // sms * k_steps + math.ceil(rest * slices / sms) * (math.ceil(k_steps / slices) + extra)
            if span < best[0]:
                best = (span, whole, slices)
    return best[1], best[2]


def matmul_config(
    variant: str,
    m: int,
    n: int,
    k: int,
    group: int,
    split: int,
    warps: int,
    stages: int,
    loop: tuple[int, int] = (0, 0),
) -> Config:
    """A full config; ``loop``: the TMA kernel's (FLATTEN, SUBTILE), 0 for the others."""
    return {
        "VARIANT": variant,
        "BLOCK_M": m,
        "BLOCK_N": n,
        "BLOCK_K": k,
        "GROUP_M": group,
        "SPLIT_K": split,
        "FLATTEN": loop[0],
        "SUBTILE": loop[1],
        "num_warps": warps,
        "num_stages": stages,
    }


#: (N, K) of the projections (fused QKV, output, fused gate/up, down) of models other than
#: those of benchmarks/heldout.py, for the "models" preset; each is tuned at two token counts
_MODEL_WEIGHTS = (
    *((8192, 3584), (3584, 4096), (28672, 3584), (3584, 14336)),  # Gemma-2-9B
    *((9216, 3072), (3072, 3072), (16384, 3072), (3072, 8192)),  # Phi-3-mini
    *((6144, 5120), (5120, 4096), (28672, 5120), (5120, 14336)),  # Mistral-Nemo-12B
    *((8192, 4608), (4608, 4096)),  # Gemma-2-27B's attention
    (5120, 3072),  # Llama-3.2-3B's fused QKV
    (8192, 29568),  # Qwen2.5-72B's down projection
)
#: token counts from decode to prefill, in an order that gives neighbouring weights different ones
_MODEL_TOKENS = (1, 32, 256, 1024, 4096, 64, 512, 8192)


class MatmulTemplate(ShippedTemplate):
    name = "matmul"
    dims = ("M", "N", "K")
    kernel_module = "matmul"
    kernel_sources = (
        "_tile_coords",
        "_tile_dot",
        "_store_tile",
        "_dot_step",
        "_matmul_kernel",
        "_matmul_persistent_kernel",
        "_tma_tile",
        "_matmul_tma_kernel",
        "_matmul_splitk_kernel",
        "_matmul_splittail_kernel",
        "tail_split",
        "_tma_ready",
        "_aligned_copy",
        "_loadable",
        "_padded_copy",
        "_pointer_operands",
        "_arrivals",
        "launch_matmul",
    )
    presets = {
        # LLM GEMMs: square, decode-sized M, an MLP projection, a long-K down projection, unaligned K
        "llm": [
            {"M": 4096, "N": 4096, "K": 4096},
            {"M": 8192, "N": 8192, "K": 8192},
            {"M": 16, "N": 4096, "K": 4096},
            {"M": 128, "N": 14336, "K": 4096},
            {"M": 2048, "N": 4096, "K": 14336},
            {"M": 1000, "N": 3000, "K": 777},
        ],
        # decode-sized M against LLM weight shapes, where split-K matters
        "skinny": [{"M": m, "N": n, "K": k} for m in (1, 16, 64) for n, k in ((4096, 4096), (14336, 4096))],
        # the projections of more models (fused QKV, output, fused gate/up, down), each at two
        # token counts from decode to prefill: what the selector learns from, so that a model
        # nobody tuned gets a config fitted across weight shapes as well as token counts
        "models": [
            {"M": m, "N": n, "K": k}
            for i, (n, k) in enumerate(_MODEL_WEIGHTS)
            for m in (_MODEL_TOKENS[i % 8], _MODEL_TOKENS[(i + 4) % 8])
        ],
        # small and odd on purpose: runs in the CPU interpreter in seconds
        "tiny": [
            {"M": 37, "N": 45, "K": 29},
            {"M": 100, "N": 70, "K": 50},
        ],
    }

    # First the other variants' likely winners, so a short sweep measures each variant: Triton
    # tutorial 09's best H100 tiles for the persistent and TMA kernels (the TMA ones with the
    # loop flattened: on an H200 that was 1.06x the plain loop's speed, geometric mean of 66
    # configs, 0.95x-1.65x), split-K tiles for
    # M <= 64 (2-8 slices) and single-tile-row ones for M <= 64 (the H100 sweep's 16x4096x4096
    # winner among them); then tutorial 03's CUDA autotune list for the grouped kernel, less its
    # two num_warps=2 entries, which lie outside this space.
    known_good = (
        # the H200 survey's (benchmarks/data/gemm_variants.csv) fastest flattened TMA tiles
        matmul_config("tma", 128, 128, 64, 8, 1, 4, 4, (1, 0)),
        matmul_config("tma", 128, 256, 64, 8, 1, 8, 3, (1, 1)),
        matmul_config("tma", 128, 128, 64, 8, 1, 8, 4, (1, 0)),
        matmul_config("tma", 128, 128, 128, 8, 1, 8, 3, (1, 0)),
        matmul_config("splittail", 128, 256, 64, 8, 1, 8, 3),
        matmul_config("splittail", 128, 128, 64, 8, 1, 8, 4),
        matmul_config("persistent", 128, 256, 64, 8, 1, 8, 3),
        matmul_config("persistent", 128, 128, 64, 8, 1, 8, 4),
        matmul_config("splitk", 16, 64, 128, 1, 4, 4, 4),
        matmul_config("splitk", 16, 128, 128, 1, 2, 4, 4),
        matmul_config("splitk", 32, 64, 128, 1, 4, 4, 4),
        matmul_config("splitk", 64, 64, 128, 1, 2, 4, 4),
        matmul_config("tma", 64, 128, 64, 1, 1, 4, 4, (1, 0)),
        matmul_config("tma", 16, 128, 128, 1, 1, 4, 4),
        matmul_config("grouped", 64, 128, 64, 1, 1, 4, 4),
        matmul_config("grouped", 16, 64, 128, 1, 1, 4, 5),
        *(
            matmul_config("grouped", m, n, k, 8, 1, w, s)
            for m, n, k, s, w in (
                (128, 256, 64, 3, 8),
                (64, 256, 32, 4, 4),
                (128, 128, 32, 4, 4),
                (128, 64, 32, 4, 4),
                (64, 128, 32, 4, 4),
                (128, 32, 32, 4, 4),
                (128, 256, 128, 3, 8),
                (256, 128, 128, 3, 8),
                (256, 64, 128, 4, 4),
                (64, 256, 128, 4, 4),
                (128, 128, 128, 4, 4),
                (128, 64, 64, 4, 4),
                (64, 128, 64, 4, 4),
                (128, 32, 64, 4, 4),
            )
        ),
    )

    def key(self, problem: Problem) -> ShapeKey:
        # M (tokens, batch) varies at run time and shares configs by power-of-two bucket;
        # N and K come from weights and are kept exact.
        return ShapeKey.make(
            {"M": pow2_bucket(problem["M"]), "N": problem["N"], "K": problem["K"]},
            {"dtype": problem["dtype"]},
        )

    def make_inputs(self, problem: Problem, device: Device) -> tuple[torch.Tensor, torch.Tensor]:
        import torch  # heavy: imported where tensors are made or compared

        dtype = getattr(torch, problem["dtype"])
        where = "cuda" if device.is_gpu else "cpu"
        a = torch.randn(problem["M"], problem["K"], device=where, dtype=dtype)
        b = torch.randn(problem["K"], problem["N"], device=where, dtype=dtype)
        return a, b

    def launch(self, inputs: tuple[torch.Tensor, torch.Tensor], config: Config) -> torch.Tensor:
        return self.kernels.launch_matmul(*inputs, config)

    def reference(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        a, b = inputs
        return a.float() @ b.float()

    peer_name = "cuBLAS (torch.matmul)"

    def peer(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> Callable[[], torch.Tensor]:
        import torch  # heavy: imported where tensors are made or compared

        a, b = inputs
        return lambda: torch.matmul(a, b)

    def heuristic(self, problem: Problem, device: Device) -> Config:
        m, n, k = problem["M"], problem["N"], problem["K"]
        if m <= 64:
            block_m = max(16, pow2_bucket(m))  # no tile taller than the problem
            block_k = 128 if m <= 16 else 64
            config = matmul_config("grouped", block_m, 64, block_k, 8, 1, 4, 4)
            # split K until the tiles fill the SMs, keeping at least two K steps per slice
            tiles = cdiv(m, block_m) * cdiv(n, 64)
            split = 1
            while split < 8 and tiles * split < device.sm_count and k >= 2 * (2 * split) * block_k:
                split *= 2
            if split > 1:
                config.update(VARIANT="splitk", SPLIT_K=split, GROUP_M=1)
        else:
            config = matmul_config("grouped", 128, 128, 64, 8, 1, 8, 3)
        if cdiv(m, int(config["BLOCK_M"])) == 1:
            config["GROUP_M"] = 1  # a single tile-row has nothing to group
        if self.violations(config, problem, device):
            # small problems: the smallest feasible tiles
            config = self.feasible(problem, device)[0]
        return config

    def cost(self, problem: Problem) -> Cost:
        m, n, k = problem["M"], problem["N"], problem["K"]
        size = ELEMENT_BYTES[problem["dtype"]]
        return Cost(flops=2.0 * m * n * k, bytes=float((m * k + k * n + m * n) * size))

    def wave_fill(self, config: Config, problem: Problem, device: Device) -> float:
        # one program per output tile and K slice, one resident per SM: the persistent kernels
        # walk the same tiles in the same waves, one per SM at a time
        tiles = cdiv(problem["M"], int(config["BLOCK_M"])) * cdiv(problem["N"], int(config["BLOCK_N"]))
        programs = tiles * int(config.get("SPLIT_K", 1))
        sms = max(device.sm_count, 1)
        if config.get("VARIANT") == "splittail" and int(config.get("SPLIT_K", 1)) == 1:
            # the tiles' K steps over the SMs' span as tail_split models it (its slices' extra
            # steps counted); whole tiles alone where it does not cut, as the launch does
            block_k = int(config["BLOCK_K"])
            k_steps = cdiv(problem["K"], block_k)
            whole, slices = tail_split(tiles, k_steps, block_k, sms)
            if slices > 1:
                cut = math.ceil((tiles - whole) * slices / sms) * (math.ceil(k_steps / slices) + 1600 / block_k)
                return tiles * k_steps / (sms * (whole // sms * k_steps + cut))
        return programs / (cdiv(programs, sms) * sms)

    def selector_features(self, problem: Problem, device: Device) -> dict[str, float]:
        # whether a tile size fills the SMs decides between large tiles, small ones and split-K:
        # tiles per SM and the last wave's fill at the space's common tile sizes
        features = super().selector_features(problem, device)
        m, n, k = problem["M"], problem["N"], problem["K"]
        sms = max(device.sm_count, 1)
        for bm, bn in ((128, 256), (128, 128), (64, 64), (16, 64)):
            per_sm = cdiv(m, bm) * cdiv(n, bn) / sms
            features[f"log2_tiles_per_sm_{bm}x{bn}"] = math.log2(per_sm)
            features[f"last_wave_{bm}x{bn}"] = per_sm / math.ceil(per_sm) if per_sm >= 1 else per_sm
        features["log2_k_steps_64"] = math.log2(cdiv(k, 64))
        return features


TEMPLATE = MatmulTemplate()
