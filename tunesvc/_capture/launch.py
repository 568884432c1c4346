"""The launch path: tunesvc's ``Autotuner.run``, and the ways a kernel comes to run it.

:func:`captured_run` is the run of every captured kernel: a key met before is one dict lookup, then
the kernel's launch; a miss goes to :func:`tunesvc._capture.miss.resolve_config`. A kernel gets it as a
:class:`CapturedKernel` (``tunesvc.autotune``'s Autotuner subclass: :func:`autotune`) or
process-wide: :func:`capture` puts it on Triton's ``Autotuner`` class and wraps the ``run`` of
subclasses that have their own (:class:`_StoreCache` answers their cache's misses);
:func:`uncapture` takes it off. The process's capture (``_process``, rebound here only) and each
kernel's state (:func:`_state_of`) live here.
"""

from __future__ import annotations

import inspect
import itertools
import os
import sys
import threading
import types
import weakref
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

from triton.runtime.autotuner import Autotuner

from tunesvc import settings
from tunesvc._capture.bench import MEASURING
from tunesvc._capture.bench import Pruned
from tunesvc._capture.bench import is_nested
from tunesvc._capture.failopen import KERNELS
from tunesvc._capture.failopen import STAGE
from tunesvc._capture.failopen import LeftToTriton
from tunesvc._capture.failopen import Off
from tunesvc._capture.failopen import give_up
from tunesvc._capture.failopen import write_summary
from tunesvc._capture.miss import HEARD
from tunesvc._capture.miss import config_for
from tunesvc._capture.miss import key_text_of
from tunesvc._capture.miss import nested_config
from tunesvc._capture.miss import resolve_config
from tunesvc._capture.miss import triton_cache_key
from tunesvc._capture.miss import unremembered
from tunesvc._capture.sharing import SHARED
from tunesvc._capture.sharing import Settings
from tunesvc._capture.sharing import State
from tunesvc._capture.sharing import settings_lock
from tunesvc._processes import remake_unheld
from tunesvc.errors import TunesvcError
from tunesvc.text import warn

#: Triton's own Autotuner.run (the interpreter-start hook may have put a trampoline there first,
#: and a library its own run over that: the hook kept Triton's)
TRITON_AUTOTUNER_RUN: Callable[..., Any] = getattr(sys.modules.get("_tunesvc_capture"), "TRITON_RUN", None) or getattr(
    Autotuner.run, "__tunesvc_original__", Autotuner.run
)


_STATES: weakref.WeakSet[Autotuner] = weakref.WeakSet()
#: the process's capture, set by capture(); None: plain Autotuner instances run as Triton's
_process: Settings | None = None


def _state_of(tuner: Autotuner) -> State:
    state = tuner.__dict__.get("_tunesvc")
    if state is None:
        with settings_lock:
            state = tuner.__dict__.get("_tunesvc")
            if state is None:
                try:
                    if isinstance(tuner, CapturedKernel):  # a copy of one (see State.__reduce__)
                        state = tuner._new_state()
                    elif _process is None:  # reached through a library's own run after uncapture()
                        state = Off(tuner)
                    else:
                        state = State(tuner, _process, None, {})
                except Exception as exc:  # fails open: the kernel runs as Triton's
                    off = Off(tuner)
                    give_up(off, exc, "setting up")
                    state = off
                if not state.off:
                    KERNELS.add(state.name)
                tuner.__dict__["_tunesvc"] = state
                _STATES.add(tuner)
    return state


def _locks_remade_in_the_child() -> None:
    """In a forked child: every lock of capture made anew, unheld. A lock another thread of the
    parent held at the fork (a kernel's, for the whole of a key's tuning) would otherwise stay held
    in the child for ever, since that thread does not exist there: the child's first launch of
    the kernel would wait on it, and the parent on the child. A key the parent was tuning is
    resolved again in the child, where the one key claim makes it wait for the parent's winner."""
    remake_unheld(settings_lock)  # imported by name where it is used: made anew in place
    for tuner in list(_STATES):
        state = tuner.__dict__.get("_tunesvc")
        if state is not None and hasattr(state, "lock"):
            state.lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_locks_remade_in_the_child)


def _forget_all() -> None:
    """Drop every kernel's captured state: the next launches resolve again (settings changed)."""
    for tuner in list(_STATES):
        state = tuner.__dict__.get("_tunesvc")
        if state is not None and not isinstance(tuner, CapturedKernel):
            del tuner.__dict__["_tunesvc"]
        elif state is not None:
            state.chosen.clear()
    SHARED.clear()


def captured_run(self: Autotuner, *args: Any, **kwargs: Any) -> Any:
    """``Autotuner.run`` the tunesvc way: a key seen before is one dict lookup, then the kernel."""
    state = self.__dict__.get("_tunesvc") or _state_of(self)
    if state.off or (kwargs and not state.set_by_configs.isdisjoint(kwargs)):
        # a call that passes a parameter its configs set is refused by Triton (a ValueError while
        # it benchmarks, a TypeError at a launch): so it is here, by Triton itself
        return TRITON_AUTOTUNER_RUN(self, *args, **kwargs)
    # Triton's key: the key arguments' values, then the dtype of every argument that has one;
    # the dtype objects themselves, not their names (str() on every call is measurable)
    nargs = dict(zip(self.arg_names, args))
    if kwargs:
        if kwargs.keys() <= state.arg_set:
            nargs.update(kwargs)
        else:
            arg_set = state.arg_set
            for k, v in kwargs.items():
                if k in arg_set:
                    nargs[k] = v
    key = tuple([nargs[k] for k in self.keys if k in nargs] + [v.dtype for v in nargs.values() if hasattr(v, "dtype")])
    try:
        hit = state.chosen.get(key)
    except TypeError:  # an unhashable dtype: Triton's own key, with dtype names
        key = triton_cache_key(self, nargs)
        hit = state.chosen.get(key)
    if hit is None:
        try:
            hit = resolve_config(self, state, key, nargs, args, kwargs)
        except LeftToTriton:
            return TRITON_AUTOTUNER_RUN(self, *args, **kwargs)
        except Exception as exc:  # capture fails open (see tunesvc._capture)
            HEARD.__dict__.pop("call", None)
            give_up(state, exc, STAGE.of(exc))
            return TRITON_AUTOTUNER_RUN(self, *args, **kwargs)
        heard = HEARD.__dict__.pop("call", None)
        if heard is not None:  # Triton's autotuning listener (see tunesvc._capture.miss._listener)
            heard()
    config, launch = hit
    self.best_config = config
    if config.pre_hook is not None:
        config.pre_hook({**nargs, **kwargs, **launch})
    direct = state.direct
    if direct is not None and "grid" in kwargs and kwargs.get("warmup") is False:
        # KernelInterface[grid] passes grid and warmup as keywords; the rest are the kernel's (a
        # run() without warmup goes to the kernel's own run, which refuses it as without capture)
        rest = {k: v for k, v in kwargs.items() if k != "grid" and k != "warmup"}
        return direct.launch(kwargs["grid"], args, {**rest, **launch})
    return self.fn.run(*args, **kwargs, **launch)


#: tunesvc's run is Triton's run, captured (a trampoline that finds it on Autotuner calls it)
captured_run.__tunesvc_original__ = TRITON_AUTOTUNER_RUN  # type: ignore[attr-defined]


# -- Autotuner subclasses with a run of their own (FlagGems' LibTuner, for one) ------------------
#: the (args, kwargs) of the subclass launch running on this thread, for its cache's miss
_CALL = threading.local()


class _StoreCache:
    """A subclass autotuner's ``cache`` (key -> config) whose misses tunesvc answers.

    Such a ``run`` builds its own key, asks ``key in self.cache`` before it searches, then
    launches ``self.cache[key]``: while capture is on, a key is resolved the tunesvc way (stored,
    tuned on the call's arguments, or the fallback) and the subclass launches that config,
    searching nothing. The subclass's own cache (a dict, or a persistent store of its own) is kept
    underneath, untouched by tunesvc, and answers alone while capture is off.
    """

    def __init__(self, tuner: Autotuner, inner: Any) -> None:
        self.tuner = tuner
        self.inner = inner
        self._state: State | None = None
        self._resolved: dict[Any, Any] = {}

    def _answers(self) -> dict[Any, Any] | None:
        """This capture's resolved keys (None: capture is off or off for this kernel)."""
        if _process is None:
            return None
        state = _state_of(self.tuner)
        if state is not self._state:  # new settings: resolve again
            self._state, self._resolved = state, {}
        return None if state.off else self._resolved

    def __contains__(self, key: object) -> bool:
        answers = self._answers()
        if answers is None:
            return key in self.inner
        if key in answers:
            return True
        call = getattr(_CALL, "value", None)
        if call is None or not isinstance(key, tuple):  # not asked from within the run
            return key in self.inner
        tuner, state = self.tuner, self._state
        assert state is not None
        args, kwargs = call
        nargs = {k: v for k, v in {**dict(zip(tuner.arg_names, args)), **kwargs}.items() if k in state.arg_set}
        text, pruned = key_text_of(tuner, key, nargs), Pruned(tuner, args, kwargs)
        try:
            # inside tunesvc's measuring or a CUDA graph: answered for this launch alone, as resolve_config does
            alone = nested_config(state, text, pruned) if is_nested() else None
            if alone is None:
                alone = unremembered(tuner, state, text, pruned, args, kwargs)
            if alone is not None:
                MEASURING.answer = (self, key, alone)
                return True
            with state.lock:
                if key not in answers:
                    answers[key] = config_for(tuner, state, text, args, kwargs)
        except LeftToTriton:
            return key in self.inner
        except Exception as exc:  # capture fails open: the subclass searches as it would alone
            give_up(state, exc, STAGE.of(exc))
            return key in self.inner
        return True

    def __getitem__(self, key: Any) -> Any:
        nested = getattr(MEASURING, "answer", None)
        if nested is not None and nested[0] is self and nested[1] == key:
            MEASURING.answer = None
            return nested[2]
        answers = self._answers()
        if answers is not None and key in answers:
            return answers[key]
        return self.inner[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        self.inner[key] = value

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key] if key in self else default  # noqa: SIM401 (self.get is this method)

    # a run that reads its cache as a dict (its size, whether it is empty, its keys) sees its own
    # keys, then those tunesvc answered; a cache of its own without len() or iter() refuses them
    # as it does without capture
    def __len__(self) -> int:
        size = len(self.inner)
        return size + sum(1 for key in self._answers() or () if key not in self.inner)

    def __bool__(self) -> bool:
        return bool(self._answers()) or bool(self.inner)

    def __iter__(self) -> Iterator[Any]:
        own = iter(self.inner)
        return itertools.chain(own, (key for key in list(self._answers() or ()) if key not in self.inner))

    def __getattr__(self, name: str) -> Any:  # the subclass's own cache's other methods
        if name == "inner":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


def _wrap_run(cls: type) -> None:
    """Give ``cls`` (a subclass of Autotuner with its own ``run``) a run whose cache misses go
    through tunesvc while capture is on; with capture off it is the class's own run."""
    own = cls.__dict__.get("run")
    if not isinstance(own, types.FunctionType) or own is captured_run or hasattr(own, "__tunesvc_original__"):
        return  # a run that is no plain function (a staticmethod, a partialmethod) stays as written

    def run(self: Autotuner, *args: Any, **kwargs: Any) -> Any:
        if _process is None:
            return own(self, *args, **kwargs)
        if type(self.__dict__.get("cache")) is not _StoreCache:
            state = _state_of(self)
            if state.off:
                return own(self, *args, **kwargs)
            try:
                self.cache = _StoreCache(self, self.cache)
            except Exception as exc:  # a cache tunesvc cannot stand in for (a read-only property)
                give_up(state, exc, "setting up")
                return own(self, *args, **kwargs)
        outer = getattr(_CALL, "value", None)
        _CALL.value = (args, kwargs)
        try:
            return own(self, *args, **kwargs)
        finally:
            _CALL.value = outer

    run.__tunesvc_original__ = own  # type: ignore[attr-defined]
    run.__doc__, run.__name__, run.__qualname__ = own.__doc__, own.__name__, own.__qualname__
    try:
        cls.run = run  # type: ignore[attr-defined]
    except Exception:  # a metaclass that refuses it: the run stays as written, the class is still made
        pass


def _wrap_subclasses() -> None:
    """Every Autotuner subclass with its own run, defined now or later, gets :func:`_wrap_run`."""
    todo = list(Autotuner.__subclasses__())
    while todo:
        cls = todo.pop()
        _wrap_run(cls)
        todo.extend(cls.__subclasses__())
    if "__init_subclass__" not in Autotuner.__dict__:
        Autotuner.__init_subclass__ = classmethod(_init_subclass)


def _init_subclass(cls: type, **kwargs: Any) -> None:
    """Autotuner's hook for a new subclass: the classes above run theirs (a mixin's registry,
    Generic's), then the subclass's own run is wrapped."""
    super(Autotuner, cls).__init_subclass__(**kwargs)
    _wrap_run(cls)


_autotuner_params = set(inspect.signature(Autotuner.__init__).parameters)


class CapturedKernel(Autotuner):
    """``triton.autotune``'s Autotuner with tunesvc's launch path (see :mod:`tunesvc._capture`)."""

    def __init__(
        self,
        fn: Any,
        arg_names: list[str],
        configs: list[Any],
        key: list[str],
        reset_to_zero: list[str] | None = None,
        restore_value: list[str] | None = None,
        *,
        name: str | None = None,
        mode: str | None = None,
        db: str | os.PathLike | None = None,
        bundle: str | os.PathLike | None = None,
        tolerance: float | None = None,
        **triton_options: Any,
    ) -> None:
        unknown = set(triton_options) - _autotuner_params
        if unknown:
            raise TunesvcError(
                f"This Triton's autotune takes no {', '.join(sorted(unknown))}; drop it or upgrade Triton."
            )
        super().__init__(fn, arg_names, configs, key, reset_to_zero, restore_value, **triton_options)
        self._explicit = (mode, db, bundle)
        self._named = (name, {"tolerance": tolerance})
        self.__dict__["_tunesvc"] = self._new_state()
        _STATES.add(self)

    run = captured_run

    def _new_state(self) -> State:
        """Its state under the capture of now: explicit options keep winning."""
        return State(self, Settings.resolve(*self._explicit, base=_process), *self._named)

    def _rebind(self) -> None:
        """New settings after capture()/configure()."""
        self.__dict__["_tunesvc"] = self._new_state()


def autotune(
    configs: list[Any],
    key: list[str],
    prune_configs_by: dict[str, Any] | None = None,
    reset_to_zero: list[str] | None = None,
    restore_value: list[str] | None = None,
    pre_hook: Callable[..., Any] | None = None,
    post_hook: Callable[..., Any] | None = None,
    warmup: int | None = None,
    rep: int | None = None,
    use_cuda_graph: bool = False,
    do_bench: Callable[..., Any] | None = None,
    cache_results: bool = False,
    *,
    name: str | None = None,
    mode: str | None = None,
    db: str | os.PathLike | None = None,
    bundle: str | os.PathLike | None = None,
    tolerance: float | None = None,
) -> Callable[[Any], CapturedKernel]:
    """triton.autotune's decorator, tuned and stored by tunesvc (arguments as Triton's)."""
    options: dict[str, Any] = {
        "prune_configs_by": prune_configs_by,
        "pre_hook": pre_hook,
        "post_hook": post_hook,
        "warmup": warmup,
        "rep": rep,
        "use_cuda_graph": use_cuda_graph,
        "do_bench": do_bench,
        "cache_results": cache_results,
    }
    defaults = {"use_cuda_graph": False, "cache_results": False}
    # an option this Triton lacks may be left at its default; given, CapturedKernel says so
    options = {k: v for k, v in options.items() if k in _autotuner_params or v not in (None, defaults.get(k))}

    def decorate(fn: Any) -> CapturedKernel:
        return CapturedKernel(
            fn,
            fn.arg_names,
            configs,
            key,
            reset_to_zero,
            restore_value,
            name=name,
            mode=mode,
            db=db,
            bundle=bundle,
            tolerance=tolerance,
            **options,
        )

    return decorate


class Capture:
    """The handle :func:`capture` returns: ``close()`` (or leaving the ``with`` block) undoes it."""

    def __init__(self, previous: Settings | None, patched: bool) -> None:
        self._previous = previous
        self._patched = patched
        self.closed = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            _apply(self._previous)

    def __enter__(self) -> Capture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def capture(
    mode: str | None = None, db: str | os.PathLike | None = None, bundle: str | os.PathLike | None = None
) -> Capture:
    """Route every ``triton.autotune`` kernel of this process through tunesvc.

    Kernels decorated before and after alike: Triton's ``Autotuner.run`` becomes tunesvc's.
    ``mode``/``db``/``bundle`` default to $TUNESVC_MODE/$TUNESVC_DB/$TUNESVC_BUNDLE (see
    :class:`Settings`). A plain call, or a context manager; :func:`uncapture` or the handle's
    ``close`` gives Triton its own autotuner back.
    """
    previous = _process
    _apply(Settings.resolve(mode, db, bundle))
    if not _ours(Autotuner.__dict__.get("run")):
        run = Autotuner.__dict__.get("run")
        warn(
            f"tunesvc: Autotuner.run is {getattr(run, '__module__', '?')}.{getattr(run, '__qualname__', run)}, "
            "another library's: it stays, and capture reaches plain triton.autotune kernels only through the run "
            "it replaced (call tunesvc.capture() before that library replaces it).",
            RuntimeWarning,
        )
    return Capture(previous, True)


def uncapture() -> None:
    """Give every plain ``triton.autotune`` kernel Triton's own autotuner back."""
    _apply(None)


_summary_registered = False


def _apply(chosen: Settings | None) -> None:
    global _process, _summary_registered
    with settings_lock:
        _process = chosen
        if _ours(Autotuner.__dict__.get("run")):  # a library's own run stays (it may call tunesvc's)
            Autotuner.run = captured_run if chosen is not None else TRITON_AUTOTUNER_RUN
        if chosen is not None:
            _wrap_subclasses()
            if not _summary_registered and (settings.summary_requested() or settings.summary_file()):
                import atexit

                atexit.register(write_summary)
                _summary_registered = True
    _forget_all()
    for tuner in list(_STATES):
        if isinstance(tuner, CapturedKernel):
            tuner._rebind()
    _hook_compiled_regions(chosen is not None)


def _hook_compiled_regions(on: bool) -> None:
    """Capture's hook where Dynamo traces a kernel inside torch.compile (:mod:`tunesvc._capture.compiled`),
    on while capture is; one that cannot be put on is said, and leaves compiled regions to Inductor."""
    try:
        from tunesvc._capture import compiled

        if on:
            compiled.install(capturing, _state_of)
        else:
            compiled.uninstall()
    except Exception as exc:  # capture itself goes on: only compiled regions are Inductor's
        warn(
            f"tunesvc: could not hook torch.compile ({type(exc).__name__}: {exc}); triton.autotune kernels inside "
            "compiled regions are tuned by Inductor.",
            RuntimeWarning,
        )


def _ours(run: Any) -> bool:
    """Whether ``run`` on Autotuner is Triton's, tunesvc's or the start-up hook's trampoline."""
    return run is TRITON_AUTOTUNER_RUN or getattr(run, "__tunesvc_original__", None) is not None


def capturing() -> Settings | None:
    """The process's capture settings, or None when plain triton.autotune kernels run as Triton's."""
    return _process


def capture_from_env() -> None:
    """What ``TUNESVC_CAPTURE=1`` does once Triton's autotuner is imported (see _tunesvc_capture)."""
    if settings.capture_requested() and _process is None:
        _apply(Settings.resolve())  # a library's run over the hook's trampoline reaches tunesvc's through it
