"""`tune report`: the HTML page of a database, its numbers, and how a real headless browser shows it.

The browser check needs Chromium (`apt-get install chromium`; .ci/run installs it): without it
the test fails, it never skips.
"""

from __future__ import annotations

import gc
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from tunesvc import TunesvcError
from tunesvc.cli import app
from tunesvc.report import FIGURES
from tunesvc.report import collect
from tunesvc.report import convergence_figure
from tunesvc.report import write_report
from tunesvc.runtime import Runtime
from tunesvc.search import STRATEGIES
from tunesvc.space import config_hash
from tunesvc.store import Store
from tunesvc.store.models import Trial
from tunesvc.store.models import Winner
from tunesvc.template import SHIPPED
from tunesvc.template import ShapeKey
from tunesvc.template import get_template

EXAMPLE = Path(__file__).parent.parent / "tune.db.example"
H100 = "NVIDIA H100 80GB HBM3"
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
    for target in re.findall(r'(?:src|href)="([^"]*)"', html):
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


def screenshot(page: Path, tmp_path: Path) -> tuple[Path, str]:
    """Render ``page`` in headless Chromium; the screenshot and Chromium's log (stderr)."""
    shot = tmp_path / "shot.png"
    cmd = [
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
        f"--screenshot={shot}",
        "--window-size=1200,1600",
        page.resolve().as_uri(),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return shot, done.stderr


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
    assert html.count('src="data:image/png;base64,') == len(FIGURES) == 3
    pngs = list(out.glob("*.png"))
    assert sorted(kind for kind in FIGURES for p in pngs if p.name.endswith(f"-{kind}.png")) == sorted(FIGURES)
    for png in pngs:
        assert png.read_bytes().startswith(PNG_MAGIC)
        assert png.name in html  # the page says where its figures are saved
    assert "listed peak" in html
    # the torch peer, timed by the sweep: its time and the speed-up over it in every key's row
    assert "peer ms</th>" in html and "cuBLAS (torch.matmul)" in html
    for row in re.findall(r"<tr><td class=\"l k\">.*?</tr>", html):
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
        peer, over_peer = cells[6], cells[7]
        assert float(peer) > 0 and float(over_peer.removesuffix("x")) > 0, row


def test_tiny_sweep_numbers(tiny_db, template):
    store = Store(tiny_db, readonly=True)
    try:
        [section] = collect(store)
        device = store.find_device(section.device.hardware_id)
        winners = {w.shape_key: w for w in store.winners()}
    finally:
        store.close()
    assert section.kernel == "matmul" and section.version == template.version
    assert section.device.kind == "interpreter"
    assert [k.shape_key for k in section.keys] == sorted(KEYS, key=lambda k: int(k.split(",")[0][2:]))
    for key in section.keys:
        assert len(key.trials) == 3
        assert [t.id for t in key.trials] == sorted(t.id for t in key.trials)
        assert key.winner_ms == winners[key.shape_key].time_ms == min(key.ok_times)
        assert key.winner_config == winners[key.shape_key].config
        # the problem measured, from the sweeps table; the heuristic's trial is the first one
        assert str(template.key(key.problem)) == key.shape_key
        heuristic = config_hash(template.heuristic(key.problem, device))
        assert key.trials[0].config_hash == heuristic
        assert key.heuristic_ms == key.trials[0].time_ms
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


def test_tiny_report_in_a_browser(tiny_report, tmp_path):
    _, out, _, _ = tiny_report
    check_screenshot(*screenshot(out / "report.html", tmp_path))


# -- the repository's H100 sweep: what holds of any real sweep, whatever it holds --------------
def test_report_of_the_h100_example(example_report, template):
    result, out, example_db = example_report
    assert result.exit_code == 0, result.output
    # not a byte changed, and no journal left (tune.db.example is not in WAL mode)
    assert files_of(example_db.parent) == {"tune.db": EXAMPLE.read_bytes()}

    html = (out / "report.html").read_text()
    check_page(html)
    assert f"matmul on {H100}" in html
    assert "listed peak" in html and "989" in html and "3.35" in html

    store = Store(example_db, readonly=True)
    try:
        sections = collect(store)
        device = store.find_device(H100)
    finally:
        store.close()
    # a section per kernel version and device, each with its three figures
    assert {s.kernel for s in sections} == set(SHIPPED)
    assert html.count('src="data:image/png;base64,') == 3 * len(sections) == len(list(out.glob("*.png")))
    # a key shows its torch peer where its sweep timed one, and "-" where it did not
    keys = [k for s in sections for k in s.keys]
    timed = [k for k in keys if k.peer_ms is not None]
    assert all(k.peer_speedup == pytest.approx(k.peer_ms / k.winner_ms) for k in timed)
    assert all(k.peer_speedup is None for k in keys if k.peer_ms is None)
    assert html.count("peer ms</th>") == len(sections)
    rows = re.findall(r"<tr><td class=\"l k\">.*?</tr>", html)
    assert len(rows) == len(keys)
    assert sum(re.findall(r"<td[^>]*>(.*?)</td>", row)[6:8] == ["-", "-"] for row in rows) == len(keys) - len(timed)
    assert all(set(k.traces) <= set(STRATEGIES) for k in keys)

    [section] = [s for s in sections if s.kernel == "matmul" and s.version == template.version]
    assert section.device.name == H100
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


def test_every_shipped_template_has_a_correct_winner_at_its_current_version():
    """For each shipped template, the H100 holds a winner at the template's current version; the
    runtime answers each such key exactly with it; its config satisfies the space on that device."""
    before = EXAMPLE.read_bytes()
    store = Store(EXAMPLE, readonly=True)
    try:
        device = store.find_device(H100)
        current = {
            name: store.winners(kernel=name, version=get_template(name).version, hardware_id=device.hardware_id)
            for name in SHIPPED
        }
    finally:
        store.close()
    runtime = Runtime(db=EXAMPLE, device=device)
    for name, winners in current.items():
        assert winners, f"tune.db.example has no {H100} winner of {name} at its current version"
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
    time, and no correct trial of that key is faster."""
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
                faster = session.scalar(
                    select(Trial.id).where(
                        Trial.kernel_version_id == winner.kernel_version_id,
                        Trial.device_id == winner.device_id,
                        Trial.shape_key == winner.shape_key,
                        Trial.status == "ok",
                        Trial.time_ms < winner.time_ms,
                    )
                )
                assert faster is None, f"trial {faster} of {where} is faster than its winner"
    finally:
        store.close()


def test_h100_report_in_a_browser(example_report, tmp_path):
    _, out, example_db = example_report
    check_screenshot(*screenshot(out / "report.html", tmp_path))
    assert example_db.read_bytes() == EXAMPLE.read_bytes()


def test_report_that_cannot_be_written_is_one_clear_error_and_leaves_no_figures(tmp_path):
    from typer.testing import CliRunner

    from tunesvc.cli import app

    out = tmp_path / "out"
    (out / "report.html").mkdir(parents=True)  # the page cannot be written, even by root
    result = CliRunner().invoke(app, ["report", "--db", str(EXAMPLE), "--out", str(out), "--kernel", "softmax"])
    assert result.exit_code == 1, result.output
    assert "Cannot write the report into" in result.output
    assert not isinstance(result.exception, OSError)
    assert [p.name for p in out.iterdir()] == ["report.html"]  # the figures written before it are gone
