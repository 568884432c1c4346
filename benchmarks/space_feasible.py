"""Host time of ``Template.feasible``: the space's constraints checked for a problem, as every
sweep does at its start and the search replay does per problem.

    python benchmarks/space_feasible.py            # matmul, attention, softmax
    python benchmarks/space_feasible.py --runs 9 decode

Runs on the CPU (no kernel is launched); prints the median of ``--runs`` calls per template after
one warm-up call (which also loads the space file), with ``uptime``'s load for context.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import tunesvc

#: a large bf16 problem per template, as a sweep of a model's shapes would start with
PROBLEMS = {
    "matmul": {"M": 4096, "N": 4096, "K": 4096},
    "attention": {"B": 4, "H": 16, "S": 4096, "D": 128},
    "softmax": {"M": 4096, "N": 4096},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("templates", nargs="*", default=list(PROBLEMS))
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    device = tunesvc.current_device()
    print(f"device: {device.name}; load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("| template | configs | feasible | median ms | runs ms |")
    print("|---|---:|---:|---:|---|")
    for name in args.templates:
        template = tunesvc.get_template(name)
        problem = template.problem(**PROBLEMS.get(name, {}), dtype="bfloat16")
        feasible = template.feasible(problem, device)
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            template.feasible(problem, device)
            times.append((time.perf_counter() - start) * 1e3)
        runs = ", ".join(f"{t:.1f}" for t in times)
        print(f"| {name} | {template.space.size} | {len(feasible)} | {statistics.median(times):.1f} | {runs} |")


if __name__ == "__main__":
    main()
