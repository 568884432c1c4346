"""Capture against triton.autotune, per kernel and key, in one run.

    python benchmarks/capture.py [--csv benchmarks/results/capture.csv] [--only fla_softmax ...]

Kernels: a grouped GEMM written here with the Triton tutorials' autotune configs (two keys),
and real libraries' triton.autotune kernels, launched as the libraries launch them (fla-core:
softmax, logsumexp with a heuristic above the autotuner, a 48-config chunked cumsum, the
causal-conv1d decode step that updates its cache in place;
liger-kernel: DyT, the MoE token gather-sum).

Each side runs in its own child process with an empty Triton cache (TRITON_CACHE_DIR), so both
compile everything: "tunesvc" under ``tunesvc.capture(db=...)`` (mode tune, an empty database;
worker processes compile the configs of a kernel that imports by name, so the libraries' and not
this script's own GEMM, which runs as __main__; ``--compile-workers N`` sets their number,
TUNESVC_COMPILE_WORKERS, 0 for none), "triton" as the libraries ship them. Per case each child
times the first call (wall clock, synchronised: triton.autotune's benchmark of every config
against tunesvc's check, timing and storing of every config) and prints the config its launch used
(``best_config``). Then this process times the two winners' kernels, each launched with its config
directly (no autotuner in the way), from CUDA graphs in interleaved rounds: tunesvc's winner must
not be slower than triton.autotune's by more than 2% (the script says so and exits 1 when it is).
Last, the hit path, both sides in this one process: host time per call over 200 calls with no
synchronisation between them (fewer than the launch queue holds, so the host never waits on the
GPU), a tunesvc hit (capture on, mode lookup) against a triton.autotune cache hit (capture off),
median of 20 interleaved loops. Rows are appended to the CSV (ratio = peer_ms / ours_ms: above 1,
tunesvc's side is faster or cheaper).

``--smoke`` runs tiny shapes on whatever device there is (the CPU interpreter included: there
Triton's autotuner is given a wall-clock benchmarker) to check the script, and writes no CSV.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# isort: off
import tunesvc  # without a GPU (--smoke) it selects Triton's interpreter, which must precede triton's import

# isort: on
import torch
import triton
import triton.language as tl
import triton.testing
from results_page import COLUMNS  # the benchmarks' one CSV layout (benchmarks/ is this script's path)
from results_page import columns_of
from triton.runtime.autotuner import Autotuner
from triton.runtime.autotuner import Heuristics

HERE = Path(__file__).resolve().parent
CSV = HERE / "results" / "capture.csv"
#: calls per hit-cost measurement: fewer than the launch queue holds, so the host never waits
#: for the GPU inside the timed loop; the median of HIT_REPEATS measurements is kept
HIT_CALLS = 200
HIT_REPEATS = 10
ROUNDS = 5
SLOWER_BY = 1.02
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# the Triton tutorials' CUDA configs for their matmul
MATMUL_CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=3, num_warps=8),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 256, "BLOCK_K": 32, "GROUP_M": 8}, num_stages=4, num_warps=4),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8}, num_stages=4, num_warps=4),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8}, num_stages=4, num_warps=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8}, num_stages=4, num_warps=4),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8}, num_stages=4, num_warps=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8}, num_stages=5, num_warps=2),
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8}, num_stages=5, num_warps=2),
]


@triton.autotune(configs=MATMUL_CONFIGS, key=["M", "N", "K"])
@triton.jit
def grouped_matmul(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """C = A @ B, fp32 accumulation; program ids walk GROUP_M row tiles per column of tiles (L2 reuse)."""
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * tiles_n)
    first_m = group * GROUP_M
    rows_in_group = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * tiles_n)) % rows_in_group
    pid_n = (pid % (GROUP_M * tiles_n)) // rows_in_group
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(
            a_ptr + offs_m[:, None] * stride_am + (k * BLOCK_K + offs_k)[None, :] * stride_ak,
            mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left),
            other=0.0,
        )
        b = tl.load(
            b_ptr + (k * BLOCK_K + offs_k)[:, None] * stride_bk + offs_n[None, :] * stride_bn,
            mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N),
            other=0.0,
        )
        acc = tl.dot(a, b, acc)
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(tl.float16), mask=c_mask)


@dataclass
class Case:
    """One kernel call, ``kernel[grid](*args, **kwargs)``, as its library makes it."""

    kernel: Any
    grid: Any
    args: tuple
    kwargs: dict[str, Any]
    out: torch.Tensor
    reference: Callable[[], torch.Tensor]
    shape: str

    def __call__(self) -> None:
        self.kernel[self.grid](*self.args, **self.kwargs)


def _randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, device=DEVICE, dtype=dtype)


def matmul(m: int, n: int, k: int) -> Case:
    a, b = _randn(m, k, dtype=torch.float16), _randn(k, n, dtype=torch.float16)
    c = torch.empty(m, n, device=DEVICE, dtype=torch.float16)
    args = (a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride())
    grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)
    return Case(grouped_matmul, grid, args, {}, c, lambda: a.double() @ b.double(), f"M={m},N={n},K={k},fp16")


def fla_softmax(rows: int, cols: int) -> Case:
    from fla.ops.utils.softmax import softmax_fwd_kernel

    x = _randn(rows, cols)
    p = torch.empty_like(x)
    kwargs = {"x": x, "p": p, "D": cols, "B": triton.next_power_of_2(cols)}
    return Case(
        softmax_fwd_kernel, (rows,), (), kwargs, p, lambda: torch.softmax(x.double(), -1), f"{rows}x{cols},fp32"
    )


def fla_logsumexp(rows: int, cols: int) -> Case:
    from fla.ops.utils.logsumexp import logsumexp_fwd_kernel

    x = _randn(rows, cols)
    block = min(triton.next_power_of_2(cols), 64 * 1024)
    z = torch.empty(rows, triton.cdiv(cols, block), device=DEVICE)
    kwargs = {"x": x, "z": z, "scale": 0.5, "D": cols, "B": block}
    grid = (rows, triton.cdiv(cols, block))
    reference = lambda: torch.logsumexp(0.5 * x.double(), -1, keepdim=True)
    return Case(logsumexp_fwd_kernel, grid, (), kwargs, z, reference, f"{rows}x{cols},scale,fp32")


def fla_cumsum(batch: int, length: int, heads: int) -> Case:
    from fla.ops.utils.cumsum import chunk_global_cumsum_scalar_kernel

    s = _randn(batch, length, heads)
    o = torch.empty_like(s)
    kwargs = {"s": s, "o": o, "scale": None, "cu_seqlens": None, "T": length, "B": batch, "H": heads, "REVERSE": True}
    reference = lambda: s.double().flip(1).cumsum(1).flip(1)
    return Case(
        chunk_global_cumsum_scalar_kernel,
        (batch * heads,),
        (),
        kwargs,
        o,
        reference,
        f"B={batch},T={length},H={heads},reverse",
    )


def fla_conv_update(tokens: int, dim: int, width: int) -> Case:
    """A decode step that rolls its cache in place (restore_value) on fla's Autotuner subclass."""
    from fla.modules.causal_conv1d.ops import causal_conv1d_update_kernel

    x, cache = _randn(tokens, dim, dtype=torch.bfloat16), _randn(tokens, dim, width, dtype=torch.bfloat16)
    weight, bias = _randn(dim, width, dtype=torch.bfloat16), _randn(dim, dtype=torch.bfloat16)
    rolled = torch.cat([cache[..., 1:], x[..., None]], -1).double()
    expected = (rolled * weight.double()).sum(-1) + bias.double()  # before the cache rolls
    y = torch.empty_like(x)
    kwargs = {
        "x": x,
        "cache": cache,
        "residual": None,
        "y": y,
        "weight": weight,
        "bias": bias,
        "stride_x_n": x.stride(0),
        "stride_x_d": x.stride(1),
        "stride_y_n": y.stride(0),
        "stride_y_d": y.stride(1),
        "D": dim,
        "W": width,
        "BW": triton.next_power_of_2(width),
        "ACTIVATION": None,
    }
    grid = lambda meta: (triton.cdiv(dim, meta["BD"]) * tokens,)
    return Case(
        causal_conv1d_update_kernel, grid, (), kwargs, y, lambda: expected, f"N={tokens},D={dim},W={width},bf16"
    )


def liger_dyt(rows: int, cols: int) -> Case:
    from liger_kernel.ops.dyt import _dyt_fwd_kernel

    x = _randn(rows, cols, dtype=torch.bfloat16)
    alpha, gamma, beta = _randn(1), _randn(cols), _randn(cols)
    y = torch.empty_like(x)
    grid = lambda meta: (triton.cdiv(cols, meta["BLOCK_N"]), rows)
    reference = lambda: torch.tanh(alpha.double() * x.double()) * gamma.double() + beta.double()
    return Case(_dyt_fwd_kernel, grid, (x, y, alpha, gamma, beta, True, cols), {}, y, reference, f"{rows}x{cols},bf16")


def liger_gather(tokens: int, topk: int, hidden: int) -> Case:
    from liger_kernel.ops.fused_moe_kernels import _token_gather_weighted_sum_kernel

    y = _randn(tokens * topk, hidden, dtype=torch.bfloat16)
    w = torch.rand(tokens * topk, device=DEVICE)
    reverse_scatter = torch.randperm(tokens * topk, device=DEVICE).to(torch.int32)
    out = torch.empty(tokens, hidden, device=DEVICE, dtype=torch.bfloat16)
    kwargs = {
        "H_dim": hidden,
        "K_dim": topk,
        "stride_Y_TK": y.stride(0),
        "stride_Y_H": y.stride(1),
        "stride_out_T": out.stride(0),
        "stride_out_H": out.stride(1),
        "w_is_None": False,
    }

    def reference() -> torch.Tensor:
        rows = y.double()[reverse_scatter.long()].view(tokens, topk, hidden)
        return (rows * w.double().view(tokens, topk, 1)).sum(1)

    args = (y, w, reverse_scatter, out)
    return Case(
        _token_gather_weighted_sum_kernel,
        (tokens,),
        args,
        kwargs,
        out,
        reference,
        f"T={tokens},K={topk},H={hidden},bf16",
    )


#: name -> (the case on a GPU, a tiny one for --smoke, or None where the interpreter cannot run it)
CASES: dict[str, tuple[Callable[[], Case], Callable[[], Case] | None]] = {
    "matmul_4096": (lambda: matmul(4096, 4096, 4096), lambda: matmul(37, 45, 29)),
    "matmul_odd": (lambda: matmul(1000, 3000, 777), lambda: matmul(21, 19, 33)),
    "fla_softmax": (lambda: fla_softmax(16384, 1000), lambda: fla_softmax(7, 45)),
    "fla_logsumexp": (lambda: fla_logsumexp(16384, 1000), lambda: fla_logsumexp(5, 83)),
    "fla_cumsum": (lambda: fla_cumsum(8, 4096, 16), lambda: fla_cumsum(1, 37, 1)),
    "fla_conv_update": (lambda: fla_conv_update(256, 4096, 4), lambda: fla_conv_update(3, 45, 4)),
    "liger_dyt": (lambda: liger_dyt(4096, 4096), None),  # libdevice tanh: not in the interpreter
    "liger_gather": (lambda: liger_gather(4096, 8, 2048), lambda: liger_gather(3, 2, 37)),
}


def autotuner_of(kernel: Any) -> Any:
    while not isinstance(kernel, Autotuner):
        kernel = kernel.fn
    return kernel


def config_dict(config: Any) -> dict[str, Any]:
    return {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}


def kernel_name(kernel: Any) -> str:
    """The name capture stores the kernel under (this script's own kernel: the script's path)."""
    fn = autotuner_of(kernel).base_fn
    return f"{fn.__module__}:{fn.__qualname__}".replace("__main__", "benchmarks/capture.py")


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.double().reshape(ref.shape)
    return ((out - ref).norm() / ref.norm()).item()


def _wall_clock_bench(kernel_call: Any, quantiles: Any = None, **_: Any) -> Any:
    start = time.perf_counter()
    kernel_call()
    ms = (time.perf_counter() - start) * 1e3
    return [ms] * len(quantiles) if quantiles else ms


def child(side: str, db: str, names: list[str], smoke: bool) -> None:
    """One side's first call and the config it chose, one JSON line per case."""
    if side == "tunesvc":
        tunesvc.capture(mode="tune", db=db)
    elif DEVICE == "cpu":
        # Triton's autotuner asks the GPU driver for a benchmarker; the interpreter has none
        Autotuner.do_bench = property(lambda self: _wall_clock_bench)  # type: ignore[assignment]
    for name in names:
        case = CASES[name][1 if smoke else 0]()
        sync()
        start = time.perf_counter()
        case()
        sync()
        first_s = time.perf_counter() - start
        error = relative_error(case.out, case.reference())
        line = {
            "case": name,
            "first_ms": first_s * 1e3,
            "config": config_dict(autotuner_of(case.kernel).best_config),
            "rel_error": error,
        }
        print(json.dumps(line), flush=True)


def launch_with(case: Case, config: dict[str, Any]) -> Callable[[], Any]:
    """``case`` launched with ``config`` straight into the jitted kernel: what @triton.heuristics
    above the autotuner add, then the config's meta-parameters and launch options."""
    kernel, kwargs = case.kernel, dict(case.kwargs)
    while not isinstance(kernel, Autotuner):
        if isinstance(kernel, Heuristics):
            for name, rule in kernel.values.items():
                kwargs[name] = rule({**dict(zip(kernel.arg_names, case.args)), **kwargs})
        kernel = kernel.fn
    (listed,) = [c for c in kernel.configs if config_dict(c) == config]
    meta = listed.all_kwargs()
    if listed.pre_hook is not None:
        listed.pre_hook({**dict(zip(kernel.arg_names, case.args)), **kwargs, **meta})
    inner = kernel.fn
    return lambda: inner.run(*case.args, grid=case.grid, warmup=False, **kwargs, **meta)


def kernel_times(ours: Callable[[], Any], peer: Callable[[], Any], smoke: bool) -> tuple[float, float]:
    """Median ms of ours and of the peer over interleaved rounds, each round from a CUDA graph
    (no launch overhead: the kernels alone)."""
    if smoke and DEVICE == "cpu":
        return _wall_clock_bench(ours), _wall_clock_bench(peer)
    times: dict[bool, list[float]] = {True: [], False: []}
    for r in range(1 if smoke else ROUNDS):
        for is_ours in (r % 2 == 0, r % 2 != 0):
            fn = ours if is_ours else peer
            times[is_ours].append(triton.testing.do_bench_cudagraph(fn, rep=100, quantiles=[0.5]))
    return statistics.median(times[True]), statistics.median(times[False])


def hit_costs(case: Case, db: str, smoke: bool) -> tuple[float, float]:
    """Host ms per call of a tunesvc hit and of a triton.autotune cache hit, both in this process:
    capture (mode lookup, the winner the tunesvc child stored) is switched on and off between
    interleaved rounds, so that both sides share one interpreter, one allocator and one clock."""
    calls, rounds = (5, 2) if smoke else (HIT_CALLS, HIT_REPEATS)
    times: dict[bool, list[float]] = {True: [], False: []}
    with tunesvc.capture(mode="lookup", db=db):
        case()  # resolves the key from the database and leaves its config in Triton's cache too
    for r in range(2 * rounds + 1):  # the first round warms both sides up
        for is_ours in (r % 2 == 0, r % 2 != 0):
            handle = tunesvc.capture(mode="lookup", db=db) if is_ours else None
            try:
                case()
                sync()
                start = time.perf_counter()
                for _ in range(calls):
                    case()
                elapsed = (time.perf_counter() - start) / calls
                sync()
            finally:
                if handle is not None:
                    handle.close()
            if r:
                times[is_ours].append(elapsed * 1e3)
    return statistics.median(times[True]), statistics.median(times[False])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=CSV)
    parser.add_argument("--only", nargs="+", choices=list(CASES), default=None)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument(
        "--compile-workers",
        type=int,
        default=None,
        help="the tunesvc side's TUNESVC_COMPILE_WORKERS (0: it compiles each config itself); default: its own choice",
    )
    parser.add_argument("--child", choices=["tunesvc", "triton"], help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = [n for n in (args.only or CASES) if not args.smoke or CASES[n][1] is not None]
    if args.child:
        child(args.child, args.db, names, args.smoke)
        return 0
    if DEVICE != "cuda" and not args.smoke:
        print("benchmarks/capture.py needs a CUDA GPU (or --smoke).", file=sys.stderr)
        return 1

    started = datetime.datetime.now(datetime.UTC)  # the run's name, as _common.record stamps its rows
    work = Path(tempfile.mkdtemp(prefix="capture-bench-"))
    db = str(work / "tune.db")
    sides: dict[str, dict[str, dict[str, Any]]] = {}
    for side in ("tunesvc", "triton"):
        env = {k: v for k, v in os.environ.items() if not k.startswith("TUNESVC_")}
        env["TRITON_CACHE_DIR"] = str(work / f"triton-cache-{side}")  # both compile every config
        if side == "tunesvc" and args.compile_workers is not None:
            env["TUNESVC_COMPILE_WORKERS"] = str(args.compile_workers)
        command = [sys.executable, __file__, "--child", side, "--db", db, "--only", *names]
        done = subprocess.run(command + (["--smoke"] if args.smoke else []), env=env, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"the {side} side failed:\n{done.stderr[-4000:]}", file=sys.stderr)
            return 1
        sides[side] = {r["case"]: r for r in map(json.loads, done.stdout.splitlines()) if r}

    device = tunesvc.current_device()
    common = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "run": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "gpu": device.name,
        "driver": device.driver,
        "torch": torch.__version__,
        "triton": triton.__version__,
    }
    rows: list[dict[str, Any]] = []
    slower = []
    print(
        "| kernel | shape | tuning s (ours / triton) | kernel ms (ours / triton) | hit us (ours / triton) | ours config | triton config |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in names:
        ours, peer = sides["tunesvc"][name], sides["triton"][name]
        for result in (ours, peer):
            if not result["rel_error"] <= 2e-2:
                print(f"{name}: relative error {result['rel_error']:.3g} against torch", file=sys.stderr)
                return 1
        case = CASES[name][1 if args.smoke else 0]()
        ours_ms, peer_ms = kernel_times(
            launch_with(case, ours["config"]), launch_with(case, peer["config"]), args.smoke
        )
        ours["hit_ms"], peer["hit_ms"] = hit_costs(case, db, args.smoke)
        if ours_ms > SLOWER_BY * peer_ms and not args.smoke:  # one interpreter run decides nothing
            slower.append(f"{name}: tunesvc's winner {ours_ms:.4f} ms, triton.autotune's {peer_ms:.4f} ms")
        kernel = kernel_name(case.kernel)
        measured = [
            (
                "triton.autotune first call (tuning)",
                ours["first_ms"],
                peer["first_ms"],
                "wall clock of the first call, synchronised; each side in a fresh process with an empty Triton cache"
                + ("" if args.compile_workers is None else f"; TUNESVC_COMPILE_WORKERS={args.compile_workers}"),
            ),
            (
                "triton.autotune winner (kernel time)",
                ours_ms,
                peer_ms,
                f"each winner launched directly; CUDA graph (do_bench_cudagraph median, inputs not flushed from L2), median of {ROUNDS} interleaved rounds",
            ),
            (
                "triton.autotune cache hit (host time per call)",
                ours["hit_ms"],
                peer["hit_ms"],
                f"host wall clock per call over {HIT_CALLS} calls with no synchronisation; both sides in one process "
                f"(capture switched on and off), median of {2 * HIT_REPEATS} interleaved loops",
            ),
        ]
        for peer_name, mine, theirs, method in measured:
            rows.append(
                common
                | {
                    "kernel": kernel,
                    "shape": case.shape,
                    "ours_ms": f"{mine:.6g}",
                    "peer": peer_name,
                    "peer_ms": f"{theirs:.6g}",
                    "ratio": f"{theirs / mine:.4f}",
                    "timing_method": method,
                }
            )
        print(
            f"| {kernel} | {case.shape} | {ours['first_ms'] / 1e3:.2f} / {peer['first_ms'] / 1e3:.2f} "
            f"| {ours_ms:.4f} / {peer_ms:.4f} | {ours['hit_ms'] * 1e3:.1f} / {peer['hit_ms'] * 1e3:.1f} "
            f"| {ours['config']} | {peer['config']} |"
        )
    if not args.smoke:
        new = not args.csv.exists()
        # an existing file is appended to in its own layout; one of another layout: one sentence,
        # and nothing appended to it
        columns = COLUMNS if new else columns_of(args.csv)
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with args.csv.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns, restval="")
            if new:
                writer.writeheader()
            writer.writerows(rows)
        print(f"{len(rows)} rows appended to {args.csv}")
    for line in slower:
        print(f"SLOWER by more than {SLOWER_BY - 1:.0%}: {line}")
    return 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())
