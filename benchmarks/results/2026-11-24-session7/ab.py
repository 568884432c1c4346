"""Session 7 A/B on the GPU, one process, peers timed beside ours:

1. split-K's arrival counters: zeroed per call (a memset before each launch, as committed before
   this session) against zeroed once per stream and reset by the kernel (this session), on the
   skinny GEMMs, GPU time from CUDA graphs over cycled inputs (``tunesvc.bench.graph_time``),
   cuBLAS beside them, three interleaved rounds;
2. the attention forward with a share of its exponentials computed by a polynomial on the FMA
   units instead of MUFU (FlashAttention-4's offload; ``attn_poly.patch`` beside this file adds
   the POLY flag to kernels/attention.py as committed with this script: 1 = half of every
   block's, 2 = half of every other block's), checked against the float64 reference first, then
   timed with do_bench beside SDPA (slower everywhere, so not committed to the kernel);
3. which kernels SDPA launches (torch.profiler), so the README can name its peer.

    python benchmarks/results/2026-11-24-session7/ab.py   (from the repo root, GPU machine)
"""
import importlib.util
import math
import pathlib
import shutil
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
import triton

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from _common import bench_ms  # noqa: E402
from _common import copies  # noqa: E402
from _common import rel_error  # noqa: E402

mm = importlib.import_module("tunesvc.kernels.matmul")  # the package re-exports a matmul function under the same name
from tunesvc.bench import graph_time  # noqa: E402


def load_attn_poly():
    """kernels/attention.py with attn_poly.patch applied (GNU patch), imported as a module."""
    out = pathlib.Path(tempfile.mkdtemp()) / "attn_poly.py"
    subprocess.run(["patch", "-s", "-o", str(out), str(HERE.parents[2] / "kernels" / "attention.py"),
                    str(HERE / "attn_poly.patch")], check=True)
    spec = importlib.util.spec_from_file_location("attn_poly", out)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


attn_poly = load_attn_poly()


def splitk_ab():
    print("## split-K arrival counters: memset per call (old) vs zeroed once, reset by the kernel (new)")
    cases = {
        (1, 4096, 4096): [mm._config("splitk", 16, 128, 32, 1, 4, 4, 6), mm._config("splitk", 16, 128, 32, 1, 8, 4, 6),
                          mm._config("splitk", 16, 64, 64, 1, 4, 4, 6)],
        (16, 4096, 4096): [mm._config("splitk", 16, 64, 128, 1, 2, 4, 6), mm._config("splitk", 16, 128, 64, 1, 4, 4, 6)],
        (64, 4096, 4096): [mm._config("splitk", 64, 64, 128, 1, 2, 4, 5)],
        (1, 14336, 4096): [mm._config("splitk", 16, 128, 64, 1, 2, 4, 6)],
    }
    cached = mm._arrivals

    def per_call(device, tiles):
        return torch.zeros(tiles, device=device, dtype=torch.int32)

    for (m, n, k), configs in cases.items():
        make = lambda: (torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
                        torch.randn(k, n, device="cuda", dtype=torch.bfloat16))
        sets = copies(make(), make)
        a, b = sets[0]
        ref = a.double() @ b.double()

        def graph_us(run):
            return graph_time([lambda x=x, y=y: run(x, y) for x, y in sets], 100, [0.5])[0] * 1e3

        for rnd in range(3):
            cublas = graph_us(torch.matmul)
            line = [f"{m}x{n}x{k} round {rnd}: cuBLAS {cublas:.2f} us"]
            for c in configs:
                name = f"{c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']}/{c['SPLIT_K']} s{c['num_stages']}"
                times = {}
                for label, arrivals in (("old", per_call), ("new", cached)):
                    mm._arrivals = arrivals
                    try:
                        err = ((mm.launch_matmul(a, b, c).double() - ref).norm() / ref.norm()).item()
                        assert err < 2e-2, (label, c, err)
                        times[label] = graph_us(lambda x, y: mm.launch_matmul(x, y, c))
                    finally:
                        mm._arrivals = cached
                line.append(f"{name} old {times['old']:.2f} new {times['new']:.2f} us "
                            f"(cuBLAS/new {cublas / times['new']:.3f}x, cuBLAS/old {cublas / times['old']:.3f}x)")
            print("; ".join(line), flush=True)
        del sets


FWD = [
    dict(BLOCK_M=128, BLOCK_N=64, TMA=1, WS=0, num_warps=4, num_stages=2),
    dict(BLOCK_M=128, BLOCK_N=128, TMA=1, WS=0, num_warps=8, num_stages=3),
    dict(BLOCK_M=128, BLOCK_N=64, TMA=0, WS=0, num_warps=8, num_stages=3),
    dict(BLOCK_M=128, BLOCK_N=128, TMA=1, WS=1, num_warps=8, num_stages=3),
]


def fmt(c):
    return " ".join(f"{k}={v}" for k, v in c.items())


def poly_ab():
    print("\n## attention forward: exponentials partly by polynomial (POLY 1: 1/2, 2: 1/4 of them)")
    bad = 0
    for causal in (False, True):
        q, k, v = (torch.randn((2, 3, 1000, 128), device="cuda", dtype=torch.bfloat16) for _ in range(3))
        s = q.double() @ k.double().transpose(-1, -2) / math.sqrt(128)
        if causal:
            s = s.masked_fill(torch.ones(1000, 1000, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
        ref = torch.softmax(s, -1) @ v.double()
        for c in FWD[:2]:
            for poly in (0, 1, 2):
                o, lse = attn_poly.launch_attention(q, k, v, dict(c, POLY=poly), causal=causal)
                e = rel_error(o, ref)
                le = (lse.double() - torch.logsumexp(s, -1)).abs().max().item()
                bad += e > 1e-2 or le > 1e-3
                print(f"check causal={causal} {fmt(c)} POLY={poly}: rel err {e:.2e}, LSE max abs err {le:.1e}")
    print(f"{bad} variants over tolerance", flush=True)
    B, H, S, D = 4, 32, 4096, 128
    for causal in (False, True):
        flops = 4 * B * H * S * S * D / (2 if causal else 1)
        q, k, v = (torch.randn((B, H, S, D), device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for rnd in range(2):
            sdpa = bench_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
            print(f"\ncausal={causal} round {rnd}: SDPA {sdpa:.4f} ms = {flops / sdpa / 1e9:.0f} TFLOP/s")
            for c in FWD:
                if causal and c["WS"]:
                    continue
                for poly in (0, 1, 2):
                    cfg = dict(c, POLY=poly)
                    ms = bench_ms(lambda: attn_poly.launch_attention(q, k, v, cfg, causal=causal))
                    print(f"fwd {fmt(cfg)}: {ms:.4f} ms = {flops / ms / 1e9:.0f} TFLOP/s, {sdpa / ms:.3f}x SDPA", flush=True)


def sdpa_kernels():
    print("\n## kernels SDPA launches (B4 H32 S4096 D128 bf16)")
    q, k, v = (torch.randn((4, 32, 4096, 128), device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile
    for causal in (False, True):
        F.scaled_dot_product_attention(q, k, v, is_causal=causal).sum().backward()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            out.sum().backward()
            torch.cuda.synchronize()
        names = sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})
        print(f"causal={causal}:")
        for name in names:
            print("  ", name[:200])
    print("ncu:", shutil.which("ncu"), "nsys:", shutil.which("nsys"))
    if shutil.which("ncu"):
        print(subprocess.run(["ncu", "--version"], capture_output=True, text=True).stdout)


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    what = sys.argv[1:] or ["splitk", "poly", "sdpa"]
    if "sdpa" in what:
        sdpa_kernels()
    if "splitk" in what:
        splitk_ab()
    if "poly" in what:
        poly_ab()
