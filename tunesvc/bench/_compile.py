"""Compiling candidates in parallel, in worker processes, ahead of their measurement: :class:`Compiler`."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED
from concurrent.futures import Future
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import wait
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING
from typing import Any
from typing import Protocol

import torch

from tunesvc._processes import worker_pool
from tunesvc.bench._base import context_lost
from tunesvc.bench._base import one_line
from tunesvc.device import current_device
from tunesvc.serving.launch import use_static_launcher
from tunesvc.timeline import mark
from tunesvc.timeline import set_role

if TYPE_CHECKING:
    from tunesvc.device import Device
    from tunesvc.space import Config
    from tunesvc.template import Problem


def pool_size(
    device: Device, most: int | None, *, workers: int | None = None, cores: int | None = None, cap: int
) -> int:
    """How many processes compile candidates while one process measures them, for a sweep and a
    captured key alike: ``workers`` where the caller was given a number (0: none); else none off a
    GPU (the interpreter compiles nothing) and on a GPU one per core of ``cores`` (default: the
    host's), at most ``cap``; never more than ``most`` (the candidates a worker could take; None:
    no bound)."""
    if workers is None:
        if not device.is_gpu:
            return 0
        workers = min(cap, cores if cores is not None else os.cpu_count() or 1)
    if most is not None:
        workers = min(workers, most)
    return max(workers, 0)


class Launchable(Protocol):
    """What a compile worker needs of a kernel: a template, or a captured kernel rebuilt from its
    recorded call (tunesvc._capture.RecordedKernel)."""

    def make_inputs(self, problem: Problem, device: Device) -> Any: ...

    def launch(self, inputs: Any, config: Config) -> Any: ...


#: :meth:`Compiler.compile_each`'s outcome for a config handed to the caller to compile itself
CALLER = "compiled by the caller"


class Compiler:
    """Compiles candidates in parallel, in worker processes, before they are measured.

    Each worker launches a config once on its own copy of the inputs: Triton compiles it and
    keeps the binary in its on-disk cache, where the measuring process then finds it. The
    process that owns the timings never waits on the compiler for more than a cache load.
    Written on concurrent.futures because Triton offers no public batch-compile API across
    versions 3.2-3.9; a worker that hangs past ``timeout_s`` is left to the pool's shutdown.

    The workers start in a background thread (a forkserver that imports torch and triton takes
    seconds), each reading the device and, given ``template`` and ``problem``, making that
    problem's inputs, so that all of it overlaps the caller's own set-up. With ``start`` False
    they start at :meth:`start` (or the first :meth:`submit`) instead: a sweep measures and
    stores its first candidate before its pool's workers take the host's cores and the
    driver's context creation.
    """

    def __init__(
        self,
        workers: int,
        timeout_s: float = 120.0,
        *,
        template: Launchable | None = None,
        problem: Problem | None = None,
        forkserver: bool = False,
        start: bool = True,
    ) -> None:
        self.workers = workers
        self._forkserver = forkserver  # workers from the forkserver even where this process could fork them
        self.timeout_s = timeout_s
        #: how many times the pool was replaced after a worker died or hung
        self.restarts = 0
        self._warm_up = (template, problem)
        self._pool: ProcessPoolExecutor | None = None
        self._starting: threading.Thread | None = None
        self._lock = threading.Lock()
        if start:
            self.start()

    @property
    def started(self) -> bool:
        """Whether the pool's worker processes have been started."""
        return self._pool is not None

    def start(self) -> None:
        """Start the pool's worker processes (once; :meth:`submit` starts them if this was not called)."""
        with self._lock:  # submit() may be called from several threads
            if self._pool is None:
                self._pool = self._new_pool()
                mark("compile pool started", workers=self.workers)

    def _new_pool(self) -> ProcessPoolExecutor:
        pool = worker_pool(self.workers, self._forkserver)
        # submit() starts a worker process and blocks until it is forked (by this process or the forkserver)
        self._starting = threading.Thread(target=self._start_workers, args=(pool,), daemon=True)
        self._starting.start()
        return pool

    def _start_workers(self, pool) -> None:
        try:
            for _ in range(self.workers):
                pool.submit(_warm_worker, *self._warm_up)
        except RuntimeError:  # the pool broke (a candidate killed its worker) or closed: compile() reports it
            pass

    def compile(self, template: Launchable, problem: Problem, configs: list[Config]) -> dict[int, str | None]:
        """Launch each config once in the pool; index -> None, or the error it raised."""
        return dict(self.compile_each(template, problem, configs))

    def compile_each(
        self, template: Launchable, problem: Problem, configs: list[Config], *, spare: bool = False
    ) -> Iterator[tuple[int, str | None]]:
        """Launch each config once in the pool, yielding (index, outcome) as each is done, in the
        order they finish (outcome: None, or the error it raised); so the caller measures a
        candidate while the later ones compile, and never waits on a slow one while others are ready.

        With ``spare``, until the pool finishes a compile not handed out yet, the last config not
        handed out is yielded at once with outcome :data:`CALLER`, for the caller to compile
        itself (a measuring process compiles a config at its first launch): while a new pool's
        workers start (seconds: a CUDA context each, then Triton's first compile in each), the
        GPU is then not left idle. Such a config's compile in the pool is waited for and not
        reported.

        A worker that dies (a candidate faulted and poisoned its CUDA context) breaks the pool,
        and one that hangs past ``timeout_s`` (counted from the batch's submission) blocks a
        slot: either way the pool is replaced after the batch, so later batches still compile in
        parallel.
        """
        return self._outcomes(self.submit(template, problem, configs), spare=spare)

    def submit(self, template: Launchable, problem: Problem, configs: list[Config]) -> list[Future]:
        """Launch each config once in the pool: a future per config, of None or the error it raised."""
        # submit() is thread-safe: the first candidates go to the first workers started
        self.start()
        pool = self._pool
        assert pool is not None
        return [pool.submit(_compile_in_worker, template, problem, c) for c in configs]

    def _outcomes(self, futures: list, spare: bool = False) -> Iterator[tuple[int, str | None]]:
        index = {future: i for i, future in enumerate(futures)}
        pending = set(futures)
        unhanded = list(range(len(futures)))  # the caller's own picks come from its end
        deadline = time.monotonic() + self.timeout_s
        replace = False
        try:
            while pending:
                done: set = set()
                if spare and unhanded:
                    done, pending = wait(pending, timeout=0, return_when=FIRST_COMPLETED)
                    spare = not any(index[f] in unhanded for f in done)  # on until the pool hands one over
                    if spare:
                        yield unhanded.pop(), CALLER  # nothing compiled to hand: the caller compiles one
                        if not done:
                            continue
                if not done:
                    done, pending = wait(
                        pending, timeout=max(0.0, deadline - time.monotonic()), return_when=FIRST_COMPLETED
                    )
                if not done:  # the deadline passed with these still compiling (or queued behind them)
                    for future in sorted(pending, key=index.__getitem__):
                        if index[future] in unhanded:
                            yield index[future], f"compile timeout after {self.timeout_s:g} s"
                    replace = True
                    return
                for future in sorted(done, key=index.__getitem__):
                    if index[future] not in unhanded:  # the caller compiled it itself
                        if isinstance(future.exception(), BrokenProcessPool):
                            replace = True
                        continue
                    unhanded.remove(index[future])
                    try:
                        outcome = future.result()
                    except BrokenProcessPool as exc:
                        outcome = f"compile worker died: {one_line(exc)}"
                        replace = True
                    except Exception as exc:
                        outcome = f"{type(exc).__name__}: {one_line(exc)}"
                    yield index[future], outcome
        finally:
            if replace:
                self._kill()
                self._pool = self._new_pool()
                self.restarts += 1

    def _kill(self) -> None:
        # ProcessPoolExecutor cannot stop a worker that hangs (Python < 3.14 has no
        # terminate_workers); its private process table is the only handle on them
        if self._pool is None or self._starting is None:
            return
        self._starting.join()
        for process in list(getattr(self._pool, "_processes", {}).values()):
            process.kill()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        if self._pool is None or self._starting is None:  # never started: no process to stop
            return
        self._starting.join()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Compiler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_worker_inputs: dict[str, Any] = {}


def _warm_worker(template: Launchable | None = None, problem: Problem | None = None) -> None:
    """A worker's first task: starting it, and unpickling the template, imports what the
    compiles need (the forkserver has preloaded tunesvc's kernels; a forked worker has the
    parent's modules)."""
    set_role("compile")
    mark("compile worker started")
    if template is not None and problem is not None:
        _inputs(template, problem)  # the device's context and the inputs, before the first candidate
    mark("compile worker warm")


def _inputs(template: Launchable, problem: Problem) -> Any:
    """This worker's copy of the problem's inputs (one problem at a time: they can be large; the
    memory of the one before goes back to the device, so that a pool compiling many problems in
    turn, as `tune adopt`'s does, holds one problem's inputs per worker, not its largest)."""
    key = repr(sorted(problem.items()))
    if key not in _worker_inputs:
        if _worker_inputs:
            _worker_inputs.clear()
            if torch.cuda.is_initialized():
                torch.cuda.empty_cache()
        _worker_inputs[key] = template.make_inputs(problem, current_device())
    return _worker_inputs[key]


def _compile_in_worker(template: Launchable, problem: Problem, config: Config) -> str | None:
    use_static_launcher(False)  # a compile launches once: the static launcher's import would cost it seconds
    device = current_device()
    inputs = _inputs(template, problem)
    try:
        template.launch(inputs, config)
        if device.is_gpu:
            torch.cuda.synchronize()
        mark("first compile in a worker")
    except Exception as exc:  # measured again, and classified, by the timing process
        message = f"{type(exc).__name__}: {one_line(exc)}"
        if device.is_gpu and context_lost(message):
            os._exit(1)  # this worker's CUDA context is unusable: the Compiler replaces the pool
        return message
    return None
