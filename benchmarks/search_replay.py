"""Search efficiency, replayed offline from the ground truth (CPU only, no GPU needed).

    python benchmarks/search_replay.py [--csv benchmarks/data/ground_truth.csv] [--seeds 20]

Per problem of the ground truth (an exhaustive sweep measured on the GPU), each strategy is
replayed with the measured times as its oracle (a failed config answers its stored status), for
``--seeds`` seeds; the table gives the median number of trials it needs to reach within 3% of
the exhaustive best, as a share of the space's size (its feasible configs), and whether that is
at most 20% (the target for Optuna). Two tables: cold (the strategy alone) and as a
sweep runs (``--warm``: the template's warm start, its heuristic and known-good configs for an
H100's limits, asked first).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import tunesvc
from tunesvc.errors import TunesvcError
from tunesvc.search.replay import TARGET_FRACTION
from tunesvc.search.replay import efficiency
from tunesvc.search.replay import read_ground_truth
from tunesvc.space import Config
from tunesvc.template import get_template

DEFAULT_CSV = Path(__file__).parent / "data" / "ground_truth.csv"
STRATEGIES = ("optuna", "random", "cmaes")
#: the device the ground truth was measured on (an H100 SXM): its limits decide
#: the heuristic and which known-good configs a sweep would try first
H100 = dict(
    kind="cuda",
    name="NVIDIA H100 80GB HBM3",
    capability="9.0",
    sm_count=132,
    max_shared_memory=232448,
    max_num_regs=65536,
)


def warm_start(kernel: str, shape_key: str) -> list[Config]:
    """What run_sweep asks first for this problem on the H100 (less the stored-winner part)."""
    template = get_template(kernel)
    problem = template.problem_of_key(shape_key)
    device = dataclasses.replace(tunesvc.current_device(), **H100)
    return template.warm_start(problem, device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--csv", default=str(DEFAULT_CSV), help="ground truth written by ground_truth.py")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--tolerance", type=float, default=0.03, help="within this fraction of the best")
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated")
    parser.add_argument("--warm", action="store_true", help="also replay with the sweep's warm start first")
    args = parser.parse_args()
    if not Path(args.csv).exists():
        print(f"No ground truth at {args.csv}; run benchmarks/ground_truth.py on a GPU first.", file=sys.stderr)
        raise SystemExit(1)
    strategies = args.strategies.split(",")
    header = (
        ["problem", "space"]
        + [f"{s} trials (% of space)" for s in strategies]
        + [f"{strategies[0]} <= {TARGET_FRACTION:.0%}"]
    )
    for warm in (False, True) if args.warm else (False,):
        title = "warm start first, as a sweep runs" if warm else "cold: the strategy alone"
        print(
            f"\n### Trials to within {args.tolerance:.0%} of the exhaustive best, median of {args.seeds} seeds ({title})\n"
        )
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for truth in read_ground_truth(args.csv):
            initial = warm_start(truth.kernel, truth.shape_key) if warm else []
            if truth.best_ms is None:
                print(f"| {truth.name} | {len(truth.configs)} | no correct config |")
                continue
            cells, first = [], None
            for strategy in strategies:
                try:
                    e = efficiency(truth, strategy, seeds=args.seeds, tolerance=args.tolerance, initial=initial)
                except TunesvcError as exc:  # e.g. cmaes without its package
                    cells.append(f"- ({exc})")
                    continue
                first = first or e
                cells.append(f"{e.median_trials:g} ({e.fraction:.1%})")
            verdict = "yes" if first and first.strategy == strategies[0] and first.within else "no"
            print(f"| {truth.name} | {len(truth.configs)} | " + " | ".join(cells) + f" | {verdict} |", flush=True)


if __name__ == "__main__":
    main()
