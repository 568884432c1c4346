"""The dropout template: shapes, keys, heuristics, costs.

What tuning and lookups need to know about the kernel, without importing torch or Triton:
the kernels themselves and their launches are in :mod:`tunesvc.kernels.dropout`, which the methods
that make inputs, launch and check import when first called.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from tunesvc.template import ELEMENT_BYTES
from tunesvc.template import Cost
from tunesvc.template import Problem
from tunesvc.template import ShapeKey
from tunesvc.template import pow2_bucket
from tunesvc.templates._shipped import ShippedTemplate

if TYPE_CHECKING:
    import torch

    from tunesvc.device import Device
    from tunesvc.space import Config


SWEEP_P = 0.1


class DropoutTemplate(ShippedTemplate):
    """Dropout over a flattened tensor; the backward is this same kernel applied to the gradient
    (the mask regenerated from the seed), so it shares this template and its tuned configs."""

    name = "dropout"
    dims = ("numel",)
    kernel_module = "dropout"
    kernel_sources = ("_uniform", "_uniform_lanes", "_dropout_kernel", "launch_dropout")
    presets = {
        # the row-wise kernels' LLM activation shapes (4096x4096, 16384x8192, 32768x1024), flattened
        "llm": [{"numel": 4096 * 4096}, {"numel": 16384 * 8192}, {"numel": 32768 * 1024}],
        # small and odd on purpose: runs in the CPU interpreter in seconds
        "tiny": [{"numel": 37 * 45}, {"numel": 999}],
    }

    # Triton tutorial 04's block (1024 elements, default 4 warps), and the heuristic's block in
    # the other layout, so that a short search measures both layouts
    known_good = (
        {"BLOCK": 1024, "LANES_2D": 0, "num_warps": 4},
        {"BLOCK": 4096, "LANES_2D": 1, "num_warps": 8},
    )

    def key(self, problem: Problem) -> ShapeKey:
        # the element count varies with batch and tokens; powers of two share configs
        return ShapeKey.make({"numel": pow2_bucket(problem["numel"])}, {"dtype": problem["dtype"]})

    def make_inputs(self, problem: Problem, device: Device) -> tuple[torch.Tensor, float, int]:
        import torch  # heavy: imported where tensors are made or compared

        where = "cuda" if device.is_gpu else "cpu"
        x = torch.randn(problem["numel"], device=where, dtype=getattr(torch, problem["dtype"]))
        return x, SWEEP_P, random.randrange(2**31)

    def launch(self, inputs: tuple[torch.Tensor, float, int], config: Config) -> torch.Tensor:
        return self.kernels.launch_dropout(*inputs, config)

    def reference(self, inputs: tuple[torch.Tensor, float, int]) -> torch.Tensor:
        # Philox's stream cannot be drawn in torch; the mask comes from a separate fixed-config
        # kernel, so a config that skips, repeats or shifts elements still fails the check
        import torch  # heavy: imported where tensors are made or compared

        x, p, seed = inputs
        keep = self.kernels.keep_mask(x.numel(), p, seed, x.device).view(x.shape)
        return torch.where(keep, x.double() / (1.0 - p), 0.0)

    peer_name = "torch F.dropout"

    def peer(self, inputs: tuple[torch.Tensor, float, int]) -> Callable[[], torch.Tensor]:
        import torch  # heavy: imported where tensors are made or compared

        x, p, _ = inputs
        return lambda: torch.nn.functional.dropout(x, p, training=True)

    def heuristic(self, problem: Problem, device: Device) -> Config:
        config: Config = {"BLOCK": 4096, "LANES_2D": 0, "num_warps": 8}
        if self.violations(config, problem, device):
            config = self.feasible(problem, device)[0]
        return config

    def cost(self, problem: Problem) -> Cost:
        size = ELEMENT_BYTES[problem["dtype"]]
        return Cost(flops=float(problem["numel"]), bytes=float(2 * problem["numel"] * size))


TEMPLATE = DropoutTemplate()
