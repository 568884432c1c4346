"""Autotuned kernels inside ``torch.compile``: their stored winners served where Dynamo traces them.

Inside a compiled region no ``Autotuner.run`` is called. Dynamo traces ``kernel[grid](...)`` into
torch's ``triton_kernel_wrapper_mutation`` op through ``TritonHOPifier.call_triton_kernel``
(``torch/_higher_order_ops/triton_kernel_wrap.py``), and Inductor writes every config the
autotuner lists into the generated code and benchmarks them all at the compiled code's first run,
in every process and at every compile. That method already rebuilds the kernel as another
autotuner where it must (the configs a pruner keeps, a ``@triton.heuristics`` beneath the
autotuner) and calls itself again with it. Capture's hook on it does the same with a one-config
autotuner holding the key's config, so Inductor compiles that config alone and benchmarks
nothing; where the hook has no config to give, torch's method runs as it is.

The key is the one a launch computes (:func:`~tunesvc._capture.miss.key_text_of`), read from what
Dynamo knows at trace time: constants (the integers and flags it specialises on and guards), and
each tensor's dtype from its example value. A compiled graph therefore holds one key, and a call
with another key misses Dynamo's guards and is traced again. Per key met in a compiled region
(counted in :data:`~tunesvc._capture.failopen.STATS` with a ``compiled_`` prefix):

- ``compiled_stored``: its stored winner (database or bundle, this GPU model, this version);
- ``compiled_fallback``: none stored, mode ``lookup``: the one chain's answer, the miss recorded;
  mode ``heuristic``: the first config the pruning keeps;
- ``compiled_missed``: none stored, mode ``tune``: left to Inductor, which tunes it as it does
  without capture; the miss is recorded with its call (argument shapes, strides, dtypes,
  scalars, each config's grid) so that ``tune misses --tune`` tunes it into the store, and the
  next compile in any process serves it;
- ``compiled_dynamic``: a key argument symbolic at trace time (dynamic shapes): Inductor's, and
  nothing recorded, since no one config could be served to a graph that runs every value of it;
- ``compiled_untuned``: the kernel's pruning keeps one config: Inductor compiles it alone.

A kernel with ``prune_configs_by`` is served its stored winner at once where the winner is a
listed config (it was tuned among the configs its pruning keeps for this key); otherwise Dynamo
runs the pruner as it does without capture and the hook chooses among the configs it kept, at
torch's own call with them (:class:`_Pending`).

Fail-open: a failure inside the hook is one warning line, and that kernel is left to Inductor in
compiled regions for the rest of the process (:func:`_fail_open`). The hook goes on torch's class
only while capture is on (:func:`install`, :func:`uninstall`), once torch's module is imported:
it is never imported here, so capture costs a program that does not compile nothing.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any

import torch

from tunesvc._capture.failopen import COMPILED_UNHOOKED
from tunesvc._capture.failopen import STAGE
from tunesvc._capture.failopen import STATS
from tunesvc._capture.miss import by_identity
from tunesvc._capture.miss import key_text_of
from tunesvc._capture.recorded import record_missed_call
from tunesvc._capture.sharing import shared_for
from tunesvc.bench import one_line
from tunesvc.settings import HEURISTIC
from tunesvc.settings import LOOKUP
from tunesvc.settings import TUNE
from tunesvc.text import visible
from tunesvc.text import warn

if TYPE_CHECKING:
    from triton.runtime.autotuner import Autotuner

    from tunesvc._capture.sharing import Settings
    from tunesvc._capture.sharing import State

#: torch's module that turns a user-defined Triton kernel's call into its higher-order op
TARGET = "torch._higher_order_ops.triton_kernel_wrap"
#: launch options a call may pass by name, which torch folds into every config (a call passing
#: one is not the call the stored key describes: left to torch)
_LAUNCH_OPTIONS = frozenset(
    {"num_warps", "num_stages", "num_ctas", "num_consumer_groups", "num_buffers_warp_spec", "num_cpu_threads"}
)
_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


class _Opaque:
    """An argument whose value the trace does not give (a TMA descriptor, an object of its own)."""


_OPAQUE = _Opaque()

#: autotuners left to Inductor in compiled regions after a failure inside the hook
_LEFT: weakref.WeakSet[Any] = weakref.WeakSet()
#: autotuners whose miss could not be recorded, said once each
_UNRECORDED: weakref.WeakSet[Any] = weakref.WeakSet()
#: autotuner -> config hash -> its one-config autotuner (the same object at every trace)
_SERVED: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


@dataclass
class _Call:
    """A call as a recorded miss needs it: the arguments' trace-time values (fake tensors of
    static shapes, scalars) and the grid as a Python value; ``why`` says why there is none."""

    args: tuple
    kwargs: dict[str, Any]
    grid: Any
    why: str | None = None


@dataclass
class _Pending:
    """A key whose config is chosen among those the kernel's pruner keeps: torch runs the pruner
    under Dynamo and calls its method again with an autotuner of those configs and no key, over
    the same function (``autotune(configs=pruned_configs, key=[])(variable.kernel.fn)``)."""

    tuner: Any
    state: State
    text: str
    call: _Call

    def matches(self, kernel: Any) -> bool:
        return (
            kernel is not self.tuner
            and getattr(kernel, "fn", None) is self.tuner.fn
            and not getattr(kernel, "keys", True)
            and getattr(kernel, "early_config_prune", None) is None
            and getattr(kernel, "perf_model", None) is None
        )


#: the key this thread's trace chooses for at torch's call with the pruned configs
_PENDING = threading.local()


def _off() -> Any:
    return None


#: the launch path's own, handed over by :func:`install` (this module is imported by it): the
#: process's capture settings (None: off), and a kernel's state under them
_capturing: Callable[[], Settings | None] = _off
_state_of: Callable[[Any], State] | None = None


# -- installing the hook ---------------------------------------------------------------------------
def install(capturing: Callable[[], Settings | None], state_of: Callable[[Any], State]) -> None:
    """Put the hook on torch's ``TritonHOPifier.call_triton_kernel`` now if torch's module is
    imported, else when it is (a meta-path finder: importing it here would import Dynamo).
    ``capturing`` and ``state_of`` are the launch path's (:mod:`tunesvc._capture.launch`)."""
    global _capturing, _state_of
    _capturing, _state_of = capturing, state_of
    module = sys.modules.get(TARGET)
    if module is not None and hasattr(module, "TritonHOPifier"):
        patch(module)
    elif module is None and not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def uninstall() -> None:
    """Torch's own method back (capture is off), and no finder left waiting."""
    for finder in [f for f in sys.meta_path if isinstance(f, _Finder)]:
        sys.meta_path.remove(finder)
    module = sys.modules.get(TARGET)
    cls = getattr(module, "TritonHOPifier", None)
    current = None if cls is None else cls.__dict__.get("call_triton_kernel")
    if getattr(current, "__tunesvc_compiled__", False):
        cls.call_triton_kernel = current.__tunesvc_original__  # type: ignore[union-attr]


def patch(module: types.ModuleType) -> None:
    """Wrap ``module.TritonHOPifier.call_triton_kernel`` once (over the start-up hook's
    trampoline, which it replaces); a torch without that method is said once, and its compiled
    regions are Inductor's."""
    cls = getattr(module, "TritonHOPifier", None)
    current = None if cls is None else cls.__dict__.get("call_triton_kernel")
    if getattr(current, "__tunesvc_compiled__", False):
        return
    original = getattr(current, "__tunesvc_original__", current)
    if not isinstance(original, types.FunctionType):
        reason = f"torch {torch.__version__} has no TritonHOPifier.call_triton_kernel to serve them through"
        if reason not in COMPILED_UNHOOKED:
            COMPILED_UNHOOKED.append(reason)
            warn(
                visible(
                    f"tunesvc: {reason}: triton.autotune kernels inside torch.compile are tuned by Inductor, "
                    "not served from the store."
                ),
                RuntimeWarning,
            )
        return
    assert cls is not None
    cls.call_triton_kernel = _hooked(original)


def _hooked(original: Callable[..., Any]) -> Callable[..., Any]:
    def call_triton_kernel(self: Any, variable: Any, args: Any, kwargs: Any, tx: Any) -> Any:
        if _capturing() is None:
            return original(self, variable, args, kwargs, tx)
        try:
            outcome = _resolve(self, variable, args, kwargs, tx)
            if outcome is not None and not isinstance(outcome, _Pending):
                variable = _with_kernel(self, variable, outcome)
        except Exception as exc:  # capture fails open: torch's and Inductor's own behaviour
            _fail_open(variable, exc)
            outcome = None
        if not isinstance(outcome, _Pending):
            return original(self, variable, args, kwargs, tx)
        outer = getattr(_PENDING, "value", None)
        _PENDING.value = outcome
        try:
            return original(self, variable, args, kwargs, tx)
        finally:
            _PENDING.value = outer

    call_triton_kernel.__tunesvc_original__ = original  # type: ignore[attr-defined]
    call_triton_kernel.__tunesvc_compiled__ = True  # type: ignore[attr-defined]
    call_triton_kernel.__doc__ = original.__doc__
    call_triton_kernel.__name__, call_triton_kernel.__qualname__ = original.__name__, original.__qualname__
    return call_triton_kernel


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it wraps the loader of torch's module to put the hook on once loaded."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find else None
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        if _capturing() is not None:
            try:
                patch(module)
            except Exception as exc:  # an import of torch's must never fail because of tunesvc
                warn(visible(f"tunesvc: could not hook torch.compile ({one_line(exc)})."), RuntimeWarning)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


# -- the hook ----------------------------------------------------------------------------------------
def _resolve(hopifier: Any, variable: Any, args: Any, kwargs: Any, tx: Any) -> Any:
    """The kernel to trace instead of ``variable.kernel`` (a one-config autotuner), a
    :class:`_Pending` choice, or None: torch's own way."""
    from triton.runtime.autotuner import Autotuner

    kernel = variable.kernel
    pending = getattr(_PENDING, "value", None)
    if pending is not None and pending.matches(kernel):
        _PENDING.value = None
        config = _decide(pending.tuner, pending.state, pending.text, list(kernel.configs), pending.call)
        return None if config is None else _one_config(pending.tuner, config)
    if not isinstance(kernel, Autotuner) or len(kernel.configs) <= 1 or kernel in _LEFT:
        return None
    assert _state_of is not None, "install() hands the launch path's state_of over"
    state = _state_of(kernel)
    if state.off or (kwargs and not (state.set_by_configs | _LAUNCH_OPTIONS).isdisjoint(kwargs)):
        return None  # Triton's own, or a call torch changes the configs for (or refuses)
    positional = tuple(_traced(a, tx) for a in args)
    named = {k: _traced(v, tx) for k, v in kwargs.items()}
    nargs = dict(zip(kernel.arg_names, positional))
    nargs.update((k, v) for k, v in named.items() if k in state.arg_set)
    if any(v is _OPAQUE for v in nargs.values()):
        return None
    values = [nargs[k] for k in kernel.keys if k in nargs]
    if any(isinstance(v, _SYMBOLIC) for v in values):
        STATS["compiled_dynamic"] += 1
        return None
    if any(by_identity(v) for v in values):  # a tensor in the key: a new key on every call
        return None
    key = tuple(values + [str(v.dtype) for v in nargs.values() if hasattr(v, "dtype")])
    text = key_text_of(kernel, key, nargs)
    call = _call_of(positional, named, variable.grid, tx)
    if kernel.early_config_prune is None and kernel.perf_model is None:
        config = _decide(kernel, state, text, list(kernel.configs), call)
        return None if config is None else _one_config(kernel, config)
    # a pruner: its stored winner if listed (tuned among the configs its pruning keeps for the key)
    if state.settings.mode != HEURISTIC:
        with STAGE("look up"):
            stored = shared_for(state.settings).table(state.template).get(text)
        listed = None if stored is None else state.listed(stored)
        if listed is not None:
            STATS["compiled_stored"] += 1
            return _one_config(kernel, listed)
    if _is_jit(kernel.fn):
        return _Pending(kernel, state, text, call)
    # a @triton.heuristics beneath the autotuner: torch prunes configs it has rewritten
    if state.settings.mode == TUNE:
        _record(kernel, state, text, call)
    STATS["compiled_missed"] += 1
    return None


def _decide(tuner: Autotuner, state: State, text: str, candidates: list[Any], call: _Call) -> Any | None:
    """The config of a key among ``candidates`` as a launch chooses it (None: Inductor's)."""
    mode = state.settings.mode
    if mode == HEURISTIC:
        STATS["compiled_fallback"] += 1
        return candidates[0]
    if len(candidates) == 1:
        STATS["compiled_untuned"] += 1
        return None
    shared = shared_for(state.settings)
    with STAGE("look up"):
        config = state.match(shared.table(state.template).get(text), lambda: candidates)
    if config is not None:
        STATS["compiled_stored"] += 1
        return config
    if mode == LOOKUP:
        with STAGE("look up"):
            config, _ = shared.answer(state, text, lambda: candidates)
        _record(tuner, state, text, call)
        STATS["compiled_fallback"] += 1
        return config
    _record(tuner, state, text, call)
    STATS["compiled_missed"] += 1
    return None


def _one_config(tuner: Autotuner, config: Any) -> Any:
    """An autotuner of ``tuner``'s function with ``config`` alone (the same object for the same
    config at every trace), as torch builds one from the configs a pruner keeps."""
    from triton.runtime.autotuner import autotune

    from tunesvc._capture.identity import config_dict
    from tunesvc.space import config_hash

    served = _SERVED.setdefault(tuner, {})
    digest = config_hash(config_dict(config))
    kernel = served.get(digest)
    if kernel is None:
        kernel = served[digest] = autotune(
            configs=[config],
            key=[],
            reset_to_zero=list(getattr(tuner, "reset_to_zero", None) or ()) or None,
            restore_value=list(getattr(tuner, "restore_value", None) or ()) or None,
        )(tuner.fn)
    return kernel


def _with_kernel(hopifier: Any, variable: Any, kernel: Any) -> Any:
    """``variable`` with another kernel and a new entry in torch's kernel side table, as torch's
    own method makes one (``recreate_variable`` where this torch has it)."""
    recreate = getattr(hopifier, "recreate_variable", None)
    if recreate is not None:
        return recreate(variable, kernel=kernel, kernel_idx=None, grid=variable.grid)
    extra = {"kernel_source": variable.kernel_source} if hasattr(variable, "kernel_source") else {}
    return type(variable)(kernel=kernel, kernel_idx=None, grid=variable.grid, **extra)


def _is_jit(fn: Any) -> bool:
    """Whether ``fn`` is the ``@triton.jit`` function itself (no ``@triton.heuristics`` between)."""
    from triton.runtime.autotuner import Heuristics

    return not isinstance(fn, Heuristics)


def _traced(value: Any, tx: Any) -> Any:
    """An argument's value at trace time: a constant, a tensor's example value (a fake tensor), a
    symbolic scalar, or :data:`_OPAQUE`. Dynamo passes its variable trackers (``tx`` set);
    ``wrap_triton`` under ``make_fx`` passes the values themselves."""
    if tx is None:
        return value
    realize = getattr(value, "realize", None)
    if realize is not None:
        value = realize()
    if value.is_python_constant():
        return value.as_python_constant()
    try:
        example = value.as_proxy().node.meta.get("example_value")
    except Exception:  # a tracker with no proxy of one value
        return _OPAQUE
    return example if isinstance(example, (torch.Tensor, *_SYMBOLIC)) else _OPAQUE


def _call_of(args: tuple, kwargs: dict[str, Any], grid: Any, tx: Any) -> _Call:
    """The call for a recorded miss, or why there is none (a symbolic shape, a grid the trace
    holds no Python value of)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, _SYMBOLIC) or (
            isinstance(value, torch.Tensor)
            and any(isinstance(n, torch.SymInt) for n in (*value.shape, *value.stride()))
        ):
            return _Call(args, kwargs, None, "an argument's shape is symbolic")
    if tx is not None:
        try:
            grid = grid.as_python_constant() if grid.is_python_constant() else None
        except Exception:  # a closure Dynamo cannot give back as values
            grid = None
        if grid is None:
            return _Call(args, kwargs, None, "its grid is no constant at trace time")
    return _Call(args, kwargs, grid)


def _record(tuner: Autotuner, state: State, text: str, call: _Call) -> None:
    """Record the miss for ``tune misses --tune`` (in mode tune the database is made where there
    is none, as tuning it would make it); where no call can be recorded, said once per kernel."""
    why = call.why
    if why is None:
        from tunesvc._capture.recorded import describe_call

        described = describe_call(tuner, call.args, {**call.kwargs, "grid": call.grid}, values=False, traced=True)
        if all(g is None for g in described["grids"]):
            why = "its grid could not be computed at trace time"
    if why is not None:
        if tuner not in _UNRECORDED:
            _UNRECORDED.add(tuner)
            warn(
                visible(
                    f"tunesvc: {state.name}: a key with no stored winner met inside torch.compile is not recorded "
                    f"for `tune misses --tune` ({why}); launch it once outside compiled code to tune it."
                ),
                RuntimeWarning,
            )
        return
    shared = shared_for(state.settings)
    record_missed_call(
        shared,
        state,
        text,
        tuner,
        call.args,
        {**call.kwargs, "grid": call.grid},
        values=False,
        traced=True,
        create=state.settings.mode == TUNE,
    )


def _fail_open(variable: Any, exc: BaseException) -> None:
    """Leave the kernel to Inductor in compiled regions for the rest of the process, said once."""
    kernel = getattr(variable, "kernel", None)
    try:
        _LEFT.add(kernel)
    except TypeError:  # not weakly referable: said again at its next trace
        pass
    STATS["compiled_failed_open"] += 1
    base = getattr(kernel, "base_fn", None)
    name = f"{getattr(base, '__module__', '?')}:{getattr(base, '__qualname__', type(kernel).__name__)}"
    stage = STAGE.of(exc)
    warn(
        visible(
            f"tunesvc: {name}: {stage} failed inside torch.compile with {type(exc).__name__}: {one_line(exc)}; "
            "in compiled regions it is tuned by Inductor in this process (set TUNESVC_MODE=off to leave it "
            "to Inductor quietly, and report this tunesvc bug)."
        ),
        RuntimeWarning,
    )
