"""Ground truth: exhaustive grid sweeps on the GPU, exported as CSV for offline search replay.

    python benchmarks/ground_truth.py --db gt.db --out benchmarks/data/ground_truth.csv

Every feasible config of each problem below is measured once (checked against the reference,
then timed with a short repetition time: the ranking, not the last percent, is what a replay
needs), compiled in parallel worker processes and measured in an isolated worker. The database
keeps every trial, so a killed run resumes where it stopped; the CSV (one row per trial:
kernel, shape key, config, status, time) is written from the database at the end, for every
problem measured so far. `benchmarks/search_replay.py` replays search strategies against it.

Problems: GEMM 4096^3, 16x4096x4096 and 1000x3000x777; attention forward in two
settings; softmax in two shapes (or LayerNorm, when softmax is not registered). A template that
is not registered yet is skipped with a message.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from tunesvc.bench import Measurement
from tunesvc.bench import Status
from tunesvc.device import current_device
from tunesvc.errors import TunesvcError
from tunesvc.search.replay import GroundTruth
from tunesvc.search.replay import write_ground_truth
from tunesvc.store import Store
from tunesvc.template import get_template
from tunesvc.tuning.sweep import run_sweep

DEFAULT_OUT = Path(__file__).parent / "data" / "ground_truth.csv"

PROBLEMS: list[tuple[str, dict]] = [
    ("matmul", {"M": 4096, "N": 4096, "K": 4096, "dtype": "bfloat16"}),
    ("matmul", {"M": 16, "N": 4096, "K": 4096, "dtype": "bfloat16"}),
    ("matmul", {"M": 1000, "N": 3000, "K": 777, "dtype": "bfloat16"}),
    ("attention", {"B": 4, "H": 32, "S": 4096, "D": 128, "causal": False, "dtype": "bfloat16"}),
    ("attention", {"B": 4, "H": 32, "S": 2048, "D": 64, "causal": True, "dtype": "bfloat16"}),
    ("softmax", {"M": 4096, "N": 4096, "dtype": "bfloat16"}),
    ("softmax", {"M": 32768, "N": 1000, "dtype": "bfloat16"}),
]
#: used for the row-wise problems when softmax is not registered
FALLBACK = {"softmax": "layernorm"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default="ground_truth.db", help="database of the sweeps (resumed if it exists)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="CSV to write")
    parser.add_argument("--only", default=None, help="only these kernels, comma-separated (e.g. softmax,attention)")
    parser.add_argument("--rep-ms", type=float, default=10.0, help="timing repetition window per config")
    parser.add_argument("--workers", type=int, default=None, help="compile processes [CPU cores - 1, at most 16]")
    parser.add_argument("--check", action="store_true", help="one small GEMM, 6 configs: a quick end-to-end check")
    args = parser.parse_args()

    device = current_device()
    if not device.is_gpu and not args.check:
        print("ground_truth.py needs a CUDA GPU (or --check for the interpreter).", file=sys.stderr)
        raise SystemExit(1)
    workers = args.workers if args.workers is not None else max(1, min(16, (os.cpu_count() or 2) - 1))
    problems = [("matmul", {"M": 37, "N": 45, "K": 29, "dtype": "float16"})] if args.check else PROBLEMS
    store = Store(args.db)
    truths: list[GroundTruth] = []
    try:
        for name, fields in problems:
            if args.only and name not in args.only.split(","):
                continue
            template = _template(name)
            if template is None:
                continue
            problem = template.problem(**fields)
            feasible = template.feasible(problem, device)
            candidates = feasible[:6] if args.check else None
            start = time.perf_counter()
            [result] = run_sweep(
                template,
                [problem],
                store,
                strategy="grid",
                device=device,
                candidates=candidates,
                workers=workers if device.is_gpu else 0,
                rep_ms=args.rep_ms,
                measure_timeout=30.0,
            )
            print(
                f"{template.name} {result.shape_key}: {result.trials_stored} configs ({result.trials_new} new, "
                f"{result.failures} failed) in {time.perf_counter() - start:.0f} s, best {result.winner_ms} ms",
                flush=True,
            )
            truths.append(_truth(store, template, device, result.shape_key))
    finally:
        store.close()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_ground_truth(out, truths)
    print(f"wrote {sum(len(t.configs) for t in truths)} trials of {len(truths)} problems to {out}")


def _template(name: str):
    for candidate in (name, FALLBACK.get(name)):
        if candidate is None:
            continue
        try:
            return get_template(candidate)
        except TunesvcError:
            print(f"skipping {candidate}: not registered yet", flush=True)
    return None


def _truth(store: Store, template, device, key: str) -> GroundTruth:
    truth = GroundTruth(template.name, key)
    for row in store.trials(store.kernel_version_id(template), store.device_id(device), key):
        truth.add(dict(row.config), Measurement(Status(row.status), time_ms=row.time_ms))
    return truth


if __name__ == "__main__":
    main()
