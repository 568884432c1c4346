"""`tune adopt`: another GPU model's winners made this one's, each verified by a few measurements.

For each shape key that the other model (``from_device``: a sibling such as an H100 for an H200,
or any stored device) holds a winner of, at the kernel's current version, at most
:data:`CANDIDATES` configs are measured on this device:

1. the other model's winner of this key;
2. its winners of the nearest other keys it tuned (the template's key distance), each config
   once, as many as leave room for
3. the heuristic (a captured kernel's first listed config).

They are checked against the reference and timed as a sweep times them (:func:`tunesvc.tuning.sweep.run_sweep`
over this explicit list: first pass, the finalists side by side, the tie rule and
``NEVER_SLOWER`` of :class:`tunesvc.tuning.key.KeyTuning`), and the certified one is stored as
this device's winner. Nothing of the other model's is copied: every stored time was measured
here. Where it came from is kept: the sweep rows' strategy is ``adopt``, and each trial's message
ends with its provenance (``adopted: NVIDIA H100 80GB HBM3's winner of this key``).

The compiles of every key's candidates are started at once in one pool (a fresh GPU host compiles
each config once, many at a time), and one measuring process loads each key's inputs in turn.

A captured triton.autotune kernel is adopted on the call its sweep recorded on the other model,
when ``kernel`` names it (stored data never chooses a module to import), through capture's own
key tuning over the candidates; its recorded call is stored for this device too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
from typing import TYPE_CHECKING
from typing import Any

from tunesvc import settings
from tunesvc.device import Device
from tunesvc.device import fork_safe_current_device
from tunesvc.errors import TunesvcError
from tunesvc.space import config_hash
from tunesvc.template import ShapeKey
from tunesvc.template import template_named_by_data

if TYPE_CHECKING:
    from tunesvc.records import WinnerEntry
    from tunesvc.space import Config
    from tunesvc.store import Store
    from tunesvc.template import Problem
    from tunesvc.template import Template

#: the most configs measured per key: the other model's winner, its nearest keys' and the heuristic
CANDIDATES = 3
#: what a candidate is, as a trial's provenance names it
OWN, NEAREST, HEURISTIC = "winner of this key", "winner of", "the heuristic"


@dataclass
class Adoption:
    """One key's adoption: what was measured, and what this device now serves."""

    kernel: str
    shape_key: str
    version: str
    #: (provenance, config) measured, in order; empty where the key was not adopted
    candidates: list[tuple[str, Config]] = field(default_factory=list)
    winner: Config | None = None
    winner_ms: float | None = None
    #: the winner's provenance (one of the candidates'); None where no winner was stored
    chosen: str | None = None
    #: the other model's winner of this key, measured here (None: not measured, or wrong)
    theirs_ms: float | None = None
    heuristic_ms: float | None = None
    #: why the key was not adopted, or what went wrong
    detail: str = ""
    #: where its seconds went (a sweep's phases: compile waits, checking and timing, finalists...)
    phases: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def adopted(self) -> bool:
        return self.winner is not None


def candidates_for(
    template: Template,
    problem: Problem,
    key: str,
    theirs: dict[str, Config],
    device: Device,
    heuristic: Config,
) -> list[tuple[str, Config]]:
    """The configs to measure for ``key`` (:data:`CANDIDATES` at most, each once): the other
    model's winner of it (``theirs``: its winners by shape key), its winners of the nearest keys
    it tuned, then ``heuristic``; a config that does not fit ``problem`` on ``device`` is skipped."""
    target = ShapeKey.parse(key)
    ranked = sorted((0.0 if k == key else template.key_distance(target, ShapeKey.parse(k)), k) for k in theirs)
    seen = {config_hash(heuristic)}
    picked: list[tuple[str, Config]] = []
    for distance, k in ranked:
        if len(picked) == CANDIDATES - 1 or distance == math.inf:
            break
        config = template.space.stored_config(theirs[k])  # a parameter added since: its first choice
        if isinstance(config, str) or config_hash(config) in seen or template.violations(config, problem, device):
            continue
        seen.add(config_hash(config))
        picked.append((OWN if k == key else f"{NEAREST} {k}", dict(config)))
    return [*picked, (HEURISTIC, dict(heuristic))]


def adopt(
    store: Store,
    from_device: str,
    *,
    kernel: str | None = None,
    device: Device | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    time_limit_s: float = settings.REPLAY_TIME_LIMIT_S,
    workers: int | None = None,
) -> list[Adoption]:
    """Adopt ``from_device``'s winners (a stored device's name or hardware id) on ``device``
    (default: this one), ``kernel``'s only where given; see the module docstring.

    ``progress(what, step, total)`` is told before each key (``step`` keys done of ``total``)
    and once at the end. A captured kernel's recorded call is replayed in a process stopped
    after ``time_limit_s``."""
    device = device or fork_safe_current_device()
    other = store.find_device(from_device)
    if other.hardware_id == device.hardware_id:
        raise TunesvcError(
            f"'{from_device}' is this device ({device.name}); adopt takes another GPU model's winners: "
            "name one that `tune show` lists."
        )
    by_kernel: dict[str, list[WinnerEntry]] = {}
    for entry, _ in store.winners_with_devices(kernel=kernel, hardware_id=other.hardware_id):
        by_kernel.setdefault(entry.kernel, []).append(entry)
    plans: list[tuple[Template | None, Adoption, Problem | None]] = []
    for name in sorted(by_kernel):
        plans += _plan(store, name, by_kernel[name], device, named=name == kernel)
    todo = [p for p in plans if p[1].candidates]
    if progress is not None and todo:
        progress(f"compiling {sum(len(a.candidates) for _, a, _ in todo)} candidates", 0, len(todo))
    shipped = [(t, a, p) for t, a, p in todo if t is not None and p is not None]
    with _Measuring(shipped, device, workers, other.name) as measuring:
        for step, (template, adoption, problem) in enumerate(todo):
            if progress is not None:
                progress(f"{adoption.kernel} {adoption.shape_key}", step, len(todo))
            try:
                if template is not None and problem is not None:
                    measuring.sweep(store, template, problem, adoption)
                else:
                    _adopt_captured(store, adoption, other, device, time_limit_s)
            except TunesvcError as exc:
                adoption.detail = str(exc)
    refit = {t.name: t for t, a, _ in shipped if a.adopted}
    if refit:
        from tunesvc.tuning.selector_fit import refit_after_sweep

        for template in refit.values():
            refit_after_sweep(store, template, device)
    if progress is not None:
        progress("adopted", len(todo), len(todo))
    return [a for _, a, _ in plans]


def by_key(entries: list[WinnerEntry], version: str | None) -> dict[str, WinnerEntry]:
    """One winner per shape key: of kernel ``version`` where the key has one, else the newest."""
    out: dict[str, WinnerEntry] = {}
    for e in entries:
        held = out.get(e.shape_key)
        if held is None or (e.kernel_version == version, e.updated_at) >= (
            held.kernel_version == version,
            held.updated_at,
        ):
            out[e.shape_key] = e
    return out


def _plan(
    store: Store, name: str, entries: list[WinnerEntry], device: Device, *, named: bool
) -> list[tuple[Template | None, Adoption, Problem | None]]:
    """Each of the other model's keys of kernel ``name`` (its winners: ``entries``, any version)
    as an adoption to run (its candidates chosen) or one that says why it is not run."""
    if ":" in name and store.captured_kernels(name):
        return _plan_captured(store, name, entries, device, named=named)
    try:
        template = template_named_by_data(name, (name if named else None,))
    except TunesvcError as exc:
        return [
            (None, Adoption(name, k, w.kernel_version, detail=f"not adopted: {exc}"), None)
            for k, w in sorted(by_key(entries, None).items())
        ]
    winners = by_key(entries, template.version)
    current = {k: w for k, w in winners.items() if w.kernel_version == template.version}
    theirs = {k: dict(w.config) for k, w in current.items()}
    out: list[tuple[Template | None, Adoption, Problem | None]] = []
    for key, entry in sorted(winners.items()):
        adoption = Adoption(name, key, entry.kernel_version)
        if key not in current:
            adoption.detail = (
                f"not adopted: tuned for kernel version {entry.kernel_version}, now {template.version}; "
                "sweep the key here"
            )
            out.append((template, adoption, None))
            continue
        try:
            problem = template.problem_of_key(key)
        except TunesvcError as exc:
            adoption.detail = f"not adopted: its shape key names no problem to run: {exc}"
            out.append((template, adoption, None))
            continue
        adoption.candidates = candidates_for(
            template, problem, key, theirs, device, template.heuristic(problem, device)
        )
        out.append((template, adoption, problem))
    return out


def _plan_captured(
    store: Store, name: str, entries: list[WinnerEntry], device: Device, *, named: bool
) -> list[tuple[Template | None, Adoption, Problem | None]]:
    from tunesvc._capture import CapturedTemplate
    from tunesvc._capture import config_dict
    from tunesvc._capture import find_autotuner
    from tunesvc._capture import kernel_version

    def said(detail: str) -> list[tuple[Template | None, Adoption, Problem | None]]:
        newest = by_key(entries, None)
        return [(None, Adoption(name, k, w.kernel_version, detail=detail), None) for k, w in sorted(newest.items())]

    if not named:
        return said(f"not adopted: a captured kernel, adopted on its recorded calls when named: --kernel {name}")
    try:
        tuner = find_autotuner(name)
    except TunesvcError as exc:
        return said(f"not adopted: {exc}")
    version = kernel_version(tuner.fn, tuner.configs)
    template = CapturedTemplate(name, version, tuner.configs)
    winners = by_key(entries, version)
    current = {k: w for k, w in winners.items() if w.kernel_version == version}
    theirs = {k: dict(w.config) for k, w in current.items()}
    first = config_dict(tuner.configs[0])
    out: list[tuple[Template | None, Adoption, Problem | None]] = []
    for key, entry in sorted(winners.items()):
        adoption = Adoption(name, key, entry.kernel_version)
        if key in current:
            adoption.candidates = candidates_for(template, template.problem(key=key), key, theirs, device, first)
        else:
            adoption.detail = f"not adopted: tuned for kernel version {entry.kernel_version}, now {version}"
        out.append((None, adoption, None))
    return out


def _provenance(other: str, what: str) -> str:
    """A trial's provenance: ``adopted: NVIDIA H100 80GB HBM3's winner of this key``."""
    return (
        f"adopted: {other}'s {what}"
        if what != HEURISTIC
        else f"adopted: {HEURISTIC}, measured beside {other}'s winners"
    )


class _Measuring:
    """One compile pool for every shipped key's candidates, submitted at once and waited for
    before the first key is timed, then one measuring process that loads each key's inputs in
    turn and finds their binaries in Triton's cache. Not timed while the pool compiles: its
    workers make each key's inputs and launch each candidate on the same GPU, and on an H200 the
    first keys timed beside them had a spread of 14-20% (0.4-2% for the keys after), which made
    the heuristic a tie with a sibling's winner 12% faster."""

    def __init__(
        self, shipped: list[tuple[Template, Adoption, Problem]], device: Device, workers: int | None, other: str
    ) -> None:
        self.shipped, self.device, self.workers, self.other = shipped, device, workers, other
        self.compiler: Any = None
        self.measurer: Any = None

    def __enter__(self) -> _Measuring:
        from tunesvc.tuning.sweep import compile_pool
        from tunesvc.tuning.sweep import measuring_process

        if not self.shipped:
            return self
        template, _, problem = self.shipped[0]
        total = sum(len(a.candidates) for _, a, _ in self.shipped)
        self.measurer = measuring_process(template, problem, device=self.device)
        self.compiler = compile_pool(template, problem, budget=total, workers=self.workers, device=self.device)
        if self.compiler is not None:
            futures = [
                future
                for template, adoption, problem in self.shipped
                for future in self.compiler.submit(template, problem, [c for _, c in adoption.candidates])
            ]
            _wait_for_compiles(futures, self.compiler.timeout_s)
            self.compiler.close()  # its workers leave the GPU before the first key is timed
            self.compiler = None
        return self

    def __exit__(self, *exc: object) -> None:
        for held in (self.compiler, self.measurer):
            if held is not None:
                held.close()

    def sweep(self, store: Store, template: Template, problem: Problem, adoption: Adoption) -> None:
        from tunesvc.tuning.sweep import run_sweep

        notes = {config_hash(c): _provenance(self.other, what) for what, c in adoption.candidates}
        [result] = run_sweep(
            template,
            [problem],
            store,
            strategy="grid",
            candidates=[c for _, c in adoption.candidates],
            device=self.device,
            workers=0,  # compiled ahead in the pool: each measurement loads its binary from Triton's cache
            measurer=self.measurer,
            refit_selector=False,
            label="adopt",
            notes=notes,
            time_peer=False,  # nothing of adopt's reads it
        )
        adoption.phases = {k: round(v, 3) for k, v in result.phases.items()}
        _record(adoption, result.winner, result.winner_ms, store, store.kernel_version_id(template), self.device)


def _wait_for_compiles(futures: list, stall_s: float) -> None:
    """Until every compile is done, or none has finished for ``stall_s`` (a hung worker: the
    measuring process compiles what is left itself)."""
    from concurrent.futures import FIRST_COMPLETED
    from concurrent.futures import wait

    pending = set(futures)
    while pending:
        done, pending = wait(pending, timeout=stall_s, return_when=FIRST_COMPLETED)
        if not done:
            return


def _record(
    adoption: Adoption, winner: Config | None, winner_ms: float | None, store: Store, kv_id: int, device: Device
) -> None:
    """Fill ``adoption`` from the key's stored trials on ``device`` (kernel version ``kv_id``)
    once it is measured."""
    rows = store.trials(kv_id, store.device_id(device), adoption.shape_key)
    times = {r.config_hash: r.time_ms for r in rows if r.status == "ok"}
    adoption.winner, adoption.winner_ms = winner, winner_ms
    by_hash = {config_hash(c): what for what, c in adoption.candidates}
    adoption.chosen = by_hash.get(config_hash(winner)) if winner is not None else None
    if winner is not None and adoption.chosen is None:
        adoption.chosen = "stored before"
    own = next((c for what, c in adoption.candidates if what == OWN), None)
    adoption.theirs_ms = times.get(config_hash(own)) if own is not None else None
    heuristic = adoption.candidates[-1][1] if adoption.candidates else None
    adoption.heuristic_ms = times.get(config_hash(heuristic)) if heuristic is not None else None
    if winner is None:
        failed = [f"{r.status}: {r.message}" for r in rows if r.status != "ok"]
        adoption.detail = "no candidate ran correctly here" + (f" ({failed[0]})" if failed else "")


def _adopt_captured(store: Store, adoption: Adoption, other: Device, device: Device, time_limit_s: float) -> None:
    from tunesvc._capture import adopt_recorded

    notes = {config_hash(c): _provenance(other.name, what) for what, c in adoption.candidates}
    winner, kv_id = adopt_recorded(
        store,
        adoption.kernel,
        adoption.version,
        adoption.shape_key,
        [c for _, c in adoption.candidates],
        recorded_on=other.hardware_id,
        notes=notes,
        time_limit_s=time_limit_s,
    )
    mine = store.winners(kernel=adoption.kernel, hardware_id=device.hardware_id, version=adoption.version)
    stored = next((w for w in mine if w.shape_key == adoption.shape_key), None)
    _record(adoption, winner, stored.time_ms if stored is not None else None, store, kv_id, device)
