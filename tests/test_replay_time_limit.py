"""A recorded call's replay (`tune misses --tune`, `tune verify`) has a time limit: a kernel that
never ends there is stopped after --time-limit seconds (600 by default), said in one line, and the
key left as it was; real processes, a real recorded call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from _capture import interpreter_env

from tunesvc import settings
from tunesvc._processes import receive_within
from tunesvc._processes import start_child
from tunesvc.store import Store

#: a captured kernel whose hook, run before each launch tunesvc measures, sleeps $HANG seconds
KERNELS = """
import os, time
import triton
import triton.language as tl

def hang(nargs, reset_only=False):
    time.sleep(float(os.environ.get("HANG", "0")))

@triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (16, 32)], key=["n"], pre_hook=hang)
@triton.jit
def scale(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, 2.0 * tl.load(x_ptr + offs, mask=mask), mask=mask)
"""

APP = """
import torch, triton
import hangkernels
n = 100
x, out = torch.randn(n), torch.empty(n)
hangkernels.scale[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, out, n)
torch.testing.assert_close(out, 2.0 * x)
"""

NAME = "hangkernels:scale"


@pytest.fixture
def recorded(tmp_path):
    """A database holding one open miss of hangkernels:scale, recorded while serving."""
    (tmp_path / "hangkernels.py").write_text(KERNELS)
    (tmp_path / "app.py").write_text(APP)
    db = tmp_path / "t.db"
    env = interpreter_env(TUNESVC_CAPTURE="1", TUNESVC_MODE="lookup", TUNESVC_DB=str(db))
    done = subprocess.run(
        [sys.executable, "app.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr
    return db


def _tune(tmp_path, *args: str, hang: float) -> tuple[subprocess.CompletedProcess, float]:
    env = interpreter_env(HANG=str(hang), PYTHONPATH=str(tmp_path))
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "tunesvc", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    return done, time.monotonic() - started


def _misses(db) -> list[str]:
    store = Store(db, readonly=True)
    try:
        return [m.status for m in store.misses()]
    finally:
        store.close()


def test_a_replay_past_its_time_limit_is_stopped_and_the_miss_stays_open(recorded, tmp_path):
    args = ("misses", "--tune", "--kernel", NAME, "--db", str(recorded), "--time-limit", "3")
    done, took = _tune(tmp_path, *args, hang=3600)
    said = " ".join(done.stdout.split())
    assert done.returncode == 1, done.stdout + done.stderr
    assert "ran past its time limit of 3 s" in said and "--time-limit" in said, said
    assert took < 120, took  # not the hour the hook sleeps
    assert _misses(recorded) == ["open"]
    # within its limit, the same miss is tuned
    done, _ = _tune(tmp_path, *args[:-1], "60", hang=0)
    assert done.returncode == 0 and "tuned: BLOCK=" in done.stdout, done.stdout + done.stderr
    assert _misses(recorded) == ["tuned"]


def test_verify_stops_a_replay_past_its_time_limit_and_says_so(recorded, tmp_path):
    done, _ = _tune(tmp_path, "misses", "--tune", "--kernel", NAME, "--db", str(recorded), hang=0)
    assert done.returncode == 0, done.stdout + done.stderr
    args = ("verify", "--kernel", NAME, "--db", str(recorded), "--json", "--time-limit", "3")
    done, took = _tune(tmp_path, *args, hang=3600)
    assert done.returncode == 0, done.stdout + done.stderr
    [verdict] = json.loads(done.stdout)
    assert verdict["flags"] == ["not-measured"] and "ran past its time limit of 3 s" in verdict["detail"], verdict
    assert took < 120, took


def test_a_time_limit_out_of_range_is_refused_in_one_sentence(tmp_path):
    done, _ = _tune(tmp_path, "misses", "--tune", "--kernel", NAME, "--time-limit", "0", hang=0)
    assert done.returncode == 2 and "--time-limit" in done.stderr and "Traceback" not in done.stderr


def _sleeps(connection, seconds):
    time.sleep(seconds)
    connection.send("late")


def test_a_child_with_no_answer_in_time_is_killed_and_reaped():
    process, connection = start_child(_sleeps, 3600)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        receive_within(process, connection, 1.0)
    assert time.monotonic() - started < 30
    assert not process.is_alive() and process.exitcode == -9
    with pytest.raises(ProcessLookupError):
        os.kill(process.pid, 0)


def test_the_default_limit_is_the_options_and_the_librarys():
    from tunesvc._capture import tune

    assert tune.tune_recorded.__kwdefaults__["time_limit_s"] == settings.REPLAY_TIME_LIMIT_S
    assert tune.measure_stored.__kwdefaults__["time_limit_s"] == settings.REPLAY_TIME_LIMIT_S
