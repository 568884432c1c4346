"""Offline replay: how many trials a strategy needs, with measured times as the oracle.

A ground truth is an exhaustive sweep of one problem (every feasible config measured once),
kept as CSV rows ``kernel, shape_key, config (JSON), status, time_ms``. Replaying a strategy
against it asks configs, answers each from the table (a failed or infeasible config answers
its stored status) and counts the trials until the best found is within ``tolerance`` of the
exhaustive best: the efficiency figure of a search, measured on the CPU, for many seeds, with
no GPU.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections.abc import Iterable
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

from tunesvc.bench import Measurement
from tunesvc.bench import Status
from tunesvc.search import make_strategy
from tunesvc.space import LAUNCH_OPTIONS
from tunesvc.space import Config
from tunesvc.space import Space
from tunesvc.space import config_hash

COLUMNS = ("kernel", "shape_key", "config", "status", "time_ms")


@dataclass
class GroundTruth:
    """Every feasible config of one (kernel, shape key) with its measured outcome."""

    kernel: str
    shape_key: str
    configs: list[Config] = field(default_factory=list)
    outcomes: dict[str, Measurement] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.kernel} {self.shape_key}"

    @property
    def best_ms(self) -> float | None:
        return min((m.time_ms for m in self.outcomes.values() if m.ok and m.time_ms is not None), default=None)

    def add(self, config: Config, measurement: Measurement) -> None:
        self.configs.append(config)
        self.outcomes[config_hash(config)] = measurement

    def space(self) -> Space:
        """The space the table spans: each parameter's measured values, in increasing order."""
        values = {n: sorted({c[n] for c in self.configs}) for n in self.configs[0]}
        return Space.from_dict(
            {
                "params": {n: v for n, v in values.items() if n not in LAUNCH_OPTIONS},
                "launch": {n: v for n, v in values.items() if n in LAUNCH_OPTIONS},
            }
        )


def read_ground_truth(path: str | Path) -> list[GroundTruth]:
    """The problems of a ground-truth CSV, in the order they first appear."""
    problems: dict[tuple[str, str], GroundTruth] = {}
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            truth = problems.setdefault((row["kernel"], row["shape_key"]), GroundTruth(row["kernel"], row["shape_key"]))
            status = Status(row["status"])
            time_ms = float(row["time_ms"]) if status is Status.OK else None
            truth.add(json.loads(row["config"]), Measurement(status, time_ms=time_ms))
    return list(problems.values())


def write_ground_truth(path: str | Path, truths: Iterable[GroundTruth]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        for truth in truths:
            for config in truth.configs:
                m = truth.outcomes[config_hash(config)]
                time_ms = f"{m.time_ms:.6g}" if m.ok else ""
                writer.writerow(
                    [truth.kernel, truth.shape_key, json.dumps(config, sort_keys=True), m.status.value, time_ms]
                )


def trials_to_reach(
    truth: GroundTruth, strategy: str, seed: int, tolerance: float = 0.03, initial: Sequence[Config] = ()
) -> int:
    """Trials a strategy spends until its best is within ``tolerance`` of the exhaustive best
    (the space's size if it never gets there). ``initial``: configs asked first, as a sweep's
    warm start (those outside the table are dropped, as a sweep prunes them)."""
    if truth.best_ms is None:  # no config ran: none can get there
        return len(truth.configs)
    target = truth.best_ms * (1 + tolerance)
    known = {config_hash(c) for c in truth.configs}
    initial = [c for c in initial if config_hash(c) in known]
    search = make_strategy(strategy, truth.space(), truth.configs, seed=seed, initial=initial)
    best = None
    while (config := search.ask()) is not None:
        m = truth.outcomes[config_hash(config)]
        search.tell(config, m)
        if m.ok and m.time_ms is not None and (best is None or m.time_ms < best):
            best = m.time_ms
        if best is not None and best <= target:
            return len(search.told)
    return len(truth.configs)


@dataclass(frozen=True)
class Efficiency:
    """One strategy's median, over seeds, of the trials to get within tolerance of the best."""

    strategy: str
    median_trials: float
    fraction: float  # of the space's size

    @property
    def within(self) -> bool:
        return self.fraction <= TARGET_FRACTION


#: the target: within 3% of the exhaustive best, in at most 20% of the space's size
TARGET_FRACTION = 0.20


def efficiency(
    truth: GroundTruth, strategy: str, seeds: int = 20, tolerance: float = 0.03, initial: Sequence[Config] = ()
) -> Efficiency:
    trials = [trials_to_reach(truth, strategy, seed, tolerance, initial) for seed in range(seeds)]
    median = statistics.median(trials)
    return Efficiency(strategy, median, median / len(truth.configs))
