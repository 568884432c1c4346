"""Where the time of a GEMM with unaligned K goes (1000x3000x777 bf16), TMA variant vs the others.

    python benchmarks/matmul_unaligned.py --db tune.db

The TMA variant needs 16-byte aligned rows, so A (K=777 bf16) is first copied into a row-padded
buffer. On the H100 one run of benchmarks/matmul.py timed this shape's tuned TMA config at 26 us
and a later run, same code and config, at 97 us. This script times the pieces in one process,
each three times (do_bench median, L2 flushed), once replayed from a CUDA graph, and its host time
per launch (launches back to back, no sync): the whole
launch for M=1000 and for M=1024 (the shape key's bucket, which the sweep measured), the kernel
alone on a pre-padded A, the padding copy alone, the best stored config of every other variant,
and cuBLAS.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from _common import bench_graph_ms
from _common import bench_ms
from _common import print_table
from _common import rel_error
from _common import require_gpu

from tunesvc.device import current_device
from tunesvc.kernels.matmul import TEMPLATE
from tunesvc.kernels.matmul import _aligned_copy
from tunesvc.kernels.matmul import launch_matmul
from tunesvc.store import Store


def best_per_variant(db: str, key: str) -> dict[str, dict]:
    """The fastest correct stored config of each variant for this shape key on this device."""
    store = Store(db)
    try:
        kv = store.kernel_version_id(TEMPLATE)
        dev = store.device_id(current_device())
        best: dict[str, tuple[float, dict]] = {}
        for row in store.trials(kv, dev, key):
            if row.status != "ok":
                continue
            variant = row.config.get("VARIANT", "grouped")
            if variant not in best or row.time_ms < best[variant][0]:
                best[variant] = (row.time_ms, dict(row.config))
        return {v: c for v, (_, c) in sorted(best.items())}
    finally:
        store.close()


def host_us(fn, calls: int = 200) -> float:
    """Host time per call in us: calls launched back to back with no sync between them."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    return 1e6 * host / calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="tune.db")
    args = parser.parse_args()
    require_gpu("benchmarks/matmul_unaligned.py")
    n, k = 3000, 777
    key = str(TEMPLATE.key(TEMPLATE.problem(M=1000, N=n, K=k, dtype="bfloat16")))
    configs = best_per_variant(args.db, key)
    if "tma" not in configs:
        print(
            f"no stored tma trial for {key} in {args.db}: sweep it first (benchmarks/matmul.py --sweep)",
            file=sys.stderr,
        )
        return 1
    rows = []
    for m in (1000, 1024):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        ref = a.float() @ b.float()
        padded = _aligned_copy(a)
        flops = 2 * m * n * k
        cases = [(f"{v} (whole launch)", lambda c=c: launch_matmul(a, b, c), c) for v, c in configs.items()]
        cases += [
            ("tma kernel on a pre-padded A", lambda: launch_matmul(padded, b, configs["tma"]), configs["tma"]),
            ("padding copy of A alone", lambda: _aligned_copy(a), None),
            ("cuBLAS torch.matmul", lambda: torch.matmul(a, b), None),
        ]
        for name, fn, config in cases:
            out = fn()
            err = f"{rel_error(out, ref):.1e}" if out.shape == ref.shape else "-"
            times = [bench_ms(fn) for _ in range(3)]
            graph = bench_graph_ms(fn)
            host = host_us(fn)
            tflops = "-" if config is None and "cuBLAS" not in name else f"{flops / (min(times) * 1e9):.0f}"
            rows.append(
                [
                    f"{m}x{n}x{k}",
                    name,
                    " / ".join(f"{1e3 * t:.1f}" for t in times),
                    f"{1e3 * graph:.1f}",
                    f"{host:.1f}",
                    tflops,
                    err,
                    config or "-",
                ]
            )
    print_table(
        f"GEMM with unaligned K: pieces of the time (us), shape key {key}",
        [
            "shape",
            "what",
            "do_bench x3 (us)",
            "CUDA graph (us)",
            "host per launch (us)",
            "TFLOP/s (best)",
            "rel err",
            "config",
        ],
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
