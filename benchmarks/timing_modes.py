"""Graph against eager timing on small kernels, where the host's launch cost can make them disagree.

    python benchmarks/timing_modes.py --db timing.db                 # a GPU: 8 small keys, budget 24
    TRITON_INTERPRET=1 python benchmarks/timing_modes.py --db /tmp/t.db --tiny --record   # CPU check

Each key (rmsnorm, softmax, layernorm and bias_act_residual at a few rows, decode at B=1, matmul
at M=1) is swept twice into ``--db``: with ``--timing graph`` (CUDA graph replays over input
copies: the GPU time) and with ``--timing eager`` (loops of ordinary launches, one
synchronisation per loop: the host's launch cost counts), which measures the graph winner first,
eagerly, and stores an eager winner only where its choice is at least as fast as that. Then the
config the eager runtime serves (the eager winner, else the graph winner) and the graph winner
are timed side by side, their timings interleaved (``Bench.time_together``), under each timing.

One row per key and timing to benchmarks/results/timing_modes.csv: ours = what an eager runtime
serves, peer = "graph winner", ratio = peer / ours (above 1: the eager winner is faster under that
timing), timing_method ``bench_graph`` or ``bench_eager``, config ``eager: ...; graph: ...``
(``same`` where the two sweeps chose one config). In the interpreter (``--tiny``: shapes and a
budget that it runs in seconds) rows are recorded only with ``--record``: they time the CPU.
"""

from __future__ import annotations

import argparse
import sys

from _common import print_table
from _common import record
from _common import shape_text

from tunesvc.bench import Bench
from tunesvc.device import fork_safe_current_device
from tunesvc.settings import TIMINGS
from tunesvc.space import config_hash
from tunesvc.store import Store
from tunesvc.template import get_template
from tunesvc.tuning.sweep import run_sweep

#: (kernel, problem) of the small keys a GPU measures
KEYS = [
    ("rmsnorm", {"M": 1, "N": 4096}),
    ("rmsnorm", {"M": 16, "N": 4096}),
    ("softmax", {"M": 1, "N": 4096}),
    ("softmax", {"M": 32, "N": 1024}),
    ("layernorm", {"M": 4, "N": 4096}),
    ("bias_act_residual", {"M": 8, "N": 4096, "act": "gelu"}),
    ("decode", {"B": 1, "HQ": 32, "HKV": 8, "S": 1024, "D": 128, "paged": False}),
    ("matmul", {"M": 1, "N": 4096, "K": 4096}),
]
#: the same kernels at shapes the CPU interpreter runs in seconds
TINY = [
    ("rmsnorm", {"M": 1, "N": 64}),
    ("softmax", {"M": 1, "N": 64}),
    ("bias_act_residual", {"M": 2, "N": 64, "act": "gelu"}),
    ("matmul", {"M": 1, "N": 32, "K": 32}),
]
TIMING_METHOD = {"graph": "bench_graph", "eager": "bench_eager"}


def config_text(config: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(config.items()))


def measure_key(store: Store, device, name: str, dims: dict, dtype: str, budget: int, rep_ms: float) -> list[dict]:
    """Sweep one key under both timings, then time the two winners side by side under each."""
    template = get_template(name)
    problem = template.problem(**{**dims, "dtype": dtype})
    winners = {}
    for timing in TIMINGS:  # graph first: the eager sweep measures the graph winner first
        [result] = run_sweep(template, [problem], store, budget=budget, device=device, timing=timing, rep_ms=rep_ms)
        winners[timing] = result.winner
    graph = winners["graph"]
    if graph is None:
        print(f"{name} {dims}: no graph winner (no candidate ran correctly); skipped", file=sys.stderr)
        return []
    eager = winners["eager"] or graph  # no eager winner: an eager runtime serves the graph winner
    same = config_hash(eager) == config_hash(graph)
    rows = []
    for timing in TIMINGS:
        bench = Bench(template, problem, device, rep_ms=rep_ms, timing=timing)
        checked = [bench.measure(c) for c in ([eager] if same else [eager, graph])]
        if not all(m.ok for m in checked):
            print(f"{name} {dims}: {next(m for m in checked if not m.ok).message}; skipped", file=sys.stderr)
            continue
        if same:
            ours = theirs = bench.time_together([eager])[0]
        else:
            ours, theirs = bench.time_together([eager, graph])
        if not (ours.ok and theirs.ok and ours.time_ms and theirs.time_ms):
            continue
        rows.append(
            {
                "kernel": template.name,
                "shape": shape_text(template, problem),
                "ours_ms": ours.time_ms,
                "peer": "graph winner",
                "peer_ms": theirs.time_ms,
                "ratio": theirs.time_ms / ours.time_ms,
                "timing_method": TIMING_METHOD[timing],
                "config": "same" if same else f"eager: {config_text(eager)}; graph: {config_text(graph)}",
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="the database both sweeps of every key go into (resumed)")
    parser.add_argument("--budget", type=int, default=None, help="trials per key and timing [24; --tiny: 3]")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--rep-ms", type=float, default=None, help="each timing's length [100; --tiny: 10]")
    parser.add_argument("--tiny", action="store_true", help="the interpreter's shapes and budget (a CPU check)")
    parser.add_argument("--record", action="store_true", help="record the rows even in the interpreter")
    parser.add_argument("--kernels", help="only these kernels' keys, comma-separated (e.g. decode,matmul)")
    args = parser.parse_args()
    device = fork_safe_current_device()
    keys = TINY if args.tiny else KEYS
    if args.kernels:
        wanted = {k.strip() for k in args.kernels.split(",")}
        unknown = wanted - {name for name, _ in keys}
        if unknown:
            raise SystemExit(
                f"--kernels: no key of {', '.join(sorted(unknown))} here; the kernels are {', '.join(dict.fromkeys(n for n, _ in keys))}"
            )
        keys = [(name, dims) for name, dims in keys if name in wanted]
    budget = args.budget or (3 if args.tiny else 24)
    rep_ms = args.rep_ms or (10.0 if args.tiny else 100.0)
    store = Store(args.db)
    rows: list[dict] = []
    try:
        for name, dims in keys:
            measured = measure_key(store, device, name, dims, args.dtype, budget, rep_ms)
            if measured and (device.is_gpu or args.record):
                record("timing_modes", measured)  # each key's rows as it ends: a run cut short keeps them
            rows += measured
    finally:
        store.close()
    print_table(
        f"Graph and eager winners, each timed beside the other, on {device.name}",
        ["kernel", "shape", "timing", "eager runtime's ms", "graph winner ms", "graph / eager", "configs"],
        [
            [r["kernel"], r["shape"], r["timing_method"], r["ours_ms"], r["peer_ms"], r["ratio"], r["config"]]
            for r in rows
        ],
    )


if __name__ == "__main__":
    main()
