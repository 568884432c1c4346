"""Every ``triton.autotune`` kernel, unmodified, tuned once and served from the store.

Two ways in, one mechanism:

- ``tunesvc.autotune(configs, key, ...)`` with ``triton.Config`` objects builds a
  :class:`CapturedKernel`, a subclass of Triton's own ``Autotuner`` (so ``fn``, ``base_fn``,
  ``configs``, ``keys``, ``cache``, ``best_config``, ``prune_configs``, ``warmup`` ... are
  Triton's), whose ``run`` is tunesvc's;
- :func:`capture` (or ``TUNESVC_CAPTURE=1``, or ``tune run -- CMD``) puts that same ``run`` on
  Triton's ``Autotuner`` class, so every autotuned kernel of the process, decorated before or
  after, from any library, goes through tunesvc.

A kernel is identified by ``module:qualname`` of its Python function (also the path to import
it); its version hashes its source's syntax tree, its config list and the Triton version, so
an edited kernel, a changed config list or another Triton never reuses stored winners. The
shape key is Triton's own autotuning key (the ``key`` arguments' values, then the dtype of every
tensor argument), written as readable text: ``n_cols=1000,HAS_BIAS=True,x.dtype=float16``.

A launch looks the key tuple up in one dict (as Triton's own cache does) and runs the kernel.
On a miss: the stored winner (database or bundle) if there is one; else, in mode ``tune``,
every config that survives Triton's pruning is checked and timed on the call's own arguments
(one process per key across processes and hosts: the one key claim), every trial and the winner stored; in mode
``lookup`` a deterministic fallback (the nearest stored key's winner, else the first listed
config) and the miss recorded for offline tuning; in mode ``heuristic`` the first config Triton's
pruning keeps, nothing read; in mode ``off``, Triton's own autotuner (see :mod:`tunesvc.settings`).

Capture fails open: whatever goes wrong inside tunesvc on a launch (a bug, an unusual config,
dtype or hook, a damaged, locked or unreachable database, a kernel whose key changes on every
call) is one warning line naming the kernel, the reason and what to do, and the launch, and every
later launch of that kernel in the process, runs as Triton's own autotuner would. Tuning leaves
no trace but the store: it measures on aliases of the call's tensors (``Tensor.data``: autograd
version counters untouched), without autograd, with the RNG state, the current device and stream
put back, and the tensors' contents restored (see :func:`_untraced`).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import threading
import time
import warnings
import weakref
from collections import Counter
from collections.abc import Callable
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any

import torch
from triton.runtime.autotuner import Autotuner
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from tunesvc import settings
from tunesvc.bench import Bench
from tunesvc.bench import Measurement
from tunesvc.bench import Status
from tunesvc.bench import relative_error
from tunesvc.bench._base import one_line as _one_line
from tunesvc.bench._inprocess import FIRST_GRAPH_SHARE
from tunesvc.bench._inprocess import _compile_error_types
from tunesvc.bench._inprocess import _out_of_resources_types
from tunesvc.errors import TunesvcError
from tunesvc.launch import DirectLaunch
from tunesvc.settings import HEURISTIC
from tunesvc.settings import LOOKUP
from tunesvc.settings import OFF
from tunesvc.settings import TUNE
from tunesvc.space import LAUNCH_OPTIONS
from tunesvc.space import config_hash
from tunesvc.template import ShapeKey
from tunesvc.template import Template
from tunesvc.template import source_version

if TYPE_CHECKING:
    from tunesvc.device import Device
    from tunesvc.runtime import Runtime
    from tunesvc.space import Config as ConfigDict
    from tunesvc.store import Store


#: Triton's own Autotuner.run (the interpreter-start hook may have put a trampoline there first)
_TRITON_RUN: Callable[..., Any] = getattr(Autotuner.run, "__tunesvc_original__", Autotuner.run)

#: what happened to the keys this process met, across kernels: ``stored`` (served from the database or bundle, nothing measured), ``tuned``
#: (measured here), ``benchmarks`` (candidates measured), ``fallback`` (mode lookup, no stored
#: winner), ``heuristic`` (mode heuristic), ``untuned`` (one config survived pruning), ``nested``
#: (met while tunesvc was measuring: stored winner or fallback, see :func:`_measuring`),
#: ``precompiled`` (candidates a compile worker compiled before their measurement), ``failed_open``
#: (kernels left to Triton's own autotuner after a failure inside tunesvc)
STATS: Counter[str] = Counter()
#: seconds spent tuning keys (``tuned``), and why kernels were left to Triton's own autotuner
TUNE_SECONDS = [0.0]
FAILED_OPEN: Counter[str] = Counter()
#: the names of the captured kernels this process launched
KERNELS: set[str] = set()

#: a candidate's largest relative error against the first valid config's output, by dtype
#: (settings.CONFIG_TOLERANCE: the one table, by name)
TOLERANCE = {getattr(torch, name): tolerance for name, tolerance in settings.CONFIG_TOLERANCE.items()}
LOOSE_TOLERANCE = settings.CONFIG_TOLERANCE_OTHER

#: rounds of the finalists' re-measurement on a GPU (tunesvc.sweep's interleaved rounds)
FINALISTS = 3
#: candidates whose first time is within this fraction of the fastest's are re-timed as finalists
#: (see :func:`_contenders`)
FINALIST_WINDOW = 0.05
#: each candidate's first timing of a captured key is this share of the replay length (rep:
#: triton.autotune's ``rep``, else settings.REP_MS); the finalists are then re-timed over the
#: whole of it, with any candidate whose first time beats theirs. triton.autotune spends its whole
#: rep on every config, and the program waits for capture's tuning as for Triton's: the short
#: first pass is what keeps a captured first run no slower than one without capture
FIRST_PASS_SHARE = 0.25
#: a captured key's finalists replay graphs of rep_ms / 30 (3.3 ms at the default), not an offline
#: sweep's rep_ms (100 ms): the program's first call waits for them, and the long replays would add
#: about 8 s a key to it (nine rounds at the 0.85 s a round and config a sweep's long replays took on
#: an H100), where a captured GEMM's first call took 8.9-9.4 s, triton.autotune's 6.1-7.1 s
#: (benchmarks/results/capture.csv)
CAPTURE_FINALIST_GRAPH_SHARE = FIRST_GRAPH_SHARE / 3


def stats() -> dict[str, int]:
    """Counters of this process's captured keys (see :data:`STATS`)."""
    return dict(STATS)


def summary_record() -> dict[str, Any]:
    """What this process's capture did, as data (what `tune run` adds up over its processes)."""
    return {
        "kernels": len(KERNELS),
        "stored": STATS["stored"],
        "tuned": STATS["tuned"],
        "tune_s": round(TUNE_SECONDS[0], 3),
        "untuned": STATS["untuned"],
        "fallback": STATS["fallback"] + STATS["heuristic"],
        "failed_open": dict(FAILED_OPEN),
    }


def summary_line(records: list[dict[str, Any]]) -> str:
    """One line over the records of one or more processes (see :func:`summary_record`)."""
    total: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    seconds = 0.0
    for r in records:
        total.update({k: int(r.get(k, 0)) for k in ("kernels", "stored", "tuned", "untuned", "fallback")})
        seconds += float(r.get("tune_s", 0.0))
        reasons.update(r.get("failed_open", {}))
    text = (
        f"tunesvc: {total['kernels']} kernel{'s' * (total['kernels'] != 1)} captured; keys: "
        f"{total['stored']} served from the store, {total['tuned']} tuned in {seconds:.1f} s, "
        f"{total['untuned']} with one config, {total['fallback']} served untuned"
    )
    if reasons:
        why = ", ".join(f"{n} {reason}" for reason, n in reasons.most_common())
        text += f"; left to Triton's autotuner: {why}"
    return text + "."


def _write_summary() -> None:
    """At exit: the summary line on stderr ($TUNESVC_SUMMARY) and/or a JSON line for `tune run`."""
    import json
    import sys

    if not KERNELS and not FAILED_OPEN:
        return
    try:
        if settings.summary_requested():
            print(summary_line([summary_record()]), file=sys.stderr)
        path = settings.summary_file()
        if path:
            with open(path, "a") as f:
                f.write(json.dumps(summary_record()) + "\n")
    except Exception:  # a summary must never change how the program ends
        pass


# -- settings ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    """Where captured kernels read and write winners, and what a miss does."""

    mode: str
    db: str | None
    bundle: str | None

    @classmethod
    def resolve(
        cls,
        mode: str | None = None,
        db: str | os.PathLike | None = None,
        bundle: str | os.PathLike | None = None,
        base: Settings | None = None,
    ) -> Settings:
        """Explicit values, else ``base`` (the process's capture), else $TUNESVC_MODE/_DB/_BUNDLE.

        The default mode is ``tune``, as triton.autotune tunes every miss; with a bundle and no
        database it is ``lookup`` (serving a shipped bundle never measures). A mode given here
        that is not one of :data:`MODES` is a TunesvcError (a program's own call); a bad
        $TUNESVC_MODE is one warning and the default (see :mod:`tunesvc.settings`).
        """
        wrong = None if mode is None else settings.check_mode(mode)
        if wrong is not None:
            raise TunesvcError(wrong)
        if base is not None:
            mode, db, bundle = mode or base.mode, db or base.db, bundle or base.bundle
        db = str(db) if db is not None else settings.db()
        bundle = str(bundle) if bundle is not None else settings.bundle()
        mode = mode or settings.mode(LOOKUP if bundle and not db else TUNE)
        return cls(mode, db, bundle)

    @property
    def db_path(self) -> str:
        """The database misses are tuned into (and read from): given, else ./tune.db."""
        return self.db or settings.DEFAULT_DB


_settings_lock = threading.Lock()
_shared: dict[Settings, _Shared] = {}


class _Shared:
    """What the kernels of one Settings share: the bundle read once, one store connection."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._runtime: Runtime | None = None
        self._store: Store | None = None
        self.lock = threading.Lock()

    def table(self, template: Template) -> dict[str, ConfigDict]:
        """The stored winners of ``template`` on this device (bundle, else database; {}: none)."""
        from tunesvc.store import DatabaseNotCreated

        runtime = self._runtime or self._open()
        if runtime is None:
            return {}
        try:
            table = runtime._table(template)
        except DatabaseNotCreated:
            return {}  # the file, but no tables yet (another process creating them): as no file
        self._runtime = runtime
        return table

    def _open(self) -> Runtime | None:
        """A runtime (mode lookup, strict: a source that cannot be read is capture's failure to
        say) over these settings' winner source; None while there is no database (not kept:
        another process may create it before the next miss)."""
        from tunesvc.runtime import Runtime
        from tunesvc.runtime import _database_exists

        s = self.settings
        if not s.bundle and not _database_exists(s.db_path):
            return None
        return Runtime(db=None if s.bundle else s.db_path, bundle=s.bundle, mode="lookup", strict=True)

    def answer(
        self, state: _State, text: str, pruned: Callable[[], list[Any]], *, said: bool = True
    ) -> tuple[Any, str]:
        """The config, and its source, that the runtime's one chain gives a key not tuned here:
        its stored winner, else predicted, nearest, transferred (as one of the kernel's configs),
        else the first config Triton's pruning keeps for the call (the heuristic, as in mode
        heuristic). ``said``: the runtime says once per kernel that the answer is not tuned."""
        self.table(state.template)  # opens the source, where there is one
        if self._runtime is not None:
            result = self._runtime.answer(state.template, {"key": text}, said=said)
            if result.source != "heuristic":
                config = state.match(result.config, pruned)
                if config is not None:
                    return config, result.source
        return pruned()[0], "heuristic"

    def store(self, create: bool) -> Store | None:
        """The writable store (created if ``create``), or None where there is no database."""
        if self._store is None:
            from tunesvc.runtime import _database_exists
            from tunesvc.store import Store

            path = self.settings.db_path
            if not create and not (self.settings.db or _database_exists(path)):
                return None
            self._store = Store(path)
        return self._store


def _shared_for(settings: Settings) -> _Shared:
    with _settings_lock:
        shared = _shared.get(settings)
        if shared is None:
            shared = _shared[settings] = _Shared(settings)
        return shared


# -- identity -----------------------------------------------------------------------------------
def config_dict(config: Any) -> ConfigDict:
    """A triton.Config as the store keeps it: meta-parameters and every launch option that is set
    (``all_kwargs()``: whatever options the installed Triton's Config carries, ``ir_override`` too).

    Values other than whole numbers and text (bools, floats, None) are written as their text
    (``True``, ``0.5``): stored configs and bundles hold ints and strings only, and a stored
    config only names one of the listed configs (by :func:`~tunesvc.space.config_hash`), which
    is what launches, with its own values and pre_hook.
    """
    return {k: _stored_value(v) for k, v in config.all_kwargs().items()}


def _stored_value(value: Any) -> int | str:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return repr(value) if isinstance(value, float) else str(value)
    return value


def kernel_name(fn: Any) -> str:
    """``module:qualname`` of the Python function under any stack of JIT/heuristics wrappers."""
    base = fn
    while not inspect.isfunction(base):
        base = base.fn
    return f"{base.__module__}:{base.__qualname__}"


def _base_function(fn: Any) -> Callable[..., Any]:
    while not inspect.isfunction(fn):
        fn = fn.fn
    return fn


def kernel_version(fn: Any, configs: list[Any]) -> str:
    """Hash of the kernel's syntax tree, its config list and the Triton version."""
    import triton

    listing = repr([sorted(config_dict(c).items()) for c in configs])
    try:
        source = inspect.getsource(_base_function(fn))
    except (OSError, TypeError):  # no source file (exec'd code): the name stands in
        source = f"# {kernel_name(fn)}"
    return source_version(source, listing, repr(triton.__version__))


def _value_text(value: Any) -> str:
    if value is None or isinstance(value, (bool, int)):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    return str(value).replace(",", ";").replace("=", ":")


def key_text(names: list[str], key: tuple, dtype_names: list[str]) -> str:
    """Triton's key tuple as stable, readable text: ``n=1000,flag=True,x.dtype=float16``."""
    values = len(key) - len(dtype_names)
    parts = [f"{n}={_value_text(v)}" for n, v in zip(names[:values], key[:values])]
    parts += [f"{n}.dtype={str(d).removeprefix('torch.')}" for n, d in zip(dtype_names, key[values:])]
    return ",".join(parts)


class CapturedTemplate(Template):
    """A captured kernel as the store and the runtime see it: a name, a version, and a space that
    is its config list (a stored config is accepted where it names only parameters the list sets:
    which config it is, listed or built by the kernel's pruner for a call, is matched at launch).

    Its problem is a shape key's text (``{"key": "n=1000,x.dtype=float16"}``), so the runtime's
    one chain (exact, predicted, nearest, transferred, heuristic) answers a captured kernel as it
    does a shipped one; its heuristic is its first listed config (capture launches the first
    config Triton's pruning keeps for the call where the chain ends there)."""

    dims = ()

    def __init__(self, name: str, version: str, configs: list[Any]) -> None:
        self.name = name  # type: ignore[misc]
        self.__dict__["version"] = version  # shadows Template's cached_properties
        self.__dict__["space"] = ListedConfigs(configs)
        self._first: ConfigDict = config_dict(configs[0]) if configs else {}
        self.tune_hint = f"tune it with `tune misses --tune --kernel {name}`, or run in mode '{TUNE}'"

    def problem(self, **kwargs: Any) -> dict[str, Any]:
        return {"key": str(kwargs["key"])}

    def key(self, problem: dict[str, Any]) -> ShapeKey:
        return CapturedKey.of(problem["key"])

    def heuristic(self, problem: dict[str, Any], device: Device) -> ConfigDict:
        return dict(self._first)

    def violations(self, config: Any, problem: dict[str, Any], device: Device) -> list[str]:
        return []  # whether a stored config fits the call is Triton's pruning's to say, at launch

    def key_distance(self, a: ShapeKey, b: ShapeKey) -> float:
        """Distance in log2 space over the integer fields (|n| + 1: a key value may be 0);
        infinite when any other field differs."""
        if not a.comparable(b):
            return math.inf
        return math.sqrt(
            sum((math.log2(abs(x) + 1) - math.log2(abs(y) + 1)) ** 2 for (_, x), (_, y) in zip(a.dims, b.dims))
        )


@dataclass(frozen=True)
class CapturedKey(ShapeKey):
    """A captured kernel's shape key: parsed like any (integer dims, other fields), written as
    Triton's key text exactly as stored (its fields in the kernel's own order)."""

    text: str = ""

    @classmethod
    def of(cls, text: str) -> CapturedKey:
        parsed = ShapeKey.parse(text)
        return cls(parsed.dims, parsed.fields, text)

    def __str__(self) -> str:
        return self.text


class ListedConfigs:
    """What the runtime asks of a captured kernel's space: whether a stored config may be one of
    its configs (listed, or built by an ``early_config_prune`` or ``perf_model`` for some call)."""

    def __init__(self, configs: list[Any]) -> None:
        self.hashes = {config_hash(config_dict(c)) for c in configs}
        self.names = {name for c in configs for name in config_dict(c)} | set(LAUNCH_OPTIONS)

    def stored_config(self, config: Any) -> ConfigDict | str:
        if not isinstance(config, dict) or not config:
            return "not a config"
        if config_hash(config) in self.hashes or config.keys() <= self.names:
            return config
        return "names parameters the kernel's configs do not have"


# -- per-kernel state -------------------------------------------------------------------------
class _State:
    """tunesvc's state of one autotuner: its identity, settings and chosen configs."""

    def __init__(self, tuner: Autotuner, settings: Settings, name: str | None, options: dict[str, Any]) -> None:
        self.settings = settings
        self.off = settings.mode == OFF or len(tuner.configs) <= 1
        self.name = name or kernel_name(tuner.fn)
        #: distinct keys this process resolved (a kernel past settings.max_keys() is left to Triton)
        self.keys_met = 0
        self.options = options
        #: Triton's key tuple -> (config, its launch keyword arguments): the hot path's one lookup
        self.chosen: dict[tuple, tuple[Any, dict[str, Any]]] = {}
        self.arg_set = frozenset(tuner.arg_names)
        self.lock = threading.Lock()
        self._template: CapturedTemplate | None = None
        self._by_hash: dict[str, Any] | None = None
        self._configs = tuner.configs
        self._fn = tuner.fn
        #: the kernel's launcher on a hit (tunesvc.launch); None where fn wraps the kernel
        #: (@triton.heuristics): then fn.run, as Triton's Autotuner calls it
        self.direct = DirectLaunch(tuner.fn) if isinstance(tuner.fn, (JITFunction, InterpretedFunction)) else None

    @property
    def template(self) -> CapturedTemplate:
        if self._template is None:
            self._template = CapturedTemplate(self.name, kernel_version(self._fn, self._configs), self._configs)
        return self._template

    def listed(self, stored: dict[str, Any]) -> Any | None:
        """The listed triton.Config a stored config names (None: not in this list)."""
        if self._by_hash is None:
            self._by_hash = {}
            for c in self._configs:
                self._by_hash.setdefault(config_hash(config_dict(c)), c)
        return self._by_hash.get(config_hash(dict(stored)))

    def match(self, stored: dict[str, Any] | None, candidates: Callable[[], list[Any]]) -> Any | None:
        """The triton.Config a stored config names: a listed one, else one of ``candidates()`` (the
        configs the kernel's pruner builds for this call; called only where none is listed)."""
        if stored is None:
            return None
        config = self.listed(stored)
        if config is None:
            wanted = config_hash(dict(stored))
            config = next((c for c in candidates() if config_hash(config_dict(c)) == wanted), None)
        return config


_STATES: weakref.WeakSet[Autotuner] = weakref.WeakSet()
#: the process's capture, set by capture(); None: plain Autotuner instances run as Triton's
_process: Settings | None = None


def _state_of(tuner: Autotuner) -> _State:
    state = tuner.__dict__.get("_tunesvc")
    if state is None:
        with _settings_lock:
            state = tuner.__dict__.get("_tunesvc")
            if state is None:
                try:
                    state = _State(tuner, _process or Settings.resolve(), None, {})
                except Exception as exc:  # fails open: the kernel runs as Triton's
                    off = _Off(tuner)
                    _give_up(off, exc, "setting up", stacklevel=4)
                    state = off
                if not state.off:
                    KERNELS.add(state.name)
                tuner.__dict__["_tunesvc"] = state
                _STATES.add(tuner)
    return state


def _forget_all() -> None:
    """Drop every kernel's captured state: the next launches resolve again (settings changed)."""
    for tuner in list(_STATES):
        state = tuner.__dict__.get("_tunesvc")
        if state is not None and not isinstance(tuner, CapturedKernel):
            del tuner.__dict__["_tunesvc"]
        elif state is not None:
            state.chosen.clear()
    _shared.clear()


# -- the launch path ----------------------------------------------------------------------------
def captured_run(self: Autotuner, *args: Any, **kwargs: Any) -> Any:
    """``Autotuner.run`` the tunesvc way: a key seen before is one dict lookup, then the kernel."""
    state = self.__dict__.get("_tunesvc") or _state_of(self)
    if state.off:
        return _TRITON_RUN(self, *args, **kwargs)
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
        key = _triton_key(self, nargs)
        hit = state.chosen.get(key)
    if hit is None:
        try:
            hit = _resolve(self, state, key, nargs, args, kwargs)
        except _LeftToTriton:
            return _TRITON_RUN(self, *args, **kwargs)
        except Exception as exc:  # capture fails open (see the module docstring)
            _give_up(state, exc, _STAGE.of(exc), stacklevel=2)
            return _TRITON_RUN(self, *args, **kwargs)
    config, launch = hit
    self.best_config = config
    if config.pre_hook is not None:
        config.pre_hook({**nargs, **kwargs, **launch})
    direct = state.direct
    if direct is not None and "grid" in kwargs and not kwargs.get("warmup"):
        # KernelInterface[grid] passes grid and warmup as keywords; the rest are the kernel's
        rest = {k: v for k, v in kwargs.items() if k != "grid" and k != "warmup"}
        return direct.launch(kwargs["grid"], args, {**rest, **launch})
    return self.fn.run(*args, **kwargs, **launch)


class _LeftToTriton(Exception):
    """A key tunesvc leaves to Triton's own autotuner, already said (see :func:`_give_up`)."""


class _Stage(threading.local):
    """What this thread's capture is doing, for the warning of a failure (``look up``, ``claim``...)."""

    name = "look up"

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        outer, self.name = self.name, name
        try:
            yield
        except Exception as exc:  # the innermost stage names the failure: the outer ones are restored
            if not hasattr(exc, "_tunesvc_stage"):
                try:
                    exc._tunesvc_stage = name  # type: ignore[attr-defined]
                except Exception:  # an exception type that takes no attributes: the outer stage
                    pass
            raise
        finally:
            self.name = outer

    def of(self, exc: BaseException) -> str:
        """The stage ``exc`` was raised in."""
        return getattr(exc, "_tunesvc_stage", self.name)


_STAGE = _Stage()


def _give_up(state: Any, exc: BaseException | str, stage: str, *, stacklevel: int) -> None:
    """Leave the kernel to Triton's own autotuner for the rest of the process, said in one line
    naming the kernel, the reason and what to do (``stacklevel`` as the caller's own, so that the
    line points at the user's launch). ``exc`` is an exception, or a reason of tunesvc's own."""
    state.off = True
    if isinstance(exc, str):
        category, reason, fix = stage, exc, "nothing is wrong with the program"
    elif isinstance(exc, TunesvcError):
        category, reason, fix = stage, str(exc).rstrip("."), "fix that and run again"
    else:
        category = f"{stage} failed"
        reason = f"{category} with {type(exc).__name__}: {_one_line(exc)}"
        if stage in _DATABASE_STAGES or isinstance(exc, OSError) or "sqlalchemy" in type(exc).__module__:
            fix = "check the database TUNESVC_DB names, or set TUNESVC_MODE=off to leave the kernels to Triton"
        else:
            fix = "set TUNESVC_MODE=off to leave it to Triton quietly, and report this tunesvc bug"
    FAILED_OPEN[category] += 1
    warnings.warn(
        f"tunesvc: {state.name}: {reason}; it runs with Triton's own autotuner in this process ({fix}).",
        RuntimeWarning,
        stacklevel=stacklevel + 1,
    )


#: stages whose failures come from the database rather than from tunesvc's own code
_DATABASE_STAGES = ("look up", "open the database", "claim", "store")


class _Off:
    """The state of a kernel whose own state could not be made: Triton's own autotuner runs it."""

    off = True

    def __init__(self, tuner: Autotuner) -> None:
        self.name = getattr(getattr(tuner, "base_fn", None), "__qualname__", type(tuner).__name__)


def _triton_key(tuner: Autotuner, nargs: dict[str, Any]) -> tuple:
    """The key Autotuner.run caches a config under: key values, then dtype names."""
    return tuple(
        [nargs[k] for k in tuner.keys if k in nargs] + [str(v.dtype) for v in nargs.values() if hasattr(v, "dtype")]
    )


#: how deep this thread is in tunesvc's own measuring of a kernel (see :func:`_measuring`)
_MEASURING = threading.local()


@contextmanager
def _measuring() -> Iterator[None]:
    """Mark this thread as measuring: autotuned launches that the measuring itself causes tune
    nothing. A library may have put autotuned kernels under torch's ops (FlagGems' ``use_gems``
    and ``enable`` replace the CUDA kernels of norm, sub, copy and others), and tunesvc's checks
    and timing call those ops: tuning such a key there would be a tuning inside a tuning, and
    the same kernel's key again inside its own (its lock is held). Such a key gets its stored
    winner or the fallback, and is not remembered: when the program launches it, it is tuned.
    """
    _MEASURING.depth = getattr(_MEASURING, "depth", 0) + 1
    try:
        yield
    finally:
        _MEASURING.depth -= 1


def _nested() -> bool:
    return getattr(_MEASURING, "depth", 0) > 0


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
            config = _tune_locked(tuner, state, shared, text, args, kwargs, pruned)
    if len(tuner.configs) > 1:
        # triton.autotune zeroes the reset_to_zero arguments after benchmarking a key, so the
        # launch that follows a key's first resolution starts from zero: so does this one
        tuner.pre_hook({**dict(zip(tuner.arg_names, args)), **kwargs, **config.all_kwargs()}, reset_only=True)
    return config


class _Pruned:
    """The configs Triton's pruning keeps for one call (:func:`_pruned`), computed on first use."""

    def __init__(self, tuner: Autotuner, args: tuple, kwargs: dict[str, Any]) -> None:
        self._call = (tuner, args, kwargs)
        self._configs: list[Any] | None = None

    def __call__(self) -> list[Any]:
        if self._configs is None:
            self._configs = _pruned(*self._call)
        return self._configs


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
        self._state: _State | None = None
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
        if _nested():  # answered for this launch alone, as _resolve does
            _MEASURING.answer = (
                self,
                key,
                _nested_config(state, _key_text_of(tuner, key, nargs), _Pruned(tuner, args, kwargs)),
            )
            return True
        try:
            with state.lock:
                if key not in answers:
                    answers[key] = _config_for(tuner, state, _key_text_of(tuner, key, nargs), args, kwargs)
        except _LeftToTriton:
            return key in self.inner
        except Exception as exc:  # capture fails open: the subclass searches as it would alone
            _give_up(state, exc, _STAGE.of(exc), stacklevel=3)
            return key in self.inner
        return True

    def __getitem__(self, key: Any) -> Any:
        nested = getattr(_MEASURING, "answer", None)
        if nested is not None and nested[0] is self and nested[1] == key:
            _MEASURING.answer = None
            return nested[2]
        answers = self._answers()
        if answers is not None and key in answers:
            return answers[key]
        return self.inner[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        self.inner[key] = value

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key] if key in self else default  # noqa: SIM401 (self.get is this method)

    def __getattr__(self, name: str) -> Any:  # the subclass's own cache's other methods
        if name == "inner":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


def _wrap_run(cls: type) -> None:
    """Give ``cls`` (a subclass of Autotuner with its own ``run``) a run whose cache misses go
    through tunesvc while capture is on; with capture off it is the class's own run."""
    own = cls.__dict__.get("run")
    if own is None or own is captured_run or getattr(own, "__tunesvc_original__", None) is not None:
        return

    def run(self: Autotuner, *args: Any, **kwargs: Any) -> Any:
        if _process is None:
            return own(self, *args, **kwargs)
        if type(self.cache) is not _StoreCache:
            self.cache = _StoreCache(self, self.cache)
        outer = getattr(_CALL, "value", None)
        _CALL.value = (args, kwargs)
        try:
            return own(self, *args, **kwargs)
        finally:
            _CALL.value = outer

    run.__tunesvc_original__ = own  # type: ignore[attr-defined]
    run.__doc__, run.__name__, run.__qualname__ = own.__doc__, own.__name__, own.__qualname__
    cls.run = run  # type: ignore[attr-defined]


def _wrap_subclasses() -> None:
    """Every Autotuner subclass with its own run, defined now or later, gets :func:`_wrap_run`."""
    todo = list(Autotuner.__subclasses__())
    while todo:
        cls = todo.pop()
        _wrap_run(cls)
        todo.extend(cls.__subclasses__())
    if "__init_subclass__" not in Autotuner.__dict__:
        Autotuner.__init_subclass__ = classmethod(lambda cls, **_: _wrap_run(cls))


def _record_miss(shared: _Shared, state: _State, text: str, tuner: Autotuner, args: tuple, kwargs: dict) -> None:
    """Write the miss to the database for offline tuning; serving goes on if it cannot."""
    try:
        store = shared.store(create=False)
        if store is None:
            return
        from tunesvc.device import current_device

        device = current_device()
        store.record_miss(state.template, device, text, describe_call(tuner, args, kwargs))
    except Exception as exc:  # a serving process never fails on bookkeeping
        warnings.warn(f"tunesvc: could not record the miss of {state.name} ({exc}).", RuntimeWarning, stacklevel=4)


def describe_call(tuner: Autotuner, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments as data (tensors by shape, stride and dtype; small integer tensors by
    value, since they are often offsets or indices), and the grid each listed config launches."""

    def arg(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            out: dict[str, Any] = {
                "tensor": {"shape": list(value.shape), "stride": list(value.stride()), "dtype": str(value.dtype)}
            }
            if not value.is_floating_point() and value.numel() <= 4096:
                out["tensor"]["values"] = value.detach().cpu().flatten().tolist()
            return out
        if value is None or isinstance(value, (bool, int, float, str)):
            return {"value": value}
        if _is_descriptor(value) and isinstance(value.base, torch.Tensor):
            return {
                "descriptor": {
                    **arg(value.base),
                    **{f: [int(x) for x in getattr(value, f)] for f in ("shape", "strides", "block_shape")},
                    "padding": str(getattr(value, "padding", "zero")),
                }
            }
        return {"unsupported": type(value).__name__}

    grid = kwargs.get("grid")
    nargs = {**dict(zip(tuner.arg_names, args)), **kwargs}
    grids: list[list[int] | None] = []
    for config in tuner.configs:
        try:
            g = grid({**nargs, **config.all_kwargs()}) if callable(grid) else grid
            grids.append([int(x) for x in (g if isinstance(g, (tuple, list)) else (g,))])
        except Exception:
            grids.append(None)
    return {
        "args": [arg(a) for a in args],
        "kwargs": {k: arg(v) for k, v in kwargs.items() if k not in ("grid", "warmup")},
        "grids": grids,
    }


# -- tuning a miss ------------------------------------------------------------------------------
def _tune_locked(
    tuner: Autotuner,
    state: _State,
    shared: _Shared,
    text: str,
    args: tuple,
    kwargs: dict[str, Any],
    pruned: _Pruned,
) -> Any:
    """Tune the key once across processes and hosts; the others wait and then read the winner
    (the one key claim: :class:`tunesvc.tuning.claim.KeyClaim`)."""
    from tunesvc.device import current_device
    from tunesvc.tuning.claim import KeyClaim

    with _STAGE("prune"):
        candidates = pruned()
    if len(candidates) == 1:  # as triton.autotune: nothing to choose between, nothing measured
        STATS["untuned"] += 1
        return candidates[0]
    with _STAGE("open the database"):
        store = shared.store(create=True)
        assert store is not None
        device = current_device()
    template = state.template

    def winner() -> Any:
        rows = store.winners(kernel=state.name, hardware_id=device.hardware_id, version=template.version)
        return state.match(next((w.config for w in rows if w.shape_key == text), None), pruned)

    ident = f"{state.name}|{template.version}|{device.hardware_id}|{text}"
    with _STAGE("claim"), KeyClaim(store, state.name, ident, text, winner) as claim:
        if claim.winner is not None:
            STATS["stored"] += 1
            return claim.winner
        started = time.perf_counter()
        with _untraced(_tensors_of((args, kwargs))):
            config = tune_key(tuner, state, store, device, text, list(candidates), _aliased(args), _aliased(kwargs))
        TUNE_SECONDS[0] += time.perf_counter() - started
        STATS["tuned"] += 1
        return config


@contextmanager
def _untraced(tensors: list[torch.Tensor]) -> Iterator[None]:
    """Tuning leaves no trace but the store: no autograd graph (inference mode where the call's
    tensors are inference tensors, which only it may write), the RNG states, the current CUDA
    device and stream as they were."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    device = torch.cuda.current_device() if cuda else None
    stream = torch.cuda.current_stream() if cuda else None
    inference = any(t.is_inference() for t in tensors)
    grad_off = torch.inference_mode() if inference else torch.no_grad()
    try:
        with torch.random.fork_rng(devices=[device] if device is not None else [], device_type="cuda"), grad_off:
            yield
    finally:
        if device is not None:
            torch.cuda.set_device(device)
            torch.cuda.set_stream(stream)  # type: ignore[arg-type]


def _aliased(values: Any) -> Any:
    """The call's arguments with each tensor as ``Tensor.data``: the same memory under a version
    counter of its own, so that restoring the inputs between candidates (and reset_to_zero,
    restore_value) never bumps the version of a tensor autograd saved for backward."""

    def alias(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return v.data
        base = v.base if _is_descriptor(v) else None
        if isinstance(base, torch.Tensor) and dataclasses.is_dataclass(v) and not isinstance(v, type):
            return dataclasses.replace(v, base=base.data)
        return v

    if isinstance(values, dict):
        return {k: alias(v) for k, v in values.items()}
    return tuple(alias(v) for v in values)


def _pruned(tuner: Autotuner, args: tuple, kwargs: dict[str, Any]) -> list[Any]:
    """The configs Triton's pruning keeps for a call, each once (a list may repeat one: torchao's
    int8 GEMM lists two of its 27 twice). ``prune_configs`` reads the call from ``tuner.nargs``,
    which is put back as it was after: a subclass's own run (FlagGems' LibTuner) sets it before
    its cache lookup, which lands here, and reads it again after."""
    before = getattr(tuner, "nargs", None)
    tuner.nargs = dict(zip(tuner.arg_names, args))
    try:
        kept = tuner.prune_configs(kwargs)
    finally:
        tuner.nargs = before
    unique: dict[str, Any] = {}
    for config in kept:
        unique.setdefault(config_hash(config_dict(config)), config)
    return list(unique.values())


class CaptureBench(Bench):
    """Checks and times a captured kernel's configs on one call's own arguments.

    The tensors of the call are snapshotted before the first candidate and restored before each
    one, so every candidate starts from the same inputs (an accumulating or in-place kernel is
    judged on what one call computes). A candidate's output is every tensor argument after its
    launch (before the post-hook, which may restore them), compared with the first valid
    config's: the tensors that config wrote by relative error within the dtype's tolerance,
    the others exactly. Where that config wrote NaN or inf and a later one writes none, the later
    one is the reference from then on (a config that computes garbage may come first in a list).
    """

    def __init__(
        self,
        tuner: Autotuner,
        device: Device,
        args: tuple,
        kwargs: dict[str, Any],
        *,
        rep_ms: float = settings.REP_MS,
        tolerance: float | None = None,
        grids: dict[str, Any] | None = None,
        candidates: list[Any] = (),  # type: ignore[assignment]
    ) -> None:
        self.tuner = tuner
        self.device = device
        self.rep_ms = rep_ms
        self.problem = {}
        self.inputs = (tuple(args), dict(kwargs))
        self._input_sets = None
        self._tolerance = tolerance
        self._grids = grids
        #: every config a finalist's stored dict may name: listed, or built by the pruner for this call
        self._configs = {config_hash(config_dict(c)): c for c in (*tuner.configs, *candidates)}
        self._tensors = _tensors_of(self.inputs)
        self._pristine = [t.clone() for t in self._tensors]
        self.ref: list[torch.Tensor] | None = None
        self._written: list[bool] = []
        #: set by the measure that made its config the reference in place of an earlier one
        self.took_over = False
        self._ref_finite = True
        self.measurements = 0

    def restore(self) -> None:
        for t, saved in zip(self._tensors, self._pristine):
            t.copy_(saved)

    def input_sets(self) -> list[Any]:
        if self._input_sets is None:
            from tunesvc.bench import input_bytes
            from tunesvc.bench import input_sets_needed
            from tunesvc.bench import l2_bytes

            count = input_sets_needed(input_bytes(self._pristine), l2_bytes()) if self.device.is_gpu else 1
            self._input_sets = [self.inputs] + [_cloned(self.inputs) for _ in range(count - 1)]
        return self._input_sets

    def _launch(self, config: Any, inputs: Any, *, check: bool = False) -> list[torch.Tensor] | None:
        args, kwargs = inputs
        if self._grids is not None:
            kwargs = {**kwargs, "grid": self._grids[config_hash(config_dict(config))]}

        def outputs() -> list[torch.Tensor]:  # read before the post-hook, which may restore them
            self._sync()
            return [t.clone() for t in self._tensors]

        return launch_listed(self.tuner, config, args, kwargs, outputs if check else None)

    def measure(self, config: Any) -> Measurement:
        self.measurements += 1
        self.restore()
        start = time.perf_counter()
        try:
            outputs = self._launch(config, self.inputs, check=True)
            self._sync()
        except _out_of_resources_types() as exc:
            return Measurement(Status.INVALID, message=_one_line(exc))
        except _compile_error_types() as exc:
            return Measurement(Status.COMPILE_ERROR, message=_one_line(exc))
        except Exception as exc:  # a candidate's failure is data
            return Measurement(Status.ERROR, message=f"{type(exc).__name__}: {_one_line(exc)}")
        elapsed_ms = (time.perf_counter() - start) * 1e3
        assert outputs is not None
        if self.ref is None:  # the first valid config is the reference
            self.ref = outputs
            self._written = [not _same(out, saved) for out, saved in zip(outputs, self._pristine)]
            self._ref_finite = self._finite(outputs)
            err = 0.0
        elif not self._ref_finite and self._finite(outputs):
            # the reference wrote NaN or inf where this config writes none: this one takes over,
            # and the configs measured before it are to be judged again (see _measured)
            self.ref, self._ref_finite, self.took_over = outputs, True, True
            err = 0.0
        else:
            err, message = self._error(outputs)
            if message:
                return Measurement(Status.WRONG_RESULT, rel_error=err, message=message)
        if not self.device.is_gpu:  # the interpreter: its one run is its time
            return Measurement(Status.OK, time_ms=elapsed_ms, spread=0.0, reps=1, rel_error=err)
        return self._timed(self._launcher(config), rel_error=err)

    def _finite(self, outputs: list[torch.Tensor]) -> bool:
        """No NaN or inf in the floating tensors the reference config wrote."""
        return all(
            bool(torch.isfinite(_widened(out)).all())
            for out, written in zip(outputs, self._written)
            if written and (out.is_floating_point() or out.is_complex())
        )

    def _error(self, outputs: list[torch.Tensor]) -> tuple[float, str | None]:
        assert self.ref is not None
        worst = 0.0
        for i, (out, ref, written) in enumerate(zip(outputs, self.ref, self._written)):
            if not written or not (out.is_floating_point() or out.is_complex()):
                if not _same(out, ref):
                    return math.inf, f"tensor argument {i} differs from the first valid config's"
                continue
            tolerance = self._tolerance if self._tolerance is not None else TOLERANCE.get(out.dtype, LOOSE_TOLERANCE)
            err = relative_error(_widened(out), _widened(ref))
            if not err <= tolerance:
                return (
                    err,
                    f"tensor argument {i}: relative error {err:.3g} > {tolerance:g} against the first valid config",
                )
            worst = max(worst, err)
        return worst, None

    def time_peer(self) -> Measurement:
        """INVALID: a captured kernel has no template, so no torch peer (Bench's would raise on it)."""
        return Measurement(Status.INVALID, message="a captured kernel has no torch peer")

    def _launcher(self, config: Any):
        if isinstance(config, dict):  # a finalist, by its stored dict
            config = self._configs[config_hash(config)]
        return lambda inputs: lambda: self._launch(config, inputs)


def _contenders(measured: list[Measurement]) -> int:
    """How many of a key's fastest correct candidates the finalists' re-timing takes: those whose
    first time is within FINALIST_WINDOW of the fastest, at most FINALISTS. Long replays are spent
    only where they can change the answer: a fastest candidate ahead of every other by more
    than the window wins on its first time (one contender: no re-timing)."""
    times = sorted(m.time_ms for m in measured if m.ok and m.time_ms is not None)
    if not times:
        return 0
    return min(FINALISTS, sum(1 for t in times if t <= times[0] * (1 + FINALIST_WINDOW)))


def _widened(t: torch.Tensor) -> torch.Tensor:
    """A float tensor of a dtype torch does little arithmetic on (float8 e4m3/e5m2: no ``abs`` on
    CUDA, so no ``isfinite``) as float32, by value; other tensors as they are."""
    if t.is_floating_point() and t.element_size() == 1:
        return t.float()
    return t


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal in shape and bits (float8 compared as bytes: torch has no ``eq`` for it everywhere)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point() and a.element_size() == 1:
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    return torch.equal(a, b)


def launch_listed(
    tuner: Autotuner, config: Any, args: tuple, kwargs: dict[str, Any], after: Callable[[], Any] | None = None
) -> Any:
    """Launch the kernel with one of its listed configs as its autotuner would: the config's and
    the tuner's pre-hooks, the launch, ``after()`` (what it returns is returned), the post-hook."""
    launch = config.all_kwargs()
    full = {**dict(zip(tuner.arg_names, args)), **kwargs, **launch}
    if config.pre_hook:
        config.pre_hook(full)
    tuner.pre_hook(full)
    try:
        tuner.fn.run(*args, **kwargs, **launch)
        result = after() if after is not None else None
    except Exception as exc:
        try:
            tuner.post_hook(full, exception=exc)
        finally:
            raise
    tuner.post_hook(full, exception=None)
    return result


def _measured(bench: CaptureBench, configs: list[Any], ready: Callable[[int], None] | None = None) -> list[Measurement]:
    """Each config measured by ``bench`` (once ``ready(i)`` returns, where given); where one takes
    over as the reference, the configs before it are measured again, against it."""
    out: list[Measurement] = []
    for i, config in enumerate(configs):
        if ready is not None:
            ready(i)
        measurement = bench.measure(config)
        if bench.took_over:
            bench.took_over = False
            out = [bench.measure(earlier) for earlier in configs[: len(out)]]
        out.append(measurement)
    return out


def _tensors_of(inputs: tuple[tuple, dict[str, Any]]) -> list[torch.Tensor]:
    """The call's tensors: its tensor arguments and the tensors under its host-side tensor
    descriptors (``triton.tools.tensor_descriptor.TensorDescriptor``: FlagGems' host-TMA GEMM
    takes A, B and C only so), each once."""
    args, kwargs = inputs
    found: dict[int, torch.Tensor] = {}
    for v in (*args, *kwargs.values()):
        tensor = v.base if _is_descriptor(v) else v
        if isinstance(tensor, torch.Tensor):
            found.setdefault(id(tensor), tensor)
    return list(found.values())


def _is_descriptor(value: Any) -> bool:
    # by name: triton.tools.tensor_descriptor exists from Triton 3.4, and launches stay import-free
    return type(value).__name__ == "TensorDescriptor" and hasattr(value, "block_shape")


def _cloned(inputs: tuple[tuple, dict[str, Any]]) -> tuple[tuple, dict[str, Any]]:
    args, kwargs = inputs

    def copy(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return v.clone()
        base = v.base if _is_descriptor(v) else None
        if isinstance(base, torch.Tensor) and dataclasses.is_dataclass(v) and not isinstance(v, type):
            return dataclasses.replace(v, base=base.clone())  # a host-side descriptor over a copy
        return v

    return tuple(copy(a) for a in args), {k: copy(v) for k, v in kwargs.items()}


#: compile workers a captured key's candidates get at most (see :func:`_precompiled`)
MAX_COMPILE_WORKERS = 8
#: GPU memory counted for a compile worker beside its copy of the call's tensors: a margin for
#: its CUDA context with torch and Triton loaded (some hundreds of MB)
WORKER_CONTEXT_BYTES = 600 << 20


class RecordedKernel:
    """A captured kernel as a compile worker rebuilds it: imported by ``module:qualname``, its
    call rebuilt from the record (:func:`describe_call`), a listed config launched on it. What
    :class:`tunesvc.bench.Compiler` asks of a template: ``make_inputs`` and ``launch``."""

    def __init__(self, name: str, call: dict[str, Any]) -> None:
        self.name = name
        self.call = call

    def make_inputs(self, problem: dict[str, Any], device: Device) -> tuple[Autotuner, tuple, dict, dict]:
        tuner = find_autotuner(self.name)
        args, kwargs, grids = rebuild_call(tuner, self.call, device)
        return tuner, args, kwargs, grids

    def launch(self, inputs: tuple[Autotuner, tuple, dict, dict], config: ConfigDict) -> None:
        tuner, args, kwargs, grids = inputs
        h = config_hash(config)
        listed = next(c for c in tuner.configs if config_hash(config_dict(c)) == h)
        launch_listed(tuner, listed, args, {**kwargs, "grid": grids[h]})


def compile_workers(candidates: int, device: Device, call_bytes: int) -> int:
    """How many worker processes compile a captured key's candidates while this process
    measures them: $TUNESVC_COMPILE_WORKERS where set (0: none), else on a GPU half the CPU cores
    up to MAX_COMPILE_WORKERS; never more than the candidates after the first (which this
    process compiles meanwhile), nor more copies of the call than half the free GPU memory holds;
    none where this process runs on a GPU other than the first visible one (a rank of a
    multi-GPU process), since workers make their contexts on that one."""
    given = settings.compile_workers()
    if given is not None:
        workers = given
    elif device.is_gpu:
        workers = min(MAX_COMPILE_WORKERS, (os.cpu_count() or 1) // 2)
    else:
        return 0  # the interpreter compiles nothing
    workers = min(workers, candidates - 1)
    if workers > 0 and device.is_gpu:
        if torch.cuda.current_device() != 0:
            return 0  # workers make their CUDA context on the first visible GPU, not this process's
        free, _ = torch.cuda.mem_get_info()
        workers = min(workers, int(free // 2 // (call_bytes + WORKER_CONTEXT_BYTES)))
    return max(workers, 0)


#: seconds a captured key's measuring runs alone before its compile workers may start: a key
#: done sooner never starts them
PRECOMPILE_AFTER_S = 5.0
#: ... and they start only where the candidates left would take this process longer than this,
#: at the pace it has gone so far: a pool's start (its server importing torch and Triton, each
#: worker making its CUDA context) costs about 10 s of an H100 machine's CPU and GPU beside the
#: measuring, more than it saves on a key whose candidates compile in less
PRECOMPILE_WORTH_S = 20.0


class _Precompile:
    """Compile workers for one key's candidates, started in the background after
    PRECOMPILE_AFTER_S where those left are worth it (PRECOMPILE_WORTH_S), which take the
    candidates this process has not reached yet (see :func:`_precompiled`)."""

    def __init__(self, workers: int, kernel: RecordedKernel, configs: list[ConfigDict]) -> None:
        self._lock = threading.Lock()
        self._futures: dict[int, Future] = {}
        self._taken: set[int] = set()  # candidates this process compiles itself
        self._reached = 0  # candidates this process has started measuring
        self._stop = threading.Event()
        self._compiler: Any = None  # set before the first future
        self._thread = threading.Thread(target=self._start, args=(workers, kernel, configs), daemon=True)
        self._thread.start()

    def _start(self, workers: int, kernel: RecordedKernel, configs: list[ConfigDict]) -> None:
        from tunesvc.bench import Compiler

        started = time.perf_counter()
        if self._stop.wait(PRECOMPILE_AFTER_S):
            return
        with self._lock:
            reached = max(self._reached, 1)
        left_s = (time.perf_counter() - started) / reached * (len(configs) - reached)
        if left_s < PRECOMPILE_WORTH_S:
            return
        problem = {"kernel": kernel.name}
        try:
            # from the forkserver: this thread must not fork a process whose other threads run on
            self._compiler = compiler = Compiler(workers, template=kernel, problem=problem, forkserver=True)
            for i, config in enumerate(configs):
                with self._lock:
                    if self._stop.is_set():
                        return
                    if i in self._taken:
                        continue
                future = compiler.submit(kernel, problem, [config])[0]  # blocks while the pool starts
                with self._lock:
                    self._futures[i] = future
                    if i in self._taken or self._stop.is_set():
                        future.cancel()
        except Exception:  # no pool, or a broken one: the calling process compiles what is left
            return

    def ready(self, i: int) -> None:
        """Before candidate ``i`` is measured: wait for a worker that has it, else take it back."""
        with self._lock:
            self._reached = max(self._reached, i + 1)
            future = self._futures.get(i)
            if future is None:
                self._taken.add(i)
                return
        if future.cancel():  # queued, not started: this process compiles it without waiting
            return
        try:
            if future.result(timeout=self._compiler.timeout_s) is None:
                STATS["precompiled"] += 1
        except Exception:  # a worker's failure: this process compiles, measures and classifies it
            pass

    def close(self) -> None:
        """Stop, without waiting for a pool that is still starting."""
        self._stop.set()
        with self._lock:
            for future in self._futures.values():
                future.cancel()
        threading.Thread(target=self._shut_down, daemon=True).start()

    def _shut_down(self) -> None:
        self._thread.join()
        if self._compiler is not None:
            self._compiler.close()


@contextmanager
def _precompiled(
    tuner: Autotuner,
    state: _State,
    device: Device,
    candidates: list[Any],
    call: dict[str, Any],
    args: tuple,
    kwargs: dict[str, Any],
) -> Iterator[Callable[[int], None] | None]:
    """Yields ``ready(i)``, to call before measuring candidate ``i``: once the key has been
    measured for PRECOMPILE_AFTER_S, and where what is left would take longer than
    PRECOMPILE_WORTH_S, worker processes compile the candidates this process has not reached
    into Triton's on-disk cache, where its launch then finds them. None where no worker
    helps (see :func:`compile_workers`) or none can rebuild the kernel (defined in a script or a
    function, or an argument of a type no record holds).

    Triton holds the GIL while it compiles (two compiles on two threads took as long as one after
    the other, Triton 3.9), hence processes. ``ready(i)`` waits for candidate ``i`` where a
    worker has started it, and takes it back where none has: this process compiles it then, as
    it would without workers, instead of waiting behind the others.
    """
    describable = all("unsupported" not in spec for spec in [*call.get("args", []), *call.get("kwargs", {}).values()])
    call_bytes = sum(t.numel() * t.element_size() for t in _tensors_of((args, kwargs)))
    workers = compile_workers(len(candidates), device, call_bytes) if describable else 0
    if workers > 0:
        try:
            reachable = find_autotuner(state.name) is tuner
        except TunesvcError:
            reachable = False
        workers = workers if reachable else 0
    if workers <= 0:
        yield None
        return
    precompile = _Precompile(workers, RecordedKernel(state.name, call), [config_dict(c) for c in candidates])
    try:
        yield precompile.ready
    finally:
        precompile.close()


def tune_key(
    tuner: Autotuner,
    state: _State,
    store: Store,
    device: Device,
    text: str,
    candidates: list[Any],
    args: tuple,
    kwargs: dict[str, Any],
    *,
    grids: dict[str, Any] | None = None,
    call: dict[str, Any] | None = None,
) -> Any:
    """Check and time every candidate on the call's arguments, store every trial and the winner.

    Returns the winning triton.Config (the first candidate where none is correct: its launch
    then raises what triton.autotune would). The call's tensors are left as they were given.
    """
    from tunesvc.bench import remeasure_finalists

    template = state.template
    with _STAGE("store"):
        kv_id = store.kernel_version_id(template)
        device_id = store.device_id(device)
        started = time.perf_counter()
        # the call as data: `tune verify` and offline tuning rebuild inputs of the same shapes from it
        call = call if call is not None else describe_call(tuner, args, kwargs)
        sweep_id = store.start_sweep(kv_id, device_id, text, call, "capture", len(candidates), 0)
    rep_ms = float(getattr(tuner, "num_reps", None) or settings.REP_MS)
    with (
        _STAGE("measure"),
        _measuring(),
        _precompiled(tuner, state, device, candidates, call, args, kwargs) as ready,
    ):
        bench = CaptureBench(
            tuner,
            device,
            args,
            kwargs,
            rep_ms=rep_ms * FIRST_PASS_SHARE,
            tolerance=state.options.get("tolerance"),
            grids=grids,
            candidates=candidates,
        )
        try:
            measured = _measured(bench, candidates, ready)
            STATS["benchmarks"] += bench.measurements
            results = [(config_dict(c), config_hash(config_dict(c)), m) for c, m in zip(candidates, measured)]
            with _STAGE("store"):
                new = store.add_trials(sweep_id, kv_id, device_id, text, results)
                if None in new:  # measured before (`tune verify --retune`): the stored trials take the new measurements
                    stored = {r.config_hash: r.id for r in store.trials(kv_id, device_id, text)}
                    store.replace_measurements(
                        [(stored[h], m) for (_, h, m), i in zip(results, new) if i is None and h in stored]
                    )
            contenders = _contenders(measured)
            if device.is_gpu and contenders > 1:
                rows = store.trials(kv_id, device_id, text)
                store.replace_measurements(
                    remeasure_finalists(bench, rows, contenders, rep_ms, graph_ms=rep_ms * CAPTURE_FINALIST_GRAPH_SHARE)
                )
        finally:
            bench.restore()  # the caller launches the winner on the inputs as they were given
    # what triton.autotune leaves for code that reads them (first measurements, as Triton's)
    tuner.configs_timings = {
        c: [m.time_ms if m.ok and m.time_ms is not None else math.inf] * 3 for c, (_, _, m) in zip(candidates, results)
    }
    tuner.bench_time = time.perf_counter() - started
    with _STAGE("store"):
        winner = store.update_winner(kv_id, device_id, text)
        store.finish_sweep(sweep_id, time.perf_counter() - started)
    if winner is None:
        return candidates[0]
    return state.match(winner.config, lambda: candidates) or candidates[0]


# -- the drop-in and process-wide capture ----------------------------------------------------
_autotuner_params = set(inspect.signature(Autotuner.__init__).parameters)


class CapturedKernel(Autotuner):
    """``triton.autotune``'s Autotuner with tunesvc's launch path (see the module docstring)."""

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
        chosen = Settings.resolve(mode, db, bundle, base=_process)
        self.__dict__["_tunesvc"] = _State(self, chosen, name, {"tolerance": tolerance})
        _STATES.add(self)

    run = captured_run

    def _rebind(self) -> None:
        """New settings after capture()/configure(): explicit options keep winning."""
        old = self.__dict__["_tunesvc"]
        chosen = Settings.resolve(*self._explicit, base=_process)
        self.__dict__["_tunesvc"] = _State(self, chosen, old.name, old.options)


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
    return Capture(previous, True)


def uncapture() -> None:
    """Give every plain ``triton.autotune`` kernel Triton's own autotuner back."""
    _apply(None)


_summary_registered = False


def _apply(chosen: Settings | None) -> None:
    global _process, _summary_registered
    with _settings_lock:
        _process = chosen
        Autotuner.run = captured_run if chosen is not None else _TRITON_RUN
        if chosen is not None:
            _wrap_subclasses()
            if not _summary_registered and (settings.summary_requested() or settings.summary_file()):
                import atexit

                atexit.register(_write_summary)
                _summary_registered = True
    _forget_all()
    for tuner in list(_STATES):
        if isinstance(tuner, CapturedKernel):
            tuner._rebind()


def capturing() -> Settings | None:
    """The process's capture settings, or None when plain triton.autotune kernels run as Triton's."""
    return _process


def capture_from_env() -> None:
    """What ``TUNESVC_CAPTURE=1`` does once Triton's autotuner is imported (see _tunesvc_capture)."""
    if settings.capture_requested() and _process is None:
        capture()


# -- offline: recorded calls rebuilt, kernels found by name (`tune misses --tune`, `tune verify`) --
def find_autotuner(name: str) -> Autotuner:
    """Import the module ``name`` (``module:qualname``) names and find its autotuned kernel.

    Only ever called on a user's request on the command line (the module's import runs its code).
    TunesvcError, in one sentence, when the module does not import or holds no such kernel.
    """
    import importlib

    module_name, _, qualname = name.partition(":")
    if module_name == "__main__":
        raise TunesvcError(f"{name} was defined in a script run as __main__; move it to a module to tune it offline.")
    if "<locals>" in qualname.split("."):  # torchao builds its fp8 GEMMs inside a function, for one
        raise TunesvcError(
            f"{name} is defined inside a function, so no import reaches it; "
            "tune it where the program launches it (mode tune) instead."
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise TunesvcError(
            f"Module {module_name} of {name} does not import here ({type(exc).__name__}: {exc})."
        ) from None
    for value in list(vars(module).values()):
        obj, seen = value, 0
        while obj is not None and seen < 8:  # a wrapper (heuristics, a library's) walked by .fn
            if isinstance(obj, Autotuner):
                try:
                    if kernel_name(obj.fn) == name:
                        return obj
                except AttributeError:
                    pass
                break
            obj, seen = getattr(obj, "fn", None), seen + 1
    raise TunesvcError(f"Module {module_name} has no autotuned kernel {qualname}; was it renamed?")


def _host_memory() -> int:
    """This machine's memory in bytes (the interpreter's device memory)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # no sysconf: 16 GiB
        return 16 << 30


def _constexprs(tuner: Autotuner) -> set[str]:
    """The names of the kernel's ``tl.constexpr`` parameters (its JITFunction's, under any wrappers)."""
    fn: Any = tuner.fn
    for _ in range(8):
        if hasattr(fn, "params"):
            return {p.name for p in fn.params if getattr(p, "is_constexpr", False)}
        fn = getattr(fn, "fn", None)
    return set()


def check_call(tuner: Autotuner, call: Any, device: Device, shape_key: str | None = None) -> None:
    """Refuse (:class:`tunesvc.recorded_check.RefusedCall`, one sentence) a recorded call that
    cannot be replayed safely on ``device`` (see :mod:`tunesvc.recorded_check`), or whose key
    arguments and dtypes disagree with ``shape_key``, the key it is stored under."""
    from tunesvc.recorded_check import RefusedCall
    from tunesvc.recorded_check import check_recorded_call

    check_recorded_call(
        call,
        arg_names=list(tuner.arg_names),
        key_names=list(tuner.keys),
        constexprs=_constexprs(tuner),
        listed=len(tuner.configs),
        memory_bytes=device.memory_bytes or _host_memory(),
    )
    if shape_key is None:
        return
    stored = dict(part.partition("=")[::2] for part in shape_key.split(","))
    for name, spec in [*zip(tuner.arg_names, call.get("args", [])), *call.get("kwargs", {}).items()]:
        if name in tuner.keys and "value" in spec:
            field, recorded = name, _value_text(spec["value"])
        elif "tensor" in spec:
            field, recorded = f"{name}.dtype", str(spec["tensor"]["dtype"]).removeprefix("torch.")
        else:
            continue
        if field in stored and stored[field] != recorded:
            raise RefusedCall(
                f"The recorded call is refused, never launched: its {field} is {recorded}, "
                f"and the key it is stored under says {stored[field]}."
            )


def rebuild_call(
    tuner: Autotuner, call: dict[str, Any], device: Device, shape_key: str | None = None
) -> tuple[tuple, dict[str, Any], dict[str, Any]]:
    """Arguments of a recorded call (random floats, recorded small integer tensors), and the grid
    of each listed config by its hash. TunesvcError when the record cannot be replayed, or not
    safely (:func:`check_call`, before anything is allocated)."""
    from tunesvc.device import torch_device

    check_call(tuner, call, device, shape_key)
    where = torch_device()

    def value(spec: dict[str, Any]) -> Any:
        if "value" in spec:
            return spec["value"]
        if "descriptor" in spec:
            return descriptor(spec["descriptor"])
        if "tensor" not in spec:
            raise TunesvcError(
                f"The recorded call has an argument of type {spec.get('unsupported')}; it cannot be replayed."
            )
        t = spec["tensor"]
        dtype = getattr(torch, str(t["dtype"]).removeprefix("torch."), None)
        if not isinstance(dtype, torch.dtype):
            raise TunesvcError(f"The recorded call names an unknown dtype {t['dtype']!r}.")
        out = torch.empty_strided(t["shape"], t["stride"], dtype=dtype, device=where)
        if "values" in t:
            out.copy_(torch.tensor(t["values"], dtype=dtype).reshape(t["shape"]))
        elif dtype.is_floating_point:
            out.normal_()
        else:
            out.zero_()
        return out

    def descriptor(spec: dict[str, Any]) -> Any:
        """A host-side tensor descriptor over a new tensor (FlagGems' host-TMA GEMM takes them)."""
        try:
            from triton.tools.tensor_descriptor import TensorDescriptor
        except ImportError:
            raise TunesvcError(
                "The recorded call has a tensor descriptor argument and this Triton has no host-side descriptors."
            ) from None
        base = value(spec)
        try:
            fields = {f: [int(x) for x in spec[f]] for f in ("shape", "strides", "block_shape")}
            return TensorDescriptor(base, **fields, padding=str(spec.get("padding", "zero")))
        except (AssertionError, KeyError, TypeError, ValueError) as exc:  # Triton checks with asserts
            raise TunesvcError(
                f"The recorded call's tensor descriptor is not valid here ({exc or 'a check failed'})."
            ) from None

    args = tuple(value(a) for a in call.get("args", []))
    kwargs = {k: value(v) for k, v in call.get("kwargs", {}).items()}
    grids = {
        config_hash(config_dict(c)): tuple(g) for c, g in zip(tuner.configs, call.get("grids", [])) if g is not None
    }
    if not grids:
        raise TunesvcError("The recorded call has no launch grid; launch the kernel once in mode tune instead.")
    return args, {**kwargs, "grid": None, "warmup": False}, grids


def tune_recorded(store: Store, name: str, version: str, shape_key: str, call: dict[str, Any]) -> Any:
    """Tune one recorded key offline: import the kernel, rebuild the call, tune as on a miss.

    Returns the winning config as stored (a dict), or raises TunesvcError with the reason.
    """
    from tunesvc.device import current_device

    tuner = find_autotuner(name)
    state = _State(tuner, Settings(TUNE, store.url, None), name, {})
    if state.template.version != version:
        raise TunesvcError(
            f"{name} changed since the key was recorded (version {version}, now {state.template.version}); "
            "run the program again to record it anew."
        )
    device = current_device()
    args, kwargs, grids = rebuild_call(tuner, call, device, shape_key)
    pruned = [c for c in _pruned(tuner, args, kwargs) if config_hash(config_dict(c)) in grids]
    if not pruned:
        raise TunesvcError(f"No config of {name} has a recorded grid for {shape_key}.")
    winner = tune_key(tuner, state, store, device, shape_key, pruned, args, kwargs, grids=grids, call=call)
    rows = store.trials(store.kernel_version_id(state.template), store.device_id(device), shape_key)
    if not any(r.status == Status.OK.value for r in rows):  # every candidate failed: no winner, not tuned
        statuses = Counter(r.status for r in rows)
        said = next((r.message for r in rows if r.message), None)
        raise TunesvcError(
            f"Every candidate of {name} failed on {shape_key} ("
            + ", ".join(f"{n} {status}" for status, n in sorted(statuses.items()))
            + (f", the first saying {said}" if said else "")
            + "), so it has no winner."
        )
    STATS["tuned"] += 1
    return config_dict(winner)


def measure_stored(
    store: Store, name: str, shape_key: str, configs: list[dict[str, Any]], device: Device
) -> list[Measurement]:
    """Re-measure stored configs of a captured key on inputs rebuilt from the call its sweep
    recorded (`tune verify`); each config after the first is checked against the first's output
    (or a later one's, where the first wrote NaN or inf: see :class:`CaptureBench`)."""
    tuner = find_autotuner(name)
    call = store.captured_call(name, shape_key, device.hardware_id)
    if call is None:
        raise TunesvcError(f"No recorded call of {name} for {shape_key}; tune it again to re-measure it.")
    args, kwargs, grids = rebuild_call(tuner, call, device, shape_key)
    state = _State(tuner, Settings(LOOKUP, store.url, None), name, {})
    with _measuring():
        bench = CaptureBench(tuner, device, args, kwargs, grids=grids)
        listed = [state.listed(stored) for stored in configs]
        try:
            measured = iter(_measured(bench, [c for c in listed if c is not None]))
        finally:
            bench.restore()
    gone = Measurement(Status.INVALID, message="not in the kernel's config list any more")
    return [gone if config is None else next(measured) for config in listed]
