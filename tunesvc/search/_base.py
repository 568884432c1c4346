"""The search protocol.

A :class:`Strategy` proposes configs and learns from their measurements, one at a time::

    strategy = make_strategy("optuna", space, candidates, seed=0)
    for config, measurement in already_stored:      # resume: replay what is known
        strategy.tell(config, measurement)
    while (config := strategy.ask()) is not None:   # None: nothing left to propose
        strategy.tell(config, bench.measure(config))

``candidates`` is the feasible set for the problem and device (constraints already applied);
``initial`` configs are proposed first (warm start: the heuristic, neighbouring winners).
``ask`` may be called several times before the matching ``tell`` calls (a batch to compile
in parallel); it never proposes a config that is asked and not yet told.
The sweep owns the budget; a strategy only decides what to try next.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING

from tunesvc.space import config_hash

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tunesvc.bench import Measurement
    from tunesvc.space import Config
    from tunesvc.space import Space


class Strategy(abc.ABC):
    """Proposes configs of one feasible set, one :meth:`ask` at a time, and learns from :meth:`tell`.

    The rules every strategy keeps (``tests/test_strategy_contract.py`` runs them over each one
    in :data:`~tunesvc.search.STRATEGIES`):

    * **Inside the feasible set**: :meth:`ask` returns one of ``candidates`` (so never a config
      outside the space or breaking its constraints), or None.
    * **No repeats**: never a config already told, nor one asked and not yet told.
    * **Exhaustion**: once every candidate is told (:attr:`exhausted`), or asked and pending,
      :meth:`ask` returns None; a sweep's budget below the set's size is the sweep's to keep
      (it stops asking), and a strategy asked again after any number of tells goes on proposing.
    * **Warm start**: the feasible ``initial`` configs are proposed before any other.
    * **Failures are data**: a measurement that is not OK (wrong result, compile error, crash)
      is told like any other; the config is not proposed again and the search goes on.
    * **Determinism**: the same space, candidates, seed and sequence of tells give the same
      proposals (grid: whatever the seed).
    """

    name: str

    def __init__(
        self, space: Space, candidates: list[Config], *, seed: int = 0, initial: Sequence[Config] = ()
    ) -> None:
        self.space = space
        self.candidates = candidates
        self.seed = seed
        self._feasible = {config_hash(c) for c in candidates}
        self.initial = [c for c in initial if config_hash(c) in self._feasible]
        self.told: dict[str, Measurement] = {}
        #: proposed and not yet told: a sweep may ask for several configs before measuring any
        self.asked: set[str] = set()

    @property
    def exhausted(self) -> bool:
        return self._feasible <= self.told.keys()

    @abc.abstractmethod
    def ask(self) -> Config | None:
        """The next config to measure, or None when the strategy has nothing left."""

    def tell(self, config: Config, measurement: Measurement) -> None:
        """Record a measurement (of a config this strategy proposed, or a stored one)."""
        key = config_hash(config)
        self.told[key] = measurement
        self.asked.discard(key)
