"""Transferred answers: a sibling GPU model's winners, for a model with none of its own for a key.

Two GPU models are siblings when they share the compute capability and the SM count but not the
hardware id (an H100 SXM and an H200: sm_90, 132 SMs). The same SM count gives the same waves
of tiles and the same architecture the same shared memory, registers and instructions, so a
config that won on one is a measured answer on the other where the best config differs mostly
by memory bandwidth. The runtime serves it as its own tier, ``transferred``, naming the sibling,
and never stores it as this model's winner; a sweep on this model measures it first.

Where several siblings have winners of a kernel, the one with the most tuned keys of it answers
(ties: the device name, in sorted order), for every key: one sibling per kernel, so the answers
of one process come from one model's measurements.

**Served only where the evidence says it wins.** Nothing is measured where a transferred answer
is served (mode lookup), and a winner of one model can lose to the heuristic on the other (its
margin on the H100 shrinks on the H200, whose memory is faster). So the sibling's own trials
decide (:func:`judge`): the winner of the sibling key it would be served from must have run
faster than the heuristic's config of that key on the sibling by a margin that grows with the
distance from this key (:data:`MIN_MARGIN`, :data:`MARGIN_PER_DISTANCE`), within
:data:`MAX_DISTANCE`; where the heuristic was never timed there, there is no evidence, and the
heuristic is served. A sweep on this model (mode tune, `tune sweep`) measures the sibling's
winner first whatever its margin (tunesvc.tuning.sweep.sibling_warm_start).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from dataclasses import field
from typing import TYPE_CHECKING
from typing import Any

from tunesvc.template import ShapeKey
from tunesvc.text import visible

if TYPE_CHECKING:
    from tunesvc.device import Device
    from tunesvc.space import Config
    from tunesvc.template import Problem
    from tunesvc.template import Template


#: The sibling's winner must have beaten the heuristic there by this factor at distance 0: of
#: tune.db.example's 43 H100 matmul winners, each 1.20x or more faster there kept 0.80 of that on an
#: H200 or more (1.20 x 0.80 = 0.96; benchmarks/data/verify_h100_winners_on_h200.csv), one of 1.14x fell to 0.86x.
MIN_MARGIN = 1.20
#: Each unit of key distance (one doubling of one dim) asks 5% more: the margin was measured at the
#: sibling's key, and a doubling away moves the best tile by about one step.
MARGIN_PER_DISTANCE = 0.05
#: Farther than this (a doubling of two dims, 1.41, and some), the sibling's key says nothing of this one.
MAX_DISTANCE = 1.5


def required_margin(distance: float) -> float:
    """How much faster than the heuristic the sibling's winner must have run there, ``distance`` away."""
    return MIN_MARGIN + MARGIN_PER_DISTANCE * distance


@dataclass(frozen=True)
class SiblingTable:
    """One sibling model's winners of one kernel: shape key -> config, with the evidence for
    serving them blind (the winner's and the heuristic's times on the sibling, per key)."""

    #: the sibling's GPU name, as answers name it ("NVIDIA H100 80GB HBM3")
    name: str
    hardware_id: str
    winners: dict[str, Config]
    #: shape key -> the winner's time on the sibling, ms
    winner_ms: dict[str, float] = field(default_factory=dict)
    #: shape key -> the time on the sibling of the heuristic's config of that key, ms (absent: never
    #: timed there, or not read: a bundle holds no trials)
    heuristic_ms: dict[str, float] = field(default_factory=dict)

    def parsed(self) -> list[tuple[ShapeKey, str]]:
        return [(ShapeKey.parse(k), k) for k in self.winners]


@dataclass(frozen=True)
class Transferred:
    """A sibling's winner that fits this problem on this device."""

    sibling: str
    matched_key: str
    distance: float
    config: Config


def is_sibling(device: Device, capability: str, sm_count: int, hardware_id: str) -> bool:
    """Whether a GPU model of this capability, SM count and hardware id is ``device``'s sibling."""
    return (
        device.is_gpu
        and capability == device.capability
        and sm_count == device.sm_count
        and hardware_id != device.hardware_id
    )


def pick_sibling(entries: Iterable[Any]) -> SiblingTable | None:
    """The sibling table of entries read from a store (each with ``device``, ``hardware_id``,
    ``shape_key``, ``config``; oldest first, so the newest measurement of a key wins): the
    model with the most keys, ties by name; None where there are none."""
    tables: dict[str, SiblingTable] = {}
    for e in entries:
        table = tables.setdefault(e.hardware_id, SiblingTable(e.device or e.hardware_id, e.hardware_id, {}))
        table.winners[e.shape_key] = {**e.config}
        table.winner_ms[e.shape_key] = e.time_ms
    if not tables:
        return None
    return min(tables.values(), key=lambda t: (-len(t.winners), t.name, t.hardware_id))


def transferred(
    template: Template,
    problem: Problem,
    key: ShapeKey,
    table: SiblingTable,
    parsed: list[tuple[ShapeKey, str]],
    device: Device,
) -> Transferred | None:
    """The sibling's winner of this key, else of its nearest tuned key (the template's key
    distance), skipping every config that does not fit ``problem`` on ``device`` (its space's
    constraints with this device's limits: shared memory, SM count); None where none fits."""
    text = str(key)
    ranked = sorted((0.0 if k == text else template.key_distance(key, parsed_key), k) for parsed_key, k in parsed)
    for distance, matched in ranked:
        if distance == math.inf:
            break
        config = table.winners[matched]
        if not template.violations(config, problem, device):
            return Transferred(table.name, matched, distance, config)
    return None


@dataclass(frozen=True)
class Verdict:
    """Whether a transferred answer is served blind, and why, in one sentence."""

    serve: bool
    reason: str


def judge(table: SiblingTable, moved: Transferred) -> Verdict:
    """Whether the sibling's evidence says ``moved`` beats the heuristic: its winner ran at least
    :func:`required_margin` times faster than the heuristic's config at its own key on the sibling,
    and that key is at most :data:`MAX_DISTANCE` away. The reason names the sibling, the key, the
    distance and the margin (stored text, shown with :func:`~tunesvc.text.visible`)."""
    winner = f"the {table.name} winner of {moved.matched_key} (distance {moved.distance:.2f})"
    if moved.distance > MAX_DISTANCE:
        return Verdict(False, visible(f"heuristic: {winner} is farther than {MAX_DISTANCE:g} from this key."))
    heuristic_ms = table.heuristic_ms.get(moved.matched_key)
    winner_ms = table.winner_ms.get(moved.matched_key)
    if heuristic_ms is None or not winner_ms:
        return Verdict(
            False,
            visible(f"heuristic: {winner} has no timing of the heuristic beside it there, so no evidence it wins."),
        )
    margin, needed = heuristic_ms / winner_ms, required_margin(moved.distance)
    if margin < needed:
        return Verdict(
            False,
            visible(
                f"heuristic: {winner} ran only {margin:.2f}x the heuristic there (at least {needed:.2f}x is served)."
            ),
        )
    return Verdict(
        True,
        visible(f"transferred: {winner} ran {margin:.2f}x faster than the heuristic there (at least {needed:.2f}x)."),
    )
