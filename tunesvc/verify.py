"""`tune verify`: are the stored winners of this device still right, fresh and fast?

For each shape key of this device's hardware (the CPU interpreter is a device too), the newest
winner is checked:

- ``stale-kernel``: tuned for another version of the kernel's source than the current one; its
  config is not measured (it may not even fit the new kernel);
- ``stale-triton``: tuned under another Triton version than this one;
- ``wrong``: its config no longer runs or no longer matches the reference;
- ``slower``: the heuristic config, measured now beside it, is faster by more than ``margin``.

A captured triton.autotune kernel is re-measured on inputs rebuilt from the call its sweep
recorded, beside its first listed config (its heuristic), when ``kernel`` names it: its module is
imported then, and stored data never chooses a module to import. Where it is not named, or its
recorded call is missing or cannot be replayed safely (:mod:`tunesvc._capture.recorded_check`), it is
``not-measured``, with the reason; a module that does not import here is ``unknown-kernel``.
Neither is a flag that ``retune`` can clear.

``retune`` sweeps the keys flagged stale, wrong or slower again (``budget`` new trials each):
under the new kernel version or software stack a sweep starts afresh; otherwise it extends the
stored search. A captured kernel is tuned again over its whole config list, as its current
version, on its recorded call (its stored trials take the new measurements). A retune never
keeps a winner this run measured wrong or slower than the heuristic: where the sweep would keep
it, this run's measurements of the two are stored as theirs, and the winner follows them.
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
from tunesvc.space import config_hash
from tunesvc.template import template_named_by_data
from tunesvc.tuning.key import KeyTuning
from tunesvc.tuning.key import first_pass
from tunesvc.tuning.sweep import run_sweep

if TYPE_CHECKING:
    from collections.abc import Callable

    from tunesvc.bench import Measurement
    from tunesvc.space import Config
    from tunesvc.store import Store
    from tunesvc.template import Problem
    from tunesvc.template import Template

STALE_KERNEL, STALE_TRITON, WRONG, SLOWER, UNKNOWN = "stale-kernel", "stale-triton", "wrong", "slower", "unknown-kernel"
NOT_MEASURED = "not-measured"
#: the flags a retune can clear (the others say why a winner could not be judged)
RETUNABLE = (STALE_KERNEL, STALE_TRITON, WRONG, SLOWER)


@dataclass
class Verdict:
    kernel: str
    shape_key: str
    version: str
    config: Config
    stored_ms: float
    tuned_triton: str
    measured_ms: float | None = None
    heuristic_ms: float | None = None
    flags: list[str] = field(default_factory=list)
    detail: str = ""
    retuned_ms: float | None = None
    retuned_config: Config | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def retunable(self) -> bool:
        """Flagged stale, wrong or slower: what ``retune`` can act on."""
        return any(f in RETUNABLE for f in self.flags)

    @property
    def measured(self) -> bool:
        """Judged here: not flagged ``not-measured`` nor ``unknown-kernel``."""
        return not any(f in (NOT_MEASURED, UNKNOWN) for f in self.flags)


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
) -> list[Verdict]:
    """Re-measure this device's stored winners (filtered by ``kernel``); see the module docstring.

    ``progress(what, step, total)`` is told before each key is judged (``what``: its kernel and
    shape key; ``step`` keys done of ``total``) and once at the end. A captured kernel's recorded
    call is replayed in a process stopped after ``time_limit_s``."""
    if not 0 <= margin < float("inf"):  # NaN too: every comparison with it is false, so it never flagged
        raise TunesvcError(f"--margin must be at least 0 and finite, got {margin}.")
    if budget < 1:
        raise TunesvcError(f"--budget must be at least 1, got {budget}.")
    device = device or current_device()
    newest: dict[tuple[str, str], tuple] = {}
    templates: dict[str, Template | None] = {}
    for entry, tuned_on in store.winners_with_devices(kernel=kernel, hardware_id=device.hardware_id):
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
        slot = (entry.kernel, entry.shape_key)
        held = newest.get(slot)
        # a winner of the current kernel version beats older versions' ones; then the newest
        if held is None or (current, entry.updated_at) > (held[2], held[0].updated_at):
            newest[slot] = (entry, tuned_on, current)
    verdicts = []
    for step, ((name, key), (entry, tuned_on, current)) in enumerate(sorted(newest.items())):
        if progress is not None:
            progress(f"{name} {key}", step, len(newest))
        template = templates[name]
        fresh: list[tuple[Config, Measurement]] = []  # this run's measurements of the winner and the heuristic
        verdict = Verdict(name, key, entry.kernel_version, entry.config, entry.time_ms, tuned_on.triton)
        verdicts.append(verdict)
        if template is None:
            if ":" in name and entry.kernel != kernel and not _captured(store, name):
                # module:qualname with no call recorded here (a bundle's or another database's)
                verdict.flags.append(UNKNOWN)
                verdict.detail = "kernel not found here, and no call of it recorded in this database to re-measure"
            elif ":" in name:  # a captured triton.autotune kernel, by module:qualname
                now, fresh = _verify_captured(
                    verdict, store, device, margin, named=entry.kernel == kernel, time_limit_s=time_limit_s
                )
                if retune and verdict.retunable and now is not None:
                    kv_id = _retune_captured(verdict, store, device, now, time_limit_s=time_limit_s)
                    if kv_id is not None:
                        _overrule(verdict, store, device, kv_id, fresh)
            else:
                verdict.flags.append(UNKNOWN)
                verdict.detail = "kernel not found here; cannot measure it"
            continue
        try:
            problem = template.problem_of_key(key)
        except TunesvcError as exc:  # a stored key this kernel cannot run (M=0): judged by nobody, said
            verdict.flags.append(NOT_MEASURED)
            verdict.detail = f"its shape key names no problem to run: {exc}"
            continue
        if not current:
            verdict.flags.append(STALE_KERNEL)
            verdict.detail = f"tuned for kernel version {entry.kernel_version}, now {template.version}"
        else:
            if tuned_on.triton != device.triton:
                verdict.flags.append(STALE_TRITON)
                verdict.detail = f"tuned with Triton {tuned_on.triton}, now {device.triton}"
            fresh = _measure(verdict, template, problem, device, margin)
        if retune and verdict.retunable:
            _retune(verdict, template, problem, store, device, budget, strategy)
            _overrule(verdict, store, device, store.kernel_version_id(template), fresh, problem=dict(problem))
    if progress is not None:
        progress("verified", len(newest), len(newest))
    return verdicts


def _overrule(
    verdict: Verdict,
    store: Store,
    device: Device,
    kv_id: int,
    fresh: list[tuple[Config, Measurement]],
    problem: dict[str, Any] | None = None,
) -> None:
    """After retuning a key flagged wrong or slower: store this run's measurements of the winner
    and the heuristic (``fresh``) as those configs' trials of this device, in place of older
    times, and let the winner follow the trials; so no winner this run measured wrong, or slower
    than the heuristic, is kept (the sweep alone would keep one whose stored time is older)."""
    if not fresh or not (WRONG in verdict.flags or SLOWER in verdict.flags):
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
    )
    tuning.record([(c, h, m) for h, (c, m) in measured.items()])
    winner = tuning.finish(0.0).winner
    verdict.retuned_config = dict(winner.config) if winner is not None else None
    verdict.retuned_ms = winner.time_ms if winner is not None else None


def _measure(
    verdict: Verdict, template: Template, problem: Problem, device: Device, margin: float
) -> list[tuple[Config, Measurement]]:
    """Measure the winner and the heuristic now (checked, then timed: :func:`tunesvc.tuning.key.first_pass`);
    flag ``wrong`` or ``slower``. Returns both measurements."""
    heuristic = template.heuristic(problem, device)
    configs = [verdict.config] if heuristic == verdict.config else [verdict.config, heuristic]
    measured = first_pass(Bench(template, problem, device), configs)
    winner, theirs = measured[0], measured[-1]
    verdict.measured_ms = winner.time_ms
    verdict.heuristic_ms = theirs.time_ms if theirs.ok else None
    if not winner.ok:
        verdict.flags.append(WRONG)
        verdict.detail = f"{winner.status.value}: {winner.message}"
    elif (
        theirs.ok
        and theirs.time_ms is not None
        and winner.time_ms is not None
        and theirs.time_ms < winner.time_ms * (1 - margin)
    ):
        verdict.flags.append(SLOWER)
        verdict.detail = verdict.detail or f"heuristic {theirs.time_ms:.4g} ms < winner {winner.time_ms:.4g} ms"
    return [(verdict.config, winner), (heuristic, theirs)]


def _retune(
    verdict: Verdict, template: Template, problem: Problem, store: Store, device: Device, budget: int, strategy: str
) -> None:
    stored = store.trials(store.kernel_version_id(template), store.device_id(device), verdict.shape_key)
    [result] = run_sweep(template, [problem], store, strategy=strategy, budget=len(stored) + budget, device=device)
    verdict.retuned_ms, verdict.retuned_config = result.winner_ms, result.winner


def _retune_captured(
    verdict: Verdict, store: Store, device: Device, version: str, *, time_limit_s: float
) -> int | None:
    """Tune a flagged captured key again, as the kernel's current ``version`` over every listed
    config, on inputs rebuilt from the call its sweep recorded. Returns the id of that kernel
    version (None: not retuned, and the detail says why)."""
    from tunesvc._capture import CapturedTemplate
    from tunesvc._capture import find_autotuner
    from tunesvc._capture import tune_recorded

    call = store.captured_call(verdict.kernel, verdict.shape_key, device.hardware_id)
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
    verdict: Verdict, store: Store, device: Device, margin: float, *, named: bool, time_limit_s: float
) -> tuple[str | None, list[tuple[Config, Measurement]]]:
    """Re-measure a captured kernel's winner beside its first listed config, on inputs rebuilt
    from the recorded call; when its module is not named on the command line (``named``: stored
    data never chooses a module to import), its recorded call is missing or not safe to replay
    (not-measured), or its module does not import here (unknown-kernel), say so instead.

    Returns the kernel's current version (None where it could not be judged) and this run's
    measurements of the winner and the first listed config."""
    from tunesvc._capture import config_dict
    from tunesvc._capture import find_autotuner
    from tunesvc._capture import kernel_version
    from tunesvc._capture import measure_stored

    if not named:
        verdict.flags.append(NOT_MEASURED)
        verdict.detail = f"a captured kernel, re-measured on its recorded call when named: --kernel {verdict.kernel}"
        return None, []
    try:
        tuner = find_autotuner(verdict.kernel)
    except TunesvcError as exc:
        verdict.flags.append(UNKNOWN)
        verdict.detail = f"not re-measured: {exc}"
        return None, []
    current = kernel_version(tuner.fn, tuner.configs)
    if verdict.version != current:
        verdict.flags.append(STALE_KERNEL)
        verdict.detail = (
            f"tuned for kernel version {verdict.version}, now {current} (source, configs or Triton changed)"
        )
        return current, []
    first = config_dict(tuner.configs[0])
    try:
        measured = measure_stored(
            store, verdict.kernel, verdict.shape_key, [verdict.config, first], device, time_limit_s=time_limit_s
        )
    except TunesvcError as exc:
        verdict.flags.append(NOT_MEASURED)
        verdict.detail = f"not re-measured: {exc}"
        return None, []
    winner, theirs = measured
    verdict.measured_ms = winner.time_ms
    verdict.heuristic_ms = theirs.time_ms if theirs.ok else None
    if not winner.ok:
        verdict.flags.append(WRONG)
        verdict.detail = f"{winner.status.value}: {winner.message}"
    elif theirs.time_ms is not None and winner.time_ms is not None and theirs.time_ms < winner.time_ms * (1 - margin):
        verdict.flags.append(SLOWER)
        verdict.detail = f"first listed config {theirs.time_ms:.4g} ms < winner {winner.time_ms:.4g} ms"
    return current, [(verdict.config, winner), (first, theirs)]
