"""Ctrl-C during `tune sweep`: a real process gets SIGINT (to its whole process group, as a
terminal sends it), says how many trials are stored and how to resume, and exits 130; the
command it prints resumes the sweep to its end; at a terminal, its progress lines stay drawn once."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import shlex
import signal
import sqlite3
import struct
import subprocess
import sys
import termios
import time

import pytest
from _capture import interpreter_env

pytestmark = pytest.mark.serial  # a sweep on every core, interrupted at a moment read from its database


@pytest.fixture(autouse=True)
def _sigint_reaches_the_command():
    """The commands here get SIGINT as from a terminal's Ctrl-C. A test run started in the
    background of a non-interactive shell (`cmd &`, as CI scripts do) inherits SIGINT ignored, and
    a command would inherit that too: handled here, it is reset to its default at their exec."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


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


def _screen(output: str, columns: int) -> list[str]:
    """The lines a terminal of ``columns`` shows after ``output``: text, CR, LF, cursor up (CSI A)
    and erase in line (CSI K), what rich's live display writes; other escapes change no text. A
    character written in the last column leaves the cursor there, and the next one wraps, as
    terminals do: a ^C echoed after a line of the full width goes to a line of its own.
    Hand-written: these five are all the test reads, where a terminal emulator would be a new
    dependency."""
    lines: list[list[str]] = [[]]
    row = col = 0
    wrapping = False
    for match in re.finditer(r"\x1b\[([0-9;?]*)([A-Za-z])|\x1b.|(.)", output, re.S):
        params, command, char = match.groups()
        if command == "A":
            row, wrapping = max(row - int(params or 1), 0), False
        elif command == "K":
            lines[row] = [] if params == "2" else lines[row][:col]
        elif char == "\r":
            col, wrapping = 0, False
        elif char == "\n":
            row, wrapping = row + 1, False
        elif char is not None:
            if wrapping:
                row, col, wrapping = row + 1, 0, False
            lines += [[] for _ in range(row + 1 - len(lines))]
            line = lines[row]
            line += [" "] * (col + 1 - len(line))
            line[col] = char
            col, wrapping = (col, True) if col == columns - 1 else (col + 1, False)
        lines += [[] for _ in range(row + 1 - len(lines))]
    return ["".join(line).rstrip() for line in lines]


@pytest.mark.parametrize("gpus", [None, "0,1"], ids=["one-process", "gpus"])
def test_ctrl_c_at_an_80_column_terminal_leaves_each_progress_line_drawn_once(tmp_path, gpus):
    """Ctrl-C typed at a terminal of 80 columns (a pseudo-terminal, whose line discipline echoes
    ^C and sends SIGINT to the command's process group): each key's progress line is on the
    screen once and whole (its three-digit count and its clock), the ^C drawn over, above the
    summary."""
    db = tmp_path / "tune.db"
    args = ["sweep", "matmul", "--shape", "37x45x29", "--shape", "100x70x50", "--budget", "150", "--dtype", "float32"]
    args += ["--gpus", gpus] if gpus else []
    env = {k: v for k, v in interpreter_env(TERM="xterm").items() if k not in ("COLUMNS", "LINES")}
    pid, terminal = pty.fork()
    if pid == 0:  # the command, in a session of its own whose controlling terminal is the pty
        try:
            fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
            os.chdir(tmp_path)
            os.execve(sys.executable, [sys.executable, "-m", "tunesvc", *args], env)
        finally:
            os._exit(127)
    output, typed = b"", False
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if not typed and _trials(db) >= 3 and b"/150" in output:
            os.write(terminal, b"\x03")  # Ctrl-C
            typed = True
        if select.select([terminal], [], [], 0.2)[0]:
            try:
                data = os.read(terminal, 65536)
            except OSError:  # EIO: the command ended, and the terminal with it
                break
            if not data:
                break
            output += data
    else:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(terminal)
    assert typed and os.waitstatus_to_exitcode(status) == 130, output.decode(errors="replace")[-3000:]
    screen = _screen(output.decode(), 80)
    # the smaller key's total: its feasible configs on the interpreter, fewer than the budget
    for key, total in (("M=64,N=45,K=29,dtype=float32", 70), ("M=128,N=70,K=50,dtype=float32", 150)):
        drawn = [line for line in screen if line.startswith(key)]
        assert len(drawn) == 1, screen
        assert re.search(rf" +\d+/{total} (.* )?\d+:\d\d:\d\d$", drawn[0]), drawn[0]
    assert sum(line.startswith("Interrupted: ") for line in screen) == 1, screen
    assert "^C" not in "\n".join(screen) and max(map(len, screen)) <= 80, screen
