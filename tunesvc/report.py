"""`tune report`: one self-contained HTML page about a database, to look at rather than read.

Per kernel (version) and device: a table of the winners (tuned time against the heuristic's
trial, when the sweep measured it; achieved TFLOP/s; the fraction of the device's roofline from
the template's ``cost(problem)`` and a small table of listed peaks), a convergence figure
(best-so-far time against trial index, one panel per shape key) and a spread figure (every
correct trial's time relative to the key's winner).

The page has no JavaScript and loads nothing: the figures are PNGs embedded as base64 data URIs,
and the same PNGs are written beside it. The database is only read.
"""

from __future__ import annotations

import base64
import html
import io
import math
import re
from collections import defaultdict
from dataclasses import dataclass
from dataclasses import field
from datetime import datetime
from datetime import timezone
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import make_url

from tunesvc.errors import TunesvcError
from tunesvc.space import config_hash
from tunesvc.store.models import KernelVersion
from tunesvc.store.models import StoredDevice
from tunesvc.store.models import Sweep
from tunesvc.store.models import Trial
from tunesvc.store.models import Winner

if TYPE_CHECKING:
    from tunesvc.store import Store
    from tunesvc.template import Template


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

    @property
    def slug(self) -> str:
        return _slug(f"{self.kernel}-{self.version}-{self.device.name}-d{self.device.id}")


def write_report(store: Store, out_dir: str | Path, kernel: str | None = None) -> Path:
    """Write ``report.html`` and its PNG figures into ``out_dir``; returns the HTML's path."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise TunesvcError(f"{out} is a file; pass a folder to --out.")
    sections = collect(store, kernel=kernel)
    if not sections:
        what = f" of kernel '{kernel}'" if kernel else ""
        raise TunesvcError(f"Nothing to report: {_where(store)} holds no trials{what}; run `tune sweep` first.")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TunesvcError(f"Cannot create {out}: {exc.strerror}.") from None
    figures: dict[str, dict[str, str]] = {}
    for section in sections:
        figures[section.slug] = {}
        for kind, draw in (("convergence", _convergence_figure), ("spread", _spread_figure)):
            png = draw(section)
            if png is None:
                continue
            name = f"{section.slug}-{kind}.png"
            (out / name).write_bytes(png)
            figures[section.slug][kind] = base64.b64encode(png).decode("ascii")
    path = out / REPORT_FILE
    path.write_text(_html(store, sections, figures, kernel), encoding="utf-8")
    return path


# -- data ------------------------------------------------------------------------------------------
def collect(store: Store, kernel: str | None = None) -> list[Section]:
    """Every (kernel version, device) with trials, its keys, winners, heuristic times and rooflines."""
    # named columns, not whole rows: a database of an older schema (which a read-only store
    # cannot upgrade) still has every column read here
    device_columns = [getattr(StoredDevice, f) for f in ("id", "hardware_id", *_device_fields())]
    with store.session() as session:
        versions = {kv.id: kv for kv in session.execute(select(KernelVersion.id, KernelVersion.kernel, KernelVersion.version))}
        devices = {d.id: d for d in session.execute(select(*device_columns))}
        query = select(
            Trial.id, Trial.sweep_id, Trial.kernel_version_id, Trial.device_id, Trial.shape_key,
            Trial.config_hash, Trial.status, Trial.time_ms,
        ).order_by(Trial.id)
        if kernel is not None:
            query = query.join(KernelVersion, Trial.kernel_version_id == KernelVersion.id).where(KernelVersion.kernel == kernel)
        trials = session.execute(query).all()
        winners = {
            (w.kernel_version_id, w.device_id, w.shape_key): w
            for w in session.execute(select(
                Winner.kernel_version_id, Winner.device_id, Winner.shape_key, Winner.config, Winner.time_ms, Winner.trial_id
            ))
        }
        sweeps = session.execute(select(
            Sweep.id, Sweep.kernel_version_id, Sweep.device_id, Sweep.shape_key, Sweep.problem, Sweep.wall_seconds
        ).order_by(Sweep.id)).all()
    problem_of_sweep = {s.id: dict(s.problem) for s in sweeps}
    latest_problem: dict[tuple[int, int, str], dict] = {}
    sweep_stats: dict[tuple[int, int], list[float]] = defaultdict(list)
    for s in sweeps:
        latest_problem[(s.kernel_version_id, s.device_id, s.shape_key)] = dict(s.problem)
        sweep_stats[(s.kernel_version_id, s.device_id)].append(s.wall_seconds or 0.0)
    trials_of: dict[tuple[int, int, str], list[Any]] = defaultdict(list)
    for t in trials:
        trials_of[(t.kernel_version_id, t.device_id, t.shape_key)].append(t)

    sections: dict[tuple[int, int], Section] = {}
    templates: dict[str, Template | None] = {}
    for (kv_id, device_id, key), rows in trials_of.items():
        kv, device = versions[kv_id], devices[device_id]
        section = sections.get((kv_id, device_id))
        if section is None:
            stats = sweep_stats.get((kv_id, device_id), [])
            section = sections[(kv_id, device_id)] = Section(
                kernel=kv.kernel, version=kv.version, device=device, sweeps=len(stats), sweep_seconds=sum(stats)
            )
            if kv.kernel not in templates:
                templates[kv.kernel] = _template(kv.kernel)
            template = templates[kv.kernel]
            if template is None:
                section.template_note = f"Template '{kv.kernel}' is not installed here: no heuristic or roofline."
            elif template.version != kv.version:
                section.template_note = (
                    f"The installed {kv.kernel} has version {template.version}; its heuristic and cost are used."
                )
        winner = winners.get((kv_id, device_id, key))
        by_id = {t.id: t for t in rows}
        winner_trial = by_id.get(winner.trial_id) if winner else None
        # the problem the winner was measured on (a key buckets several problems), else the latest
        problem = problem_of_sweep.get(winner_trial.sweep_id) if winner_trial else None
        problem = problem or latest_problem.get((kv_id, device_id, key))
        report = KeyReport(shape_key=key, problem=problem, trials=rows)
        if winner is not None:
            report.winner_config, report.winner_ms = dict(winner.config), winner.time_ms
        _fill_template_numbers(report, templates[kv.kernel], device, rows)
        section.keys.append(report)
    ordered = sorted(sections.values(), key=lambda s: (s.kernel, s.device.name, s.device.id, s.version))
    for section in ordered:
        section.keys.sort(key=lambda k: _key_order(k.shape_key))
    return ordered


def _template(name: str) -> Template | None:
    from tunesvc.template import get_template

    try:
        return get_template(name)
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


def _device_fields() -> list[str]:
    from tunesvc.device import Device

    return list(Device.__dataclass_fields__)


def _device(row: Any):
    from tunesvc.device import Device

    return Device(**{f: getattr(row, f) for f in _device_fields()})


def _key_order(key: str) -> tuple:
    """Shape keys by their dims as numbers (M=16 before M=128), then the rest."""
    parts = [p.partition("=") for p in key.split(",")]
    return tuple((0, int(v), "") if v.isdigit() else (1, 0, v) for _, _, v in parts)


# -- figures ---------------------------------------------------------------------------------------
def _new_figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)  # Agg, without touching pyplot's global backend
    return figure


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", facecolor="white", metadata={"Software": None})
    return buffer.getvalue()


def _convergence_figure(section: Section) -> bytes | None:
    """One panel per shape key: every correct trial's time (dots) and the best so far (line)."""
    from matplotlib.ticker import MaxNLocator

    keys = [k for k in section.keys if k.ok_times]
    if not keys:
        return None
    columns = min(3, len(keys))
    rows = math.ceil(len(keys) / columns)
    figure = _new_figure(3.8 * columns, 2.7 * rows + 0.5)
    axes = figure.subplots(rows, columns, squeeze=False)
    for ax in axes.flat[len(keys):]:
        ax.set_visible(False)
    for ax, key in zip(axes.flat, keys):
        index, times, best_index, best_times = [], [], [], []
        best = math.inf
        for i, t in enumerate(key.trials, start=1):
            if t.status == "ok" and t.time_ms is not None:
                index.append(i)
                times.append(t.time_ms)
                best = min(best, t.time_ms)
            if best < math.inf:
                best_index.append(i)
                best_times.append(best)
        ax.scatter(index, times, s=9, color="#9bb7d4", label="trial", zorder=2)
        ax.step(best_index, best_times, where="post", color="#c0392b", linewidth=1.8, label="best so far", zorder=3)
        if max(times) / min(times) > 4:
            ax.set_yscale("log")
            _plain_log_ticks(ax.yaxis)
        ax.set_title(_short_key(key.shape_key), fontsize=9)
        ax.set_xlabel("trial", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("ms", fontsize=8)
        ax.tick_params(which="both", labelsize=7)
        ax.grid(True, alpha=0.3, linewidth=0.5)
    axes.flat[0].legend(fontsize=7, loc="upper right")
    figure.suptitle(f"Convergence: best-so-far time by trial ({section.kernel} on {section.device.name})", fontsize=10)
    return _png(figure)


def _spread_figure(section: Section) -> bytes | None:
    """Per shape key, every correct trial's time over the winner's (1 = the winner)."""
    import numpy as np

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
    ax.set_yticks(range(len(keys)), [_short_key(k.shape_key) for k in keys], fontsize=8)
    ax.set_ylim(len(keys) - 0.5, -0.5)
    ax.axvline(1.0, color="#27ae60", linewidth=1, linestyle="--")
    scale = "log scale; " if largest > 3 else ""
    ax.set_xlabel(f"trial time / winner time ({scale}bar: middle half, red tick: median)", fontsize=8)
    ax.tick_params(axis="x", which="both", labelsize=8)
    ax.grid(True, axis="x", which="both", alpha=0.3, linewidth=0.5)
    ax.set_title(f"Spread of correct trials relative to the winner ({section.kernel} on {section.device.name})", fontsize=10)
    return _png(figure)


def _plain_log_ticks(axis) -> None:
    """Log-axis labels as plain numbers (0.05, 0.1, 0.2), not 5x10^-2: labels at 1, 2, 3 and 5 per decade."""
    from matplotlib.ticker import FuncFormatter

    def minor(value: float, _position: int) -> str:
        mantissa = value / 10 ** math.floor(math.log10(value)) if value > 0 else 0
        return f"{value:g}" if round(mantissa, 6) in (2.0, 3.0, 5.0) else ""

    axis.set_major_formatter(FuncFormatter(lambda value, _position: f"{value:g}"))
    axis.set_minor_formatter(FuncFormatter(minor))


def _short_key(key: str) -> str:
    """M=4096,N=4096,K=4096,dtype=bfloat16 -> 4096x4096x4096 bfloat16 (dims in order)."""
    parts = [p.partition("=") for p in key.split(",")]
    dims = [v for _, _, v in parts if v.isdigit()]
    rest = [v for _, _, v in parts if not v.isdigit()]
    return " ".join(["x".join(dims), *rest]) if dims else key


# -- page --------------------------------------------------------------------------------------------
_CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, "DejaVu Sans", Arial, sans-serif; margin: 24px;
       color: #1b2631; max-width: 1400px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #ccd; }
.meta { color: #566573; font-size: 13px; margin: 2px 0; }
table { border-collapse: collapse; font-size: 13px; margin: 12px 0; }
th, td { border: 1px solid #d5d8dc; padding: 4px 7px; text-align: right; white-space: nowrap; }
td.w { white-space: normal; min-width: 180px; } th { white-space: normal; }
th { background: #eaf2f8; } td.l, th.l { text-align: left; }
tr:nth-child(even) td { background: #f8f9f9; }
code { font-size: 12px; }
figure { margin: 16px 0; } figure img { max-width: 100%; border: 1px solid #e5e8e8; }
figcaption { font-size: 12px; color: #566573; }
.note { font-size: 12px; color: #566573; max-width: 900px; }
"""


def _html(store: Store, sections: list[Section], figures: dict[str, dict[str, str]], kernel: str | None) -> str:
    e = html.escape
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    trials = sum(len(k.trials) for s in sections for k in s.keys)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>tunesvc report: {e(_where(store))}</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>tunesvc report</h1>",
        f'<p class="meta">Database <code>{e(_where(store))}</code>'
        + (f", kernel <code>{e(kernel)}</code>" if kernel else "")
        + f"; {len(sections)} kernel/device section(s), {trials} trials; written {e(now)}.</p>",
    ]
    for section in sections:
        parts += _section_html(section, figures.get(section.slug, {}))
    parts += _peaks_html()
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _section_html(section: Section, figures: dict[str, str]) -> list[str]:
    e = html.escape
    d = section.device
    software = ", ".join(f"{k} {v}" for k, v in (("driver", d.driver), ("CUDA", d.cuda), ("torch", d.torch), ("Triton", d.triton)) if v)
    trials = sum(len(k.trials) for k in section.keys)
    failed = sum(k.failed for k in section.keys)
    out = [
        f'<h2 id="{e(section.slug)}">{e(section.kernel)} on {e(d.name)}</h2>',
        f'<p class="meta">Hardware id <code>{e(d.hardware_id)}</code>; {e(software)}. '
        f"Kernel version <code>{e(section.version)}</code>. {len(section.keys)} shape keys, {trials} trials "
        f"({failed} failed or invalid), {section.sweeps} sweep runs, {section.sweep_seconds:.0f} s of sweeping.</p>",
    ]
    if section.template_note:
        out.append(f'<p class="note">{e(section.template_note)}</p>')
    peak = LISTED_PEAKS.get(d.name) if d.kind == "cuda" else None
    out.append("<table><thead><tr>")
    headers = [("shape key", "l"), ("problem", "l"), ("winner config", "l"), ("tuned ms", ""), ("heuristic ms", ""),
               ("speed-up", ""), ("TFLOP/s", ""), ("of roofline (listed peak)", ""), ("trials", ""), ("failed", "")]
    out.append("".join(f'<th class="{c}">{e(h)}</th>' for h, c in headers))
    out.append("</tr></thead><tbody>")
    for k in section.keys:
        speedup = f"{k.heuristic_ms / k.winner_ms:.2f}x" if k.heuristic_ms and k.winner_ms else "-"
        roofline = f"{k.roofline:.0%} ({k.bound})" if k.roofline is not None else "-"
        cells = [
            (k.shape_key, "l"), (_problem_text(k.problem), "l"),
            (_config_text(k.winner_config) if k.winner_config else "no correct trial", "l w"),
            (_ms(k.winner_ms), ""), (_ms(k.heuristic_ms), ""), (speedup, ""),
            (f"{k.tflops:.3g}" if k.tflops is not None else "-", ""), (roofline, ""),
            (str(len(k.trials)), ""), (str(k.failed), ""),
        ]
        out.append("<tr>" + "".join(f'<td class="{c}">{e(v)}</td>' for v, c in cells) + "</tr>")
    out.append("</tbody></table>")
    roofline = (
        f"the time the template's FLOPs and bytes would take at the listed peak of the {e(d.name)} (see the "
        "table at the end), over the tuned time" if peak else "\"-\": no listed peak for this device"
    )
    out.append(
        '<p class="note">heuristic ms: the trial of the config the template\'s heuristic picks for this problem and '
        f"device (sweeps measure it first); \"-\" where it was not measured. Roofline: {roofline}.</p>"
    )
    for kind, caption in (
        ("convergence", "Convergence: every correct trial's time (dots) and the best so far (line), by trial index in the order measured."),
        ("spread", "Spread: every correct trial's time relative to its shape key's winner (1 = the winner)."),
    ):
        if kind in figures:
            alt = f"{kind} of {section.kernel} on {d.name}"
            out.append(
                f'<figure><img alt="{e(alt)}" src="data:image/png;base64,{figures[kind]}">'
                f"<figcaption>{e(caption)} Also saved as <code>{e(section.slug)}-{kind}.png</code>.</figcaption></figure>"
            )
    return out


def _peaks_html() -> list[str]:
    e = html.escape
    rows = [
        f'<tr><td class="l">{e(name)}</td><td>{_tflops_text(p.flops)}</td><td>{p.bytes_per_s / 1e12:.3g}</td></tr>'
        for name, p in LISTED_PEAKS.items()
    ]
    return [
        "<h2>Listed peaks</h2>",
        '<p class="note">The roofline uses these listed peaks (vendor datasheet, dense tensor-core rates, no '
        "sparsity), not measured ones; other devices, other dtypes and Triton's CPU interpreter show \"-\".</p>",
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


def _where(store: Store) -> str:
    if store.is_sqlite:
        return store.path or store.url
    return make_url(store.url).render_as_string(hide_password=True)
