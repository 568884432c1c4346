"""`tune import` (merging bundles and databases) and `tune verify` (re-measuring winners)."""

from __future__ import annotations

import json
import shutil
import sqlite3

import pytest
from typer.testing import CliRunner

import tunesvc
from tunesvc import Runtime
from tunesvc import TunesvcError
from tunesvc.bench import Bench
from tunesvc.bench import Measurement
from tunesvc.bench import Status
from tunesvc.bundle import build_bundles
from tunesvc.bundle import import_sources
from tunesvc.bundle import write_bundles
from tunesvc.cli import app
from tunesvc.space import config_hash
from tunesvc.store import Store
from tunesvc.tuning.sweep import run_sweep
from tunesvc.verify import verify

PROBLEM = {"M": 16, "N": 32, "K": 32, "dtype": "float16"}
KEY = "M=16,N=32,K=32,dtype=float16"


@pytest.fixture(scope="module")
def source_db(tmp_path_factory):
    """A database with one winner: the heuristic config, measured once (the cheapest sweep)."""
    db = str(tmp_path_factory.mktemp("source") / "source.db")
    template = tunesvc.get_template("matmul")
    problem = template.problem(**PROBLEM)
    store = Store(db)
    try:
        [result] = run_sweep(
            template, [problem], store, budget=1, candidates=[template.heuristic(problem, tunesvc.current_device())]
        )
    finally:
        store.close()
    assert result.winner is not None
    return db


@pytest.fixture
def bundle(source_db, tmp_path):
    store = Store(source_db, readonly=True)
    try:
        [path] = write_bundles(build_bundles(store), tmp_path / "bundle.json")
    finally:
        store.close()
    return path


def _edited(bundle, tmp_path, name, time_ms, config_change=None):
    """A copy of the bundle whose one winner has another time (and maybe another config)."""
    data = json.loads(bundle.read_text())
    section = data["kernels"]["matmul"]
    winner = section["winners"][KEY]
    winner["time_ms"] = time_ms
    config = {**section["configs"][winner["config"]], **(config_change or {})}
    winner["config"] = config_hash(config)
    section["configs"][winner["config"]] = config
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path, config


def _winners(db):
    store = Store(db, readonly=True)
    try:
        return {(w.kernel, w.shape_key): w for w in store.winners()}
    finally:
        store.close()


def test_import_merges_with_faster_wins_and_ties_keep(bundle, tmp_path, tmp_db):
    stored_ms = json.loads(bundle.read_text())["kernels"]["matmul"]["winners"][KEY]["time_ms"]
    store = Store(tmp_db)
    try:
        [added] = import_sources(store, [bundle]).winners
        [tie] = import_sources(store, [bundle]).winners
        slower, _ = _edited(bundle, tmp_path, "slower.json", stored_ms * 2, {"num_warps": 8})
        [kept] = import_sources(store, [slower]).winners
        faster, faster_winner = _edited(bundle, tmp_path, "faster.json", stored_ms / 2, {"num_stages": 3})
        [replaced] = import_sources(store, [faster]).winners
    finally:
        store.close()
    assert (added.action, added.stored_ms) == ("added", None)
    assert (tie.action, tie.stored_ms) == ("kept", pytest.approx(stored_ms))
    assert kept.action == "kept"
    assert (replaced.action, replaced.stored_ms) == ("replaced", pytest.approx(stored_ms))
    winner = _winners(tmp_db)[("matmul", KEY)]
    assert winner.config == faster_winner and winner.time_ms == pytest.approx(stored_ms / 2)
    # the runtime reads the merged database like a swept one
    assert Runtime(db=tmp_db).lookup("matmul", **PROBLEM).config == faster_winner


def test_import_replaces_a_winner_only_where_it_serves_another_config(bundle, tmp_path, tmp_db):
    """The same config timed a little faster elsewhere changes nothing that is served: it is
    kept, as stored, and the summary counts no replacement."""
    stored = json.loads(bundle.read_text())["kernels"]["matmul"]["winners"][KEY]
    store = Store(tmp_db)
    try:
        import_sources(store, [bundle])
    finally:
        store.close()
    before = _winners(tmp_db)[("matmul", KEY)]
    retimed, config = _edited(bundle, tmp_path, "retimed.json", stored["time_ms"] * 0.9)
    assert config == before.config
    result = CliRunner().invoke(app, ["import", str(retimed), "--db", tmp_db, "--json"])
    assert result.exit_code == 0, result.output
    [change] = json.loads(result.output)["winners"]
    assert change["action"] == "kept" and change["stored_ms"] == pytest.approx(stored["time_ms"])
    after = _winners(tmp_db)[("matmul", KEY)]
    assert (after.config, after.time_ms) == (before.config, before.time_ms)
    result = CliRunner().invoke(app, ["import", str(retimed), "--db", tmp_db])
    assert "0 added, 0 replaced, 1 kept" in result.output


def test_import_of_a_database_and_the_cli_report(source_db, tmp_path):
    target = str(tmp_path / "target.db")
    result = CliRunner().invoke(app, ["import", source_db, "--db", target, "--json"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)
    assert found["selectors"] == []  # the source has no selector
    [change] = found["winners"]
    assert (change["action"], change["kernel"], change["shape_key"]) == ("added", "matmul", KEY)
    assert _winners(target)[("matmul", KEY)].config == _winners(source_db)[("matmul", KEY)].config
    result = CliRunner().invoke(app, ["import", source_db, "--db", target])
    assert result.exit_code == 0, result.output
    assert f"0 added, 0 replaced, 1 kept in sqlite:///{target}." in result.output
    assert KEY in result.output and "kept" in result.output


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"format": "tunesvc-bundle", "format_version": 99}), "bundle format 99"),
    ],
)
def test_import_of_a_bad_bundle_is_one_error_and_writes_nothing(bundle, tmp_path, tmp_db, content, message):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    store = Store(tmp_db)
    try:
        with pytest.raises(TunesvcError, match=message):
            import_sources(store, [bundle, bad])  # every source is checked before any write
        assert store.winners() == []
    finally:
        store.close()
    result = CliRunner().invoke(app, ["import", str(tmp_path / "missing.db"), "--db", tmp_db])
    assert result.exit_code == 1 and "No bundle or database at" in result.output


def test_verify_measures_a_fresh_winner_on_the_interpreter(source_db):
    store = Store(source_db, readonly=True)
    try:
        [verdict] = verify(store, margin=10.0)  # a 10x margin: interpreter noise never flags it
    finally:
        store.close()
    assert (verdict.kernel, verdict.shape_key, verdict.flags) == ("matmul", KEY, [])
    assert verdict.measured_ms > 0 and verdict.heuristic_ms == verdict.measured_ms  # the winner is the heuristic


def test_verify_tells_its_progress_key_by_key(source_db):
    store = Store(source_db, readonly=True)
    told = []
    try:
        [verdict] = verify(store, progress=lambda what, step, total: told.append((what, step, total)))
    finally:
        store.close()
    assert told == [(f"matmul {KEY}", 0, 1), ("verified", 1, 1)]
    assert verdict.measured_ms is not None


def test_tune_verify_draws_its_progress_on_stderr_within_80_columns(source_db):
    """At a terminal of 80 columns `tune verify` shows the key it measures, on stderr; --json's
    standard output is the JSON alone."""
    import os
    import re
    import subprocess
    import sys

    env = {**os.environ, "COLUMNS": "80", "FORCE_COLOR": "1"}  # rich: a terminal
    done = subprocess.run(
        [sys.executable, "-m", "tunesvc", "verify", "--db", source_db, "--json"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [v["shape_key"] for v in json.loads(done.stdout)] == [KEY]
    drawn = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", done.stderr)
    assert f"matmul {KEY}" in drawn and "0/1" in drawn
    assert max(len(line) for line in drawn.replace("\r", "\n").splitlines()) <= 80


def test_verify_flags_a_winner_slower_than_the_heuristic(source_db, tmp_db, monkeypatch, template, device):
    shutil.copy(source_db, tmp_db)
    heuristic = template.heuristic(template.problem(**PROBLEM), device)
    other = {**heuristic, "num_warps": 8 if heuristic["num_warps"] == 4 else 4}
    with sqlite3.connect(tmp_db) as db:  # stored at the time it measures now: only the heuristic flags it
        db.execute("UPDATE tunesvc_winners SET config = ?, time_ms = 2.0", (json.dumps(other),))
    # timings are the point here, not the interpreter's noise: the heuristic measures 2x faster
    monkeypatch.setattr(
        Bench, "measure", lambda self, c: Measurement(Status.OK, time_ms=1.0 if c == heuristic else 2.0)
    )
    store = Store(tmp_db, readonly=True)
    try:
        [verdict] = verify(store)
    finally:
        store.close()
    assert verdict.flags == ["slower"]
    assert (verdict.measured_ms, verdict.heuristic_ms) == (2.0, 1.0)


def test_verify_flags_stale_entries_and_retunes_them(source_db, tmp_db, template, monkeypatch):
    shutil.copy(source_db, tmp_db)
    with sqlite3.connect(tmp_db) as db:
        # as if tuned under an older Triton: another software stack, so another fingerprint
        db.execute("UPDATE tunesvc_devices SET triton = '2.0.0', fingerprint = 'older-stack'")
    result = CliRunner().invoke(app, ["verify", "--db", tmp_db, "--margin", "10", "--json"])
    assert result.exit_code == 0, result.output
    [verdict] = json.loads(result.output)
    assert verdict["flags"] == ["stale-triton"] and "2.0.0" in verdict["detail"]

    old_version = template.version
    monkeypatch.setitem(template.__dict__, "version", "edited-kernel")  # the kernel's source changed
    store = Store(tmp_db)
    try:
        [stale] = verify(store, retune=True, budget=1)
        after = verify(store, margin=10.0)
    finally:
        store.close()
    assert stale.flags == ["stale-kernel"] and old_version in stale.detail
    assert stale.measured_ms is None  # an old kernel's config is not measured on the new kernel
    assert stale.retuned_ms is not None and stale.retuned_config is not None
    [fresh] = after  # the retuned winner of the new version is now the one checked
    assert (fresh.version, fresh.flags) == ("edited-kernel", [])


def test_verify_rejects_bad_options(source_db):
    result = CliRunner().invoke(app, ["verify", "--db", source_db, "--margin", "-1"])
    assert result.exit_code == 1 and "--margin must be at least 0" in result.output


def test_retune_never_keeps_a_winner_it_measured_slower_than_the_heuristic(
    source_db, tmp_db, monkeypatch, template, device
):
    """The stored winner's trial is older and faster than it measures now: the retune's sweep
    alone would keep it; this run's measurements of it and the heuristic decide instead."""
    shutil.copy(source_db, tmp_db)
    heuristic = template.heuristic(template.problem(**PROBLEM), device)
    other = {**heuristic, "num_warps": 8 if heuristic["num_warps"] == 4 else 4}
    with sqlite3.connect(tmp_db) as db:
        db.execute(
            "UPDATE tunesvc_trials SET config = ?, config_hash = ?, time_ms = 0.001",
            (json.dumps(other), config_hash(other)),
        )
        db.execute(
            "UPDATE tunesvc_winners SET config = ?, config_hash = ?, time_ms = 0.001",
            (json.dumps(other), config_hash(other)),
        )
    monkeypatch.setattr(
        Bench, "measure", lambda self, c: Measurement(Status.OK, time_ms=1.0 if c == heuristic else 2.0, reps=1)
    )
    store = Store(tmp_db)
    try:
        [verdict] = verify(store, retune=True, budget=1)
        [winner] = store.winners()
    finally:
        store.close()
    assert verdict.flags == ["slower", "slower-than-stored"] and (verdict.measured_ms, verdict.heuristic_ms) == (
        2.0,
        1.0,
    )
    assert "now 2,000x its stored 0.001 ms ±" in verdict.detail
    assert verdict.retuned_config == heuristic and verdict.retuned_ms == 1.0
    assert (winner.config, winner.time_ms) == (heuristic, 1.0)


def test_reimporting_the_examples_own_bundle_replaces_nothing(tmp_path):
    """A bundle keeps times to 6 decimals: the example's winners exported and imported back are
    the same winners, kept, not "replaced" by their own rounded times."""
    from pathlib import Path

    db = tmp_path / "example.db"
    shutil.copy(Path(__file__).parents[1] / "tune.db.example", db)
    out = tmp_path / "bundles"
    assert CliRunner().invoke(app, ["export", "--db", str(db), "--out", str(out)]).exit_code == 0
    bundles = sorted(out.glob("*.json"))
    assert len(bundles) == 2  # one per GPU model: the H100's, the H200's (matmul)
    before = _winners(str(db))
    actions = []
    for bundle in bundles:
        result = CliRunner().invoke(app, ["import", str(bundle), "--db", str(db), "--json"])
        assert result.exit_code == 0, result.output
        actions += [c["action"] for c in json.loads(result.output)["winners"]]
    assert len(actions) > 50 and set(actions) == {"kept"}
    assert _winners(str(db)) == before
    # the same config faster at a bundle's precision serves nothing new: kept
    data = json.loads(bundle.read_text())
    section = data["kernels"]["matmul"]
    key = sorted(section["winners"])[0]
    section["winners"][key]["time_ms"] = round(section["winners"][key]["time_ms"] - 1e-6, 6)
    bundle.write_text(json.dumps(data))
    result = CliRunner().invoke(app, ["import", str(bundle), "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "0 added, 0 replaced," in result.output
    assert _winners(str(db)) == before
    # another config, faster at a bundle's precision, replaces it
    other = next(h for h in sorted(section["configs"]) if h != section["winners"][key]["config"])
    section["winners"][key]["config"] = other
    bundle.write_text(json.dumps(data))
    result = CliRunner().invoke(app, ["import", str(bundle), "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "0 added, 1 replaced," in result.output
