"""`tune report`: the HTML page of a database, its numbers, and how a real headless browser shows it.

The browser check needs Chromium (`apt-get install chromium`; .ci/run installs it): without it
the test fails, it never skips. It measures the page in the browser through a script added to a
copy of the page (the report itself has none) that writes its measurements into the DOM, which
Chromium's --dump-dom prints.
"""

from __future__ import annotations

import base64
import gc
import html as html_module
import json
import math
import re
import shutil
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from tunesvc import TunesvcError
from tunesvc.cli import app
from tunesvc.records import noise_of
from tunesvc.report import FIGURES
from tunesvc.report import SWEEP_FIGURES_NOTE
from tunesvc.report import _short_key
from tunesvc.report import _spread_figure
from tunesvc.report import collect
from tunesvc.report import convergence_figure
from tunesvc.report import write_report
from tunesvc.search import STRATEGIES
from tunesvc.serving.runtime import Runtime
from tunesvc.space import config_hash
from tunesvc.store import Store
from tunesvc.store.models import Trial
from tunesvc.store.models import Winner
from tunesvc.template import SHIPPED
from tunesvc.template import ShapeKey
from tunesvc.template import get_template

EXAMPLE = Path(__file__).parent.parent / "tune.db.example"
#: the most bytes the example database's report may take: it holds every kernel's H100 sweeps
#: (1.35 MB at 192 tuned keys, figures at 90 dpi), and the convergence figures draw two panels per key, ~4 KB each
EXAMPLE_REPORT_BYTES = 1_500_000
#: browser widths the report must fit: a small laptop and a desktop window
WIDTHS = (1024, 1400)
H100 = "NVIDIA H100 80GB HBM3"
#: where tune.db.example's matmul winners of the current version were measured
H200 = "NVIDIA H200"
SHAPES = ("37x45x29", "16x32x32")
KEYS = ("M=64,N=45,K=29,dtype=float16", "M=16,N=32,K=32,dtype=float16")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args))
    gc.collect()  # `tune sweep` leaves its SQLite connections to the garbage collector
    return result


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def tiny_db(tmp_path_factory) -> Path:
    """A database of a tiny sweep on this machine's device (the interpreter without a GPU)."""
    folder = tmp_path_factory.mktemp("tiny")
    db = folder / "tiny.db"
    args = ["sweep", "matmul", "--budget", "3", "--db", str(db), "--quiet"]
    for shape in SHAPES:
        args += ["--shape", shape]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return db


@pytest.fixture(scope="module")
def tiny_report(tiny_db, tmp_path_factory):
    """`tune report` of the tiny database: the command's result, the report folder, and the
    database folder's files before and after."""
    before = files_of(tiny_db.parent)
    out = tmp_path_factory.mktemp("tiny-report") / "report"
    result = invoke("report", "--db", str(tiny_db), "--out", str(out))
    return result, out, before, files_of(tiny_db.parent)


@pytest.fixture(scope="module")
def example_report(tmp_path_factory):
    """`tune report` of a private copy of the repository's H100 sweep (alone in its folder)."""
    folder = tmp_path_factory.mktemp("example")
    shutil.copy(EXAMPLE, folder / "tune.db")
    out = folder / "report"
    result = invoke("report", "--db", str(folder / "tune.db"), "--out", str(out))
    return result, out, folder / "tune.db"


def check_page(html: str) -> None:
    """Self-contained and script-free: nothing to load, so nothing can fail or log in a browser."""
    assert html.startswith("<!DOCTYPE html>")
    assert "<script" not in html.lower()
    assert not re.search(r"\bon[a-z]+\s*=", html.lower()), "an inline event handler is JavaScript too"
    ids = set(re.findall(r' id="([^"]*)"', html))
    for target in re.findall(r'(?:src|href)="([^"]*)"', html):
        if target.startswith("#"):  # the table of contents and the summary link into the page
            assert target[1:] in ids, f"a link to {target}, which the page does not have"
            continue
        assert target.startswith("data:image/png;base64,"), f"the page loads {target[:60]}"


def chromium() -> str:
    path = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    if path is None:
        pytest.fail(
            "chromium is not installed: the report's browser check needs it "
            "(Debian: apt-get install -y chromium; .ci/run installs it)",
            pytrace=False,
        )
    return path


def chromium_args(tmp_path: Path, width: int, height: int) -> list[str]:
    return [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--enable-logging=stderr",
        "--v=0",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--hide-scrollbars",
        f"--window-size={width},{height}",
    ]


def screenshot(page: Path, tmp_path: Path, width: int = 1200, height: int = 1600) -> tuple[Path, str]:
    """Render ``page`` in headless Chromium; the screenshot and Chromium's log (stderr)."""
    shot = tmp_path / f"shot-{width}.png"
    cmd = [*chromium_args(tmp_path, width, height), f"--screenshot={shot}", page.resolve().as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return shot, done.stderr


#: measures the page once loaded: the document's width, every heading, caption, cell, paragraph and
#: figure that is cut off (wider than its box, or reaching past the window's right edge), every
#: table that needs a scroll bar of its own, and every image's size
MEASURE = """<script>
window.addEventListener("load", () => {
  const width = window.innerWidth;
  const cut = [];
  const name = (el) => `${el.tagName.toLowerCase()} "${(el.textContent || el.alt || "").trim().slice(0, 60)}"`;
  for (const el of document.querySelectorAll("h1, h2, h3, nav, p, li, th, td, figure, figcaption, img")) {
    const box = el.getBoundingClientRect();
    if (box.right > width + 0.5) cut.push(`past the window's edge: ${name(el)}`);
    if (el.tagName !== "IMG" && el.scrollWidth > el.clientWidth + 1) cut.push(`wider than its box: ${name(el)}`);
  }
  for (const el of document.querySelectorAll(".wide")) {
    if (el.scrollWidth > el.clientWidth + 1) cut.push(`a table scrolls: ${name(el.querySelector("th"))}`);
  }
  const images = [...document.images].map((img) => ({
    alt: img.alt, loaded: img.complete && img.naturalWidth > 0, shown: img.getBoundingClientRect().width,
  }));
  const out = document.createElement("pre");
  out.id = "measured";
  out.textContent = JSON.stringify({width, scrollWidth: document.documentElement.scrollWidth, cut, images});
  document.body.appendChild(out);
});
</script>"""


def measure(page: Path, tmp_path: Path, width: int) -> dict:
    """The page's measurements (see MEASURE) in headless Chromium, ``width`` pixels wide."""
    probe = tmp_path / f"measured-{width}.html"
    probe.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    cmd = [*chromium_args(tmp_path, width, 900), "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    found = re.search(r'<pre id="measured">(.*?)</pre>', done.stdout, re.S)
    assert found, f"the measuring script did not run: {done.stdout[-2000:]}"
    return json.loads(html_module.unescape(found.group(1)))


def check_fits(measured: dict, width: int, figures: int) -> None:
    assert measured["width"] == width
    assert measured["scrollWidth"] <= width, f"the page is {measured['scrollWidth']} px wide in a {width} px window"
    assert measured["cut"] == []
    assert len(measured["images"]) == figures
    for image in measured["images"]:
        assert image["loaded"] and 0 < image["shown"] <= width, image


def check_screenshot(shot: Path, log: str) -> None:
    assert shot.is_file(), log[-3000:]
    data = shot.read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert len(data) > 10_000, f"screenshot of {len(data)} bytes: a blank page?"
    # a page's console messages reach this log as "CONSOLE(line)" lines; there must be none
    assert "CONSOLE" not in log, [line for line in log.splitlines() if "CONSOLE" in line]


# -- a tiny sweep on this machine ---------------------------------------------------------------
def test_report_of_a_tiny_sweep(tiny_report):
    result, out, before, after = tiny_report
    assert result.exit_code == 0, result.output
    page = out / "report.html"
    assert f"wrote {page}" in result.stdout.replace("\n", "")
    assert after["tiny.db"] == before["tiny.db"]  # read-only: not a byte of the database changed
    # a sweep leaves its database in WAL mode, where SQLite gives every reader, even a read-only
    # one, a -shm index and an (empty) -wal file; nothing may be written into them
    assert set(after) - set(before) <= {"tiny.db-wal", "tiny.db-shm"}
    assert after.get("tiny.db-wal", b"") == b""

    html = page.read_text()
    check_page(html)
    for key in KEYS:
        assert key.replace(",", ",<wbr>") in html  # long keys may wrap after a comma
    # each figure stored once: in the page, not again beside it
    assert html.count('src="data:image/png;base64,') == len(FIGURES) == 3
    assert [p.name for p in out.iterdir()] == ["report.html"]
    for data in re.findall(r'src="data:image/png;base64,([^"]*)"', html):
        assert base64.b64decode(data).startswith(PNG_MAGIC)
    assert "listed peak" in html
    # the torch peer, timed by the sweep: its time, and the speed-up over it in the direction the
    # header says (peer / tuned), in every key's row
    assert "peer ms</th>" in html and "cuBLAS (torch.matmul)" in html
    assert "speed-up over peer (peer / tuned)</th>" in html
    rows = re.findall(r"<tr><td class=\"l k\">.*?</tr>", html)
    assert len(rows) == len(KEYS)
    for row in rows:
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
        shown = [cells[2], cells[5], cells[6].removesuffix("x")]
        tuned, peer, over_peer = (float(text) for text in shown)
        # the ratio agrees with the times as shown, up to each number's rounding to its digits
        rounding = sum(_rounding(text) for text in shown)
        assert peer > 0 and over_peer == pytest.approx(peer / tuned, rel=rounding), row
        css = re.findall(r'<td class="(slow|fast)">', row)[-1]
        assert css == ("slow" if over_peer < 1 else "fast"), row
    # the summary opens the page: one row for matmul on this machine's device, its numbers those of the rows
    assert html.index('id="summary"') < html.index('id="contents"') < html.index('<h2 id="matmul-')


def _rounding(text: str) -> float:
    """The largest relative error of a number printed as ``text``: half a unit of its last digit."""
    digits = Decimal(text)
    return float(Decimal(5).scaleb(digits.as_tuple().exponent - 1) / abs(digits))


def test_tiny_sweep_numbers(tiny_db, template):
    store = Store(tiny_db, readonly=True)
    try:
        [section] = collect(store)
        device = store.find_device(section.device.hardware_id)
        winners = {w.shape_key: w for w in store.winners()}
        spreads = {
            t.id: t.spread
            for key in section.keys
            for t in store.trials(key.trials[0].kernel_version_id, key.trials[0].device_id, key.shape_key)
        }
    finally:
        store.close()
    assert section.kernel == "matmul" and section.version == template.version
    assert section.device.kind == "interpreter"
    assert [k.shape_key for k in section.keys] == sorted(KEYS, key=lambda k: int(k.split(",")[0][2:]))
    for key in section.keys:
        assert len(key.trials) == 3
        assert [t.id for t in key.trials] == sorted(t.id for t in key.trials)
        # the fastest, or one tied with it (within its noise interval: the tie rule's pick)
        assert key.winner_ms == winners[key.shape_key].time_ms
        fastest = min((t for t in key.trials if t.status == "ok"), key=lambda t: t.time_ms)
        assert fastest.time_ms <= key.winner_ms <= fastest.time_ms * (1 + noise_of(spreads[fastest.id]))
        assert key.winner_config == winners[key.shape_key].config
        # the problem measured, from the sweeps table; the first trial is what the runtime
        # launched untuned: the heuristic for the key swept first (KEYS[0]), for the other the
        # first key's winner where it fits; the heuristic's own trial comes first or next
        assert str(template.key(key.problem)) == key.shape_key
        heuristic = config_hash(template.heuristic(key.problem, device))
        first_winner = winners[KEYS[0]].config
        fits = key.shape_key != KEYS[0] and not template.violations(first_winner, key.problem, device)
        assert key.trials[0].config_hash == (config_hash(first_winner) if fits else heuristic)
        assert heuristic in [t.config_hash for t in key.trials[:2]]
        assert key.heuristic_ms == next(t.time_ms for t in key.trials if t.config_hash == heuristic)
        cost = template.cost(key.problem)
        assert key.tflops == pytest.approx(cost.flops / (key.winner_ms * 1e-3) / 1e12)
        assert key.roofline is None and key.bound is None  # no listed peak for the interpreter
        assert key.peer_ms > 0 and key.peer_speedup == pytest.approx(key.peer_ms / key.winner_ms)
        # one strategy, its trials in order, seconds since the sweep started never going back
        [trace] = key.traces.values()
        assert trace.strategy == "grid" and trace.index == [1, 2, 3]
        assert trace.times == [t.time_ms for t in key.trials]
        assert trace.seconds == sorted(trace.seconds) and trace.seconds[0] >= 0
        assert trace.best_so_far == [min(trace.times[: i + 1]) for i in range(3)]
    assert section.peer_name == template.peer_name


def test_two_strategies_on_one_key_draw_two_labelled_lines(tmp_path):
    """A key swept by grid, then by random (which replays grid's trials and measures new ones):
    each convergence figure's panel has one best-so-far line per strategy, labelled with its name."""
    db = tmp_path / "two.db"
    for strategy, budget in (("grid", "2"), ("random", "4")):
        result = invoke(
            "sweep",
            "matmul",
            "--shape",
            "16x32x32",
            "--strategy",
            strategy,
            "--budget",
            budget,
            "--db",
            str(db),
            "--quiet",
        )
        assert result.exit_code == 0, result.output
    store = Store(db, readonly=True)
    try:
        [section] = collect(store)
        out = write_report(store, tmp_path / "report")
    finally:
        store.close()
    [key] = section.keys
    assert list(key.traces) == ["grid", "random"]
    assert [len(t.index) for t in key.traces.values()] == [2, 2]
    for by in ("trial", "seconds"):
        [ax] = [ax for ax in convergence_figure(section, by=by).axes if ax.get_visible()]
        lines = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
        assert [line.get_label() for line in lines] == ["grid", "random"]
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["grid", "random"]
        trace = key.traces["random"]
        assert list(lines[1].get_xdata()) == (trace.index if by == "trial" else trace.seconds)
    html = out.read_text()
    assert html.count("Strategies: grid, random.") == 2  # the captions of both convergence figures
    assert 'alt="convergence-time of matmul on' in html and "(strategies: grid, random)" in html
    with pytest.raises(ValueError):
        convergence_figure(section, by="minutes")


def test_report_filters_by_kernel_and_says_when_there_is_nothing(tiny_db, tmp_path):
    result = invoke("report", "--db", str(tiny_db), "--kernel", "conv", "--out", str(tmp_path / "r"))
    assert result.exit_code == 1
    assert "Nothing to report" in result.output and "conv" in result.output
    assert not (tmp_path / "r").exists()
    missing = invoke("report", "--db", str(tmp_path / "missing.db"), "--out", str(tmp_path / "r"))
    assert missing.exit_code == 1 and "No database at" in missing.output
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    (tmp_path / "a-file").write_text("x")
    store = Store(tiny_db, readonly=True)
    try:
        assert [s.kernel for s in collect(store, kernel="matmul")] == ["matmul"]
        assert collect(store, kernel="conv") == []
        with pytest.raises(TunesvcError, match="is a file"):
            write_report(store, tmp_path / "a-file")
    finally:
        store.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_tiny_report_in_a_browser(tiny_report, tmp_path, width):
    _, out, _, _ = tiny_report
    check_fits(measure(out / "report.html", tmp_path, width), width, figures=len(FIGURES))
    check_screenshot(*screenshot(out / "report.html", tmp_path, width))


# -- the repository's H100 sweep: what holds of any real sweep, whatever it holds --------------
def test_report_of_the_h100_example(example_report, template):
    result, out, example_db = example_report
    assert result.exit_code == 0, result.output
    # not a byte changed, and no journal left (tune.db.example is not in WAL mode)
    assert files_of(example_db.parent) == {"tune.db": EXAMPLE.read_bytes()}

    html = (out / "report.html").read_text()
    check_page(html)
    assert f"matmul on {H200}" in html and f"rmsnorm on {H100}" in html
    assert "listed peak" in html and "989" in html and "3.35" in html

    store = Store(example_db, readonly=True)
    try:
        found = collect(store)
        device = store.find_device(H200)  # matmul's current version's
    finally:
        store.close()
    # by default, the kernel versions lookups use: the installed templates', one section per kernel
    sections = [s for s in found if s.current]
    assert sorted(s.kernel for s in sections) == sorted(SHIPPED)
    assert all(s.version == get_template(s.kernel).version for s in sections)
    older = [s for s in found if not s.current]
    assert older and "older version" not in html and "--all-versions" in html
    # each section with its three figures, stored once: in the page, which stays small
    assert html.count('src="data:image/png;base64,') == 3 * len(sections)
    assert [p.name for p in out.iterdir()] == ["report.html"]
    assert (out / "report.html").stat().st_size <= EXAMPLE_REPORT_BYTES
    # a key shows its torch peer where its sweep timed one, and "-" where it did not
    keys = [k for s in sections for k in s.keys]
    timed = [k for k in keys if k.peer_ms is not None]
    assert timed and all(k.peer_speedup == pytest.approx(k.peer_ms / k.winner_ms) for k in timed)
    assert all(k.peer_speedup is None for k in keys if k.peer_ms is None)
    assert html.count("peer ms</th>") == len(sections)
    rows = re.findall(r"<tr><td class=\"l k\">.*?</tr>", html)
    assert len(rows) == len(keys)
    assert sum(re.findall(r"<td[^>]*>(.*?)</td>", row)[5:7] == ["-", "-"] for row in rows) == len(keys) - len(timed)
    assert all(set(k.traces) <= set(STRATEGIES) for k in keys)
    # the summary: per kernel and device, the geometric mean, best and worst of the speed-ups over the peer
    summary = html[html.index('id="summary"') : html.index('id="contents"')]
    for section in sections:
        [row] = re.findall(rf'<tr><td class="l"><a href="#{section.slug}">.*?</tr>', summary)
        cells = re.findall(r"<td([^>]*)>(.*?)</td>", row)
        ratios = [k.peer_speedup for k in section.keys if k.peer_speedup is not None]
        assert cells[3][1] == str(len(ratios))
        # the peer the sweeps timed, named: the page's figures are the sweeps' own, not the benchmarks'
        peer = (
            f'<br><span class="sub">peer: {html_module.escape(section.peer_name)}</span>' if section.peer_name else ""
        )
        assert cells[0][1].endswith(f"</a>{peer}"), row
        if not ratios:
            assert [c for _, c in cells[4:7]] == ["-"] * 3
            continue
        geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
        for (css, text), value in zip(cells[4:7], (geomean, max(ratios), min(ratios)), strict=True):
            assert float(text.split("x")[0]) == pytest.approx(value, rel=5e-3), row
            assert css == (' class="slow"' if value < 1 else ' class="fast"'), row
    assert 'class="slow"' in summary  # attention on the H100 is slower than torch's SDPA (FlashAttention)
    assert html_module.escape(SWEEP_FIGURES_NOTE) in summary and "benchmarks/RESULTS.md" in summary
    # no panel title ends in a bare flag
    assert _short_key("B=4,H=32,S=4096,D=128,causal=True,dtype=bfloat16") == "4x32x4096x128 causal bfloat16"
    assert _short_key("B=8,HQ=32,HKV=8,S=4096,D=128,dtype=bfloat16,paged=False").endswith("bfloat16 not paged")

    [section] = [s for s in sections if s.kernel == "matmul" and s.version == template.version]
    assert section.device.name == H200
    for key in section.keys:
        # the problem comes from the sweeps table, and buckets to the key it was stored under
        assert str(template.key(key.problem)) == key.shape_key
        assert 0 < key.roofline < 1 and key.bound in ("compute", "memory")
        heuristic = config_hash(template.heuristic(key.problem, device))
        row = next((t for t in key.trials if t.config_hash == heuristic), None)
        assert key.heuristic_ms == (row.time_ms if row else None)
    big = {k.shape_key: k for k in section.keys}["M=4096,N=4096,K=4096,dtype=bfloat16"]
    assert big.roofline == pytest.approx(2 * 4096**3 / 989e12 / (big.winner_ms * 1e-3))
    assert big.bound == "compute" and f"{big.roofline:.0%} (compute)" in html


def test_all_versions_adds_the_older_ones_under_their_own_headings(tmp_path):
    calls = []
    store = Store(EXAMPLE, readonly=True)
    try:
        found = collect(store, kernel="rmsnorm")
        page = write_report(
            store, tmp_path, kernel="rmsnorm", all_versions=True, progress=lambda *args: calls.append(args)
        )
    finally:
        store.close()
    html = page.read_text()
    [current] = [s for s in found if s.current]
    [old] = [s for s in found if not s.current]
    assert html.index('id="current"') < html.index(f'id="{current.slug}"') < html.index('id="older"')
    assert html.index('id="older"') < html.index(f'id="{old.slug}"')
    heading = f"rmsnorm on {H100}: older version {old.version} (lookups use {current.version})"
    assert f'<h2 id="{old.slug}" class="old">{heading}</h2>' in html
    assert html.count('src="data:image/png;base64,') == 6
    # progress: reading, then each of the 6 figures
    assert calls[:2] == [("reading the database", 0, 1), ("reading the database", 1, 1)]
    assert calls[2:] == [("drawing figures", i, 6) for i in range(1, 7)]


def check_nothing_cut(figure) -> None:
    """Every title and label of a drawn figure inside the figure (nothing cut at its edges)."""
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    box = figure.bbox
    texts = [t for t in [figure._suptitle] if t is not None]
    for ax in figure.axes:
        if not ax.get_visible():
            continue
        texts += [ax.title, ax.xaxis.label, ax.yaxis.label]
        # tick labels drawn: those of ticks within the axis' limits
        (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
        texts += [t for t in ax.get_xticklabels(which="both") if x0 <= t.get_position()[0] <= x1]
        texts += [t for t in ax.get_yticklabels(which="both") if y0 <= t.get_position()[1] <= y1]
    for text in texts:
        if not text.get_text() or not text.get_visible():
            continue
        extent = text.get_window_extent(renderer)
        assert box.x0 - 0.5 <= extent.x0 and extent.x1 <= box.x1 + 0.5, text.get_text()
        assert box.y0 - 0.5 <= extent.y0 and extent.y1 <= box.y1 + 0.5, text.get_text()


def lowest_labelled_tick(ax) -> float:
    low, high = ax.get_ylim()
    labelled = [
        label.get_position()[1]
        for label in [*ax.yaxis.get_ticklabels(), *ax.yaxis.get_ticklabels(minor=True)]
        if label.get_text() and low <= label.get_position()[1] <= high
    ]
    return min(labelled)


def test_figures_of_a_one_shape_sweep_show_their_whole_title_and_the_best_time(tiny_db, tmp_path):
    store = Store(tiny_db, readonly=True)
    try:
        [section] = collect(store)
    finally:
        store.close()
    section.keys = section.keys[:1]  # as a sweep of one shape
    [key] = section.keys
    for by in ("trial", "seconds"):
        figure = convergence_figure(section, by=by)
        check_nothing_cut(figure)
        title = " ".join(figure._suptitle.get_text().split())  # wrapped to the figure's width
        assert title.endswith(f"({section.kernel} on {section.device.name})"), title
        [ax] = [ax for ax in figure.axes if ax.get_visible()]
        best = min(key.ok_times)
        assert ax.get_title().endswith(f"best {best:.4g} ms")
        assert ax.get_ylim()[0] <= lowest_labelled_tick(ax) <= best
    check_nothing_cut(_spread_figure(section))


def test_every_shipped_template_has_a_correct_winner_at_its_current_version():
    """For each shipped template, a GPU of the example (the H100; matmul's current version, the
    H200) holds winners at the template's current version; the runtime answers each such key
    exactly with it on that device; its config satisfies the space on that device."""
    before = EXAMPLE.read_bytes()
    store = Store(EXAMPLE, readonly=True)
    try:
        devices = [store.find_device(record.name) for record in store.devices()]
        current = {
            (name, device): store.winners(
                kernel=name, version=get_template(name).version, hardware_id=device.hardware_id
            )
            for name in SHIPPED
            for device in devices
        }
    finally:
        store.close()
    for name in SHIPPED:
        assert any(current[name, d] for d in devices), f"tune.db.example has no winner of {name} at its current version"
    assert [d.name for d in devices if current["matmul", d]] == [H200]
    for (name, device), winners in current.items():
        runtime = Runtime(db=EXAMPLE, device=device)
        template = get_template(name)
        for winner in winners:
            problem = template.problem_of_key(winner.shape_key)
            assert str(template.key(problem)) == winner.shape_key  # a key is a fixed point of bucketing
            assert template.violations(winner.config, problem, device) == []
            found = runtime.lookup(template, **problem)
            assert (found.source, found.config) == ("exact", winner.config), (name, winner.shape_key)
    assert EXAMPLE.read_bytes() == before


def test_every_stored_winner_is_its_keys_fastest_correct_trial():
    """Every winner (of any kernel version) points at a trial of its own key that ran correctly
    (status ok, relative error within the template's tolerance), with the winner's config and
    time, and no correct trial of that key is faster beyond the fastest's noise interval (the
    sweep's tie rule)."""
    store = Store(EXAMPLE, readonly=True)
    try:
        with store.session() as session:
            winners = list(session.scalars(select(Winner)).unique())
            assert winners
            for winner in winners:
                name = winner.kernel_version.kernel
                trial = session.get(Trial, winner.trial_id)
                where = f"{name} {winner.shape_key}"
                assert trial is not None, f"the winner of {where} has no trial"
                assert (trial.kernel_version_id, trial.device_id, trial.shape_key) == (
                    winner.kernel_version_id,
                    winner.device_id,
                    winner.shape_key,
                ), where
                assert trial.status == "ok" and trial.config_hash == winner.config_hash, where
                assert trial.time_ms == winner.time_ms > 0, where
                assert trial.config_hash == config_hash(dict(winner.config)), where
                assert name in SHIPPED, where
                dtype = dict(ShapeKey.parse(winner.shape_key).fields)["dtype"]
                tolerance = get_template(name).tolerance({"dtype": dtype})
                assert trial.rel_error is not None and trial.rel_error <= tolerance, where
                # the fastest correct trial, or one tied with it: within its noise interval
                fastest = session.scalars(
                    select(Trial)
                    .where(
                        Trial.kernel_version_id == winner.kernel_version_id,
                        Trial.device_id == winner.device_id,
                        Trial.shape_key == winner.shape_key,
                        Trial.status == "ok",
                    )
                    .order_by(Trial.time_ms)
                ).first()
                assert fastest is not None and winner.time_ms <= fastest.time_ms * (1 + noise_of(fastest.spread)), (
                    f"trial {fastest.id} of {where} is faster than its winner beyond its noise"
                )
    finally:
        store.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_h100_report_in_a_browser(example_report, tmp_path, width):
    _, out, example_db = example_report
    page = out / "report.html"
    check_fits(measure(page, tmp_path, width), width, figures=page.read_text().count("<img "))
    check_screenshot(*screenshot(page, tmp_path, width))
    assert example_db.read_bytes() == EXAMPLE.read_bytes()


def test_report_that_cannot_be_written_is_one_clear_error_and_leaves_no_figures(tmp_path):
    from typer.testing import CliRunner

    from tunesvc.cli import app

    out = tmp_path / "out"
    (out / "report.html").mkdir(parents=True)  # the page cannot be written, even by root
    result = CliRunner().invoke(app, ["report", "--db", str(EXAMPLE), "--out", str(out), "--kernel", "softmax"])
    assert result.exit_code == 1, result.output
    assert f"{out / 'report.html'} is a folder; move it, or pass another --out." in result.output
    assert not isinstance(result.exception, OSError)
    assert [p.name for p in out.iterdir()] == ["report.html"]  # refused before any figure was drawn
