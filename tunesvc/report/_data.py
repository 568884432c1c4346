"""The report's records and how they are read from a store: :func:`collect` gives one
:class:`Section` per (kernel version, device), its :class:`KeyReport` per shape key, with winners,
heuristic and peer times, rooflines from :data:`LISTED_PEAKS`, and each search strategy's
:class:`Trace`.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass
from dataclasses import field
from typing import TYPE_CHECKING
from typing import Any
from typing import Protocol

from tunesvc.device import Device
from tunesvc.records import wrong_reasons
from tunesvc.space import config_hash
from tunesvc.template import template_named_by_data
from tunesvc.tuning.selector_measure import CROSS_MEASURE
from tunesvc.tuning.selector_measure import CROSS_RETIME

if TYPE_CHECKING:
    from tunesvc.store import Store
    from tunesvc.template import Template


class Progress(Protocol):
    """Told what the report is doing: ``step`` of ``total`` steps of ``what`` done."""

    def __call__(self, what: str, step: int, total: int) -> None: ...


@dataclass(frozen=True)
class Peak:
    """A GPU's listed (datasheet) peaks: dense FLOP/s per dtype and memory bandwidth."""

    flops: dict[str, float]
    bytes_per_s: float


#: Listed peaks of known GPUs, by the name torch reports; dense (no sparsity) tensor-core rates.
#: Only dtypes listed here get a roofline fraction; every other device or dtype shows "-".
LISTED_PEAKS: dict[str, Peak] = {
    "NVIDIA H100 80GB HBM3": Peak(flops={"bfloat16": 989e12, "float16": 989e12}, bytes_per_s=3.35e12),
    "NVIDIA H200": Peak(flops={"bfloat16": 989e12, "float16": 989e12}, bytes_per_s=4.8e12),
}


@dataclass
class Trace:
    """One search strategy's trials of a shape key, in the order measured (its sweeps in turn)."""

    strategy: str
    index: list[int] = field(default_factory=list)  # 1, 2, ...: the trial's place in this strategy's search
    seconds: list[float] = field(default_factory=list)  # since its sweep started, after earlier sweeps' time
    times: list[float | None] = field(default_factory=list)  # ms; None: not a correct trial

    @property
    def best_so_far(self) -> list[float | None]:
        best, out = math.inf, []
        for t in self.times:
            if t is not None:
                best = min(best, t)
            out.append(best if best < math.inf else None)
        return out


@dataclass
class KeyReport:
    """One shape key of one kernel version on one device."""

    shape_key: str
    problem: dict[str, Any] | None
    trials: list[Any]  # rows of trials (id, status, time_ms, config_hash...), in the order measured
    winner_config: dict[str, int] | None = None
    winner_ms: float | None = None
    heuristic_ms: float | None = None
    tflops: float | None = None
    roofline: float | None = None
    bound: str | None = None  # "compute" or "memory", where the roofline is known
    peer_ms: float | None = None  # the template's torch peer, timed by a sweep of this problem
    traces: dict[str, Trace] = field(default_factory=dict)  # strategy -> its trials, first swept first

    @property
    def peer_speedup(self) -> float | None:
        """Speed-up over the peer, peer time / tuned time: above 1, the tuned kernel is faster than torch's."""
        return self.peer_ms / self.winner_ms if self.peer_ms and self.winner_ms else None

    @property
    def ok_times(self) -> list[float]:
        return [t.time_ms for t in self.trials if t.status == "ok" and t.time_ms is not None]

    @property
    def failed(self) -> int:
        return sum(t.status != "ok" for t in self.trials)


@dataclass
class Section:
    """One kernel version on one stored device."""

    kernel: str
    version: str
    device: Any  # a row of devices: id, name, hardware_id, kind, versions
    keys: list[KeyReport] = field(default_factory=list)
    sweeps: int = 0
    sweep_seconds: float = 0.0
    template_note: str = ""
    peer_name: str = ""  # what the installed template's peer runs; "" when unknown
    #: the version lookups use: the installed template's, else the kernel's newest stored version
    lookup_version: str = ""

    @property
    def slug(self) -> str:
        return _slug(f"{self.kernel}-{self.version}-{self.device.name}-d{self.device.id}")

    @property
    def current(self) -> bool:
        return self.version == self.lookup_version

    @property
    def wrong_results(self) -> list[tuple[str, int, str]]:
        """Its candidates stored as wrong results, by reason: (reason, trials, the message most
        often stored), most first (:func:`tunesvc.records.wrong_reasons`)."""
        messages: dict[str, int] = defaultdict(int)
        for k in self.keys:
            for t in k.trials:
                if t.status == "wrong_result":
                    messages[t.message or ""] += 1
        return wrong_reasons(messages)

    @property
    def peer_speedups(self) -> list[tuple[float, KeyReport]]:
        """(speed-up over the peer, key) of every key whose peer was timed."""
        return [(k.peer_speedup, k) for k in self.keys if k.peer_speedup is not None]

    @property
    def title(self) -> str:
        what = f"{self.kernel} on {self.device.name}"
        if self.current:
            return what
        return f"{what}: older version {self.version} (lookups use {self.lookup_version or 'another'})"


def collect(store: Store, kernel: str | None = None) -> list[Section]:
    """Every (kernel version, device) with trials, its keys, winners, heuristic times and rooflines."""
    history = store.history(kernel)
    sweeps = history.sweeps
    problem_of_sweep = {s.id: dict(s.problem) for s in sweeps}
    sweep_by_id = {s.id: s for s in sweeps}
    peers: dict[tuple[int, int, str], list[Any]] = defaultdict(list)  # sweeps that timed the peer, oldest first
    latest_problem: dict[tuple[int, int, str], dict] = {}
    for s in sweeps:
        if s.peer_ms is not None:
            peers[(s.kernel_version_id, s.device_id, s.shape_key)].append(s)
        latest_problem[(s.kernel_version_id, s.device_id, s.shape_key)] = dict(s.problem)
    trials_of: dict[tuple[int, int, str], list[Any]] = defaultdict(list)
    for t in history.trials:
        trials_of[(t.kernel_version_id, t.device_id, t.shape_key)].append(t)

    sections: dict[tuple[int, int], Section] = {}
    templates: dict[str, Template | None] = {}
    captured_kernels = set(store.captured_kernels())
    for (kv_id, device_id, key), rows in trials_of.items():
        kv = history.kernel_versions[kv_id]
        captured = kv.kernel in captured_kernels
        if kv.kernel not in templates:
            # a captured triton.autotune kernel has no template; its module is never imported here
            templates[kv.kernel] = None if captured else _template(kv.kernel, (kernel,))
        if (kv_id, device_id) not in sections:
            sections[(kv_id, device_id)] = _section(
                kv, history.devices[device_id], sweeps, templates[kv.kernel], captured=captured
            )
        winner = history.winners.get((kv_id, device_id, key))
        winner_trial = next((t for t in rows if t.id == winner.trial_id), None) if winner else None
        # the problem the winner was measured on (a key buckets several problems), else the latest
        problem = problem_of_sweep.get(winner_trial.sweep_id) if winner_trial else None
        problem = problem or latest_problem.get((kv_id, device_id, key))
        report = KeyReport(shape_key=key, problem=problem, trials=rows, traces=_traces(rows, sweep_by_id))
        if winner is not None:
            report.winner_config, report.winner_ms = dict(winner.config), winner.time_ms
        report.peer_ms = _peer_ms(peers.get((kv_id, device_id, key), []), winner_trial, problem)
        _fill_template_numbers(report, templates[kv.kernel], history.devices[device_id], rows)
        sections[(kv_id, device_id)].keys.append(report)
    newest: dict[str, tuple[int, str]] = {}  # kernel -> its newest stored version (id, version)
    for (kv_id, _), section in sections.items():
        newest[section.kernel] = max(newest.get(section.kernel, (kv_id, section.version)), (kv_id, section.version))
    for section in sections.values():
        template = templates[section.kernel]
        section.lookup_version = template.version if template is not None else newest[section.kernel][1]
    # the versions lookups use first, then older ones; newest first among those
    ids = {id(s): kv_id for (kv_id, _), s in sections.items()}
    ordered = sorted(
        sections.values(), key=lambda s: (not s.current, s.kernel, s.device.name, s.device.id, -ids[id(s)])
    )
    for section in ordered:
        section.keys.sort(key=lambda k: _key_order(k.shape_key))
    return ordered


def _section(kv: Any, device: Any, sweeps: list[Any], template: Template | None, *, captured: bool) -> Section:
    """An empty section of one kernel version on one device, with its sweeps' count and time."""
    seconds = [s.wall_seconds or 0.0 for s in sweeps if (s.kernel_version_id, s.device_id) == (kv.id, device.id)]
    section = Section(
        kernel=kv.kernel, version=kv.version, device=device, sweeps=len(seconds), sweep_seconds=sum(seconds)
    )
    section.peer_name = template.peer_name if template is not None else ""
    if template is None and captured:
        section.template_note = f"'{kv.kernel}' is a captured triton.autotune kernel: no heuristic or roofline."
    elif template is None:
        section.template_note = f"Template '{kv.kernel}' is not installed here: no heuristic or roofline."
    elif template.version != kv.version:
        section.template_note = (
            f"The installed {kv.kernel} has version {template.version}; its heuristic and cost are used."
        )
    return section


def _traces(rows: list[Any], sweeps: dict[int, Any]) -> dict[str, Trace]:
    """The key's trials split by the strategy of the sweep that measured them.

    Seconds count from the start of the trial's sweep; a strategy's later sweep of the key (a
    resumed one) starts where its earlier one ended (its wall time), not after the pause between.
    Trials that a selector's cross-measuring stored (:func:`tunesvc.tuning.selector_measure.cross_measure`) are
    no search's: they are in the spread figure, not here.
    """
    traces: dict[str, Trace] = {}
    current: dict[str, int] = {}  # strategy -> the id of its sweep being read
    offset: dict[str, float] = defaultdict(float)  # strategy -> seconds of its earlier sweeps
    since_start: dict[int, float] = {}  # sweep id -> seconds to its latest trial
    for t in rows:
        sweep = sweeps.get(t.sweep_id)
        strategy = sweep.strategy if sweep is not None else "?"
        if strategy in (CROSS_MEASURE, CROSS_RETIME):
            continue
        trace = traces.setdefault(strategy, Trace(strategy))
        previous = current.get(strategy)
        if previous is not None and previous != t.sweep_id:
            wall = sweeps[previous].wall_seconds if previous in sweeps else None
            offset[strategy] += wall if wall is not None else since_start[previous]  # None: it was killed
        current[strategy] = t.sweep_id
        since = 0.0
        if sweep is not None and sweep.started_at is not None and t.created_at is not None:
            since = max(0.0, (t.created_at - sweep.started_at).total_seconds())
        since_start[t.sweep_id] = since
        trace.index.append(len(trace.index) + 1)
        trace.seconds.append(offset[strategy] + since)
        trace.times.append(t.time_ms if t.status == "ok" and t.time_ms is not None else None)
    return traces


def _peer_ms(timed: list[Any], winner_trial: Any, problem: dict[str, Any] | None) -> float | None:
    """The peer's time on the problem the winner was measured on: its sweep's, else the latest
    sweep of that problem that timed it; None where none did (sweeps before revision 0004)."""
    if winner_trial is not None:
        own = next((s for s in timed if s.id == winner_trial.sweep_id), None)
        if own is not None:
            return own.peer_ms
    same = [s for s in timed if problem is not None and dict(s.problem) == problem]
    return same[-1].peer_ms if same else None


def _template(name: str, allowed: tuple[str | None, ...] = ()) -> Template | None:
    try:
        # a name from the database: never a module path the data chooses (see template_named_by_data)
        return template_named_by_data(name, allowed)
    except Exception:  # a user's template that is not importable here: report without it
        return None


def _fill_template_numbers(report: KeyReport, template: Template | None, device: Any, rows: list[Any]) -> None:
    """Heuristic time, achieved TFLOP/s and roofline fraction: each stays None when unknown."""
    if template is None or report.problem is None:
        return
    try:
        heuristic = template.heuristic(report.problem, _device(device))
        cost = template.cost(report.problem)
    except Exception:
        return
    h = config_hash(heuristic)
    measured = next((t for t in rows if t.config_hash == h and t.status == "ok"), None)
    report.heuristic_ms = measured.time_ms if measured else None
    if not report.winner_ms:
        return
    seconds = report.winner_ms * 1e-3
    report.tflops = cost.flops / seconds / 1e12
    peak = LISTED_PEAKS.get(device.name) if device.kind == "cuda" else None
    peak_flops = peak.flops.get(report.problem.get("dtype", "")) if peak else None
    if peak is None or peak_flops is None:
        return
    compute_s, memory_s = cost.flops / peak_flops, cost.bytes / peak.bytes_per_s
    report.roofline = max(compute_s, memory_s) / seconds
    report.bound = "compute" if compute_s >= memory_s else "memory"


def _device(row: Any) -> Device:
    return Device(**{f: getattr(row, f) for f in Device.__dataclass_fields__})


def _key_order(key: str) -> tuple:
    """Shape keys by their dims as numbers (M=16 before M=128), then the rest."""
    parts = [p.partition("=") for p in key.split(",")]
    return tuple((0, int(v), "") if v.isascii() and v.isdigit() else (1, 0, v) for _, _, v in parts)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
