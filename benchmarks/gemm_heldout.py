"""GEMM on a held-out set of current models' shapes: the tuned tunesvc matmul against cuBLAS.

    python benchmarks/gemm_heldout.py --list                  # the shapes; no GPU needed
    python benchmarks/gemm_heldout.py --check                 # tiny shapes, every step, seconds
    python benchmarks/gemm_heldout.py --sweep --shapes 0:13   # tune shapes 0-12 into gemm_heldout.db (resumes)
    python benchmarks/gemm_heldout.py --sweep --shapes 13:    # the rest
    python benchmarks/gemm_heldout.py                         # time every shape (--shapes too)

(``TRITON_INTERPRET=1`` for --check on a machine without a GPU. The default --db,
gemm_heldout.db, is git-ignored: a fresh database, so that no stored winner answers a shape.)

The target (issue 57): on at least 20 shapes of at least five current models, M from 1 to 8192,
bf16, each tuned with 32 trials or fewer, a geometric mean of at least 1.0x cuBLAS in GPU time
and no shape below 0.9x. SHAPES holds 25 projections of six models (DeepSeek-V3, Qwen3-235B-A22B,
Qwen3-30B-A3B, gpt-oss-120b, Llama-4-Scout, Gemma-3-27B: N and K from each model's config.json,
M a token count from decode to prefill, most not powers of two). Thirteen of them have fewer than
one 128x128 output tile per SM of an H200 (132 SMs), where a kernel of one tile per program leaves
SMs idle, and six more a partial last wave (1.2 to 3.9 tiles per SM); --list says each one's.
None shares a shape key with a matmul preset (checked before anything runs), so
tune.db.example's winners do not answer them.

--sweep tunes the --shapes slice into --db through the library call of ``tune sweep``
(tunesvc.tuning.sweep.run_sweep via _common.sweep: Optuna TPE, --budget trials, warm-started,
compiles in parallel workers, one compile pool and one measuring process for the whole slice).
Trials are stored a batch at a time, so a run killed by a time limit continues where it stopped
when run again; a shape already holding --budget trials costs a second. Expected GPU time, on an
H200 with 16 cores: about 0.5 s per trial measured (100 ms of graph replays, the check against
the reference, the set-up) while the next ones compile (8 workers; a compile takes 1-4 s, so a
batch of 8 is about 3 s), then the three finalists re-timed (about 3 s) and cuBLAS timed once:
about 30 s a shape at 32 trials, plus about 20 s once for the pool and measuring process to
start. The 25 shapes took 93 s and 86 s on an H200 (``--shapes 0:13``, then ``13:``, with
Triton's cache warm from a sweep of the matmul presets just before).

Without --sweep, per shape of the slice, on one set of random bf16 inputs: the config the
runtime looks up in --db (as a user's call gets it; the source, ``exact`` once swept, is in the
table) launched through tunesvc.kernels.matmul.launch_matmul, and torch.matmul (cuBLAS), the
tuned output checked against the float32 reference first (a wrong one is not timed and makes
the exit status 1), each timed from a CUDA graph cycling over copies of the inputs that
together exceed twice the L2 (_common.bench_graph_ms), ours and cuBLAS interleaved over ROUNDS
rounds (median). One row per shape goes to benchmarks/results/gemm_heldout.csv as it is
measured (a run stopped by a time limit keeps what it measured), with the winner's output tiles
per SM and its roofline fraction: the bound is the larger of FLOPs at PEAK_TFLOPS and the
minimum bytes at the copy bandwidth measured in this run. Timing takes about 8 s a shape (about
3.5 minutes for the 25: ten graph captures and replays of 100 ms each, the float32 reference).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tunesvc.template import cdiv

#: (model, projection, M, N, K): N and K from each model's config.json (fused QKV = (query heads +
#: 2 KV heads) * head dim; fused gate/up = 2 * intermediate; MoE experts' own widths), M tokens
SHAPES: tuple[tuple[str, str, int, int, int], ...] = (
    # DeepSeek-V3: hidden 7168, q_lora_rank 1536, kv_lora_rank 512, rope dim 64, 128 heads of
    # nope 128 + rope 64 (v 128), routed experts of 2048
    ("DeepSeek-V3", "kv_a_proj_with_mqa (512 + 64)", 250, 576, 7168),
    ("DeepSeek-V3", "q_b_proj (128 heads x 192)", 1000, 24576, 1536),
    ("DeepSeek-V3", "o_proj (128 heads x 128)", 24, 7168, 16384),
    ("DeepSeek-V3", "expert gate_up (2 x 2048)", 96, 4096, 7168),
    ("DeepSeek-V3", "expert down", 700, 7168, 2048),
    ("DeepSeek-V3", "kv_b_proj (128 heads x 256)", 8192, 32768, 512),
    # Qwen3-235B-A22B: hidden 4096, 64 query / 4 KV heads of 128, experts of 1536
    ("Qwen3-235B-A22B", "fused QKV (64 + 8 heads x 128)", 1, 9216, 4096),
    ("Qwen3-235B-A22B", "o_proj (64 heads x 128)", 2000, 4096, 8192),
    ("Qwen3-235B-A22B", "expert gate_up (2 x 1536)", 400, 3072, 4096),
    ("Qwen3-235B-A22B", "expert down", 150, 4096, 1536),
    # Qwen3-30B-A3B: hidden 2048, 32 query / 4 KV heads of 128, experts of 768
    ("Qwen3-30B-A3B", "fused QKV (32 + 8 heads x 128)", 5000, 5120, 2048),
    ("Qwen3-30B-A3B", "o_proj (32 heads x 128)", 64, 2048, 4096),
    ("Qwen3-30B-A3B", "expert gate_up (2 x 768)", 600, 1536, 2048),
    ("Qwen3-30B-A3B", "expert down", 3000, 2048, 768),
    # gpt-oss-120b: hidden 2880, 64 query / 8 KV heads of 64, experts of 2880
    ("gpt-oss-120b", "fused QKV (64 + 16 heads x 64)", 8, 5120, 2880),
    ("gpt-oss-120b", "o_proj (64 heads x 64)", 1500, 2880, 4096),
    ("gpt-oss-120b", "expert gate_up (2 x 2880)", 200, 5760, 2880),
    # Llama-4-Scout-17B-16E: hidden 5120, 40 query / 8 KV heads of 128, experts and shared expert of 8192
    ("Llama-4-Scout", "fused QKV (40 + 16 heads x 128)", 4, 7168, 5120),
    ("Llama-4-Scout", "shared expert gate_up (2 x 8192)", 8192, 16384, 5120),
    ("Llama-4-Scout", "expert down", 500, 5120, 8192),
    ("Llama-4-Scout", "o_proj (40 heads x 128)", 12, 5120, 5120),
    # Gemma-3-27B: hidden 5376, 32 query / 16 KV heads of 128, intermediate 21504
    ("Gemma-3-27B", "fused QKV (32 + 32 heads x 128)", 3500, 8192, 5376),
    ("Gemma-3-27B", "down_proj", 40, 5376, 21504),
    ("Gemma-3-27B", "gate_up (2 x 21504)", 128, 43008, 5376),
    ("Gemma-3-27B", "o_proj (32 heads x 128)", 6000, 5376, 4096),
)

#: --check: small and odd on purpose (no size a multiple of a block), so each step runs in the
#: CPU interpreter in seconds
CHECK_SHAPES: tuple[tuple[str, str, int, int, int], ...] = (
    ("check", "decode-sized", 5, 48, 40),
    ("check", "a few tile-rows", 37, 72, 100),
)

#: NVIDIA H100/H200 SXM datasheet, dense bf16 tensor-core peak (the H200 has the H100's SMs)
PEAK_TFLOPS = 989.0
#: interleaved timing rounds per shape, ours and cuBLAS once each per round
ROUNDS = 5
#: SMs the set is described against (--list), an H200's
LIST_SMS = 132


def problems_of(shapes: tuple[tuple[str, str, int, int, int], ...]) -> list[dict[str, Any]]:
    from tunesvc.templates.matmul import TEMPLATE

    return [TEMPLATE.problem(M=m, N=n, K=k, dtype="bfloat16") for _, _, m, n, k in shapes]


def check_held_out(problems: list[dict[str, Any]]) -> None:
    """Every shape's key is its own and none is a preset's (whose stored winner would answer it)."""
    from heldout import assert_disjoint

    from tunesvc.templates.matmul import TEMPLATE

    assert_disjoint(TEMPLATE, problems)
    keys = [str(TEMPLATE.key(p)) for p in problems]
    assert len(set(keys)) == len(keys), "two held-out shapes share a shape key"


def tiles_per_sm(m: int, n: int, block_m: int, block_n: int, sms: int) -> float:
    return cdiv(m, block_m) * cdiv(n, block_n) / sms


def slice_of(text: str, count: int) -> range:
    """--shapes "i:j" (either end may be left out, as in Python) as a range of indices."""
    first, sep, last = text.partition(":")
    if not sep:
        raise ValueError(text)
    return range(count)[slice(int(first) if first else None, int(last) if last else None)]


def wall_ms(calls: list[Callable[[], Any]]) -> float:
    """Off a GPU (--check in the interpreter): the median host time of the calls in ms, so that the
    timing path runs end to end; not a measurement of anything."""
    times = []
    for call in calls * 2:
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def time_shapes(
    labels: list[tuple[str, str]], problems: list[dict[str, Any]], db: str, on_gpu: bool
) -> tuple[list[list[Any]], list[float], int]:
    """Per problem: check, time and record (see the module's docstring); (table rows, ratios of
    the shapes tuned in db, shapes that were wrong)."""
    import torch
    from _common import bench_graph_ms
    from _common import copies
    from _common import copy_bandwidth
    from _common import interleaved_ms
    from _common import record
    from _common import result_row
    from _common import tuned_runtime

    from tunesvc.bench import relative_error
    from tunesvc.device import current_device
    from tunesvc.kernels.matmul import launch_matmul
    from tunesvc.templates.matmul import TEMPLATE

    device = current_device()
    where = "cuda" if on_gpu else "cpu"
    # off a GPU (--check): a nominal bandwidth, so that the roofline's arithmetic runs
    bandwidth = copy_bandwidth() if on_gpu else 100e9
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s; {device.name}, {device.sm_count} SMs", flush=True)
    runtime = tuned_runtime(db)
    table: list[list[Any]] = []
    ratios: list[float] = []
    wrong = 0
    for (model, projection), problem in zip(labels, problems):
        m, n, k = problem["M"], problem["N"], problem["K"]
        found = runtime.lookup(TEMPLATE, **problem)
        config = found.config

        def make() -> tuple[torch.Tensor, torch.Tensor]:
            return (
                torch.randn(m, k, device=where, dtype=torch.bfloat16),
                torch.randn(k, n, device=where, dtype=torch.bfloat16),
            )

        inputs = make()
        err = relative_error(launch_matmul(*inputs, config), inputs[0].float() @ inputs[1].float())
        shape = f"{m}x{n}x{k}"
        if not err <= TEMPLATE.tolerance(problem):
            wrong += 1
            print(f"{shape}: relative error {err:.2e} with {config}: wrong, not timed", flush=True)
            table.append([model, projection, shape, found.source, "WRONG", "-", "-", "-", "-", "-", f"{err:.1e}"])
            continue
        sets = copies(inputs, make) if on_gpu else [inputs]
        ours_calls = [lambda x=x, y=y: launch_matmul(x, y, config) for x, y in sets]
        peer_calls = [lambda x=x, y=y: torch.matmul(x, y) for x, y in sets]
        ours_ms, peer_ms, _ = interleaved_ms(ours_calls, peer_calls, ROUNDS, bench_graph_ms if on_gpu else wall_ms)
        del sets, ours_calls, peer_calls, inputs
        cost = TEMPLATE.cost(problem)
        bound_ms = max(cost.flops / (PEAK_TFLOPS * 1e12), cost.bytes / bandwidth) * 1e3
        per_sm = tiles_per_sm(m, n, int(config["BLOCK_M"]), int(config["BLOCK_N"]), device.sm_count)
        ratio = peer_ms / ours_ms
        if found.source == "exact":
            ratios.append(ratio)
        row = result_row(
            TEMPLATE,
            problem,
            peer=TEMPLATE.peer_name,
            ours_ms=ours_ms,
            peer_ms=peer_ms,
            timing_method="cuda_graph" if on_gpu else "host wall clock (--check, interpreter)",
            rate_unit="TFLOP/s",
            work=cost.flops,
        )
        row.update(
            kernel=f"matmul [held-out, {found.source}]",
            tiles_per_sm=f"{per_sm:.3f}",
            roofline=f"{bound_ms / ours_ms:.3f}",
            config=" ".join(f"{key}={value}" for key, value in config.items()),
        )
        record("gemm_heldout", [row])  # per shape: a run stopped by a time limit keeps what it measured
        variant = config.get("VARIANT", "grouped")
        split = f"/{config['SPLIT_K']}" if variant == "splitk" else ""
        table.append(
            [
                model,
                projection,
                shape,
                found.source,
                f"{ratio:.3f}x",
                f"{ours_ms * 1e3:.1f} / {peer_ms * 1e3:.1f}",
                f"{per_sm:.2f}",
                f"{100 * m / (cdiv(m, int(config['BLOCK_M'])) * int(config['BLOCK_M'])):.0f}%",
                f"{100 * bound_ms / ours_ms:.0f}% / {100 * bound_ms / peer_ms:.0f}%",
                f"{variant} {config['BLOCK_M']}x{config['BLOCK_N']}x{config['BLOCK_K']}{split} "
                f"w{config['num_warps']} s{config['num_stages']}",
                f"{err:.1e}",
            ]
        )
    return table, ratios, wrong


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="gemm_heldout.db", help="the database the sweeps write and the timing reads")
    parser.add_argument("--sweep", action="store_true", help="tune the --shapes slice into --db (and time nothing)")
    parser.add_argument("--budget", type=int, default=32, help="trials per shape, warm start included (at most 32)")
    parser.add_argument("--workers", type=int, default=None, help="parallel compile workers (default: up to 8)")
    parser.add_argument("--shapes", default=":", help="a slice of the --list indices, e.g. 0:13 or 13: (default: all)")
    parser.add_argument("--list", action="store_true", help="print the shapes and exit")
    parser.add_argument(
        "--check",
        action="store_true",
        help="every step (sweep of 3 trials, lookup, check, timing, CSV row) on tiny shapes, into a "
        "scratch database and results folder; runs in the CPU interpreter too",
    )
    args = parser.parse_args()
    if not 1 <= args.budget <= 32:
        parser.error("--budget must be between 1 and 32")
    shapes = CHECK_SHAPES if args.check else SHAPES
    try:
        chosen = slice_of(args.shapes, len(shapes))
    except ValueError:
        parser.error(f"--shapes {args.shapes!r}: give a slice of 0 to {len(shapes)}, e.g. 0:13 or 13:")
    shapes = tuple(shapes[i] for i in chosen)
    problems = problems_of(shapes)
    if not args.check:
        check_held_out(problems_of(SHAPES))
    if args.list:
        for i, (model, projection, m, n, k) in zip(chosen, shapes):
            print(f"{i:2d}  {model:16s} {projection:34s} M={m},N={n},K={k}  "
                  f"{tiles_per_sm(m, n, 128, 128, LIST_SMS):.2f} 128x128 tiles per SM")  # fmt: skip
        print(f"{len(shapes)} shapes, none sharing a shape key with a matmul preset")
        return 0

    import _common
    from _common import geomean
    from _common import print_table
    from _common import require_gpu
    from _common import sweep

    from tunesvc.device import fork_safe_current_device
    from tunesvc.templates.matmul import TEMPLATE

    if args.check:
        scratch = tempfile.mkdtemp(prefix="gemm-heldout-check-")
        args.db, args.budget = os.path.join(scratch, "check.db"), 3
        _common.RESULTS_DIR = Path(scratch)  # check rows stay out of benchmarks/results
    else:
        require_gpu("benchmarks/gemm_heldout.py")
    on_gpu = fork_safe_current_device().is_gpu  # CUDA left uninitialised: the sweep forks its workers
    if args.sweep or args.check:
        # refit_selector off: the held-out keys are answered by their own winners (exact); the
        # selector answers untuned keys, and refitting it after each shape costs the lease CPU time
        seconds = sweep(TEMPLATE, problems, args.db, strategy="optuna", budget=args.budget, workers=args.workers)
        print(f"swept {len(seconds)} shapes in {sum(seconds.values()):.0f} s (budget {args.budget})", flush=True)
        if args.sweep:
            return 0
    if not os.path.isfile(args.db):
        raise SystemExit(f"--db {args.db}: no such file; tune the shapes into it first with --sweep.")
    labels = [(model, projection) for model, projection, *_ in shapes]
    table, ratios, wrong = time_shapes(labels, problems, args.db, on_gpu)
    print_table(
        f"GEMM bf16, held-out shapes: tunesvc (tuned in {args.db}) vs cuBLAS, GPU time from CUDA graphs",
        [
            "model",
            "projection",
            "M x N x K",
            "lookup",
            "cuBLAS / ours",
            "ours / cuBLAS us",
            "tiles/SM",
            "rows used",
            "roofline ours / cuBLAS",
            "winner",
            "rel err",
        ],
        table,
    )
    if ratios:
        print(
            f"{len(ratios)} of {len(problems)} shapes tuned in {args.db}: cuBLAS / ours geometric mean "
            f"{geomean(ratios):.3f}x, lowest {min(ratios):.3f}x (targets: >= 1.0x, none below 0.9x)"
        )
    else:
        print(f"none of the {len(problems)} shapes is tuned in {args.db}: run --sweep first")
    if wrong:
        print(f"{wrong} shape(s) exceeded the tolerance against the float32 reference", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
