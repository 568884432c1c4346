from __future__ import annotations

import random

from tunesvc.search._base import Strategy
from tunesvc.space import Config
from tunesvc.space import config_hash


class RandomStrategy(Strategy):
    """Warm-start configs first, then the feasible set in a seeded random order: the baseline."""

    name = "random"

    def ask(self) -> Config | None:
        if not hasattr(self, "_order"):
            self._order = [*self.initial, *random.Random(self.seed).sample(self.candidates, len(self.candidates))]
        for config in self._order:
            key = config_hash(config)
            if key not in self.told and key not in self.asked:
                self.asked.add(key)
                return config
        return None
