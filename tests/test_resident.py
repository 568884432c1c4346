"""The resident process of `tune sweep` (tunesvc/cli/_resident.py): a real one, started by a real
sweep under Triton's interpreter, serving later sweeps as forks in the caller's terminal; and the
caller's fail-open paths, against sockets that do not answer as a resident process does."""

from __future__ import annotations

import json
import os
import pty
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tunesvc.cli import _resident
from tunesvc.store import Store

SHAPE = ["--shape", "37x45x29", "--budget", "2"]
#: a sweep long enough to be interrupted (30 trials of a 100^3 GEMM under the interpreter)
LONG = ["--shape", "100x100x100", "--budget", "30"]
#: seconds a resident process may take to start on a loaded 2-core machine (it imports torch)
START_S = 180.0


def _wait(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"waited {timeout:g} s for {what}")


def _events(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _sweep(resident, *args: str, timeline: Path | None = None, env: dict | None = None, **options):
    env = {**resident.env, **(env or {})}
    if timeline is not None:
        env["TUNESVC_TIMELINE"] = str(timeline)
    command = [sys.executable, "-m", "tunesvc", "sweep", "matmul", *args]
    return subprocess.run(command, cwd=resident.cwd, env=env, capture_output=True, text=True, timeout=600, **options)


@pytest.fixture
def runtime():
    """A socket folder of a short path (pytest's tmp_path is too long for a Unix socket's name)."""
    folder = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _socket(runtime: Path) -> Path | None:
    found = sorted(runtime.glob("tunesvc-*/resident-*.sock"))
    return found[0] if found else None


@pytest.fixture(scope="module")
def resident(tmp_path_factory):
    """A resident process, started by a first sweep that ran in its own process."""
    root = tmp_path_factory.mktemp("resident")
    runtime, cwd = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp")), root / "work"
    cwd.mkdir()
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "TUNESVC_RESIDENT": "1", "COLUMNS": "80"}
    env.pop("TUNESVC_TIMELINE", None)
    state = SimpleNamespace(root=root, runtime=runtime, cwd=cwd, env=env)
    first = _sweep(state, *SHAPE, "--db", str(root / "first.db"), timeline=root / "first.jsonl")
    assert first.returncode == 0, first.stderr
    state.first_events = _events(root / "first.jsonl")
    state.socket = _wait(lambda: _socket(runtime), START_S, "the resident process's socket")
    state.pid = int(state.socket.with_suffix(".lock").read_text())
    yield state
    os.kill(state.pid, signal.SIGTERM)
    shutil.rmtree(runtime, ignore_errors=True)


def test_a_sweep_runs_in_the_resident_process_an_earlier_sweep_started(resident):
    assert not any(e["event"] == "resident process forked" for e in resident.first_events)  # none ran yet
    db, log = resident.root / "second.db", resident.root / "second.jsonl"
    done = _sweep(resident, *SHAPE, "--db", str(db), "--json", timeline=log)
    assert done.returncode == 0, done.stderr
    assert [r["shape_key"] for r in json.loads(done.stdout)] == ["M=64,N=45,K=29,dtype=float16"]  # stdout: the caller's
    forked = [e for e in _events(log) if e["event"] == "resident process forked"]
    assert len(forked) == 1 and forked[0]["role"] == "command"
    assert forked[0]["pid"] != resident.pid  # a child of the resident process, not the process itself
    # what the sweep stored is in the caller's database, under the caller's working folder
    store = Store(str(db))
    try:
        assert [w.shape_key for w in store.winners(kernel="matmul")] == ["M=64,N=45,K=29,dtype=float16"]
    finally:
        store.close()
    # the resident process's own imports wrote nothing into the caller's timeline
    assert not any(e["pid"] == resident.pid for e in _events(log))


def test_a_sweep_in_the_resident_process_exits_as_it_would_here(resident):
    refused = _sweep(resident, "--shape", "37x45x29", "--strategy", "nope", timeline=resident.root / "nope.jsonl")
    here = _sweep(resident, "--shape", "37x45x29", "--strategy", "nope", env={"TUNESVC_RESIDENT": "0"})
    assert any(e["event"] == "resident process forked" for e in _events(resident.root / "nope.jsonl"))
    assert refused.returncode == here.returncode != 0
    assert refused.stderr == here.stderr and "Unknown strategy 'nope'" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_ctrl_c_reaches_the_sweep_in_the_resident_process(resident):
    db, log = resident.root / "interrupted.db", resident.root / "interrupted.jsonl"
    env = {**resident.env, "TUNESVC_TIMELINE": str(log)}
    command = [sys.executable, "-m", "tunesvc", "sweep", "matmul", *LONG, "--db", str(db), "-q"]
    caller = subprocess.Popen(
        command, cwd=resident.cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    _wait(lambda: any(e["event"] == "first trials stored" for e in _events(log)), 300, "the first trial")
    assert any(e["event"] == "resident process forked" for e in _events(log))
    caller.send_signal(signal.SIGINT)
    _, err = caller.communicate(timeout=300)
    assert caller.returncode == 130, err
    assert "Interrupted:" in err and "Resume with:" in err  # the sweep's own Ctrl-C report


def test_a_killed_caller_interrupts_its_sweep(resident):
    db, log = resident.root / "orphan.db", resident.root / "orphan.jsonl"
    env = {**resident.env, "TUNESVC_TIMELINE": str(log)}
    command = [sys.executable, "-m", "tunesvc", "sweep", "matmul", *LONG, "--db", str(db), "-q"]
    caller = subprocess.Popen(command, cwd=resident.cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait(lambda: any(e["event"] == "first trials stored" for e in _events(log)), 300, "the first trial")
    (child,) = {e["pid"] for e in _events(log) if e["event"] == "resident process forked"}
    caller.kill()
    caller.wait()

    def gone() -> bool:
        try:
            return Path(f"/proc/{child}/stat").read_text().split()[2] == "Z"  # ended, not yet reaped
        except FileNotFoundError:
            return True

    _wait(gone, 300, f"the sweep of the killed caller (process {child}) to end")
    os.kill(resident.pid, 0)  # the resident process itself still serves


def test_the_resident_process_streams_are_the_callers_terminal(resident):
    """The console the CLI made at the resident process's import (on /dev/null) draws for the caller's terminal."""
    main, follower = pty.openpty()
    env = {**resident.env, "TERM": "xterm-256color", "TUNESVC_TIMELINE": str(resident.root / "tty.jsonl")}
    env.pop("NO_COLOR", None)
    command = [sys.executable, "-m", "tunesvc", "sweep", "matmul", *SHAPE, "--db", str(resident.root / "tty.db")]
    caller = subprocess.Popen(command, cwd=resident.cwd, env=env, stdin=follower, stdout=follower, stderr=follower)
    os.close(follower)
    chunks = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: _read(main), b"")), daemon=True)
    reader.start()
    assert caller.wait(timeout=600) == 0
    reader.join(timeout=10)
    os.close(main)
    assert any(e["event"] == "resident process forked" for e in _events(resident.root / "tty.jsonl"))
    drawn = b"".join(chunks)
    assert b"\x1b[" in drawn  # styled for a terminal (a pipe or /dev/null gets plain text)
    assert b"M=64,N=45,K=29" in drawn


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 65536)
    except OSError:  # EIO: the terminal's last writer closed it
        return b""


def test_the_resident_process_refuses_what_it_must_not_run(resident):
    def ask(message: dict, fds: list[int] | None) -> dict:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.settimeout(60)
        client.connect(str(resident.socket))
        channel = _resident._Channel(client)
        channel.send(message, fds=fds)
        try:
            return channel.receive()
        except ConnectionAbortedError:
            return {}
        finally:
            client.close()

    base = {"argv": ["tune", "sweep"], "cwd": "/", "env": {}, "path": [], "umask": 0o22, "streams": []}
    real = resident.socket.stem.removeprefix("resident-")
    assert "fingerprint" in ask({**base, "fingerprint": "0" * 20}, [0, 1, 2])["refused"]
    assert "three streams" in ask({**base, "fingerprint": real}, None)["refused"]
    assert "commands" in ask({**base, "fingerprint": real, "argv": ["tune", "run"]}, [0, 1, 2])["refused"]
    assert "not text" in ask({**base, "fingerprint": real, "env": {"HOME": 1}}, [0, 1, 2])["refused"]
    assert "umask" in ask({**base, "fingerprint": real, "umask": -1}, [0, 1, 2])["refused"]
    os.kill(resident.pid, 0)  # still serving


def test_an_idle_resident_process_exits(tmp_path, runtime):
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "TUNESVC_RESIDENT": "1", "TUNESVC_RESIDENT_IDLE_S": "1"}
    state = SimpleNamespace(root=tmp_path, cwd=tmp_path, env=env)
    assert _sweep(state, *SHAPE, "--db", str(tmp_path / "a.db")).returncode == 0
    lock = _wait(lambda: sorted(runtime.glob("tunesvc-*/resident-*.lock")), START_S, "the resident process")[0]
    pid = int(_wait(lambda: lock.read_text().strip(), START_S, "its pid"))
    _wait(lambda: not _alive(pid), START_S, "the idle resident process to exit")
    assert not list(runtime.glob("tunesvc-*/resident-*.sock"))  # it removed its socket


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


# -- the caller's fail-open paths, in this process --------------------------------------------------
@pytest.fixture
def caller(runtime, monkeypatch):
    """This process as a `tune sweep` caller with its own socket folder; starting a resident
    process is recorded instead (the tests above start real ones)."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("TUNESVC_RESIDENT", "1")
    started: list[Path] = []
    monkeypatch.setattr(_resident, "start", started.append)
    where = _resident.socket_path(_resident.fingerprint())
    assert where is not None
    return SimpleNamespace(where=where, started=started)


def _serve_once(where: Path, answer) -> threading.Thread:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(where))
    server.listen(1)

    def run() -> None:
        conn, _ = server.accept()
        _, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        for fd in fds:
            os.close(fd)
        answer(conn)
        conn.close()
        server.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_no_resident_process_runs_the_sweep_here_and_starts_one(caller, recwarn):
    assert _resident.run_in_resident(["tune", "sweep", "matmul"]) is None
    assert caller.started == [caller.where]
    assert not recwarn.list  # none running is no failure


def test_other_commands_and_turned_off_never_reach_a_resident_process(caller, monkeypatch):
    assert _resident.run_in_resident(["tune", "show"]) is None
    monkeypatch.setenv("TUNESVC_RESIDENT", "0")
    assert _resident.run_in_resident(["tune", "sweep", "matmul"]) is None
    assert caller.started == []


@pytest.mark.parametrize(
    "answer, said",
    [
        (lambda conn: None, "did not take the sweep (the other end closed the socket)"),
        (lambda conn: conn.sendall(b"\xff\xff\xff\xff"), "did not take the sweep (a message of 4294967295 bytes"),
        (
            lambda conn: conn.sendall(b"\x00\x00\x00\x02[]"),
            "did not take the sweep (a message that is not a JSON object)",
        ),
        (lambda conn: _resident._Channel(conn).send({"refused": "busy"}), "refused the sweep (busy)"),
    ],
    ids=["closed", "oversized", "not-an-object", "refused"],
)
def test_a_socket_that_does_not_answer_as_a_resident_process_runs_the_sweep_here(caller, answer, said):
    thread = _serve_once(caller.where, answer)
    with pytest.warns(RuntimeWarning) as said_lines:
        assert _resident.run_in_resident(["tune", "sweep", "matmul"]) is None
    thread.join(timeout=30)
    assert len(said_lines) == 1 and said in str(said_lines[0].message) and "it runs here" in str(said_lines[0].message)
    assert caller.started == []


def test_a_socket_folder_others_may_write_is_not_used(runtime, monkeypatch):
    folder = runtime / f"tunesvc-{os.getuid()}"
    folder.mkdir()
    folder.chmod(0o777)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("TUNESVC_RESIDENT", "1")
    with pytest.warns(RuntimeWarning, match="not a folder of this user's alone") as said:
        assert _resident.run_in_resident(["tune", "sweep", "matmul"]) is None
    assert len(said) == 1
    assert list(folder.iterdir()) == []  # nothing started, nothing written there


def test_the_fingerprint_follows_the_import_environment_not_the_commands(monkeypatch):
    before = _resident.fingerprint()
    monkeypatch.setenv("TUNESVC_DB", "/elsewhere/tune.db")  # read by the command, as it runs
    monkeypatch.setenv("TUNESVC_TIMELINE", "/tmp/timeline.jsonl")
    monkeypatch.setenv("SOME_OTHER_PROGRAMS_SETTING", "1")
    assert _resident.fingerprint() == before
    monkeypatch.setenv("TRITON_CACHE_DIR", "/elsewhere/triton")  # read when triton is imported
    assert _resident.fingerprint() != before


#: a caller on a host where a GPU may be present: tunesvc's finder that asks torch about the GPU
#: just before triton is first imported is in place, as it is there (tunesvc/_processes.py)
MAYBE_GPU_CALLER = """
import os, sys
import tunesvc
from tunesvc import _processes
os.environ.pop("TRITON_INTERPRET", None)
sys.meta_path.insert(0, _processes._BeforeTriton())
from tunesvc.cli import _resident
_resident.fingerprint()
print("torch" in sys.modules, "triton" in sys.modules)
"""


def test_the_caller_imports_neither_torch_nor_triton():
    """Its fingerprint looks the libraries up without importing them: the second a fresh import takes is what it saves."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    seen = subprocess.run([sys.executable, "-c", MAYBE_GPU_CALLER], env=env, capture_output=True, text=True, check=True)
    assert seen.stdout.split() == ["False", "False"]


def test_sweep_help_says_a_resident_process_may_run_it():
    shown = subprocess.run(
        [sys.executable, "-m", "tunesvc", "sweep", "--help"], capture_output=True, text=True, check=True
    )
    said = " ".join(shown.stdout.replace("│", " ").split())
    assert "the first sweep leaves a resident process behind" in said and "TUNESVC_RESIDENT=0" in said
