"""One launch each of our tuned attention forward and SDPA's (B4 H32 S4096 D128 bf16, non-causal
and causal) between cudaProfilerStart/Stop, for Nsight Compute run with --profile-from-start off:

    ncu --profile-from-start off --section SpeedOfLight --section WarpStateStats ... python ncu_attn.py
"""
import torch
import torch.nn.functional as F

from tunesvc.kernels.attention import launch_attention

CONFIG = dict(BLOCK_M=128, BLOCK_N=64, TMA=1, WS=0, num_warps=4, num_stages=2)  # the stored winner, both settings
q, k, v = (torch.randn((4, 32, 4096, 128), device="cuda", dtype=torch.bfloat16) for _ in range(3))
for causal in (False, True):
    launch_attention(q, k, v, CONFIG, causal=causal)
    F.scaled_dot_product_attention(q, k, v, is_causal=causal)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for causal in (False, True):
    launch_attention(q, k, v, CONFIG, causal=causal)
    F.scaled_dot_product_attention(q, k, v, is_causal=causal)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
