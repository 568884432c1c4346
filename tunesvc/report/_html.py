"""The report's page: :func:`write_report` draws the figures and writes ``report.html``, built here
from a summary, a table of contents and one section (winners table, notes, figures) per kernel
version and device.
"""

from __future__ import annotations

import base64
import math
from collections import defaultdict
from datetime import UTC
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from tunesvc.errors import TunesvcError
from tunesvc.report._data import LISTED_PEAKS
from tunesvc.report._data import collect
from tunesvc.report._figures import FIGURES
from tunesvc.report._figures import _png
from tunesvc.report._figures import _short_key
from tunesvc.report._figures import _spread_figure
from tunesvc.report._figures import convergence_figure
from tunesvc.text import html_text

if TYPE_CHECKING:
    from tunesvc.report._data import Progress
    from tunesvc.report._data import Section
    from tunesvc.store import Store


REPORT_FILE = "report.html"


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
    e = html_text
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
    sub = f'<br><span class="sub">{html_text(under)}</span>' if under else ""
    return f'<td class="{css}">{html_text(text or f"{value:.3g}x")}{sub}</td>'


def _summary_html(sections: list[Section], left_out: dict[str, int]) -> list[str]:
    e = html_text
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
    note = SPEEDUP_NOTE + ' "-": no sweep of that kernel timed its peer. ' + html_text(SWEEP_FIGURES_NOTE)
    if left_out:
        older = ", ".join(f"{k} ({n})" for k, n in sorted(left_out.items()))
        note += (
            f" Left out: sections of kernel versions lookups no longer use, {older}; "
            "<code>tune report --all-versions</code> shows them."
        )
    out.append(f'<p class="note">{note}</p>')
    return out


def _contents_html(current: list[Section], older: list[Section]) -> list[str]:
    e = html_text

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
    e = html_text
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
    wrong = section.wrong_results
    if wrong:
        reasons = "; ".join(f"{n} for {reason} (most often <q>{e(said)}</q>)" for reason, n, said in wrong)
        out.append(
            f'<p class="note">{sum(n for _, n, _ in wrong)} of {_count(trials, "candidate")} rejected as '
            f"wrong results (never eligible to win): {reasons}.</p>"
        )
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
    e = html_text
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
    e = html_text
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
    e = html_text
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
    e = html_text
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
