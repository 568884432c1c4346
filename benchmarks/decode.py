"""Decode attention on the GPU: the tuned tunesvc kernel vs torch SDPA (bf16, 32 query / 8 KV heads, D 128).

    python benchmarks/decode.py --db tune.db --sweep --budget 30
    python benchmarks/decode.py --check      # correctness only, in seconds (no GPU: tiny shapes, interpreter)

Settings: batch 1 / 2k context, 8 / 4k and 64 / 4k with a contiguous cache, and 8 / 4k with a
paged one (16-token pages in shuffled order). Every sequence is at full length, so SDPA reads
the same padded cache with no mask. The peer is F.scaled_dot_product_attention on a
(B, 32, 1, 128) query against the cache in its own (B, 8, S, 128) layout, with enable_gqa=True
(KV heads repeated where that argument is missing); SDPA has no paged mode, so in the paged
row it reads the dense cache. With --sweep, the template's "llama3-8b" preset is first tuned
into --db (random lengths, as make_inputs draws them), resuming what is stored there.

Bytes = K and V read once; % of copy = our read rate / the device-to-device copy bandwidth
(read + write) measured in the same run. Ratio = SDPA time / our time (> 1: we are faster).
The tuned output's relative error is checked against the float32 reference, both on the
timed inputs and on make_inputs' variable lengths.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from _common import bench_graph_ms
from _common import bench_ms
from _common import copies
from _common import copy_bandwidth
from _common import print_table
from _common import record
from _common import require_gpu
from _common import result_row
from _common import sweep
from _common import tuned_runtime

import tunesvc  # noqa: F401  (first: without a GPU, --check needs Triton's interpreter chosen before triton loads)
from tunesvc.bench import input_bytes
from tunesvc.bench import relative_error as rel_error
from tunesvc.device import current_device
from tunesvc.device import torch_device
from tunesvc.kernels.decode import PAGE_SIZE
from tunesvc.kernels.decode import TEMPLATE
from tunesvc.kernels.decode import decode_reference
from tunesvc.kernels.decode import launch_decode
from tunesvc.serving.runtime import Runtime
from tunesvc.template import Problem

PRESET = "llama3-8b"


def sdpa_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """SDPA on q (B, HQ, D) against k, v (B, HKV, S, D); (B, HQ, D) out."""
    try:
        out = F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True)
    except TypeError:  # torch < 2.5: no enable_gqa
        group = q.shape[1] // k.shape[1]
        out = F.scaled_dot_product_attention(
            q[:, :, None], k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        )
    return out[:, :, 0]


def full_length_inputs(problem: Problem, where: str) -> tuple[torch.Tensor, ...]:
    """Random inputs with every sequence at full length S; the paged cache has shuffled pages."""
    B, HQ, HKV, S, D = (problem[d] for d in TEMPLATE.dims)
    dtype = getattr(torch, problem["dtype"])
    q = torch.randn(B, HQ, D, device=where, dtype=dtype)
    seq_lens = torch.full((B,), S, device=where, dtype=torch.int32)
    if not problem["paged"]:
        k = torch.randn(B, S, HKV, D, device=where, dtype=dtype)
        v = torch.randn(B, S, HKV, D, device=where, dtype=dtype)
        return q, k, v, seq_lens, None
    pages = -(-S // PAGE_SIZE)
    k = torch.randn(B * pages, PAGE_SIZE, HKV, D, device=where, dtype=dtype)
    v = torch.randn(B * pages, PAGE_SIZE, HKV, D, device=where, dtype=dtype)
    block_table = torch.randperm(B * pages, device=where).to(torch.int32).view(B, pages)
    return q, k, v, seq_lens, block_table


def dense_head_major(cache: torch.Tensor, block_table: torch.Tensor | None, S: int) -> torch.Tensor:
    """The cache as SDPA wants it: (B, HKV, S, D), contiguous."""
    if block_table is not None:
        cache = cache[block_table.long()].flatten(1, 2)
    return cache[:, :S].transpose(1, 2).contiguous()


def check(problems: list[Problem], runtime: Runtime) -> int:
    """Tuned (or fallback) configs and the SDPA peer against the reference; no timing."""
    device = current_device()
    where = torch_device()
    failed = 0
    for problem in problems:
        found = runtime.lookup(TEMPLATE, **problem)
        tolerance = TEMPLATE.tolerance(problem)
        varlen = TEMPLATE.make_inputs(problem, device)
        full = full_length_inputs(problem, where)
        errors = {
            "ours, variable lengths": rel_error(launch_decode(*varlen, found.config), TEMPLATE.reference(varlen)),
            "ours, full lengths": rel_error(launch_decode(*full, found.config), TEMPLATE.reference(full)),
        }
        q, k, v, _, block_table = full
        k4, v4 = (dense_head_major(c, block_table, problem["S"]) for c in (k, v))
        errors["sdpa"] = rel_error(sdpa_decode(q, k4, v4), TEMPLATE.reference(full))
        bad = [name for name, err in errors.items() if not err <= tolerance]
        failed += bool(bad)
        text = ", ".join(f"{name} {err:.2e}" for name, err in errors.items())
        print(f"{'FAIL' if bad else 'ok'} {TEMPLATE.key(problem)} [{found.source} {found.config}]: {text}", flush=True)
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="tune.db")
    parser.add_argument("--sweep", action="store_true", help="tune the settings into --db first")
    parser.add_argument("--strategy", default="optuna")
    parser.add_argument("--budget", type=int, default=30)
    parser.add_argument("--check", action="store_true", help="check correctness only (no sweep, no timing)")
    args = parser.parse_args()

    gpu = current_device().is_gpu
    if args.check:
        preset = PRESET if gpu else "tiny"
        problems = [TEMPLATE.problem(**{"dtype": "bfloat16", **p}) for p in TEMPLATE.presets[preset]]
        return check(problems, tuned_runtime(args.db))
    require_gpu("benchmarks/decode.py")
    problems = [TEMPLATE.problem(**{"dtype": "bfloat16", **p}) for p in TEMPLATE.presets[PRESET]]
    if args.sweep:
        sweep(TEMPLATE, problems, args.db, strategy=args.strategy, budget=args.budget)

    runtime = tuned_runtime(args.db)
    copy = copy_bandwidth()
    rows, csv_rows = [], []
    for problem in problems:
        B, _HQ, HKV, S, D = (problem[d] for d in TEMPLATE.dims)
        found = runtime.lookup(TEMPLATE, **problem)
        inputs = full_length_inputs(problem, torch_device())
        q, k, v, _seq_lens, block_table = inputs
        k4, v4 = (dense_head_major(c, block_table, S) for c in (k, v))
        varlen = TEMPLATE.make_inputs(problem, current_device())
        err = max(
            rel_error(launch_decode(*inputs, found.config), decode_reference(*inputs)),
            rel_error(launch_decode(*varlen, found.config), decode_reference(*varlen)),
        )
        del varlen

        # host launch cost (two Triton launches, ~20 us each on the H100 host) hides a ~10 us
        # kernel: the ratio is taken on CUDA-graph replays; plain launches are shown beside it
        # copies of the cache exceeding L2 twice: one 2k-context sequence's 8 MB would stay in
        # L2 between replays, where a model's decode step reads it from memory
        def dense_set(full):
            fk, fv = (dense_head_major(c, full[4], S) for c in full[1:3])
            return full, (full[0], fk, fv)

        sets = copies(
            dense_set(inputs),
            lambda: dense_set(full_length_inputs(problem, torch_device())),
            per_call_bytes=input_bytes(inputs),
        )
        ours = bench_graph_ms([lambda x=x: launch_decode(*x, found.config) for x, _ in sets])
        peer = bench_graph_ms([lambda y=y: sdpa_decode(*y) for _, y in sets])
        del sets
        ours_launch = bench_ms(lambda: launch_decode(*inputs, found.config))
        peer_launch = bench_ms(lambda: sdpa_decode(q, k4, v4))
        kv_bytes = 2 * B * S * HKV * D * q.element_size()
        ours_rate, peer_rate = kv_bytes / (ours * 1e-3), kv_bytes / (peer * 1e-3)  # bytes/s
        csv_rows += [
            result_row(
                TEMPLATE,
                problem,
                peer="torch SDPA",
                ours_ms=ours,
                peer_ms=peer,
                timing_method="cuda_graph",
                rate_unit="GB/s",
                work=kv_bytes,
            ),
            result_row(
                TEMPLATE,
                problem,
                peer="torch SDPA",
                ours_ms=ours_launch,
                peer_ms=peer_launch,
                timing_method="do_bench",
                rate_unit="GB/s",
                work=kv_bytes,
            ),
        ]
        rows.append(
            [
                f"B{B} S{S}" + (" paged" if problem["paged"] else ""),
                ours * 1e3,
                peer * 1e3,
                f"{peer / ours:.2f}x",
                ours_launch * 1e3,
                peer_launch * 1e3,
                ours_rate / 1e9,
                f"{100 * ours_rate / copy:.0f}%",
                peer_rate / 1e9,
                f"{err:.1e}" + ("" if err <= TEMPLATE.tolerance(problem) else " WRONG"),
                found.source,
                " ".join(f"{key}={value}" for key, value in found.config.items()),
            ]
        )
        del inputs, q, k, v, k4, v4
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    heads = problems[0]
    print_table(
        f"Decode attention, bf16, {heads['HQ']} query / {heads['HKV']} KV heads, D {heads['D']}: tunesvc vs torch SDPA "
        f"(copy bandwidth {copy / 1e9:.0f} GB/s)",
        [
            "setting",
            "ours us (graph)",
            "SDPA us (graph)",
            "SDPA/ours",
            "ours us (launch)",
            "SDPA us (launch)",
            "ours GB/s",
            "% of copy",
            "SDPA GB/s",
            "rel err",
            "config source",
            "config",
        ],
        rows,
    )
    record("decode", csv_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
