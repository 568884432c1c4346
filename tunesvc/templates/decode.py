"""The decode attention over a (paged) KV cache template: shapes, keys, heuristics, costs.

What tuning and lookups need to know about the kernel, without importing torch or Triton:
the kernels themselves and their launches are in :mod:`tunesvc.kernels.decode`, which the methods
that make inputs, launch and check import when first called.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from tunesvc.errors import TunesvcError
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

    #: q, k_cache, v_cache, seq_lens and block_table (None for a contiguous cache)
    DecodeInputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]


#: tokens per page in the paged inputs the template makes (vLLM's default block size)
PAGE_SIZE = 16

#: (query heads, KV heads, head dim) of models other than those of benchmarks/heldout.py, for
#: the "models" preset: Gemma-2-2B, Gemma-2-9B, Qwen2-1.5B, Qwen2.5-3B, Llama-3.2-3B,
#: Phi-3-medium, Gemma-2-27B, Yi-34B and Llama-3.1-405B
_MODEL_HEADS = (
    (8, 4, 256),
    (16, 8, 256),
    (12, 2, 128),
    (16, 2, 128),
    (24, 8, 128),
    (40, 10, 128),
    (32, 16, 128),
    (56, 8, 128),
    (128, 8, 128),
)
#: (batch, context) pairs from one decoding sequence to a serving batch, at most 2^17 tokens of cache
_MODEL_BATCHES = ((1, 512), (4, 2048), (16, 8192), (2, 32768), (64, 1024), (1, 16384), (8, 4096), (32, 512), (4, 30000))


class DecodeTemplate(ShippedTemplate):
    name = "decode"
    dims = ("B", "HQ", "HKV", "S", "D")
    options = {"paged": (False, True)}
    kernel_module = "decode"
    kernel_sources = ("_decode_split_kernel", "_decode_combine_kernel", "launch_decode")
    presets = {
        # Llama-3-8B attention (32 query / 8 KV heads, D 128): batch 1 to 64, contiguous and paged
        "llama3-8b": [
            {"B": 1, "HQ": 32, "HKV": 8, "S": 2048, "D": 128},
            {"B": 8, "HQ": 32, "HKV": 8, "S": 4096, "D": 128},
            {"B": 64, "HQ": 32, "HKV": 8, "S": 4096, "D": 128},
            {"B": 8, "HQ": 32, "HKV": 8, "S": 4096, "D": 128, "paged": True},
        ],
        # the head layouts of more models, each at four (batch, context) pairs: what the selector
        # learns from, so that a layout nobody tuned gets a config fitted across layouts
        "models": [
            {"B": b, "HQ": hq, "HKV": hkv, "S": s, "D": d}
            for i, (hq, hkv, d) in enumerate(_MODEL_HEADS)
            for b, s in (_MODEL_BATCHES[(i + step) % len(_MODEL_BATCHES)] for step in (0, 2, 4, 6))
        ],
        # small and odd on purpose: runs in the CPU interpreter in seconds
        "tiny": [
            {"B": 3, "HQ": 4, "HKV": 1, "S": 37, "D": 32},
            {"B": 1, "HQ": 2, "HKV": 2, "S": 70, "D": 32, "paged": True},
        ],
    }

    def check(self, problem: Problem) -> None:
        if problem["HQ"] % problem["HKV"]:
            raise TunesvcError(
                f"decode: HQ={problem['HQ']} is not a multiple of HKV={problem['HKV']}; "
                "each KV head serves a whole group of query heads."
            )
        d = problem["D"]
        if d & (d - 1) or not 16 <= d <= 256:
            raise TunesvcError(f"decode: head dim D={d} is not supported; use a power of two from 16 to 256.")

    def key(self, problem: Problem) -> ShapeKey:
        # batch and context length vary at run time and share configs by power-of-two bucket;
        # heads and head dim come from the model and are kept exact
        return ShapeKey.make(
            {
                "B": pow2_bucket(problem["B"]),
                "HQ": problem["HQ"],
                "HKV": problem["HKV"],
                "S": pow2_bucket(problem["S"]),
                "D": problem["D"],
            },
            {"dtype": problem["dtype"], "paged": str(problem["paged"])},
        )

    def make_inputs(self, problem: Problem, device: Device) -> DecodeInputs:
        """q, k_cache, v_cache, seq_lens (all S but one, random in [1, S], when B > 1), block_table or None.

        Paged caches get PAGE_SIZE-token pages handed out in a random order.
        """
        import torch  # heavy: imported where tensors are made or compared

        B, HQ, HKV, S, D = (problem[d] for d in self.dims)
        dtype = getattr(torch, problem["dtype"])
        where = "cuda" if device.is_gpu else "cpu"
        q = torch.randn(B, HQ, D, device=where, dtype=dtype)
        # Every sequence full but one of random length: the timing reflects the context the key
        # names (a config tuned on half-empty caches splits too little), and the check still
        # covers ragged lengths.
        seq_lens = torch.full((B,), S, device=where, dtype=torch.int32)
        if B > 1:
            seq_lens[torch.randint(B, ())] = torch.randint(1, S + 1, ()).item()
        if problem["paged"]:
            pages = cdiv(S, PAGE_SIZE)
            k_cache = torch.randn(B * pages, PAGE_SIZE, HKV, D, device=where, dtype=dtype)
            v_cache = torch.randn(B * pages, PAGE_SIZE, HKV, D, device=where, dtype=dtype)
            block_table = torch.randperm(B * pages, device=where).to(torch.int32).view(B, pages)
        else:
            k_cache = torch.randn(B, S, HKV, D, device=where, dtype=dtype)
            v_cache = torch.randn(B, S, HKV, D, device=where, dtype=dtype)
            block_table = None
        return q, k_cache, v_cache, seq_lens, block_table

    def launch(self, inputs: DecodeInputs, config: Config) -> torch.Tensor:
        return self.kernels.launch_decode(*inputs, config)

    def reference(self, inputs: DecodeInputs) -> torch.Tensor:
        return self.kernels.decode_reference(*inputs)

    peer_name = "torch SDPA (enable_gqa, dense cache)"

    def peer(self, inputs: DecodeInputs) -> Callable[[], torch.Tensor]:
        """SDPA of the one-token queries over a dense head-major (B, HKV, S, D) copy of the cache,
        made once here, as a torch user without a paged kernel would keep it. Unmasked: the one
        shorter sequence is attended in full, at most 1/B more work for the peer."""
        import torch  # heavy: imported where tensors are made or compared

        q, k_cache, v_cache, seq_lens, block_table = inputs
        S = int(seq_lens.max())
        if block_table is not None:
            k_cache = k_cache[block_table.long()].flatten(1, 2)
            v_cache = v_cache[block_table.long()].flatten(1, 2)
        k, v = (t[:, :S].transpose(1, 2).contiguous() for t in (k_cache, v_cache))
        queries = q.unsqueeze(2)  # (B, HQ, 1, D)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        if _torch_at_least(2, 5):
            return lambda: sdpa(queries, k, v, enable_gqa=True)
        # before torch 2.5, SDPA has no GQA: each KV head repeated for its group of query heads
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return lambda: sdpa(queries, k, v)

    def heuristic(self, problem: Problem, device: Device) -> Config:
        # enough splits for about two programs per SM, never a split shorter than one tile
        block_n = 64
        programs = problem["B"] * problem["HKV"]
        splits = 1
        while splits < 64 and programs * splits * 2 <= 2 * device.sm_count and splits * 2 * block_n <= problem["S"]:
            splits *= 2
        config: Config = {"BLOCK_N": block_n, "NUM_SPLITS": splits, "num_warps": 4, "num_stages": 3}
        if self.violations(config, problem, device):
            # small problems: the smallest feasible tiles
            config = self.feasible(problem, device)[0]
        return config

    def key_distance(self, a: ShapeKey, b: ShapeKey) -> float:
        # compared in the terms decode's speed follows (log2 of each): the split kernel's programs
        # per split (B x HKV), the context, the query heads each program serves and the head dim.
        # By B and HKV apart, a key of twice the batch and half the KV heads would lie two
        # doublings away, though it launches the same grid.
        if not a.comparable(b):
            return math.inf
        return math.dist(_decode_point(dict(a.dims)), _decode_point(dict(b.dims)))

    def wave_fill(self, config: Config, problem: Problem, device: Device) -> float:
        # the split kernel's programs (one per sequence, KV head and split) over the SMs: several
        # are resident on an SM at once, so past one per SM a last wave does not leave SMs idle
        programs = problem["B"] * problem["HKV"] * config["NUM_SPLITS"]
        return min(1.0, programs / max(device.sm_count, 1))

    def cost(self, problem: Problem) -> Cost:
        B, HQ, HKV, S, D = (problem[d] for d in self.dims)
        size = ELEMENT_BYTES[problem["dtype"]]
        # expected sum of the lengths make_inputs draws: all S but one (when B > 1), uniform in [1, S]
        tokens = S if B == 1 else (B - 1) * S + (S + 1) / 2
        return Cost(flops=4.0 * HQ * D * tokens, bytes=float((2 * HKV * D * tokens + 2 * B * HQ * D) * size))


def _decode_point(dims: dict[str, int]) -> tuple[float, ...]:
    """A decode shape key's dims as the point :meth:`DecodeTemplate.key_distance` measures from."""
    return (
        math.log2(dims["B"] * dims["HKV"]),
        math.log2(dims["S"]),
        math.log2(dims["HQ"] / dims["HKV"]),
        math.log2(dims["D"]),
    )


def _torch_at_least(major: int, minor: int) -> bool:
    import torch  # heavy: imported where tensors are made or compared

    found = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    return found >= (major, minor)


TEMPLATE = DecodeTemplate()
