"""The tune-on-miss policy that tunesvc hands to the runtime for mode 'tune' (see
:mod:`tunesvc.serving.on_miss`): sweep the missed key now with a ``budget``-trial sweep and
store it, so that every later lookup, in this process and others, finds it tuned.

Processes (on any host sharing the database) that miss the same key at once go through the one
key claim (:class:`tunesvc.tuning.claim.KeyClaim`, as captured kernels do): one sweeps, the
others wait and then read its winner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tunesvc.serving.runtime import stored_winners
from tunesvc.store import Store
from tunesvc.tuning.claim import KeyClaim
from tunesvc.tuning.sweep import run_sweep

if TYPE_CHECKING:
    from tunesvc.serving.on_miss import MissedKey
    from tunesvc.space import Config


def tune_on_miss(miss: MissedKey) -> dict[str, Config]:
    """Sweep ``miss``'s key and persist its winner, unless another process did while this one
    waited for the key's claim; the kernel's winners on the device afterwards."""
    template, device = miss.template, miss.device
    store = Store(miss.db)
    try:

        def winner() -> dict[str, Config] | None:
            table = stored_winners(miss.db, template, device, readonly=False)
            return table if miss.key in table else None

        ident = f"{template.name}|{template.version}|{device.hardware_id}|{miss.key}"
        with KeyClaim(store, template.name, ident, miss.key, winner) as claim:
            if claim.winner is not None:
                return claim.winner
            run_sweep(template, [miss.problem], store, strategy=miss.strategy, budget=miss.budget, device=device)
    finally:
        store.close()
    return stored_winners(miss.db, template, device, readonly=True)
