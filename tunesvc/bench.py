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
