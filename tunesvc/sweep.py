"""A sweep: for each problem, search the template's space on this device and store it all.

Per problem: shape key -> the trials already stored for (kernel version, device, key) are
replayed into the strategy (so a killed sweep resumes, and a repeated one costs nothing) ->
ask/measure/store/tell until the budget or the space runs out -> the fastest correct trial
becomes the key's winner.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Callable

from tunesvc.bench import Bench
from tunesvc.bench import Compiler
from tunesvc.bench import Measurement
from tunesvc.bench import Status
from tunesvc.device import Device
from tunesvc.device import current_device
from tunesvc.errors import TunesvcError
from tunesvc.search import STRATEGIES
from tunesvc.search import make_strategy
from tunesvc.space import config_hash

if TYPE_CHECKING:
    from tunesvc.space import Config
    from tunesvc.store import Store
    from tunesvc.template import Problem
    from tunesvc.template import Template

DEFAULT_OPTUNA_BUDGET = 50


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
    #: where the wall time went: waiting for the compile workers, and checking + timing
    compile_seconds: float = 0.0
    measure_seconds: float = 0.0


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
    workers: int | None = None,
    candidates: list[Config] | None = None,
) -> list[ProblemResult]:
    """Tune ``template`` on every problem; returns one result per problem, in order.

    ``workers`` processes compile each batch of candidates in parallel before it is measured
    (default: up to 8 on a GPU, none in the interpreter, which has nothing to compile).
    ``candidates`` replaces the space's enumeration with an explicit list (constraints still
    apply), e.g. to compare with another tuner on the same configs.
    """
    check_sweep_arguments(strategy, budget)
    device = device or current_device()
    if workers is None:
        workers = min(8, os.cpu_count() or 1) if device.is_gpu else 0
    compiler = Compiler(workers) if workers > 1 else None
    try:
        return [
            _sweep_one(template, problem, store, device, strategy, budget, seed, on_start, on_trial, compiler, candidates)
            for problem in problems
        ]
    finally:
        if compiler is not None:
            compiler.close()


def _sweep_one(
    template: Template, problem: Problem, store: Store, device: Device, strategy: str, budget: int | None,
    seed: int, on_start, on_trial, compiler: Compiler | None, explicit: list[Config] | None,
) -> ProblemResult:
    kv_id = store.kernel_version_id(template)
    device_id = store.device_id(device)
    started = time.perf_counter()
    key = str(template.key(problem))
    if explicit is None:
        candidates = template.feasible(problem, device)
    else:
        candidates = [c for c in explicit if not template.violations(c, problem, device)]
    if not candidates:
        raise TunesvcError(
            f"No config of {template.name}'s space fits {key} on {device.name}; widen search_spaces/{template.name}.toml."
        )
    heuristic = template.heuristic(problem, device)
    limit = len(candidates) if budget is None and strategy == "grid" else budget or DEFAULT_OPTUNA_BUDGET
    limit = min(limit, len(candidates))
    initial = template.warm_start(problem, device)
    search = make_strategy(strategy, template.space, candidates, seed=seed, initial=initial)
    stored = store.trials(kv_id, device_id, key)
    for row in stored:
        search.tell(dict(row.config), _measurement(row))
    measured = {row.config_hash: row for row in stored}
    best = min((r.time_ms for r in stored if r.status == "ok"), default=None)
    if on_start:
        on_start(problem, key, limit)
    sweep_id = store.start_sweep(kv_id, device_id, key, problem, strategy, budget, seed)
    bench: Bench | None = None
    new = 0
    batch_size = compiler.workers if compiler else 1
    exhausted = False
    compile_seconds = measure_seconds = 0.0
    while len(search.told) < limit and not exhausted:
        batch: list[Config] = []
        while len(batch) < batch_size and len(search.told) + len(batch) < limit:
            config = search.ask()
            if config is None:
                exhausted = True
                break
            if config_hash(config) in measured:  # a strategy may propose a stored config again
                search.tell(config, _measurement(measured[config_hash(config)]))
            else:
                batch.append(config)
        if compiler is not None:
            tick = time.perf_counter()
            compiler.compile(template, problem, batch)
            compile_seconds += time.perf_counter() - tick
        for config in batch:
            h = config_hash(config)
            tick = time.perf_counter()
            bench = bench or Bench(template, problem, device)
            m = bench.measure(config)
            measure_seconds += time.perf_counter() - tick
            row = store.add_trial(sweep_id, kv_id, device_id, key, config, h, m)
            if row is not None:
                measured[h] = row
                new += 1
            search.tell(config, m)
            if m.ok and (best is None or m.time_ms < best):
                best = m.time_ms
            if on_trial:
                on_trial(TrialEvent(problem, key, len(search.told), limit, config, m, best))
    winner = store.update_winner(kv_id, device_id, key)
    rows = store.trials(kv_id, device_id, key)
    heuristic_row = next((r for r in rows if r.config_hash == config_hash(heuristic)), None)
    wall = time.perf_counter() - started
    store.finish_sweep(sweep_id, wall)
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
            compile_seconds=compile_seconds,
            measure_seconds=measure_seconds,
    )


def check_sweep_arguments(strategy: str, budget: int | None) -> None:
    if strategy not in STRATEGIES:
        raise TunesvcError(f"Unknown strategy '{strategy}'; use one of {', '.join(STRATEGIES)}.")
    if budget is not None and budget < 1:
        raise TunesvcError(f"--budget must be at least 1, got {budget}.")


def _measurement(row) -> Measurement:
    return Measurement(
        Status(row.status), time_ms=row.time_ms, spread=row.spread, reps=row.reps,
        rel_error=row.rel_error, message=row.message,
    )
