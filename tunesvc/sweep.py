"""A sweep: for each problem, search the template's space on this device and store it all.

Per problem: shape key -> the trials already stored for (kernel version, device, key) are
replayed into the strategy (so a killed sweep resumes, and a repeated one costs nothing) ->
warm start (the heuristic, the winners of the nearest tuned keys on this device and of this
key on other devices, the template's known-good configs) -> ask/measure/store/tell until the
trial budget, the time budget, the patience or the space runs out -> the finalists (the
fastest few) are re-measured interleaved -> the fastest correct trial becomes the key's winner
-> the template's torch peer, if it has one, is timed once on the same inputs (sweeps.peer_ms).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from typing import TYPE_CHECKING

from tunesvc.bench import Bench
from tunesvc.bench import Compiler
from tunesvc.bench import Measurement
from tunesvc.bench import Status
from tunesvc.bench import Worker
from tunesvc.device import Device
from tunesvc.device import fork_safe_current_device
from tunesvc.errors import TunesvcError
from tunesvc.search import OPTUNA_STRATEGIES
from tunesvc.search import STRATEGIES
from tunesvc.search import make_strategy
from tunesvc.space import config_hash
from tunesvc.template import ShapeKey
from tunesvc.template import Template

if TYPE_CHECKING:
    from tunesvc.space import Config
    from tunesvc.store import Store
    from tunesvc.template import Problem

DEFAULT_OPTUNA_BUDGET = 50
#: winners of this many nearest tuned shape keys (same kernel version and device) start a search
NEIGHBOURS = 3
#: rounds of the finalists' interleaved re-measurement
FINALIST_ROUNDS = 3
#: what ProblemResult.phases names, in the order a sweep meets them: the parent's waits, so that
#: work overlapped in other processes (the compile pool and the measuring process starting,
#: candidates compiling while earlier ones are timed) counts only where it holds the sweep up
PHASES = (
    "start",  # the first problem only: reading the device, starting the compile pool
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


class _Clock:
    """Splits a wall time into phases: each lap's time since the previous lap goes to its phase."""

    def __init__(self) -> None:
        self.start = self._last = time.perf_counter()
        self.phases: dict[str, float] = {}

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self._last
        self._last = now


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
    isolate: bool | None = None,
    measure_timeout: float = 60.0,
    rep_ms: float = 100.0,
    compiler: Compiler | None = None,
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
    fraction). The ``finalists`` fastest configs (default 3 on a GPU, none in the interpreter)
    are then re-measured interleaved, ``FINALIST_ROUNDS`` times, and keep the median, so a
    config that won by noise is not stored as the winner. With ``isolate`` (default: on a GPU)
    every candidate is measured in a :class:`~tunesvc.bench.Worker` process, and one that
    crashes it or runs past ``measure_timeout`` seconds is stored as ``crash`` or ``timeout``.
    Optuna strategies keep their study in the store's database (see ``study_storage``).
    ``compiler``: a compile pool the caller keeps across sweeps (see :func:`compile_pool`), used
    instead of starting one and left open.
    """
    check_sweep_arguments(strategy, budget, time_budget, patience)
    clock = _Clock()
    device = device or fork_safe_current_device()  # this process then forks its workers
    fitting = (
        None
        if candidates is None
        else max((sum(not template.violations(c, p, device) for c in candidates) for p in problems), default=0)
    )
    workers = _pool_size(workers, device, strategy, budget, fitting)
    options = _Options(
        strategy,
        budget,
        seed,
        time_budget,
        patience,
        min_improvement,
        (3 if device.is_gpu else 0) if finalists is None else finalists,
        device.is_gpu if isolate is None else isolate,
        measure_timeout,
        rep_ms,
    )
    own = compiler is None
    if own:
        compiler = _start_pool(workers, template, problems)
    clock.lap("start")
    try:
        return [
            _sweep_one(
                template,
                problem,
                store,
                device,
                options,
                on_start,
                on_trial,
                compiler,
                candidates,
                on_phase or (lambda key, what: None),
                clock if i == 0 else _Clock(),
            )
            for i, problem in enumerate(problems)
        ]
    finally:
        if own and compiler is not None:
            compiler.close()


def compile_pool(
    template: Template,
    problem: Problem,
    *,
    strategy: str = "grid",
    budget: int | None = None,
    workers: int | None = None,
    device: Device | None = None,
) -> Compiler | None:
    """The compile pool :func:`run_sweep` would start for such a sweep, for a caller that runs
    many sweeps of one kind and passes it to each (``tune sweep --gpus`` workers, one job after
    another): its processes, their CUDA contexts (made one after another by the driver, seconds
    for sixteen) and their imports are then paid once, not per sweep. None where the sweep would
    compile in its own process. The caller closes it."""
    device = device or fork_safe_current_device()
    return _start_pool(_pool_size(workers, device, strategy, budget, None), template, [problem])


def _start_pool(size: int, template: Template, problems: list[Problem]) -> Compiler | None:
    """A pool of ``size`` compile workers warmed up on the first problem; None where a sweep
    compiles in its own process (one worker or none, or a template the workers cannot unpickle)."""
    if size > 1 and problems and _picklable(template, problems):
        return Compiler(size, template=template, problem=problems[0])
    return None


def _pool_size(workers: int | None, device: Device, strategy: str, budget: int | None, fitting: int | None) -> int:
    """``fitting``: how many of an explicit candidate list fit the device, for the problem where
    most do (an idle worker would still start, make its CUDA context and inputs)."""
    if workers is None:
        if not device.is_gpu:
            return 0
        workers = min(16 if strategy in ("grid", "random") else 8, os.cpu_count() or 1)
    for most in (budget, fitting):
        if most is not None:
            workers = min(workers, most)  # a batch never holds more candidates than these
    return workers


@dataclass(frozen=True)
class _Options:
    strategy: str
    budget: int | None
    seed: int
    time_budget: float | None
    patience: int | None
    min_improvement: float
    finalists: int
    isolate: bool
    measure_timeout: float
    rep_ms: float


def study_name(template: Template, device: Device, shape_key: str, strategy: str) -> str:
    """The Optuna study of one (kernel, kernel version, device, shape key) and strategy."""
    return f"tunesvc:{template.name}:{template.version}:{device.fingerprint}:{shape_key}:{strategy}"


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


def _sweep_one(
    template: Template,
    problem: Problem,
    store: Store,
    device: Device,
    options: _Options,
    on_start,
    on_trial,
    compiler: Compiler | None,
    explicit: list[Config] | None,
    on_phase: Callable[[str, str], None],
    clock: _Clock,
) -> ProblemResult:
    kv_id = store.kernel_version_id(template)
    device_id = store.device_id(device)
    started = clock.start
    key = str(template.key(problem))
    if explicit is None:
        candidates = template.feasible(problem, device)
    else:
        candidates = [c for c in explicit if not template.violations(c, problem, device)]
    if not candidates:
        raise TunesvcError(
            f"No config of {template.name}'s space fits {key} on {device.name}; widen search_spaces/{template.name}.toml."
        )
    strategy, budget = options.strategy, options.budget
    heuristic = template.heuristic(problem, device)
    limit = len(candidates) if budget is None and strategy == "grid" else budget or DEFAULT_OPTUNA_BUDGET
    limit = min(limit, len(candidates))
    warm = template.warm_start(problem, device)
    initial = _unique([*warm[:1], *stored_warm_start(store, template, device, key), *warm[1:]])
    storage = study_storage(store) if strategy in OPTUNA_STRATEGIES else None
    search = make_strategy(
        strategy,
        template.space,
        candidates,
        seed=options.seed,
        initial=initial,
        storage=storage,
        study_name=study_name(template, device, key, strategy) if storage else None,
    )
    stored = store.trials(kv_id, device_id, key)
    for row in stored:
        search.tell(dict(row.config), _measurement(row))
    measured = {row.config_hash: _measurement(row) for row in stored}
    best = min((r.time_ms for r in stored if r.status == "ok"), default=None)
    if on_start:
        on_start(problem, key, limit)
    sweep_id = store.start_sweep(kv_id, device_id, key, problem, strategy, budget, options.seed)
    measurer: Bench | Worker | None = None
    new = 0
    batch_size = compiler.workers if compiler else 1
    stopped = "budget"
    since_improved = 0  # trials since the best last improved by min_improvement
    peer_ms: float | None = None
    clock.lap("set-up")
    try:
        while len(search.told) < limit:
            if options.time_budget is not None and time.perf_counter() - started >= options.time_budget:
                stopped = "time"
                break
            if options.patience is not None and since_improved >= options.patience:
                stopped = "patience"
                break
            batch: list[Config] = []
            hashes: list[str] = []
            while len(batch) < batch_size and len(search.told) + len(batch) < limit:
                config = search.ask()
                if config is None:
                    break
                h = config_hash(config)
                if h in measured:  # a strategy may propose a stored config again
                    search.tell(config, measured[h])
                else:
                    batch.append(config)
                    hashes.append(h)
            if not batch:
                stopped = "exhausted"
                break
            clock.lap("search")
            measurer = measurer or _measurer(template, problem, device, options)
            if compiler is not None:
                on_phase(key, f"compiling {len(batch)} candidates")
                compiled = compiler.compile_each(template, problem, batch)  # in the order they finish
            else:
                compiled = ((j, None) for j in range(len(batch)))
            clock.lap("measurer start")
            results: list[tuple[Config, str, Measurement]] = []
            for i, (j, _) in enumerate(compiled):  # to its end: the end replaces a broken pool
                config, h = batch[j], hashes[j]
                clock.lap("waiting for compiles")
                if isinstance(measurer, Worker):
                    measurer.wait_ready()
                    clock.lap("measurer start")
                if i == 0:
                    on_phase(key, "checking and timing")
                results.append((config, h, measurer.measure(config)))
                clock.lap("checking and timing")
            # one transaction per batch: many workers on one database commit once per batch, not
            # per trial (benchmarks/write_throughput.py); a kill loses at most the batch in flight
            # with a --budget, the store counts every writer's trials of this key against it
            ids = store.add_trials(
                sweep_id, kv_id, device_id, key, results, budget=limit if budget is not None else None
            )
            clock.lap("trial writes")
            for (config, h, m), trial_id in zip(results, ids):
                if trial_id is not None:
                    measured[h] = m
                    new += 1
                search.tell(config, m)
                if m.ok and (best is None or m.time_ms < best * (1 - options.min_improvement)):
                    since_improved = 0
                else:
                    since_improved += 1
                if m.ok and (best is None or m.time_ms < best):
                    best = m.time_ms
                if on_trial:
                    on_trial(TrialEvent(problem, key, len(search.told), limit, config, m, best))
            clock.lap("search")
            if budget is not None and None in ids and store.trial_count(kv_id, device_id, key) >= limit:
                break  # sweeps of this key beside this one used the rest of the budget
        if stopped == "budget" and search.exhausted:
            stopped = "exhausted"
        clock.lap("search")
        if new and options.finalists > 1:
            on_phase(key, f"re-timing {options.finalists} finalists")
            measurer = measurer or _measurer(template, problem, device, options)
            clock.lap("measurer start")
            _remeasure_finalists(store, measurer, kv_id, device_id, key, options.finalists, options.rep_ms)
            clock.lap("finalists")
        if measurer is not None and has_peer(template):  # a sweep that measured nothing makes no inputs for it
            on_phase(key, "timing the torch peer")
            peer_ms = _time_peer(measurer)
            clock.lap("torch peer")
    finally:
        if isinstance(measurer, Worker):
            measurer.close()
            clock.lap("measurer stop")
    winner = store.update_winner(kv_id, device_id, key)
    rows = store.trials(kv_id, device_id, key)
    heuristic_row = next((r for r in rows if r.config_hash == config_hash(heuristic)), None)
    store.finish_sweep(sweep_id, time.perf_counter() - started, peer_ms=peer_ms)
    clock.lap("winner")
    wall = sum(clock.phases.values())
    on_phase(key, "done")
    return ProblemResult(
        problem=problem,
        shape_key=key,
        winner=dict(winner.config) if winner else None,
        winner_ms=winner.time_ms if winner else None,
        heuristic=heuristic,
        heuristic_ms=heuristic_row.time_ms if heuristic_row and heuristic_row.status == "ok" else None,
        trials_new=new,
        trials_stored=len(rows),
        failures=sum(r.status != Status.OK.value for r in rows),
        wall_seconds=wall,
        phases=clock.phases,
        stopped=stopped,
        peer_ms=peer_ms,
    )


def _measurer(template: Template, problem: Problem, device: Device, options: _Options) -> Bench | Worker:
    # a template the child cannot unpickle (e.g. a decorated kernel with local functions) is
    # measured in this process, as before isolation existed
    if options.isolate and _picklable(template, problem):
        return Worker(template, problem, device, timeout_s=options.measure_timeout, rep_ms=options.rep_ms)
    return Bench(template, problem, device, rep_ms=options.rep_ms)


def has_peer(template: Template) -> bool:
    """Whether the template defines ``peer`` (the base class's returns None)."""
    return type(template).peer is not Template.peer


def _time_peer(measurer: Bench | Worker) -> float | None:
    """The peer's median ms, timed once per sweep on the candidates' inputs; None if it failed."""
    try:
        m = measurer.time_peer()
    except Exception:  # even a measuring process that will not start: the peer is never worth a sweep
        return None
    return m.time_ms if m.ok else None


def _picklable(*objects: object) -> bool:
    import pickle

    try:
        pickle.dumps(objects)
    except Exception:  # pickle raises AttributeError, TypeError or PicklingError, by object
        return False
    return True


def stored_warm_start(store: Store, template: Template, device: Device, shape_key: str) -> list[Config]:
    """Winners worth measuring first for ``shape_key``: those of the ``NEIGHBOURS`` nearest tuned
    keys of this kernel version on this device, then this key's on other devices."""
    winners = store.winners(kernel=template.name, version=template.version)
    target = ShapeKey.parse(shape_key)
    near = sorted(
        (distance, w.shape_key, w.config)
        for w in winners
        if w.hardware_id == device.hardware_id
        and w.shape_key != shape_key
        and (distance := target.distance(ShapeKey.parse(w.shape_key))) != float("inf")
    )
    elsewhere = [w.config for w in winners if w.shape_key == shape_key and w.hardware_id != device.hardware_id]
    return _unique([dict(config) for _, _, config in near[:NEIGHBOURS]] + [dict(c) for c in elsewhere])


def _remeasure_finalists(
    store: Store, measurer: Bench | Worker, kv_id: int, device_id: int, key: str, k: int, rep_ms: float
) -> None:
    """Re-time the k fastest correct trials round-robin and store each one's median of rounds.

    Interleaving puts every finalist under the same clocks and temperatures, so a config whose
    first measurement was lucky falls back before it can be declared the winner. A round times
    for rep_ms / FINALIST_ROUNDS: a finalist's rounds take as long as its first measurement,
    and are interleaved more finely. A finalist that fails now (a crash, a timeout) keeps that
    status and cannot win.
    """
    from tunesvc.store.models import Trial

    rows = sorted((r for r in store.trials(kv_id, device_id, key) if r.status == "ok"), key=lambda r: r.time_ms)[:k]
    if len(rows) < 2:
        return
    rounds: dict[int, list[Measurement]] = {r.id: [] for r in rows}
    for _ in range(FINALIST_ROUNDS):
        for row in rows:
            rounds[row.id].append(measurer.time_only(dict(row.config), rep_ms / FINALIST_ROUNDS))
    with store.session() as session:
        for row in rows:
            ms = rounds[row.id]
            trial = session.get(Trial, row.id)
            failed = next((m for m in ms if not m.ok), None)
            if failed is not None:
                trial.status, trial.time_ms, trial.message = (
                    failed.status.value,
                    None,
                    f"as a finalist: {failed.message}",
                )
                continue
            times = sorted([row.time_ms, *(m.time_ms for m in ms)])
            median = statistics.median(times)
            trial.time_ms = median
            trial.spread = (times[-1] - times[0]) / median
            trial.reps = row.reps + sum(m.reps for m in ms)


def _unique(configs: list[Config]) -> list[Config]:
    seen: set[str] = set()
    return [c for c in configs if not (config_hash(c) in seen or seen.add(config_hash(c)))]


def check_sweep_arguments(
    strategy: str, budget: int | None, time_budget: float | None = None, patience: int | None = None
) -> None:
    if strategy not in STRATEGIES:
        raise TunesvcError(f"Unknown strategy '{strategy}'; use one of {', '.join(STRATEGIES)}.")
    if budget is not None and budget < 1:
        raise TunesvcError(f"--budget must be at least 1, got {budget}.")
    if time_budget is not None and not time_budget > 0:
        raise TunesvcError(f"--time-budget must be a positive number of seconds, got {time_budget}.")
    if patience is not None and patience < 1:
        raise TunesvcError(f"--patience must be at least 1, got {patience}.")


def _measurement(row) -> Measurement:
    return Measurement(
        Status(row.status),
        time_ms=row.time_ms,
        spread=row.spread,
        reps=row.reps,
        rel_error=row.rel_error,
        message=row.message,
    )
