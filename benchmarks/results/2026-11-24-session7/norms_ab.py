"""Session 7 A/B of the LayerNorm / RMSNorm forwards against torch.compile on the GPU, one process.

The committed forwards load the weight (and bias) after the row's reductions, so each program
waits for them after its row; the variant below issues them with the row's load (HOIST), and
optionally marks the row's load and the output's store evict-first and the weights evict-last
(EVICT). Per shape, 5 rounds each time torch.compile and every (variant, config) once with
do_bench (L2 flushed); the table gives median times and per-round ratios to torch.compile.

    python benchmarks/results/2026-11-24-session7/norms_ab.py   (from the repo root, GPU machine)
"""
import pathlib
import statistics
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from _common import bench_ms
from _common import rel_error

from tunesvc.kernels.layernorm import launch_layernorm
from tunesvc.kernels.rmsnorm import launch_rmsnorm


@triton.jit
def _norm_fwd(X, Y, W, B, Stat1, Stat2, M, N, stride_x, stride_y, eps,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LAYER: tl.constexpr, HOIST: tl.constexpr,
              EVICT: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    r64 = rows.to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < M
    col_mask = cols < N
    mask = row_mask[:, None] & col_mask[None, :]
    x_policy: tl.constexpr = "evict_first" if EVICT else ""
    w_policy: tl.constexpr = "evict_last" if EVICT else ""
    x = tl.load(X + r64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0, eviction_policy=x_policy).to(tl.float32)
    if HOIST:
        w = tl.load(W + cols, mask=col_mask, other=0.0, eviction_policy=w_policy).to(tl.float32)
        if LAYER:
            b = tl.load(B + cols, mask=col_mask, other=0.0, eviction_policy=w_policy).to(tl.float32)
    if LAYER:
        mean = tl.sum(x, axis=1) / N
        xc = tl.where(mask, x - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / N + eps)
    else:
        xc = x
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)
    if not HOIST:
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
        if LAYER:
            b = tl.load(B + cols, mask=col_mask, other=0.0).to(tl.float32)
    y = xc * rstd[:, None] * w[None, :]
    if LAYER:
        y += b[None, :]
        tl.store(Stat1 + rows, mean, mask=row_mask)
    tl.store(Y + r64[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask, eviction_policy=x_policy)
    tl.store(Stat2 + rows, rstd, mask=row_mask)


def variant(op, x, w, b, cfg, hoist, evict):
    M, N = x.shape
    y = torch.empty_like(x)
    s1 = torch.empty(M, device=x.device, dtype=torch.float32)
    s2 = torch.empty(M, device=x.device, dtype=torch.float32)
    eps = 1e-5 if op == "layer_norm" else 1e-6
    _norm_fwd[(triton.cdiv(M, cfg["BLOCK_M"]),)](
        x, y, w, b, s1, s2, M, N, x.stride(0), y.stride(0), eps, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=triton.next_power_of_2(N),
        LAYER=op == "layer_norm", HOIST=hoist, EVICT=evict, num_warps=cfg["num_warps"])
    return y


CONFIGS = {  # the stored winners first, then their neighbours in the space
    (4096, 4096): [(2, 8), (1, 8), (1, 4), (1, 16)],
    (16384, 8192): [(1, 16), (2, 16), (1, 8), (1, 32)],
    (32768, 1024): [(4, 4), (8, 4), (2, 4), (4, 8), (1, 2)],
}


def main():
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    peers = {"layer_norm": torch.compile(lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5), dynamic=False),
             "rms_norm": torch.compile(lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6), dynamic=False)}
    for (M, N), configs in CONFIGS.items():
        x = (torch.randn(M, N, device="cuda") * 2 + 0.5).to(torch.bfloat16)
        w = (torch.randn(N, device="cuda") + 1).to(torch.bfloat16)
        b = torch.randn(N, device="cuda").to(torch.bfloat16)
        for op in ("layer_norm", "rms_norm"):
            ref = (F.layer_norm(x.float(), (N,), w.float(), b.float(), 1e-5) if op == "layer_norm"
                   else F.rms_norm(x.float(), (N,), w.float(), 1e-6))
            peer = (lambda: peers[op](x, w, b)) if op == "layer_norm" else (lambda: peers[op](x, w))
            runs = {}
            for bm, nw in configs:
                cfg = {"BLOCK_M": bm, "BLOCK_N": triton.next_power_of_2(N), "num_warps": nw}
                committed = ((lambda cfg=cfg: launch_layernorm(x, w, b, 1e-5, cfg)[0]) if op == "layer_norm"
                             else (lambda cfg=cfg: launch_rmsnorm(x, w, 1e-6, cfg)[0]))
                runs[f"committed {bm}x{nw}w"] = committed
                for hoist, evict in ((0, 0), (1, 0), (1, 1)):
                    runs[f"hoist={hoist} evict={evict} {bm}x{nw}w"] = (
                        lambda cfg=cfg, h=hoist, e=evict: variant(op, x, w, b, cfg, h, e))
            for name, fn in runs.items():
                err = rel_error(fn(), ref)
                assert err < 2e-2, (op, M, N, name, err)
            peer()
            times = {name: [] for name in runs}
            peer_ms = []
            for rnd in range(5):
                order = list(runs.items())
                if rnd % 2:
                    order.reverse()
                peer_ms.append(bench_ms(peer))
                for name, fn in order:
                    times[name].append(bench_ms(fn))
            compile_med = statistics.median(peer_ms)
            print(f"\n## {op} {M}x{N}: torch.compile median {compile_med * 1e3:.2f} us "
                  f"({min(peer_ms) * 1e3:.2f}-{max(peer_ms) * 1e3:.2f})")
            for name in sorted(runs, key=lambda n: statistics.median(times[n])):
                ratios = sorted(p / t for p, t in zip(peer_ms, times[name]))
                print(f"{name}: median {statistics.median(times[name]) * 1e3:.2f} us, compile/ours per round "
                      f"median {statistics.median(ratios):.3f}x ({ratios[0]:.3f}-{ratios[-1]:.3f})", flush=True)


if __name__ == "__main__":
    main()
