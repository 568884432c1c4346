"""`tune run -- CMD` behaves like CMD: the signals a supervisor or a terminal sends reach CMD,
and CMD's exit status is `tune run`'s (128 + the signal for a CMD a signal ended), with real
processes."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from _capture import DOUBLING_PROGRAM

#: a command that says it is ready, then records the first signal it gets and exits 42
TRAPS = textwrap.dedent(
    """
    import os, signal, sys, time
    out = sys.argv[1]
    def got(signum, frame):
        with open(out, "a") as f:
            f.write(signal.Signals(signum).name + "\\n")
        os._exit(42)
    for name in ("SIGTERM", "SIGINT", "SIGHUP"):
        signal.signal(getattr(signal, name), got)
    with open(out + ".ready", "w") as f:
        f.write(str(os.getpid()))
    time.sleep(120)
    """
)


def _tune_run(*command: str, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "TUNESVC_DB": str(cwd / "run.db")}
    return subprocess.Popen(
        [sys.executable, "-m", "tunesvc", "run", "--", *command],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # no terminal: a signal reaches `tune run` alone, as `kill` sends it
    )


def _ready(process: subprocess.Popen, path: Path) -> int:
    deadline = time.monotonic() + 120
    while not path.exists() or not path.read_text():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the command did not start in time"
        time.sleep(0.05)
    return int(path.read_text())


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_signal_sent_to_tune_run_reaches_the_command_and_its_exit_status_is_passed_through(name, tmp_path):
    script = tmp_path / "traps.py"
    script.write_text(TRAPS)
    out = tmp_path / "signals"
    process = _tune_run(sys.executable, str(script), str(out), cwd=tmp_path)
    child = _ready(process, Path(f"{out}.ready"))
    assert child != process.pid
    os.kill(process.pid, getattr(signal, name))  # to `tune run` alone
    _, err = process.communicate(timeout=60)
    assert out.read_text().split() == [name]  # the command got it, once
    assert process.returncode == 42, err
    assert "tunesvc: 0 kernels captured" in err  # and the summary line still ends the run


def test_a_command_that_ignores_nothing_ends_by_the_forwarded_signal_and_tune_run_exits_128_plus_it(tmp_path):
    script = tmp_path / "sleeps.py"
    script.write_text("import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(120)\n")
    ready = tmp_path / "ready"
    process = _tune_run(sys.executable, str(script), str(ready), cwd=tmp_path)
    child = _ready(process, ready)
    os.kill(process.pid, signal.SIGTERM)
    process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM
    with pytest.raises(ProcessLookupError):  # not left running, orphaned
        os.kill(child, 0)


@pytest.mark.parametrize("name", ["SIGKILL", "SIGSEGV"])
def test_a_command_ended_by_a_signal_makes_tune_run_exit_128_plus_the_signal(name, tmp_path):
    number = int(getattr(signal, name))
    code = f"import os, signal; os.kill(os.getpid(), {number})"
    process = _tune_run(sys.executable, "-c", code, cwd=tmp_path)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 128 + number, err  # 137, 139: as a shell says it


def test_tune_run_passes_the_commands_own_exit_status_through(tmp_path):
    process = _tune_run(sys.executable, "-c", "raise SystemExit(7)", cwd=tmp_path)
    process.communicate(timeout=120)
    assert process.returncode == 7


#: records every SIGINT it gets; exits 42 two seconds after the first (a second one would come by then)
COUNTS = textwrap.dedent(
    """
    import os, signal, sys, time
    out = sys.argv[1]
    got = []
    def on(signum, frame):
        with open(out, "a") as f:
            f.write(signal.Signals(signum).name + "\\n")
        got.append(signum)
    signal.signal(signal.SIGINT, on)
    with open(out + ".ready", "w") as f:
        f.write(str(os.getpid()))
    deadline = time.monotonic() + 120
    while not got and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(2)
    os._exit(42)
    """
)


def _with_a_terminal() -> None:
    """In the child, before exec: a new session whose controlling terminal is its standard input."""
    import fcntl
    import termios

    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def test_a_terminals_ctrl_c_reaches_the_command_once_not_twice(tmp_path):
    """Ctrl-C: the terminal sends SIGINT to its foreground process group, `tune run` and the
    command alike; `tune run` does not send the command a second one."""
    import pty

    script = tmp_path / "counts.py"
    script.write_text(COUNTS)
    out = tmp_path / "signals"
    primary, secondary = pty.openpty()
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "tunesvc", "run", "--", sys.executable, str(script), str(out)],
            cwd=tmp_path,
            env={**os.environ, "TUNESVC_DB": str(tmp_path / "run.db")},
            stdin=secondary,
            stdout=secondary,
            stderr=secondary,
            preexec_fn=_with_a_terminal,  # the test process forks nothing else meanwhile
        )
        os.close(secondary)
        secondary = -1
        _ready(process, Path(f"{out}.ready"))
        assert os.tcgetpgrp(primary) == process.pid  # `tune run` leads the terminal's foreground group
        os.killpg(process.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        deadline = time.monotonic() + 60
        while process.poll() is None:  # the terminal is read, so that nothing written to it blocks
            assert time.monotonic() < deadline, "tune run did not end"
            with contextlib.suppress(OSError):
                if select.select([primary], [], [], 0.1)[0]:
                    os.read(primary, 65536)
    finally:
        os.close(primary)
        if secondary != -1:
            os.close(secondary)
    assert out.read_text().split() == ["SIGINT"]
    assert process.returncode == 42


@pytest.mark.parametrize("status", [0, 3])
def test_tune_run_leaves_the_database_its_command_wrote_whole_and_no_side_files(status, tmp_path):
    """The database the command created is left as the command left it: SQLite's -wal and -shm
    files are gone once `tune run` exits, and a command that fails keeps the file it wrote a
    winner to (the file of a failed command is removed only where it holds nothing)."""
    import sqlite3

    (tmp_path / "launches.py").write_text(DOUBLING_PROGRAM)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNESVC_")}
    done = subprocess.run(
        [sys.executable, "-m", "tunesvc", "run", "--mode", "tune", "--", sys.executable, "launches.py", str(status)],
        cwd=tmp_path,
        env={**env, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == status, done.stderr[-2000:]
    db = tmp_path / "tune.db"
    assert db.exists() and not Path(f"{db}-wal").exists() and not Path(f"{db}-shm").exists(), sorted(
        p.name for p in tmp_path.iterdir()
    )
    with sqlite3.connect(db) as connection:
        assert connection.execute("SELECT count(*) FROM tunesvc_winners").fetchone() == (1,)
