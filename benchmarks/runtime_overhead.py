"""Host cost of the runtime: launches through tunesvc vs direct launches vs triton.autotune.

    python benchmarks/runtime_overhead.py            # on a GPU: bundle, lookup, launch paths + breakdown
    python benchmarks/runtime_overhead.py --cpu-only # bundle and lookup; the breakdown with no-op launches

Launch overhead: a tiny GEMM (64x64x64 fp16, cache hit), N launches timed on the host clock
with no sync between them (the launch path is what is measured), median of 41 interleaved rounds
(spread: the lowest and highest round), and the median of the per-round ratios (each round
times both sides within milliseconds of each other): the shipped ``tunesvc.kernels.matmul`` against
``launch_matmul`` with the same fixed config, and the same ``@triton.jit`` kernel three ways:
``kernel[grid]`` with a fixed config, under ``@tunesvc.autotune`` (config from a bundle) and under
``triton.autotune`` (both on a hit). The breakdown times each step of those paths alone. Without a
GPU (``--cpu-only``), the kernels' ``run`` is replaced by a no-op in this script (the interpreter
would time the kernel's arithmetic, not a launch), so the breakdown shows the host steps around it.
Bundle: a synthetic bundle of 10,000 winners (spread over the space's configs) written to disk,
then loaded by a fresh Runtime (time and memory measured with tracemalloc).
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import torch
import triton

import tunesvc
from tunesvc.bundle import FORMAT
from tunesvc.bundle import FORMAT_VERSION
from tunesvc.device import current_device
from tunesvc.serving.runtime import Runtime
from tunesvc.serving.runtime import default_runtime
from tunesvc.space import config_hash

# the module, not the function of the same name that tunesvc.kernels exports
matmul_module = importlib.import_module("tunesvc.kernels.matmul")
TEMPLATE = matmul_module.TEMPLATE
launch_matmul = matmul_module.launch_matmul


def timed(
    fns: dict, calls: int, repeats: int = 7, sync=None, samples: dict | None = None
) -> dict[str, tuple[float, float, float]]:
    """Per-call host time of each function: (median, lowest, highest) over rounds that take
    the functions in turn (in reverse order every other round), so a busy moment of the machine
    lands on all of them alike; ``samples`` receives each function's per-round times."""
    samples = {} if samples is None else samples
    samples.update({name: [] for name in fns})
    for fn in fns.values():
        fn()  # a kwargs order Triton has not seen is a new cache entry: compile it before timing
    for round_ in range(repeats):
        for name, fn in list(fns.items()) if round_ % 2 == 0 else list(fns.items())[::-1]:
            if sync:
                sync()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            if sync:
                sync()
            samples[name].append((time.perf_counter() - start) / calls * 1e6)
    return {name: (statistics.median(s), min(s), max(s)) for name, s in samples.items()}


def paired(samples: dict[str, list[float]], ours: str, base: str) -> str:
    """Median over rounds of each round's ours/base ratio (the two ran side by side in it),
    with the quartiles of those ratios: steadier than a ratio of two medians when rounds drift."""
    ratios = sorted(o / b for o, b in zip(samples[ours], samples[base]))
    q1, median, q3 = statistics.quantiles(ratios, n=4)
    return f"{median:.3f}x ({q1:.3f}-{q3:.3f})"


def us(t: tuple[float, float, float]) -> str:
    return f"{t[0]:.2f} us ({t[1]:.2f}-{t[2]:.2f})"


#: one config of the grouped kernel (_matmul_kernel) that suits a 64x64x64 GEMM
GROUPED = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 1, "num_warps": 4, "num_stages": 3}


def grid(meta):
    return (triton.cdiv(meta["M"], meta["BLOCK_M"]) * triton.cdiv(meta["N"], meta["BLOCK_N"]),)


def kernel_launchers(config: dict, bundle: Path):
    """kernel[grid](...) with a fixed config, the same call through @tunesvc.autotune (keyed like
    triton.autotune on M, N, K; configs from ``bundle``), and the decorated kernel.

    Both build the output and the grid the same way as benchmarks/matmul.py's triton.autotune
    peer, so the three differ only in how the config is chosen.
    """
    kernel = matmul_module._matmul_kernel.kernel  # Triton's JITFunction, not the shipped DirectLaunch
    decorated = tunesvc.autotune([config], key=["M", "N", "K"], name="matmul_decorated", bundle=bundle)(kernel)
    fixed = dict(config)

    def direct(a, b):
        M, K = a.shape
        N = b.shape[1]
        c = torch.empty((M, N), device=a.device, dtype=a.dtype)
        kernel[grid](
            a,
            b,
            c,
            M,
            N,
            K,
            N,  # NB: B's columns wrap modulo its own width, N where B is not padded
            a.stride(0),
            a.stride(1),
            b.stride(0),
            b.stride(1),
            c.stride(0),
            c.stride(1),
            DOT_IN_FP32=False,
            **fixed,
        )
        return c

    def through_tunesvc(a, b):
        M, K = a.shape
        N = b.shape[1]
        c = torch.empty((M, N), device=a.device, dtype=a.dtype)
        decorated[grid](
            a,
            b,
            c,
            M,
            N,
            K,
            N,  # NB: B's columns wrap modulo its own width, N where B is not padded
            a.stride(0),
            a.stride(1),
            b.stride(0),
            b.stride(1),
            c.stride(0),
            c.stride(1),
            DOT_IN_FP32=False,
        )
        return c

    return direct, through_tunesvc, decorated


def synthetic_bundle(
    path: Path, device, n: int, extra: dict | None = None, kernel: str = "matmul", version: str | None = None
) -> None:
    """A bundle of ``n`` winners spread over up to 600 of the matmul space's configs (a real
    bundle's winners differ; one config for all would make the file unrealistically small)."""
    problem = TEMPLATE.problem(M=4096, N=4096, K=4096)
    configs = list(itertools.islice(TEMPLATE.space.feasible({**problem, "elem_bytes": 2}, device.limits()), 600))
    configs = configs or [TEMPLATE.heuristic(problem, device)]
    winners = {f"M={1 << (i % 14)},N={64 + i},K=4096,dtype=bfloat16": configs[i % len(configs)] for i in range(n)}
    winners.update(extra or {})
    section = {"version": version or TEMPLATE.version, "torch": "", "triton": ""}
    if FORMAT_VERSION == 1:
        section["winners"] = {key: {"config": c, "time_ms": 0.1} for key, c in winners.items()}
    else:
        section["configs"] = {config_hash(c): c for c in winners.values()}
        section["winners"] = {key: {"config": config_hash(c), "time_ms": 0.1} for key, c in winners.items()}
    bundle = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "device": {
            "hardware_id": device.hardware_id,
            "name": device.name,
            "capability": device.capability,
            "sm_count": device.sm_count,
        },
        "kernels": {kernel: section},
    }
    path.write_text(json.dumps(bundle, indent=2, sort_keys=True))


def bundle_rows(device) -> list[tuple[str, str, str]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bundle.json"
        synthetic_bundle(path, device, 10_000)
        loads = []
        for _ in range(5):
            start = time.perf_counter()
            runtime = Runtime(bundle=path, device=device)
            hit = runtime.lookup("matmul", M=4096, N=76, K=4096, dtype="bfloat16")
            loads.append((time.perf_counter() - start) * 1e3)
        tracemalloc.start()  # a separate load, for memory: tracemalloc slows allocation down
        Runtime(bundle=path, device=device).lookup("matmul", M=4096, N=76, K=4096, dtype="bfloat16")
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert hit.source == "exact", hit
        size = path.stat().st_size / 2**20
        rows.append(
            (
                f"load a 10,000-winner bundle ({size:.1f} MB) + first lookup",
                f"{statistics.median(loads):.1f} ms ({min(loads):.1f}-{max(loads):.1f}, 5 loads)",
                "<= 50 ms",
            )
        )
        rows.append(("memory while loading it (tracemalloc peak)", f"{peak / 2**20:.1f} MB", "<= 20 MB"))
        lookup = timed({"": lambda: runtime.lookup("matmul", M=4096, N=76, K=4096, dtype="bfloat16")}, 20000, 9)[""]
        rows.append(("lookup() on a hit", us(lookup), "<= 1 us"))
        config_for = timed(
            {"": lambda: runtime.config_for(TEMPLATE, M=4096, N=76, K=4096, dtype=torch.bfloat16)}, 20000, 9
        )[""]
        rows.append(("config_for() on a hit", us(config_for), ""))
    return rows


def breakdown_rows(a: torch.Tensor, b: torch.Tensor, decorated, run_direct, run_decorated, sync, calls: int) -> list:
    """Each step of the two launch paths timed alone, and the paths' differences."""
    from tunesvc.kernels import matmul

    kernel = matmul_module._matmul_kernel.kernel  # Triton's JITFunction
    direct_launch = matmul_module._matmul_kernel  # what launch_matmul calls (tunesvc.serving.launch)
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    config = default_runtime().config_for(TEMPLATE, M=M, N=N, K=K, dtype=a.dtype)
    blocks = {k: config[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")}
    options = {k: config[k] for k in ("num_warps", "num_stages")}
    even_k = K % config["BLOCK_K"] == 0
    args = (a, b, c, M, N, K, N, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    stored = dict(
        decorated._configs[(M, N, K, a.dtype, a.get_device())]
    )  # the decorator's config, in the bundle's key order
    launcher = decorated[grid]
    rt = default_runtime()
    t = timed(
        {
            "matmul": lambda: matmul(a, b),
            "launch_matmul": lambda: launch_matmul(a, b, config),
            "kernel[(tiles,)]": lambda: kernel[(1,)](*args, **blocks, DOT_IN_FP32=False, EVEN_K=even_k, **options),
            "direct[(tiles,)]": lambda: direct_launch[(1,)](
                *args, **blocks, DOT_IN_FP32=False, EVEN_K=even_k, **options
            ),
            "kernel.run": lambda: kernel.run(
                *args, grid=(1,), warmup=False, **blocks, DOT_IN_FP32=False, EVEN_K=even_k, **options
            ),
            "empty": lambda: torch.empty((M, N), device=a.device, dtype=a.dtype),
            "strides": lambda: (a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1)),
            "cdiv": lambda: triton.cdiv(M, 64),
            "is_compiling": torch.compiler.is_compiling,
            "checks": lambda: a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0] or a.dtype != b.dtype,
            "config_for": lambda: rt.config_for(TEMPLATE, M=a.shape[0], N=b.shape[1], K=a.shape[1], dtype=a.dtype),
            "memo get": lambda: rt.launch_configs.get((TEMPLATE, a.shape, b.shape, a.dtype, b.dtype, a.get_device())),
            "direct kernel[grid]": lambda: run_direct(a, b),
            "decorated": lambda: run_decorated(a, b),
            "decorated[grid]": lambda: decorated[grid],
            "launcher(...)": lambda: launcher(*args, DOT_IN_FP32=False),
            "run, caller's order": lambda: kernel.run(*args, grid=grid, warmup=False, DOT_IN_FP32=False, **GROUPED),
            "run, stored order": lambda: kernel.run(*args, grid=grid, warmup=False, DOT_IN_FP32=False, **stored),
        },
        calls,
        9,
        sync,
    )

    def diff(x: str, y: str) -> str:
        return f"{t[x][0] - t[y][0]:.2f} us"

    return [
        ("tunesvc.kernels.matmul(a, b) (hit)", us(t["matmul"]), ""),
        ("launch_matmul(a, b, config)", us(t["launch_matmul"]), ""),
        ("  matmul - launch_matmul: our path (op routing, memo get)", diff("matmul", "launch_matmul"), ""),
        ("    torch.compiler.is_compiling()", us(t["is_compiling"]), ""),
        (
            "    runtime.launch_configs.get((TEMPLATE, a.shape, b.shape, a.dtype, b.dtype, a.get_device()))",
            us(t["memo get"]),
            "",
        ),
        ("    on a miss only: operand checks (ndim, shapes, dtypes)", us(t["checks"]), ""),
        ("    on a miss only: runtime.config_for(TEMPLATE, M=, N=, K=, dtype=) hit", us(t["config_for"]), ""),
        ("  the Triton launch: _matmul_kernel[(1,)](prebuilt args)", us(t["kernel[(tiles,)]"]), ""),
        ("  the same through DirectLaunch (a hit: the compiled kernel's launcher)", us(t["direct[(tiles,)]"]), ""),
        ("    of it, _matmul_kernel.run(...) alone", us(t["kernel.run"]), ""),
        (
            "  launch_matmul's own steps (launch_matmul - launch - empty)",
            f"{t['launch_matmul'][0] - t['kernel[(tiles,)]'][0] - t['empty'][0]:.2f} us",
            "",
        ),
        ("    torch.empty((M, N))", us(t["empty"]), ""),
        ("    six .stride() calls", us(t["strides"]), ""),
        ("    triton.cdiv(M, 64) (two per launch_matmul)", us(t["cdiv"]), ""),
        ("kernel[grid](...) with a fixed config (benchmark's direct)", us(t["direct kernel[grid]"]), ""),
        ("@tunesvc.autotune kernel (hit)", us(t["decorated"]), ""),
        ("  decorated - direct", diff("decorated", "direct kernel[grid]"), ""),
        ("    decorated[grid] (the launcher closure)", us(t["decorated[grid]"]), ""),
        ("    launcher(*args) (key, dict hit, kernel.run)", us(t["launcher(...)"]), ""),
        ("    kernel.run(**config) in the caller's key order", us(t["run, caller's order"]), ""),
        ("    kernel.run(**config) in the stored (sorted) key order", us(t["run, stored order"]), ""),
    ]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu-only", action="store_true")
    args = parser.parse_args()
    device = current_device()
    rows = bundle_rows(device)
    on_gpu = not args.cpu_only and device.is_gpu
    where = "cuda" if on_gpu else "cpu"
    if not on_gpu:
        # the launch itself is a no-op here: the interpreter would run the GEMM's arithmetic
        matmul_module._matmul_kernel.kernel.run = lambda *args, **kwargs: None

    from tunesvc.kernels import matmul

    a = torch.randn(64, 64, device=where, dtype=torch.float16)
    b = torch.randn(64, 64, device=where, dtype=torch.float16)
    problem = TEMPLATE.problem(M=64, N=64, K=64)
    config = TEMPLATE.heuristic(problem, device)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tiny.json"
        synthetic_bundle(path, device, 0, extra={str(TEMPLATE.key(problem)): config})
        tunesvc.configure(bundle=path)
        assert tunesvc.lookup("matmul", **problem).source == "exact"
        path = Path(tmp) / "decorated.json"
        run_direct, run_decorated, decorated = kernel_launchers(GROUPED, path)
        # the bundle is read at the first miss, so it may be written after the decoration
        synthetic_bundle(
            path,
            device,
            0,
            kernel="matmul_decorated",
            version=decorated.template.version,
            extra={"M=64,N=64,K=64,dtype=float16": GROUPED},
        )
        run_decorated(a, b)  # the miss: looks the key up in the bundle once
        assert decorated.last.source == "exact", decorated.last
    run_direct(a, b)  # compiles the fixed config
    matmul(a, b)
    sync = torch.cuda.synchronize if on_gpu else None
    if on_gpu:
        # the autotune peer is the one benchmarks/matmul.py uses (same kernel, tutorial configs)
        from matmul import autotuned_matmul

        run_autotuned, _ = autotuned_matmul()
        run_autotuned(a, b)  # tunes once; later calls are autotune cache hits
        rounds: dict[str, list[float]] = {}
        t = timed(
            {
                "direct": lambda: launch_matmul(a, b, config),
                "ours": lambda: matmul(a, b),
                "raw": lambda: run_direct(a, b),
                "decorated": lambda: run_decorated(a, b),
                "autotuned": lambda: run_autotuned(a, b),
            },
            500,
            41,
            sync,
            samples=rounds,
        )
        direct, ours, raw, dec, auto = (t[k][0] for k in ("direct", "ours", "raw", "decorated", "autotuned"))
        rows.append(("launch: direct launch_matmul, fixed config", us(t["direct"]), ""))
        rows.append(("launch: tunesvc.kernels.matmul (hit)", us(t["ours"]), f"{ours / direct:.3f}x direct (<= 1.05x)"))
        rows.append(
            ("  the same, median of per-round ratios (quartiles)", paired(rounds, "ours", "direct"), "<= 1.05x")
        )
        rows.append(("launch: kernel[grid](...), fixed config", us(t["raw"]), ""))
        rows.append(
            ("launch: @tunesvc.autotune kernel (hit)", us(t["decorated"]), f"{dec / raw:.3f}x kernel[grid] (<= 1.05x)")
        )
        rows.append(
            ("  the same, median of per-round ratios (quartiles)", paired(rounds, "decorated", "raw"), "<= 1.05x")
        )
        rows.append(("launch: triton.autotune kernel (hit)", us(t["autotuned"]), f"{auto / raw:.3f}x kernel[grid]"))
        rows.append(("  the same, median of per-round ratios (quartiles)", paired(rounds, "autotuned", "raw"), ""))
    breakdown = breakdown_rows(a, b, decorated, run_direct, run_decorated, sync, 2000 if on_gpu else 5000)
    print(f"\n{device.name}, torch {torch.__version__}, triton {triton.__version__}, {time.strftime('%Y-%m-%d')}\n")
    print("| what | measured (median of rounds, lowest-highest) | target |")
    print("|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(
        f"\nBreakdown ({'GPU launches' if on_gpu else 'Triton launch replaced by a no-op'}); "
        "an indented step is part of the line above it:\n"
    )
    print("| step | host time per call |")
    print("|---|---|")
    for name, value, _ in breakdown:
        print(f"| {name} | {value} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
