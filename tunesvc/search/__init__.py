"""Search strategies behind one ask/tell protocol (see :mod:`tunesvc.search._base`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tunesvc.errors import TunesvcError
from tunesvc.search._base import Strategy
from tunesvc.search._grid import GridStrategy

if TYPE_CHECKING:
    from tunesvc.space import Config
    from tunesvc.space import Space

STRATEGIES = ("grid", "optuna")


def make_strategy(name: str, space: Space, candidates: list[Config], *, seed: int = 0, initial: list[Config] = ()) -> Strategy:
    if name == "grid":
        return GridStrategy(space, candidates, seed=seed, initial=initial)
    if name == "optuna":
        from tunesvc.search._optuna import OptunaStrategy  # optuna is imported only when used

        return OptunaStrategy(space, candidates, seed=seed, initial=initial)
    raise TunesvcError(f"Unknown strategy '{name}'; use one of {', '.join(STRATEGIES)}.")


__all__ = ["STRATEGIES", "GridStrategy", "Strategy", "make_strategy"]
