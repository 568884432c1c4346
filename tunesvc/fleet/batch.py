"""The batch runner: queue a sweep's (kernel x shape) jobs in the database, run one worker per GPU
of this host (:mod:`tunesvc.fleet.jobs`) or of a Ray cluster (:mod:`tunesvc.fleet.cluster`), and
report the batch's progress, read from the database where the workers record it, through
callbacks; what it returns is the batch's jobs and winners.

It draws nothing: ``tune sweep --gpus`` / ``--ray`` (:mod:`tunesvc.cli._sweep_workers`) passes
callbacks that draw a progress bar per job and turns a :class:`BatchInterrupted` into its summary.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any

from tunesvc.timeline import mark

if TYPE_CHECKING:
    from tunesvc.device import Device
    from tunesvc.records import JobRecord
    from tunesvc.records import WinnerEntry
    from tunesvc.store import Store
    from tunesvc.template import Template

#: seconds between two progress reports while the workers run
POLL_S = 0.5


@dataclass(frozen=True)
class BatchStart:
    """The queued batch, reported once before the workers begin."""

    batch: str
    #: jobs this call added to the queue (the rest were there from an earlier run of the batch)
    added: int
    jobs: int
    workers: int
    #: where the workers run: "" for this host, " on Ray"
    where: str
    #: shape key -> the trials its job's sweep runs at most, in the order the shapes were given
    limits: dict[str, int]


@dataclass(frozen=True)
class JobProgress:
    """One job's state in a progress report: its status and trials stored of its ``limit``."""

    shape_key: str
    status: str
    completed: int
    limit: int


@dataclass(frozen=True)
class BatchResult:
    batch: str
    device: Device
    workers: int
    where: str
    #: the database as messages name it (no password)
    shown_url: str
    jobs: list[JobRecord]
    #: shape key -> its stored winner on the hardware the workers ran on
    winners: dict[str, WinnerEntry]
    #: the workers' exit codes (Ray's: (code, hardware id) or None)
    codes: list[Any]


class BatchInterrupted(KeyboardInterrupt):
    """Ctrl-C during a batch, after the workers gave their running jobs back: what is stored."""

    def __init__(self, new: int, total: int, keys: int, shown_url: str) -> None:
        super().__init__()
        self.new, self.total, self.keys, self.shown_url = new, total, keys, shown_url


def job_limits(
    template: Template, problems: list[dict], device: Device, strategy: str, budget: int | None
) -> dict[str, int]:
    """Shape key -> the trials each job's sweep will run at most, as run_sweep counts them."""
    from tunesvc.tuning.sweep import DEFAULT_OPTUNA_BUDGET

    limits: dict[str, int] = {}
    for problem in problems:
        feasible = len(template.feasible(problem, device))
        wanted = feasible if budget is None and strategy == "grid" else budget or DEFAULT_OPTUNA_BUDGET
        limits[str(template.key(problem))] = min(wanted, feasible)
    return limits


def run_batch(
    kernel: str,
    template: Template,
    problems: list[dict],
    strategy: str,
    budget: int | None,
    seed: int,
    *,
    db: str | None,
    gpus: str | None = None,
    ray_address: str | None = None,
    time_budget: float | None = None,
    patience: int | None = None,
    workers: int | None = None,
    on_start: Callable[[BatchStart], None] = lambda start: None,
    on_progress: Callable[[list[JobProgress]], None] = lambda jobs: None,
    on_log: Callable[[str], None] = lambda line: None,
) -> BatchResult:
    """Queue the (kernel x shape) jobs in ``db`` and run them on one worker per GPU of this host
    (``gpus``: "all" or a list of indices) or of the Ray cluster at ``ray_address``; each worker
    runs its jobs with ``time_budget``, ``patience`` and ``workers`` compiling processes.

    ``on_start`` is called once the jobs are queued, ``on_progress`` every :data:`POLL_S` while
    the workers run and once after (the final report waits for a database that is unreachable,
    as the workers do; the others skip it), ``on_log`` with each line the workers or the retries
    say. Ctrl-C raises :class:`BatchInterrupted` once the workers have given their jobs back.
    """
    # the GPU count (torch); the job queue (SQLAlchemy)
    import torch

    from tunesvc.device import current_device
    from tunesvc.fleet import jobs
    from tunesvc.store import Store
    from tunesvc.store import resolve_url

    processes: list[jobs.WorkerProcess] = []
    connected = False
    if ray_address is None:
        # device_count() asks NVML: CUDA stays uninitialised here, so the workers are forked from this process
        shape_keys = len(dict.fromkeys(str(template.key(p)) for p in problems))  # one job per key
        slots = jobs.worker_slots(gpus or "all", torch.cuda.device_count(), jobs=shape_keys)
        # started first: they read their devices while this process opens the database and queues the jobs
        processes = jobs.spawn_workers(
            resolve_url(db),
            None,
            slots,
            time_budget=time_budget,
            patience=patience,
            compile_workers=workers,
            first_jobs=jobs.planned_jobs(kernel, template, problems, strategy, budget, seed),
            kernel=kernel,
        )
        mark("workers started")
        count, where = len(slots), ""
    else:
        from tunesvc.fleet import cluster

        connected = cluster.connect(ray_address)  # before queuing: a cluster that cannot be reached queues nothing
        count, where = cluster.placement()[0], " on Ray"
    store = None
    try:
        store = Store(db)
        mark("database open")
        device = current_device()
        mark("device read")
        batch = jobs.batch_name(kernel, template, problems, strategy, budget, seed, device, time_budget, patience)
        added = jobs.enqueue(store, batch, kernel, template, problems, strategy, budget, seed)
        mark("jobs queued")
        keys = list(dict.fromkeys(str(template.key(p)) for p in problems))
        before = jobs.trials_stored(store, template, device.hardware_id, keys)  # before any worker begins
        for p in processes:
            p.begin(batch)
        limits = job_limits(template, problems, device, strategy, budget)
        on_start(BatchStart(batch, added, len(problems), count, where, {key: limits[key] for key in keys}))
        report = _reporter(store, batch, template, device, limits, on_progress, on_log)
        try:
            if ray_address is None:
                codes: list = _wait_reporting(processes, report)
            else:
                codes = cluster.run_on_ray(
                    store.url,
                    batch,
                    time_budget=time_budget,
                    patience=patience,
                    compile_workers=workers,
                    kernel=kernel,
                    log=on_log,
                    tick=report,
                )
                report(final=True)
        except KeyboardInterrupt:
            now = jobs.trials_stored(store, template, device.hardware_id, keys)
            raise BatchInterrupted(
                sum(now.values()) - sum(before.values()), sum(now.values()), len(keys), store.shown_url
            ) from None
        mark("workers done")
        # the workers' results, read again while the database is unreachable (a server restarted
        # during the sweep, which the workers rode out): finished work is not reported as an error
        rows = jobs.retrying(lambda: jobs.jobs(store, batch), on_log)
        # Ray's workers may hold other GPUs than this host (a head node without one)
        hardware = {c[1] for c in codes if isinstance(c, tuple)} or {device.hardware_id}
        stored = jobs.retrying(lambda: store.winners(kernel=template.name, version=template.version), on_log)
        winners = {w.shape_key: w for w in stored if w.hardware_id in hardware}
    finally:
        for p in processes:  # a failure before the jobs were queued: the workers exit quietly
            p.abandon()
        for p in processes:
            p.wait()
        if store is not None:
            store.close()
        if connected:
            _ray_shutdown()
    return BatchResult(batch, device, count, where, store.shown_url, rows, winners, codes)


def _reporter(
    store: Store,
    batch: str,
    template: Template,
    device: Device,
    limits: dict[str, int],
    on_progress: Callable[[list[JobProgress]], None],
    on_log: Callable[[str], None],
) -> Callable[..., None]:
    """The function that reads the batch's jobs and stored trials and passes them to ``on_progress``."""
    from tunesvc.fleet.jobs import retrying
    from tunesvc.fleet.jobs import trials_stored
    from tunesvc.store import DatabaseUnavailable

    keys = list(limits)

    def read() -> None:
        stored = trials_stored(store, template, device.hardware_id, keys)
        on_progress(
            [
                JobProgress(
                    job.shape_key,
                    job.status,
                    limits[job.shape_key]
                    if job.status == "done"
                    else min(stored[job.shape_key], limits[job.shape_key]),
                    limits[job.shape_key],
                )
                for job in store.jobs(batch)
                if job.shape_key in limits
            ]
        )

    def report(final: bool = False) -> None:
        """Read from the database; while it is unreachable (a server restart, which the workers
        retry through), a report is skipped, and the final one waits for it as the workers do."""
        if final:
            retrying(read, on_log)
            return
        try:
            read()
        except DatabaseUnavailable:
            pass

    return report


def _wait_reporting(processes: list, report: Callable[..., None]) -> list[int]:
    """Wait for this host's workers, reporting the batch's progress.

    On Ctrl-C (SIGINT, which a terminal sends to the workers too) the workers give their running
    jobs back to the queue; this waits for them to end, then raises KeyboardInterrupt."""
    try:
        while any(p.poll() is None for p in processes):
            report()
            time.sleep(POLL_S)
        report(final=True)
        return [p.wait() for p in processes]
    except KeyboardInterrupt:
        # a terminal's Ctrl-C reached the workers too, and they are giving their jobs back: a
        # second SIGINT is for those that did not get one (`kill -INT` of this process alone)
        deadline = time.monotonic() + 1
        while any(p.poll() is None for p in processes) and time.monotonic() < deadline:
            time.sleep(0.1)
        for p in processes:
            p.interrupt()
        for p in processes:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        raise


def _ray_shutdown() -> None:
    import ray

    ray.shutdown()
