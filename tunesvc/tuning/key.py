"""One key's tuning: measure the candidates, check them, re-time the finalists, store the trials and the winner.

The sweep (:mod:`tunesvc.tuning.sweep`), capture's key tuning (``tunesvc._capture.tune``), the
cross-measure (:mod:`tunesvc.tuning.selector_measure`) and ``tune verify`` (:mod:`tunesvc.verify`)
each tune a key through one :class:`KeyTuning`, so each of these decisions is made here once:

* **measured and checked**: each candidate goes through :meth:`Measurer.measure
  <tunesvc.bench.Measurer.measure>`, which checks its output against the reference before it
  times it, so a wrong config has no time and cannot win; the order is the caller's (the sweep
  measures each candidate as it finishes compiling, capture as its precompile is ready);
* **stored**: every measurement is a trial of the key, in one transaction per batch; a config
  stored before keeps its trial, or, where the caller re-measures (``replace``), takes the new
  measurement;
* **re-timed**: the finalists, by the one rule of :class:`Finalists`, together with the answer
  the key is served today (``served``: the selector's pick, the nearest tuned key's winner, a
  sibling GPU's, the heuristic, or the stored winner), so that the winner has beaten what it
  replaces under the same clocks;
* **the winner**: the fastest correct trial (:meth:`KeyTuning.finish`), and the served answer's
  re-timed measurement beside it in :class:`KeyOutcome` (each with its spread), where a rule
  that stores a winner only when it is not slower than what it replaces, and a tie rule, belong.

Where callers differ, it is a parameter:

* ``finalists`` (:class:`Finalists`): how many of the fastest are re-timed, and the window of the
  fastest's first time they must be within (None for the sweep, whose ``finalists`` fastest are
  all re-timed; :data:`IN_PROCESS`'s 5% for capture, which spends long replays only where they can
  change the answer).
* capture's first pass (:data:`FIRST_PASS_SHARE`, :data:`IN_PROCESS`): inside a user's process,
  with the in-process measurer, under the key claim, each candidate's first timing is a quarter
  of the replay length and the finalists replay shorter graphs, because the program waits for
  its tuning as it waits for triton.autotune's.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any

from tunesvc.bench import FINALIST_ROUNDS
from tunesvc.bench import FIRST_GRAPH_SHARE
from tunesvc.bench import Measurement
from tunesvc.bench import Status
from tunesvc.bench import timed_in_rounds
from tunesvc.space import config_hash

if TYPE_CHECKING:
    from tunesvc.bench import Measurer
    from tunesvc.device import Device
    from tunesvc.records import TrialRecord as Trial
    from tunesvc.records import WinnerRecord
    from tunesvc.space import Config
    from tunesvc.store import Store

#: how many of the fastest trials a key's finalists take by default on a GPU (none in the
#: interpreter, whose timings are of the CPU and whose re-timing would change no answer that matters)
FINALISTS = 3

#: each candidate's first timing of a captured key is this share of the replay length (rep:
#: triton.autotune's ``rep``, else settings.REP_MS); the finalists are then re-timed over the
#: whole of it, with any candidate whose first time beats theirs. triton.autotune spends its whole
#: rep on every config, and the program waits for capture's tuning as for Triton's: the short
#: first pass is what keeps a captured first run no slower than one without capture
FIRST_PASS_SHARE = 0.25
#: a captured key's finalists replay graphs of rep_ms / 30 (3.3 ms at the default), not an offline
#: sweep's rep_ms (100 ms): the program's first call waits for them, and the long replays would add
#: about 8 s a key to it (nine rounds at the 0.85 s a round and config a sweep's long replays took on
#: an H100), where a captured GEMM's first call took 8.9-9.4 s, triton.autotune's 6.1-7.1 s
#: (benchmarks/results/capture.csv)
CAPTURE_FINALIST_GRAPH_SHARE = FIRST_GRAPH_SHARE / 3
#: capture's finalists: those whose first time is within 5% of the fastest's, at most FINALISTS
CAPTURE_WINDOW = 0.05


@dataclass(frozen=True)
class Finalists:
    """The one finalist rule: after the first pass, the ``count`` fastest correct trials whose
    first time is within ``window`` (a fraction) of the fastest's, and the trials of the configs
    kept (the answer the key is served today), are re-timed round-robin in ``rounds`` rounds of
    rep_ms / ``rounds`` each (``rep_ms``: default the measurer's; ``graph_ms``: each graph
    replay's length, default ``Measurer.time_only``'s), and each keeps the median of its rounds
    and their spread; then any trial whose first time is below the fastest finalist's new one is
    re-timed beside it, until none is. Nothing is re-timed where fewer than two trials qualify.

    Interleaving puts every finalist under the same clocks and temperatures, so a config whose
    first measurement was lucky falls back before it can be declared the winner. A finalist's
    rounds are timed longer than a first measurement, and a GPU at its power cap times a
    compute-bound kernel slower over a long replay than over a short one (see
    ``tunesvc.bench.FIRST_GRAPH_SHARE``): the chase after the rounds makes the winner
    (the fastest correct trial) one timed as every trial that could beat it. A finalist that fails
    now (a crash, a timeout) keeps that status and cannot win.

    Re-timing starts wherever two trials qualify, a kept served answer counted: re-timed beside
    the fastest, even with a count of one, it keeps a winner from being slower than what it
    replaces. The count and the window are the caller's: the sweep's count with no window (every
    one of its fastest re-timed), capture's within 5% (long replays spent only where they can
    change the answer, since the program waits for them), the cross-measure's one (a new
    candidate re-timed only where it beats the stored winner it is kept beside).
    """

    count: int
    window: float | None = None
    rep_ms: float | None = None
    graph_ms: float | None = None
    rounds: int = FINALIST_ROUNDS

    def contenders(self, times: Iterable[float | None]) -> int:
        """How many of these first times (None: failed) the count and the window admit."""
        ok = sorted(t for t in times if t is not None)
        if not ok:
            return 0
        within = ok if self.window is None else [t for t in ok if t <= ok[0] * (1 + self.window)]
        return min(self.count, len(within))

    def chosen(self, rows: Sequence[Trial], keep: Iterable[str] = ()) -> list[Trial]:
        """The finalists of ``rows`` before the chase: the contenders, fastest first, then the
        trials of the configs hashed in ``keep`` among the others that ran correctly."""
        ok = _fastest_first(rows)
        keep = set(keep)
        n = self.contenders(r.time_ms for r in ok)
        return ok[:n] + [r for r in ok[n:] if r.config_hash in keep]

    def retime(
        self, measurer: Measurer, rows: Sequence[Trial], keep: Iterable[str] = ()
    ) -> list[tuple[int, Measurement]]:
        """Re-time the finalists of ``rows`` (a key's trials) and the trials of the configs hashed
        in ``keep``; each one's new measurement, by trial id."""
        ok = _fastest_first(rows)
        batch = self.chosen(rows, keep)
        if len(batch) < 2:
            return []
        rep_ms = self.rep_ms if self.rep_ms is not None else measurer.rep_ms
        timings: dict[int, list[Measurement]] = {}
        results: dict[int, Measurement] = {}
        while batch:
            configs = {r.id: r.config for r in batch}
            for i, measured in timed_in_rounds(measurer, configs, rep_ms, self.rounds, self.graph_ms).items():
                timings.setdefault(i, []).extend(measured)
            for row in batch:
                results[row.id] = _finalist_result(row, timings[row.id])
            timed = [(m.time_ms, i) for i, m in results.items() if m.ok and m.time_ms is not None]
            if not timed:
                break
            best_ms, best_id = min(timed)
            faster = [r for r in ok if r.id not in results and (r.time_ms or 0.0) < best_ms]
            batch = [next(r for r in ok if r.id == best_id), *faster] if faster else []
        return list(results.items())


def default_finalists(
    device: Device, count: int | None = None, window: float | None = None, rep_ms: float | None = None
) -> Finalists:
    """A sweep's finalists: the ``count`` fastest (default :data:`FINALISTS` on a GPU, none in
    the interpreter) within ``window`` of the fastest (default: whatever their distance), each
    re-timed for ``rep_ms`` (default: the measurer's)."""
    return Finalists((FINALISTS if device.is_gpu else 0) if count is None else count, window=window, rep_ms=rep_ms)


def in_process(device: Device, rep_ms: float) -> Finalists:
    """Capture's finalists inside a user's process (see the module docstring): within
    :data:`CAPTURE_WINDOW` of the fastest, at most :data:`FINALISTS` on a GPU (none in the
    interpreter), over the whole replay length ``rep_ms`` in graphs of ``rep_ms`` *
    :data:`CAPTURE_FINALIST_GRAPH_SHARE`."""
    count = FINALISTS if device.is_gpu else 0
    return Finalists(count, window=CAPTURE_WINDOW, rep_ms=rep_ms, graph_ms=rep_ms * CAPTURE_FINALIST_GRAPH_SHARE)


#: capture's window and count, for code that reads them without a device (a GPU's)
IN_PROCESS = Finalists(FINALISTS, window=CAPTURE_WINDOW)


@dataclass(frozen=True)
class KeyOutcome:
    """What one key's tuning stored: its winner (None: no correct trial) and, beside it, the
    answer the key was served before (``served``) with its measurement as it now stands (re-timed
    with the finalists where it was one), each carrying its time and spread."""

    winner: WinnerRecord | None
    winner_measurement: Measurement | None
    served: Config | None
    served_measurement: Measurement | None


class KeyTuning:
    """One key's tuning into ``store``: its trials of (kernel version ``kv_id``, device
    ``device_id``, ``shape_key``), stored under one sweep row of ``strategy``, its finalists
    re-timed and its winner stored.

    ``served``: the config the key is served today (the runtime's untuned answer, or the stored
    winner), kept among the finalists. ``finalists``: the rule's parameters (:class:`Finalists`).
    ``replace``: a config stored before takes this run's measurement (a re-measure: ``tune
    verify``, capture's retune) instead of keeping its trial.
    """

    def __init__(
        self,
        store: Store,
        kv_id: int,
        device_id: int,
        shape_key: str,
        *,
        problem: dict[str, Any],
        strategy: str,
        budget: int | None = None,
        seed: int = 0,
        served: Config | None = None,
        finalists: Finalists = Finalists(0),
        replace: bool = False,
    ) -> None:
        self.store, self.kv_id, self.device_id, self.key = store, kv_id, device_id, shape_key
        self.problem, self.strategy, self.budget, self.seed = problem, strategy, budget, seed
        self.served = served
        self.finalists = finalists
        self.replace = replace
        self.sweep_id: int | None = None
        #: trials this tuning stored as new (not those other writers or earlier runs stored)
        self.new = 0

    def open(self) -> int:
        """The sweep row this tuning's trials are stored under, started on first use."""
        if self.sweep_id is None:
            self.sweep_id = self.store.start_sweep(
                self.kv_id, self.device_id, self.key, self.problem, self.strategy, self.budget, self.seed
            )
        return self.sweep_id

    def trials(self) -> list[Trial]:
        return self.store.trials(self.kv_id, self.device_id, self.key)

    def measure(self, measurer: Measurer, configs: Sequence[Config]) -> list[tuple[Config, str, Measurement]]:
        """Each config checked and timed by ``measurer`` (:func:`first_pass`), with its hash, to
        :meth:`record`."""
        return [(dict(c), config_hash(dict(c)), m) for c, m in zip(configs, first_pass(measurer, configs))]

    def record(
        self, results: Sequence[tuple[Config, str, Measurement]], *, budget: int | None = None
    ) -> list[int | None]:
        """Store (config, hash, measurement)s as the key's trials in one transaction; each one's
        new trial id, None where the config was stored already (by another writer, or before:
        with ``replace`` its stored trial takes this measurement) or the store refused it over
        ``budget`` trials of the key (every writer's)."""
        if not results:
            return []
        stored = {r.config_hash: r.id for r in self.trials()} if self.replace else {}
        new = [r for r in results if r[1] not in stored]
        ids = (
            self.store.add_trials(self.open(), self.kv_id, self.device_id, self.key, new, budget=budget) if new else []
        )
        added = {h: i for (_, h, _), i in zip(new, ids)}
        out = [added.get(h) for _, h, _ in results]
        if self.replace:
            if None in added.values():  # stored by another writer meanwhile
                stored = {r.config_hash: r.id for r in self.trials()}
            self.store.replace_measurements(
                [(stored[h], m) for (_, h, m), i in zip(results, out) if i is None and h in stored]
            )
        self.new += sum(i is not None for i in out)
        return out

    def kept(self, keep: Iterable[str] = ()) -> set[str]:
        """The config hashes re-timed with the finalists: ``keep`` and the served answer."""
        return {*keep, *([config_hash(self.served)] if self.served is not None else [])}

    def chosen(self, finalists: Finalists | None = None, keep: Iterable[str] = ()) -> list[Trial]:
        """The trials :meth:`retime` would re-time first (it re-times none of fewer than two)."""
        rule, kept = finalists or self.finalists, self.kept(keep)
        if rule.count < 2 and not kept:  # none to read the trials for: one at most qualifies
            return []
        return rule.chosen(self.trials(), kept)

    def retime(
        self, measurer: Measurer, finalists: Finalists | None = None, keep: Iterable[str] = ()
    ) -> list[tuple[int, Measurement]]:
        """Re-time the key's finalists (this tuning's rule, or ``finalists``) beside the served
        answer and the configs hashed in ``keep``, and store their new measurements."""
        rule, kept = finalists or self.finalists, self.kept(keep)
        if rule.count < 2 and not kept:  # one at most qualifies: nothing to compare
            return []
        retimed = rule.retime(measurer, self.trials(), kept)
        if retimed:
            self.store.replace_measurements(retimed)
        return retimed

    def finish(self, seconds: float | None = None, peer_ms: float | None = None) -> KeyOutcome:
        """Store the key's winner, the fastest correct trial, and end the sweep row (``seconds``:
        its wall time; ``peer_ms``: the torch peer's time), where one was started."""
        winner = self.store.update_winner(self.kv_id, self.device_id, self.key)
        if self.sweep_id is not None and seconds is not None:
            self.store.finish_sweep(self.sweep_id, seconds, peer_ms=peer_ms)
        rows = {r.config_hash: r for r in self.trials()}
        return KeyOutcome(
            winner=winner,
            winner_measurement=_of(rows.get(winner.config_hash)) if winner is not None else None,
            served=self.served,
            served_measurement=_of(rows.get(config_hash(self.served))) if self.served is not None else None,
        )


def first_pass(measurer: Measurer, configs: Sequence[Config]) -> list[Measurement]:
    """Each config checked against the reference, then timed (:meth:`Measurer.measure
    <tunesvc.bench.Measurer.measure>`), in order: a wrong config gets no time. The sweep and
    capture order their own first passes (as compiles finish; as precompiles are ready, with a
    reference that may change hands) and measure each candidate the same way."""
    return [measurer.measure(c) for c in configs]


def _fastest_first(rows: Sequence[Trial]) -> list[Trial]:
    return sorted((r for r in rows if r.status == "ok" and r.time_ms is not None), key=lambda r: r.time_ms or 0.0)


def measurement_of(row: Trial) -> Measurement:
    """A stored trial as the measurement it recorded."""
    return Measurement(
        Status(row.status),
        time_ms=row.time_ms,
        spread=row.spread,
        reps=row.reps,
        rel_error=row.rel_error,
        message=row.message,
    )


def _of(row: Trial | None) -> Measurement | None:
    return None if row is None else measurement_of(row)


def _finalist_result(row: Trial, rounds: list[Measurement]) -> Measurement:
    """A finalist's measurement from its rounds: the first failure, else their median and their
    spread (its first measurement left out: it was timed over shorter replays)."""
    failed = next((m for m in rounds if not m.ok), None)
    if failed is not None:
        return Measurement(failed.status, message=f"as a finalist: {failed.message}")
    times = sorted(m.time_ms or 0.0 for m in rounds)
    median = statistics.median(times)
    reps = row.reps + sum(m.reps for m in rounds)
    return Measurement(Status.OK, time_ms=median, spread=(times[-1] - times[0]) / median, reps=reps)


__all__ = [
    "CAPTURE_FINALIST_GRAPH_SHARE",
    "CAPTURE_WINDOW",
    "FINALISTS",
    "FIRST_PASS_SHARE",
    "IN_PROCESS",
    "Finalists",
    "KeyOutcome",
    "KeyTuning",
    "default_finalists",
    "first_pass",
    "in_process",
]
