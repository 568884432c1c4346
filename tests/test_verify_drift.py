"""`tune verify` and drift: winners measured under another driver, CUDA, torch or Triton (their
device row's versions), or on another GPU model (``--from-device``), re-measured here beside the
heuristic, each stored time judged with its noise; real SQLite files written through the store,
real Triton kernels under the interpreter."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import tunesvc
from tunesvc import TunesvcError
from tunesvc.bench import Bench
from tunesvc.bench import Measurement
from tunesvc.bench import Status
from tunesvc.cli import app
from tunesvc.store import Store
from tunesvc.tuning.sweep import run_sweep
from tunesvc.verify import drift
from tunesvc.verify import drift_text
from tunesvc.verify import verify

#: tuned under an older torch and Triton (the same GPU model), and here
OLD = {"M": 16, "N": 32, "K": 32, "dtype": "float16"}
HERE = {"M": 16, "N": 64, "K": 32, "dtype": "float16"}
OTHER_GPU = "Other GPU"


def _older(device):
    return dataclasses.replace(device, triton="3.4.0", torch="2.8.0")


def _key(problem) -> str:
    template = tunesvc.get_template("matmul")
    return str(template.key(template.problem(**problem)))


def _sweep(db: str, tuned: list[tuple[dict, object]]) -> None:
    """One winner per (problem, device): the heuristic config, measured once (the cheapest sweep)."""
    template = tunesvc.get_template("matmul")
    store = Store(db)
    try:
        for problem, on in tuned:
            p = template.problem(**problem)
            run_sweep(template, [p], store, budget=1, candidates=[template.heuristic(p, on)], device=on)
    finally:
        store.close()


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A winner tuned under older torch and Triton versions (OLD), one tuned here (HERE)."""
    device = tunesvc.current_device()
    db = str(tmp_path_factory.mktemp("drift") / "drift.db")
    _sweep(db, [(OLD, _older(device)), (HERE, device)])
    return db


@pytest.fixture
def db(swept, tmp_path):
    copy = str(tmp_path / "drift.db")
    shutil.copy(swept, copy)
    return copy


def _restore(db: str, problem: dict, on, time_ms: float, spread: float | None = None) -> float:
    """Store another time (and spread) for the winner of ``problem`` measured on ``on``, through
    the store; returns the time it had."""
    template = tunesvc.get_template("matmul")
    store = Store(db)
    try:
        key = _key(problem)
        trial = store.winner_trial(template.name, template.version, on, key)
        assert trial is not None and trial.time_ms is not None
        store.replace_measurements([(trial.id, Measurement(Status.OK, time_ms=time_ms, spread=spread, reps=1))])
        winner = store.update_winner(store.kernel_version_id(template), store.device_id(on), key)
        assert winner is not None and winner.time_ms == time_ms
    finally:
        store.close()
    return trial.time_ms


def _verdicts(db: str, **options):
    store = Store(db, readonly=not options.get("retune"))
    try:
        return {v.shape_key: v for v in verify(store, **options)}
    finally:
        store.close()


def test_drift_names_the_gpu_model_and_each_version_that_differs(device):
    assert drift(device, device) == {}
    older = _older(device)
    assert drift(older, device) == {"torch": ("2.8.0", device.torch), "triton": ("3.4.0", device.triton)}
    assert drift_text(drift(older, device)) == f"torch 2.8.0 -> {device.torch}, triton 3.4.0 -> {device.triton}"
    gpu = dataclasses.replace(older, name="NVIDIA H100", driver="580.1")
    assert list(drift(gpu, device)) == ["device", "driver", "torch", "triton"]
    assert drift_text(drift(gpu, device)).startswith(f"device NVIDIA H100 -> {device.name}, driver 580.1 -> -, ")
    # the same name with another SM count: the hardware ids tell the two apart
    twin = dataclasses.replace(device, sm_count=device.sm_count + 1)
    assert drift(twin, device) == {"device": (twin.hardware_id, device.hardware_id)}


def _measures(monkeypatch, time_ms: float, spread: float = 0.01) -> None:
    """Every config measures ``time_ms``: timings are the point, not the interpreter's noise
    (its median of 3 runs on a busy CPU can spread over 100%, where no stored time is apart)."""
    measured = Measurement(Status.OK, time_ms=time_ms, spread=spread, reps=1)
    monkeypatch.setattr(Bench, "measure", lambda self, config: measured)


def test_drifted_measures_only_the_winners_of_another_software_stack(db, device):
    """Real timings: the drifted winner is measured beside the heuristic, with the versions that
    differ and no stale-triton flag (its times judge it); the winner tuned here is skipped."""
    told = []
    verdicts = _verdicts(db, drifted=True, progress=lambda what, step, total: told.append((what, step, total)))
    old, here = verdicts[_key(OLD)], verdicts[_key(HERE)]
    assert old.measured and old.measured_ms is not None and old.heuristic_ms is not None
    assert old.stored_spread is not None and old.measured_spread is not None  # the sweep's spread, and now's
    assert "stale-triton" not in old.flags and "wrong" not in old.flags, old.detail
    assert old.drift == {"torch": ("2.8.0", device.torch), "triton": ("3.4.0", device.triton)}
    assert here.skipped and not here.measured and here.measured_ms is None and here.flags == []
    assert told == [(f"matmul {_key(OLD)}", 0, 1), ("verified", 1, 1)]  # the skipped key is never measured


def test_a_drifted_winner_stored_5x_faster_than_it_runs_is_flagged(db, device, monkeypatch):
    _restore(db, OLD, _older(device), 0.2)
    _measures(monkeypatch, 1.0)
    verdicts = _verdicts(db, drifted=True)
    old, here = verdicts[_key(OLD)], verdicts[_key(HERE)]
    assert old.flags == ["slower-than-stored"] and old.retunable
    assert old.detail == "now 5x its stored 0.2 ms ±1%, measured ±1%"
    assert here.skipped and here.measured_ms is None


def test_without_drifted_every_winner_is_measured_and_another_triton_is_stale(db, device):
    verdicts = _verdicts(db, margin=10.0)  # a 10x margin: interpreter noise never flags a time
    old, here = verdicts[_key(OLD)], verdicts[_key(HERE)]
    assert old.flags == ["stale-triton"] and "3.4.0" in old.detail and old.measured_ms is not None
    assert here.flags == [] and here.measured_ms is not None and here.drift == {}
    assert not any(v.skipped for v in verdicts.values())


@pytest.mark.parametrize(
    "stored, stored_spread, now, now_spread, flags",
    [
        (1.0, 0.02, 1.01, 0.02, []),  # the same time
        (1.0, 0.10, 1.08, 0.01, []),  # 8% slower, inside the stored time's 10% spread
        (1.0, None, 1.04, 0.0, []),  # apart (1% each), but within the 5% margin
        (1.0, 0.01, 1.08, 0.01, ["slower-than-stored"]),
        (0.2, 0.01, 1.0, 0.01, ["slower-than-stored"]),  # stored 5x too fast
        (1.0, 0.01, 0.5, 0.01, ["faster-than-stored"]),
    ],
)
def test_a_stored_time_is_judged_with_both_spreads(
    db, device, monkeypatch, stored, stored_spread, now, now_spread, flags
):
    _restore(db, OLD, _older(device), stored, stored_spread)
    # timings are the point here, not the interpreter's noise: every config measures ``now``
    monkeypatch.setattr(
        Bench, "measure", lambda self, c: Measurement(Status.OK, time_ms=now, spread=now_spread, reps=1)
    )
    old = _verdicts(db, drifted=True)[_key(OLD)]
    assert old.flags == flags, old.detail
    assert (old.stored_ms, old.stored_spread, old.measured_ms, old.measured_spread) == (
        stored,
        stored_spread,
        now,
        now_spread,
    )
    assert old.retunable == (flags == ["slower-than-stored"])  # faster than stored: said, not retuned


def test_retune_sweeps_a_drifted_winner_slower_than_stored_on_this_stack(db, device, monkeypatch):
    _restore(db, OLD, _older(device), 0.2)
    _measures(monkeypatch, 1.0)
    old = _verdicts(db, drifted=True, retune=True, budget=1)[_key(OLD)]
    assert old.flags == ["slower-than-stored"]
    assert old.retuned_ms == 1.0 and old.retuned_config is not None
    store = Store(db, readonly=True)
    try:
        [(entry, _)] = [(e, d) for e, d in store.winners_with_devices() if e.shape_key == _key(OLD) and d == device]
    finally:
        store.close()
    assert (entry.config, entry.time_ms) == (old.retuned_config, 1.0)  # a winner of this stack, at its time now
    # the key's newest winner is this stack's now: nothing of it drifted any more
    assert all(v.skipped for v in _verdicts(db, drifted=True).values())


def test_from_device_measures_another_gpu_models_winners_here(tmp_path, device):
    db = str(tmp_path / "other.db")
    other = dataclasses.replace(_older(device), name=OTHER_GPU, sm_count=7)
    _sweep(db, [(OLD, other)])
    assert _verdicts(db) == {}  # none of this device's hardware
    [verdict] = _verdicts(db, winners_of=OTHER_GPU, drifted=True, margin=10.0).values()
    assert verdict.measured_ms is not None and verdict.flags == []
    assert verdict.drift["device"] == (OTHER_GPU, device.name) and verdict.drift["triton"] == ("3.4.0", device.triton)
    store = Store(db, readonly=True)
    try:
        with pytest.raises(TunesvcError, match="No device 'nope' in .*; stored devices: Other GPU"):
            verify(store, winners_of="nope")
    finally:
        store.close()
    result = CliRunner().invoke(app, ["verify", "--db", db], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert f"it holds {OTHER_GPU} winners only" in said and f"--from-device '{OTHER_GPU}'" in said
    result = CliRunner().invoke(app, ["verify", "--db", db, "--from-device", "nope"])
    assert result.exit_code == 1 and "No device 'nope'" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(app, ["verify", "--db", db, "--from-device", OTHER_GPU, "--drifted", "--margin", "10"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert f"Winners of {OTHER_GPU} in sqlite:///{db}, measured on {device.name}" in said
    assert f"device {OTHER_GPU} -> {device.name}," in said and "1 winner checked, 0 flagged." in said


#: `tune verify ARGS` where every config measures 1 ms (as :func:`_measures`)
MEASURING_1_MS = """
import sys
from tunesvc.bench import Bench, Measurement, Status
Bench.measure = lambda self, config: Measurement(Status.OK, time_ms=1.0, spread=0.01, reps=1)
from tunesvc.cli import main
sys.argv[0] = "tune"
main()
"""


def test_tune_verify_drifted_prints_the_times_and_versions_within_80_columns(db, device, monkeypatch):
    """As a script reads it (--json) and as a terminal of 80 columns shows it: the drifted
    winner's stored and measured times and the versions that differ; the other one skipped."""
    _restore(db, OLD, _older(device), 0.2)
    _measures(monkeypatch, 1.0)
    result = CliRunner().invoke(app, ["verify", "--db", db, "--drifted", "--json"])
    assert result.exit_code == 0, result.output
    found = {v["shape_key"]: v for v in json.loads(result.output)}
    old, here = found[_key(OLD)], found[_key(HERE)]
    assert old["flags"] == ["slower-than-stored"] and (old["stored_ms"], old["measured_ms"]) == (0.2, 1.0)
    assert old["drift"] == {"torch": ["2.8.0", device.torch], "triton": ["3.4.0", device.triton]}
    assert here["skipped"] and here["measured_ms"] is None

    env = {**os.environ, "COLUMNS": "80", "FORCE_COLOR": "1"}  # rich: a terminal
    done = subprocess.run(
        [sys.executable, "-c", MEASURING_1_MS, "verify", "--db", db, "--drifted"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    drawn = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", done.stdout)
    assert max(len(line) for line in drawn.splitlines()) <= 80, drawn
    said = " ".join(drawn.split())
    assert f"torch 2.8.0 -> {device.torch}, triton 3.4.0 -> {device.triton}" in said, said
    assert _key(OLD) in said and _key(HERE) not in said, said
    assert "slower-than" in said and "5x its" in said, said  # a table cell: rich may fold a word at 80 columns
    assert "1 winner checked, 1 flagged; 1 skipped: measured under this device's versions." in said, said
    assert "Run with --retune" in said


def test_drifted_with_nothing_drifted_says_so(tmp_path, device):
    db = str(tmp_path / "here.db")
    _sweep(db, [(HERE, device)])
    result = CliRunner().invoke(app, ["verify", "--db", db, "--drifted"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert said.startswith(f"All 1 winner of {device.name} in sqlite:///{db} were measured under this device's")
    assert "none drifted, none measured (verify without --drifted to measure them)." in said
