"""The in-process measurer: :class:`Bench`.

Every candidate's output is compared with the template's torch reference *before* it is
timed, so a config that computes the wrong answer is recorded as ``wrong_result`` and can
never win. GPU timing: a kernel whose launches take ``GRAPH_BELOW_MS`` or more is timed by
``triton.testing.do_bench`` (CUDA events, warm-up, L2 flushed between repetitions, median and
20th/80th percentiles); a faster one, whose host launch cost would hide it, from a CUDA graph of
its calls over enough copies of the inputs that no call finds its inputs in L2
(:class:`GraphTimer`). Finalists are timed together (:meth:`Bench.time_together`): their graphs
replayed in turn, sample after sample, all queued before one wait, so that every one of them
runs under the same clocks and the GPU never idles between them. In the CPU interpreter, a few
wall-clock runs. Spread = (p80 - p20) / median; an ok measurement's message says how it was
timed (graph or events, L2 cold or warm, the SM clock seen).

That is the ``graph`` timing (the default): the GPU time of a kernel as a CUDA graph or a fused
program launches it. The ``eager`` timing (``Bench(..., timing="eager")``, `tune sweep --timing
eager`) times a program that launches kernel by kernel from Python: loops of ordinary launches
over the same input copies, the wall time of each loop up to its one synchronisation, so the
host's launch cost counts wherever it exceeds the kernel's (:class:`EagerTimer`); finalists'
loops take turns (:func:`sample_eager`), as their graphs do. In the interpreter, eager is plain
loops of launches timed by the wall clock.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

import torch
import triton
import triton.testing
from torch.utils._pytree import tree_leaves

from tunesvc import settings
from tunesvc.bench._base import FINALIST_ROUNDS
from tunesvc.bench._base import Measurement
from tunesvc.bench._base import Measurer
from tunesvc.bench._base import Status
from tunesvc.bench._base import one_line
from tunesvc.bench._base import relative_error
from tunesvc.settings import EAGER
from tunesvc.settings import GRAPH
from tunesvc.timeline import mark

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
#: a candidate's first timing from a graph lasts ten times this share of rep_ms (50 ms at the
#: default rep_ms), in samples of :data:`SAMPLE_MS`; finalists are then timed together for rep_ms
#: each (:meth:`Bench.time_together`). The first timing only sorts the candidates: an H100 running
#: GEMMs back to back sits at its 700 W power cap with its SM clock swinging between 1035 and
#: 1830 MHz, and one config's 10 ms replays ranged over 19% from one timing to the next, so the
#: winner is decided among the fastest timed side by side, under the same clocks
FIRST_GRAPH_SHARE = 0.05
#: one timing sample of a graph: its calls replayed once, about this long (at least one cycle
#: through the input copies); short enough that a timing holds tens of samples, long enough that
#: the gap between two replays is a small share of one
SAMPLE_MS = 2.0
#: most calls captured into one sample's graph (a kernel of a few microseconds)
MAX_GRAPH_CALLS = 4096
#: graph replays before a timing's samples are kept: the clocks settle under load, as do_bench's warm-up
WARMUP_MS = 10.0
#: the input sets a graph replay cycles through hold at least this many times the L2 cache
L2_MULTIPLE = 2
#: most input sets a graph replay cycles through (tiny inputs: some L2 hits remain)
MAX_INPUT_SETS = 64
#: the L2 size assumed where torch does not report it (the H100's)
DEFAULT_L2_BYTES = 50 * 2**20


#: one eager sample in the interpreter: a loop of this many launches (its samples: FINALIST_ROUNDS)
INTERPRETER_LOOP = 2


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
    own copy of the inputs), for about ``rep_ms`` after a warm-up; the ``quantiles`` in ms."""
    timer = GraphTimer(calls, estimate_ms(calls[0]))
    samples, _ = sample_together([timer], rep_ms)
    return quantiles_of(samples[0], quantiles)


def estimate_ms(fn: Callable[[], Any]) -> float:
    """One call's time from five launched back to back between two events, as
    ``do_bench_cudagraph`` estimates it: the host's launch time where that is longer."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    end.synchronize()
    return max(start.elapsed_time(end) / 5, 1e-4)


class GraphTimer:
    """``calls`` (each on its own copy of the inputs) taken in turn into one CUDA graph of about
    :data:`SAMPLE_MS` of GPU work, captured once and replayed for every sample.

    Written here, not with ``triton.testing.do_bench_cudagraph``: that one replays a single call
    (inputs that fit in L2 stay there: it times the cache, not a kernel reading memory as it
    does in a model), captures a new graph of rep_ms of calls at every timing (a host cost larger
    than the GPU time of a small kernel's), and cannot interleave two configs' replays.
    """

    def __init__(self, calls: Sequence[Callable[[], Any]], estimate: float) -> None:
        self.calls = list(calls)
        self.stream = torch.cuda.Stream()
        self._capture(self._count(estimate))
        # the estimate is the host's launch time for a kernel faster than it: size by the GPU's
        per_call = self.replay_ms() / self.count
        if self.count < MAX_GRAPH_CALLS and per_call * self.count < SAMPLE_MS / 2:
            self._capture(self._count(per_call))

    def _count(self, per_call_ms: float) -> int:
        cycle = len(self.calls)
        wanted = min(MAX_GRAPH_CALLS, math.ceil(SAMPLE_MS / max(per_call_ms, 1e-4)))
        return max(cycle, -(-wanted // cycle) * cycle)  # whole cycles through the input copies

    def _capture(self, count: int) -> None:
        self.count = count
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(self.stream):
            for call in self.calls:  # warm on the capture's stream, as do_bench_cudagraph does
                call()
            self.stream.synchronize()
            turn = itertools.cycle(self.calls)
            try:
                with torch.cuda.graph(self.graph, stream=self.stream):
                    for _ in range(count):
                        next(turn)()
            except Exception:
                _mend_generator()
                raise
        self.stream.synchronize()

    def replay_ms(self) -> float:
        """One replay's GPU time, waited for."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.stream):
            start.record()
            self.graph.replay()
            end.record()
        end.synchronize()
        return start.elapsed_time(end)


def _mend_generator() -> None:
    """After a capture that failed at its end (a call that launched on another stream, such as a
    backward by autograd whose forward ran there): torch skips its generator's capture epilogue
    then, which leaves the CUDA generator capturing, and every later torch.randn on the GPU raises
    "Offset increment outside graph capture" (the next problem's inputs could not be made). One
    small capture that ends well runs the epilogue again."""
    try:
        x = torch.zeros(1, device="cuda")
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream), torch.cuda.graph(torch.cuda.CUDAGraph(), stream=stream):
            x.add_(1)
        stream.synchronize()
    except Exception:  # a context past mending: context_lost finds it
        pass


def sample_together(timers: Sequence[GraphTimer], rep_ms: float) -> tuple[list[list[float]], int | None]:
    """Each timer's per-call times (ms), one a sample: the timers' graphs replayed in turn,
    :data:`WARMUP_MS` first and then about ``rep_ms`` of samples each, every replay queued on one
    stream before one wait, so that the GPU runs them back to back under the same clocks; and the
    SM clock seen meanwhile (MHz; None: NVML unavailable)."""
    if not timers:
        return [], None
    clock = None
    stream = timers[0].stream
    unit = sum(t.replay_ms() for t in timers)  # one turn through every timer, its graphs now loaded
    warmup = math.ceil(WARMUP_MS / max(unit, 1e-3))
    rounds = max(5, math.ceil(rep_ms * len(timers) / max(unit, 1e-3)))
    events: list[list[tuple[torch.cuda.Event, torch.cuda.Event]]] = [[] for _ in timers]
    with torch.cuda.stream(stream):
        for turn in range(warmup + rounds):
            for i, timer in enumerate(timers):
                if turn < warmup:
                    timer.graph.replay()
                    continue
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                timer.graph.replay()
                end.record()
                events[i].append((start, end))
            if turn == warmup + rounds // 2:
                clock = sm_clock_mhz()  # read while the GPU runs what is queued
    stream.synchronize()
    return [[s.elapsed_time(e) / timer.count for s, e in pairs] for timer, pairs in zip(timers, events)], clock


class EagerTimer:
    """``calls`` (each on its own copy of the inputs) launched in turn from Python, a loop of
    about :data:`SAMPLE_MS` (at least one cycle through the copies, at most
    :data:`MAX_GRAPH_CALLS` launches) per sample, ``sync`` once at its end: the loop's wall time
    over its launches is one call's time as a program that launches kernel by kernel sees it,
    the host's launch cost included where it is the longer. ``per_call_ms``: an estimate of one
    call's time, which sizes the loop; None: :data:`INTERPRETER_LOOP` launches (the interpreter)."""

    def __init__(self, calls: Sequence[Callable[[], Any]], sync: Callable[[], None], per_call_ms: float | None) -> None:
        self.calls = list(calls)
        self.sync = sync
        cycle = len(self.calls)
        if per_call_ms is None:
            count = max(cycle, INTERPRETER_LOOP)
        else:
            wanted = min(MAX_GRAPH_CALLS, math.ceil(SAMPLE_MS / max(per_call_ms, 1e-4)))
            count = max(cycle, -(-wanted // cycle) * cycle)
        self.count = count
        self.sequence = [self.calls[i % cycle] for i in range(count)]

    def loop_ms(self) -> float:
        """One loop's wall time per launch (ms), from the first launch to the synchronisation."""
        self.sync()  # what was queued before is not this loop's
        start = time.perf_counter()
        for call in self.sequence:
            call()
        self.sync()
        return (time.perf_counter() - start) * 1e3 / self.count


def eager_estimate_ms(fn: Callable[[], Any], sync: Callable[[], None]) -> float:
    """One call's wall time from five launched back to back and one synchronisation."""
    sync()
    start = time.perf_counter()
    for _ in range(5):
        fn()
    sync()
    return max((time.perf_counter() - start) * 1e3 / 5, 1e-4)


def sample_eager(timers: Sequence[EagerTimer], rep_ms: float, on_gpu: bool = True) -> list[list[float]]:
    """Each timer's per-call times (ms), one a loop: the timers' loops taking turns, so that every
    one runs under the same clocks as the others; on a GPU :data:`WARMUP_MS` of loops first and
    then about ``rep_ms`` of loops each (at least 5), in the interpreter :data:`FINALIST_ROUNDS`
    loops each (a launch there takes milliseconds of the CPU)."""
    if not timers:
        return []
    samples: list[list[float]] = [[] for _ in timers]
    if not on_gpu:
        for _ in range(FINALIST_ROUNDS):
            for i, timer in enumerate(timers):
                samples[i].append(timer.loop_ms())
        return samples
    unit = sum(t.loop_ms() * t.count for t in timers)  # one turn through every timer, warmed
    warmup = math.ceil(WARMUP_MS / max(unit, 1e-3))
    rounds = max(5, math.ceil(rep_ms * len(timers) / max(unit, 1e-3)))
    for turn in range(warmup + rounds):
        for i, timer in enumerate(timers):
            ms = timer.loop_ms()
            if turn >= warmup:
                samples[i].append(ms)
    return samples


def quantiles_of(times: Sequence[float], quantiles: Sequence[float]) -> list[float]:
    """The ``quantiles`` of ``times`` (linear interpolation, as torch.quantile's default)."""
    ordered = sorted(times)
    out = []
    for q in quantiles:
        pos = q * (len(ordered) - 1)
        low = math.floor(pos)
        high = min(low + 1, len(ordered) - 1)
        out.append(ordered[low] + (ordered[high] - ordered[low]) * (pos - low))
    return out


def sm_clock_mhz() -> int | None:
    """The current GPU's SM clock in MHz (NVML, through torch.cuda.clock_rate); None where NVML
    is not installed or refuses."""
    try:
        return int(torch.cuda.clock_rate())
    except Exception:  # no NVML library or driver support: the clock is left unsaid
        return None


def timing_note(method: str, l2_cold: bool, clock_mhz: int | None) -> str:
    """An ok measurement's message: how it was timed."""
    clock = f", SM {clock_mhz} MHz" if clock_mhz else ""
    return f"timed: {method}, L2 {'cold' if l2_cold else 'warm'}{clock}"


class Bench(Measurer):
    """Measures configs of one template on one problem, sharing inputs and the reference.

    Inputs are drawn fresh (random, never zeros) when the Bench is made; the reference is
    computed once from them.
    """

    def __init__(
        self,
        template: Template,
        problem: Problem,
        device: Device,
        *,
        rep_ms: float = settings.REP_MS,
        timing: str = GRAPH,
    ) -> None:
        if timing not in settings.TIMINGS:
            raise ValueError(f"timing {timing!r} is not one of {settings.TIMINGS}")
        self.template = template
        self.problem = problem
        self.device = device
        self.rep_ms = rep_ms
        self.timing = timing
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
            mark("first candidate launched")  # its compile (or Triton's cache) and first run
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
        mark("first candidate checked")
        timed = self._timed(self._launcher(config), rel_error=err)
        mark("first candidate timed")
        return timed

    def _launcher(self, config: Config):
        return lambda inputs: lambda: self.template.launch(inputs, config)

    def _timed(
        self, call_on, rel_error: float | None = None, rep_ms: float | None = None, graph_ms: float | None = None
    ) -> Measurement:
        """Time ``call_on(inputs)()`` into an OK measurement; one that raises while timed is an
        ERROR, not a crash."""
        try:
            rep_ms = rep_ms or self.rep_ms
            median, low, high, reps, note = self._time(call_on, rep_ms, graph_ms or rep_ms * FIRST_GRAPH_SHARE)
        except Exception as exc:
            return Measurement(Status.ERROR, rel_error=rel_error, message=f"{type(exc).__name__}: {one_line(exc)}")
        return Measurement(
            Status.OK, time_ms=median, spread=(high - low) / median, reps=reps, rel_error=rel_error, message=note
        )

    def _sync(self) -> None:
        if self.device.is_gpu:
            torch.cuda.synchronize()

    def time_only(self, config: Config, rep_ms: float | None = None, graph_ms: float | None = None) -> Measurement:
        """Re-time a config already checked by :meth:`measure` (a finalist): events for ``rep_ms``
        (default: the Bench's), and where it is timed from a CUDA graph, for ten times
        ``graph_ms`` (default: the Bench's rep_ms; see :data:`FIRST_GRAPH_SHARE`)."""
        return self._timed(self._launcher(config), rep_ms=rep_ms, graph_ms=graph_ms or self.rep_ms)

    def time_together(
        self, configs: Sequence[Config], rep_ms: float | None = None, rounds: int = FINALIST_ROUNDS
    ) -> list[Measurement]:
        """Configs already checked timed side by side: on a GPU, each one's graph (see
        :class:`GraphTimer`) replayed in turn with the others', about ``rep_ms`` (default: the
        Bench's) of samples each, all under the same clocks; where a graph cannot be captured
        (or in the interpreter), ``rounds`` round-robin rounds of :meth:`time_only`."""
        rep_ms = rep_ms or self.rep_ms
        if self.timing == EAGER and configs:
            return self._eager_together(configs, rep_ms, rounds)
        if not self.device.is_gpu or len(configs) < 1:
            return super().time_together(configs, rep_ms, rounds)
        try:
            timers = []
            for config in configs:
                call_on = self._launcher(config)
                calls = [call_on(inputs) for inputs in self.input_sets()]
                timers.append(GraphTimer(calls, estimate_ms(calls[0])))
            samples, clock = sample_together(timers, rep_ms)
        except Exception:  # a launch that cannot be captured: each config timed on its own, in rounds
            return super().time_together(configs, rep_ms, rounds)
        note = timing_note("graph, timed together", self._l2_cold(), clock)
        out = []
        for timer, times in zip(timers, samples):
            median, low, high = quantiles_of(times, [0.5, 0.2, 0.8])
            out.append(
                Measurement(
                    Status.OK, time_ms=median, spread=(high - low) / median, reps=timer.count * len(times), message=note
                )
            )
        return out

    def _eager_timer(self, call_on: Callable[[Any], Callable[[], Any]]) -> EagerTimer:
        """An :class:`EagerTimer` of ``call_on`` over the input copies, its loop sized on a GPU
        by five launches' wall time."""
        calls = [call_on(inputs) for inputs in self.input_sets()]
        estimate = eager_estimate_ms(calls[0], self._sync) if self.device.is_gpu else None
        return EagerTimer(calls, self._sync, estimate)

    def _eager_note(self, together: bool = False) -> str:
        if not self.device.is_gpu:
            return f"timed: eager{', timed together' if together else ''}, interpreter, wall clock"
        return timing_note("eager, timed together" if together else "eager", self._l2_cold(), sm_clock_mhz())

    def _eager_together(self, configs: Sequence[Config], rep_ms: float, rounds: int) -> list[Measurement]:
        """Eager finalists: each config's loops taking turns with the others' (:func:`sample_eager`);
        where a launch raises, each config timed on its own (its failure a status)."""
        try:
            timers = [self._eager_timer(self._launcher(config)) for config in configs]
            samples = sample_eager(timers, rep_ms, on_gpu=self.device.is_gpu)
        except Exception:  # a launch that fails now: each config timed alone, in rounds
            return super().time_together(configs, rep_ms, rounds)
        note = self._eager_note(together=True)
        out = []
        for timer, times in zip(timers, samples):
            median, low, high = quantiles_of(times, [0.5, 0.2, 0.8])
            out.append(
                Measurement(
                    Status.OK, time_ms=median, spread=(high - low) / median, reps=timer.count * len(times), message=note
                )
            )
        return out

    def _l2_cold(self) -> bool:
        """Whether the input copies a graph cycles through exceed the L2 cache (no call finds its inputs there)."""
        sets = self.input_sets()
        return input_bytes(self.inputs) * len(sets) >= l2_bytes()

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

    def _time(self, call_on, rep_ms: float, graph_ms: float) -> tuple[float, float, float, int, str]:
        """(median, p20, p80, repetitions, how it was timed) of ``call_on(inputs)()``: from a graph
        for ten times ``graph_ms`` where five launches take less than GRAPH_BELOW_MS each, else
        do_bench's events for ``rep_ms``; eager (:attr:`timing`): loops of launches for ten
        times ``graph_ms`` (:class:`EagerTimer`)."""
        if self.timing == EAGER:
            loops = self._eager_timer(call_on)
            [times] = sample_eager([loops], 10 * graph_ms, on_gpu=self.device.is_gpu)
            median, low, high = quantiles_of(times, [0.5, 0.2, 0.8])
            return median, low, high, loops.count * len(times), self._eager_note()
        fn = call_on(self.inputs)
        if self.device.is_gpu:
            estimate = estimate_ms(fn)
            if estimate < GRAPH_BELOW_MS:
                try:
                    timer = GraphTimer([fn] + [call_on(inputs) for inputs in self.input_sets()[1:]], estimate)
                    samples, clock = sample_together([timer], 10 * graph_ms)
                    times = samples[0]
                    median, low, high = quantiles_of(times, [0.5, 0.2, 0.8])
                    note = timing_note("graph", self._l2_cold(), clock)
                    return median, low, high, timer.count * len(times), note
                except Exception:  # a launch that cannot be captured keeps an event timing
                    pass
            median, low, high = triton.testing.do_bench(
                fn, warmup=min(25, rep_ms), rep=rep_ms, quantiles=[0.5, 0.2, 0.8]
            )
            # do_bench sizes its repetitions to fill rep_ms; this is that count
            return median, low, high, max(1, round(rep_ms / median)), timing_note("events", True, sm_clock_mhz())
        times = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        times.sort()
        return statistics.median(times), times[0], times[-1], len(times), "timed: interpreter, wall clock"
