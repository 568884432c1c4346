"""Compiling a captured key's candidates ahead, in worker processes, while this process measures them.

Triton holds the GIL while it compiles, hence processes: once a key has been measured for
PRECOMPILE_AFTER_S, and where what is left is worth PRECOMPILE_WORTH_S, workers
(:func:`compile_workers` of them) compile the candidates this process has not reached into
Triton's on-disk cache (:class:`_Precompile`, started by :func:`precompiled_configs`), each rebuilding
the kernel and its call from the record (:class:`RecordedKernel`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import TYPE_CHECKING
from typing import Any

import torch

from tunesvc import settings
from tunesvc._capture.bench import launch_listed
from tunesvc._capture.bench import tensors_of
from tunesvc._capture.failopen import STATS
from tunesvc._capture.identity import config_dict
from tunesvc._capture.recorded import find_autotuner
from tunesvc._capture.recorded import rebuild_call
from tunesvc.bench import pool_size
from tunesvc.errors import TunesvcError
from tunesvc.space import config_hash

if TYPE_CHECKING:
    from triton.runtime.autotuner import Autotuner

    from tunesvc._capture.sharing import State
    from tunesvc.device import Device
    from tunesvc.space import Config as ConfigDict


#: compile workers a captured key's candidates get at most (see :func:`precompiled_configs`)
MAX_COMPILE_WORKERS = 8
#: GPU memory counted for a compile worker beside its copy of the call's tensors: a margin for
#: its CUDA context with torch and Triton loaded (some hundreds of MB)
WORKER_CONTEXT_BYTES = 600 << 20


class RecordedKernel:
    """A captured kernel as a compile worker rebuilds it: imported by ``module:qualname``, its
    call rebuilt from the record (:func:`~tunesvc._capture.recorded.describe_call`), a listed config launched on it. What
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
    # half the cores: the program being served runs beside them (tunesvc.bench.pool_size, the one rule)
    cores = (os.cpu_count() or 1) // 2
    workers = pool_size(
        device, candidates - 1, workers=settings.compile_workers(), cores=cores, cap=MAX_COMPILE_WORKERS
    )
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
    candidates this process has not reached yet (see :func:`precompiled_configs`)."""

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
def precompiled_configs(
    tuner: Autotuner,
    state: State,
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
    call_bytes = sum(t.numel() * t.element_size() for t in tensors_of((args, kwargs)))
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
