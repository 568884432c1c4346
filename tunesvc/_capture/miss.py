"""A key's first launch: its config stored, tuned now, or the fallback; and the keys left to Triton.

:func:`_resolve` resolves a key the launch path has not met (one thread per kernel; the others
then find it); :func:`_check_key` leaves to Triton a kernel whose key cannot name a stored winner;
:func:`_config_for` reads the store, then tunes (mode tune), serves the one chain's answer and
records the miss (lookup), or takes the first config Triton's pruning keeps (heuristic). A key met
while tunesvc is measuring is answered without tuning (:func:`_nested_config`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any

import torch

from tunesvc import settings
from tunesvc._capture.bench import _nested
from tunesvc._capture.bench import _Pruned
from tunesvc._capture.failopen import _STAGE
from tunesvc._capture.failopen import FAILED_OPEN
from tunesvc._capture.failopen import STATS
from tunesvc._capture.failopen import _give_up
from tunesvc._capture.failopen import _LeftToTriton
from tunesvc._capture.identity import _value_text
from tunesvc._capture.identity import key_text
from tunesvc._capture.recorded import _record_miss
from tunesvc._capture.sharing import _shared_for
from tunesvc._capture.tune import _tune_locked
from tunesvc.settings import HEURISTIC
from tunesvc.settings import LOOKUP
from tunesvc.store import DatabaseLocked

if TYPE_CHECKING:
    from triton.runtime.autotuner import Autotuner

    from tunesvc._capture.sharing import _State


def _triton_key(tuner: Autotuner, nargs: dict[str, Any]) -> tuple:
    """The key Autotuner.run caches a config under: key values, then dtype names."""
    return tuple(
        [nargs[k] for k in tuner.keys if k in nargs] + [str(v.dtype) for v in nargs.values() if hasattr(v, "dtype")]
    )


def _nested_config(state: _State, text: str, pruned: Callable[[], list[Any]]) -> Any:
    """A key met inside tunesvc's measuring: the one chain's answer (no tuning, nothing said)."""
    STATS["nested"] += 1
    return _shared_for(state.settings).answer(state, text, pruned, said=False)[0]


def _resolve(
    tuner: Autotuner, state: _State, key: tuple, nargs: dict[str, Any], args: tuple, kwargs: dict[str, Any]
) -> tuple[Any, dict[str, Any]]:
    """The config of a key this process has not met: stored, tuned now, or the fallback."""
    if _nested():  # before the lock: the measuring may be this kernel's own, holding it
        config = _nested_config(
            state, _key_text_of(tuner, _triton_key(tuner, nargs), nargs), _Pruned(tuner, args, kwargs)
        )
        return config, config.all_kwargs()
    with state.lock:  # one thread resolves a key; the others then find it
        hit = state.chosen.get(key)
        if hit is not None:
            return hit
        triton_key = _triton_key(tuner, nargs)
        _check_key(tuner, state, triton_key, nargs)
        config = _config_for(tuner, state, _key_text_of(tuner, triton_key, nargs), args, kwargs)
        tuner.cache[triton_key] = config
        hit = state.chosen[key] = (config, config.all_kwargs())
        state.keys_met += 1
        return hit


def _by_identity(value: Any) -> bool:
    """Whether a key value is hashed by its identity (a tensor, or an object that keeps object's
    own hash): then an equal value in the next call is another key, to Triton and to the store."""
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, tuple):
        return any(_by_identity(v) for v in value)
    # None and torch's dtypes are singletons: hashed by identity, and the same in every call
    return value is not None and not isinstance(value, torch.dtype) and type(value).__hash__ is object.__hash__


def _check_key(tuner: Autotuner, state: _State, key: tuple, nargs: dict[str, Any]) -> None:
    """Leave to Triton (:class:`_LeftToTriton`) a kernel whose key cannot name a stored winner: a
    key argument hashed by its identity (a tensor: Triton keys it so, and every call is a new
    key), or more distinct keys than settings.max_keys() in this process (a
    key that changes on almost every call). Said once; the store gets no further rows of it."""
    values = key[: len([k for k in tuner.keys if k in nargs])]
    odd = next((v for v in values if _by_identity(v)), None)
    if odd is not None:
        reason = f"its key holds a {type(odd).__name__} argument, which is a new key on every call"
    elif state.keys_met >= settings.max_keys():
        reason = f"it met {state.keys_met} distinct keys, more than TUNESVC_MAX_KEYS allows; its key changes on almost every call"
    else:
        return
    _give_up(state, reason, "a key that changes on every call", stacklevel=5)
    raise _LeftToTriton


def _key_text_of(tuner: Autotuner, key: tuple, nargs: dict[str, Any]) -> str:
    """A key tuple as stored text, named by the key arguments and the dtypes' arguments; a key a
    subclass builds its own way (other lengths) by position."""
    names = [k for k in tuner.keys if k in nargs]
    dtype_names = [k for k, v in nargs.items() if hasattr(v, "dtype")]
    if len(key) == len(names) + len(dtype_names):
        return key_text(names, key, dtype_names)
    return ",".join(f"key{i}={_value_text(v)}" for i, v in enumerate(key))


def _config_for(tuner: Autotuner, state: _State, text: str, args: tuple, kwargs: dict[str, Any]) -> Any:
    """The config for a key's text: stored, else tuned now (mode tune) or the fallback (lookup);
    in mode heuristic the first config the pruning keeps, nothing read."""
    pruned = _Pruned(tuner, args, kwargs)
    if state.settings.mode == HEURISTIC:
        with _STAGE("prune"):
            config = pruned()[0]
        STATS["heuristic"] += 1
    else:
        shared = _shared_for(state.settings)
        with _STAGE("look up"):
            table = shared.table(state.template)
            config = state.match(table.get(text), pruned)
        if config is not None:
            STATS["stored"] += 1
        elif state.settings.mode == LOOKUP:
            with _STAGE("look up"):
                config, _ = shared.answer(state, text, pruned)
            _record_miss(shared, state, text, tuner, args, kwargs)
            STATS["fallback"] += 1
        else:
            config = _tune_unless_locked(tuner, state, shared, text, args, kwargs, pruned)
    if len(tuner.configs) > 1:
        # triton.autotune zeroes the reset_to_zero arguments after benchmarking a key, so the
        # launch that follows a key's first resolution starts from zero: so does this one
        tuner.pre_hook({**dict(zip(tuner.arg_names, args)), **kwargs, **config.all_kwargs()}, reset_only=True)
    return config


#: the summary's reason for the keys left to Triton while another process held the write lock
LOCKED_REASON = "keys met while another process held the database's write lock"


def _tune_unless_locked(
    tuner: Autotuner, state: _State, shared: Any, text: str, args: tuple, kwargs: dict[str, Any], pruned: _Pruned
) -> Any:
    """:func:`_tune_locked`, unless another process holds the database's write lock: then this
    launch is Triton's own (it benchmarks, as without capture) and the key is left for a later
    run; the first such wait (at most LOCK_WAIT_S, twice where a claim was held) is said once and
    ends the process's writes (:meth:`~tunesvc._capture.sharing._Shared.lock_out`), so a peer's
    lock costs a program a few seconds in all, not a wait per kernel or key."""
    if shared.locked_out is None:
        try:
            return _tune_locked(tuner, state, shared, text, args, kwargs, pruned)
        except DatabaseLocked as exc:
            shared.lock_out(exc, stacklevel=5)
    FAILED_OPEN[LOCKED_REASON] += 1
    raise _LeftToTriton
