"""`tune verify`: are the stored winners of this device still right, fresh and fast?

For each shape key of this device's hardware (the CPU interpreter is a device too), the newest
winner is checked:

- ``stale-kernel``: tuned for another version of the kernel's source than the current one; its
  config is not measured (it may not even fit the new kernel);
- ``stale-triton``: tuned under another Triton version than this one (measured all the same);
- ``wrong``: its config no longer runs or no longer matches the reference;
- ``slower``: the heuristic config, measured now beside it, is faster by more than ``margin``;
- ``slower-than-stored`` / ``faster-than-stored``: its time now and its stored time are apart:
  their noise intervals (:meth:`tunesvc.records.Measurement.interval`, each time's spread, at
  least 1%) do not meet, and they differ by more than ``margin``. A winner slower than stored
  won its key on a time it no longer has: a retune sweeps it again. One faster than stored is
  said, not retuned: it still serves its key at least as fast as it was chosen for.

Every verdict names what differs between the environment its winner was measured in (its
device row: driver, CUDA, torch and Triton versions; the GPU model with ``winners_of``) and
this one (:func:`drift`). ``drifted`` measures only the winners where something does, and
judges them by measurement alone: a Triton upgrade is no flag (``stale-triton``) then, only
what it did to the time is; the others are skipped (``skipped``), and counted.

``winners_of`` (a stored device's name or hardware id) takes that GPU model's winners instead of
this device's and measures them here, beside this device's heuristic: how winners tuned on an
H100 do on an H200, and what a software upgrade did to them (their stored times are the other
model's, so ``faster-than-stored`` or ``slower-than-stored`` says as much about the hardware).

A captured triton.autotune kernel is re-measured on inputs rebuilt from the call its sweep
recorded, beside its first listed config (its heuristic), when ``kernel`` names it: its module is
imported then, and stored data never chooses a module to import. Where it is not named, or its
recorded call is missing or cannot be replayed safely (:mod:`tunesvc._capture.recorded_check`), it is
``not-measured``, with the reason; a module that does not import here is ``unknown-kernel``.
Neither is a flag that ``retune`` can clear.

``retune`` sweeps the keys flagged stale, wrong, slower or slower than stored again (``budget``
new trials each) on this device: under the new kernel version or software stack a sweep starts
afresh; otherwise it extends the stored search. A captured kernel is tuned again over its whole
config list, as its current version, on its recorded call (its stored trials take the new
measurements). A retune never keeps a winner this run measured wrong, slower than the heuristic
or slower than its stored time: where the sweep would keep it, this run's measurements of the
two are stored as theirs, and the winner follows them.
"""

from __future__ import annotations

from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
from typing import TYPE_CHECKING
from typing import Any

from tunesvc import settings
from tunesvc.bench import Bench
from tunesvc.device import Device
from tunesvc.device import current_device
from tunesvc.errors import TunesvcError
from tunesvc.records import Measurement
from tunesvc.records import Status
from tunesvc.space import config_hash
from tunesvc.template import template_named_by_data
from tunesvc.tuning.key import KeyTuning
from tunesvc.tuning.key import first_pass
from tunesvc.tuning.sweep import run_sweep

if TYPE_CHECKING:
    from collections.abc import Callable

    from tunesvc.space import Config
    from tunesvc.store import Store
    from tunesvc.template import Problem
    from tunesvc.template import Template

STALE_KERNEL, STALE_TRITON, WRONG, SLOWER, UNKNOWN = "stale-kernel", "stale-triton", "wrong", "slower", "unknown-kernel"
NOT_MEASURED = "not-measured"
SLOWER_THAN_STORED, FASTER_THAN_STORED = "slower-than-stored", "faster-than-stored"
#: the flags a retune can clear (the others say why a winner could not be judged, or, for
#: faster-than-stored, that it serves its key at least as fast as it was chosen for)
RETUNABLE = (STALE_KERNEL, STALE_TRITON, WRONG, SLOWER, SLOWER_THAN_STORED)
#: a winner's measurement is kept from a retune's sweep when it is one of these: this run's
#: measurements of it and the heuristic are stored as theirs (:func:`_overrule`)
MEASURED_WORSE = (WRONG, SLOWER, SLOWER_THAN_STORED)
#: the software versions of a device row that a winner's time depends on (tunesvc.device.Device)
VERSIONS = ("driver", "cuda", "torch", "triton")


def drift(recorded: Device, here: Device) -> dict[str, tuple[str, str]]:
    """What differs between the device a winner was measured on and ``here``: ``"device"`` (the
    GPU model: its name, or its hardware id where the names agree), then each of
    :data:`VERSIONS` that differs, as (recorded, here); empty where nothing does."""
    out: dict[str, tuple[str, str]] = {}
    if recorded.hardware_id != here.hardware_id:
        named = recorded.name != here.name
        out["device"] = (recorded.name, here.name) if named else (recorded.hardware_id, here.hardware_id)
    for name in VERSIONS:
        if getattr(recorded, name) != getattr(here, name):
            out[name] = (getattr(recorded, name), getattr(here, name))
    return out


def drift_text(changes: dict[str, tuple[str, str]]) -> str:
    """``triton 3.4.0 -> 3.6.0, torch 2.8.0 -> 2.11.0``: a :func:`drift` in words ("-" for a
    version a device has none of, the interpreter's driver)."""
    return ", ".join(f"{name} {old or '-'} -> {new or '-'}" for name, (old, new) in changes.items())


@dataclass
class Verdict:
    kernel: str
    shape_key: str
    version: str
    config: Config
    stored_ms: float
    tuned_triton: str
    #: the spread of the stored time (its trial's; None: none stored) and of the time measured now
    stored_spread: float | None = None
    measured_ms: float | None = None
    measured_spread: float | None = None
    heuristic_ms: float | None = None
    flags: list[str] = field(default_factory=list)
    detail: str = ""
    retuned_ms: float | None = None
    retuned_config: Config | None = None
    #: what differs between the environment the winner was measured in and this one (:func:`drift`)
    drift: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: the timing the winner was chosen under (graph | eager): it is re-measured, and retuned, so
    timing: str = "graph"
    #: not measured by choice: ``drifted`` was asked, and nothing differs
    skipped: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def retunable(self) -> bool:
        """Flagged stale, wrong, slower or slower than stored: what ``retune`` can act on."""
        return any(f in RETUNABLE for f in self.flags)

    @property
    def measured(self) -> bool:
        """Judged here: not skipped, nor flagged ``not-measured`` nor ``unknown-kernel``."""
        return not self.skipped and not any(f in (NOT_MEASURED, UNKNOWN) for f in self.flags)

    def flag(self, name: str, detail: str) -> None:
        """Add a flag and what it says (after what the verdict says already)."""
        self.flags.append(name)
        self.detail = f"{self.detail}; {detail}" if self.detail else detail


def verify(
    store: Store,
    *,
    kernel: str | None = None,
    device: Device | None = None,
    margin: float = 0.05,
    retune: bool = False,
    budget: int = 8,
    strategy: str = "grid",
    progress: Callable[[str, int, int], None] | None = None,
    time_limit_s: float = settings.REPLAY_TIME_LIMIT_S,
    drifted: bool = False,
    winners_of: str | None = None,
) -> list[Verdict]:
    """Re-measure this device's stored winners (filtered by ``kernel``; ``winners_of``: another
    stored device's, measured here; ``drifted``: only those measured in another environment);
    see the module docstring.

    ``progress(what, step, total)`` is told before each key is judged (``what``: its kernel and
    shape key; ``step`` keys done of ``total``) and once at the end. A captured kernel's recorded
    call is replayed in a process stopped after ``time_limit_s``."""
    if not 0 <= margin < float("inf"):  # NaN too: every comparison with it is false, so it never flagged
        raise TunesvcError(f"--margin must be at least 0 and finite, got {margin}.")
    if budget < 1:
        raise TunesvcError(f"--budget must be at least 1, got {budget}.")
    device = device or current_device()
    hardware_id = device.hardware_id if winners_of is None else store.find_device(winners_of).hardware_id
    newest: dict[tuple[str, str, str], tuple] = {}
    templates: dict[str, Template | None] = {}
    for entry, tuned_on in store.winners_with_devices(kernel=kernel, hardware_id=hardware_id, timing=None):
        if entry.kernel not in templates:
            try:
                # a name from the database: never a module path the data chooses (a captured
                # kernel's module is imported by tunesvc.capture, and only when --kernel names it)
                templates[entry.kernel] = (
                    None if _captured(store, entry.kernel) else template_named_by_data(entry.kernel, (kernel,))
                )
            except TunesvcError:
                templates[entry.kernel] = None  # a decorator's kernel, or one not installed here
        template = templates[entry.kernel]
        current = template is not None and entry.kernel_version == template.version
        slot = (entry.kernel, entry.shape_key, entry.timing)
        held = newest.get(slot)
        # a winner of the current kernel version beats older versions' ones; then the newest
        if held is None or (current, entry.updated_at) > (held[2], held[0].updated_at):
            newest[slot] = (entry, tuned_on, current)
    verdicts = []
    for (name, key, timing), (entry, tuned_on, _) in sorted(newest.items()):
        trial = store.winner_trial(name, entry.kernel_version, tuned_on, key, timing=timing)
        verdict = Verdict(
            name, key, entry.kernel_version, entry.config, entry.time_ms, tuned_on.triton,
            stored_spread=trial.spread if trial is not None else None, drift=drift(tuned_on, device), timing=timing,
        )  # fmt: skip
        verdict.skipped = drifted and not verdict.drift
        verdicts.append(verdict)
    judged = [(v, newest[v.kernel, v.shape_key, v.timing]) for v in verdicts if not v.skipped]
    for step, (verdict, (entry, tuned_on, current)) in enumerate(judged):
        name, key = verdict.kernel, verdict.shape_key
        if progress is not None:
            progress(f"{name} {key}", step, len(judged))
        template = templates[name]
        stored = Measurement(Status.OK, time_ms=entry.time_ms, spread=verdict.stored_spread)
        fresh: list[tuple[Config, Measurement]] = []  # this run's measurements of the winner and the heuristic
        if template is None:
            if ":" in name and entry.kernel != kernel and not _captured(store, name):
                # module:qualname with no call recorded here (a bundle's or another database's)
                verdict.flag(
                    UNKNOWN, "kernel not found here, and no call of it recorded in this database to re-measure"
                )
            elif ":" in name:  # a captured triton.autotune kernel, by module:qualname
                now, fresh = _verify_captured(
                    verdict, store, device, margin, stored, tuned_on,
                    named=entry.kernel == kernel, time_limit_s=time_limit_s,
                )  # fmt: skip
                if retune and verdict.retunable and now is not None:
                    kv_id = _retune_captured(
                        verdict, store, device, now, recorded_on=tuned_on.hardware_id, time_limit_s=time_limit_s
                    )
                    if kv_id is not None:
                        _overrule(verdict, store, device, kv_id, fresh)
            else:
                verdict.flag(UNKNOWN, "kernel not found here; cannot measure it")
            continue
        try:
            problem = template.problem_of_key(key)
        except TunesvcError as exc:  # a stored key this kernel cannot run (M=0): judged by nobody, said
            verdict.flag(NOT_MEASURED, f"its shape key names no problem to run: {exc}")
            continue
        if not current:
            verdict.flag(STALE_KERNEL, f"tuned for kernel version {entry.kernel_version}, now {template.version}")
        else:
            if tuned_on.triton != device.triton and not drifted:  # with drifted, its times judge it
                verdict.flag(STALE_TRITON, f"tuned with Triton {tuned_on.triton}, now {device.triton}")
            fresh = _measure(verdict, template, problem, device, margin, stored)
        if retune and verdict.retunable:
            _retune(verdict, template, problem, store, device, budget, strategy)
            _overrule(verdict, store, device, store.kernel_version_id(template), fresh, problem=dict(problem))
    if progress is not None:
        progress("verified", len(judged), len(judged))
    return verdicts


def _overrule(
    verdict: Verdict,
    store: Store,
    device: Device,
    kv_id: int,
    fresh: list[tuple[Config, Measurement]],
    problem: dict[str, Any] | None = None,
) -> None:
    """After retuning a key flagged wrong, slower or slower than stored: store this run's
    measurements of the winner and the heuristic (``fresh``) as those configs' trials of this
    device, in place of older times, and let the winner follow the trials; so no winner this run
    measured wrong, slower than the heuristic or slower than its stored time is kept (the sweep
    alone would keep one whose stored time is older)."""
    if not fresh or not any(f in MEASURED_WORSE for f in verdict.flags):
        return
    measured = {config_hash(dict(c)): (dict(c), m) for c, m in fresh}
    tuning = KeyTuning(
        store,
        kv_id,
        store.device_id(device),
        verdict.shape_key,
        problem=problem or {},
        strategy="verify",
        budget=len(measured),
        served=verdict.config,
        replace=True,
        timing=verdict.timing,
    )
    tuning.record([(c, h, m) for h, (c, m) in measured.items()])
    winner = tuning.finish(0.0).winner
    verdict.retuned_config = dict(winner.config) if winner is not None else None
    verdict.retuned_ms = winner.time_ms if winner is not None else None


def _measure(
    verdict: Verdict, template: Template, problem: Problem, device: Device, margin: float, stored: Measurement
) -> list[tuple[Config, Measurement]]:
    """Measure the winner and the heuristic now (checked, then timed: :func:`tunesvc.tuning.key.first_pass`);
    flag ``wrong``, ``slower`` or a time apart from ``stored`` (:func:`_judge`). Returns both measurements."""
    heuristic = template.heuristic(problem, device)
    configs = [verdict.config] if heuristic == verdict.config else [verdict.config, heuristic]
    measured = first_pass(Bench(template, problem, device, timing=verdict.timing), configs)
    winner, theirs = measured[0], measured[-1]
    _judge(verdict, winner, theirs, stored, margin, "heuristic")
    return [(verdict.config, winner), (heuristic, theirs)]


def _judge(
    verdict: Verdict, winner: Measurement, theirs: Measurement, stored: Measurement, margin: float, whose: str
) -> None:
    """Judge the winner measured now beside ``theirs`` (the heuristic, or a captured kernel's
    first listed config: ``whose``) and its ``stored`` time: ``wrong``; ``slower`` where theirs
    is faster by more than ``margin``; ``slower-than-stored`` or ``faster-than-stored`` where the
    two times' noise intervals do not meet and they differ by more than ``margin``."""
    verdict.measured_ms, verdict.measured_spread = winner.time_ms, winner.spread
    verdict.heuristic_ms = theirs.time_ms if theirs.ok else None
    if not winner.ok:
        verdict.flag(WRONG, f"{winner.status.value}: {winner.message}")
        return
    if winner.time_ms is None:
        return
    if theirs.ok and theirs.time_ms is not None and theirs.time_ms < winner.time_ms * (1 - margin):
        verdict.flag(SLOWER, f"{whose} {theirs.time_ms:.4g} ms < winner {winner.time_ms:.4g} ms")
    now, then = winner.interval(), stored.interval()
    if now is None or then is None or stored.time_ms is None or not (now[1] < then[0] or then[1] < now[0]):
        return  # the two times cannot be told apart
    ratio = winner.time_ms / stored.time_ms
    times = f"{ratio:,.0f}x" if ratio >= 100 else f"{ratio:.3g}x"
    said = f"now {times} its stored {stored.time_ms:.4g} ms ±{stored.noise:.0%}, measured ±{winner.noise:.0%}"
    if ratio > 1 + margin:
        verdict.flag(SLOWER_THAN_STORED, said)
    elif ratio < 1 - margin:
        verdict.flag(FASTER_THAN_STORED, said)


def _retune(
    verdict: Verdict, template: Template, problem: Problem, store: Store, device: Device, budget: int, strategy: str
) -> None:
    kv_id, device_id = store.kernel_version_id(template), store.device_id(device)
    stored = store.trials(kv_id, device_id, verdict.shape_key, timing=verdict.timing)
    [result] = run_sweep(
        template, [problem], store, strategy=strategy, budget=len(stored) + budget, device=device, timing=verdict.timing
    )
    verdict.retuned_ms, verdict.retuned_config = result.winner_ms, result.winner


def _retune_captured(
    verdict: Verdict, store: Store, device: Device, version: str, *, recorded_on: str, time_limit_s: float
) -> int | None:
    """Tune a flagged captured key again on ``device``, as the kernel's current ``version`` over
    every listed config, on inputs rebuilt from the call its sweep recorded on the device model
    ``recorded_on``. Returns the id of that kernel version (None: not retuned, and the detail
    says why)."""
    from tunesvc._capture import CapturedTemplate
    from tunesvc._capture import find_autotuner
    from tunesvc._capture import tune_recorded

    call = store.captured_call(verdict.kernel, verdict.shape_key, recorded_on)
    try:
        if call is None:
            raise TunesvcError("no recorded call of this key")
        config = tune_recorded(store, verdict.kernel, version, verdict.shape_key, call, time_limit_s=time_limit_s)
    except TunesvcError as exc:
        verdict.detail = f"{verdict.detail}; not retuned: {exc}"
        return None
    stored = store.winners(kernel=verdict.kernel, hardware_id=device.hardware_id, version=version)
    times = [w.time_ms for w in stored if w.shape_key == verdict.shape_key]
    verdict.retuned_config = config
    verdict.retuned_ms = times[0] if times else None
    return store.kernel_version_id(CapturedTemplate(verdict.kernel, version, find_autotuner(verdict.kernel).configs))


def _captured(store: Store, kernel: str) -> bool:
    """Whether ``kernel`` was stored by tunesvc.capture (a triton.autotune kernel)."""
    return ":" in kernel and bool(store.captured_kernels(kernel))


def _verify_captured(
    verdict: Verdict,
    store: Store,
    device: Device,
    margin: float,
    stored: Measurement,
    tuned_on: Device,
    *,
    named: bool,
    time_limit_s: float,
) -> tuple[str | None, list[tuple[Config, Measurement]]]:
    """Re-measure a captured kernel's winner beside its first listed config, on inputs rebuilt
    from the call its sweep recorded (on ``tuned_on``'s device model); when its module is not
    named on the command line (``named``: stored data never chooses a module to import), its
    recorded call is missing or not safe to replay (not-measured), or its module does not import
    here (unknown-kernel), say so instead.

    Returns the kernel's current version (None where it could not be judged) and this run's
    measurements of the winner and the first listed config."""
    from tunesvc._capture import config_dict
    from tunesvc._capture import find_autotuner
    from tunesvc._capture import kernel_version
    from tunesvc._capture import measure_stored

    if not named:
        verdict.flag(
            NOT_MEASURED, f"a captured kernel, re-measured on its recorded call when named: --kernel {verdict.kernel}"
        )
        return None, []
    try:
        tuner = find_autotuner(verdict.kernel)
    except TunesvcError as exc:
        verdict.flag(UNKNOWN, f"not re-measured: {exc}")
        return None, []
    current = kernel_version(tuner.fn, tuner.configs)
    if verdict.version != current:
        verdict.flag(
            STALE_KERNEL,
            f"tuned for kernel version {verdict.version}, now {current} (source, configs or Triton changed)",
        )
        return current, []
    first = config_dict(tuner.configs[0])
    try:
        measured = measure_stored(
            store, verdict.kernel, verdict.shape_key, [verdict.config, first], device,
            time_limit_s=time_limit_s, recorded_on=tuned_on.hardware_id,
        )  # fmt: skip
    except TunesvcError as exc:
        verdict.flag(NOT_MEASURED, f"not re-measured: {exc}")
        return None, []
    winner, theirs = measured
    _judge(verdict, winner, theirs, stored, margin, "first listed config")
    return current, [(verdict.config, winner), (first, theirs)]
