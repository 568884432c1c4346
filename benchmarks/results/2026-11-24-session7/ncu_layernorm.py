"""One launch each of our tuned LayerNorm forward and torch.compile's (16384x8192 bf16) between
cudaProfilerStart/Stop, for Nsight Compute run with --profile-from-start off; with
TORCH_LOGS=output_code, Inductor also prints the Triton kernel it generated.

    TORCH_LOGS=output_code ncu --profile-from-start off --section SpeedOfLight ... python ncu_layernorm.py
"""
import torch
import torch.nn.functional as F

from tunesvc.kernels.layernorm import launch_layernorm

CONFIG = {"BLOCK_M": 1, "BLOCK_N": 8192, "num_warps": 8}  # the stored winner of this session
M, N = 16384, 8192
x = (torch.randn(M, N, device="cuda") * 2 + 0.5).to(torch.bfloat16)
w = (torch.randn(N, device="cuda") + 1).to(torch.bfloat16)
b = torch.randn(N, device="cuda").to(torch.bfloat16)
compiled = torch.compile(lambda x, w, b: F.layer_norm(x, (N,), w, b, 1e-5), dynamic=False)
for _ in range(2):
    launch_layernorm(x, w, b, 1e-5, CONFIG)
    compiled(x, w, b)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
launch_layernorm(x, w, b, 1e-5, CONFIG)
compiled(x, w, b)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
