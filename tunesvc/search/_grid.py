from __future__ import annotations

from tunesvc.search._base import Strategy
from tunesvc.space import Config
from tunesvc.space import config_hash


class GridStrategy(Strategy):
    """Every feasible config once, warm-start configs first, then in the space's order."""

    name = "grid"

    def ask(self) -> Config | None:
        for config in (*self.initial, *self.candidates):
            key = config_hash(config)
            if key not in self.told and key not in self.asked:
                self.asked.add(key)
                return config
        return None
