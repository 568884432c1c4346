"""`tune report`: one self-contained HTML page about a database, to look at rather than read.

It opens with a summary (per kernel and device: the tuned kernels' speed-up over their torch
peers, as a geometric mean, best and worst) and a table of contents. By default it shows the
kernel versions that lookups use (the installed template's; for a captured or uninstalled
kernel, its newest stored version); ``all_versions`` adds the older ones, under their own
headings. Per kernel version and device: a table of the winners (tuned time against the heuristic's
trial, when the sweep measured it, and against the template's torch peer, when the sweep timed
it; achieved TFLOP/s; the fraction of the device's roofline from the template's
``cost(problem)`` and a small table of listed peaks), two convergence figures (best-so-far time
against trial index and against seconds of sweeping, one panel per shape key, one line per
search strategy) and a spread figure (every correct trial's time relative to the key's winner).

The page has no JavaScript and loads nothing: the figures are PNGs (256-colour palettes, a third
of the bytes of full colour for line plots) embedded as base64 data URIs, each stored once. The
database is only read.
"""

from __future__ import annotations

import base64
import html
import io
import math
import re
import textwrap
from collections import defaultdict
from dataclasses import dataclass
from dataclasses import field
from datetime import UTC
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import Protocol

import numpy as np

from tunesvc.device import Device
from tunesvc.errors import TunesvcError
from tunesvc.space import config_hash
from tunesvc.template import template_named_by_data
from tunesvc.text import figure_text
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

REPORT_FILE = "report.html"
#: figures' resolution: 1026 px for three panels side by side, within the page's widest column; 90, not 100:
#: the example database's report stays under 1.5 MB (its figures are most of it)
DPI = 90
#: the figures of each section, in page order: kind -> caption
FIGURES = {
    "convergence": "Convergence by trial: every correct trial's time (dots) and the best so far (line), by trial "
    "index in the order measured; one line per search strategy where a key was swept with several.",
    "convergence-time": "Convergence by time: the same, against seconds since the sweep started (compiling, checking "
    "and timing included; a strategy's later sweeps of a key continue where its earlier ones ended).",
    "spread": "Spread: every correct trial's time relative to its shape key's winner (1 = the winner).",
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
    def peer_speedups(self) -> list[tuple[float, KeyReport]]:
        """(speed-up over the peer, key) of every key whose peer was timed."""
        return [(k.peer_speedup, k) for k in self.keys if k.peer_speedup is not None]

    @property
    def title(self) -> str:
        what = f"{self.kernel} on {self.device.name}"
        if self.current:
            return what
        return f"{what}: older version {self.version} (lookups use {self.lookup_version or 'another'})"


def write_report(
    store: Store,
    out_dir: str | Path,
    kernel: str | None = None,
    *,
    all_versions: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Write ``report.html`` into ``out_dir``; returns its path. ``all_versions`` adds the kernel
    versions lookups no longer use; ``progress`` is told each step (reading, each figure)."""
    from tunesvc.files import check_replaceable
    from tunesvc.files import write_atomically

    out = Path(out_dir)
    try:
        if out.exists() and not out.is_dir():
            raise TunesvcError(f"{out} is a file; pass a folder to --out.")
    except OSError as exc:  # a name too long, a folder that may not be looked into
        raise TunesvcError(f"Cannot use --out {_cut(str(out))}: {exc.strerror}; pass another folder.") from None
    tell = progress or (lambda what, step, total: None)
    tell("reading the database", 0, 1)
    found = collect(store, kernel=kernel)
    tell("reading the database", 1, 1)
    sections = [s for s in found if all_versions or s.current]
    if not found:
        what = f" of kernel '{kernel}'{_did_you_mean(store, kernel)}" if kernel else ""
        raise TunesvcError(f"Nothing to report: {store.where} holds no trials{what}; run `tune sweep` first.")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TunesvcError(f"Cannot create {_cut(str(out))}: {exc.strerror}.") from None
    path = out / REPORT_FILE
    # before the figures are drawn: a planted link or a file of someone else's is refused at once
    check_replaceable(path, _is_report, "tunesvc report")
    figures: dict[str, dict[str, str]] = {}
    draw = {
        "convergence": lambda section: convergence_figure(section, by="trial"),
        "convergence-time": lambda section: convergence_figure(section, by="seconds"),
        "spread": _spread_figure,
    }
    total, step = len(sections) * len(FIGURES), 0
    for section in sections:
        figures[section.slug] = {}
        for kind in FIGURES:
            figure = draw[kind](section)
            if figure is not None:
                figures[section.slug][kind] = base64.b64encode(_png(figure)).decode("ascii")
            step += 1
            tell("drawing figures", step, total)
    try:
        write_atomically(path, _html(store, sections, figures, kernel, left_out=_left_out(found, sections)))
    except OSError as exc:  # a read-only or full --out: say so
        raise TunesvcError(
            f"Cannot write the report into {out}: {exc.strerror}; pass a writable folder to --out."
        ) from None
    return path


def _is_report(path: Path) -> bool:
    """Whether ``path`` is a page this module wrote (which a new report replaces)."""
    try:
        with path.open("rb") as handle:
            head = handle.read(4096)
    except OSError:
        return False
    return head.startswith(b"<!DOCTYPE html>") and b"<title>tunesvc report: " in head


def _cut(text: str, most: int = 80) -> str:
    """A long path cut for a message."""
    return text if len(text) <= most else f"{text[: most - 20]}...{text[-17:]}"


def _did_you_mean(store: Store, kernel: str) -> str:
    from tunesvc.template import SHIPPED
    from tunesvc.template import did_you_mean

    if kernel in SHIPPED:  # a kernel known here, only not swept
        return ""
    return did_you_mean(kernel, [*sorted({w.kernel for w in store.winners()}), *SHIPPED])


def _left_out(found: list[Section], shown: list[Section]) -> dict[str, int]:
    """Kernel -> how many of its (version, device) sections the page leaves out."""
    counts: dict[str, int] = defaultdict(int)
    kept = {id(s) for s in shown}
    for section in found:
        if id(section) not in kept:
            counts[section.kernel] += 1
    return dict(counts)


# -- data ------------------------------------------------------------------------------------------
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
    return tuple((0, int(v), "") if v.isdigit() else (1, 0, v) for _, _, v in parts)


# -- figures ---------------------------------------------------------------------------------------
def _new_figure(width: float, height: float):
    # matplotlib is heavy (half a second): imported only to draw, never to read a database
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)  # Agg, without touching pyplot's global backend
    return figure


def _png(figure) -> bytes:
    """The figure as a PNG of a 256-colour palette: lines, dots and text on white need no more,
    and the page is a third of the size."""
    from PIL import Image  # matplotlib's own dependency: heavy, imported only to draw

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", facecolor="white", metadata={"Software": None})
    image = Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")
    quantized = image.quantize(colors=256, method=Image.Quantize.FASTOCTREE)
    # the octree averages the background to (254, 254, 254): white again, as the page around it
    palette = quantized.getpalette() or []
    for i in range(0, len(palette) - 2, 3):
        if min(palette[i : i + 3]) >= 250:
            palette[i : i + 3] = [255, 255, 255]
    quantized.putpalette(palette)
    buffer = io.BytesIO()
    quantized.save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def _title(text: str, width_in: float) -> str:
    """``text`` wrapped to a figure ``width_in`` inches wide at 10 pt, so no title runs off it."""
    return "\n".join(textwrap.wrap(text, width=max(30, int(width_in * 12)), break_on_hyphens=False))


def _lowest_tick_at_or_below(ax, value: float) -> None:
    """Start the y axis at a labelled tick at or below ``value`` (the best time), so the best time
    never sits below the lowest number on the axis. The ticks are fixed here: matplotlib's own
    choice depends on the panel's final height, which the layout decides later."""
    from matplotlib.ticker import FixedLocator
    from matplotlib.ticker import MaxNLocator

    high = ax.get_ylim()[1]
    if ax.get_yscale() == "log":
        # labelled: 1, 2, 3 and 5 per decade (see _plain_log_ticks)
        decade = 10 ** math.floor(math.log10(value))
        ax.set_ylim(max(m * decade for m in (1, 2, 3, 5) if m * decade <= value * (1 + 1e-9)), high)
        return
    ticks = [float(t) for t in MaxNLocator(nbins=6).tick_values(value, high)]
    ticks = [t for t in ticks if t <= value * (1 + 1e-9)][-1:] + [t for t in ticks if t > value * (1 + 1e-9)]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.set_ylim(ticks[0], high)


#: line colours of the strategies of one figure, in the order they first appear
STRATEGY_COLORS = ("#c0392b", "#2471a3", "#229954", "#8e44ad", "#d68910", "#17202a")


def convergence_figure(section: Section, by: str = "trial"):
    """One panel per shape key: every correct trial's time (dots) and each strategy's best so far
    (a line labelled with the strategy's name), against trial index (``by="trial"``) or seconds
    since the sweep started (``by="seconds"``). A matplotlib Figure, or None with nothing to draw."""
    # matplotlib is heavy: imported only to draw
    from matplotlib.ticker import MaxNLocator

    if by not in ("trial", "seconds"):
        raise ValueError(f"by must be 'trial' or 'seconds', not {by!r}")
    keys = [k for k in section.keys if k.ok_times]
    if not keys:
        return None
    strategies = list(dict.fromkeys(s for k in keys for s in k.traces))
    colors = {s: STRATEGY_COLORS[i % len(STRATEGY_COLORS)] for i, s in enumerate(strategies)}
    columns = min(3, len(keys))
    rows = math.ceil(len(keys) / columns)
    width = max(3.8 * columns, 6.4)  # one panel is as wide as the title needs
    figure = _new_figure(width, 2.7 * rows + 0.5)
    axes = figure.subplots(rows, columns, squeeze=False)
    for ax in axes.flat[len(keys) :]:
        ax.set_visible(False)
    shown: set[tuple[str, ...]] = set()
    for ax, key in zip(axes.flat, keys):
        for strategy, trace in key.traces.items():
            x_all = trace.index if by == "trial" else trace.seconds
            dots = [(x, t) for x, t in zip(x_all, trace.times) if t is not None]
            line = [(x, b) for x, b in zip(x_all, trace.best_so_far) if b is not None]
            if not dots:
                continue
            color = colors[strategy]
            ax.scatter(*zip(*dots), s=11, color=color, alpha=0.4, linewidths=0, zorder=2)
            ax.step(*zip(*line), where="post", color=color, linewidth=1.8, label=figure_text(strategy), zorder=3)
        times = key.ok_times
        if max(times) / min(times) > 4:
            ax.set_yscale("log")
            _plain_log_ticks(ax.yaxis)
        _lowest_tick_at_or_below(ax, min(times))
        ax.set_title(figure_text(f"{_short_key(key.shape_key)}: best {min(times):.4g} ms"), fontsize=9)
        ax.set_xlabel("trial" if by == "trial" else "seconds since the sweep started", fontsize=8)
        if by == "trial":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("ms", fontsize=8)
        ax.tick_params(which="both", labelsize=7)
        ax.grid(True, alpha=0.3, linewidth=0.5)
        # a legend where the panel's strategies are not those of a panel already showing one
        labels = tuple(label for label in ax.get_legend_handles_labels()[1])
        if labels and labels not in shown:
            shown.add(labels)
            ax.legend(fontsize=7, loc="upper right", title="best so far", title_fontsize=7)
    what = "trial" if by == "trial" else "seconds of sweeping"
    title = f"Convergence: best-so-far time by {what} ({section.kernel} on {section.device.name})"
    figure.suptitle(_title(figure_text(title), width), fontsize=10)
    return figure


def _spread_figure(section: Section):
    """Per shape key, every correct trial's time over the winner's (1 = the winner)."""
    keys = [k for k in section.keys if k.ok_times]
    if not keys:
        return None
    figure = _new_figure(9.5, 0.55 * len(keys) + 1.4)
    ax = figure.subplots()
    rng = np.random.default_rng(0)  # the same jitter every time: reports can be compared
    largest = 1.0
    for row, key in enumerate(keys):
        times = np.array(key.ok_times)
        ratios = times / times.min()
        largest = max(largest, float(ratios.max()))
        y = row + rng.uniform(-0.18, 0.18, size=len(ratios))
        ax.scatter(ratios, y, s=10, color="#2e86c1", alpha=0.6, zorder=2)
        q1, median, q3 = np.percentile(ratios, [25, 50, 75])
        ax.hlines(row, q1, q3, color="#1b2631", linewidth=4, alpha=0.35, zorder=1)
        ax.plot([median, median], [row - 0.3, row + 0.3], color="#c0392b", linewidth=2, zorder=3)
    if largest > 3:  # a log axis labels too little of a narrow range
        ax.set_xscale("log")
        _plain_log_ticks(ax.xaxis)
    ax.set_xlim(0.97, largest * 1.1 if largest > 3 else largest + 0.05 * (largest - 0.97) + 0.01)
    ax.set_yticks(range(len(keys)), [figure_text(_short_key(k.shape_key)) for k in keys], fontsize=8)
    ax.set_ylim(len(keys) - 0.5, -0.5)
    ax.axvline(1.0, color="#27ae60", linewidth=1, linestyle="--")
    scale = "log scale; " if largest > 3 else ""
    ax.set_xlabel(f"trial time / winner time ({scale}bar: middle half, red tick: median)", fontsize=8)
    ax.tick_params(axis="x", which="both", labelsize=8)
    ax.grid(True, axis="x", which="both", alpha=0.3, linewidth=0.5)
    title = f"Spread of correct trials relative to the winner ({section.kernel} on {section.device.name})"
    ax.set_title(_title(figure_text(title), 9.5), fontsize=10)
    return figure


def _plain_log_ticks(axis) -> None:
    """Log-axis labels as plain numbers (0.05, 0.1, 0.2), not 5x10^-2: labels at 1, 2, 3 and 5 per decade."""
    # matplotlib is heavy: imported only to draw
    from matplotlib.ticker import FuncFormatter

    def minor(value: float, _position: int) -> str:
        mantissa = value / 10 ** math.floor(math.log10(value)) if value > 0 else 0
        return f"{value:g}" if round(mantissa, 6) in (2.0, 3.0, 5.0) else ""

    axis.set_major_formatter(FuncFormatter(lambda value, _position: f"{value:g}"))
    axis.set_minor_formatter(FuncFormatter(minor))


def _short_key(key: str) -> str:
    """M=4096,N=4096,K=4096,dtype=bfloat16 -> 4096x4096x4096 bfloat16 (dims in order); a flag by
    its name (causal=True -> causal, paged=False -> not paged), any other value as name=value."""
    parts = [p.partition("=") for p in key.split(",")]
    dims = [v for _, _, v in parts if v.isdigit()]
    rest = []
    for name, _, value in parts:
        if value.isdigit():
            continue
        if value in ("True", "False"):
            rest.append(name if value == "True" else f"not {name}")
        else:
            rest.append(value if name == "dtype" else f"{name}={value}")
    return " ".join(["x".join(dims), *rest]) if dims else key


# -- page --------------------------------------------------------------------------------------------
_CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, "DejaVu Sans", Arial, sans-serif; margin: 24px;
       color: #1b2631; max-width: 1400px; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #ccd; overflow-wrap: anywhere; }
h2.old { color: #6c3483; border-bottom: 1px dashed #a569bd; }
h2.part { font-size: 20px; margin-top: 40px; border-bottom: 2px solid #1b2631; }
.meta { color: #566573; font-size: 13px; margin: 2px 0; overflow-wrap: anywhere; }
.wide { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; font-size: 13px; margin: 12px 0; }
th, td { border: 1px solid #d5d8dc; padding: 4px 6px; text-align: right; white-space: nowrap; }
td.w { white-space: normal; min-width: 110px; } th { white-space: normal; }
td.k { white-space: normal; min-width: 120px; }
th { background: #eaf2f8; } td.l, th.l { text-align: left; }
tr:nth-child(even) td { background: #f8f9f9; }
td.slow, tr:nth-child(even) td.slow { color: #922b21; background: #fadbd8; font-weight: 600; }
td.fast { color: #1e8449; }
.sub { font-size: 11px; color: #566573; font-weight: normal; white-space: normal; }
code { font-size: 12px; overflow-wrap: anywhere; }
nav ol { font-size: 14px; margin: 6px 0; } nav li { margin: 2px 0; }
figure { margin: 16px 0; } figure img { max-width: 100%; height: auto; box-sizing: border-box; border: 1px solid #e5e8e8; }
figcaption { font-size: 12px; color: #566573; }
.note { font-size: 12px; color: #566573; max-width: 900px; }
"""

#: what the speed-up over the peer is, wherever the page shows one
SPEEDUP_NOTE = (
    "Speed-up over the peer: peer ms / tuned ms, the torch equivalent's time over the tuned kernel's on the same "
    "inputs; above 1 the tuned kernel is faster, below 1 (red) it is slower."
)


#: where the page's speed-ups come from, and what they are not
SWEEP_FIGURES_NOTE = (
    "These are the sweeps' own figures, read from this database: each key's peer (the template's, named under its "
    "kernel) timed once by the sweep that tuned the key, in the same way as its candidates, on every key the database "
    "holds. "
    "They are not the benchmark scripts' figures (benchmarks/RESULTS.md, and the README's performance table made "
    "from its CSVs), which time the presets' shapes only, with CUDA graphs or do_bench, against the peers named "
    "there (torch.compile for the norms): the two differ in shapes, peers and timing."
)


def _html(
    store: Store,
    sections: list[Section],
    figures: dict[str, dict[str, str]],
    kernel: str | None,
    left_out: dict[str, int] | None = None,
) -> str:
    e = html.escape
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    trials = sum(len(k.trials) for s in sections for k in s.keys)
    current = [s for s in sections if s.current]
    older = [s for s in sections if not s.current]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>tunesvc report: {e(store.where)}</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>tunesvc report</h1>",
        f'<p class="meta">Database <code>{e(store.where)}</code>'
        + (f", kernel <code>{e(kernel)}</code>" if kernel else "")
        + f"; {len(current)} kernel/device section(s) of the kernel versions lookups use"
        + (f", {len(older)} of older versions" if older else "")
        + f", {trials} trials; written {e(now)}.</p>",
    ]
    parts += _summary_html(current, left_out or {})
    parts += _contents_html(current, older)
    if current:
        parts.append('<h2 class="part" id="current">Kernel versions lookups use</h2>')
    for section in current:
        parts += _section_html(section, figures.get(section.slug, {}))
    if older:
        parts.append('<h2 class="part" id="older">Older kernel versions (lookups no longer use them)</h2>')
    for section in older:
        parts += _section_html(section, figures.get(section.slug, {}))
    parts += _peaks_html()
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _ratio_cell(value: float | None, text: str | None = None, under: str = "") -> str:
    """A speed-up's cell: red below 1 (slower than what it is compared with), green above;
    ``under``: a second, smaller line (what the value belongs to)."""
    if value is None:
        return "<td>-</td>"
    css = "slow" if value < 1 else "fast"
    sub = f'<br><span class="sub">{html.escape(under)}</span>' if under else ""
    return f'<td class="{css}">{html.escape(text or f"{value:.3g}x")}{sub}</td>'


def _summary_html(sections: list[Section], left_out: dict[str, int]) -> list[str]:
    e = html.escape
    out = [
        '<h2 id="summary">Summary</h2>',
        '<div class="wide"><table><thead><tr><th class="l">kernel</th><th class="l">device</th><th>shape keys</th>'
        "<th>keys with a peer timed</th><th>speed-up over the peer: geometric mean</th><th>best (shape)</th>"
        "<th>worst (shape)</th></tr></thead><tbody>",
    ]
    for section in sections:
        ratios = section.peer_speedups
        row = [
            f'<td class="l"><a href="#{e(section.slug)}">{e(section.kernel)}</a>'
            + (f'<br><span class="sub">peer: {e(section.peer_name)}</span>' if section.peer_name else "")
            + "</td>",
            f'<td class="l">{e(section.device.name)}</td>',
            f"<td>{len(section.keys)}</td>",
            f"<td>{len(ratios)}</td>",
        ]
        if ratios:
            best, worst = max(ratios, key=lambda r: r[0]), min(ratios, key=lambda r: r[0])
            row.append(_ratio_cell(_geomean([r for r, _ in ratios])))
            for value, key in (best, worst):
                row.append(_ratio_cell(value, under=_short_key(key.shape_key)))
        else:
            row += ["<td>-</td>"] * 3
        out.append("<tr>" + "".join(row) + "</tr>")
    # a kernel whose every section is of an older version: a row that says so, not nothing
    for name in sorted(set(left_out) - {s.kernel for s in sections}):
        out.append(
            f'<tr><td class="l">{e(name)}</td><td class="l" colspan="6">no trials of the version lookups use; '
            f"{_count(left_out[name], 'section')} of older versions (<code>--all-versions</code>)</td></tr>"
        )
    out.append("</tbody></table></div>")
    note = SPEEDUP_NOTE + ' "-": no sweep of that kernel timed its peer. ' + html.escape(SWEEP_FIGURES_NOTE)
    if left_out:
        older = ", ".join(f"{k} ({n})" for k, n in sorted(left_out.items()))
        note += (
            f" Left out: sections of kernel versions lookups no longer use, {older}; "
            "<code>tune report --all-versions</code> shows them."
        )
    out.append(f'<p class="note">{note}</p>')
    return out


def _contents_html(current: list[Section], older: list[Section]) -> list[str]:
    e = html.escape

    def items(sections: list[Section]) -> str:
        return "".join(f'<li><a href="#{e(s.slug)}">{e(s.title)}</a></li>' for s in sections)

    out = ['<nav><h2 id="contents">Contents</h2><ol>', '<li><a href="#summary">Summary</a></li>']
    if current:
        out.append(f'<li><a href="#current">Kernel versions lookups use</a><ol>{items(current)}</ol></li>')
    if older:
        out.append(f'<li><a href="#older">Older kernel versions</a><ol>{items(older)}</ol></li>')
    out.append('<li><a href="#peaks">Listed peaks</a></li></ol></nav>')
    return out


def _section_html(section: Section, figures: dict[str, str]) -> list[str]:
    e = html.escape
    d = section.device
    software = ", ".join(
        f"{k} {v}" for k, v in (("driver", d.driver), ("CUDA", d.cuda), ("torch", d.torch), ("Triton", d.triton)) if v
    )
    trials = sum(len(k.trials) for k in section.keys)
    failed = sum(k.failed for k in section.keys)
    css = "" if section.current else ' class="old"'
    out = [
        f'<h2 id="{e(section.slug)}"{css}>{e(section.title)}</h2>',
        f'<p class="meta">Hardware id <code>{e(d.hardware_id)}</code>; {e(software)}. '
        f"Kernel version <code>{e(section.version)}</code>. {_count(len(section.keys), 'shape key')}, "
        f"{_count(trials, 'trial')} ({failed} failed or invalid), {_count(section.sweeps, 'sweep run')}, "
        f"{section.sweep_seconds:.0f} s of sweeping.</p>",
    ]
    if section.template_note:
        out.append(f'<p class="note">{e(section.template_note)}</p>')
    return out + _winners_table(section) + [_winners_note(section)] + _figures_html(section, figures)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


#: the winners table's columns: header, CSS class
WINNER_COLUMNS = [
    ("shape key (problem measured)", "l"),
    ("winner config", "l"),
    ("tuned ms", ""),
    ("heuristic ms", ""),
    ("speed-up over heuristic", ""),
    ("peer ms", ""),
    ("speed-up over peer (peer / tuned)", ""),
    ("TFLOP/s", ""),
    ("of roofline (listed peak)", ""),
    ("trials (failed)", ""),
]


def _winners_table(section: Section) -> list[str]:
    e = html.escape
    out = ['<div class="wide"><table><thead><tr>']
    out.append("".join(f'<th class="{c}">{e(h)}</th>' for h, c in WINNER_COLUMNS))
    out.append("</tr></thead><tbody>")
    for k in section.keys:
        over_heuristic = k.heuristic_ms / k.winner_ms if k.heuristic_ms and k.winner_ms else None
        roofline = f"{k.roofline:.0%} ({k.bound})" if k.roofline is not None else "-"
        # a break opportunity after each comma: long shape keys wrap instead of widening the table
        key = e(k.shape_key).replace(",", ",<wbr>")
        config = _config_text(k.winner_config) if k.winner_config else "no correct trial"
        out.append(
            "<tr>"
            f'<td class="l k">{key}<br><span class="sub">{e(_problem_text(k.problem))}</span></td>'
            f'<td class="l w">{e(config)}</td>'
            f"<td>{_ms(k.winner_ms)}</td>"
            f"<td>{_ms(k.heuristic_ms)}</td>"
            + _ratio_cell(over_heuristic, f"{over_heuristic:.2f}x" if over_heuristic else None)
            + f"<td>{_ms(k.peer_ms)}</td>"
            # 3 digits: the interpreter is 1000x slower
            + _ratio_cell(k.peer_speedup)
            + f"<td>{f'{k.tflops:.3g}' if k.tflops is not None else '-'}</td>"
            f"<td>{e(roofline)}</td>"
            f"<td>{len(k.trials)} ({k.failed})</td>"
            "</tr>"
        )
    out.append("</tbody></table></div>")
    return out


def _winners_note(section: Section) -> str:
    e = html.escape
    d = section.device
    peak = LISTED_PEAKS.get(d.name) if d.kind == "cuda" else None
    roofline = (
        f"the time the template's FLOPs and bytes would take at the listed peak of the {e(d.name)} (see the "
        "table at the end), over the tuned time"
        if peak
        else '"-": no listed peak for this device'
    )
    peer = e(section.peer_name) if section.peer_name else "the template's torch equivalent"
    return (
        '<p class="note">heuristic ms: the trial of the config the template\'s heuristic picks for this problem and '
        f'device (sweeps measure it first); "-" where it was not measured. peer ms: {peer}, timed once by the '
        f"sweep on the same inputs and in the same way as the candidates. {e(SPEEDUP_NOTE)} "
        '"-" where no sweep timed a peer (sweeps before schema revision 0004, a template without one, or a peer '
        f"that failed). Roofline: {roofline}.</p>"
    )


def _figures_html(section: Section, figures: dict[str, str]) -> list[str]:
    e = html.escape
    strategies = list(dict.fromkeys(s for k in section.keys for s in k.traces))
    out = []
    for kind, caption in FIGURES.items():
        if kind in figures:
            alt = f"{kind} of {section.kernel} on {section.device.name}"
            if kind.startswith("convergence"):
                caption += f" Strategies: {', '.join(strategies)}."
                alt += f" (strategies: {', '.join(strategies)})"
            out.append(
                f'<figure><img alt="{e(alt)}" src="data:image/png;base64,{figures[kind]}">'
                f"<figcaption>{e(caption)}</figcaption></figure>"
            )
    return out


def _peaks_html() -> list[str]:
    e = html.escape
    rows = [
        f'<tr><td class="l">{e(name)}</td><td>{_tflops_text(p.flops)}</td><td>{p.bytes_per_s / 1e12:.3g}</td></tr>'
        for name, p in LISTED_PEAKS.items()
    ]
    return [
        '<h2 id="peaks">Listed peaks</h2>',
        '<p class="note">The roofline uses these listed peaks (vendor datasheet, dense tensor-core rates, no '
        'sparsity), not measured ones; other devices, other dtypes and Triton\'s CPU interpreter show "-".</p>',
        '<table><thead><tr><th class="l">device</th><th>listed peak TFLOP/s</th><th>listed peak TB/s</th></tr></thead><tbody>',
        *rows,
        "</tbody></table>",
    ]


def _tflops_text(flops: dict[str, float]) -> str:
    by_value: dict[float, list[str]] = defaultdict(list)
    for dtype, value in flops.items():
        by_value[value].append(dtype)
    return "; ".join(f"{v / 1e12:.4g} ({'/'.join(sorted(d))})" for v, d in by_value.items())


_SHORT = {"num_warps": "warps", "num_stages": "stages"}


def _config_text(config: dict[str, int]) -> str:
    return " ".join(f"{_SHORT.get(k, k.replace('BLOCK_', 'B'))}={v}" for k, v in config.items())


def _problem_text(problem: dict[str, Any] | None) -> str:
    """The dims of the problem measured, in order (a shape key may round them up): 1000x3000x777."""
    if not problem:
        return "-"
    dims = [str(v) for v in problem.values() if isinstance(v, int) and not isinstance(v, bool)]
    rest = [f"{k}={v}" for k, v in problem.items() if not isinstance(v, int) and k != "dtype"]
    return " ".join(["x".join(dims), *rest])


def _ms(value: float | None) -> str:
    return f"{value:.4g}" if value else "-"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
