"""A/B of the attention backward on the GPU, side by side with SDPA's backward in one process:
the two-kind kernel (dK/dV programs and dQ programs, no atomics) against ATOMIC_DQ=1 (dK/dV
programs only, each adding its dS K share of dQ into a float32 accumulator, FlashAttention-2/3's
scheme), with pointer or tensor-descriptor (TMA) loads.

    python attn_bwd_ab.py   (GPU machine)

It ran against a working tree whose backward took ATOMIC_DQ as a flag: the dK/dV loop also did

    dq = tl.dot(tl.trans(dsT), k)              # dsT cast to bf16 once, shared with dK
    DQA.atomic_add([curr_m, 0], dq)            # TMA=1: cp.reduce.async.bulk into float32 dQ
    tl.atomic_add(DQA + offsets, dq, sem="relaxed")   # TMA=0 (atom.global.add.v4.f32)

into a zeroed float32 (B, H, S, D) buffer, scaled and cast by torch.mul(..., out=dQ) after the
launch, and the grid held the dK/dV programs alone. It measured 10% slower at best than the
two-kind kernel (attn_bwd_ab.log), so it was not committed, and this script no longer runs against main.

Each variant is checked against the float32 reference on a ragged shape (B2 H3 S1000 D128), then
timed with do_bench (median, L2 flushed) on B4 H32 S4096 D128 bf16, causal and not.
"""
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from _common import bench_ms
from _common import rel_error

from tunesvc.kernels.attention import BWD_TEMPLATE
from tunesvc.kernels.attention import launch_attention
from tunesvc.kernels.attention import launch_attention_bwd
from tunesvc.kernels.attention import reference_attention

FWD = dict(BLOCK_M=128, BLOCK_N=64, TMA=1, WS=0, num_warps=4, num_stages=2)
TWO_KIND = [
    dict(BLOCK_M1=64, BLOCK_N1=128, BLOCK_M2=128, BLOCK_N2=64, TMA=0, ATOMIC_DQ=0, num_warps=8, num_stages=3),
    dict(BLOCK_M1=64, BLOCK_N1=128, BLOCK_M2=128, BLOCK_N2=64, TMA=1, ATOMIC_DQ=0, num_warps=8, num_stages=3),
    dict(BLOCK_M1=64, BLOCK_N1=128, BLOCK_M2=128, BLOCK_N2=64, TMA=0, ATOMIC_DQ=0, num_warps=8, num_stages=4),
]
ATOMIC = [
    dict(BLOCK_M1=m1, BLOCK_N1=128, BLOCK_M2=64, BLOCK_N2=16, TMA=tma, ATOMIC_DQ=1, num_warps=8, num_stages=st)
    for m1, st in ((64, 2), (64, 3), (32, 2), (32, 3), (32, 4), (16, 4))
    for tma in (0, 1)
]


def fmt(c):
    return " ".join(f"{k}={v}" for k, v in c.items())


def main():
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    bad = 0
    for causal in (False, True):
        shape = (2, 3, 1000, 128)
        q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        ref_g = torch.stack(reference_attention(q, k, v, causal=causal, do=do))
        o, lse = launch_attention(q, k, v, FWD, causal=causal)
        for c in [TWO_KIND[1]] + ATOMIC[:4]:
            g = launch_attention_bwd(q, k, v, o, lse, do, c, causal=causal)
            errs = [rel_error(g[i], ref_g[i]) for i in range(3)]
            bad += max(errs) > 1e-2
            print(f"check causal={causal} {fmt(c)}: rel err dQ dK dV " + " ".join(f"{e:.2e}" for e in errs))
    print(f"{bad} variants over tolerance")

    B, H, S, D = 4, 32, 4096, 128
    for causal in (False, True):
        problem = BWD_TEMPLATE.problem(B=B, H=H, S=S, D=D, causal=causal, dtype="bfloat16")
        flops = BWD_TEMPLATE.cost(problem).flops
        q, k, v, do = (torch.randn((B, H, S, D), device="cuda", dtype=torch.bfloat16) for _ in range(4))
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
        sdpa = bench_ms(lambda: torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True))
        sdpa_g = torch.stack(torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True))
        print(f"\n## causal={causal}: SDPA backward {sdpa:.4f} ms = {flops / sdpa / 1e9:.0f} TFLOP/s")
        o, lse = launch_attention(q, k, v, FWD, causal=causal)
        for c in TWO_KIND + ATOMIC:
            try:
                g = launch_attention_bwd(q, k, v, o, lse, do, c, causal=causal)
                ms = bench_ms(lambda: launch_attention_bwd(q, k, v, o, lse, do, c, causal=causal))
            except Exception as e:  # out of resources: report and go on
                print(f"bwd {fmt(c)}: failed: {str(e).splitlines()[0][:160]}")
                continue
            print(f"bwd {fmt(c)}: {ms:.4f} ms = {flops / ms / 1e9:.0f} TFLOP/s, {sdpa / ms:.3f}x SDPA, rel diff to SDPA {rel_error(g, sdpa_g):.1e}")
        sdpa2 = bench_ms(lambda: torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True))
        print(f"SDPA backward again {sdpa2:.4f} ms")
        del out, qg, kg, vg, sdpa_g
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
