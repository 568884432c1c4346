"""A/B of this session's attention kernel choices on the GPU, side by side with torch SDPA in one
process: the forward with and without conditional rescaling (LAZY), the backward with pointer or
tensor-descriptor (TMA) loads in its inner loops, over the best configs of the H100 ground truth.

    python attn_ab.py   (from the repo root, GPU machine)

It ran against a working tree whose forward took LAZY (and PIPE, which Triton 3.6 compiled with
no overlap, so it was not timed) as constexpr flags: lazy_pipe_forward_variant.py.txt beside this
file holds those functions. LAZY measured slower on every config (attn_ab.log), so it was not
committed, and this script no longer runs against main as it is.

Each variant is first checked against the float32 reference on a ragged shape (B2 H3 S1000), then
timed with do_bench (median, L2 flushed) on B4 H32 S4096 D128 bf16, causal and not.
"""
import sys

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
from _common import bench_ms
from _common import rel_error

from tunesvc.kernels.attention import BWD_TEMPLATE
from tunesvc.kernels.attention import TEMPLATE
from tunesvc.kernels.attention import launch_attention
from tunesvc.kernels.attention import launch_attention_bwd
from tunesvc.kernels.attention import reference_attention

FWD = [
    dict(BLOCK_M=128, BLOCK_N=64, TMA=1, WS=0, num_warps=4, num_stages=2),
    dict(BLOCK_M=128, BLOCK_N=64, TMA=0, WS=0, num_warps=8, num_stages=3),
    dict(BLOCK_M=128, BLOCK_N=64, TMA=1, WS=0, num_warps=8, num_stages=2),
    dict(BLOCK_M=128, BLOCK_N=128, TMA=1, WS=1, num_warps=8, num_stages=3),
    dict(BLOCK_M=128, BLOCK_N=64, TMA=1, WS=1, num_warps=4, num_stages=2),
    dict(BLOCK_M=128, BLOCK_N=128, TMA=0, WS=0, num_warps=8, num_stages=3),
    dict(BLOCK_M=128, BLOCK_N=128, TMA=1, WS=0, num_warps=8, num_stages=3),
]
BWD = [
    dict(BLOCK_M1=64, BLOCK_N1=128, BLOCK_M2=128, BLOCK_N2=64, num_warps=8, num_stages=4),
    dict(BLOCK_M1=64, BLOCK_N1=128, BLOCK_M2=128, BLOCK_N2=32, num_warps=8, num_stages=3),
    dict(BLOCK_M1=32, BLOCK_N1=128, BLOCK_M2=128, BLOCK_N2=32, num_warps=8, num_stages=3),
    dict(BLOCK_M1=32, BLOCK_N1=128, BLOCK_M2=128, BLOCK_N2=32, num_warps=4, num_stages=5),
    dict(BLOCK_M1=64, BLOCK_N1=128, BLOCK_M2=128, BLOCK_N2=64, num_warps=8, num_stages=3),
]


def fwd_variants(causal):
    for c in FWD:
        if causal and c["WS"]:
            continue
        for lazy in (0, 1):
            yield dict(c, LAZY=lazy)


def bwd_variants():
    for c in BWD:
        for tma in (0, 1):
            yield dict(c, TMA=tma)


def fmt(c):
    return " ".join(f"{k}={v}" for k, v in c.items())


def main():
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    # correctness on a ragged shape first
    bad = 0
    for causal in (False, True):
        shape = (2, 3, 1000, 128)
        q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        ref_o, _ = reference_attention(q, k, v, causal=causal)
        ref_g = torch.stack(reference_attention(q, k, v, causal=causal, do=do))
        for c in [dict(FWD[0], LAZY=1), dict(FWD[2], LAZY=1), dict(FWD[1], LAZY=1)]:
            o, lse = launch_attention(q, k, v, c, causal=causal)
            e = rel_error(o, ref_o)
            bad += e > 1e-2
            print(f"check fwd causal={causal} {fmt(c)}: rel err {e:.2e}")
        o, lse = launch_attention(q, k, v, FWD[0], causal=causal)
        for c in [dict(BWD[0], TMA=1), dict(BWD[2], TMA=1)]:
            g = launch_attention_bwd(q, k, v, o, lse, do, c, causal=causal)
            e = rel_error(g, ref_g)
            bad += e > 1e-2
            print(f"check bwd causal={causal} {fmt(c)}: rel err {e:.2e}")
    print(f"{bad} variants over tolerance")

    B, H, S, D = 4, 32, 4096, 128
    for causal in (False, True):
        problem = TEMPLATE.problem(B=B, H=H, S=S, D=D, causal=causal, dtype="bfloat16")
        fflops = TEMPLATE.cost(problem).flops
        bflops = BWD_TEMPLATE.cost(problem).flops
        q, k, v, do = (torch.randn((B, H, S, D), device="cuda", dtype=torch.bfloat16) for _ in range(4))
        sdpa = bench_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
        sdpa_o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        print(f"\n## causal={causal}: SDPA forward {sdpa:.4f} ms = {fflops / sdpa / 1e9:.0f} TFLOP/s")
        for c in fwd_variants(causal):
            o, _ = launch_attention(q, k, v, c, causal=causal)
            ms = bench_ms(lambda: launch_attention(q, k, v, c, causal=causal))
            print(f"fwd {fmt(c)}: {ms:.4f} ms = {fflops / ms / 1e9:.0f} TFLOP/s, {sdpa / ms:.3f}x SDPA, rel diff to SDPA {rel_error(o, sdpa_o):.1e}")
        sdpa2 = bench_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
        print(f"SDPA forward again {sdpa2:.4f} ms")
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
        sdpa_b = bench_ms(lambda: torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True))
        sdpa_g = torch.stack(torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True))
        print(f"SDPA backward {sdpa_b:.4f} ms = {bflops / sdpa_b / 1e9:.0f} TFLOP/s")
        o, lse = launch_attention(q, k, v, FWD[0], causal=causal)
        for c in bwd_variants():
            g = launch_attention_bwd(q, k, v, o, lse, do, c, causal=causal)
            ms = bench_ms(lambda: launch_attention_bwd(q, k, v, o, lse, do, c, causal=causal))
            print(f"bwd {fmt(c)}: {ms:.4f} ms = {bflops / ms / 1e9:.0f} TFLOP/s, {sdpa_b / ms:.3f}x SDPA, rel diff to SDPA {rel_error(g, sdpa_g):.1e}")
        sdpa_b2 = bench_ms(lambda: torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True))
        print(f"SDPA backward again {sdpa_b2:.4f} ms")
        del out, qg, kg, vg, sdpa_g
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
