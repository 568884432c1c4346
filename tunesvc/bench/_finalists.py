"""Finalists: the fastest trials of a key re-timed in interleaved rounds over long graph replays,
so that the winner is chosen on times all taken the same way (see docs/timing.md)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any
from typing import TypeVar

from tunesvc.bench._base import Measurement
from tunesvc.bench._base import Measurer
from tunesvc.bench._base import Status

if TYPE_CHECKING:
    from tunesvc.records import TrialRecord as Trial

#: rounds of the finalists' interleaved re-measurement
FINALIST_ROUNDS = 3

K = TypeVar("K")


def remeasure_finalists(
    measurer: Measurer,
    rows: list[Trial],
    k: int,
    rep_ms: float,
    keep: Iterable[str] = (),
    graph_ms: float | None = None,
    rounds: int = FINALIST_ROUNDS,
) -> list[tuple[int, Measurement]]:
    """Re-time the k fastest correct trials, and those of the configs hashed in ``keep``,
    round-robin; each one's median of rounds, by trial id.

    Interleaving puts every finalist under the same clocks and temperatures, so a config whose
    first measurement was lucky falls back before it can be declared the winner. A finalist's
    rounds are timed longer than a first measurement (``Measurer.time_only``), and a GPU at its
    power cap times a compute-bound kernel slower over a long replay than over a short one (see
    ``tunesvc.bench._inprocess.FIRST_GRAPH_SHARE``): so a trial whose first time is below the
    fastest finalist's new one is re-timed too, with that finalist, until none is left, and the
    winner (the fastest correct trial) has been timed as every trial that could beat it. A
    round times for rep_ms / ``rounds``, its graph replays ``graph_ms`` each (default:
    ``Measurer.time_only``'s). A finalist that fails now (a crash, a timeout) keeps that status
    and cannot win.
    """
    ok = sorted((r for r in rows if r.status == "ok" and r.time_ms is not None), key=lambda r: r.time_ms or 0.0)
    keep = set(keep)
    batch = ok[:k] + [r for r in ok[k:] if r.config_hash in keep]
    if len(batch) < 2:
        return []
    timings: dict[int, list[Measurement]] = {}
    results: dict[int, Measurement] = {}
    while batch:
        for i, measured in timed_in_rounds(measurer, {r.id: r.config for r in batch}, rep_ms, rounds, graph_ms).items():
            timings.setdefault(i, []).extend(measured)
        for row in batch:
            results[row.id] = _finalist_result(row, timings[row.id])
        timed = [(m.time_ms, i) for i, m in results.items() if m.ok and m.time_ms is not None]
        if not timed:
            break
        best_ms, best_id = min(timed)
        faster = [r for r in ok if r.id not in results and (r.time_ms or 0.0) < best_ms]
        batch = [next(r for r in ok if r.id == best_id), *faster] if faster else []
    return list(results.items())


def timed_in_rounds(
    measurer: Measurer,
    configs: Mapping[K, Mapping[str, Any]],
    rep_ms: float,
    rounds: int = FINALIST_ROUNDS,
    graph_ms: float | None = None,
) -> dict[K, list[Measurement]]:
    """Each config timed ``rounds`` times, round-robin, each time for rep_ms / ``rounds``
    (``Measurer.time_only``, graph replays of ``graph_ms``): every config under the same clocks
    and temperatures as the others. No reference check: the configs were checked before."""
    timings: dict[K, list[Measurement]] = {key: [] for key in configs}
    for _ in range(rounds):
        for key, config in configs.items():
            timings[key].append(measurer.time_only(dict(config), rep_ms / rounds, graph_ms))
    return timings


def _finalist_result(row: Trial, rounds: list[Measurement]) -> Measurement:
    """A finalist's measurement from its rounds: the first failure, else their median (its
    first measurement left out: it was timed over shorter replays)."""
    failed = next((m for m in rounds if not m.ok), None)
    if failed is not None:
        return Measurement(failed.status, message=f"as a finalist: {failed.message}")
    times = sorted(m.time_ms or 0.0 for m in rounds)
    median = statistics.median(times)
    reps = row.reps + sum(m.reps for m in rounds)
    return Measurement(Status.OK, time_ms=median, spread=(times[-1] - times[0]) / median, reps=reps)
