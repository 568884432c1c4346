"""Ctrl-C during `tune sweep`: a real process gets SIGINT (to its whole process group, as a
terminal sends it), says how many trials are stored and how to resume, and exits 130; the
command it prints resumes the sweep to its end."""

from __future__ import annotations

import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.serial  # a sweep on every core, interrupted at a moment read from its database


def _trials(db) -> int:
    try:
        connection = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
        try:
            return connection.execute("SELECT count(*) FROM tunesvc_trials").fetchone()[0]
        finally:
            connection.close()
    except sqlite3.OperationalError:  # not created yet
        return 0


def _interrupted(args: list[str], cwd, db, at_least: int, group: bool) -> subprocess.CompletedProcess:
    """Run `tune ARGS`, send SIGINT to its process group (or to the command alone, as `kill -INT`
    does) once ``db`` holds ``at_least`` trials."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tunesvc", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group: Ctrl-C reaches the command and its workers alike
    )
    deadline = time.monotonic() + 240
    while _trials(db) < at_least:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the sweep stored no trial in time"
        time.sleep(0.2)
    if group:
        os.killpg(process.pid, signal.SIGINT)
    else:
        os.kill(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def _resumed(err: str, cwd) -> subprocess.CompletedProcess:
    command = err.split("Resume with: ", 1)[1].strip()
    words = shlex.split(command)
    assert words[:4] == ["python", "-m", "tunesvc", "sweep"]  # the hint names the command that ran
    return subprocess.run(
        [sys.executable, "-m", "tunesvc", *words[3:], "--quiet"], cwd=cwd, capture_output=True, text=True, timeout=600
    )


@pytest.mark.parametrize(
    "gpus, group",
    [(None, True), ("0,1", True), ("0,1", False)],
    ids=["one-process", "gpus", "gpus-kill-int-of-the-command"],
)
def test_ctrl_c_says_what_is_stored_and_how_to_resume(tmp_path, gpus, group):
    db = tmp_path / "tune.db"  # named by default: the resume command names it by its absolute path
    args = ["sweep", "matmul", "--shape", "37x45x29", "--shape", "100x45x29", "--budget", "12", "--dtype", "float32"]
    args += ["--gpus", gpus] if gpus else []
    done = _interrupted(args, tmp_path, db, at_least=3, group=group)
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr, done.stderr
    stored = _trials(db)
    assert 3 <= stored < 24
    lines = [line for line in done.stderr.splitlines() if line.startswith("Interrupted: ")]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"Interrupted: {stored} trials stored by this run ({stored} in all for 2 shape keys)")
    expected = "python -m tunesvc sweep matmul --shape 37x45x29 --shape 100x45x29 --dtype float32 --budget 12"
    expected += f" --gpus {gpus}" if gpus else ""
    assert lines[0].endswith(f"Resume with: {expected} --db {db}")
    if gpus:  # the workers gave their jobs back: none is left running
        connection = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        statuses = {row[0] for row in connection.execute("SELECT status FROM tunesvc_jobs")}
        connection.close()
        assert "running" not in statuses, statuses

    resumed = _resumed(lines[0], tmp_path / "..")  # from another folder: the command names the database
    assert resumed.returncode == 0, resumed.stderr
    assert _trials(db) == 24  # each key's budget, the trials stored before Ctrl-C kept and not measured again
