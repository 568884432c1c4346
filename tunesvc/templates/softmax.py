"""The row softmax, forward and backward templates: shapes, keys, heuristics, costs.

What tuning and lookups need to know about the kernels, without importing torch or Triton:
the kernels themselves and their launches are in :mod:`tunesvc.kernels.softmax`, which the methods
that make inputs, launch and check import when first called.
"""

from __future__ import annotations

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


class SoftmaxTemplate(ShippedTemplate):
    name = "softmax"
    dims = ("M", "N")
    kernel_module = "softmax"
    kernel_sources = ("_softmax_kernel", "launch_softmax")
    presets = {
        # LLM activations: square, wide (16k tokens x 8k hidden) and tall (32k tokens x 1k)
        "llm": [
            {"M": 4096, "N": 4096},
            {"M": 16384, "N": 8192},
            {"M": 32768, "N": 1024},
        ],
        # small and odd on purpose: runs in the CPU interpreter in seconds
        "tiny": [
            {"M": 37, "N": 45},
            {"M": 5, "N": 300},
        ],
    }

    def key(self, problem: Problem) -> ShapeKey:
        # M (tokens) varies at run time and shares configs by power-of-two bucket; N is a model dim
        return ShapeKey.make({"M": pow2_bucket(problem["M"]), "N": problem["N"]}, {"dtype": problem["dtype"]})

    def make_inputs(self, problem: Problem, device: Device) -> torch.Tensor:
        import torch  # heavy: imported where tensors are made or compared

        where = "cuda" if device.is_gpu else "cpu"
        # scaled so rows have a real spread of probabilities, not a near-uniform one
        return 3.0 * torch.randn(problem["M"], problem["N"], device=where, dtype=getattr(torch, problem["dtype"]))

    def launch(self, inputs: torch.Tensor, config: Config) -> torch.Tensor:
        return self.kernels.launch_softmax(inputs, config)

    def reference(self, inputs: torch.Tensor) -> torch.Tensor:
        import torch  # heavy: imported where tensors are made or compared

        return torch.softmax(inputs.double(), dim=-1)

    peer_name = "torch.softmax"

    def peer(self, inputs: torch.Tensor) -> Callable[[], torch.Tensor]:
        import torch  # heavy: imported where tensors are made or compared

        return lambda: torch.softmax(inputs, dim=-1)

    def heuristic(self, problem: Problem, device: Device) -> Config:
        n = pow2_bucket(problem["N"])
        if n <= 8192:
            # one pass; a few rows per program when rows are short, so each moves >= 8 KB
            block_n = max(16, n)
            block_m = max(1, min(16, 4096 // block_n, pow2_bucket(problem["M"])))
            warps = 4 if block_m * block_n <= 2048 else 8 if block_m * block_n <= 4096 else 16
            config: Config = {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": warps, "num_stages": 1}
        else:
            config = {"BLOCK_M": 1, "BLOCK_N": 4096, "num_warps": 8, "num_stages": 2}
        if self.violations(config, problem, device):
            config = self.feasible(problem, device)[0]
        return config

    def cost(self, problem: Problem) -> Cost:
        m, n = problem["M"], problem["N"]
        size = ELEMENT_BYTES[problem["dtype"]]
        return Cost(flops=4.0 * m * n, bytes=float(2 * m * n * size))


TEMPLATE = SoftmaxTemplate()


class SoftmaxBwdTemplate(SoftmaxTemplate):
    """The backward: its own kernel, space and tuned configs, on the forward's shapes and key."""

    # inherits the forward's shapes, key and heuristic, not its inputs: the ignores below mark
    # the overrides that take the backward's inputs (mypy reads them as Liskov violations)
    name = "softmax_bwd"
    kernel_module = "softmax"
    kernel_sources = ("_softmax_bwd_kernel", "launch_softmax_bwd")

    def make_inputs(self, problem: Problem, device: Device) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        import torch  # heavy: imported where tensors are made or compared

        x = super().make_inputs(problem, device)
        return torch.softmax(x.float(), dim=-1).to(x.dtype), torch.randn_like(x)

    def launch(self, inputs: tuple[torch.Tensor, torch.Tensor], config: Config) -> torch.Tensor:  # type: ignore[override]
        return self.kernels.launch_softmax_bwd(*inputs, config)

    def reference(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:  # type: ignore[override]
        y, dy = (t.double() for t in inputs)
        return y * (dy - (y * dy).sum(dim=-1, keepdim=True))

    peer_name = "torch softmax backward (aten._softmax_backward_data)"

    def peer(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> Callable[[], torch.Tensor]:  # type: ignore[override]
        # the op autograd runs for softmax's backward, called directly: no graph to keep alive
        import torch  # heavy: imported where tensors are made or compared

        y, dy = inputs
        return lambda: torch.ops.aten._softmax_backward_data(dy, y, -1, y.dtype)

    def cost(self, problem: Problem) -> Cost:
        m, n = problem["M"], problem["N"]
        size = ELEMENT_BYTES[problem["dtype"]]
        return Cost(flops=4.0 * m * n, bytes=float(3 * m * n * size))


BWD_TEMPLATE = SoftmaxBwdTemplate()
