"""Search strategies behind one ask/tell protocol (see :mod:`tunesvc.search._base`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tunesvc.errors import TunesvcError
from tunesvc.search._base import Strategy
from tunesvc.search._grid import GridStrategy
from tunesvc.search._random import RandomStrategy

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tunesvc.space import Config
    from tunesvc.space import Space

#: grid: every feasible config; random: a seeded shuffle (the baseline); optuna: TPE;
#: cmaes: CMA-ES and gp: Gaussian process, both over parameters as indices of sorted choices
STRATEGIES = ("grid", "random", "optuna", "cmaes", "gp")
#: the strategies that keep an Optuna study (and can persist it in the database)
OPTUNA_STRATEGIES = ("optuna", "cmaes", "gp")


def make_strategy(
    name: str,
    space: Space,
    candidates: list[Config],
    *,
    seed: int = 0,
    initial: Sequence[Config] = (),
    storage: str | None = None,
    study_name: str | None = None,
) -> Strategy:
    """A strategy by name; ``storage``/``study_name`` persist an Optuna strategy's study."""
    if name == "grid":
        return GridStrategy(space, candidates, seed=seed, initial=initial)
    if name == "random":
        return RandomStrategy(space, candidates, seed=seed, initial=initial)
    if name in OPTUNA_STRATEGIES:
        from tunesvc.search import _optuna  # optuna is imported only when used

        cls = {"optuna": _optuna.OptunaStrategy, "cmaes": _optuna.CmaEsStrategy, "gp": _optuna.GPStrategy}[name]
        return cls(space, candidates, seed=seed, initial=initial, storage=storage, study_name=study_name)
    raise TunesvcError(f"Unknown strategy '{name}'; use one of {', '.join(STRATEGIES)}.")


__all__ = ["OPTUNA_STRATEGIES", "STRATEGIES", "GridStrategy", "RandomStrategy", "Strategy", "make_strategy"]
