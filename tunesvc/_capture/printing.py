"""``TRITON_PRINT_AUTOTUNING=1`` under capture: the line Triton's autotuner prints per key it tunes.

:func:`print_resolved` prints, once per key (at its first resolution), Triton's own line for a key
tuned here (the key, the tuning's seconds, the best config), and the same kind of line for a key
served from the store or served untuned (no seconds: nothing was tuned).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any

from tunesvc import settings
from tunesvc._capture.bench import benchmarks_one_config

if TYPE_CHECKING:
    from triton.runtime.autotuner import Autotuner

#: how a key's config came, as the line says it (a key with one config, or tuned: Triton's words)
_SERVED = {
    "stored": "served from the tunesvc store (not tuned in this process)",
    "fallback": "served untuned (no stored winner; mode lookup)",
    "heuristic": "served untuned (mode heuristic)",
    "untuned": "served untuned (one config left by pruning)",
}

#: how the config this thread's :func:`~tunesvc._capture.miss.config_for` returned came: a key of
#: :data:`_SERVED` (read by :func:`~tunesvc._capture.miss.resolve_config`, which knows a tuned key)
HOW = threading.local()


def printing() -> bool:
    """Whether Triton's autotuner prints: ``knobs.autotuning.print`` where this Triton has it,
    else $TRITON_PRINT_AUTOTUNING as older Tritons read it."""
    import triton

    autotuning = getattr(getattr(triton, "knobs", None), "autotuning", None)
    if autotuning is not None and hasattr(autotuning, "print"):
        return bool(autotuning.print)
    return settings.text("TRITON_PRINT_AUTOTUNING") == "1"


def print_resolved(tuner: Autotuner, key: tuple, config: Any, how: str | None, pruned: Callable[[], list[Any]]) -> None:
    """Print the line for a key just resolved (``how``: ``tuned`` or a key of :data:`_SERVED`),
    unless the call's pruning kept one config and this Triton prints nothing for it (nothing was
    chosen; see :func:`~tunesvc._capture.bench.benchmarks_one_config`). Never raises: a line
    that cannot be printed (a closed stdout) is not the launch's failure."""
    try:
        if not printing() or (len(pruned()) < 2 and not benchmarks_one_config()):
            return
        if how == "tuned":
            done = f"finished after {tuner.bench_time:.2f}s"
        elif how in _SERVED:
            done = _SERVED[how]
        else:
            return
        print(
            f"Triton autotuning for function {tuner.base_fn.__name__},\nwith key as {key},\n"
            f"{done},\nbest config selected: {config};"
        )
    except Exception:  # printing fails open: the launch goes on
        pass
