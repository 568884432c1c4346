"""The layer norm, forward and backward, and what the row norms share templates: shapes, keys, heuristics, costs.

What tuning and lookups need to know about the kernels, without importing torch or Triton:
the kernels themselves and their launches are in :mod:`tunesvc.kernels.layernorm`, which the methods
that make inputs, launch and check import when first called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

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


#: a row is held in registers whole: at most 64 KiB of it (N <= 32768 in 16-bit types)
MAX_ROW_BYTES = 65536
#: token counts of the "models" preset, decode to prefill
_MODEL_TOKENS = (1, 64, 512, 4096, 16384, 8, 256, 2048)


class RowNormTemplate(ShippedTemplate):
    """Shared by the norm templates: x is (M, N), rows normalised over N, the row in registers.

    M (tokens) varies at run time and shares configs by power-of-two bucket; N (the hidden
    size) is kept exact.
    """

    dims = ("M", "N")
    presets = {
        # LLM activations: square, wide (16k tokens x 8k hidden) and tall (32k tokens x 1k)
        "llm": [{"M": 4096, "N": 4096}, {"M": 16384, "N": 8192}, {"M": 32768, "N": 1024}],
        # the hidden sizes of more models (Qwen2.5-0.5B and 1.5B, Llama-3.2-1B, Gemma-2-2B,
        # Llama-3.2-3B, Gemma-2-27B, Mixtral-8x22B, Yi-34B, Mistral-Large, Llama-3.1-405B), each
        # at two token counts from decode to prefill: what the selector learns from
        "models": [
            {"M": m, "N": n}
            for i, n in enumerate((896, 1536, 2048, 2304, 3072, 4608, 6144, 7168, 12288, 16384))
            for m in (_MODEL_TOKENS[i % 8], _MODEL_TOKENS[(i + 3) % 8])
        ],
        # odd on purpose (no block divides them): runs in the CPU interpreter in seconds
        "tiny": [{"M": 37, "N": 45}, {"M": 5, "N": 130}],
    }

    def check(self, problem: Problem) -> None:
        elem = ELEMENT_BYTES[problem["dtype"]]
        if problem["N"] * elem > MAX_ROW_BYTES:
            raise TunesvcError(
                f"{self.name}: N={problem['N']} is too wide; a row must fit in {MAX_ROW_BYTES // 1024} KiB "
                f"(N <= {MAX_ROW_BYTES // elem} for {problem['dtype']})."
            )

    def key(self, problem: Problem) -> ShapeKey:
        return ShapeKey.make({"M": pow2_bucket(problem["M"]), "N": problem["N"]}, {"dtype": problem["dtype"]})

    def _tensor(
        self, problem: Problem, device: Device, *shape: int, scale: float = 1.0, shift: float = 0.0
    ) -> torch.Tensor:
        import torch  # heavy: imported where tensors are made or compared

        where = "cuda" if device.is_gpu else "cpu"
        data = torch.randn(*shape, device=where, dtype=torch.float32) * scale + shift
        return data.to(getattr(torch, problem["dtype"]))

    def _rows_and_warps(self, problem: Problem) -> Config:
        """About 4096 elements per program, one warp per 512 of them (tutorial 05's ratio)."""
        block_n = max(16, pow2_bucket(problem["N"]))
        block_m = min(8, max(1, 4096 // block_n), pow2_bucket(problem["M"]))
        num_warps = min(16, max(1, block_m * block_n // 512))
        return {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": num_warps}

    def _checked(self, config: Config, problem: Problem, device: Device) -> Config:
        """The config if it satisfies the space, else the first feasible one."""
        return self.feasible(problem, device)[0] if self.violations(config, problem, device) else config

    def forward_heuristic(self, problem: Problem, device: Device) -> Config:
        return self._checked(self._rows_and_warps(problem), problem, device)

    def backward_heuristic(self, problem: Problem, device: Device) -> Config:
        # about two programs per SM: enough in flight to stream rows, few partial rows to reduce
        group = min(1024, max(64, pow2_bucket(device.sm_count)))
        config = {**self._rows_and_warps(problem), "GROUP_SIZE_M": group, "num_stages": 2}
        return self._checked(config, problem, device)


class LayerNormTemplate(RowNormTemplate):
    name = "layernorm"
    kernel_module = "layernorm"
    kernel_sources = ("_layernorm_fwd_kernel", "launch_layernorm")

    def make_inputs(self, problem: Problem, device: Device) -> tuple[torch.Tensor, ...]:
        M, N = problem["M"], problem["N"]
        # a non-zero mean, so that a kernel that forgot to centre is caught
        x = self._tensor(problem, device, M, N, scale=2.0, shift=0.5)
        w = self._tensor(problem, device, N, shift=1.0)
        b = self._tensor(problem, device, N)
        return x, w, b

    def launch(self, inputs: tuple[torch.Tensor, ...], config: Config) -> torch.Tensor:
        x, w, b = inputs
        return self.kernels.launch_layernorm(x, w, b, 1e-5, config)[0]

    def reference(self, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        import torch  # heavy: imported where tensors are made or compared

        x, w, b = (t.float() for t in inputs)
        return torch.nn.functional.layer_norm(x, (x.shape[1],), w, b, 1e-5)

    peer_name = "torch F.layer_norm"

    def peer(self, inputs: tuple[torch.Tensor, ...]) -> Callable[[], torch.Tensor]:
        import torch  # heavy: imported where tensors are made or compared

        x, w, b = inputs
        return lambda: torch.nn.functional.layer_norm(x, (x.shape[1],), w, b, 1e-5)

    def heuristic(self, problem: Problem, device: Device) -> Config:
        return self.forward_heuristic(problem, device)

    def cost(self, problem: Problem) -> Cost:
        M, N = problem["M"], problem["N"]
        elem = ELEMENT_BYTES[problem["dtype"]]
        return Cost(flops=8.0 * M * N, bytes=float((2 * M * N + 2 * N) * elem))


class LayerNormBwdTemplate(RowNormTemplate):
    name = "layernorm_bwd"
    kernel_module = "layernorm"
    kernel_sources = ("_layernorm_bwd_kernel", "column_sum_kernel", "launch_layernorm_bwd", "launch_column_sum")

    def make_inputs(self, problem: Problem, device: Device) -> tuple[torch.Tensor, ...]:
        import torch  # heavy: imported where tensors are made or compared

        M, N = problem["M"], problem["N"]
        x = self._tensor(problem, device, M, N, scale=2.0, shift=0.5)
        w = self._tensor(problem, device, N, shift=1.0)
        b = self._tensor(problem, device, N)
        dy = self._tensor(problem, device, M, N)
        # the statistics the forward would have saved, from the same (rounded) x
        var, mean = torch.var_mean(x.float(), dim=1, correction=0)
        return x, w, b, dy, mean, torch.rsqrt(var + 1e-5)

    def launch(self, inputs: tuple[torch.Tensor, ...], config: Config) -> torch.Tensor:
        """dx, dw, db back to back in one flat buffer, so that one relative error covers all three."""
        import torch  # heavy: imported where tensors are made or compared

        x, w, _, dy, mean, rstd = inputs
        out = torch.empty(x.numel() + 2 * x.shape[1], device=x.device, dtype=x.dtype)
        self.kernels.launch_layernorm_bwd(x, w, dy, mean, rstd, config, out=out)
        return out

    def reference(self, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        import torch  # heavy: imported where tensors are made or compared

        x, w, b, dy = (t.double() for t in inputs[:4])
        x.requires_grad_(True)
        w.requires_grad_(True)
        b.requires_grad_(True)
        y = torch.nn.functional.layer_norm(x, (x.shape[1],), w, b, 1e-5)
        dx, dw, db = torch.autograd.grad(y, (x, w, b), dy)
        return torch.cat([dx.flatten(), dw, db])

    peer_name = "torch F.layer_norm backward (autograd)"

    def peer(self, inputs: tuple[torch.Tensor, ...]) -> Callable[[], tuple[torch.Tensor, ...]]:
        """dx, dw, db by autograd (the forward run before any timing: backward_peer): only the backward is timed."""
        import torch  # heavy: imported where tensors are made or compared

        x, w, b, dy = inputs[:4]
        return backward_peer(
            lambda x, w, b: torch.nn.functional.layer_norm(x, (x.shape[1],), w, b, 1e-5), (x, w, b), dy
        )

    def heuristic(self, problem: Problem, device: Device) -> Config:
        return self.backward_heuristic(problem, device)

    def cost(self, problem: Problem) -> Cost:
        M, N = problem["M"], problem["N"]
        elem = ELEMENT_BYTES[problem["dtype"]]
        return Cost(flops=13.0 * M * N, bytes=float((3 * M * N + 3 * N) * elem + 8 * M))


TEMPLATE = LayerNormTemplate()
BWD_TEMPLATE = LayerNormBwdTemplate()
