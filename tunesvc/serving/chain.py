"""The one chain: what a shape key is served, for shipped and captured kernels alike.

    exact shape key  ->  predicted (the kernel's selector, see tunesvc.serving.selector)
                     ->  nearest tuned key (the template's key distance, same categorical fields)
                     ->  transferred (a sibling GPU model's winner: same capability and SM count,
                         see tunesvc.serving.transfer)  ->  heuristic

Transferred comes after this model's own answers: a measurement on this model, even of a
neighbouring key, is preferred to one of the same key on another model (benchmarks/transfer.py
times both against a config tuned here). A sibling's winner is served only where the sibling's
own trials say it beat the heuristic there by a margin that grows with the key distance
(:func:`tunesvc.serving.transfer.judge`); elsewhere the heuristic is. Every answer says why, in
one sentence (:attr:`LookupResult.reason`), which `tune lookup` prints.

Its inputs come from one winner source (:mod:`tunesvc.serving.source`). The runtime walks it
over the winners it loaded (:meth:`tunesvc.serving.runtime.Runtime.answer`, a captured kernel's
miss included); a sweep asks it what a key it is about to tune was served before
(:func:`tunesvc.tuning.selector_fit.untuned_answer`), and `tune lookup` what a captured kernel's
key is served, so that all read one decision. The sources after exact are given as callables:
each is read only where the steps before it did not answer (a selector, a sibling's winners: a
database read on a kernel's first miss).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any

from tunesvc.serving import transfer as transfers
from tunesvc.text import visible

if TYPE_CHECKING:
    from tunesvc.device import Device
    from tunesvc.serving.selector import Selector
    from tunesvc.space import Config
    from tunesvc.template import Problem
    from tunesvc.template import ShapeKey
    from tunesvc.template import Template

EXACT, PREDICTED, NEAREST, TRANSFERRED, HEURISTIC, TUNED = (
    "exact",
    "predicted",
    "nearest",
    "transferred",
    "heuristic",
    "tuned",
)

#: the reasons of the answers that name nothing stored
TUNED_HERE = "exact: tuned on this GPU model for this key."
SELECTED = "predicted: the selector fitted on this GPU model's trials picked it among its winners."
NOTHING_TUNED = "heuristic: no winner of this key or a comparable one on this GPU model, nor a sibling's to transfer."
HEURISTIC_MODE = "heuristic: mode 'heuristic' reads no winners."
TUNED_NOW = "tuned: tuned on this GPU model on this miss."
NOTHING_RAN = "heuristic: no candidate ran correctly when this key was tuned on this miss."


@dataclass(frozen=True)
class LookupResult:
    kernel: str
    config: Config
    source: str  # exact | predicted | nearest | transferred | heuristic | tuned (tuned on this miss)
    key: str
    matched_key: str | None = None
    distance: float | None = None
    #: the sibling GPU model whose winner a transferred answer is (its name); None otherwise
    transferred_from: str | None = None
    #: why this answer, one sentence that starts with its source ("exact: tuned on this GPU model
    #: for this key"), stored names shown as text
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "config": self.config,
            "source": self.source,
            "key": self.key,
            "matched_key": self.matched_key,
            "distance": self.distance,
            "transferred_from": self.transferred_from,
            "reason": self.reason,
        }


#: a sibling model's winners of a kernel with their parsed keys (None: no sibling, or transfer off)
Sibling = tuple[transfers.SiblingTable, list[tuple["ShapeKey", str]]]


def answer(
    template: Template,
    problem: Problem,
    key: ShapeKey,
    device: Device,
    winners: dict[str, Config],
    parsed: Callable[[], list[tuple[ShapeKey, str]]],
    selector: Callable[[], Selector | None] = lambda: None,
    sibling: Callable[[], Sibling | None] = lambda: None,
) -> LookupResult:
    """The chain's answer for ``problem`` (its shape key ``key``) on ``device`` from this model's
    ``winners`` (shape key -> config; ``parsed()``: their keys parsed), the kernel's
    ``selector()`` and a sibling model's winners ``sibling()``."""
    text = str(key)
    if text in winners:
        return LookupResult(template.name, winners[text], EXACT, text, text, 0.0, reason=TUNED_HERE)
    fitted = selector()
    config = fitted.pick(template, problem, device) if fitted is not None else None
    if config is not None:
        return LookupResult(template.name, config, PREDICTED, text, reason=SELECTED)
    found = nearest(template, problem, key, device, winners, parsed())
    if found is not None:
        return found
    table = sibling()
    reason = NOTHING_TUNED
    if table is not None:
        moved = transfers.transferred(template, problem, key, table[0], table[1], device)
        if moved is not None:
            verdict = transfers.judge(table[0], moved)
            if verdict.serve:
                return LookupResult(
                    template.name,
                    moved.config,
                    TRANSFERRED,
                    text,
                    moved.matched_key,
                    moved.distance,
                    moved.sibling,
                    verdict.reason,
                )
            reason = verdict.reason
    return LookupResult(template.name, template.heuristic(problem, device), HEURISTIC, text, reason=reason)


def nearest(
    template: Template,
    problem: Problem,
    key: ShapeKey,
    device: Device,
    winners: dict[str, Config],
    parsed: list[tuple[ShapeKey, str]],
) -> LookupResult | None:
    """The winner of the nearest tuned key (the template's key distance; ties by key text) where
    it fits ``problem`` on ``device``; None where there is none, or it does not fit."""
    distance, matched = min(((template.key_distance(key, k), s) for k, s in parsed), default=(math.inf, None))
    if matched is None or distance == math.inf:
        return None
    config = winners[matched]
    if template.violations(config, problem, device):  # e.g. a tile taller than this M
        return None
    reason = visible(f"nearest: the winner tuned on this GPU model for {matched} (distance {distance:.2f}).")
    return LookupResult(template.name, config, NEAREST, str(key), matched, distance, reason=reason)
