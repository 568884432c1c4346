"""Run-time lookup: which config to launch a kernel with, here and now.

The winners of the current device (matched by hardware id: GPU model, capability, SM count)
and the current kernel version are loaded once per kernel from the runtime's winner source, a
database or an exported bundle (:mod:`tunesvc.serving.source`, which reads and checks them).
Each lookup then walks the one chain of :mod:`tunesvc.serving.chain` (exact, predicted, nearest,
transferred, heuristic) and says which step answered; what the runtime adds is when to read,
the memos, and failing open.

A key may hold a graph and an eager winner (see tunesvc.bench). A runtime serves those of its
``timing`` (``TUNESVC_TIMING``, default graph), else each key's only winner; set to eager, it
serves the graph winners to launches made inside CUDA-graph capture
(``torch.cuda.is_current_stream_capturing()``: that program replays a graph). In mode 'tune'
a miss goes to the policy that the tuning side registers (:mod:`tunesvc.serving.on_miss`): this
module imports no tuning.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import threading
import weakref
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any

from tunesvc import settings
from tunesvc._processes import remake_unheld
from tunesvc.command import named
from tunesvc.device import current_device
from tunesvc.device import device_at
from tunesvc.device import interpreting
from tunesvc.errors import TunesvcError
from tunesvc.serving import chain
from tunesvc.serving import on_miss
from tunesvc.serving import transfer as transfers
from tunesvc.serving.chain import EXACT as EXACT
from tunesvc.serving.chain import HEURISTIC as HEURISTIC
from tunesvc.serving.chain import NEAREST as NEAREST
from tunesvc.serving.chain import PREDICTED as PREDICTED
from tunesvc.serving.chain import TRANSFERRED as TRANSFERRED
from tunesvc.serving.chain import TUNED as TUNED
from tunesvc.serving.chain import LookupResult as LookupResult
from tunesvc.serving.source import BundleSource
from tunesvc.serving.source import DatabaseSource
from tunesvc.serving.source import Winners
from tunesvc.serving.source import WinnerSource
from tunesvc.serving.source import in_space
from tunesvc.serving.source import stored_winners as stored_winners  # tuning's tune-on-miss policy reads it here
from tunesvc.settings import GRAPH
from tunesvc.settings import MODES
from tunesvc.settings import TIMINGS
from tunesvc.template import ShapeKey
from tunesvc.template import Template
from tunesvc.template import get_template
from tunesvc.text import visible
from tunesvc.text import warn

if TYPE_CHECKING:
    from tunesvc.device import Device
    from tunesvc.serving.selector import Selector
    from tunesvc.space import Config


class Runtime:
    """Tuned configs for one process.

    Where winners come from: ``db`` or ``bundle`` (a JSON file from `tune export`); neither:
    $TUNESVC_BUNDLE, else $TUNESVC_DB, else ./tune.db if it exists, else heuristics only.

    ``mode`` (or $TUNESVC_MODE): ``lookup`` (tuned, else the fallback chain above),
    ``heuristic`` (never read winners), ``tune`` (a miss is tuned now with a ``budget``-trial
    sweep, stored in the database and used from then on; processes that miss the same key at
    once go through the one key claim (tunesvc.tuning.claim), so it is tuned once).

    A winner source that cannot be read (corrupt bundle, unreachable database) does not stop
    the program: the runtime warns once and uses heuristics, unless ``strict`` (the CLI) asks
    for the error.

    ``transfer`` (default: on unless $TUNESVC_TRANSFER=0): whether a key this GPU model has no
    answer of its own for is served a sibling model's winner (same capability and SM count).

    ``timing`` (or $TUNESVC_TIMING; default graph): whose winners are served, graph's or eager's,
    else each key's only one; an eager runtime serves the graph winners inside CUDA-graph capture.
    """

    def __init__(
        self,
        db: str | os.PathLike | None = None,
        bundle: str | os.PathLike | None = None,
        device: Device | None = None,
        *,
        mode: str | None = None,
        budget: int = 8,
        strategy: str = "grid",
        strict: bool = False,
        transfer: bool | None = None,
        timing: str | None = None,
    ) -> None:
        if timing is not None and timing not in TIMINGS:
            raise TunesvcError(f"Unknown timing '{timing}'; use one of {', '.join(TIMINGS)}.")
        if db is not None and bundle is not None:
            raise TunesvcError("Give a database or a bundle, not both.")
        if db is None and bundle is None:
            bundle = settings.bundle()
            db = settings.db()
        if mode is not None and settings.check_mode(mode) is not None:
            raise TunesvcError(f"Unknown runtime mode '{mode}'; use one of {', '.join(MODES)}.")
        if mode == "tune" and bundle is not None:
            raise TunesvcError("Mode 'tune' stores what it tunes in a database; give db, not a bundle.")
        if mode is None:
            mode = settings.mode("lookup")
            if mode == "tune" and bundle is not None:  # from the environment: a warning, never an error
                warn(
                    "tunesvc: TUNESVC_MODE=tune with a bundle alone has no database to store in; serving it "
                    "in mode lookup (set TUNESVC_DB to tune).",
                    RuntimeWarning,
                )
                mode = "lookup"
        if mode == "off":  # tunesvc steps aside: a shipped kernel has no autotuner but its heuristic
            mode = "heuristic"
        self.db = db
        self.bundle = bundle
        self.mode = mode
        self.budget = budget
        self.strategy = strategy
        self.strict = strict
        self.transfer = settings.transfer_enabled() if transfer is None else transfer
        self.timing = settings.timing() if timing is None else timing
        self._device = device
        self._source: WinnerSource | None = None
        self._tables: dict[str, dict[str, Config]] = {}
        self._keys: dict[str, list[tuple[ShapeKey, str]]] = {}
        self._selectors: dict[str, Selector | None] = {}
        #: the sibling model's winners per kernel (None: none), read on the kernel's first miss
        #: that reaches the transferred step, with their parsed keys
        self._siblings: dict[str, tuple[transfers.SiblingTable, list[tuple[ShapeKey, str]]] | None] = {}
        self._lock = threading.Lock()
        _RUNTIMES.add(self)
        self._warned: set[tuple[str, str]] = set()
        #: problems resolved per (kernel, source); a problem seen again is served from a memo
        #: and not counted again
        self.counters: Counter[tuple[str, str]] = Counter()
        # The memos, keyed by the CUDA device index (-1: no GPU, or the given device) besides the
        # problem: functools.cache makes the key of a call's arguments in C, so a hit costs
        # about half of a key tuple built in Python (benchmarks/runtime_overhead.py).
        self.lookup_on = functools.cache(self.lookup_on)  # type: ignore[method-assign]
        self.config_on = functools.cache(self.config_on)  # type: ignore[method-assign]
        #: configs by a key that a kernel builds from its raw arguments (its template, tensor
        #: shapes, dtypes and device index): a hit skips even the kernel's argument checks, which
        #: ran on the miss that stored it (see tunesvc.kernels.matmul)
        self.launch_configs: dict[tuple, Config] = {}
        #: runtimes of the other GPU models this process drives, by CUDA device index
        self._on_device: dict[int, Runtime] = {}
        self._device_index = _device_index_reader(device)
        #: an eager runtime's twin set to graph, for launches inside CUDA-graph capture
        self._graph_twin: Runtime | None = None
        if self.timing != GRAPH:
            self._serve_graph_inside_capture()
        if self._device_index is _no_gpu:  # one device: no frame of lookup() in front of the memo
            self.lookup = functools.partial(self.lookup_on, -1)  # type: ignore[method-assign]
            self.config_for = functools.partial(self.config_on, -1)  # type: ignore[method-assign]

    def _serve_graph_inside_capture(self) -> None:
        """Route this (eager) runtime's lookups and kernels' launch configs to a graph twin while
        the current stream is capturing a CUDA graph; outside capture, one check more per call."""
        eager_lookup, eager_config = self.lookup_on, self.config_on

        def lookup_on(index: int, kernel: str | Template, /, **problem: Any) -> LookupResult:
            if capturing():
                return self._graph().lookup_on(index, kernel, **problem)
            return eager_lookup(index, kernel, **problem)

        def config_on(index: int, template: Template, /, **problem: Any) -> Config:
            if capturing():
                return self._graph().config_on(index, template, **problem)
            return eager_config(index, template, **problem)

        self.lookup_on = lookup_on  # type: ignore[method-assign]
        self.config_on = config_on  # type: ignore[method-assign]
        self.launch_configs = ByCapture(self._graph)

    def _graph(self) -> Runtime:
        """The graph twin of an eager runtime: the same source and options, graph's winners."""
        if self._graph_twin is None:
            with self._lock:
                if self._graph_twin is None:
                    twin = Runtime(
                        self.db,
                        self.bundle,
                        self._device,
                        mode=self.mode,
                        budget=self.budget,
                        strategy=self.strategy,
                        strict=self.strict,
                        transfer=self.transfer,
                        timing=GRAPH,
                    )
                    twin._source = self._source
                    self._graph_twin = twin
        return self._graph_twin

    @property
    def device(self) -> Device:
        if self._device is None:
            self._device = current_device()
        return self._device

    def _table(self, template: Template) -> dict[str, Config]:
        table = self._tables.get(template.name)
        if table is None:
            with self._lock:
                table = self._tables.get(template.name)
                if table is None:
                    table = {} if self.mode == "heuristic" else self._load_or_warn(template)
                    self._tables[template.name] = table
        return table

    def tuned_keys(self, kernel: str | Template) -> list[str]:
        """The shape keys this runtime holds a winner for, of the kernel's current version on its device."""
        return list(self._table(kernel if isinstance(kernel, Template) else get_template(kernel)))

    def _parsed_keys(self, name: str) -> list[tuple[ShapeKey, str]]:
        """Tuned keys parsed for the nearest-key search, built on the first miss only."""
        keys = self._keys.get(name)
        if keys is None:
            with self._lock:
                keys = self._keys[name] = [(ShapeKey.parse(k), k) for k in self._tables[name]]
        return keys

    def _load_or_warn(self, template: Template) -> dict[str, Config]:
        try:
            return self._served(template, self.source.winners(template, self.timing))
        except TunesvcError as exc:
            if self.strict:
                raise
            self._warn_once(template.name, "load", f"tunesvc: {exc} Using heuristic configs for {template.name}.")
            return {}
        except Exception as exc:  # the runtime fails open: a source that cannot be read is no source
            if self.strict:
                raise
            self._warn_once(
                template.name,
                "load",
                f"tunesvc: could not read winners of {template.name} ({type(exc).__name__}: {exc}); "
                "using heuristic configs (check TUNESVC_DB / TUNESVC_BUNDLE).",
            )
            return {}

    @property
    def source(self) -> WinnerSource:
        """Where this runtime reads winners: its bundle, else its database (./tune.db where none
        was given), for its device; made on first use, as the device is read then."""
        if self._source is None:
            if self.bundle is not None:
                self._source = BundleSource(self.bundle, self.device)
            else:  # in mode 'tune' a database that is not there yet is created on the first miss
                self._source = DatabaseSource(self.db, self.device, absent_is_empty=self.mode == "tune")
        return self._source

    def _served(self, template: Template, winners: Winners) -> dict[str, Config]:
        """The winners the source gave in the kernel's space; those outside it fall back like
        untuned keys, with one warning per kernel that names the first (strict: an error)."""
        if winners.outside:
            key, why = winners.outside[0]
            message = (
                f"{self.source.location}: {len(winners.outside)} stored winner(s) of {template.name} lie outside "
                f"its space (first: {key[:200]}: {why})"
            )
            if self.strict:
                raise TunesvcError(f"{message}; re-tune them with `tune sweep` or re-export the bundle.")
            self._warn_once(template.name, "space", f"tunesvc: {message}. Using heuristic configs for those keys.")
        return winners.table

    def where(self) -> str:
        """Where winners are read from, as messages name it: a bundle's or SQLite file's absolute
        path (``./tune.db`` depends on the working folder), a server URL without its password, or
        why there is none."""
        if self.mode == "heuristic":
            return "no winners (mode 'heuristic')"
        return self.source.where()

    def _warn_once(self, kernel: str, what: str, message: str) -> None:
        if (kernel, what) not in self._warned:
            self._warned.add((kernel, what))
            # shown as text: a stored key, config or device name may hold escape sequences
            warn(visible(message), RuntimeWarning)

    def lookup(self, kernel: str | Template, /, **problem: Any) -> LookupResult:
        """The config for this problem on the current CUDA device and how it was found; a
        problem seen before is one dict hit.

        Memoised per runtime by the device and the call's arguments: a name and a Template
        object, or the same names in another order, are separate entries that resolve alike.
        """
        return self.lookup_on(self._device_index(), kernel, **problem)

    def lookup_on(self, index: int, kernel: str | Template, /, **problem: Any) -> LookupResult:
        """:meth:`lookup` for the CUDA device of this index (a tensor's ``get_device()``)."""
        return self.on_device(index)._resolve(kernel, problem)

    def on_device(self, index: int) -> Runtime:
        """The runtime answering for the CUDA device of this index: this one, or for another GPU
        model than this runtime's device, one with the same winner source for that model's winners."""
        if index < 0 or self._device_index is _no_gpu:
            return self
        runtime = self._on_device.get(index)
        if runtime is None:
            device = device_at(index)
            with self._lock:
                runtime = self._on_device.get(index)
                if runtime is None:
                    same = device.hardware_id == self.device.hardware_id
                    runtime = self._on_device[index] = self if same else self._sibling(device)
        return runtime

    def _sibling(self, device: Device) -> Runtime:
        runtime = Runtime(
            self.db,
            self.bundle,
            device,
            mode=self.mode,
            budget=self.budget,
            strategy=self.strategy,
            strict=self.strict,
            transfer=self.transfer,
            timing=self.timing,
        )
        runtime._source = self.source.on(device)  # a bundle read once serves every device
        return runtime

    def _resolve(self, kernel: str | Template, problem: dict[str, Any]) -> LookupResult:
        template = kernel if isinstance(kernel, Template) else get_template(kernel)
        normalized = template.problem(**problem)
        if self.mode == "tune" and (template.name, "tune") not in self._warned:
            text = str(template.key(normalized))
            if text not in self._table(template):
                try:
                    result = self._tune_on_miss(template, normalized, text)
                except Exception as exc:  # fails open: the lookup chain answers, and the kernel is not tuned again
                    if self.strict:
                        raise
                    self._warn_once(
                        template.name,
                        "tune",
                        f"tunesvc: tuning {template.name} for {text} failed ({type(exc).__name__}: {exc}); "
                        "using its lookup answers in this process.",
                    )
                    return self._resolve(template, problem)
                self.counters[(template.name, result.source)] += 1
                return result
        return self.answer(template, normalized)

    def answer(self, template: Template, problem: dict[str, Any], *, said: bool = True) -> LookupResult:
        """The one chain's answer for a normalised problem of ``template``, shipped or captured:
        its exact winner, else predicted, nearest, transferred, heuristic; never tuning, not
        memoised (:meth:`lookup` is), counted in :meth:`stats`. Where the answer is not exact it
        is said once per kernel (``said=False``: not said, as for a key that capture meets inside
        its own measuring, which the program tunes when it launches it)."""
        key = template.key(problem)
        text = str(key)
        result = chain.answer(
            template,
            problem,
            key,
            self.device,
            self._table(template),
            lambda: self._parsed_keys(template.name),
            lambda: self._selector(template),
            lambda: self._transfer_table(template),
        )
        if self.mode == "heuristic":
            result = dataclasses.replace(result, reason=chain.HEURISTIC_MODE)
        self.counters[(template.name, result.source)] += 1
        if said and result.source in (PREDICTED, NEAREST, TRANSFERRED, HEURISTIC) and self.mode != "heuristic":
            which = f"one, from {result.transferred_from}" if result.source == TRANSFERRED else "one"
            self._warn_once(
                template.name,
                result.source,
                named(
                    f"tunesvc: no tuned config of {template.name} for {text} on {self.device.name} ({self.where()}); "
                    f"using the {result.source} {which} ({template.tune_hint}). Warned once per kernel."
                ),
            )
        return result

    def _selector(self, template: Template) -> Selector | None:
        """The kernel's selector for this device, loaded on its first miss (None: none, or mode
        heuristic); one whose data is damaged or whose candidates lie outside the space is
        dropped with one warning (strict: an error)."""
        if template.name in self._selectors:
            return self._selectors[template.name]
        selector = None
        if self.mode != "heuristic":
            try:
                selector = self.source.selector(template)
            except TunesvcError as exc:
                if self.strict:
                    raise
                self._warn_once(template.name, "selector", f"tunesvc: {exc} Not using the selector of {template.name}.")
        with self._lock:
            self._selectors[template.name] = selector
        return selector

    def _transfer_table(self, template: Template) -> chain.Sibling | None:
        """A sibling GPU model's winners of ``template`` that fit its space, read on the kernel's
        first miss that reaches the transferred step; None when transfer is off (see
        tunesvc.serving.transfer)."""
        if not self.transfer or self.mode == "heuristic" or not self.device.is_gpu:
            return None
        if template.name in self._siblings:
            return self._siblings[template.name]
        try:
            found = self.source.sibling(template)
        except Exception as exc:  # fails open, as a winner source that cannot be read does
            if self.strict:
                raise
            self._warn_once(
                template.name,
                "transfer",
                f"tunesvc: could not read a sibling GPU model's winners of {template.name} "
                f"({type(exc).__name__}: {exc}); not transferring them.",
            )
            found = None
        table = None
        if found is not None:
            self._served(template, found)
            table = found.sibling()
        entry = None if table is None else (table, table.parsed())
        with self._lock:
            self._siblings[template.name] = entry
        return entry

    def _tune_on_miss(self, template: Template, problem: dict, text: str) -> LookupResult:
        """Hand this miss to mode 'tune''s policy (the tuning side's: it sweeps the key and stores
        it, one process per key), then serve the winner it stored."""
        miss = on_miss.MissedKey(self.source.location, template, problem, text, self.device, self.strategy, self.budget)
        table = self._served(template, in_space(template, on_miss.policy()(miss)))
        with self._lock:
            self._tables[template.name].update(table)
            self._keys.pop(template.name, None)
        if text in table:
            return LookupResult(template.name, table[text], TUNED, text, text, 0.0, reason=chain.TUNED_NOW)
        # no candidate ran correctly: never guess a tuned answer
        return LookupResult(
            template.name, template.heuristic(problem, self.device), HEURISTIC, text, reason=chain.NOTHING_RAN
        )

    def config_for(self, template: Template, /, **problem: Any) -> Config:
        """The config to launch with on the current CUDA device (memoised like :meth:`lookup`)."""
        return self.config_on(self._device_index(), template, **problem)

    def config_on(self, index: int, template: Template, /, **problem: Any) -> Config:
        """:meth:`config_for` for the CUDA device of this index (a tensor's ``get_device()``)."""
        return self.lookup_on(index, template, **problem).config

    def tuned(self, key: tuple, index: int, template: Template, /, **problem: Any) -> Config:
        """:meth:`config_on`, kept in :attr:`launch_configs` under a kernel's own key (its
        tensors' shapes, dtypes and device index): the kernel's next call is one dict get.

        A miss may sweep (mode 'tune'): that runs outside the recording of the op call that asked
        (tunesvc.serving.launch), whose dispatch mode would otherwise see, and slow, every op it times."""
        with outside_recording():
            config = self.launch_configs[key] = self.config_on(index, template, **problem)
        return config

    def stats(self) -> dict[str, dict[str, int]]:
        """Lookups per kernel and source: {'matmul': {'exact': 3, 'heuristic': 1}}, all devices."""
        counters = Counter(self.counters)
        for runtime in {id(r): r for r in self._on_device.values() if r is not self}.values():
            counters.update(runtime.counters)
        out: dict[str, dict[str, int]] = {}
        for (kernel, source), n in sorted(counters.items()):
            out.setdefault(kernel, {})[source] = n
        return out


def capturing() -> bool:
    """Whether the current CUDA stream is capturing a CUDA graph (False without a GPU)."""
    if interpreting():
        return False
    import torch

    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class ByCapture(dict):
    """An eager runtime's launch configs (``Runtime.launch_configs``): its own outside CUDA-graph
    capture, its graph twin's inside it, so that a kernel's memoised config follows the same rule
    as its lookup."""

    def __init__(self, graph: Callable[[], Runtime]) -> None:
        super().__init__()
        self._graph = graph

    def get(self, key: Any, default: Any = None) -> Any:
        if capturing():
            return self._graph().launch_configs.get(key, default)
        return super().get(key, default)

    def __setitem__(self, key: Any, value: Any) -> None:
        if capturing():
            self._graph().launch_configs[key] = value
        else:
            super().__setitem__(key, value)


#: every runtime of this process, for the fork handler below
_RUNTIMES: weakref.WeakSet[Runtime] = weakref.WeakSet()


def _locks_remade_in_the_child() -> None:
    """In a forked child: each runtime's lock made anew, unheld. One that a parent's thread held
    at the fork (loading a kernel's winners, reading its selector) would otherwise stay held in
    the child for ever, since that thread does not exist there: the child's first launch of a
    kernel it had not looked up yet would wait on it."""
    for runtime in list(_RUNTIMES):
        remake_unheld(runtime._lock)


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_locks_remade_in_the_child)


def _no_gpu() -> int:
    return -1


def _device_index_reader(device: Device | None) -> Callable[[], int]:
    """The current CUDA device's index, read on each lookup; -1 always where there is no GPU or
    the runtime was given its device."""
    if device is not None or interpreting():
        return _no_gpu
    import torch

    if not torch.cuda.is_available():
        return _no_gpu
    get = getattr(torch._C, "_cuda_getDevice", None)  # what torch.cuda.current_device calls, less its checks
    if get is None:
        return torch.cuda.current_device

    def index() -> int:
        torch.cuda.init()  # once: a no-op after the first call
        return get()

    return index if not torch.cuda.is_initialized() else get


_default: Runtime | None = None
#: what a config lookup that misses runs inside: tunesvc.serving.launch sets it to leave the recording of the
#: op call that asked (a tune-on-miss sweep is not part of the call)
outside_recording: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext

#: called by configure(), e.g. to drop configs that tunesvc.autotune kernels memoised from the old runtime
on_configure: list[Callable[[], None]] = []


def default_runtime() -> Runtime:
    global _default
    if _default is None:
        _default = Runtime()
    return _default


def configure(
    db: str | os.PathLike | None = None,
    bundle: str | os.PathLike | None = None,
    *,
    mode: str | None = None,
    budget: int = 8,
    timing: str | None = None,
) -> Runtime:
    """Point the process-wide runtime (used by tunesvc.kernels.*) at a database or bundle
    (``timing``: whose winners it serves, see :class:`Runtime`)."""
    global _default
    _default = Runtime(db=db, bundle=bundle, mode=mode, budget=budget, timing=timing)
    for hook in on_configure:
        hook()
    return _default


def lookup(kernel: str, **problem: Any) -> LookupResult:
    """The tuned config for ``kernel`` on this device and problem, and how it was found.

    >>> tunesvc.lookup("matmul", M=1000, N=3000, K=777, dtype="bfloat16").source
    'exact'
    """
    return default_runtime().lookup(kernel, **problem)
