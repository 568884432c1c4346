"""Sweeps shared by several workers: one per GPU of a host, on one host or many.

A sweep's (kernel x shape) jobs go into the database's ``jobs`` table under a *batch* name derived
from the sweep's arguments and the GPU model, so the same command run on several hosts (sharing
one PostgreSQL database) joins one sweep. Each worker:

* releases jobs whose worker stopped heartbeating for ``stale_s`` (it died: kill -9, a lost host);
* claims one pending job atomically: a single ``UPDATE ... WHERE status = 'pending'`` whose
  subquery is ``SELECT ... FOR UPDATE SKIP LOCKED`` on PostgreSQL (workers never wait on each
  other's rows) and plain on SQLite (whose one writer at a time makes the update atomic);
* runs it with :func:`tunesvc.tuning.sweep.run_sweep`, heartbeating from a thread; trials already
  stored for the key (by a worker that died) are reused, never measured twice;
* marks it done, only if it still holds it: a done job is never claimed again.

Losing the database server (a restart) makes the worker retry with exponential backoff; the job
is then re-run from its stored trials. Workers are processes (``python -m tunesvc.fleet.jobs``), each
with its own ``CUDA_VISIBLE_DEVICES``; placing them on other hosts is left to whatever starts
the command there (ssh, a cluster scheduler): this module is only the shared queue.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any
from typing import TextIO
from typing import TypeVar

from tunesvc import settings
from tunesvc.errors import TunesvcError
from tunesvc.records import JobSpec
from tunesvc.store import DatabaseUnavailable
from tunesvc.store import Store
from tunesvc.template import template_named_by_data
from tunesvc.timeline import mark
from tunesvc.timeline import set_role
from tunesvc.tuning.sweep import compile_pool
from tunesvc.tuning.sweep import measuring_process
from tunesvc.tuning.sweep import run_sweep

if TYPE_CHECKING:
    from tunesvc.bench import Compiler
    from tunesvc.bench import Worker as MeasuringProcess
    from tunesvc.device import Device
    from tunesvc.records import JobRecord
    from tunesvc.template import Problem
    from tunesvc.template import Template

#: a running job's worker refreshes its heartbeat this often (seconds)
HEARTBEAT_S = 5.0
#: a running job whose heartbeat is older than this goes back to pending (its worker died)
STALE_S = 60.0
#: how long a worker keeps retrying an unreachable database before it gives up (seconds)
RETRY_S = 300.0
#: the kernel name a sweep's command gave, passed to its workers: the one module path a job row may name
JOB_KERNEL_ENV = "TUNESVC_JOB_KERNEL"


def batch_name(
    kernel: str,
    template: Template,
    problems: list[Problem],
    strategy: str,
    budget: int | None,
    seed: int,
    device: Device,
    time_budget: float | None = None,
    patience: int | None = None,
) -> str:
    """The same sweep arguments on the same GPU model name the same batch, on any host.

    ``time_budget`` and ``patience`` change which trials a job measures, so they name another
    batch; left out when unset, so a sweep queued before they were passed keeps its name.
    """
    limits = {k: v for k, v in (("time_budget", time_budget), ("patience", patience)) if v is not None}
    data = json.dumps(
        [
            kernel,
            template.version,
            sorted(str(template.key(p)) for p in problems),
            strategy,
            budget,
            seed,
            device.hardware_id,
        ]
        + ([limits] if limits else []),
        sort_keys=True,
    )
    return hashlib.sha256(data.encode()).hexdigest()[:16]


def enqueue(
    store: Store,
    batch: str,
    kernel: str,
    template: Template,
    problems: list[Problem],
    strategy: str,
    budget: int | None,
    seed: int,
) -> int:
    """Add the batch's jobs that are not there yet (another host may have added them); returns how many.

    Workers claim jobs in the order they were added, so the costliest (the cost model's bytes and
    FLOPs) go in first: the longest-job-first rule, which keeps one slow shape from being the last
    job claimed while the other workers sit idle.
    """
    added = 0
    for job in planned_jobs(kernel, template, problems, strategy, budget, seed):
        added += store.add_job(batch, kernel, job.shape_key, job.problem, strategy, budget, seed)
    return added


def _cost_rank(template: Template, problem: Problem) -> tuple[float, float]:
    try:
        cost = template.cost(problem)
    except NotImplementedError:  # a template without a cost model keeps the order given
        return (0.0, 0.0)
    return (cost.flops, cost.bytes)


def release_stale(store: Store, batch: str, stale_s: float = STALE_S) -> int:
    """Put running jobs whose worker stopped heartbeating back to pending; returns how many."""
    return store.release_stale_jobs(batch, stale_s)


def claim(store: Store, batch: str, worker: str) -> JobSpec | None:
    """Take the batch's first pending job for ``worker`` (which holds at most one), or None."""
    return store.claim_job(batch, worker)


def heartbeat(store: Store, job_id: int, worker: str) -> bool:
    """Refresh the job's heartbeat; False if the worker no longer holds it."""
    return store.job_heartbeat(job_id, worker)


def finish(store: Store, job_id: int, worker: str, status: str = "done", message: str | None = None) -> bool:
    """Mark the job done (or failed) if ``worker`` still holds it; False if it does not."""
    return store.finish_job(job_id, worker, status, message)


def jobs(store: Store, batch: str) -> list[JobRecord]:
    return store.jobs(batch)


def trials_stored(store: Store, template: Template, hardware_id: str, keys: list[str]) -> dict[str, int]:
    """Trials stored per shape key of ``keys`` for the template's current version on GPUs of
    ``hardware_id``: what a sweep's progress and its Ctrl-C summary count."""
    return store.trials_per_key(template.name, template.version, hardware_id, keys)


class _Heartbeat:
    """Refreshes a job's heartbeat from a thread while the worker runs it."""

    def __init__(self, store: Store, job_id: int, worker: str, every_s: float) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(store, job_id, worker, every_s), daemon=True)

    def _run(self, store: Store, job_id: int, worker: str, every_s: float) -> None:
        while not self._stop.wait(every_s):
            try:
                heartbeat(store, job_id, worker)
            except TunesvcError:  # the database is away: the worker's own retry reports it
                pass

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def work(
    db: str,
    batch: str,
    *,
    worker: str | None = None,
    heartbeat_s: float = HEARTBEAT_S,
    stale_s: float = STALE_S,
    retry_s: float = RETRY_S,
    log: Callable[[str], None] | None = None,
    time_budget: float | None = None,
    patience: int | None = None,
    compile_workers: int | None = None,
    cores: int | None = None,
    isolate: bool | None = None,
    warm_index: int = 0,
    warm: _Warm | None = None,
) -> int:
    """Run the batch's jobs until none is pending or running; returns how many this worker finished.

    ``time_budget``, ``patience``, ``compile_workers`` and ``isolate`` go to each job's
    :func:`~tunesvc.tuning.sweep.run_sweep` (``workers`` there), as in a sweep without ``--gpus``;
    ``cores``: the host's CPU cores that this worker's compile pool may use by default (a share,
    where several workers run on one host).

    The worker stays warm across its jobs: one compile pool and one measuring process (on a
    GPU) serve them all, so their processes, CUDA contexts and loaded kernels are made once.
    Both start before the first claim, for the pending job ``warm_index`` places down the queue
    (the one this worker will likely get when its siblings claim at the same time), so that
    they warm up while the claim and the job's set-up run; ``warm``: those a worker started
    earlier still, for the job it expected before the batch was queued (``tune sweep --gpus``).

    A job whose sweep raises a TunesvcError (no feasible config, ...) is marked failed with its
    message; an unreachable database is retried with backoff (1, 2, 4 ... 30 s) for ``retry_s``.
    """
    worker = worker or f"{socket.gethostname()}:{os.getpid()}:gpu{settings.raw('CUDA_VISIBLE_DEVICES', '-')}"
    runner = _JobRunner(
        db,
        batch,
        worker,
        log or (lambda line: print(f"[{worker}] {line}", file=sys.stderr, flush=True)),
        heartbeat_s=heartbeat_s,
        stale_s=stale_s,
        sweep_options={"time_budget": time_budget, "patience": patience, "isolate": isolate},
        warm=warm or _Warm(compile_workers, cores, isolate),
        warm_index=warm_index,
    )
    backoff = _Backoff(retry_s, runner.log)
    try:
        while True:
            try:
                if not runner.step(backoff):
                    return runner.done
            except DatabaseUnavailable as exc:
                backoff.wait(exc)
            except BaseException as exc:
                # a bug or Ctrl-C: others need not wait for the heartbeat to go stale; a second
                # Ctrl-C (the command passes one on) must not cut the give-back short
                ignore = isinstance(exc, KeyboardInterrupt) and threading.current_thread() is threading.main_thread()
                previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if ignore else None
                try:
                    runner.give_back()
                finally:
                    if ignore:
                        signal.signal(signal.SIGINT, previous)
                raise
    finally:
        runner.close()


T = TypeVar("T")


def retrying(read: Callable[[], T], log: Callable[[str], None], retry_s: float = RETRY_S) -> T:
    """``read()``, tried again while the database is unreachable (a server restart, which the
    workers ride out the same way): 1, 2, 4 ... 30 s apart, each retry said to ``log``, giving up
    after ``retry_s``. A command whose workers finished reads their results through this, so that
    a connection lost meanwhile does not turn finished work into an error."""
    backoff = _Backoff(retry_s, log)
    while True:
        try:
            return read()
        except DatabaseUnavailable as exc:
            backoff.wait(exc)


class _Backoff:
    """Waits 1, 2, 4 ... 30 s between tries of an unreachable database, giving up after ``retry_s``."""

    def __init__(self, retry_s: float, log: Callable[[str], None]) -> None:
        self.retry_s = retry_s
        self.log = log
        self.reset()

    def reset(self) -> None:
        """The database answers again."""
        self.delay: float = 1.0
        self.down_since: float | None = None

    def wait(self, exc: DatabaseUnavailable) -> None:
        self.down_since = self.down_since or time.monotonic()
        if time.monotonic() - self.down_since > self.retry_s:
            raise TunesvcError(f"{exc}; gave up after {self.retry_s:.0f} s of retries.") from None
        self.log(f"{exc}; retrying in {self.delay:.0f} s")
        time.sleep(self.delay)
        self.delay = min(self.delay * 2, 30.0)


class _JobRunner:
    """One worker on a batch: claims a job, sweeps it, marks it done, and again."""

    def __init__(
        self,
        db: str,
        batch: str,
        worker: str,
        log: Callable[[str], None],
        *,
        heartbeat_s: float,
        stale_s: float,
        sweep_options: dict[str, Any],
        warm: _Warm,
        warm_index: int,
    ) -> None:
        self.db, self.batch, self.worker, self.log = db, batch, worker, log
        self.heartbeat_s, self.stale_s, self.sweep_options = heartbeat_s, stale_s, sweep_options
        self.store: Store | None = None
        self.held: JobSpec | None = None  # kept across a lost connection: the worker resumes its own job
        self.warm, self.warm_index = warm, warm_index  # its compile pool and measuring process, for all its jobs
        self.done = 0

    def step(self, backoff: _Backoff) -> bool:
        """Claim a job (or keep the one held) and run it; False once none is pending or running."""
        store = self.store = self.store or Store(self.db)
        mark("database open")
        if not self.warm.started:
            ahead = peek(store, self.batch, self.warm_index)
            if ahead is not None:
                self.warm.start(ahead)
        if self.held is None or not heartbeat(store, self.held.id, self.worker):
            release_stale(store, self.batch, self.stale_s)
            self.held = claim(store, self.batch, self.worker)
            if self.held is not None:
                mark("job claimed")
        backoff.reset()
        if self.held is None:
            if not any(j.status == "running" for j in jobs(store, self.batch)):
                return False
            time.sleep(min(self.heartbeat_s, 1.0))  # a running job comes back if its worker dies
            return True
        self._run(store, self.held)
        self.held = None
        return True

    def _run(self, store: Store, held: JobSpec) -> None:
        # the job row's name: shipped, an entry point, or the kernel this sweep's command named
        template = template_named_by_data(held.kernel, (settings.job_kernel(),))
        problem = template.problem(**held.problem)
        try:
            with _Heartbeat(store, held.id, self.worker, self.heartbeat_s):
                self.warm.start(held)
                [result] = run_sweep(
                    template,
                    [problem],
                    store,
                    strategy=held.strategy,
                    budget=held.budget,
                    seed=held.seed,
                    workers=self.warm.compile_workers,
                    compiler=self.warm.compiler,
                    measurer=self.warm.measurer,
                    **self.sweep_options,
                )
        except DatabaseUnavailable:
            raise
        except TunesvcError as exc:
            finish(store, held.id, self.worker, "failed", str(exc))
            self.log(f"failed {held.shape_key}: {exc}")
            return
        if finish(store, held.id, self.worker):
            self.done += 1
            best = f"{result.winner_ms:.4g} ms" if result.winner_ms else "no correct config"
            self.log(f"done {held.shape_key}: {best} ({result.trials_stored} trials, +{result.trials_new})")

    def give_back(self) -> None:
        if self.store is None:
            return
        try:
            # held, or claimed by a transaction that committed just before Ctrl-C cut its return
            ids = (
                [self.held.id]
                if self.held is not None
                else [j.id for j in jobs(self.store, self.batch) if j.status == "running" and j.worker == self.worker]
            )
            for job_id in ids:
                self.store.release_job(job_id, self.worker)
        except TunesvcError:  # the database is away too: the stale heartbeat releases it instead
            pass

    def close(self) -> None:
        self.warm.close()


def peek(store: Store, batch: str, offset: int = 0) -> JobSpec | None:
    """The batch's pending job ``offset`` places down the queue, without claiming it (see
    :meth:`~tunesvc.store.Store.peek_job`)."""
    return store.peek_job(batch, offset)


def planned_jobs(
    kernel: str, template: Template, problems: list[Problem], strategy: str, budget: int | None, seed: int
) -> list[JobSpec]:
    """The jobs :func:`enqueue` would add, in the order workers claim them (ids not yet known: 0)."""
    return [
        JobSpec(0, kernel, str(template.key(p)), dict(p), strategy, budget, seed)
        for p in sorted(problems, key=lambda p: _cost_rank(template, p), reverse=True)
    ]


class _Warm:
    """What a worker keeps across its jobs: its compile pool and its measuring process, started
    for the first job it sees (the batch's jobs share kernel, strategy and budget)."""

    def __init__(self, compile_workers: int | None, cores: int | None, isolate: bool | None) -> None:
        self.compile_workers, self.cores, self.isolate = compile_workers, cores, isolate
        self.started = False
        self.compiler: Compiler | None = None
        self.measurer: MeasuringProcess | None = None

    def start(self, job: JobSpec) -> None:
        if self.started:
            return
        # a job row's name (peeked from the queue) loads as the job's own does (see _JobRunner._run)
        template = template_named_by_data(job.kernel, (settings.job_kernel(),))
        problem = template.problem(**job.problem)
        self.started = True
        self.measurer = measuring_process(template, problem, isolate=self.isolate)
        self.compiler = compile_pool(
            template, problem, strategy=job.strategy, budget=job.budget, workers=self.compile_workers, cores=self.cores
        )
        # each job batches as many candidates as the pool holds; none: every job compiles in its own process
        self.compile_workers = self.compiler.workers if self.compiler is not None else 0
        mark("warm processes started")

    def close(self) -> None:
        if self.compiler is not None:
            self.compiler.close()
        if self.measurer is not None:
            self.measurer.close()


def worker_slots(gpus: str, gpu_count: int, jobs: int | None = None) -> list[str | None]:
    """``--gpus`` as one CUDA_VISIBLE_DEVICES value per worker ("all", or indices such as "0,1").

    Without a GPU each listed index is one interpreter worker (None: no CUDA_VISIBLE_DEVICES), so
    the same multi-worker path runs, and is tested, on a CPU-only machine; "all" is then one, and
    there are never more than the CPU cores. Never more workers than ``jobs``: each one starts
    by importing torch (seconds of a core), and one without a job would only exit.
    """
    slots = _listed_slots(gpus, gpu_count)
    if not gpu_count:
        slots = slots[: os.cpu_count() or 1]
    return slots[: max(jobs, 1)] if jobs is not None else slots


def _listed_slots(gpus: str, gpu_count: int) -> list[str | None]:
    text = gpus.strip().lower()
    if text == "all":
        return [str(i) for i in range(gpu_count)] if gpu_count else [None]
    items: list[str | None] = [s.strip() for s in text.split(",") if s.strip()]
    indices = [int(s) for s in items if s is not None and s.isascii() and s.isdigit()]
    if not items or len(indices) != len(items) or len(set(items)) != len(items):
        raise TunesvcError(f"--gpus takes 'all' or distinct GPU indices such as 0,1; got '{gpus}'.")
    if not gpu_count:
        return [None] * len(items)
    if max(indices) >= gpu_count:
        raise TunesvcError(f"--gpus {gpus} names a GPU this host lacks; it has {gpu_count} (0 to {gpu_count - 1}).")
    return items


def spawn_workers(
    db: str,
    batch: str | None,
    slots: list[str | None],
    *,
    stale_s: float = STALE_S,
    heartbeat_s: float = HEARTBEAT_S,
    time_budget: float | None = None,
    patience: int | None = None,
    compile_workers: int | None = None,
    first_jobs: list[JobSpec] | None = None,
    kernel: str | None = None,
) -> list[WorkerProcess]:
    """One worker process per slot, each seeing only its own GPU (see :func:`work`).

    Each worker's compile pool gets an equal share of the host's cores by default. With
    ``batch`` None, the workers start now and wait for :meth:`WorkerProcess.begin` to name the
    batch: a command starts them first and queues the jobs while they start. ``first_jobs``
    (:func:`planned_jobs`): a forked worker starts its compile pool and measuring process for job
    ``i`` of them (its index) before it knows the batch, since workers that start together claim
    the queue's first jobs in turn. ``kernel``, the name the sweep's command gave, goes to each
    worker's environment: the one module path a worker may import for a job row (see
    tunesvc.template.template_named_by_data).
    """
    argv = ["--stale-s", str(stale_s), "--heartbeat-s", str(heartbeat_s)]
    argv += ["--cores", str(max(1, (os.cpu_count() or 1) // max(1, len(slots))))]
    for flag, value in (("--time-budget", time_budget), ("--patience", patience), ("--workers", compile_workers)):
        if value is not None:
            argv += [flag, str(value)]
    processes = []
    for index, slot in enumerate(slots):
        env = {"TUNESVC_DB": db, "TUNESVC_TIMELINE_ROLE": "worker"}
        if kernel is not None:
            env[JOB_KERNEL_ENV] = kernel
        if slot is not None:
            env["CUDA_VISIBLE_DEVICES"] = slot
        first = first_jobs[index % len(first_jobs)] if first_jobs else None
        processes.append(WorkerProcess(env, [*argv, "--warm-index", str(index)], first))
        if batch is not None:
            processes[-1].begin(batch)
    return processes


#: the command's ends of its workers' start pipes: a worker forked later closes them all, so
#: that each worker sees EOF when the command exits without naming the batch
_start_ends: set[int] = set()


class WorkerProcess:
    """A worker started before its batch is known, waited on like a ``subprocess.Popen``.

    Forked from this process while it has not initialised CUDA (a fork starts in milliseconds
    with torch, triton and tunesvc imported, where a new interpreter takes seconds to import
    them); otherwise ``python -m tunesvc.fleet.jobs``, with the database URL in the environment, not
    the command line, where ``ps`` would show its password. Either way the worker reads its
    device and then waits on a pipe for the batch's name (:meth:`begin`); EOF instead (the
    command failed before queuing) ends it quietly.
    """

    def __init__(self, env: dict[str, str], argv: list[str], first_job: JobSpec | None = None) -> None:
        from tunesvc.device import can_fork_gpu_children

        read_end, start_end = os.pipe()
        self._start_end: int | None = start_end
        self._popen: subprocess.Popen | None = None
        self._process: Any = None  # a multiprocessing fork context's Process
        if can_fork_gpu_children():
            import multiprocessing

            _start_ends.add(start_end)
            self._process = multiprocessing.get_context("fork").Process(
                target=_forked_main, args=(read_end, env, argv, first_job), name="tunesvc-sweep-worker"
            )
            self._process.start()
            self.pid = self._process.pid
        else:
            self._popen = subprocess.Popen(
                [sys.executable, "-m", "tunesvc.fleet.jobs", "--batch", "-", *argv],
                env={**settings.environment(), **env},
                stdin=read_end,
            )
            self.pid = self._popen.pid
        os.close(read_end)

    @property
    def forked(self) -> bool:
        return self._process is not None

    def begin(self, batch: str) -> None:
        """Name the batch the worker runs (once)."""
        if self._start_end is None:
            return
        try:
            os.write(self._start_end, (batch + "\n").encode())
        except OSError:  # the worker is gone: its exit code tells
            pass
        self.abandon()

    def abandon(self) -> None:
        """Close the start pipe without a batch: a worker still waiting exits with status 0."""
        if self._start_end is not None:
            os.close(self._start_end)
            _start_ends.discard(self._start_end)
            self._start_end = None

    def poll(self) -> int | None:
        return self._popen.poll() if self._popen is not None else self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        if self._popen is not None:
            return self._popen.wait(timeout)
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(f"tunesvc.fleet.jobs worker {self.pid}", timeout or 0.0)
        return self._process.exitcode

    def interrupt(self) -> None:
        """Send the worker SIGINT, as Ctrl-C in a terminal would: it gives its job back and exits."""
        import signal

        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGINT)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        if self._popen is not None:
            self._popen.kill()
        else:
            self._process.kill()


def _forked_main(read_end: int, env: dict[str, str], argv: list[str], first_job: JobSpec | None) -> None:
    import torch  # imported by the command already: a fork has it

    import tunesvc.device

    set_role("worker")
    for end in _start_ends:  # the command's ends of the other workers' pipes
        try:
            os.close(end)
        except OSError:
            pass
    # one CPU thread, as the compile and measuring workers: GNU OpenMP's pool does not survive
    # fork, and a process that ran a parallel torch op before forking (a test's, a notebook's)
    # leaves its child hanging in its own first one
    torch.set_num_threads(1)
    os.environ.update(env)  # before this process initialises CUDA, which reads CUDA_VISIBLE_DEVICES
    tunesvc.device._current = None  # the command's device: this worker's GPU may be another model
    try:
        with os.fdopen(read_end) as start:
            code = _main(["--batch", "-", *argv], start=start, first_job=first_job)
    except KeyboardInterrupt:  # Ctrl-C reaches every process of the terminal's group: the command reports it
        code = 130
    except BaseException:  # a bug: its traceback, as any process's
        traceback.print_exc()
        code = 1
    # Exit here, not through multiprocessing's exit handler: that one joins this process's
    # children (the compile pool's) before the pool's own exit hook has told them to stop
    # (CPython runs it first in a forked child), and would wait on them forever. Everything is
    # closed by now; a pool worker still alive exits once this process is gone (start_worker).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _main(argv: list[str] | None = None, start: TextIO | None = None, first_job: JobSpec | None = None) -> int:
    """A worker process (started by `tune sweep --gpus`); its errors are one line and exit 1.

    ``--batch -``: read the batch's name from ``start`` (default: stdin) once the device is read
    and the compile pool and measuring process are started for ``first_job`` (if given); EOF
    there means the command gave up before queuing, and the worker exits 0.
    """
    mark("worker imports done")
    parser = argparse.ArgumentParser(prog="python -m tunesvc.fleet.jobs", description="Run a shared sweep's jobs.")
    parser.add_argument("--db", default=settings.db(), help="[default: $TUNESVC_DB]")
    parser.add_argument("--batch", required=True, help="the batch's name, or - to read it from stdin")
    parser.add_argument("--stale-s", type=float, default=STALE_S)
    parser.add_argument("--heartbeat-s", type=float, default=HEARTBEAT_S)
    parser.add_argument("--retry-s", type=float, default=RETRY_S)
    parser.add_argument("--time-budget", type=float, help="most seconds of search per job")
    parser.add_argument("--patience", type=int, help="stop a job after this many trials in a row without a 1%% gain")
    parser.add_argument("--workers", type=int, help="processes compiling candidates in parallel")
    parser.add_argument("--cores", type=int, help="CPU cores the compile pool may use by default [all]")
    parser.add_argument("--warm-index", type=int, default=0, help="which pending job to warm up for")
    args = parser.parse_args(argv)
    if not args.db:
        parser.error("give --db or set TUNESVC_DB")
    warm = _Warm(args.workers, args.cores, None)
    try:
        batch = args.batch
        if batch == "-":
            from tunesvc.device import fork_safe_current_device

            fork_safe_current_device()  # while the command queues the jobs
            mark("device read")
            if first_job is not None:
                warm.start(first_job)
            batch = (start or sys.stdin).readline().strip()
            if not batch:
                warm.close()
                return 0
            mark("batch received")
        work(
            args.db,
            batch,
            stale_s=args.stale_s,
            heartbeat_s=args.heartbeat_s,
            retry_s=args.retry_s,
            time_budget=args.time_budget,
            patience=args.patience,
            compile_workers=args.workers,
            cores=args.cores,
            warm_index=args.warm_index,
            warm=warm,
        )
    except TunesvcError as exc:
        print(f"Error: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:  # its running job went back to pending (work()); the command reports it
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(_main())
