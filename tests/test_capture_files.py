"""The files a captured program and the CLI open never block them, and a database that changes
under a running program loses nothing silently: a FIFO at the database's side files, at
TUNESVC_TIMELINE or at TUNESVC_SUMMARY_FILE is refused in one line; a peer holding the
database's write lock (a second process, BEGIN IMMEDIATE) costs a captured program a few seconds
and one warning line; a database deleted or replaced while a program runs gets what it tunes
from then on; a 240-character database name can be created. Real processes, real FIFOs, real
SQLite files."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _capture import interpreter_env

from tunesvc.errors import TunesvcError
from tunesvc.store import Store

KERNELS = """
import triton
import triton.language as tl

def bench(fn, quantiles=None, **kw):
    fn()
    return [1.0] * len(quantiles) if quantiles else 1.0

CONFIGS = [triton.Config({"BLOCK": b}) for b in (16, 32)]

@triton.autotune(configs=CONFIGS, key=["n"], do_bench=bench)
@triton.jit
def scale(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, 2.0 * tl.load(x_ptr + offs, mask=mask), mask=mask)

@triton.autotune(configs=CONFIGS, key=["n"], do_bench=bench)
@triton.jit
def shift(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, 1.0 + tl.load(x_ptr + offs, mask=mask), mask=mask)
"""

#: two kernels, two keys each; prints the seconds its launches took; between the keys, runs
#: the BETWEEN environment variable's Python (a deletion of the database, a replacement)
APP = """
import os, time
import torch, triton
import appkernels as k

def launch(n):
    x, out = torch.randn(n), torch.empty(n)
    k.scale[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, out, n)
    torch.testing.assert_close(out, 2.0 * x)
    k.shift[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, out, n)
    torch.testing.assert_close(out, 1.0 + x)

start = time.monotonic()
launch(100)
exec(os.environ.get("BETWEEN", ""))
launch(200)
print(f"launches {time.monotonic() - start:.2f}")
"""

#: holds the write lock of a SQLite file (BEGIN IMMEDIATE) until its standard input closes
PEER = """
import sqlite3, sys
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute("BEGIN IMMEDIATE")
print("held", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def app(tmp_path):
    (tmp_path / "appkernels.py").write_text(KERNELS)
    path = tmp_path / "app.py"
    path.write_text(APP)
    return path


def _run(app: Path, timeout: float = 240, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(app)],
        env=interpreter_env(TUNESVC_CAPTURE="1", **env),
        cwd=app.parent,
        capture_output=True,
        text=True,
        timeout=timeout,  # a regression hangs: it fails here instead
    )


def _tunesvc_lines(stderr: str) -> list[str]:
    return [line.strip() for line in stderr.splitlines() if line.strip().startswith(("tunesvc:", "RuntimeWarning"))]


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "RuntimeWarning: tunesvc:" in line]


def _winner_keys(db: Path) -> set[tuple[str, str]]:
    store = Store(db, readonly=True)
    try:
        return {(w.kernel.rpartition(":")[2], w.shape_key.split(",")[0]) for w in store.winners()}
    finally:
        store.close()


# -- FIFOs -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("side", ["-journal", "-wal", "-shm"])
@pytest.mark.parametrize("readonly", [False, True])
def test_a_fifo_at_a_side_file_of_the_database_is_refused_in_one_line(side, readonly, tmp_path):
    db = tmp_path / "t.db"
    Store(db).close()
    os.mkfifo(f"{db}{side}")
    code = f"from tunesvc.store import Store; Store({str(db)!r}, readonly={readonly})"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=interpreter_env()
    )
    assert done.returncode != 0
    assert f"{db}{side} is a FIFO (named pipe), where SQLite keeps the database's {side[1:]} file" in done.stderr
    with pytest.raises(TunesvcError, match="FIFO"):  # and here, in one sentence, before any open
        Store(db, readonly=readonly)


def test_a_captured_program_whose_databases_journal_is_a_fifo_runs_with_one_warning(app, tmp_path):
    db = tmp_path / "t.db"
    Store(db).close()
    os.mkfifo(f"{db}-journal")
    done = _run(app, TUNESVC_DB=str(db))
    assert done.returncode == 0, done.stderr
    assert "launches" in done.stdout
    lines = _warnings(done.stderr)
    assert lines and all("is a FIFO" in line for line in lines), done.stderr


def test_a_timeline_that_is_a_fifo_is_refused_in_one_warning_and_never_waited_on(tmp_path):
    fifo = tmp_path / "timeline"
    os.mkfifo(fifo)
    code = "from tunesvc import timeline\nfor e in ('a', 'b', 'c'): timeline.mark(e)\nprint('done')"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=interpreter_env(TUNESVC_TIMELINE=str(fifo)),
    )
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr
    assert len(_warnings(done.stderr)) == 1 and "is a FIFO (named pipe), not a timeline file" in done.stderr


def test_a_summary_file_that_is_a_fifo_is_refused_in_one_line_and_the_program_ends_as_it_would(app, tmp_path):
    fifo = tmp_path / "summary"
    os.mkfifo(fifo)
    done = _run(app, TUNESVC_DB=str(tmp_path / "t.db"), TUNESVC_SUMMARY_FILE=str(fifo))
    assert done.returncode == 0, done.stderr
    refused = [line for line in done.stderr.splitlines() if "TUNESVC_SUMMARY_FILE" in line]
    assert len(refused) == 1 and "is a FIFO (named pipe), not a summary file" in refused[0], done.stderr


# -- a peer's write lock ---------------------------------------------------------------------------
def test_a_peer_holding_the_write_lock_costs_a_few_seconds_and_one_warning_then_the_keys_are_tuned_later(app, tmp_path):
    db = tmp_path / "t.db"
    Store(db).close()
    free = _run(app, TUNESVC_DB=str(tmp_path / "other.db"))  # the same launches, no lock: the baseline
    assert free.returncode == 0, free.stderr
    peer = subprocess.Popen(
        [sys.executable, "-c", PEER, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert peer.stdout is not None and peer.stdout.readline().strip() == "held"
        locked = _run(app, TUNESVC_DB=str(db), TUNESVC_SUMMARY="1")
    finally:
        peer.communicate(input="", timeout=60)  # releases the lock
    assert locked.returncode == 0, locked.stderr
    lines = _warnings(locked.stderr)
    assert len(lines) == 1 and "another process held the write lock of" in lines[0], locked.stderr
    # two kernels, four keys: one wait of a few seconds in all (30 s a key before)
    took, baseline = (float(r.stdout.split("launches")[1]) for r in (locked, free))
    assert took - baseline < 10, (took, baseline, locked.stderr)
    summary = locked.stderr.strip().splitlines()[-1]
    assert "0 tuned" in summary and "4 keys met while another process held the database's write lock" in summary
    assert _winner_keys(db) == set()  # nothing written while the lock was held
    later = _run(app, TUNESVC_DB=str(db))  # the next run tunes them
    assert later.returncode == 0 and not _warnings(later.stderr), later.stderr
    assert _winner_keys(db) == {(k, f"n={n}") for k in ("scale", "shift") for n in (100, 200)}


def test_a_lookup_program_records_no_miss_while_a_peer_holds_the_lock_and_says_so_once(app, tmp_path):
    db = tmp_path / "t.db"
    Store(db).close()
    peer = subprocess.Popen(
        [sys.executable, "-c", PEER, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert peer.stdout is not None and peer.stdout.readline().strip() == "held"
        started = time.monotonic()
        done = _run(app, TUNESVC_DB=str(db), TUNESVC_MODE="lookup")
        took = time.monotonic() - started
    finally:
        peer.communicate(input="", timeout=60)
    assert done.returncode == 0, done.stderr
    locked = [line for line in _warnings(done.stderr) if "write lock" in line]
    assert len(locked) == 1, done.stderr  # four misses, one line
    assert took < 120, took


# -- a database deleted or replaced while the program runs ---------------------------------------
@pytest.mark.parametrize("sides", [("",), ("", "-wal", "-shm")], ids=["the file", "with its side files"])
def test_a_database_deleted_while_the_program_runs_gets_what_is_tuned_afterwards_with_one_warning(sides, app, tmp_path):
    """`rm tune.db` leaves its -wal and -shm: the next file at the path never reads them as its own."""
    db = tmp_path / "t.db"
    delete = (
        f"import os\nfor side in {sides!r}:\n    if os.path.exists({str(db)!r} + side): os.unlink({str(db)!r} + side)\n"
    )
    done = _run(app, TUNESVC_DB=str(db), BETWEEN=delete)
    assert done.returncode == 0, done.stderr
    lines = _warnings(done.stderr)
    assert len(lines) == 1 and f"{db} was deleted while this process ran" in lines[0], done.stderr
    # the keys tuned before the deletion went with the old file; those after are in the new one
    assert _winner_keys(db) == {("scale", "n=200"), ("shift", "n=200")}


def test_a_database_replaced_while_the_program_runs_gets_what_is_tuned_afterwards(app, tmp_path):
    db, other = tmp_path / "t.db", tmp_path / "restored.db"
    Store(other).close()
    replace = f"import os\nos.replace({str(other)!r}, {str(db)!r})\n"
    done = _run(app, TUNESVC_DB=str(db), BETWEEN=replace)
    assert done.returncode == 0, done.stderr
    lines = _warnings(done.stderr)
    assert len(lines) == 1 and f"{db} was replaced by another file while this process ran" in lines[0], done.stderr
    assert _winner_keys(db) == {("scale", "n=200"), ("shift", "n=200")}


def test_a_database_deleted_with_its_folder_is_said_and_the_program_runs_on(app, tmp_path):
    folder = tmp_path / "dbs"
    folder.mkdir()
    db = folder / "t.db"
    gone = f"import shutil\nshutil.rmtree({str(folder)!r})\n"
    done = _run(app, TUNESVC_DB=str(db), BETWEEN=gone)
    assert done.returncode == 0, done.stderr
    assert "launches" in done.stdout
    assert any("was deleted with its folder" in line for line in _warnings(done.stderr)), done.stderr


# -- numeric settings ------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["1e308", "86400"])
def test_a_claim_stale_time_out_of_range_is_one_warning_and_every_key_is_tuned(value, app, tmp_path):
    """1e308 once passed the check, then killed each claim's heartbeat thread (OverflowError);
    86400 (a day) is the longest taken, and its heartbeat waits a quarter of it."""
    db = tmp_path / "t.db"
    done = _run(app, TUNESVC_DB=str(db), TUNESVC_CLAIM_STALE_S=value)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "OverflowError" not in done.stderr, done.stderr
    said = _warnings(done.stderr)
    if value == "1e308":
        assert len(said) == 1 and "TUNESVC_CLAIM_STALE_S='1e308' is not a number of seconds from 1 to 86400" in said[0]
    else:
        assert said == [], done.stderr
    assert _winner_keys(db) == {(k, f"n={n}") for k in ("scale", "shift") for n in (100, 200)}


# -- long names ------------------------------------------------------------------------------------
def test_a_database_of_a_240_character_name_is_created(tmp_path):
    db = tmp_path / ("d" * 237 + ".db")
    assert len(db.name) == 240
    store = Store(db)
    try:
        assert store.revision is not None
    finally:
        store.close()
    assert db.is_file() and Store(db, readonly=True).revision == store.revision
    assert [p.name for p in tmp_path.iterdir()] == [db.name]  # its temporary file is gone


def test_a_store_of_a_relative_path_keeps_its_file_when_the_process_changes_folder(tmp_path, monkeypatch):
    """A relative name is the file it named when opened: a chdir is no deletion."""
    import warnings

    from tunesvc.device import current_device

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    store = Store("rel.db")
    try:
        monkeypatch.chdir(tmp_path / "b")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "deleted" warning
            store.device_id(current_device())
    finally:
        store.close()
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["rel.db"]
    assert list((tmp_path / "b").iterdir()) == []
