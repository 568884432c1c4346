"""Mode 'tune': a shape key with no winner is handed to a policy that the tuning side registers.

The runtime never imports the sweep. On a miss in mode 'tune' it calls the policy registered
here with a :class:`MissedKey` and serves the winner the policy stored. tunesvc's package root
registers the tuning side's, :func:`tunesvc.tuning.on_miss.tune_on_miss` (sweep the key under
the one key claim, store it), imported on the first miss; :func:`register` hands over another (one
that records misses for an offline sweep, a test's).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Protocol

if TYPE_CHECKING:
    from tunesvc.device import Device
    from tunesvc.space import Config
    from tunesvc.template import Problem
    from tunesvc.template import Template


@dataclass(frozen=True)
class MissedKey:
    """A shape key that a runtime in mode 'tune' found no winner for, and how to tune it."""

    #: the database the runtime reads winners from, where the tuned winner is to be stored
    db: str | os.PathLike
    template: Template
    problem: Problem
    #: the problem's shape key, as text
    key: str
    device: Device
    #: the search strategy and trial budget the runtime was given
    strategy: str
    budget: int


class TuneOnMiss(Protocol):
    """What mode 'tune' does with a miss."""

    def __call__(self, miss: MissedKey) -> dict[str, Config]:
        """Tune ``miss`` (or wait for whoever does) and return the winners of its kernel (its
        current version) on its device's model that the database holds afterwards, shape key ->
        config. A key that could not be tuned (no candidate ran correctly) is absent: the runtime
        then launches the heuristic config, never a guess called tuned."""
        ...


_policy: TuneOnMiss | None = None


def register(policy: TuneOnMiss) -> TuneOnMiss | None:
    """Make ``policy`` what every runtime in mode 'tune' does with a miss; returns the one it replaces."""
    global _policy
    previous, _policy = _policy, policy
    return previous


def policy() -> TuneOnMiss:
    """The registered policy (tunesvc's package root registers the tuning side's on import)."""
    if _policy is None:
        from tunesvc.errors import TunesvcError

        raise TunesvcError(
            "Mode 'tune' has no tune-on-miss policy registered; register one with "
            "tunesvc.serving.on_miss.register, or use mode 'lookup'."
        )
    return _policy
