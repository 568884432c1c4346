"""The report's matplotlib figures (convergence and spread) and their PNGs.

matplotlib and PIL are heavy: they are imported inside the functions that draw, never when a
database is only read.
"""

from __future__ import annotations

import io
import math
import textwrap
from typing import TYPE_CHECKING

import numpy as np

from tunesvc.text import figure_text

if TYPE_CHECKING:
    from tunesvc.report._data import Section


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
    dims = [v for _, _, v in parts if v.isascii() and v.isdigit()]
    rest = []
    for name, _, value in parts:
        if value.isascii() and value.isdigit():
            continue
        if value in ("True", "False"):
            rest.append(name if value == "True" else f"not {name}")
        else:
            rest.append(value if name == "dtype" else f"{name}={value}")
    return " ".join(["x".join(dims), *rest]) if dims else key
