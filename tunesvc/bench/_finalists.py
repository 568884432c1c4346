"""Finalists: the fastest trials of a key re-timed in interleaved rounds over long graph replays,
so that the winner is chosen on times all taken the same way (see docs/timing.md)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import TYPE_CHECKING

from tunesvc.bench._base import Measurement
from tunesvc.bench._base import Measurer
from tunesvc.bench._base import Status

if TYPE_CHECKING:
    from tunesvc.store.models import Trial

#: rounds of the finalists' interleaved re-measurement
FINALIST_ROUNDS = 3


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
        for row in batch:
            timings.setdefault(row.id, [])
        for _ in range(rounds):
            for row in batch:
                timings[row.id].append(measurer.time_only(dict(row.config), rep_ms / rounds, graph_ms))
        for row in batch:
            results[row.id] = _finalist_result(row, timings[row.id])
        timed = [(m.time_ms, i) for i, m in results.items() if m.ok and m.time_ms is not None]
        if not timed:
            break
        best_ms, best_id = min(timed)
        faster = [r for r in ok if r.id not in results and (r.time_ms or 0.0) < best_ms]
        batch = [next(r for r in ok if r.id == best_id), *faster] if faster else []
    return list(results.items())


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
