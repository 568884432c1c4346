from __future__ import annotations

import random
from typing import TYPE_CHECKING

import optuna

from tunesvc.search._base import Strategy
from tunesvc.space import Config
from tunesvc.space import config_hash

if TYPE_CHECKING:
    from tunesvc.bench import Measurement
    from tunesvc.space import Space

# Infeasible or repeated proposals cost no benchmark, but each one is a study trial that makes
# the next TPE ask slower; past this many misses in a row, a random unmeasured candidate is used.
MAX_MISSES_PER_ASK = 50


class OptunaStrategy(Strategy):
    """Optuna's TPE sampler over the space's categorical parameters.

    Each parameter is sampled only among the values that occur in the feasible set (for M=16
    that is BLOCK_M=16 alone); a proposal that still breaks a constraint is told to the study
    as failed, with no benchmark spent, and one already measured is told its stored value.
    Stored trials from an earlier run are added to the study, so a resumed sweep samples where
    the killed one left off.
    """

    name = "optuna"

    def __init__(self, space: Space, candidates: list[Config], *, seed: int = 0, initial: list[Config] = ()) -> None:
        super().__init__(space, candidates, seed=seed, initial=initial)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(10, max(1, len(candidates) // 4)))
        self.study = optuna.create_study(direction="minimize", sampler=sampler)
        self._distributions = space.distributions(candidates)
        self._rng = random.Random(seed)
        for config in self.initial:
            self.study.enqueue_trial(config, skip_if_exists=True)
        self._pending: dict[str, optuna.Trial] = {}

    def ask(self) -> Config | None:
        for _ in range(MAX_MISSES_PER_ASK):
            if self.exhausted:
                return None
            trial = self.study.ask(self._distributions)
            config = {name: trial.params[name] for name in self.space.names}
            key = config_hash(config)
            if key not in self._feasible:
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            elif key in self.told:
                self._tell_study(trial, self.told[key])
            elif key in self._pending:
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            else:
                self._pending[key] = trial
                self.asked.add(key)
                return config
        left = [c for c in self.candidates if config_hash(c) not in self.told and config_hash(c) not in self.asked]
        if not left:
            return None
        config = self._rng.choice(left)
        self.asked.add(config_hash(config))
        return config

    def tell(self, config: Config, measurement: Measurement) -> None:
        super().tell(config, measurement)
        trial = self._pending.pop(config_hash(config), None)
        if trial is not None:
            self._tell_study(trial, measurement)
        elif config_hash(config) in self._feasible:  # a stored result: teach the sampler
            state = optuna.trial.TrialState.COMPLETE if measurement.ok else optuna.trial.TrialState.FAIL
            self.study.add_trial(
                optuna.trial.create_trial(
                    params=config,
                    distributions=self._distributions,
                    value=measurement.time_ms if measurement.ok else None,
                    state=state,
                )
            )

    def _tell_study(self, trial: optuna.Trial, measurement: Measurement) -> None:
        if measurement.ok:
            self.study.tell(trial, measurement.time_ms)
        else:
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
