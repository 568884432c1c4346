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
* **the winner** (:meth:`KeyTuning.finish`): the fastest correct trial, unless others lie within
  its noise interval (its spread, at least 1%: :attr:`Measurement.noise
  <tunesvc.records.Measurement.noise>`): those are a tie, broken by one fixed rule (the config
  served before, then the heuristic's, then the cheaper: :func:`tie_break`), so that a re-tune
  from an empty database picks the same config. It is stored only where it is no slower than
  0.98x the answer it replaces (:data:`NEVER_SLOWER`), timed beside it; else that answer stays.
  :class:`KeyOutcome` holds both measurements, each with its spread.
* **the timing** (``timing``, tunesvc.settings.TIMINGS): a key's trials and winner are those of
  one timing. An eager tuning is given the key's graph winner (``baseline``): it is re-timed
  with the finalists, and an eager winner is stored only where the choice is at least as fast
  as it, timed eagerly beside it (:func:`beats_baseline`); else the key keeps its graph winner
  alone, which a runtime set to eager then serves (the key's only winner).

Where callers differ, it is a parameter:

* ``finalists`` (:class:`Finalists`): how many of the fastest are re-timed, and the window of the
  fastest's first time they must be within (the sweep's default: those within the first times'
  noise, :data:`CONTENDER_FLOOR` at least; :data:`IN_PROCESS`'s 5% for capture).
* capture's first pass (:data:`FIRST_PASS_SHARE`, :data:`IN_PROCESS`): inside a user's process,
  with the in-process measurer, under the key claim, each candidate's first timing is a quarter
  of the replay length, because the program waits for its tuning as it waits for triton.autotune's.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any

from tunesvc.bench import FINALIST_ROUNDS
from tunesvc.bench import Measurement
from tunesvc.bench import Status
from tunesvc.settings import GRAPH
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
#: capture's finalists: those whose first time is within 5% of the fastest's, at most FINALISTS
CAPTURE_WINDOW = 0.05
#: the sweep's finalists: those whose first time is within the noise of the fastest's (the sum of
#: both noises) or within this fraction of it, whichever is wider. First timings are short and
#: taken one after another, seconds apart, as the clocks move (a GPU at its power cap), so two
#: that sorted close may be in either order; one further off cannot win when timed beside them
CONTENDER_FLOOR = 0.03
#: a winner is stored only where, timed beside the answer it replaces, it runs at no less than
#: this share of that answer's speed: "tuned" never means slower
NEVER_SLOWER = 0.98


@dataclass(frozen=True)
class Finalists:
    """The one finalist rule: after the first pass, the ``count`` fastest correct trials whose
    first time is within ``window`` (a fraction) of the fastest's (with none: within the noise
    of it where ``noise``, see :data:`CONTENDER_FLOOR`, else the count alone), and the trials of
    the configs kept (the answer the key is served
    today), are timed side by side (:meth:`Measurer.time_together
    <tunesvc.bench.Measurer.time_together>`: each config's graph replayed in turn with the
    others', ``rep_ms`` each, default the measurer's; ``rounds`` where the measurer can only
    interleave whole timings), and each keeps its new time and spread; then any trial whose first
    time is below the fastest finalist's new one is timed beside it, until none is. Nothing is
    re-timed where fewer than two trials qualify.

    Timing them side by side puts every finalist under the same clocks and temperatures, so a
    config whose first measurement was lucky falls back before it can be declared the winner,
    and the chase after them makes the winner (the fastest correct trial) one timed as every
    trial that could beat it. A finalist that fails now (a crash, a timeout) keeps that status
    and cannot win.

    Re-timing starts wherever two trials qualify, a kept served answer counted: re-timed beside
    the fastest, even with a count of one, it keeps a winner from being slower than what it
    replaces. The count and the window are the caller's: the sweep's count within the noise,
    capture's within 5%, the cross-measure's one (a new candidate re-timed only where it beats
    the stored winner it is kept beside).
    """

    count: int
    window: float | None = None
    rep_ms: float | None = None
    rounds: int = FINALIST_ROUNDS
    #: with no ``window``: True, those within the noise of the fastest; False, the count alone
    noise: bool = False

    def contenders(self, times: Iterable[float | None], noises: Iterable[float | None] | None = None) -> int:
        """How many of these first times (None: failed; ``noises``: each one's, see
        :attr:`Measurement.noise <tunesvc.records.Measurement.noise>`) the count and the window admit."""
        pairs = zip(times, noises if noises is not None else itertools.repeat(None))
        ok = sorted((t, n or 0.0) for t, n in pairs if t is not None)
        if not ok:
            return 0
        best, best_noise = ok[0]
        if self.window is not None:
            within = [t for t, _ in ok if t <= best * (1 + self.window)]
        elif self.noise:
            within = [t for t, n in ok if t <= best * (1 + max(CONTENDER_FLOOR, best_noise + n))]
        else:
            within = [t for t, _ in ok]
        return min(self.count, len(within))

    def chosen(self, rows: Sequence[Trial], keep: Iterable[str] = ()) -> list[Trial]:
        """The finalists of ``rows`` before the chase: the contenders, fastest first, then the
        trials of the configs hashed in ``keep`` among the others that ran correctly."""
        ok = _fastest_first(rows)
        keep = set(keep)
        n = self.contenders((r.time_ms for r in ok), (measurement_of(r).noise for r in ok))
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
        results: dict[int, Measurement] = {}
        while batch:
            measured = measurer.time_together([dict(r.config) for r in batch], rep_ms, self.rounds)
            for row, m in zip(batch, measured):
                results[row.id] = _finalist_result(row, m, results.get(row.id))
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
    """A sweep's finalists: the ``count`` fastest (default: at most :data:`FINALISTS` on a GPU,
    those within the noise of the fastest; none in the interpreter) within ``window`` of the
    fastest (default: whatever their distance, where a count is given), each re-timed for
    ``rep_ms`` (default: the measurer's)."""
    if count is None:
        return Finalists(FINALISTS if device.is_gpu else 0, window=window, rep_ms=rep_ms, noise=True)
    return Finalists(count, window=window, rep_ms=rep_ms)


def in_process(device: Device, rep_ms: float) -> Finalists:
    """Capture's finalists inside a user's process (see the module docstring): within
    :data:`CAPTURE_WINDOW` of the fastest, at most :data:`FINALISTS` on a GPU (none in the
    interpreter), timed side by side for ``rep_ms`` each."""
    count = FINALISTS if device.is_gpu else 0
    return Finalists(count, window=CAPTURE_WINDOW, rep_ms=rep_ms)


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
    #: an eager tuning whose choice was slower than the key's graph winner timed eagerly: no
    #: eager winner was stored (``winner`` is the eager one stored before, if any)
    baseline_kept: bool = False


class KeyTuning:
    """One key's tuning into ``store``: its trials of (kernel version ``kv_id``, device
    ``device_id``, ``shape_key``), stored under one sweep row of ``strategy``, its finalists
    re-timed and its winner stored.

    ``served``: the config the key is served today (the runtime's untuned answer, or the stored
    winner), kept among the finalists; ``heuristic``: the template's (a captured kernel's first
    listed config), the tie rule's second choice. ``finalists``: the rule's parameters (:class:`Finalists`).
    ``replace``: a config stored before takes this run's measurement (a re-measure: ``tune
    verify``, capture's retune) instead of keeping its trial. ``timing``: the timing of the
    trials and the winner (graph | eager); ``baseline``: an eager tuning's key's graph winner (see
    the module docstring), kept among the finalists.
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
        heuristic: Config | None = None,
        finalists: Finalists = Finalists(0),
        replace: bool = False,
        timing: str = GRAPH,
        baseline: Config | None = None,
    ) -> None:
        self.store, self.kv_id, self.device_id, self.key = store, kv_id, device_id, shape_key
        self.problem, self.strategy, self.budget, self.seed = problem, strategy, budget, seed
        self.served = served
        self.heuristic = heuristic
        self.finalists = finalists
        self.replace = replace
        self.timing = timing
        self.baseline = baseline
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
        return self.store.trials(self.kv_id, self.device_id, self.key, timing=self.timing)

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
            self.store.add_trials(
                self.open(), self.kv_id, self.device_id, self.key, new, budget=budget, timing=self.timing
            )
            if new
            else []
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
        """The config hashes re-timed with the finalists: ``keep``, the served answer and the baseline."""
        kept = {*keep, *([config_hash(self.served)] if self.served is not None else [])}
        return kept | ({config_hash(self.baseline)} if self.baseline is not None else set())

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
        """Store the key's winner and end the sweep row (``seconds``: its wall time; ``peer_ms``:
        the torch peer's time), where one was started.

        The winner is :func:`certified`'s choice among the key's correct trials: the fastest,
        or the tie rule's among those within its noise, and never one slower than
        :data:`NEVER_SLOWER` of the answer served before."""
        rows = self.trials()
        choice = certified(rows, self.served, self.heuristic)
        kept_baseline = choice is not None and not beats_baseline(choice, rows, self.baseline)
        if kept_baseline:
            # no eager winner slower than the graph winner timed eagerly: a trial id no row has
            # writes nothing, and the winner stored before (if any) is read back
            winner = self.store.update_winner(self.kv_id, self.device_id, self.key, trial_id=-1, timing=self.timing)
        elif choice is None:
            winner = self.store.update_winner(self.kv_id, self.device_id, self.key, timing=self.timing)
        else:
            noise = measurement_of(_fastest_first(rows)[0]).noise or 0.0
            winner = self.store.update_winner(
                self.kv_id, self.device_id, self.key, trial_id=choice.id, tolerance=noise, timing=self.timing
            )
        if self.sweep_id is not None and seconds is not None:
            self.store.finish_sweep(self.sweep_id, seconds, peer_ms=peer_ms)
        by_hash = {r.config_hash: r for r in rows}
        return KeyOutcome(
            winner=winner,
            winner_measurement=_of(by_hash.get(winner.config_hash)) if winner is not None else None,
            served=self.served,
            served_measurement=_of(by_hash.get(config_hash(self.served))) if self.served is not None else None,
            baseline_kept=kept_baseline,
        )


def beats_baseline(choice: Trial, rows: Sequence[Trial], baseline: Config | None) -> bool:
    """Whether ``choice`` (a trial of ``rows``) may be stored beside ``baseline`` (the key's graph
    winner, timed in ``rows`` as they were: eagerly): at least as fast as the baseline's trial.
    True where there is no baseline, or its trial did not run correctly (nothing to compare)."""
    if baseline is None:
        return True
    digest = config_hash(baseline)
    base = next((r for r in rows if r.config_hash == digest and r.status == "ok" and r.time_ms is not None), None)
    if base is None or base.time_ms is None:
        return True
    return (choice.time_ms or 0.0) <= base.time_ms


def certified(rows: Sequence[Trial], served: Config | None = None, heuristic: Config | None = None) -> Trial | None:
    """The trial to store as a key's winner, of its trials ``rows``; None where none ran correctly.

    The fastest correct trial, unless others lie within its noise interval
    (:meth:`Measurement.within <tunesvc.records.Measurement.within>`): those are a tie, and
    :func:`tie_break` picks among them. Then, where the answer served before (``served``) ran
    correctly and the choice is slower than :data:`NEVER_SLOWER` of its speed (timed beside it:
    the served answer is always among the finalists), the served answer stays.
    """
    ok = _fastest_first(rows)
    if not ok:
        return None
    best = measurement_of(ok[0])
    tied = [r for r in ok if r.time_ms is not None and best.within(r.time_ms)]
    choice = min(tied, key=lambda r: tie_break(r.config, r.config_hash, served, heuristic))
    kept = next((r for r in ok if served is not None and r.config_hash == config_hash(served)), None)
    slower = kept is not None and kept.time_ms is not None and (choice.time_ms or 0.0) * NEVER_SLOWER > kept.time_ms
    return kept if slower and kept is not None else choice


def tie_break(config: Config, digest: str, served: Config | None, heuristic: Config | None) -> tuple:
    """The fixed order among tied configs: the config served before, then the heuristic's, then
    the cheaper (fewer warps times stages, then smaller tiles), then by hash, so that the same
    trials always give the same winner, whatever order they were measured in."""
    return (
        served is None or digest != config_hash(served),
        heuristic is None or digest != config_hash(heuristic),
        *config_cost(config),
        digest,
    )


def config_cost(config: Config) -> tuple[int, int]:
    """The tie rule's "cheaper": warps times pipeline stages (what a program holds on an SM), then
    the product of the config's tile sizes (its parameters named BLOCK...)."""

    def number(name: str, default: int) -> int:
        value = config.get(name, default)
        return value if isinstance(value, int) and not isinstance(value, bool) else default

    tiles = 1
    for name, value in config.items():
        if "BLOCK" in name.upper() and isinstance(value, int) and not isinstance(value, bool) and value > 0:
            tiles *= value
    return number("num_warps", 4) * number("num_stages", 1), tiles


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


def _finalist_result(row: Trial, m: Measurement, before: Measurement | None = None) -> Measurement:
    """A finalist's new measurement (``before``: its last one, where the chase times it again):
    its failure, else its new time and spread, with every repetition counted."""
    if not m.ok:
        return Measurement(m.status, message=f"as a finalist: {m.message}")
    reps = (before.reps if before is not None and before.ok else row.reps) + m.reps
    return Measurement(Status.OK, time_ms=m.time_ms, spread=m.spread, reps=reps, message=m.message)


__all__ = [
    "CAPTURE_WINDOW",
    "CONTENDER_FLOOR",
    "FINALISTS",
    "FIRST_PASS_SHARE",
    "IN_PROCESS",
    "NEVER_SLOWER",
    "Finalists",
    "KeyOutcome",
    "KeyTuning",
    "beats_baseline",
    "certified",
    "config_cost",
    "default_finalists",
    "first_pass",
    "in_process",
    "tie_break",
]
