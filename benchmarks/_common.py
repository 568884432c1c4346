"""What every GPU benchmark script shares: sweeping a template's problems, timing, the copy
roofline measured in the same run, the one markdown table each script prints, and the rows it
appends to its CSV under benchmarks/results/ (``record``; benchmarks/RESULTS.md is generated
from those files by ``python benchmarks/results_page.py``).

Scripts import it as ``from _common import ...`` (they run as ``python benchmarks/x.py``, so
this folder is on ``sys.path``).
"""

from __future__ import annotations

import csv
import datetime
import fcntl
import io
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import triton
import triton.testing
from results_page import COLUMNS
from results_page import RESULTS_DIR
from results_page import columns_of

from tunesvc.bench import graph_time
from tunesvc.bench import input_bytes
from tunesvc.bench import input_sets_needed
from tunesvc.bench import l2_bytes
from tunesvc.device import current_device
from tunesvc.device import fork_safe_current_device
from tunesvc.serving.runtime import Runtime
from tunesvc.store import Store
from tunesvc.template import Problem
from tunesvc.template import Template
from tunesvc.tuning.sweep import compile_pool
from tunesvc.tuning.sweep import measuring_process
from tunesvc.tuning.sweep import run_sweep


def require_gpu(script: str) -> None:
    # fork-safe: CUDA stays uninitialised here, so a sweep after it forks its workers
    if not fork_safe_current_device().is_gpu:
        print(f"{script} needs a CUDA GPU.", file=sys.stderr)
        raise SystemExit(1)


def bench_ms(fn: Callable[[], Any]) -> float:
    """Median time of fn in ms: CUDA events, warm-up, L2 flushed between repetitions."""
    return triton.testing.do_bench(fn, quantiles=[0.5])


def interleaved_ms(
    ours: Any, peer: Any, rounds: int, timer: Callable[[Any], float] | None = None
) -> tuple[float, float, list[float]]:
    """Median time (``timer``, default ``bench_ms``) of ours and of the peer over ``rounds``
    rounds that time both (the order alternating), and the per-round ratios peer / ours: what
    moves between runs (clocks, the L2's state, the host) then moves both sides of a ratio alike.
    With ``timer=bench_graph_ms``, ours and the peer are lists of calls on copies of the inputs."""
    timer = timer or bench_ms
    ours_ms, peer_ms = [], []
    for r in range(rounds):
        first, second = (ours, peer) if r % 2 == 0 else (peer, ours)
        a, b = timer(first), timer(second)
        ours_ms.append(a if r % 2 == 0 else b)
        peer_ms.append(b if r % 2 == 0 else a)
    ratios = sorted(p / o for o, p in zip(ours_ms, peer_ms))
    return statistics.median(ours_ms), statistics.median(peer_ms), ratios


def bench_graph_ms(calls: Callable[[], Any] | Sequence[Callable[[], Any]]) -> float:
    """Median GPU time of one call in ms replayed from a CUDA graph: no host launch cost, as
    serving engines run decode steps. Given several calls (the same op on copies of its inputs,
    see :func:`copies`), the graph takes them in turn, so inputs that fit in L2 are not timed
    from it (``tunesvc.bench.graph_time``). Use it for ours and the peer alike."""
    return graph_time([calls] if callable(calls) else list(calls), 100, [0.5])[0]


def copies(first: Any, make: Callable[[], Any], per_call_bytes: int | None = None) -> list[Any]:
    """``first`` and as many more input sets from ``make()`` as cycling through them without L2
    hits takes (one when ``first`` alone exceeds twice the L2 cache). ``per_call_bytes``: what
    one call reads, where a set holds the inputs of several ops (default: the whole set)."""
    count = input_sets_needed(per_call_bytes or input_bytes(first), l2_bytes())
    return [first] + [make() for _ in range(count - 1)]


def copy_bandwidth(elements: int = 1 << 28, timer: Callable[[Callable[[], Any]], float] = bench_ms) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write) of ``elements`` bf16 values,
    measured now with ``timer``; the default, 512 MB each way (far past L2), is the roofline."""
    src = torch.randn(elements, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    del src, dst
    return 2 * elements * 2 / (ms * 1e-3)


def sweep(
    template: Template,
    problems: list[dict],
    db: str,
    *,
    strategy: str = "optuna",
    budget: int | None = 40,
    workers: int | None = None,
    refit_selector: bool = True,
    candidates: Callable[[dict], list[dict]] | None = None,
    on_result: Callable[[Any], None] | None = None,
) -> dict[str, float]:
    """Tune every problem into db (resuming what is stored there: a killed run continues where
    it stopped); shape key -> wall seconds. One compile pool and one measuring process serve
    every problem, as ``tune sweep`` over several shapes does: their start-up (processes, CUDA
    contexts, imports) is paid once. ``refit_selector``: as run_sweep's, after each problem;
    ``candidates``: a problem's explicit configs (run_sweep's), in place of the space's;
    ``on_result``: called with each problem's ProblemResult as it ends."""
    if not problems:
        return {}
    store = Store(db)
    seconds: dict[str, float] = {}
    compiler = compile_pool(template, problems[0], strategy=strategy, budget=budget, workers=workers)
    measurer = measuring_process(template, problems[0])
    try:
        for problem in problems:
            [result] = run_sweep(
                template,
                [problem],
                store,
                strategy=strategy,
                budget=budget,
                workers=compiler.workers if compiler is not None else 0,
                compiler=compiler,
                measurer=measurer,
                refit_selector=refit_selector,
                candidates=candidates(problem) if candidates is not None else None,
            )
            seconds[result.shape_key] = result.wall_seconds
            if on_result is not None:
                on_result(result)
            print(
                f"swept {template.name} {result.shape_key}: {result.trials_stored} trials in "
                f"{result.wall_seconds:.1f} s, best {result.winner_ms} ms {result.winner}",
                flush=True,
            )
    finally:
        for part in (measurer, compiler):
            if part is not None:
                part.close()
        store.close()
    return seconds


def tuned_runtime(db: str) -> Runtime:
    """A runtime reading db in lookup mode (exact, nearest, heuristic), as users get it."""
    return Runtime(db=db)


def print_table(title: str, header: list[str], rows: list[list[Any]]) -> None:
    """One markdown table, headed by the device, software and date."""
    device = current_device()
    print(
        f"\n### {title}\n\n{device.name}, torch {torch.__version__}, triton {triton.__version__}, "
        f"{time.strftime('%Y-%m-%d')}\n"
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(_cell(c) for c in row) + " |")
    print(flush=True)


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def shape_text(template: Template, problem: Problem) -> str:
    """The problem as ``tune sweep --shape`` takes it, dtype included: M=4096,N=4096,K=4096,dtype=bfloat16."""
    parts = [f"{d}={problem[d]}" for d in template.dims]
    parts += [f"{o}={int(v) if isinstance(v, bool) else v}" for o, v in ((o, problem[o]) for o in template.options)]
    return ",".join([*parts, f"dtype={problem['dtype']}"])


def result_row(
    template: Template,
    problem: Problem,
    *,
    peer: str,
    ours_ms: float,
    peer_ms: float,
    timing_method: str,
    rate_unit: str = "",
    work: float = 0.0,
) -> dict[str, Any]:
    """One CSV row of a measurement against a peer; ``work`` (FLOPs or bytes, per ``rate_unit``
    "TFLOP/s" or "GB/s") adds both throughputs."""
    row: dict[str, Any] = {
        "kernel": template.name,
        "shape": shape_text(template, problem),
        "ours_ms": ours_ms,
        "peer": peer,
        "peer_ms": peer_ms,
        "ratio": peer_ms / ours_ms,
        "timing_method": timing_method,
    }
    if rate_unit:
        per_ms = {"TFLOP/s": 1e9, "GB/s": 1e6}[rate_unit]  # work per ms -> the unit
        row.update(ours_rate=work / ours_ms / per_ms, peer_rate=work / peer_ms / per_ms, rate_unit=rate_unit)
    return row


#: this invocation's run, as ``record`` stamps it (the process's UTC start, to the second)
RUN = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def record(script: str, rows: list[dict[str, Any]]) -> Path:
    """Append ``rows`` (dicts of ``result_row``) to benchmarks/results/<script>.csv, each with
    today's date (UTC), this run (``RUN``) and this device's GPU, driver, torch and Triton;
    returns the file."""
    device = current_device()
    stamp = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "run": RUN,
        "gpu": device.name,
        "driver": device.driver,
        "torch": torch.__version__,
        "triton": triton.__version__,
    }
    path = RESULTS_DIR / f"{script}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    # under an exclusive lock: processes that record at once (heldout.py --gpus) append whole
    # rows, only the first writes the header, and the others read it whole
    with path.open("a", newline="") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        if os.fstat(f.fileno()).st_size == 0:
            columns: tuple[str, ...] = COLUMNS
            csv.DictWriter(f, COLUMNS).writeheader()
        else:
            columns = columns_of(path)  # a file of another layout: one sentence, and nothing appended to it
        missing = sorted({k for row in rows for k, v in row.items() if v not in ("", None) and k not in columns})
        if missing:
            raise SystemExit(
                f"{path} has no column {', '.join(missing)} (an earlier layout); move it aside and run again."
            )
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, columns, restval="", extrasaction="ignore")
        for row in rows:
            writer.writerow({**stamp, **row})
        f.write(text.getvalue())
    print(f"appended {len(rows)} rows to {path}; regenerate the page with `python benchmarks/results_page.py`")
    return path
