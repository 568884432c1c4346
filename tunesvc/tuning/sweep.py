"""A sweep: for each problem, search the template's space on this device and store it all.

Per problem: shape key -> the trials already stored for (kernel version, device, key) are
replayed into the strategy (so a killed sweep resumes, and a repeated one costs nothing) ->
warm start (what the runtime launches for the key untuned: the selector's pick, else the
nearest tuned key's winner, else a sibling GPU model's winner, else the heuristic; then this key's
winners on sibling models (same capability and SM count), the heuristic, this key's winners under
earlier versions of the kernel on this device, the winners of the nearest tuned keys on this
device and of this key on other devices, the template's known-good configs)
-> ask/measure/store/tell until the trial budget, the time budget, the patience or the space
runs out -> the finalists (the fastest few, and the untuned answer) are re-measured
interleaved -> the fastest correct trial becomes the key's winner -> the template's torch peer,
if it has one, is timed once on the same inputs (sweeps.peer_ms). Measuring the untuned answer
first, and against the finalists, keeps a sweep from storing a winner slower than what the
runtime launched before it (up to the finalists' timing noise).

``timing``: graph (the default: CUDA graph replays, see tunesvc.bench) or eager (loops of
ordinary launches). An eager sweep's trials and winner are the key's eager ones; it measures the
key's graph winner first, eagerly, keeps it among the finalists, and stores an eager winner only
where its choice is at least as fast as that (tunesvc.tuning.key.beats_baseline). Selectors are
refitted after graph sweeps only.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from dataclasses import field
from typing import TYPE_CHECKING
from typing import TypeVar

from tunesvc import settings
from tunesvc.bench import CALLER
from tunesvc.bench import Compiler
from tunesvc.bench import Measurement
from tunesvc.bench import Measurer
from tunesvc.bench import Status
from tunesvc.bench import Worker
from tunesvc.bench import measurer_for
from tunesvc.bench import picklable
from tunesvc.bench import pool_size
from tunesvc.device import Device
from tunesvc.device import fork_safe_current_device
from tunesvc.errors import TunesvcError
from tunesvc.search import OPTUNA_STRATEGIES
from tunesvc.search import STRATEGIES
from tunesvc.search import Strategy
from tunesvc.search import make_strategy
from tunesvc.serving import transfer as transfers
from tunesvc.settings import EAGER
from tunesvc.settings import GRAPH
from tunesvc.settings import TIMINGS
from tunesvc.space import config_hash
from tunesvc.template import ShapeKey
from tunesvc.template import Template
from tunesvc.timeline import mark
from tunesvc.tuning.key import Finalists
from tunesvc.tuning.key import KeyTuning
from tunesvc.tuning.key import default_finalists
from tunesvc.tuning.key import measurement_of
from tunesvc.tuning.selector_fit import untuned_answer

if TYPE_CHECKING:
    from tunesvc.space import Config
    from tunesvc.store import Store
    from tunesvc.template import Problem

T = TypeVar("T")

DEFAULT_OPTUNA_BUDGET = 50
#: winners of this many nearest tuned shape keys (same kernel version and device) start a search
NEIGHBOURS = 3
#: what ProblemResult.phases names, in the order a sweep meets them: the parent's waits, so that
#: work overlapped in other processes (the compile pool and the measuring process starting,
#: candidates compiling while earlier ones are timed) counts only where it holds the sweep up
PHASES = (
    "start",  # reading the device (the first problem only), starting the compile pool's workers
    "set-up",  # stored trials, warm start, strategy
    "search",  # asking and telling the strategy, progress callbacks
    "measurer start",  # making the inputs and the reference, in this process or the measuring one
    "waiting for compiles",
    "checking and timing",
    "trial writes",
    "finalists",
    "torch peer",
    "measurer stop",  # the measuring process exiting
    "winner",  # choosing and storing it
)


class Clock:
    """Splits a wall time into phases (see :data:`PHASES`), so that they add up to it.

    ``with clock.phase(name):`` counts the time inside to ``name``; phases nest, the inner one
    taking its time from the outer. Time outside every phase goes to ``outside``.
    """

    def __init__(self, outside: str = "set-up") -> None:
        self.start = self._last = time.perf_counter()
        self.phases: dict[str, float] = {}
        self._open = [outside]

    def elapsed(self) -> float:
        """Seconds since the clock started."""
        return time.perf_counter() - self.start

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._lap()
        self._open.append(name)
        try:
            yield
        finally:
            self._lap()
            self._open.pop()

    def each(self, items: Iterable[T], name: str) -> Iterator[T]:
        """``items``, the time spent waiting for each one counted to ``name``."""
        iterator = iter(items)
        while True:
            with self.phase(name):
                try:
                    item = next(iterator)
                except StopIteration:
                    return
            yield item

    def _lap(self) -> None:
        now = time.perf_counter()
        phase = self._open[-1]
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self._last
        self._last = now


class StopRule(abc.ABC):
    """Ends a problem's search: asked before each batch of candidates whether the search is done,
    told each new measurement after it. ``reason`` is what :attr:`ProblemResult.stopped` says."""

    reason: str

    @abc.abstractmethod
    def done(self) -> bool:
        """Whether the search stops before its next batch."""

    def tell(self, measurement: Measurement, stored: bool = True) -> None:  # noqa: B027  (most rules only count)
        """A new trial's measurement; ``stored``: False where the store kept another writer's
        trial of the config, or refused it over the key's budget."""


class TrialBudget(StopRule):
    """At most ``limit`` trials of the key, stored ones included."""

    reason = "budget"

    def __init__(self, limit: int, search: Strategy) -> None:
        self.limit = limit
        self.search = search

    def done(self) -> bool:
        return len(self.search.told) >= self.limit

    def room(self, asked: int) -> bool:
        """Whether a batch of ``asked`` candidates may take one more."""
        return len(self.search.told) + asked < self.limit


class SharedBudget(StopRule):
    """The budget counted over every writer of the key (sweeps of it beside this one): once the
    store refuses a trial, stop if its trials of the key reach ``limit``."""

    reason = "budget"

    def __init__(self, limit: int, count: Callable[[], int]) -> None:
        self.limit = limit
        self.count = count
        self.refused = False

    def done(self) -> bool:
        refused, self.refused = self.refused, False
        return refused and self.count() >= self.limit

    def tell(self, measurement: Measurement, stored: bool = True) -> None:
        self.refused = self.refused or not stored


class TimeBudget(StopRule):
    """At most ``seconds`` since the problem's sweep started (the compile pool's start included
    for the first problem), but never before the key has one measurement: a sweep whose start
    took longer than its budget (a cold cache, a loaded host) still measures one candidate, the
    first it proposes (the heuristic or a warm start), rather than ending with no winner.
    ``measured``: the key has stored trials already (a resumed sweep stops at once)."""

    reason = "time"

    def __init__(self, seconds: float, clock: Clock, measured: bool = False) -> None:
        self.seconds = seconds
        self.clock = clock
        self.measured = measured

    def done(self) -> bool:
        return self.measured and self.clock.elapsed() >= self.seconds

    def tell(self, measurement: Measurement, stored: bool = True) -> None:
        self.measured = True


class Patience(StopRule):
    """Stop once ``trials`` new trials in a row have not improved the best time by ``min_improvement``
    (a fraction)."""

    reason = "patience"

    def __init__(self, trials: int, min_improvement: float, best_ms: float | None) -> None:
        self.trials = trials
        self.min_improvement = min_improvement
        self.best_ms = best_ms
        self.since_improved = 0

    def done(self) -> bool:
        return self.since_improved >= self.trials

    def tell(self, measurement: Measurement, stored: bool = True) -> None:
        ms = measurement.time_ms if measurement.ok else None
        if ms is not None and (self.best_ms is None or ms < self.best_ms * (1 - self.min_improvement)):
            self.since_improved = 0
        else:
            self.since_improved += 1
        if ms is not None and (self.best_ms is None or ms < self.best_ms):
            self.best_ms = ms


@dataclass
class TrialEvent:
    """What a progress display needs after each trial."""

    problem: Problem
    shape_key: str
    index: int  # trials of this key so far, stored ones included
    budget: int
    config: Config
    measurement: Measurement
    best_ms: float | None


@dataclass
class ProblemResult:
    problem: Problem
    shape_key: str
    winner: Config | None
    winner_ms: float | None
    heuristic: Config
    heuristic_ms: float | None
    trials_new: int
    trials_stored: int
    failures: int
    wall_seconds: float
    #: where wall_seconds went, in seconds per phase (see :data:`PHASES`); they add up to it
    phases: dict[str, float] = field(default_factory=dict)
    #: why the search ended: budget, time, patience or exhausted (every feasible config told)
    stopped: str = "budget"
    #: the template's torch peer (``Template.peer``) on the same inputs; None: none, or it failed
    peer_ms: float | None = None
    #: the timing it was tuned under (graph | eager)
    timing: str = GRAPH
    #: an eager sweep whose choice was slower than the key's graph winner timed eagerly: no eager
    #: winner stored (``winner`` is the eager one stored before, if any; the graph winner serves)
    graph_kept: bool = False


def run_sweep(
    template: Template,
    problems: list[Problem],
    store: Store,
    *,
    strategy: str = "grid",
    budget: int | None = None,
    seed: int = 0,
    device: Device | None = None,
    on_start: Callable[[Problem, str, int], None] | None = None,
    on_trial: Callable[[TrialEvent], None] | None = None,
    on_phase: Callable[[str, str], None] | None = None,
    workers: int | None = None,
    candidates: list[Config] | None = None,
    time_budget: float | None = None,
    patience: int | None = None,
    min_improvement: float = 0.01,
    finalists: int | None = None,
    finalist_window: float | None = None,
    isolate: bool | None = None,
    measure_timeout: float = 60.0,
    rep_ms: float = settings.REP_MS,
    compiler: Compiler | None = None,
    measurer: Worker | None = None,
    refit_selector: bool = True,
    label: str | None = None,
    notes: Mapping[str, str] | None = None,
    time_peer: bool = True,
    timing: str = GRAPH,
) -> list[ProblemResult]:
    """Tune ``template`` on every problem; returns one result per problem, in order.

    ``workers`` processes compile each batch of candidates in parallel while it is measured,
    each candidate as soon as it is compiled (default on a GPU: one per core, up to 16 for grid
    and random search, 8 for the Optuna strategies, which sample a batch before learning from
    it; never more than the candidates or the budget; none in the interpreter, which has
    nothing to compile).
    ``candidates`` replaces the space's enumeration with an explicit list (constraints still
    apply), e.g. to compare with another tuner on the same configs.

    Per problem, the search stops at ``budget`` trials, after ``time_budget`` seconds, or once
    ``patience`` trials in a row have not improved the best time by ``min_improvement`` (a
    fraction). The ``finalists`` fastest configs (default 3 on a GPU, none in the interpreter;
    with ``finalist_window``, only those whose first time is within that fraction of the
    fastest's), and what the runtime launched for the key before, are then re-measured
    interleaved, ``FINALIST_ROUNDS`` times over longer graph replays, and keep the median, with
    any trial whose first time beats the fastest of them (the one rule of
    :class:`tunesvc.tuning.key.Finalists`), so a config that won by noise is not stored as the winner.
    With ``isolate`` (default: on a GPU) every candidate is measured in a
    :class:`~tunesvc.bench.Worker` process, and one that crashes it or runs past
    ``measure_timeout`` seconds is stored as ``crash`` or ``timeout``.
    Optuna strategies keep their study in the store's database (see ``study_storage``).
    ``compiler``: a compile pool the caller keeps across sweeps (see :func:`compile_pool`), used
    instead of starting one and left open; ``measurer`` likewise, a measuring process (see
    :func:`measuring_process`) into which each problem loads its inputs in turn (with ``isolate``).
    ``refit_selector``: once a winner is stored, refit the kernel's selector on this device from
    the store (see :mod:`tunesvc.tuning.selector_fit`).
    ``label``: what the sweep rows name as their strategy instead of ``strategy`` (``adopt``);
    ``notes``: a line per config hash that its new trial's message ends with (where the config
    came from: :mod:`tunesvc.adopt`). ``time_peer``: time the template's torch peer beside the
    winner (its ``peer_ms``); off where nothing reads it. ``timing``: graph or eager (see the
    module docstring).
    """
    check_sweep_arguments(strategy, budget, time_budget, patience, timing)
    clock = Clock()
    with clock.phase("start"):
        device = device or fork_safe_current_device()  # this process then forks its workers
        mark("device read")
        fits = (
            None
            if candidates is None
            else max((len(_fitting(template, p, device, candidates)) for p in problems), default=0)
        )
        workers = _pool_size(workers, device, strategy, budget, fits)
        own = compiler is None
        if own:
            compiler = _start_pool(workers, template, problems)
    options = _Options(
        strategy=strategy,
        budget=budget,
        seed=seed,
        time_budget=time_budget,
        patience=patience,
        min_improvement=min_improvement,
        finalists=default_finalists(device, finalists, finalist_window, rep_ms),
        isolate=device.is_gpu if isolate is None else isolate,
        measure_timeout=measure_timeout,
        rep_ms=rep_ms,
        label=label or strategy,
        notes=dict(notes or {}),
        time_peer=time_peer,
        timing=timing,
    )
    run = _Run(
        template, store, device, options, compiler, candidates, on_start, on_trial, on_phase or _no_phase, measurer
    )
    try:
        results = [
            _ProblemSweep(run, problem, clock if i == 0 else Clock()).execute() for i, problem in enumerate(problems)
        ]
    finally:
        if own and compiler is not None:
            compiler.close()
    if refit_selector and timing == GRAPH and any(r.winner is not None for r in results):
        from tunesvc.tuning.selector_fit import refit_after_sweep

        refit_after_sweep(store, template, device)
    return results


def _no_phase(key: str, what: str) -> None:
    pass


def compile_pool(
    template: Template,
    problem: Problem,
    *,
    strategy: str = "grid",
    budget: int | None = None,
    workers: int | None = None,
    device: Device | None = None,
    cores: int | None = None,
) -> Compiler | None:
    """The compile pool :func:`run_sweep` would start for such a sweep, for a caller that runs
    many sweeps of one kind and passes it to each (``tune sweep --gpus`` workers, one job after
    another): its processes, their CUDA contexts (made one after another by the driver, seconds
    for sixteen) and their imports are then paid once, not per sweep. None where the sweep would
    compile in its own process. Its workers start after the first sweep's first trial is stored
    (see :func:`_start_pool`). The caller closes it. ``cores``: the CPU cores that the pool's
    default size may use (default: all of them; a share of them where several workers share a host)."""
    device = device or fork_safe_current_device()
    return _start_pool(_pool_size(workers, device, strategy, budget, None, cores), template, [problem])


def measuring_process(
    template: Template,
    problem: Problem,
    *,
    device: Device | None = None,
    isolate: bool | None = None,
    measure_timeout: float = 60.0,
    rep_ms: float = settings.REP_MS,
) -> Worker | None:
    """The measuring process :func:`run_sweep` would start for ``problem``, started now (its child
    makes the inputs and reference while the caller goes on), for a caller that passes it to
    sweep after sweep: each loads its problem into the same process, whose CUDA context, cuBLAS
    handles and loaded kernels are then made once. None where sweeps measure in their own
    process (``isolate`` off: the default in the interpreter). The caller closes it."""
    device = device or fork_safe_current_device()
    if (device.is_gpu if isolate is None else isolate) and picklable(template, problem):
        return Worker(template, problem, device, timeout_s=measure_timeout, rep_ms=rep_ms)
    return None


def _start_pool(size: int, template: Template, problems: list[Problem]) -> Compiler | None:
    """A pool of ``size`` compile workers, to be warmed up on the first problem; None where a
    sweep compiles in its own process (one worker or none, or a template the workers cannot
    unpickle). Its workers start once the sweep has stored its first trial
    (:meth:`_ProblemSweep._measure_and_store`)."""
    if size > 1 and problems and picklable(template, problems):
        return Compiler(size, template=template, problem=problems[0], start=False)
    return None


def _pool_size(
    workers: int | None,
    device: Device,
    strategy: str,
    budget: int | None,
    fitting: int | None,
    cores: int | None = None,
) -> int:
    """A sweep's compile workers (:func:`tunesvc.bench.pool_size`): a grid or random batch holds
    many candidates, so up to 16, else 8; never more than the budget, nor than ``fitting``, how
    many of an explicit candidate list fit the device for the problem where most do (an idle
    worker would still start, make its CUDA context and inputs)."""
    bounds = [most for most in (budget, fitting) if most is not None]
    cap = 16 if strategy in ("grid", "random") else 8
    return pool_size(device, min(bounds) if bounds else None, workers=workers, cores=cores, cap=cap)


@dataclass(frozen=True)
class _Options:
    strategy: str
    budget: int | None
    seed: int
    time_budget: float | None
    patience: int | None
    min_improvement: float
    finalists: Finalists
    isolate: bool
    measure_timeout: float
    rep_ms: float
    label: str
    notes: dict[str, str]
    time_peer: bool
    timing: str = GRAPH


@dataclass(frozen=True)
class _Run:
    """What every problem of one :func:`run_sweep` call shares."""

    template: Template
    store: Store
    device: Device
    options: _Options
    compiler: Compiler | None
    explicit: list[Config] | None  # candidates given instead of the space's enumeration
    on_start: Callable[[Problem, str, int], None] | None
    on_trial: Callable[[TrialEvent], None] | None
    on_phase: Callable[[str, str], None]
    kept: Worker | None = None  # a measuring process the caller keeps across run_sweep calls


def study_name(template: Template, device: Device, shape_key: str, strategy: str, timing: str = GRAPH) -> str:
    """The Optuna study of one (kernel, kernel version, device, shape key) and strategy, named to
    read in optuna-dashboard's list: kernel, GPU, shape key, strategy, then what keeps it apart
    from the same sweep of another kernel version or software stack on that GPU model.

    Studies named ``tunesvc:KERNEL:VERSION:FINGERPRINT:KEY:STRATEGY`` (before this name) stay in
    the database, unread and unchanged; the next sweep of their key starts a study under this
    name and teaches it the stored trials first, as it does for any new study. An eager sweep's
    study is another, its name ending in ``| eager``.
    """
    name = (
        f"{template.name} | {device.name} | {shape_key} | {strategy}"
        f" | version {template.version}, device {device.fingerprint[:8]}"
    )
    return name if timing == GRAPH else f"{name} | {timing}"


def study_storage(store: Store) -> str | None:
    """Where Optuna keeps the studies of sweeps into ``store``: the store's own database.

    Optuna's tables sit beside tunesvc's (tunesvc_*, revision 0005), so ``optuna.load_study``
    and optuna-dashboard read the studies at the --db URL. None (an in-memory study; resume
    still replays the stored trials) for an in-memory SQLite database, which Optuna's own
    connection would not see. A ``NAME.optuna.db`` file beside the database, where tunesvc
    before revision 0005 kept the studies, is no longer read.
    """
    if store.is_sqlite and store.path in (None, "", ":memory:"):
        return None
    return store.url


class _ProblemSweep:
    """One problem's sweep: set up from what is stored, searched batch by batch until a stop rule
    or the space says so, its finalists re-timed, its torch peer timed, its winner stored."""

    def __init__(self, run: _Run, problem: Problem, clock: Clock) -> None:
        self.run, self.problem, self.clock = run, problem, clock
        template, store, device, options = run.template, run.store, run.device, run.options
        same = run.kept is not None and run.kept.timing == options.timing
        self.kept = run.kept if same and options.isolate and picklable(template, problem) else None
        if self.kept is not None:
            self.kept.load(template, problem)  # its child makes this problem's inputs during the set-up
        with clock.phase("set-up"):
            self.kv_id = store.kernel_version_id(template)
            self.device_id = store.device_id(device)
            self.key = str(template.key(problem))
            candidates = self._candidates()
            self.heuristic = template.heuristic(problem, device)
            _, self.untuned = untuned_answer(store, template, problem, device)
            self.baseline = graph_winner(store, template, device, self.key) if options.timing == EAGER else None
            grid_all = options.budget is None and options.strategy == "grid"
            limit = len(candidates) if grid_all else options.budget or DEFAULT_OPTUNA_BUDGET
            self.search = self._strategy(candidates)
            self.tuning = KeyTuning(
                store,
                self.kv_id,
                self.device_id,
                self.key,
                problem=problem,
                strategy=options.label,
                budget=options.budget,
                seed=options.seed,
                served=self.untuned,
                heuristic=self.heuristic,
                finalists=options.finalists,
                timing=options.timing,
                baseline=self.baseline,
            )
            stored = self.tuning.trials()
            self.measured = {row.config_hash: measurement_of(row) for row in stored}
            for row in stored:
                self.search.tell(dict(row.config), self.measured[row.config_hash])
            self.best_ms = min((r.time_ms for r in stored if r.status == "ok" and r.time_ms is not None), default=None)
            self.budget = TrialBudget(min(limit, len(candidates)), self.search)
            self.rules = self._stop_rules()
            self.measurer: Measurer | None = None
            #: configs (hashes) measured while the pool's workers started, beside their CUDA
            #: contexts, inputs and first launches on the same GPU: re-timed with the finalists
            self.spared: set[str] = set()
            if run.on_start:
                run.on_start(problem, self.key, self.budget.limit)
            self.tuning.open()

    def _candidates(self) -> list[Config]:
        template, device = self.run.template, self.run.device
        if self.run.explicit is None:
            candidates = template.feasible(self.problem, device)
        else:
            candidates = _fitting(template, self.problem, device, self.run.explicit)
        if not candidates:
            raise TunesvcError(
                f"No config of {template.name}'s space fits {self.key} on {device.name}; widen search_spaces/{template.name}.toml."
            )
        return candidates

    def _strategy(self, candidates: list[Config]) -> Strategy:
        run, template, device = self.run, self.run.template, self.run.device
        warm = template.warm_start(self.problem, device)
        siblings = sibling_warm_start(run.store, template, device, self.key)
        stored = stored_warm_start(run.store, template, device, self.key)
        first = [self.baseline] if self.baseline is not None else []  # an eager sweep's graph winner
        initial = _unique([*first, self.untuned, *siblings, *warm[:1], *stored, *warm[1:]])
        storage = study_storage(run.store) if run.options.strategy in OPTUNA_STRATEGIES else None
        name = study_name(template, device, self.key, run.options.strategy, run.options.timing)
        return make_strategy(
            run.options.strategy,
            template.space,
            candidates,
            seed=run.options.seed,
            initial=initial,
            storage=storage,
            study_name=name if storage else None,
        )

    def _stop_rules(self) -> list[StopRule]:
        """The budget in trials first (this sweep's, then every writer's), then the time budget
        and the patience, if given."""
        options, store = self.run.options, self.run.store
        rules: list[StopRule] = [self.budget]
        if options.budget is not None:
            count = lambda: store.trial_count(self.kv_id, self.device_id, self.key, options.timing)
            rules.append(SharedBudget(self.budget.limit, count))
        if options.time_budget is not None:
            rules.append(TimeBudget(options.time_budget, self.clock, measured=bool(self.measured)))
        if options.patience is not None:
            rules.append(Patience(options.patience, options.min_improvement, self.best_ms))
        return rules

    def execute(self) -> ProblemResult:
        try:
            with self.clock.phase("search"):
                stopped = self._search()
            self._finalists()
            peer_ms = self._peer()
        finally:
            if self.measurer is not None and self.measurer is not self.kept:
                with self.clock.phase("measurer stop"):
                    self.measurer.close()
        return self._result(stopped, peer_ms)

    def _search(self) -> str:
        """Ask, measure, store and tell, batch after batch; returns why the search stopped."""
        while (rule := next((r for r in self.rules if r.done()), None)) is None:
            batch = self._next_batch()
            if not batch:
                return "exhausted"
            self._measure_and_store(batch)
        return "exhausted" if rule.reason == "budget" and self.search.exhausted else rule.reason

    def _next_batch(self) -> list[tuple[Config, str]]:
        """As many new candidates as compile in parallel and the budget allows; a stored config
        that the strategy proposes again is told its stored measurement instead."""
        size = self.run.compiler.workers if self.run.compiler else 1
        batch: list[tuple[Config, str]] = []
        while len(batch) < size and self.budget.room(len(batch)):
            config = self.search.ask()
            if config is None:
                break
            h = config_hash(config)
            if h in self.measured:
                self.search.tell(config, self.measured[h])
            else:
                batch.append((config, h))
        return batch

    def _measure_and_store(self, batch: list[tuple[Config, str]]) -> None:
        """Measure the batch and store its trials in one transaction. A pool's first batch: its
        first candidate is compiled by the measuring process itself (from Triton's cache on a
        warm host), measured and stored on its own before the pool's workers start, so that the
        first trial waits neither for their start (imports, a CUDA context each, the problem's
        inputs, all on the host's cores) nor for the rest of the batch; the rest then compile in
        the pool as usual. The strategy asked for the whole batch first, and is told in the same
        order: the configs measured are those of a batch stored at once."""
        compiler = self.run.compiler
        if compiler is None or compiler.started:
            self._store_and_tell(self._measure(batch, pool=compiler is not None))
            return
        self._store_and_tell(self._measure(batch[:1], pool=False))
        if len(batch) > 1:
            with self.clock.phase("start"):
                compiler.start()
            # while the new workers start, the measuring process compiles what is left itself
            self._store_and_tell(self._measure(batch[1:], pool=True, spare=True))

    def _measure(
        self, batch: list[tuple[Config, str]], pool: bool, spare: bool = False
    ) -> list[tuple[Config, str, Measurement]]:
        """Each candidate checked and timed as soon as it has compiled (in the pool with
        ``pool``, else by the measuring process itself; with ``spare`` too, whenever the pool
        has none ready: :meth:`Compiler.compile_each`)."""
        with self.clock.phase("measurer start"):
            measurer = self._measurer()
            mark("measurer started")
            compiled = self._compiled([config for config, _ in batch], pool, spare)
        results: list[tuple[Config, str, Measurement]] = []
        # to its end: the end replaces a broken pool
        for i, by_caller in self.clock.each(compiled, "waiting for compiles"):
            mark("first compile done")
            with self.clock.phase("measurer start"):
                measurer.wait_ready()
            mark("measurer ready")
            if not results:
                self.run.on_phase(self.key, "checking and timing")
            config, h = batch[i]
            if by_caller:
                self.spared.add(h)
            with self.clock.phase("checking and timing"):
                results.append((config, h, measurer.measure(config)))
            mark("first trial measured")
        return results

    def _compiled(self, configs: list[Config], pool: bool, spare: bool = False) -> Iterator[tuple[int, bool]]:
        """The indices of ``configs`` in the order they finish compiling, each with whether the
        pool left it to the measuring process while its workers started: in the pool with
        ``pool``, else in order (the measuring process compiles each at its first launch)."""
        compiler = self.run.compiler
        if compiler is None or not pool:
            return ((i, False) for i in range(len(configs)))
        self.run.on_phase(self.key, f"compiling {len(configs)} candidates")
        outcomes = compiler.compile_each(self.run.template, self.problem, configs, spare=spare)
        return ((i, outcome == CALLER) for i, outcome in outcomes)

    def _store_and_tell(self, results: list[tuple[Config, str, Measurement]]) -> None:
        # one transaction per batch: many workers on one database commit once per batch, not
        # per trial (benchmarks/write_throughput.py); a kill loses at most the batch in flight.
        # With a --budget, the store counts every writer's trials of this key against it.
        shared = self.budget.limit if self.run.options.budget is not None else None
        notes = self.run.options.notes
        if notes:
            results = [(c, h, m.noted(notes.get(h))) for c, h, m in results]
        with self.clock.phase("trial writes"):
            ids = self.tuning.record(results, budget=shared)
        mark("first trials stored", trials=len(ids))
        for (config, h, m), trial_id in zip(results, ids):
            if trial_id is not None:
                self.measured[h] = m
            self.search.tell(config, m)
            for rule in self.rules:
                rule.tell(m, stored=trial_id is not None)
            if m.ok and m.time_ms is not None and (self.best_ms is None or m.time_ms < self.best_ms):
                self.best_ms = m.time_ms
            if self.run.on_trial:
                event = TrialEvent(
                    self.problem, self.key, len(self.search.told), self.budget.limit, config, m, self.best_ms
                )
                self.run.on_trial(event)

    def _measurer(self) -> Measurer:
        if self.measurer is None:
            self.measurer = self.kept or _measurer(self.run.template, self.problem, self.run.device, self.run.options)
        return self.measurer

    def _finalists(self) -> None:
        """Re-time the finalists, with the untuned answer, where this sweep measured anything new
        (stored trials were re-timed by the sweep that stored them)."""
        if not self.tuning.new:
            return
        with self.clock.phase("finalists"):
            chosen = self.tuning.chosen(keep=self.spared)
        if len(chosen) < 2:
            return
        self.run.on_phase(self.key, f"re-timing {len(chosen)} finalists")
        with self.clock.phase("measurer start"):
            measurer = self._measurer()
        with self.clock.phase("finalists"):
            self.tuning.retime(measurer, keep=self.spared)

    def _peer(self) -> float | None:
        # a sweep that measured nothing makes no inputs for the peer
        if self.measurer is None or not self.run.options.time_peer or not has_peer(self.run.template):
            return None
        self.run.on_phase(self.key, "timing the torch peer")
        with self.clock.phase("torch peer"):
            return _time_peer(self.measurer)

    def _result(self, stopped: str, peer_ms: float | None) -> ProblemResult:
        with self.clock.phase("winner"):
            outcome = self.tuning.finish(self.clock.elapsed(), peer_ms=peer_ms)
            winner = outcome.winner
            rows = self.tuning.trials()
            heuristic = next((r for r in rows if r.config_hash == config_hash(self.heuristic)), None)
        self.run.on_phase(self.key, "done")
        mark(f"swept {self.key}", phases={k: round(v, 4) for k, v in self.clock.phases.items()})
        return ProblemResult(
            problem=self.problem,
            shape_key=self.key,
            winner=dict(winner.config) if winner else None,
            winner_ms=winner.time_ms if winner else None,
            heuristic=self.heuristic,
            heuristic_ms=heuristic.time_ms if heuristic and heuristic.status == "ok" else None,
            trials_new=self.tuning.new,
            trials_stored=len(rows),
            failures=sum(r.status != Status.OK.value for r in rows),
            wall_seconds=sum(self.clock.phases.values()),
            phases=self.clock.phases,
            stopped=stopped,
            peer_ms=peer_ms,
            timing=self.run.options.timing,
            graph_kept=outcome.baseline_kept,
        )


def graph_winner(store: Store, template: Template, device: Device, shape_key: str) -> Config | None:
    """The graph winner of ``shape_key`` (the kernel's current version, ``device``'s model; the
    newest where several software stacks tuned it), which an eager sweep of the key measures
    first and must not be slower than; None where the key has none."""
    entries = store.winners(kernel=template.name, hardware_id=device.hardware_id, version=template.version)
    found = [e for e in entries if e.shape_key == shape_key]
    if not found:
        return None
    checked = template.space.stored_config(max(found, key=lambda e: e.updated_at).config)
    return None if isinstance(checked, str) else dict(checked)


def _fitting(template: Template, problem: Problem, device: Device, configs: list[Config]) -> list[Config]:
    """Those of ``configs`` that break no constraint of the space on this problem and device."""
    return [c for c in configs if not template.violations(c, problem, device)]


def _measurer(template: Template, problem: Problem, device: Device, options: _Options) -> Measurer:
    return measurer_for(
        template,
        problem,
        device,
        isolate=options.isolate,
        timeout_s=options.measure_timeout,
        rep_ms=options.rep_ms,
        timing=options.timing,
    )


def has_peer(template: Template) -> bool:
    """Whether the template defines ``peer`` (the base class's returns None)."""
    return type(template).peer is not Template.peer


def _time_peer(measurer: Measurer) -> float | None:
    """The peer's median ms, timed once per sweep on the candidates' inputs; None if it failed."""
    try:
        m = measurer.time_peer()
    except Exception:  # even a measuring process that will not start: the peer is never worth a sweep
        return None
    return m.time_ms if m.ok else None


def stored_warm_start(store: Store, template: Template, device: Device, shape_key: str) -> list[Config]:
    """Winners worth measuring first for ``shape_key``: this key's under earlier versions of the
    kernel on this device (newest first: after an edit, the old winner is the likeliest new one),
    those of the ``NEIGHBOURS`` nearest tuned keys of this kernel version on this device, then
    this key's on other devices."""
    stored = store.winners(kernel=template.name)  # every version's: one read for both lists below
    winners = [w for w in stored if w.kernel_version == template.version]
    earlier = sorted(
        (
            w
            for w in stored
            if w.kernel_version != template.version and w.hardware_id == device.hardware_id and w.shape_key == shape_key
        ),
        key=lambda w: w.updated_at,
        reverse=True,
    )
    target = ShapeKey.parse(shape_key)
    near = sorted(
        (distance, w.shape_key, w.config)
        for w in winners
        if w.hardware_id == device.hardware_id
        and w.shape_key != shape_key
        and (distance := template.key_distance(target, ShapeKey.parse(w.shape_key))) != float("inf")
    )
    elsewhere = [w.config for w in winners if w.shape_key == shape_key and w.hardware_id != device.hardware_id]
    configs: list[Config] = [dict(w.config) for w in earlier]
    configs += [dict(config) for _, _, config in near[:NEIGHBOURS]] + [dict(c) for c in elsewhere]
    return _unique(configs)


def sibling_warm_start(store: Store, template: Template, device: Device, shape_key: str) -> list[Config]:
    """The winners of ``device``'s sibling GPU models (same capability and SM count, see
    tunesvc.serving.transfer) worth measuring first for ``shape_key``: this key's on each
    sibling (the one the runtime would transfer from first), then those of the ``NEIGHBOURS``
    nearest other keys that sibling tuned. On a new model these are the likeliest winners
    before any measurement of its own (benchmarks/adopt.py measures how few trials they save).
    Measured, never copied: a sweep on ``device`` stores only what it timed there."""
    entries = store.sibling_winners(template.name, template.version, device)
    first = transfers.pick_sibling(entries)
    newest = {e.hardware_id: e.config for e in entries if e.shape_key == shape_key}  # oldest first: the newest wins
    ordered = sorted(newest, key=lambda h: (first is None or h != first.hardware_id, h))
    configs = [newest[h] for h in ordered]
    if first is not None:
        target = ShapeKey.parse(shape_key)
        near = sorted(
            (distance, key)
            for parsed, key in first.parsed()
            if key != shape_key and (distance := template.key_distance(target, parsed)) != float("inf")
        )
        configs += [first.winners[key] for _, key in near[:NEIGHBOURS]]
    checked = [template.space.stored_config(c) for c in configs]  # a parameter added since: its first choice
    return _unique([dict(c) for c in checked if not isinstance(c, str)])


def _unique(configs: list[Config]) -> list[Config]:
    """``configs`` without repeats (by config hash), each where it first appears."""
    first: dict[str, Config] = {}
    for config in configs:
        first.setdefault(config_hash(config), config)
    return list(first.values())


def check_sweep_arguments(
    strategy: str,
    budget: int | None,
    time_budget: float | None = None,
    patience: int | None = None,
    timing: str = GRAPH,
) -> None:
    if timing not in TIMINGS:
        raise TunesvcError(f"Unknown timing '{timing}'; use one of {', '.join(TIMINGS)}.")
    if strategy not in STRATEGIES:
        raise TunesvcError(f"Unknown strategy '{strategy}'; use one of {', '.join(STRATEGIES)}.")
    if budget is not None and budget < 1:
        raise TunesvcError(f"--budget must be at least 1, got {budget}.")
    check_time_budget(time_budget)
    if patience is not None and patience < 1:
        raise TunesvcError(f"--patience must be at least 1, got {patience}.")


def check_time_budget(time_budget: float | None) -> None:
    """A --time-budget (of a sweep, ``tune selector --cross-measure`` or ``tune evaluate``) is positive seconds."""
    if time_budget is not None and not time_budget > 0:
        raise TunesvcError(f"--time-budget must be a positive number of seconds, got {time_budget}.")
