"""The RMS norm, forward and backward templates: shapes, keys, heuristics, costs.

What tuning and lookups need to know about the kernels, without importing torch or Triton:
the kernels themselves and their launches are in :mod:`tunesvc.kernels.rmsnorm`, which the methods
that make inputs, launch and check import when first called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tunesvc.template import ELEMENT_BYTES
from tunesvc.template import Cost
from tunesvc.template import Problem
from tunesvc.template import backward_peer
from tunesvc.templates.layernorm import RowNormTemplate

if TYPE_CHECKING:
    import torch

    from tunesvc.device import Device
    from tunesvc.space import Config


class RMSNormTemplate(RowNormTemplate):
    name = "rmsnorm"
    kernel_module = "rmsnorm"
    kernel_sources = ("_rmsnorm_fwd_kernel", "launch_rmsnorm")

    def make_inputs(self, problem: Problem, device: Device) -> tuple[torch.Tensor, ...]:
        M, N = problem["M"], problem["N"]
        x = self._tensor(problem, device, M, N, scale=2.0, shift=0.5)
        w = self._tensor(problem, device, N, shift=1.0)
        return x, w

    def launch(self, inputs: tuple[torch.Tensor, ...], config: Config) -> torch.Tensor:
        x, w = inputs
        return self.kernels.launch_rmsnorm(x, w, 1e-6, config)[0]

    def reference(self, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        import torch  # heavy: imported where tensors are made or compared

        x, w = (t.float() for t in inputs)
        return torch.nn.functional.rms_norm(x, (x.shape[1],), w, 1e-6)

    peer_name = "torch F.rms_norm"

    def peer(self, inputs: tuple[torch.Tensor, ...]) -> Callable[[], torch.Tensor] | None:
        import torch  # heavy: imported where tensors are made or compared

        if not hasattr(torch.nn.functional, "rms_norm"):  # torch < 2.4 has no fused eager op to compare with
            return None
        x, w = inputs
        return lambda: torch.nn.functional.rms_norm(x, (x.shape[1],), w, 1e-6)

    def heuristic(self, problem: Problem, device: Device) -> Config:
        return self.forward_heuristic(problem, device)

    def cost(self, problem: Problem) -> Cost:
        M, N = problem["M"], problem["N"]
        elem = ELEMENT_BYTES[problem["dtype"]]
        return Cost(flops=4.0 * M * N, bytes=float((2 * M * N + N) * elem))


class RMSNormBwdTemplate(RowNormTemplate):
    name = "rmsnorm_bwd"
    kernel_module = "rmsnorm"
    kernel_sources = ("_rmsnorm_bwd_kernel", "column_sum_kernel", "launch_rmsnorm_bwd", "launch_column_sum")

    def make_inputs(self, problem: Problem, device: Device) -> tuple[torch.Tensor, ...]:
        import torch  # heavy: imported where tensors are made or compared

        M, N = problem["M"], problem["N"]
        x = self._tensor(problem, device, M, N, scale=2.0, shift=0.5)
        w = self._tensor(problem, device, N, shift=1.0)
        dy = self._tensor(problem, device, M, N)
        # the statistic the forward would have saved, from the same (rounded) x
        rstd = torch.rsqrt(x.float().square().mean(dim=1) + 1e-6)
        return x, w, dy, rstd

    def launch(self, inputs: tuple[torch.Tensor, ...], config: Config) -> torch.Tensor:
        """dx and dw back to back in one flat buffer, so that one relative error covers both."""
        import torch  # heavy: imported where tensors are made or compared

        x, w, dy, rstd = inputs
        out = torch.empty(x.numel() + x.shape[1], device=x.device, dtype=x.dtype)
        self.kernels.launch_rmsnorm_bwd(x, w, dy, rstd, config, out=out)
        return out

    def reference(self, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        import torch  # heavy: imported where tensors are made or compared

        x, w, dy = (t.double() for t in inputs[:3])
        x.requires_grad_(True)
        w.requires_grad_(True)
        dx, dw = torch.autograd.grad(torch.nn.functional.rms_norm(x, (x.shape[1],), w, 1e-6), (x, w), dy)
        return torch.cat([dx.flatten(), dw])

    peer_name = "torch F.rms_norm backward (autograd)"

    def peer(self, inputs: tuple[torch.Tensor, ...]) -> Callable[[], tuple[torch.Tensor, ...]] | None:
        """dx, dw by autograd (the forward run before any timing: backward_peer): only the backward is timed."""
        import torch  # heavy: imported where tensors are made or compared

        if not hasattr(torch.nn.functional, "rms_norm"):  # torch < 2.4
            return None
        x, w, dy = inputs[:3]
        return backward_peer(lambda x, w: torch.nn.functional.rms_norm(x, (x.shape[1],), w, 1e-6), (x, w), dy)

    def heuristic(self, problem: Problem, device: Device) -> Config:
        return self.backward_heuristic(problem, device)

    def cost(self, problem: Problem) -> Cost:
        M, N = problem["M"], problem["N"]
        elem = ELEMENT_BYTES[problem["dtype"]]
        return Cost(flops=9.0 * M * N, bytes=float((3 * M * N + 2 * N) * elem + 4 * M))


TEMPLATE = RMSNormTemplate()
BWD_TEMPLATE = RMSNormBwdTemplate()
