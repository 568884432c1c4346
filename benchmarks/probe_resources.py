"""Compile every config of a list and print what it really uses: shared memory, registers,
spills. Checks the space's constraints against the compiler (run on the GPU)."""

from __future__ import annotations

import torch

from tunesvc.kernels.matmul import TEMPLATE
from tunesvc.kernels.matmul import _matmul_kernel


def main() -> None:
    a = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16)
    print("config | shared bytes | predicted (stages) | regs | spills | status")
    for config in TEMPLATE.known_good + (
        {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 4},
        {"BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 4},
        {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 5},
    ):
        predicted = (config["BLOCK_M"] + config["BLOCK_N"]) * config["BLOCK_K"] * 2 * config["num_stages"]
        try:
            meta = {k: v for k, v in config.items() if not k.startswith("num_")}
            c = torch.empty_like(a)
            compiled = _matmul_kernel[(1,)](
                a,
                b,
                c,
                512,
                512,
                512,
                512,
                1,
                512,
                1,
                512,
                1,
                **meta,
                DOT_IN_FP32=False,
                num_warps=config["num_warps"],
                num_stages=config["num_stages"],
            )
            torch.cuda.synchronize()
            status = "ok"
            shared, regs, spills = compiled.metadata.shared, compiled.n_regs, compiled.n_spills
        except Exception as exc:  # the point is to see which fail
            status, shared, regs, spills = type(exc).__name__ + ": " + str(exc)[:80], "-", "-", "-"
        print(config, "|", shared, "|", predicted, "|", regs, "|", spills, "|", status, flush=True)


if __name__ == "__main__":
    main()
