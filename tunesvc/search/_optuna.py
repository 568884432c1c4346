from __future__ import annotations

from typing import TYPE_CHECKING

import optuna

from tunesvc.search._base import Strategy
from tunesvc.space import Config
from tunesvc.space import config_hash

if TYPE_CHECKING:
    from tunesvc.bench import Measurement
    from tunesvc.space import Space

# Optuna proposes from the whole space; infeasible or repeated proposals cost no benchmark,
# so it may take many of them before it finds a new feasible config.
MAX_PROPOSALS_PER_ASK = 2000


class OptunaStrategy(Strategy):
    """Optuna's TPE sampler over the space's categorical parameters.

    Infeasible proposals are told to the study as failed (no benchmark is spent); a proposal
    already measured is told its stored value at once. Stored trials from an earlier run are
    added to the study, so a resumed sweep samples where the killed one left off.
    """

    name = "optuna"

    def __init__(self, space: Space, candidates: list[Config], *, seed: int = 0, initial: list[Config] = ()) -> None:
        super().__init__(space, candidates, seed=seed, initial=initial)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(10, max(1, len(candidates) // 4)))
        self.study = optuna.create_study(direction="minimize", sampler=sampler)
        for config in self.initial:
            self.study.enqueue_trial(config, skip_if_exists=True)
        self._pending: dict[str, optuna.Trial] = {}

    def ask(self) -> Config | None:
        for _ in range(MAX_PROPOSALS_PER_ASK):
            if self.exhausted:
                return None
            trial = self.study.ask()
            config = self.space.suggest(trial)
            key = config_hash(config)
            if key not in self._feasible:
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            elif key in self.told:
                self._tell_study(trial, self.told[key])
            elif key in self._pending:
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            else:
                self._pending[key] = trial
                return config
        # TPE keeps proposing known configs: fall back to the first unmeasured candidate
        return next((c for c in self.candidates if config_hash(c) not in self.told), None)

    def tell(self, config: Config, measurement: Measurement) -> None:
        super().tell(config, measurement)
        trial = self._pending.pop(config_hash(config), None)
        if trial is not None:
            self._tell_study(trial, measurement)
        else:
            state = optuna.trial.TrialState.COMPLETE if measurement.ok else optuna.trial.TrialState.FAIL
            self.study.add_trial(
                optuna.trial.create_trial(
                    params=config,
                    distributions=self.space.distributions(),
                    value=measurement.time_ms if measurement.ok else None,
                    state=state,
                )
            )

    def _tell_study(self, trial: optuna.Trial, measurement: Measurement) -> None:
        if measurement.ok:
            self.study.tell(trial, measurement.time_ms)
        else:
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
