"""The in-process measurer: :class:`Bench`.

Every candidate's output is compared with the template's torch reference *before* it is
timed, so a config that computes the wrong answer is recorded as ``wrong_result`` and can
never win. GPU timing uses ``triton.testing.do_bench`` (CUDA events, warm-up, L2 flushed
between repetitions, median and 20th/80th percentiles), or, for a kernel faster than
``GRAPH_BELOW_MS``, launches replayed from a CUDA graph (:func:`graph_time`), so that the host's
launch cost does not hide the kernel, over enough copies of the inputs that no launch finds its
inputs in L2; in the CPU interpreter, a few wall-clock runs. Spread = (p80 - p20) / median.
"""

from __future__ import annotations

import itertools
import statistics
import time
from typing import TYPE_CHECKING
from typing import Any

import torch
import triton
import triton.testing
from torch.utils._pytree import tree_leaves

from tunesvc import settings
from tunesvc.bench._base import Measurement
from tunesvc.bench._base import Measurer
from tunesvc.bench._base import Status
from tunesvc.bench._base import one_line
from tunesvc.bench._base import relative_error

if TYPE_CHECKING:
    from tunesvc.device import Device
    from tunesvc.space import Config
    from tunesvc.template import Problem
    from tunesvc.template import Template


def compile_error_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = []
    for module, name in (("triton.compiler.errors", "CompilationError"), ("triton.compiler", "CompilationError")):
        cls = getattr(__import__(module, fromlist=[name]), name, None)
        if isinstance(cls, type):
            types.append(cls)
    return tuple(types) or (triton.CompilationError,)


def out_of_resources_types() -> tuple[type[BaseException], ...]:
    try:
        from triton.runtime.errors import OutOfResources
    except ImportError:  # older or newer layouts
        return ()
    return (OutOfResources,)


#: below this median (ms), a kernel is re-timed from a CUDA graph. A Triton launch from Python
#: costs the host 30-100 us (measured on the H100 machine), two launches or an allocation more,
#: and when that exceeds do_bench's L2 flush the events time the host: split-K candidates of
#: 64x4096x4096, 18-20 us of GPU time, read 40-195 us that way on an H100 (a 22 us decode
#: candidate of two launches 33-54 us, a 52 us one 56 us). The threshold sits well above any
#: launch path's host time, so that the two timings agree near it: a host slowed by the sweep's
#: own compile workers can carry a fast candidate's event reading past a threshold set near the
#: host's time, and that candidate would keep the host's time while slower ones are graph-timed.
GRAPH_BELOW_MS = 1.0
#: a candidate's first timing replays its CUDA graph ten times, each replay this share of rep_ms
#: long (100 ms in all at the default rep_ms); a finalist's replays last rep_ms each (1 s in all).
#: An H100 running GEMMs back to back sits at its 700 W power cap with its SM clock swinging
#: between 1035 and 1830 MHz: one config's 10 ms replays ranged over 19% from one timing to the
#: next (57.6-68.5 us at 200x8192x8192 bf16), its 100 ms replays over 3%, and sweeps' winners of
#: compute-bound GEMMs took 3-11% longer over 100 ms replays than their first timings said. So
#: the short replays sort the candidates, and the long ones decide the winner among the fastest.
FIRST_GRAPH_SHARE = 0.1
#: the input sets a graph replay cycles through hold at least this many times the L2 cache
L2_MULTIPLE = 2
#: most input sets a graph replay cycles through (tiny inputs: some L2 hits remain)
MAX_INPUT_SETS = 64
#: the L2 size assumed where torch does not report it (the H100's)
DEFAULT_L2_BYTES = 50 * 2**20


def input_bytes(inputs: Any) -> int:
    """Bytes of every tensor in ``inputs`` (a tensor, or tuples, lists and dicts of them)."""
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

    turn = itertools.cycle(calls)
    times = triton.testing.do_bench_cudagraph(lambda: next(turn)(), rep=rep_ms, quantiles=quantiles)
    return list(times) if isinstance(times, (list, tuple)) else [times]  # one quantile: a float


class Bench(Measurer):
    """Measures configs of one template on one problem, sharing inputs and the reference.

    Inputs are drawn fresh (random, never zeros) when the Bench is made; the reference is
    computed once from them.
    """

    def __init__(
        self, template: Template, problem: Problem, device: Device, *, rep_ms: float = settings.REP_MS
    ) -> None:
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
        except out_of_resources_types() as exc:
            return Measurement(Status.INVALID, message=one_line(exc))
        except compile_error_types() as exc:
            return Measurement(Status.COMPILE_ERROR, message=one_line(exc))
        except Exception as exc:  # a candidate's failure is data, not a crash of the sweep
            return Measurement(Status.ERROR, message=f"{type(exc).__name__}: {one_line(exc)}")
        err = relative_error(out, self.ref)
        if not err <= self.tolerance:
            return Measurement(
                Status.WRONG_RESULT, rel_error=err, message=f"relative error {err:.3g} > {self.tolerance:g}"
            )
        return self._timed(self._launcher(config), rel_error=err)

    def _launcher(self, config: Config):
        return lambda inputs: lambda: self.template.launch(inputs, config)

    def _timed(
        self, call_on, rel_error: float | None = None, rep_ms: float | None = None, graph_ms: float | None = None
    ) -> Measurement:
        """Time ``call_on(inputs)()`` into an OK measurement; one that raises while timed is an
        ERROR, not a crash."""
        try:
            rep_ms = rep_ms or self.rep_ms
            median, low, high, reps = self._time(call_on, rep_ms, graph_ms or rep_ms * FIRST_GRAPH_SHARE)
        except Exception as exc:
            return Measurement(Status.ERROR, rel_error=rel_error, message=f"{type(exc).__name__}: {one_line(exc)}")
        return Measurement(Status.OK, time_ms=median, spread=(high - low) / median, reps=reps, rel_error=rel_error)

    def _sync(self) -> None:
        if self.device.is_gpu:
            torch.cuda.synchronize()

    def time_only(self, config: Config, rep_ms: float | None = None, graph_ms: float | None = None) -> Measurement:
        """Re-time a config already checked by :meth:`measure` (a finalist): events for ``rep_ms``
        (default: the Bench's), and where it is timed from a CUDA graph, replays that each last
        ``graph_ms`` (default: the Bench's rep_ms; see :data:`FIRST_GRAPH_SHARE`)."""
        return self._timed(self._launcher(config), rep_ms=rep_ms, graph_ms=graph_ms or self.rep_ms)

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
            return Measurement(Status.ERROR, message=f"{type(exc).__name__}: {one_line(exc)}")
        # timed as the finalists are, since a sweep's report divides the winner's time by it
        return self._timed(
            lambda inputs: run if inputs is self.inputs else self.template.peer(inputs), graph_ms=self.rep_ms
        )

    def _time(self, call_on, rep_ms: float, graph_ms: float) -> tuple[float, float, float, int]:
        fn = call_on(self.inputs)
        if self.device.is_gpu:
            median, low, high = triton.testing.do_bench(
                fn, warmup=min(25, rep_ms), rep=rep_ms, quantiles=[0.5, 0.2, 0.8]
            )
            if median < GRAPH_BELOW_MS:
                try:
                    calls = [fn] + [call_on(inputs) for inputs in self.input_sets()[1:]]
                    # the graph is replayed 10 times, each replay graph_ms long
                    median, low, high = graph_time(calls, graph_ms, [0.5, 0.2, 0.8])
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
