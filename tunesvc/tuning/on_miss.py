"""The tune-on-miss policy that tunesvc hands to the runtime for mode 'tune' (see
:mod:`tunesvc.serving.on_miss`): sweep the missed key now with a ``budget``-trial sweep and
store it, so that every later lookup, in this process and others, finds it tuned.

Processes that miss the same key at once take a file lock beside the database: one sweeps, the
others wait and then read its winner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from filelock import FileLock

from tunesvc.runtime import _lock_path
from tunesvc.runtime import stored_winners
from tunesvc.store import Store
from tunesvc.sweep import run_sweep

if TYPE_CHECKING:
    from tunesvc.serving.on_miss import MissedKey
    from tunesvc.space import Config


def tune_on_miss(miss: MissedKey) -> dict[str, Config]:
    """Sweep ``miss``'s key and persist its winner, unless another process did while this one
    waited for the key's lock; the kernel's winners on the device afterwards."""
    template, device = miss.template, miss.device
    with FileLock(_lock_path(miss.db, template.name, miss.key)):
        table = stored_winners(miss.db, template, device, readonly=False)
        if miss.key in table:
            return table
        store = Store(miss.db)
        try:
            run_sweep(template, [miss.problem], store, strategy=miss.strategy, budget=miss.budget, device=device)
        finally:
            store.close()
        return stored_winners(miss.db, template, device, readonly=True)
