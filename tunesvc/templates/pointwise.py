"""The bias + activation + residual, forward and backward templates: shapes, keys, heuristics, costs.

What tuning and lookups need to know about the kernels, without importing torch or Triton:
the kernels themselves and their launches are in :mod:`tunesvc.kernels.pointwise`, which the methods
that make inputs, launch and check import when first called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tunesvc.template import ELEMENT_BYTES
from tunesvc.template import Cost
from tunesvc.template import Problem
from tunesvc.template import ShapeKey
from tunesvc.template import backward_peer
from tunesvc.template import cdiv
from tunesvc.template import pow2_bucket
from tunesvc.templates._shipped import ShippedTemplate

if TYPE_CHECKING:
    import torch

    from tunesvc.device import Device
    from tunesvc.space import Config


ACTIVATIONS = ("gelu", "silu", "relu")

#: FLOPs per element of act(z) + add + add, counting erf and exp as one each
_FLOPS_PER_ELEMENT = {"gelu": 7, "silu": 5, "relu": 3}


class BiasActResidualTemplate(ShippedTemplate):
    name = "bias_act_residual"
    dims = ("M", "N")
    options = {"act": ACTIVATIONS}
    kernel_module = "pointwise"
    kernel_sources = ("_bias_act_residual_kernel", "launch_bias_act_residual")
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
            {"M": 5, "N": 300, "act": "silu"},
        ],
    }

    def key(self, problem: Problem) -> ShapeKey:
        # M (tokens) varies at run time and shares configs by power-of-two bucket; N is a model dim
        return ShapeKey.make(
            {"M": pow2_bucket(problem["M"]), "N": problem["N"]},
            {"act": problem["act"], "dtype": problem["dtype"]},
        )

    def make_inputs(self, problem: Problem, device: Device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]:
        import torch  # heavy: imported where tensors are made or compared

        where = "cuda" if device.is_gpu else "cpu"
        dtype = getattr(torch, problem["dtype"])
        m, n = problem["M"], problem["N"]
        x = torch.randn(m, n, device=where, dtype=dtype)
        bias = torch.randn(n, device=where, dtype=dtype)
        residual = torch.randn(m, n, device=where, dtype=dtype)
        return x, bias, residual, problem["act"]

    def launch(self, inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, str], config: Config) -> torch.Tensor:
        return self.kernels.launch_bias_act_residual(*inputs, config)

    def reference(self, inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]) -> torch.Tensor:
        x, bias, residual, act = inputs
        return self.kernels.bias_act_residual_reference(x.double(), bias.double(), residual.double(), act)

    peer_name = "torch eager (x + bias, activation, + residual)"

    def peer(self, inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]) -> Callable[[], torch.Tensor]:
        return lambda: self.kernels.bias_act_residual_reference(*inputs)

    def heuristic(self, problem: Problem, device: Device) -> Config:
        # 16 KB-ish tiles, whole rows where the row is short: enough bytes in flight per SM
        block_n = min(1024, max(16, pow2_bucket(problem["N"])))
        block_m = max(1, min(32, 4096 // block_n, pow2_bucket(problem["M"])))
        config: Config = {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": 4 if block_m * block_n < 4096 else 8}
        if self.violations(config, problem, device):
            config = self.feasible(problem, device)[0]
        return config

    def cost(self, problem: Problem) -> Cost:
        m, n = problem["M"], problem["N"]
        size = ELEMENT_BYTES[problem["dtype"]]
        return Cost(flops=float(_FLOPS_PER_ELEMENT[problem["act"]] * m * n), bytes=float((3 * m * n + n) * size))


TEMPLATE = BiasActResidualTemplate()


class BiasActResidualBwdTemplate(BiasActResidualTemplate):
    """The backward: its own kernel, space and tuned configs, on the forward's shapes and key."""

    # inherits the forward's shapes, key and heuristic, not its inputs: the ignores below mark
    # the overrides that take the backward's inputs (mypy reads them as Liskov violations)
    name = "bias_act_residual_bwd"
    kernel_module = "pointwise"
    kernel_sources = ("_bias_act_residual_bwd_kernel", "launch_bias_act_residual_bwd")

    def launch(self, inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, str], config: Config) -> torch.Tensor:
        """dx and dbias back to back in one flat buffer, so that one relative error covers both."""
        import torch  # heavy: imported where tensors are made or compared

        x, bias, dy, act = inputs
        out = torch.empty(x.numel() + x.shape[1], device=x.device, dtype=x.dtype)
        self.kernels.launch_bias_act_residual_bwd(x, bias, dy, act, config, out=out)
        return out

    def reference(self, inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]) -> torch.Tensor:
        import torch  # heavy: imported where tensors are made or compared

        x, bias, dy, act = inputs
        x64, bias64 = x.double().requires_grad_(), bias.double().requires_grad_()
        y = self.kernels.bias_act_residual_reference(x64, bias64, torch.zeros_like(x64), act)
        dx, dbias = torch.autograd.grad(y, (x64, bias64), dy.double())
        return torch.cat([dx.flatten(), dbias])

    peer_name = "torch eager backward (autograd)"

    def peer(  # type: ignore[override]
        self, inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]
    ) -> Callable[[], tuple[torch.Tensor, ...]]:
        """dx, dbias by autograd of the eager expression (the forward run before any timing:
        backward_peer): only the backward is timed."""
        import torch  # heavy: imported where tensors are made or compared

        x, bias, dy, act = inputs
        zeros = torch.zeros_like(x)
        return backward_peer(
            lambda x, bias: self.kernels.bias_act_residual_reference(x, bias, zeros, act), (x, bias), dy
        )

    def heuristic(self, problem: Problem, device: Device) -> Config:
        forward = super().heuristic(problem, device)
        block_n = int(forward["BLOCK_N"])
        # the longest row group that still leaves two waves of programs: fewest partial rows
        programs = cdiv(problem["N"], block_n)
        rows = next((r for r in (1024, 256) if cdiv(problem["M"], r) * programs >= 2 * device.sm_count), 64)
        config = {
            "BLOCK_M": min(forward["BLOCK_M"], 16),
            "BLOCK_N": block_n,
            "ROWS": rows,
            "num_warps": forward["num_warps"],
        }
        if self.violations(config, problem, device):
            config = self.feasible(problem, device)[0]
        return config


BWD_TEMPLATE = BiasActResidualBwdTemplate()
