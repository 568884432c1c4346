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
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any

from tunesvc.template import ShapeKey

if TYPE_CHECKING:
    from tunesvc.device import Device
    from tunesvc.space import Config
    from tunesvc.template import Problem
    from tunesvc.template import Template


@dataclass(frozen=True)
class SiblingTable:
    """One sibling model's winners of one kernel: shape key -> config."""

    #: the sibling's GPU name, as answers name it ("NVIDIA H100 80GB HBM3")
    name: str
    hardware_id: str
    winners: dict[str, Config]

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
