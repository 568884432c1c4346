"""Capture's settings and what is kept under them: :class:`Settings` (where captured kernels read and
write winners, and what a miss does), :class:`Shared` (what the kernels of one Settings share: the
winner source read once, one store connection; :func:`shared_for`) and :class:`State` (one
kernel's identity, settings and chosen configs).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any

from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from tunesvc import settings
from tunesvc._capture.identity import CapturedTemplate
from tunesvc._capture.identity import config_dict
from tunesvc._capture.identity import kernel_name
from tunesvc._capture.identity import kernel_version
from tunesvc.errors import TunesvcError
from tunesvc.serving.launch import DirectLaunch
from tunesvc.settings import LOOKUP
from tunesvc.settings import OFF
from tunesvc.settings import TUNE
from tunesvc.space import config_hash
from tunesvc.text import visible
from tunesvc.text import warn

if TYPE_CHECKING:
    from triton.runtime.autotuner import Autotuner

    from tunesvc.serving.runtime import Runtime
    from tunesvc.space import Config as ConfigDict
    from tunesvc.store import Store
    from tunesvc.template import Template


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


settings_lock = threading.Lock()
SHARED: dict[Settings, Shared] = {}

#: seconds a captured program's write waits for another process's write lock on a SQLite file
#: (a sweep's transactions last milliseconds; a lock held longer is a peer's long transaction, and
#: the launch has a program waiting on it); once one such wait fails, the process writes no more
LOCK_WAIT_S = 2.0


class Shared:
    """What the kernels of one Settings share: the bundle read once, one store connection."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._runtime: Runtime | None = None
        self._store: Store | None = None
        self.lock = threading.Lock()
        #: why this process writes no more to the database (another process held its write lock)
        self.locked_out: str | None = None

    def table(self, template: Template) -> dict[str, ConfigDict]:
        """The stored winners of ``template`` on this device (bundle, else database; {}: none)."""
        from tunesvc.serving.source import database_exists
        from tunesvc.store import DatabaseNotCreated

        runtime = self._runtime or self._open()
        if runtime is None:
            return {}
        if not self.settings.bundle and not database_exists(self.settings.db_path):
            return {}  # deleted since the runtime opened it: as no file (the store says so, and makes one)
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
        from tunesvc.serving.runtime import Runtime
        from tunesvc.serving.source import database_exists

        s = self.settings
        if not s.bundle and not database_exists(s.db_path):
            return None
        return Runtime(db=None if s.bundle else s.db_path, bundle=s.bundle, mode="lookup", strict=True)

    def answer(self, state: State, text: str, pruned: Callable[[], list[Any]], *, said: bool = True) -> tuple[Any, str]:
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
            from tunesvc.serving.source import database_exists
            from tunesvc.store import Store

            path = self.settings.db_path
            if not create and not (self.settings.db or database_exists(path)):
                return None
            self._store = Store(path, busy_timeout_s=LOCK_WAIT_S)
        return self._store

    def lock_out(self, exc: Exception) -> None:
        """Write no more to the database in this process (another process held its write lock
        past LOCK_WAIT_S): said in one warning line, the first time; the keys met from then on
        run with Triton's own autotuner (counted in the summary) and are tuned by a later run."""
        if self.locked_out is not None:
            return
        self.locked_out = str(exc)
        warn(
            visible(
                f"tunesvc: another process held the write lock of {self.settings.db_path} for over {LOCK_WAIT_S:g} s; "
                "this process writes no more to it: its keys not stored yet run with Triton's own autotuner "
                "and are tuned by a later run."
            ),
            RuntimeWarning,
        )


def _connections_left_to_the_parent() -> None:
    """In a forked child: drop the database connections inherited from the parent, without
    closing them (SQLAlchemy's ``dispose(close=False)``); the child opens its own on its next
    miss. A SQLite or PostgreSQL connection must not be used from two processes: the child's
    writes would interleave with the parent's on one file handle or socket."""
    for shared in list(SHARED.values()):
        if shared._store is not None:
            try:
                shared._store.engine.dispose(close=False)
            except Exception:  # a fork handler cannot warn the program: the child opens its own anyway
                pass
    SHARED.clear()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_connections_left_to_the_parent)


def shared_for(settings: Settings) -> Shared:
    with settings_lock:
        shared = SHARED.get(settings)
        if shared is None:
            shared = SHARED[settings] = Shared(settings)
        return shared


class State:
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
        #: every parameter and launch option the listed configs set (a call may not pass them)
        self.set_by_configs = frozenset(name for c in tuner.configs for name in c.all_kwargs())
        self.lock = threading.Lock()
        self._template: CapturedTemplate | None = None
        self._by_hash: dict[str, Any] | None = None
        self._configs = tuner.configs
        self._fn = tuner.fn
        #: the kernel's launcher on a hit (tunesvc.serving.launch); None where fn wraps the kernel
        #: (@triton.heuristics): then fn.run, as Triton's Autotuner calls it
        self.direct = DirectLaunch(tuner.fn) if isinstance(tuner.fn, (JITFunction, InterpretedFunction)) else None

    def __reduce__(self) -> tuple[Callable[[], None], tuple[()]]:
        """A copy of the kernel (copy.deepcopy, pickle) gets no state: it makes its own at its first
        launch, under the capture of that time (a lock cannot be copied)."""
        return _no_state, ()

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


def _no_state() -> None:
    return None
