"""One candidate config in, one :class:`Measurement` out, always with a status.

Every candidate's output is compared with the template's torch reference *before* it is
timed, so a config that computes the wrong answer is recorded as ``wrong_result`` and can
never win. GPU timing uses ``triton.testing.do_bench`` (CUDA events, warm-up, L2 flushed
between repetitions, median and 20th/80th percentiles); in the CPU interpreter, a few
wall-clock runs. Spread = (p80 - p20) / median.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING
from typing import Any

import torch

if TYPE_CHECKING:
    from tunesvc.device import Device
    from tunesvc.space import Config
    from tunesvc.template import Problem
    from tunesvc.template import Template


class Status(str, Enum):
    OK = "ok"
    INVALID = "invalid"  # breaks a space constraint or does not fit the device
    COMPILE_ERROR = "compile_error"
    WRONG_RESULT = "wrong_result"
    ERROR = "error"  # raised while running


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
        try:
            median, low, high, reps = self._time(lambda: self.template.launch(self.inputs, config))
        except Exception as exc:
            return Measurement(Status.ERROR, rel_error=err, message=f"{type(exc).__name__}: {_one_line(exc)}")
        return Measurement(Status.OK, time_ms=median, spread=(high - low) / median, reps=reps, rel_error=err)

    def _sync(self) -> None:
        if self.device.is_gpu:
            torch.cuda.synchronize()

    def _time(self, fn) -> tuple[float, float, float, int]:
        if self.device.is_gpu:
            import triton.testing

            median, low, high = triton.testing.do_bench(fn, warmup=25, rep=self.rep_ms, quantiles=[0.5, 0.2, 0.8])
            # do_bench sizes its repetitions to fill rep_ms; this is that count
            return median, low, high, max(1, round(self.rep_ms / median))
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
    """

    def __init__(self, workers: int, timeout_s: float = 120.0) -> None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        self.workers = workers
        self.timeout_s = timeout_s
        # A forkserver, not fork: a child forked from a process that has touched CUDA cannot use
        # the GPU. The server imports torch and triton once (neither initialises CUDA on import),
        # so each worker starts in milliseconds instead of re-importing them like a spawn would.
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["torch", "triton", "triton.language"])
        self._pool = ProcessPoolExecutor(workers, mp_context=context)
        # start every worker now, importing tunesvc's kernels, while the caller makes its inputs
        self._warming = [self._pool.submit(_warm_worker) for _ in range(workers)]

    def compile(self, template: Template, problem: Problem, configs: list[Config]) -> dict[int, str | None]:
        """Launch each config once in the pool; index -> None, or the error it raised."""
        from concurrent.futures import TimeoutError as FutureTimeout

        futures = [self._pool.submit(_compile_in_worker, template, problem, c) for c in configs]
        outcome: dict[int, str | None] = {}
        for i, future in enumerate(futures):
            try:
                outcome[i] = future.result(timeout=self.timeout_s)
            except FutureTimeout:
                outcome[i] = f"compile timeout after {self.timeout_s:g} s"
            except Exception as exc:  # the worker died (e.g. killed by the driver)
                outcome[i] = f"{type(exc).__name__}: {_one_line(exc)}"
        return outcome

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Compiler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_worker_inputs: dict[str, Any] = {}


def _warm_worker() -> None:
    import tunesvc.kernels  # noqa: F401  (the import is the warm-up)


def _compile_in_worker(template: Template, problem: Problem, config: Config) -> str | None:
    from tunesvc.device import current_device

    device = current_device()
    key = repr(sorted(problem.items()))
    if key not in _worker_inputs:
        _worker_inputs.clear()  # one problem's inputs at a time: they can be large
        _worker_inputs[key] = template.make_inputs(problem, device)
    try:
        template.launch(_worker_inputs[key], config)
        if device.is_gpu:
            torch.cuda.synchronize()
    except Exception as exc:  # measured again, and classified, by the timing process
        return f"{type(exc).__name__}: {_one_line(exc)}"
    return None
