"""How the timing method moves a small kernel's time: skinny GEMMs and cuBLAS, four ways.

    python benchmarks/timing_methods.py

Per (shape, config), in one process on the same inputs, the median time of one call:
- "do_bench": ``triton.testing.do_bench``, whose L2 flush writes zeros over 256 MB before each
  call, so the call starts with L2 full of dirty lines that must be written back as it reads;
- "events, read flush": the same event loop, but the flush *reads* 256 MB (L2 left clean);
- "graph, one set": ``do_bench_cudagraph``, back to back on the same inputs (L2 warm);
- "graph, cycled": ``tunesvc.bench.graph_time`` over copies of the inputs that exceed L2 twice
  (L2 cold and clean, no host launch cost): what sweeps store for kernels under 0.1 ms.
"""

from __future__ import annotations

import statistics
import sys

import torch
import triton.testing
from _common import copies
from _common import print_table
from _common import require_gpu

from tunesvc.bench import graph_time
from tunesvc.kernels.matmul import _config
from tunesvc.kernels.matmul import launch_matmul

FLUSH_BYTES = 256 * 2**20


def events_ms(fn, flush, reps: int = 200) -> float:
    fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        flush()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def config(variant, bm, bn, bk, split, stages):
    return _config(variant, bm, bn, bk, 1, split, 4, stages)  # one tile-row or split-K: GROUP_M 1, 4 warps


CASES = {
    (64, 4096, 4096): [
        config("grouped", 64, 32, 128, 1, 5),
        config("grouped", 64, 64, 128, 1, 5),
        config("splitk", 64, 64, 128, 2, 5),
    ],
    (16, 4096, 4096): [
        config("grouped", 16, 32, 128, 1, 5),
        config("grouped", 16, 64, 128, 1, 5),
        config("splitk", 16, 64, 128, 2, 4),
    ],
    (1, 4096, 4096): [
        config("splitk", 16, 128, 32, 4, 5),
        config("splitk", 16, 128, 32, 8, 4),
        config("grouped", 16, 64, 128, 1, 5),
    ],
}


def main() -> int:
    require_gpu("benchmarks/timing_methods.py")
    scratch = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    read_flush = scratch.sum
    rows = []
    for (m, n, k), configs in CASES.items():
        make = lambda: (
            torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
            torch.randn(k, n, device="cuda", dtype=torch.bfloat16),
        )
        sets = copies(make(), make)
        a, b = sets[0]
        runs = [
            (
                f"{c['VARIANT']} {c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']}/{c['SPLIT_K']} s{c['num_stages']}",
                lambda x, y, c=c: launch_matmul(x, y, c),
            )
            for c in configs
        ]
        runs.append(("cuBLAS", lambda x, y: torch.matmul(x, y)))
        for name, run in runs:
            fn = lambda: run(a, b)
            times = [
                triton.testing.do_bench(fn, quantiles=[0.5]),
                events_ms(fn, read_flush),
                triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median"),
                graph_time([lambda x=x, y=y: run(x, y) for x, y in sets], 100, [0.5])[0],
            ]
            rows.append([f"{m}x{n}x{k}", name, *(f"{t * 1e3:.1f}" for t in times)])
        del sets
    print_table(
        "One call's median time (us) by timing method",
        [
            "M x N x K",
            "kernel",
            "do_bench (zero-write flush)",
            "events, read flush",
            "graph, one input set",
            "graph, cycled input sets",
        ],
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
