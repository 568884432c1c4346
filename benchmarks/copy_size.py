"""Why memory-bound kernels reach 79-82% of copy at 4096x4096 but 96-99% at 16384x8192.

    python benchmarks/copy_size.py --db tune.db

The tables of norms.py and pointwise.py take their roofline from one 512 MB copy. This script
measures, in one process, the device-to-device copy rate at the sizes those kernels move (one
bf16 M x N tensor read and one written) and at 512 MB, each with do_bench (L2 flushed) and
replayed from a CUDA graph, then times the tuned softmax, layernorm, dropout and bias+gelu+residual
(configs from --db, as users get them) the same two ways, so each kernel's rate can be set
against the copy of the same size as well as against the large copy.
"""

from __future__ import annotations

import argparse
import sys

import torch
from _common import bench_graph_ms
from _common import bench_ms
from _common import copy_bandwidth
from _common import print_table
from _common import require_gpu
from _common import tuned_runtime
from pointwise import shape_problem

import tunesvc

SHAPES = [(4096, 4096), (16384, 8192), (32768, 1024)]
KERNELS = ["softmax", "layernorm", "dropout", "bias_act_residual"]


def copy_rates(elements: int) -> tuple[float, float]:
    """(do_bench, CUDA graph) copy rate in GB/s (read + write) of ``elements`` bf16 values."""
    return copy_bandwidth(elements) / 1e9, copy_bandwidth(elements, bench_graph_ms) / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="tune.db")
    args = parser.parse_args()
    require_gpu("benchmarks/copy_size.py")
    runtime = tuned_runtime(args.db)
    large, large_graph = copy_rates(1 << 28)
    rows = [["copy 512 MB each way", "-", f"{large:.0f}", f"{large_graph:.0f}", "100%", "100%", "-"]]
    for m, n in SHAPES:
        copy, copy_graph = copy_rates(m * n)
        rows.append([f"copy {m}x{n}", "-", f"{copy:.0f}", f"{copy_graph:.0f}", f"{100 * copy / large:.0f}%", "-", "-"])
        for name in KERNELS:
            template = tunesvc.get_template(name)
            problem = template.problem(**shape_problem(template, m, n))
            inputs = template.make_inputs(problem, tunesvc.current_device())
            config = runtime.lookup(template, **problem).config
            gbytes = template.cost(problem).bytes / 1e9
            rate = gbytes / (bench_ms(lambda: template.launch(inputs, config)) * 1e-3)
            rate_graph = gbytes / (bench_graph_ms(lambda: template.launch(inputs, config)) * 1e-3)
            rows.append(
                [
                    name,
                    f"{m}x{n}",
                    f"{rate:.0f}",
                    f"{rate_graph:.0f}",
                    f"{100 * rate / large:.0f}%",
                    f"{100 * rate / copy:.0f}%",
                    config,
                ]
            )
            del inputs
        torch.cuda.empty_cache()
    print_table(
        "Memory-bound kernels against copies of their own size (GB/s, read + write)",
        ["what", "shape", "do_bench GB/s", "CUDA graph GB/s", "% of 512 MB copy", "% of same-size copy", "config"],
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
