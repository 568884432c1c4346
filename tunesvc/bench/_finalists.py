"""Interleaved re-timing: configs already checked, timed round-robin over long graph replays, so
that they are compared on times all taken the same way (see docs/timing.md). Which trials are
re-timed, and what their rounds make, is the finalist rule of :mod:`tunesvc.tuning.key`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from typing import TypeVar

from tunesvc.bench._base import FINALIST_ROUNDS
from tunesvc.bench._base import Measurement
from tunesvc.bench._base import Measurer

K = TypeVar("K")


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
