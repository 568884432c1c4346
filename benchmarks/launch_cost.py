"""Host cost of one eager call of each shipped kernel against its torch peer, on small problems.

    python benchmarks/launch_cost.py [--calls 200] [--rounds 21]

Host time per call: after a warm-up (compile, lookup miss), a loop of ``--calls`` calls with no
synchronisation inside it, on the host clock (``time.perf_counter``), from a synchronised start;
on these small problems the GPU keeps up, so the loop measures the launch path. Eager end to end:
the same loop followed by ``torch.cuda.synchronize()``, per call. Each figure is the median over
``--rounds`` rounds that time ours and the peer side by side (order alternating).

Besides the families: a bare ``kernel[grid](...)`` launch of one ``@triton.jit`` kernel against
the same kernel under ``@tunesvc.autotune`` (a hit; its config from a bundle) and through
:class:`tunesvc.serving.launch.DirectLaunch`. Rows go to benchmarks/results/launch_cost.csv with
``timing_method`` ``host_per_call``, ``eager_sync`` or ``gpu_time`` (the GPU time of one call,
replayed from a CUDA graph: whether the GPU work is at parity); ours_ms and peer_ms per call,
ratio = peer / ours.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl
from _common import print_table
from _common import record
from _common import require_gpu
from runtime_overhead import synthetic_bundle

import tunesvc
import tunesvc.kernels as K
from tunesvc import _capture as tunesvc_capture
from tunesvc._capture import config_dict
from tunesvc._capture import key_text
from tunesvc.device import current_device
from tunesvc.serving.launch import DirectLaunch


def per_call_ms(fn: Callable[[], Any], calls: int, sync: bool) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    if sync:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    if not sync:
        torch.cuda.synchronize()  # the queue drains outside the timed loop
    return elapsed / calls * 1e3


def side_by_side(ours: Callable[[], Any], peer: Callable[[], Any], calls: int, rounds: int, sync: bool):
    """Median per-call ms of ours and the peer, and the median of the rounds' peer/ours ratios."""
    for _ in range(3):  # warm-up: compiles, lookups, torch's own first-call work
        ours(), peer()
    torch.cuda.synchronize()
    ours_ms, peer_ms = [], []
    for r in range(rounds):
        if r % 2 == 0:
            ours_ms.append(per_call_ms(ours, calls, sync))
            peer_ms.append(per_call_ms(peer, calls, sync))
        else:
            peer_ms.append(per_call_ms(peer, calls, sync))
            ours_ms.append(per_call_ms(ours, calls, sync))
    ratios = [p / o for o, p in zip(ours_ms, peer_ms)]
    return statistics.median(ours_ms), statistics.median(peer_ms), statistics.median(ratios)


def gpu_time(ours: Callable[[], Any], peer: Callable[[], Any]) -> tuple[float, float] | None:
    """GPU time per call (ms) of ours and the peer, each call replayed from a CUDA graph
    (``triton.testing.do_bench_cudagraph``) on the loop's inputs: whether the GPU work is at
    parity, which the eager end-to-end target presumes. None (said why) where one cannot be captured."""
    try:
        return (
            triton.testing.do_bench_cudagraph(ours, rep=50),
            triton.testing.do_bench_cudagraph(peer, rep=50),
        )
    except Exception as exc:  # a capture this case's peer or ours does not allow: no row
        print(f"gpu_time: no CUDA graph capture ({type(exc).__name__}: {exc})", flush=True)
        return None


def family_cases(dtype: torch.dtype) -> list[tuple[str, str, str, Callable[[], Any], Callable[[], Any]]]:
    """(kernel, shape, peer name, ours, peer) on small problems, inputs built once."""
    dev = "cuda"
    cases = []
    a = torch.randn(3, 4096, device=dev, dtype=dtype)
    b = torch.randn(4096, 4096, device=dev, dtype=dtype)
    cases.append(("matmul", "M=3,N=4096,K=4096", "torch.matmul", lambda: K.matmul(a, b), lambda: torch.matmul(a, b)))

    B, HQ, HKV, S, D = 3, 32, 8, 512, 128
    q = torch.randn(B, HQ, D, device=dev, dtype=dtype)
    kc = torch.randn(B, S, HKV, D, device=dev, dtype=dtype)
    vc = torch.randn(B, S, HKV, D, device=dev, dtype=dtype)
    seq_lens = torch.full((B,), S, device=dev, dtype=torch.int32)
    # the peer: SDPA over the whole cache with KV heads repeated (what a model without a decode kernel runs)
    qs, ks, vs = q[:, :, None], kc.transpose(1, 2), vc.transpose(1, 2)

    def sdpa_decode() -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)

    cases.append(
        (
            "decode",
            f"B={B},HQ={HQ},HKV={HKV},S={S},D={D}",
            "torch SDPA (enable_gqa)",
            lambda: K.decode_attention(q, kc, vc, seq_lens),
            sdpa_decode,
        )
    )

    qa, ka, va = (torch.randn(1, 16, 1000, 128, device=dev, dtype=dtype) for _ in range(3))
    cases.append(
        (
            "attention",
            "B=1,H=16,S=1000,D=128,fwd",
            "torch SDPA",
            lambda: K.attention(qa, ka, va),
            lambda: torch.nn.functional.scaled_dot_product_attention(qa, ka, va),
        )
    )

    x = torch.randn(8, 4096, device=dev, dtype=dtype)
    w = torch.randn(4096, device=dev, dtype=dtype)
    bias = torch.randn(4096, device=dev, dtype=dtype)
    cases.append(
        (
            "layernorm",
            "M=8,N=4096",
            "torch F.layer_norm",
            lambda: K.layer_norm(x, w, bias),
            lambda: torch.nn.functional.layer_norm(x, (4096,), w, bias),
        )
    )
    cases.append(
        (
            "rmsnorm",
            "M=8,N=4096",
            "torch F.rms_norm",
            lambda: K.rms_norm(x, w),
            lambda: torch.nn.functional.rms_norm(x, (4096,), w, 1e-6),
        )
    )
    cases.append(("softmax", "M=8,N=4096", "torch.softmax", lambda: K.softmax(x), lambda: torch.softmax(x, dim=-1)))
    return cases


@triton.jit
def _add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def decorator_cases() -> list[tuple[str, str, str, Callable[[], Any], Callable[[], Any]]]:
    """A 5-argument kernel: bare kernel[grid] (the peer) against @tunesvc.autotune and DirectLaunch."""
    n = 4096
    x, y, out = (torch.randn(n, device="cuda") for _ in range(3))
    grid = (triton.cdiv(n, 1024),)
    # two configs: with one, @tunesvc.autotune leaves the kernel to Triton (nothing to choose)
    configs = [triton.Config({"BLOCK": 1024}, num_warps=4, num_stages=2), triton.Config({"BLOCK": 512}, num_warps=4)]
    bundle = Path(tempfile.mkdtemp()) / "add.json"
    decorated = tunesvc.autotune(configs, key=["n"], name="launch_cost_add", bundle=bundle)(_add_kernel)
    # Triton's key of this call (n, then each tensor's dtype), as the store writes it
    key = key_text(["n"], (n, "torch.float32", "torch.float32", "torch.float32"), ["x_ptr", "y_ptr", "out_ptr"])
    version = decorated.__dict__["_tunesvc"].template.version
    # the bundle is read at the first miss, so it may be written after the decoration
    synthetic_bundle(
        bundle, current_device(), 0, kernel="launch_cost_add", version=version, extra={key: config_dict(configs[0])}
    )
    direct = DirectLaunch(_add_kernel)
    # the same kernel tuned over a declared space (tunesvc's own Template path); mode heuristic:
    # the hit path is the same whichever way the config was found
    spaced = tunesvc.autotune(
        space=[{"BLOCK": 1024, "num_warps": 4, "num_stages": 2}, {"BLOCK": 512, "num_warps": 4, "num_stages": 2}],
        key=["n"],
        name="launch_cost_add_space",
        mode="heuristic",
        dtype_arg="x_ptr",
    )(_add_kernel)

    def bare() -> None:
        _add_kernel[grid](x, y, out, n, BLOCK=1024, num_warps=4, num_stages=2)

    def through_autotune() -> None:
        decorated[grid](x, y, out, n)

    def through_space() -> None:
        spaced[grid](x, y, out, n)

    def through_direct() -> None:
        direct[grid](x, y, out, n, BLOCK=1024, num_warps=4, num_stages=2)

    stored = tunesvc_capture.STATS["stored"]
    through_autotune()  # the miss: finds the key in the bundle
    if tunesvc_capture.STATS["stored"] != stored + 1 or decorated.best_config is not configs[0]:
        print("@tunesvc.autotune did not hit its bundle; its row times a fallback", file=sys.stderr)
    return [
        ("@tunesvc.autotune hit", f"n={n}", "kernel[grid]", through_autotune, bare),
        ("@tunesvc.autotune(space=) hit", f"n={n}", "kernel[grid]", through_space, bare),
        ("DirectLaunch hit", f"n={n}", "kernel[grid]", through_direct, bare),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--db", help="a database of tuned winners (default: the runtime's usual source)")
    parser.add_argument("--sweep", action="store_true", help="ignored (gpu-run.sh passes it to every step)")
    args = parser.parse_args()
    require_gpu("launch_cost.py")
    if args.db and Path(args.db).exists():
        tunesvc.configure(db=args.db)
    dtype = getattr(torch, args.dtype)
    rows, table = [], []

    def add(kernel: str, shape: str, peer: str, method: str, ours_ms: float, peer_ms: float, ratio: float) -> None:
        rows.append(
            {
                "kernel": kernel,
                "shape": shape,
                "ours_ms": ours_ms,
                "peer": peer,
                "peer_ms": peer_ms,
                "ratio": ratio,
                "timing_method": method,
            }
        )
        table.append([kernel, shape, method, f"{ours_ms * 1e3:.1f}", f"{peer_ms * 1e3:.1f}", f"{ratio:.2f}", peer])
        print(f"{kernel} {shape} {method}: ours {ours_ms * 1e3:.1f} us, {peer} {peer_ms * 1e3:.1f} us", flush=True)

    with torch.no_grad():
        cases = family_cases(dtype) + decorator_cases()
        for kernel, shape, peer, ours, theirs in cases:
            for method, sync in (("host_per_call", False), ("eager_sync", True)):
                add(kernel, shape, peer, method, *side_by_side(ours, theirs, args.calls, args.rounds, sync))
            gpu = gpu_time(ours, theirs)
            if gpu is not None:
                ours_ms, peer_ms = gpu
                add(kernel, shape, peer, "gpu_time", ours_ms, peer_ms, peer_ms / ours_ms)
    # which config source each family's lookups took (an untuned shape runs the heuristic)
    print("lookups by source:", tunesvc.serving.runtime.default_runtime().stats())
    print_table(
        "Host cost per eager call (us; ratio = peer / ours, > 1: ours is cheaper)",
        ["kernel", "shape", "timing", "ours us", "peer us", "ratio", "peer"],
        table,
    )
    record("launch_cost", rows)
    return 0


if __name__ == "__main__":
    importlib.import_module("tunesvc.kernels")
    sys.exit(main())
