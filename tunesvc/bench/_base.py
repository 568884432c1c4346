"""The measuring protocol: :class:`Measurer`, and the :class:`~tunesvc.records.Measurement` it returns."""

from __future__ import annotations

import abc
import statistics
from collections.abc import Mapping
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any
from typing import TypeVar

import numpy as np
import torch

from tunesvc.records import Measurement as Measurement
from tunesvc.records import Status as Status

if TYPE_CHECKING:
    from tunesvc.device import Device
    from tunesvc.space import Config
    from tunesvc.template import Problem
    from tunesvc.template import Template


#: rounds of a finalist's re-timing where the measurer cannot interleave finer (Measurer.time_together)
FINALIST_ROUNDS = 3


class Measurer(abc.ABC):
    """Measures configs of one template on one problem, on one device: the sweep's one interface
    to timing, whichever process the candidates run in.

    Life cycle: made for (template, problem, device), a measurer draws the problem's inputs
    (random, never zeros) and computes the template's reference from them once, now or in the
    background (:meth:`wait_ready` waits for it). Then any number of calls, each returning a
    :class:`Measurement` with a status and never raising for a candidate's failure:

    * :meth:`measure` checks a config against the space's constraints and the device, runs it,
      compares its output with the reference (``wrong_result`` if it differs: a wrong config can
      never win) and only then times it;
    * :meth:`time_only` re-times a config already checked, and :meth:`time_together` several
      side by side under the same clocks (the finalists);
    * :meth:`time_peer` times the template's torch peer on the same inputs.

    :meth:`close` releases what the measurer holds (a child process); a measurer is also a
    context manager. Implementations: :class:`~tunesvc.bench.Bench` (in this process),
    :class:`~tunesvc.bench.Worker` (in a child process that a crashing or hanging candidate
    cannot take down with the sweep) and capture's ``CaptureBench`` (a captured
    ``triton.autotune`` kernel's listed configs on one call's own arguments, its reference the
    first valid config's output).

    The rules every measurer keeps (``tests/test_measurer_contract.py`` runs them over each one):

    * **Failures are statuses**: a candidate that breaks a constraint, does not compile, raises
      or crashes is a Measurement (INVALID, COMPILE_ERROR, ERROR, CRASH, TIMEOUT) with a
      one-line message and no time; only the measurer's own set-up may raise (TunesvcError).
    * **Checked, then timed**: OK carries ``time_ms`` > 0, ``reps`` >= 1, ``spread`` >= 0, the
      ``rel_error`` it passed with and a ``message`` saying how it was timed ("timed: ..."); an
      output off the reference by more than the tolerance is WRONG_RESULT with that
      ``rel_error`` and no time.
    * **Same inputs for every candidate**: what one candidate writes into its inputs is undone
      before the next (a captured call's tensors are restored before each); measuring a config
      again gives the same status, whatever was measured between.
    * **Goes on after a failure**: a failing candidate does not change how the next is measured.
    * **Peer**: :meth:`time_peer` is INVALID where there is no torch peer, never an exception.
    * **Close**: :meth:`close` may be called more than once.
    """

    template: Template
    problem: Problem
    device: Device
    rep_ms: float
    #: graph | eager (tunesvc.settings.TIMINGS): how an OK candidate is timed (see tunesvc.bench.Bench)
    timing: str = "graph"

    @abc.abstractmethod
    def measure(self, config: Config) -> Measurement:
        """Check ``config`` against the reference, then time it."""

    @abc.abstractmethod
    def time_only(self, config: Config, rep_ms: float | None = None, graph_ms: float | None = None) -> Measurement:
        """Time a config already checked by :meth:`measure`, for ``rep_ms`` (default: the
        measurer's); where it is timed from a CUDA graph, each of the ten replays lasts
        ``graph_ms`` (default: the measurer's rep_ms, longer than a first timing's)."""

    def time_together(
        self, configs: Sequence[Config], rep_ms: float | None = None, rounds: int = FINALIST_ROUNDS
    ) -> list[Measurement]:
        """Configs already checked by :meth:`measure`, timed side by side under the same clocks
        for about ``rep_ms`` each (default: the measurer's): one measurement per config, in
        order. Here, ``rounds`` round-robin rounds of :meth:`time_only` of rep_ms / ``rounds``
        each, combined by :func:`combined_rounds`; a Bench on a GPU interleaves graph replays."""
        timings = timed_in_rounds(self, dict(enumerate(configs)), rep_ms or self.rep_ms, rounds)
        return [combined_rounds(timings[i]) for i in range(len(configs))]

    @abc.abstractmethod
    def time_peer(self) -> Measurement:
        """Time the template's torch peer (``Template.peer``) on these inputs, as a candidate is
        timed; INVALID when the template has none."""

    # optional hooks, not abstract: a Bench has nothing to wait for or release
    def wait_ready(self) -> None:  # noqa: B027
        """Wait until the inputs and the reference exist (TunesvcError if they cannot be made)."""

    def close(self) -> None:  # noqa: B027
        """Release what the measurer holds; it may not be used afterwards."""

    def __enter__(self) -> Measurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


K = TypeVar("K")


def timed_in_rounds(
    measurer: Measurer,
    configs: Mapping[K, Any],
    rep_ms: float,
    rounds: int = FINALIST_ROUNDS,
    graph_ms: float | None = None,
) -> dict[K, list[Measurement]]:
    """Each config (checked before) timed ``rounds`` times, round-robin, each time for rep_ms /
    ``rounds`` (``Measurer.time_only``, graph replays of ``graph_ms``): every config under the
    same clocks and temperatures as the others, as far as whole timings can interleave."""
    timings: dict[K, list[Measurement]] = {key: [] for key in configs}
    for _ in range(rounds):
        for key, config in configs.items():
            timings[key].append(measurer.time_only(config, rep_ms / rounds, graph_ms))
    return timings


def combined_rounds(rounds: Sequence[Measurement]) -> Measurement:
    """One config's rounds as one measurement: the first failure, else the median of their
    times, the range of them over it as the spread, and every round's repetitions."""
    failed = next((m for m in rounds if not m.ok), None)
    if failed is not None:
        return failed
    times = sorted(m.time_ms or 0.0 for m in rounds)
    median = statistics.median(times)
    return Measurement(
        Status.OK,
        time_ms=median,
        spread=(times[-1] - times[0]) / median,
        reps=sum(m.reps for m in rounds),
        message=rounds[0].message if rounds else None,
    )


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 over the finite values; inf for a wrong shape, or where
    a NaN or inf in either is not the same value at the same place in the other (a row that is
    all masked may rightly give -inf, in every config alike).

    Computed by torch on the tensors' device, or by numpy on the host where that raises: a
    library may have put its own kernels under torch's device ops (FlagGems' ``use_gems`` and
    ``enable`` replace the CUDA kernels of norm, sub and many others, and its norm refuses
    float64), and numpy is outside torch's dispatcher.
    """
    if out.shape != ref.shape:
        return float("inf")
    try:
        out64, ref64 = out.detach().double(), ref.detach().double()
        finite = torch.isfinite(out64)
        if not bool(finite.all()) or not bool(torch.isfinite(ref64).all()):
            same = (out64 == ref64) | (torch.isnan(out64) & torch.isnan(ref64))
            if not torch.equal(finite, torch.isfinite(ref64)) or not bool(same[~finite].all()):
                return float("inf")
            out64, ref64 = out64[finite], ref64[finite]
        return ((out64 - ref64).norm() / ref64.norm().clamp_min(1e-30)).item()
    except Exception:  # an op replaced by a library refused: the host's arithmetic is numpy's
        return _host_relative_error(out, ref)


def _host_relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    # the copy to the host is torch's own even under FlagGems (it hands device changes back)
    out64 = out.detach().to("cpu", torch.float64).numpy()
    ref64 = ref.detach().to("cpu", torch.float64).numpy()
    finite = np.isfinite(out64)
    if not finite.all() or not np.isfinite(ref64).all():
        same = (out64 == ref64) | (np.isnan(out64) & np.isnan(ref64))
        if not np.array_equal(finite, np.isfinite(ref64)) or not same[~finite].all():
            return float("inf")
        out64, ref64 = out64[finite], ref64[finite]
    return float(np.linalg.norm(out64 - ref64) / max(float(np.linalg.norm(ref64)), 1e-30))


def one_line(exc: BaseException) -> str:
    """An exception's last line (where Triton and torch put the cause), at most 500 characters."""
    text = str(exc).strip().splitlines()
    return (text[-1] if text else type(exc).__name__)[:500]


#: what a CUDA error that leaves the process's context unusable says (torch re-raises the driver's text)
CONTEXT_LOST = (
    "illegal memory access",
    "unspecified launch failure",
    "misaligned address",
    "device-side assert",
    "CUDA error",
    "illegal instruction",
)


def context_lost(message: str | None) -> bool:
    """Whether this process's CUDA context is unusable after a failure that said ``message``:
    also where its random numbers are (a CUDA graph capture that failed at its end, as one of a
    backward by autograd on another stream does, leaves torch's CUDA generator capturing, and every
    later torch.randn on the GPU raises, so that the next problem's inputs cannot be made)."""
    if message and any(text in message for text in CONTEXT_LOST):
        return True
    try:  # a fault can surface at the next call rather than in the candidate's own
        torch.cuda.synchronize()
        (torch.ones(1, device="cuda") + 1).item()
        torch.randn(1, device="cuda")
    except Exception:
        return True
    return False
