"""The flash attention, forward and backward templates: shapes, keys, heuristics, costs.

What tuning and lookups need to know about the kernels, without importing torch or Triton:
the kernels themselves and their launches are in :mod:`tunesvc.kernels.attention`, which the methods
that make inputs, launch and check import when first called.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import NamedTuple

from tunesvc.errors import TunesvcError
from tunesvc.template import ELEMENT_BYTES
from tunesvc.template import Cost
from tunesvc.template import Problem
from tunesvc.template import ShapeKey
from tunesvc.template import backward_peer
from tunesvc.template import pow2_bucket
from tunesvc.templates._shipped import ShippedTemplate

if TYPE_CHECKING:
    import torch

    from tunesvc.device import Device
    from tunesvc.space import Config


HEAD_DIMS = (64, 128)


class AttentionInputs(NamedTuple):
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    causal: bool
    sm_scale: float


class AttentionBwdInputs(NamedTuple):
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    lse: torch.Tensor
    do: torch.Tensor
    causal: bool
    sm_scale: float


class _AttentionBase(ShippedTemplate):
    """What the forward and backward templates share: problems, keys, inputs."""

    dims = ("B", "H", "S", "D")
    options = {"causal": (False, True)}
    dtypes = ("float16", "bfloat16")
    presets = {
        # one long-context training step: bf16 B4 H32 S4096 D128, causal and not
        "b4h32s4096d128": [
            {"B": 4, "H": 32, "S": 4096, "D": 128, "causal": False, "dtype": "bfloat16"},
            {"B": 4, "H": 32, "S": 4096, "D": 128, "causal": True, "dtype": "bfloat16"},
        ],
        # small and odd on purpose: runs in the CPU interpreter in seconds
        "tiny": [
            {"B": 1, "H": 2, "S": 37, "D": 64},
            {"B": 1, "H": 2, "S": 50, "D": 64, "causal": True},
        ],
    }

    def check(self, problem: Problem) -> None:
        if problem["D"] not in HEAD_DIMS:
            raise TunesvcError(f"{self.name}: head dim D={problem['D']} is not supported; use 64 or 128.")

    def key(self, problem: Problem) -> ShapeKey:
        # batch and sequence length vary at run time and share configs by power-of-two bucket;
        # heads and head dim come from the model and are kept exact
        return ShapeKey.make(
            {"B": pow2_bucket(problem["B"]), "H": problem["H"], "S": pow2_bucket(problem["S"]), "D": problem["D"]},
            {"dtype": problem["dtype"], "causal": str(problem["causal"])},
        )

    def _qkv(self, problem: Problem, device: Device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        import torch  # heavy: imported where tensors are made or compared

        dtype = getattr(torch, problem["dtype"])
        where = "cuda" if device.is_gpu else "cpu"
        shape = (problem["B"], problem["H"], problem["S"], problem["D"])
        q, k, v = (torch.randn(shape, device=where, dtype=dtype) for _ in range(3))
        return q, k, v

    def _forward_flops(self, problem: Problem) -> float:
        flops = 4.0 * problem["B"] * problem["H"] * problem["S"] ** 2 * problem["D"]
        return flops / 2 if problem["causal"] else flops

    def _elements(self, problem: Problem) -> tuple[int, int, int]:
        """(elements of one of Q/K/V/O, rows of LSE, bytes per element)."""
        rows = problem["B"] * problem["H"] * problem["S"]
        return rows * problem["D"], rows, ELEMENT_BYTES[problem["dtype"]]


class AttentionTemplate(_AttentionBase):
    name = "attention"
    kernel_module = "attention"
    kernel_sources = ("_attn_fwd_step", "_attn_fwd_inner", "_attn_fwd_kernel", "_tma_ready", "launch_attention")

    # The fastest tiles of the pointer kernel in the H100 ground truth (benchmarks/data), both settings,
    # and 256 query rows on 16 warps (the fastest of the 41 configs an H100 probe tried at B2 H64
    # S3000 D128, 6% ahead of the best of its five 128-row ones), each in every variant
    # (warp-specialised TMA, TMA, pointers), so that a short sweep measures all three; infeasible
    # ones (WS when causal, TMA off Hopper) are skipped by the search.
    known_good = tuple(
        {"BLOCK_M": m, "BLOCK_N": n, "TMA": tma, "WS": ws, "num_warps": w, "num_stages": s}
        for m, n, w, s in ((128, 128, 8, 3), (128, 64, 8, 4), (64, 64, 4, 3), (128, 64, 4, 3), (256, 64, 16, 3))
        for tma, ws in ((1, 1), (1, 0), (0, 0))
    )

    def make_inputs(self, problem: Problem, device: Device) -> AttentionInputs:
        q, k, v = self._qkv(problem, device)
        return AttentionInputs(q, k, v, problem["causal"], 1.0 / math.sqrt(problem["D"]))

    def launch(self, inputs: AttentionInputs, config: Config) -> torch.Tensor:
        return self.kernels.launch_attention(
            inputs.q, inputs.k, inputs.v, config, causal=inputs.causal, sm_scale=inputs.sm_scale
        )[0]

    def reference(self, inputs: AttentionInputs) -> torch.Tensor:
        return self.kernels.reference_attention(
            inputs.q, inputs.k, inputs.v, causal=inputs.causal, sm_scale=inputs.sm_scale
        )[0]

    peer_name = "torch SDPA (F.scaled_dot_product_attention)"

    def peer(self, inputs: AttentionInputs) -> Callable[[], torch.Tensor]:
        import torch  # heavy: imported where tensors are made or compared

        q, k, v, causal, sm_scale = inputs
        return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=sm_scale)

    def heuristic(self, problem: Problem, device: Device) -> Config:
        # one warpgroup per 128 query rows for D=64; D=128's larger accumulator wants two
        warps = 4 if problem["D"] == 64 else 8
        # pointer loads run on every GPU (TMA and WS need Hopper and are left to a sweep)
        config: Config = {"BLOCK_M": 128, "BLOCK_N": 64, "TMA": 0, "WS": 0, "num_warps": warps, "num_stages": 3}
        if self.violations(config, problem, device):
            config = self.feasible(problem, device)[0]  # short sequences: the smallest tiles
        return config

    def cost(self, problem: Problem) -> Cost:
        elements, rows, size = self._elements(problem)
        return Cost(flops=self._forward_flops(problem), bytes=float(4 * elements * size + 4 * rows))


class AttentionBwdTemplate(_AttentionBase):
    name = "attention_bwd"
    kernel_module = "attention"
    kernel_sources = (
        "_attn_bwd_preprocess",
        "_attn_bwd_dkdv",
        "_attn_bwd_dq",
        "_attn_bwd_kernel",
        "launch_attention_bwd",
    )

    # Triton tutorial 06's fixed backward config, and the fastest backward tiles measured on an
    # H100 (64/128/128/64, 8 warps, 3 stages), with both kinds of loads
    known_good = (
        {"BLOCK_M1": 32, "BLOCK_N1": 128, "BLOCK_M2": 128, "BLOCK_N2": 32, "TMA": 0, "num_warps": 4, "num_stages": 5},
        {"BLOCK_M1": 64, "BLOCK_N1": 128, "BLOCK_M2": 128, "BLOCK_N2": 64, "TMA": 1, "num_warps": 8, "num_stages": 3},
        {"BLOCK_M1": 64, "BLOCK_N1": 128, "BLOCK_M2": 128, "BLOCK_N2": 64, "TMA": 0, "num_warps": 8, "num_stages": 3},
    )

    def make_inputs(self, problem: Problem, device: Device) -> AttentionBwdInputs:
        import torch  # heavy: imported where tensors are made or compared

        q, k, v = self._qkv(problem, device)
        sm_scale = 1.0 / math.sqrt(problem["D"])
        # O and LSE from this module's forward (heuristic config), not the float32 reference: each
        # compile worker makes its own inputs, and the reference's S x S scores would hold GiBs in
        # every one of them. The gradients are still checked against the reference's autograd.
        forward = TEMPLATE.heuristic(problem, device)
        o, lse = self.kernels.launch_attention(q, k, v, forward, causal=problem["causal"], sm_scale=sm_scale)
        return AttentionBwdInputs(q, k, v, o, lse, torch.randn_like(q), problem["causal"], sm_scale)

    def launch(self, inputs: AttentionBwdInputs, config: Config) -> torch.Tensor:
        q, k, v, o, lse, do, causal, sm_scale = inputs
        return self.kernels.launch_attention_bwd(q, k, v, o, lse, do, config, causal=causal, sm_scale=sm_scale)

    def reference(self, inputs: AttentionBwdInputs) -> torch.Tensor:
        import torch  # heavy: imported where tensors are made or compared

        q, k, v, _, _, do, causal, sm_scale = inputs
        return torch.stack(self.kernels.reference_attention(q, k, v, causal=causal, sm_scale=sm_scale, do=do))

    peer_name = "torch SDPA backward (autograd)"

    def peer(self, inputs: AttentionBwdInputs) -> Callable[[], tuple[torch.Tensor, ...]]:
        """dQ, dK, dV of SDPA by autograd (the forward run before any timing: backward_peer):
        the kernel too starts from a saved O and LSE, so only the backward is timed on either side."""
        import torch  # heavy: imported where tensors are made or compared

        q, k, v, _, _, do, causal, sm_scale = inputs
        sdpa = torch.nn.functional.scaled_dot_product_attention
        return backward_peer(
            lambda query, key, value: sdpa(query, key, value, is_causal=causal, scale=sm_scale), (q, k, v), do
        )

    def heuristic(self, problem: Problem, device: Device) -> Config:
        warps = 4 if problem["D"] == 64 else 8
        config: Config = {
            "BLOCK_M1": 32,
            "BLOCK_N1": 128,
            "BLOCK_M2": 128,
            "BLOCK_N2": 32,
            "TMA": 0,
            "num_warps": warps,
            "num_stages": 3,
        }
        if self.violations(config, problem, device):
            config = self.feasible(problem, device)[0]  # short sequences: the smallest tiles
        return config

    def cost(self, problem: Problem) -> Cost:
        elements, rows, size = self._elements(problem)
        # reads Q, K, V, O, dO and LSE; writes dQ, dK, dV (Delta is an intermediate, not counted)
        return Cost(flops=2.5 * self._forward_flops(problem), bytes=float(8 * elements * size + 4 * rows))


TEMPLATE = AttentionTemplate()
BWD_TEMPLATE = AttentionBwdTemplate()
