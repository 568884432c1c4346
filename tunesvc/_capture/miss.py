"""A key's first launch: its config stored, tuned now, or the fallback; and the keys left to Triton.

:func:`resolve_config` resolves a key the launch path has not met (one thread per kernel; the others
then find it); :func:`_check_key` leaves to Triton a kernel whose key cannot name a stored winner;
:func:`config_for` reads the store, then tunes (mode tune), serves the one chain's answer and
records the miss (lookup), or takes the first config Triton's pruning keeps (heuristic). A key met
while tunesvc is measuring, or inside CUDA-graph capture (:func:`_in_graph_capture`), is answered
for that launch alone without tuning (:func:`nested_config`, :func:`unremembered`).
"""

from __future__ import annotations

import functools
import inspect
import math
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any

import torch

from tunesvc import settings
from tunesvc._capture.bench import Pruned
from tunesvc._capture.bench import benchmarks_one_config
from tunesvc._capture.bench import is_nested
from tunesvc._capture.failopen import FAILED_OPEN
from tunesvc._capture.failopen import STAGE
from tunesvc._capture.failopen import STATS
from tunesvc._capture.failopen import LeftToTriton
from tunesvc._capture.failopen import give_up
from tunesvc._capture.identity import key_text
from tunesvc._capture.identity import value_text
from tunesvc._capture.printing import HOW
from tunesvc._capture.printing import print_resolved
from tunesvc._capture.recorded import record_missed_call
from tunesvc._capture.sharing import shared_for
from tunesvc._capture.tune import tune_locked
from tunesvc.settings import HEURISTIC
from tunesvc.settings import LOOKUP
from tunesvc.store import DatabaseLocked

if TYPE_CHECKING:
    from triton.runtime.autotuner import Autotuner

    from tunesvc._capture.sharing import Shared
    from tunesvc._capture.sharing import State


def triton_cache_key(tuner: Autotuner, nargs: dict[str, Any]) -> tuple:
    """The key Autotuner.run caches a config under: key values, then dtype names."""
    return tuple(
        [nargs[k] for k in tuner.keys if k in nargs] + [str(v.dtype) for v in nargs.values() if hasattr(v, "dtype")]
    )


def nested_config(state: State, text: str, pruned: Callable[[], list[Any]]) -> Any:
    """A key met inside tunesvc's measuring: the one chain's answer (no tuning, nothing said)."""
    STATS["nested"] += 1
    return shared_for(state.settings).answer(state, text, pruned, said=False)[0]


def _in_graph_capture() -> bool:
    """Whether this thread's current CUDA stream is capturing a graph (``torch.cuda.graph``, or a
    stream under ``cudaStreamBeginCapture``): a benchmark there invalidates the capture
    (``cudaErrorStreamCaptureInvalidated``), and a synchronising call (a tensor's values read on
    the host) is refused."""
    cuda = torch.cuda
    capturing = getattr(cuda, "is_current_stream_capturing", None)
    return capturing is not None and cuda.is_available() and cuda.is_initialized() and bool(capturing())


def unremembered(
    tuner: Autotuner, state: State, text: str, pruned: Callable[[], list[Any]], args: tuple, kwargs: dict[str, Any]
) -> Any | None:
    """The config of a key met inside CUDA-graph capture, for this launch alone: its stored winner,
    else the one chain's answer, else the first config the pruning keeps, nothing measured (None:
    not in a capture). The key is not remembered, so its next launch outside a graph resolves it
    again (and tunes it, in mode tune); where a database is there, the miss is recorded for
    `tune misses --tune` too, for a key that only ever launches inside graphs (not one whose
    pruning keeps one config: nothing to tune)."""
    if not _in_graph_capture():
        return None
    STATS["in_graph"] += 1
    with STAGE("prune"):
        alone = len(pruned()) == 1
    if state.settings.mode == HEURISTIC or alone:
        return pruned()[0]
    shared = shared_for(state.settings)
    with STAGE("look up"):
        config, _ = shared.answer(state, text, pruned, said=False)
    record_missed_call(shared, state, text, tuner, args, kwargs, values=False)
    return config


def resolve_config(
    tuner: Autotuner, state: State, key: tuple, nargs: dict[str, Any], args: tuple, kwargs: dict[str, Any]
) -> tuple[Any, dict[str, Any]]:
    """The config of a key this process has not met: stored, tuned now, or the fallback."""
    if is_nested():  # before the lock: the measuring may be this kernel's own, holding it
        config = nested_config(
            state, key_text_of(tuner, triton_cache_key(tuner, nargs), nargs), Pruned(tuner, args, kwargs)
        )
        return config, config.all_kwargs()
    with state.lock:  # one thread resolves a key; the others then find it
        hit = state.chosen.get(key)
        if hit is not None:
            return hit
        triton_key = triton_cache_key(tuner, nargs)
        _check_key(tuner, state, triton_key, nargs)
        text = key_text_of(tuner, triton_key, nargs)
        pruned = Pruned(tuner, args, kwargs)
        config = unremembered(tuner, state, text, pruned, args, kwargs)
        if config is not None:  # inside a CUDA graph: this launch alone (see unremembered)
            return config, config.all_kwargs()
        timings = tuner.__dict__.get("configs_timings")
        config = config_for(tuner, state, text, args, kwargs, pruned)
        tuned = tuner.__dict__.get("configs_timings") is not timings  # set anew by tune_key
        if tuned and all(math.isinf(t[0]) for t in tuner.configs_timings.values()):
            # no candidate ran (a call the kernel refuses, such as one missing an argument): the
            # launch raises the kernel's own error, and the key is not remembered, so that the
            # next call resolves it anew, as Triton's autotuner caches no key whose benchmark raised
            return config, config.all_kwargs()
        listener = _listener()
        if listener is not None and len(pruned()) > 1:  # Triton tells it of every key it chose between
            HEARD.call = functools.partial(
                listener,
                fn=_jit_of(tuner),
                key=triton_key,
                best_config=config,
                configs_timings=tuner.configs_timings if tuned else {},
                duration=getattr(tuner, "bench_time", None) if tuned else None,
                cache_hit=not tuned,
            )
        tuner.cache[triton_key] = config
        hit = state.chosen[key] = (config, config.all_kwargs())
        state.keys_met += 1
        # TRITON_PRINT_AUTOTUNING's line, once per key as Triton's (none for a key with one config)
        print_resolved(tuner, triton_key, config, "tuned" if tuned else getattr(HOW, "name", None), pruned)
        return hit


#: the autotuning listener's call for the key this thread just resolved: the launch makes it after
#: the resolution, outside capture's fail-open (a listener's own exception is the program's)
HEARD = threading.local()


def _listener() -> Callable[..., Any] | None:
    """Triton's ``knobs.autotuning.listener`` (Triton 3.8 on; None: none set, or a Triton without it).

    It hears what it would without capture: each key chosen between several configs, once, with
    the chosen config; tuned here, with ``configs_timings`` and the tuning's duration, else (a
    stored winner, the one chain's answer) as a cache hit, as Triton's on-disk cache is heard."""
    import triton

    return getattr(getattr(getattr(triton, "knobs", None), "autotuning", None), "listener", None)


def _jit_of(tuner: Autotuner) -> Any:
    """The ``@triton.jit`` object under the autotuner (and any ``@triton.heuristics``), as Triton
    passes it to its listener."""
    fn = tuner.fn
    while hasattr(fn, "fn") and not inspect.isfunction(fn.fn):
        fn = fn.fn
    return fn


def by_identity(value: Any) -> bool:
    """Whether a key value is hashed by its identity (a tensor, or an object that keeps object's
    own hash): then an equal value in the next call is another key, to Triton and to the store."""
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, tuple):
        return any(by_identity(v) for v in value)
    # None and torch's dtypes are singletons: hashed by identity, and the same in every call
    return value is not None and not isinstance(value, torch.dtype) and type(value).__hash__ is object.__hash__


def _check_key(tuner: Autotuner, state: State, key: tuple, nargs: dict[str, Any]) -> None:
    """Leave to Triton (:class:`LeftToTriton`) a kernel whose key cannot name a stored winner: a
    key argument hashed by its identity (a tensor: Triton keys it so, and every call is a new
    key), or more distinct keys than settings.max_keys() in this process (a
    key that changes on almost every call). Said once; the store gets no further rows of it."""
    values = key[: len([k for k in tuner.keys if k in nargs])]
    odd = next((v for v in values if by_identity(v)), None)
    if odd is not None:
        reason = f"its key holds a {type(odd).__name__} argument, which is a new key on every call"
    elif state.keys_met >= settings.max_keys():
        reason = f"it met {state.keys_met} distinct keys, more than TUNESVC_MAX_KEYS allows; its key changes on almost every call"
    else:
        return
    give_up(state, reason, "a key that changes on every call")
    raise LeftToTriton


def key_text_of(tuner: Autotuner, key: tuple, nargs: dict[str, Any]) -> str:
    """A key tuple as stored text, named by the key arguments and the dtypes' arguments; a key a
    subclass builds its own way (other lengths) by position."""
    names = [k for k in tuner.keys if k in nargs]
    dtype_names = [k for k, v in nargs.items() if hasattr(v, "dtype")]
    if len(key) == len(names) + len(dtype_names):
        return key_text(names, key, dtype_names)
    return ",".join(f"key{i}={value_text(v)}" for i, v in enumerate(key))


def config_for(
    tuner: Autotuner, state: State, text: str, args: tuple, kwargs: dict[str, Any], pruned: Pruned | None = None
) -> Any:
    """The config for a key's text: stored, else tuned now (mode tune) or the fallback (lookup);
    in mode heuristic, or where the pruning keeps one config, the first it keeps, nothing read."""
    pruned = Pruned(tuner, args, kwargs) if pruned is None else pruned
    with STAGE("prune"):
        alone = len(pruned()) == 1
    if state.settings.mode == HEURISTIC:
        config = pruned()[0]
        STATS["heuristic"] += 1
        HOW.name = "heuristic"
    elif alone:  # as triton.autotune: nothing to choose between, so nothing read, measured or recorded
        config = pruned()[0]
        STATS["untuned"] += 1
        HOW.name = "untuned"
    else:
        shared = shared_for(state.settings)
        with STAGE("look up"):
            table = shared.table(state.template)
            config = state.match(table.get(text), pruned)
        HOW.name = "stored"  # read, or (mode tune, not tuned here) another process's winner
        if config is not None:
            STATS["stored"] += 1
        elif state.settings.mode == LOOKUP:
            with STAGE("look up"):
                config, _ = shared.answer(state, text, pruned)
            record_missed_call(shared, state, text, tuner, args, kwargs)
            STATS["fallback"] += 1
            HOW.name = "fallback"
        else:
            config = tune_unless_locked(tuner, state, shared, text, args, kwargs, pruned)
            # the winners were read before this one was stored: the next miss that asks the one
            # chain (a key met inside a CUDA graph) reads them again, this one's included
            shared._runtime = None
    if len(tuner.configs) > 1 and (not alone or benchmarks_one_config()):
        # triton.autotune zeroes the reset_to_zero arguments after benchmarking a key, so the
        # launch that follows a key's first resolution starts from zero: so does this one
        tuner.pre_hook({**dict(zip(tuner.arg_names, args)), **kwargs, **config.all_kwargs()}, reset_only=True)
    return config


#: the summary's reason for the keys left to Triton while another process held the write lock
LOCKED_REASON = "keys met while another process held the database's write lock"


def tune_unless_locked(
    tuner: Autotuner, state: State, shared: Shared, text: str, args: tuple, kwargs: dict[str, Any], pruned: Pruned
) -> Any:
    """:func:`~tunesvc._capture.tune.tune_locked`, unless another process holds the database's write lock: then this
    launch is Triton's own (it benchmarks, as without capture) and the key is left for a later
    run; the first such wait (at most LOCK_WAIT_S, twice where a claim was held) is said once and
    ends the process's writes (:meth:`~tunesvc._capture.sharing.Shared.lock_out`), so a peer's
    lock costs a program a few seconds in all, not a wait per kernel or key."""
    if shared.locked_out is None:
        try:
            return tune_locked(tuner, state, shared, text, args, kwargs, pruned)
        except DatabaseLocked as exc:
            shared.lock_out(exc)
    FAILED_OPEN[LOCKED_REASON] += 1
    raise LeftToTriton
