"""Paged decode, before and after the fifth session's block-table prefetch, same configs, one run.

    python benchmarks/results/2026-11-24-session5/decode_paged_ab.py

B8 HQ32 HKV8 S4096 D128 bf16, 16-token pages in random order, every sequence full: each config
timed with the old and the new kernel, interleaved, three rounds, as CUDA-graph replays over
copies of the cache exceeding L2 twice (tunesvc.bench.graph_time).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[2]))  # benchmarks/

import decode_before
import torch
from _common import copies
from _common import print_table
from _common import rel_error

from tunesvc.bench import graph_time
from tunesvc.device import current_device
from tunesvc.kernels.decode import TEMPLATE
from tunesvc.kernels.decode import decode_reference
from tunesvc.kernels.decode import launch_decode

CONFIGS = [
    {"BLOCK_N": 64, "NUM_SPLITS": 8, "num_warps": 4, "num_stages": 3},  # session 4's and run 2's paged winner
    {"BLOCK_N": 32, "NUM_SPLITS": 4, "num_warps": 2, "num_stages": 3},  # run 9's paged winner
    {"BLOCK_N": 128, "NUM_SPLITS": 2, "num_warps": 4, "num_stages": 3},  # run 2's dense B8 winner
    {"BLOCK_N": 64, "NUM_SPLITS": 4, "num_warps": 4, "num_stages": 4},
]


def main() -> int:
    problem = TEMPLATE.problem(B=8, HQ=32, HKV=8, S=4096, D=128, paged=True, dtype="bfloat16")

    def full():
        q, k, v, seq_lens, table = TEMPLATE.make_inputs(problem, current_device())
        return q, k, v, torch.full_like(seq_lens, 4096), table

    sets = copies(full(), full)
    rows = []
    for config in CONFIGS:
        x = sets[0]
        ref = decode_reference(*x)
        errs = [rel_error(fn(*x, config), ref) for fn in (decode_before.launch_decode, launch_decode)]
        times = {"before": [], "after": []}
        for _ in range(3):
            for name, fn in (("before", decode_before.launch_decode), ("after", launch_decode)):
                times[name].append(graph_time([lambda s=s: fn(*s, config) for s in sets], 100, [0.5])[0])
        before, after = (statistics.median(times[n]) * 1e3 for n in ("before", "after"))
        rows.append([" ".join(f"{k}={v}" for k, v in config.items()), f"{before:.1f}", f"{after:.1f}",
                     f"{before / after:.3f}x", f"{errs[0]:.1e} / {errs[1]:.1e}"])
    print_table("Paged decode B8 S4096: block table read in the same step (before) or one tile ahead (after)",
                ["config", "before us", "after us", "before / after", "rel err before / after"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
