"""One candidate config in, one :class:`Measurement` out, always with a status.

Every candidate's output is compared with the template's torch reference *before* it is
timed, so a config that computes the wrong answer is recorded as ``wrong_result`` and can
never win. GPU timing uses ``triton.testing.do_bench`` (CUDA events, warm-up, L2 flushed
between repetitions, median and 20th/80th percentiles), or, for a kernel faster than
``GRAPH_BELOW_MS``, launches replayed from a CUDA graph (:func:`graph_time`), so that the host's
launch cost does not hide the kernel, over enough copies of the inputs that no launch finds its
inputs in L2; in the CPU interpreter, a few wall-clock runs. Spread = (p80 - p20) / median.

A :class:`Worker` runs a Bench in a child process, one per GPU, so that a candidate that
faults, corrupts the CUDA context or hangs is recorded (``crash``, ``timeout``) and the child
is replaced while the sweep goes on.
"""

from __future__ import annotations

import os
import pickle
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING
from typing import Any

import torch

from tunesvc.errors import TunesvcError

if TYPE_CHECKING:
    from tunesvc.device import Device
    from tunesvc.space import Config
    from tunesvc.template import Problem
    from tunesvc.template import Template


class Status(StrEnum):
    OK = "ok"
    INVALID = "invalid"  # breaks a space constraint or does not fit the device
    COMPILE_ERROR = "compile_error"
    WRONG_RESULT = "wrong_result"
    ERROR = "error"  # raised while running
    CRASH = "crash"  # killed its measuring process (illegal memory access, a corrupted CUDA context)
    TIMEOUT = "timeout"  # did not finish within the measuring timeout


@dataclass
class Measurement:
    status: Status
    time_ms: float | None = None
    spread: float | None = None
    reps: int = 0
    rel_error: float | None = None
    message: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is Status.OK


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; a wrong shape, NaN or inf in the output gives inf."""
    out64, ref64 = out.detach().double(), ref.detach().double()
    if out64.shape != ref64.shape or not torch.isfinite(out64).all():
        return float("inf")
    return ((out64 - ref64).norm() / ref64.norm().clamp_min(1e-30)).item()


def _compile_error_types() -> tuple[type[BaseException], ...]:
    import triton

    types: list[type[BaseException]] = []
    for module, name in (("triton.compiler.errors", "CompilationError"), ("triton.compiler", "CompilationError")):
        cls = getattr(__import__(module, fromlist=[name]), name, None)
        if isinstance(cls, type):
            types.append(cls)
    return tuple(types) or (triton.CompilationError,)


def _out_of_resources_types() -> tuple[type[BaseException], ...]:
    try:
        from triton.runtime.errors import OutOfResources
    except ImportError:  # older or newer layouts
        return ()
    return (OutOfResources,)


#: below this median (ms), a kernel is re-timed from a CUDA graph. A Triton launch from Python
#: costs the host 30-100 us (measured on the H100 machine), two launches or an allocation more,
#: and when that exceeds do_bench's L2 flush the events time the host: split-K candidates of
#: 64x4096x4096, 18-20 us of GPU time, read 40-195 us that way on an H100.
GRAPH_BELOW_MS = 0.1
#: the input sets a graph replay cycles through hold at least this many times the L2 cache
L2_MULTIPLE = 2
#: most input sets a graph replay cycles through (tiny inputs: some L2 hits remain)
MAX_INPUT_SETS = 64
#: the L2 size assumed where torch does not report it (the H100's)
DEFAULT_L2_BYTES = 50 * 2**20


def input_bytes(inputs: Any) -> int:
    """Bytes of every tensor in ``inputs`` (a tensor, or tuples, lists and dicts of them)."""
    from torch.utils._pytree import tree_leaves

    leaves = tree_leaves(inputs)
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


def input_sets_needed(per_set: int, l2_bytes: int) -> int:
    """Copies of the inputs to cycle through so that together they exceed L2 ``L2_MULTIPLE`` times:
    each set is evicted by the others before it is used again."""
    return max(1, min(MAX_INPUT_SETS, -(-L2_MULTIPLE * l2_bytes // max(1, per_set))))


def l2_bytes() -> int:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return getattr(props, "L2_cache_size", 0) or DEFAULT_L2_BYTES


def graph_time(calls: list, rep_ms: float, quantiles: list[float]) -> list[float]:
    """GPU time of one call, replayed from a CUDA graph of ``calls`` taken in turn (each on its
    own copy of the inputs). Triton's ``do_bench_cudagraph`` replays one call back to back, so
    inputs that fit in L2 stay there and it times the cache, not a kernel reading memory as it
    does in a model; the cycle keeps that out. Returns the ``quantiles`` in ms."""
    import itertools

    import triton.testing

    turn = itertools.cycle(calls)
    times = triton.testing.do_bench_cudagraph(lambda: next(turn)(), rep=rep_ms, quantiles=quantiles)
    return list(times) if isinstance(times, (list, tuple)) else [times]  # one quantile: a float


class Bench:
    """Measures configs of one template on one problem, sharing inputs and the reference.

    Inputs are drawn fresh (random, never zeros) when the Bench is made; the reference is
    computed once from them.
    """

    def __init__(self, template: Template, problem: Problem, device: Device, *, rep_ms: float = 100.0) -> None:
        self.template = template
        self.problem = problem
        self.device = device
        self.rep_ms = rep_ms
        self.inputs: Any = template.make_inputs(problem, device)
        self.ref = template.reference(self.inputs)
        self.tolerance = template.tolerance(problem)
        self._input_sets: list[Any] | None = None

    def input_sets(self) -> list[Any]:
        """``inputs`` and fresh copies, enough to cycle through without L2 hits (made on first use)."""
        if self._input_sets is None:
            count = input_sets_needed(input_bytes(self.inputs), l2_bytes()) if self.device.is_gpu else 1
            self._input_sets = [self.inputs] + [
                self.template.make_inputs(self.problem, self.device) for _ in range(count - 1)
            ]
        return self._input_sets

    def measure(self, config: Config) -> Measurement:
        broken = self.template.violations(config, self.problem, self.device)
        if broken:
            return Measurement(Status.INVALID, message=f"breaks constraint {', '.join(broken)}")
        try:
            out = self.template.launch(self.inputs, config)
            self._sync()
        except _out_of_resources_types() as exc:
            return Measurement(Status.INVALID, message=_one_line(exc))
        except _compile_error_types() as exc:
            return Measurement(Status.COMPILE_ERROR, message=_one_line(exc))
        except Exception as exc:  # a candidate's failure is data, not a crash of the sweep
            return Measurement(Status.ERROR, message=f"{type(exc).__name__}: {_one_line(exc)}")
        err = relative_error(out, self.ref)
        if not err <= self.tolerance:
            return Measurement(
                Status.WRONG_RESULT, rel_error=err, message=f"relative error {err:.3g} > {self.tolerance:g}"
            )
        return self._timed(self._launcher(config), rel_error=err)

    def _launcher(self, config: Config):
        return lambda inputs: lambda: self.template.launch(inputs, config)

    def _timed(self, call_on, rel_error: float | None = None, rep_ms: float | None = None) -> Measurement:
        """Time ``call_on(inputs)()`` into an OK measurement; one that raises while timed is an
        ERROR, not a crash."""
        try:
            median, low, high, reps = self._time(call_on, rep_ms or self.rep_ms)
        except Exception as exc:
            return Measurement(Status.ERROR, rel_error=rel_error, message=f"{type(exc).__name__}: {_one_line(exc)}")
        return Measurement(Status.OK, time_ms=median, spread=(high - low) / median, reps=reps, rel_error=rel_error)

    def _sync(self) -> None:
        if self.device.is_gpu:
            torch.cuda.synchronize()

    def time_only(self, config: Config, rep_ms: float | None = None) -> Measurement:
        """Time a config already checked by :meth:`measure` (a finalist's re-measurement), for
        ``rep_ms`` (default: the Bench's)."""
        return self._timed(self._launcher(config), rep_ms=rep_ms)

    def time_peer(self) -> Measurement:
        """Time the template's torch peer (``Template.peer``) on these inputs, as a candidate is timed.

        Not checked against the reference: the peer is torch's own op, and only its time is kept.
        INVALID when the template has no peer; ERROR when it raises.
        """
        try:
            run = self.template.peer(self.inputs)
            if run is None:
                return Measurement(Status.INVALID, message=f"{self.template.name} has no torch peer")
            run()  # the first call pays for torch's lazy set-up (cuBLAS handles, kernel selection)
            self._sync()
        except Exception as exc:  # a failing peer costs the report a number, never the sweep
            return Measurement(Status.ERROR, message=f"{type(exc).__name__}: {_one_line(exc)}")
        return self._timed(lambda inputs: run if inputs is self.inputs else self.template.peer(inputs))

    def _time(self, call_on, rep_ms: float) -> tuple[float, float, float, int]:
        fn = call_on(self.inputs)
        if self.device.is_gpu:
            import triton.testing

            median, low, high = triton.testing.do_bench(
                fn, warmup=min(25, rep_ms), rep=rep_ms, quantiles=[0.5, 0.2, 0.8]
            )
            if median < GRAPH_BELOW_MS:
                try:
                    calls = [fn] + [call_on(inputs) for inputs in self.input_sets()[1:]]
                    # the graph is replayed 10 times, each replay its rep: 10x rep_ms in all
                    # (1 s a candidate at the default) unless divided
                    median, low, high = graph_time(calls, rep_ms / 10, [0.5, 0.2, 0.8])
                except Exception:  # a launch that cannot be captured keeps its event timing
                    pass
            # do_bench sizes its repetitions to fill rep_ms; this is that count
            return median, low, high, max(1, round(rep_ms / median))
        times = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        times.sort()
        return statistics.median(times), times[0], times[-1], len(times)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[-1] if text else type(exc).__name__)[:500]


class Compiler:
    """Compiles candidates in parallel, in worker processes, before they are measured.

    Each worker launches a config once on its own copy of the inputs: Triton compiles it and
    keeps the binary in its on-disk cache, where the measuring process then finds it. The
    process that owns the timings never waits on the compiler for more than a cache load.
    Written on concurrent.futures because Triton offers no public batch-compile API across
    versions 3.2-3.9; a worker that hangs past ``timeout_s`` is left to the pool's shutdown.

    The workers start in a background thread (a forkserver that imports torch and triton takes
    seconds), each reading the device and, given ``template`` and ``problem``, making that
    problem's inputs, so that all of it overlaps the caller's own set-up.
    """

    def __init__(
        self,
        workers: int,
        timeout_s: float = 120.0,
        *,
        template: Template | None = None,
        problem: Problem | None = None,
    ) -> None:
        self.workers = workers
        self.timeout_s = timeout_s
        #: how many times the pool was replaced after a worker died or hung
        self.restarts = 0
        self._warm_up = (template, problem)
        self._pool = self._new_pool()

    def _new_pool(self):
        import threading
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(
            self.workers, mp_context=_context(), initializer=_start_worker, initargs=(os.getpid(),)
        )
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

    def compile(self, template: Template, problem: Problem, configs: list[Config]) -> dict[int, str | None]:
        """Launch each config once in the pool; index -> None, or the error it raised."""
        return dict(self.compile_each(template, problem, configs))

    def compile_each(
        self, template: Template, problem: Problem, configs: list[Config]
    ) -> Iterator[tuple[int, str | None]]:
        """Launch each config once in the pool, yielding (index, outcome) as each is done, in the
        order they finish (outcome: None, or the error it raised); so the caller measures a
        candidate while the later ones compile, and never waits on a slow one while others are ready.

        A worker that dies (a candidate faulted and poisoned its CUDA context) breaks the pool,
        and one that hangs past ``timeout_s`` (counted from the batch's submission) blocks a
        slot: either way the pool is replaced after the batch, so later batches still compile in
        parallel.
        """
        # submit() is thread-safe: the first candidates go to the first workers started
        return self._outcomes([self._pool.submit(_compile_in_worker, template, problem, c) for c in configs])

    def _outcomes(self, futures: list) -> Iterator[tuple[int, str | None]]:
        from concurrent.futures import FIRST_COMPLETED
        from concurrent.futures import wait
        from concurrent.futures.process import BrokenProcessPool

        index = {future: i for i, future in enumerate(futures)}
        pending = set(futures)
        deadline = time.monotonic() + self.timeout_s
        replace = False
        try:
            while pending:
                done, pending = wait(
                    pending, timeout=max(0.0, deadline - time.monotonic()), return_when=FIRST_COMPLETED
                )
                if not done:  # the deadline passed with these still compiling (or queued behind them)
                    for future in sorted(pending, key=index.__getitem__):
                        yield index[future], f"compile timeout after {self.timeout_s:g} s"
                    replace = True
                    return
                for future in sorted(done, key=index.__getitem__):
                    try:
                        outcome = future.result()
                    except BrokenProcessPool as exc:
                        outcome = f"compile worker died: {_one_line(exc)}"
                        replace = True
                    except Exception as exc:
                        outcome = f"{type(exc).__name__}: {_one_line(exc)}"
                    yield index[future], outcome
        finally:
            if replace:
                self._kill()
                self._pool = self._new_pool()
                self.restarts += 1

    def _kill(self) -> None:
        # ProcessPoolExecutor cannot stop a worker that hangs (Python < 3.14 has no
        # terminate_workers); its private process table is the only handle on them
        self._starting.join()
        for process in list(getattr(self._pool, "_processes", {}).values()):
            process.kill()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        self._starting.join()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Compiler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _context():
    """The process context of compile and measuring workers: fork while this process has not
    initialised CUDA (a sweep reads its device with
    :func:`~tunesvc.device.fork_safe_current_device`), so a worker starts in milliseconds with
    everything imported; the forkserver once it has. The children never touch the parent's
    database connections and end with ``os._exit``, so fork leaves those alone."""
    import multiprocessing

    from tunesvc.device import can_fork_gpu_children

    return multiprocessing.get_context("fork") if can_fork_gpu_children() else _forkserver()


def _forkserver():
    """The process context of workers started from a process that has initialised CUDA.

    A forkserver, not fork: a child forked from a process that has touched CUDA cannot use the
    GPU. The server imports torch, triton and tunesvc with its kernels once (none of them
    initialises CUDA on import), so each worker starts in milliseconds instead of importing them
    again (seconds, and sixteen compile workers doing it at once contend for the cores).
    """
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "triton", "triton.language", "tunesvc.kernels"])
    return context


_worker_inputs: dict[str, Any] = {}


def start_forkserver(wait: bool = False) -> None:
    """Start the process server of compile and measuring workers now.

    Sweeps use it only from a process that has initialised CUDA (one that has not forks its
    workers itself). Its imports (torch, triton, tunesvc: seconds) then overlap the caller's own
    work instead of holding up the first compile: a long-lived process that uses the GPU and
    will sweep later (a notebook, a serving process that tunes on a miss) can start it at
    start-up. With ``wait``, return once the server can fork a worker.
    """
    from multiprocessing import forkserver

    context = _forkserver()
    forkserver.ensure_running()
    if wait:  # the server forks its first child only after its imports
        child = context.Process(target=int)
        child.start()
        child.join()


def _start_worker(owner: int) -> None:
    """What a worker (compile or measuring) does first: use one CPU thread, and exit once ``owner``
    (the sweep's process) is gone.

    One thread: GNU OpenMP's thread pool does not survive fork, and a child forked after its
    parent ran a parallel torch CPU op hangs in its own first one (as in torch's DataLoader
    workers; the GPU does the work here). The watch: neither kind of worker can count on EOF when
    a sweep is killed with SIGKILL: a pool worker waits on a queue whose writer it holds itself
    (and one from the forkserver has the server, which lives on, for parent), and a forked
    measuring worker may share its pipe's other end with workers forked after it. Without it they
    would never exit. A poll, because a forkserver's child is not the owner's (no PDEATHSIG).
    """
    import threading

    torch.set_num_threads(1)

    def watch() -> None:
        while True:
            time.sleep(1.0)
            try:
                os.kill(owner, 0)
            except ProcessLookupError:
                os._exit(1)

    threading.Thread(target=watch, name="tunesvc-owner-watch", daemon=True).start()


def _warm_worker(template: Template | None = None, problem: Problem | None = None) -> None:
    import tunesvc.kernels  # noqa: F401  (the import is the warm-up)

    if template is not None and problem is not None:
        _inputs(template, problem)  # the device's context and the inputs, before the first candidate


def _inputs(template: Template, problem: Problem) -> Any:
    """This worker's copy of the problem's inputs (one problem at a time: they can be large)."""
    from tunesvc.device import current_device

    key = repr(sorted(problem.items()))
    if key not in _worker_inputs:
        _worker_inputs.clear()
        _worker_inputs[key] = template.make_inputs(problem, current_device())
    return _worker_inputs[key]


def _compile_in_worker(template: Template, problem: Problem, config: Config) -> str | None:
    from tunesvc.device import current_device

    device = current_device()
    inputs = _inputs(template, problem)
    try:
        template.launch(inputs, config)
        if device.is_gpu:
            torch.cuda.synchronize()
    except Exception as exc:  # measured again, and classified, by the timing process
        message = f"{type(exc).__name__}: {_one_line(exc)}"
        if device.is_gpu and _context_lost(message):
            os._exit(1)  # this worker's CUDA context is unusable: the Compiler replaces the pool
        return message
    return None


#: how long a Worker's child may take to start and make its inputs and reference
STARTUP_TIMEOUT_S = 300.0
#: what a CUDA error that leaves the process's context unusable says (torch re-raises the driver's text)
_CONTEXT_LOST = (
    "illegal memory access",
    "unspecified launch failure",
    "misaligned address",
    "device-side assert",
    "CUDA error",
    "illegal instruction",
)


class Worker:
    """A :class:`Bench` in a child process, replaced whenever a candidate kills or hangs it.

    One per GPU: the child makes its own inputs and reference and answers one request at a
    time. The parent waits at most ``timeout_s`` for each answer. No answer is a ``timeout``
    (the child is killed); a child that dies (a segfault, ``os._exit``, the driver killing it)
    or reports a CUDA error that poisons its context is a ``crash``. Either way the next
    request starts a fresh child and the sweep goes on. Written on multiprocessing because a
    CUDA context belongs to a process: only a process boundary contains a kernel that faults.
    """

    def __init__(
        self, template: Template, problem: Problem, device: Device, *, timeout_s: float = 60.0, rep_ms: float = 100.0
    ) -> None:
        self.template = template
        self.problem = problem
        self.device = device
        self.timeout_s = timeout_s
        self.rep_ms = rep_ms
        #: how many children were replaced after a crash or a timeout
        self.restarts = 0
        self._process = None
        self._conn = None
        self._ready = False
        self._start()  # the child makes its inputs while the caller compiles the first candidates

    def measure(self, config: Config) -> Measurement:
        return self._request("measure", config)

    def time_only(self, config: Config, rep_ms: float | None = None) -> Measurement:
        return self._request("time", config, rep_ms)

    def time_peer(self) -> Measurement:
        return self._request("peer", None)

    def wait_ready(self) -> None:
        """Wait until the child has made its inputs and reference (TunesvcError if it cannot)."""
        if self._process is None:
            self._start()
        if not self._ready:
            self._wait_ready()

    def _request(self, kind: str, config: Config | None, rep_ms: float | None = None) -> Measurement:
        self.wait_ready()
        try:
            self._conn.send((kind, config, rep_ms))
            if self._conn.poll(self.timeout_s):
                measurement = self._conn.recv()
                if measurement.status is Status.CRASH:  # the child exits after saying so
                    self._replace()
                return measurement
        except (EOFError, OSError):  # the pipe broke: the child is gone
            pass
        else:
            self._replace()
            return Measurement(
                Status.TIMEOUT, message=f"no result within {self.timeout_s:g} s; measuring process replaced"
            )
        code = self._replace()
        return Measurement(Status.CRASH, message=f"measuring process died (exit code {code}); replaced")

    def _start(self) -> None:
        context = _context()
        self._conn, child = context.Pipe()
        payload = pickle.dumps((self.template, self.problem, self.rep_ms))
        # a forked child also holds this end (fork copies every descriptor): it closes its copy
        # and watches this process, since EOF no longer tells it that the parent is gone
        forked = context.get_start_method() == "fork"
        self._process = context.Process(
            target=_worker_main,
            args=(child, payload, list(sys.path), os.getpid(), self._conn if forked else None),
            daemon=True,
        )
        self._process.start()
        child.close()
        self._ready = False

    def _wait_ready(self) -> None:
        # making the inputs and the reference is not a candidate's time: it has its own, long wait
        try:
            ready = self._conn.poll(max(self.timeout_s, STARTUP_TIMEOUT_S)) and self._conn.recv() == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            self._stop(grace_s=0.0)
            raise TunesvcError(
                f"The measuring process for {self.template.name} did not start; run the sweep with isolate=False to see why."
            )
        self._ready = True

    def _replace(self) -> int | None:
        """Stop the child (killing it if it does not exit at once); the next request starts one."""
        code = self._stop(grace_s=1.0)
        self.restarts += 1
        return code

    def _stop(self, grace_s: float) -> int | None:
        if self._process is None:
            return None
        process, self._process = self._process, None
        self._conn.close()
        process.join(grace_s)
        if process.is_alive():
            process.kill()
            process.join()
        return process.exitcode

    def close(self) -> None:
        if self._process is not None:
            try:  # said, not left to EOF: processes forked since (compile workers) hold this end too
                self._conn.send(("stop", None, None))
            except OSError:
                pass
        self._stop(grace_s=5.0)

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _worker_main(conn, payload: bytes, path: list[str], owner: int, parent_end=None) -> None:
    """The child of a :class:`Worker`: a Bench answering (kind, config, rep_ms) requests until told
    to stop, EOF, or ``owner`` exiting (kind: measure, time, or peer, which has no config)."""
    if parent_end is not None:
        parent_end.close()
    _start_worker(owner)
    sys.path[:] = path  # the template may live in a module only the parent's path reaches (a test's)
    import tunesvc  # noqa: F401  (sets TRITON_INTERPRET where there is no GPU, before triton runs)
    from tunesvc.device import current_device

    template, problem, default_rep_ms = pickle.loads(payload)
    bench = Bench(template, problem, current_device(), rep_ms=default_rep_ms)
    conn.send("ready")
    while True:
        try:
            kind, config, rep_ms = conn.recv()
        except EOFError:
            return
        if kind == "stop":
            return
        if kind == "measure":
            m = bench.measure(config)
        elif kind == "peer":
            m = bench.time_peer()
        else:
            m = bench.time_only(config, rep_ms)
        if bench.device.is_gpu and not m.ok and _context_lost(m.message):
            conn.send(Measurement(Status.CRASH, message=m.message))
            conn.close()
            os._exit(1)  # the CUDA context is unusable: no clean-up can run on it
        conn.send(m)


def _context_lost(message: str | None) -> bool:
    if message and any(text in message for text in _CONTEXT_LOST):
        return True
    try:  # a fault can surface at the next call rather than in the candidate's own
        torch.cuda.synchronize()
        (torch.ones(1, device="cuda") + 1).item()
    except Exception:
        return True
    return False
