"""Nothing lost: sweeps killed with SIGKILL, a database server that goes away, a full or read-only disk.

Sweeps run the matmul template in the interpreter on one small problem. Killed sweeps are
processes from a forkserver that has torch and tunesvc loaded (a cold start per repetition
would cost seconds); each reports the config hash of every trial once its transaction has
committed, so the test knows which trials must survive.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import shlex
import shutil
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pytest
from _backends import pg_database
from _backends import set_connections_allowed
from typer.testing import CliRunner

import tunesvc
from tunesvc.cli import app
from tunesvc.fleet import jobs
from tunesvc.records import MIN_NOISE
from tunesvc.store import Store
from tunesvc.store import _store
from tunesvc.tuning.sweep import run_sweep

PROBLEM = {"M": 37, "N": 45, "K": 29, "dtype": "float16"}
BUDGET = 3
REPETITIONS = 20


def _context():
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(
            [
                "torch",
                "triton",
                "triton.language",
                "tunesvc.store",
                "tunesvc.bench",
                "alembic.command",
                "tunesvc.tuning.sweep",
                "tunesvc.kernels",
            ]
        )
        return context
    return multiprocessing.get_context("spawn")


def _sweep(path: str, log_path: str) -> None:
    """The sweep under test: appends each committed trial's config hash to log_path, one line each."""
    import tunesvc
    from tunesvc.space import config_hash
    from tunesvc.store import Store
    from tunesvc.tuning.sweep import run_sweep

    template = tunesvc.get_template("matmul")
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    store = Store(path)
    run_sweep(
        template,
        [template.problem(**PROBLEM)],
        store,
        budget=BUDGET,
        on_trial=lambda event: os.write(fd, f"{config_hash(event.config)}\n".encode()),
    )
    store.close()


def _committed(log_path: str) -> list[str]:
    if not os.path.exists(log_path):
        return []
    text = Path(log_path).read_text()
    return [line for line in text.split("\n")[:-1]]  # a line cut by the kill has no newline: dropped


def _trials(path: str) -> list[tuple]:
    con = sqlite3.connect(path)
    try:
        return con.execute(
            "SELECT id, shape_key, config_hash, status, time_ms FROM tunesvc_trials ORDER BY id"
        ).fetchall()
    finally:
        con.close()


def _spread(path: str, config_hash: str) -> float | None:
    con = sqlite3.connect(path)
    try:
        return con.execute("SELECT spread FROM tunesvc_trials WHERE config_hash = ?", (config_hash,)).fetchone()[0]
    finally:
        con.close()


def _winner_hashes(path: str) -> dict[str, str]:
    con = sqlite3.connect(path)
    try:
        return dict(con.execute("SELECT shape_key, config_hash FROM tunesvc_winners"))
    finally:
        con.close()


def _integrity(path: str) -> list:
    con = sqlite3.connect(path)
    try:
        return con.execute("PRAGMA integrity_check").fetchall()
    finally:
        con.close()


def test_sweeps_killed_at_random_moments_resume_with_nothing_lost_or_duplicated(tmp_path):
    template = tunesvc.get_template("matmul")
    problem = template.problem(**PROBLEM)
    context = _context()

    warm = context.Process(target=time.sleep, args=(0,))  # starts the forkserver: not part of a sweep's time
    warm.start()
    warm.join(timeout=120)
    base = str(tmp_path / "base.db")  # an empty database at head, copied for each run: no migration per run
    Store(base).close()
    clean_db, clean_log = str(tmp_path / "clean.db"), str(tmp_path / "clean.log")
    shutil.copy(base, clean_db)
    started = time.monotonic()
    child = context.Process(target=_sweep, args=(clean_db, clean_log))
    child.start()
    child.join(timeout=120)
    duration = time.monotonic() - started
    assert child.exitcode == 0
    clean = {h for _, _, h, _, _ in _trials(clean_db)}
    assert len(clean) == BUDGET and set(_committed(clean_log)) == clean

    rng = random.Random(6)
    killed_mid_sweep = 0
    for rep in range(REPETITIONS):
        path, log_path = str(tmp_path / f"kill{rep}.db"), str(tmp_path / f"kill{rep}.log")
        shutil.copy(base, path)
        child = context.Process(target=_sweep, args=(path, log_path))
        child.start()
        time.sleep(rng.uniform(0.0, duration))
        child.kill()
        child.join(timeout=60)
        committed = _committed(log_path)
        killed_mid_sweep += child.exitcode == -9 and len(committed) < BUDGET

        store = Store(path)  # resume: the same sweep again, to the end
        try:
            run_sweep(template, [problem], store, budget=BUDGET)
        finally:
            store.close()

        trials = _trials(path)
        hashes = [h for _, _, h, _, _ in trials]
        assert set(committed) <= set(hashes), f"repetition {rep}: a committed trial was lost"
        assert len(hashes) == len(set(hashes)) == BUDGET, f"repetition {rep}: {hashes}"
        assert set(hashes) == clean  # the grid's first BUDGET configs, as in the clean run
        # the fastest of these trials, or one tied with it (within its noise interval: the tie rule's pick)
        ok = {h: ms for _, _, h, status, ms in trials if status == "ok"}
        [(key, winner)] = _winner_hashes(path).items()
        fastest = min(ok, key=ok.__getitem__)
        noise = max(_spread(path, fastest) or 0.0, MIN_NOISE)
        assert key == str(template.key(problem)) and ok[winner] <= ok[fastest] * (1 + noise)
        assert _integrity(path) == [("ok",)]
    assert killed_mid_sweep >= REPETITIONS // 4, f"only {killed_mid_sweep} kills landed mid-sweep"


# -- a full or read-only database ------------------------------------------------------------------
def _limit_sqlite(monkeypatch, pragma: str) -> None:
    """Every new SQLite connection of the store also runs ``pragma`` (SQLite's own limits stand in
    for a full disk or a read-only file: root, which runs CI, may write a chmod 444 file)."""
    original = _store.Store._sqlite_pragmas

    def pragmas(self, dbapi_connection, record):
        original(self, dbapi_connection, record)
        dbapi_connection.execute(pragma)

    monkeypatch.setattr(_store.Store, "_sqlite_pragmas", pragmas)


def _sweep_cli(db: str, budget: int):
    return CliRunner().invoke(
        app, ["sweep", "matmul", "--shape", "37x45x29", "--budget", str(budget), "--db", db, "--quiet"]
    )


def test_a_full_disk_is_one_error_line_and_leaves_no_partial_rows(tmp_db, monkeypatch):
    assert _sweep_cli(tmp_db, 1).exit_code == 0
    con = sqlite3.connect(tmp_db, isolation_level=None)
    # small pages fill after a trial or two: the disk is "full" at once, not after minutes of trials
    for pragma in ("journal_mode = DELETE", "page_size = 512", "VACUUM", "journal_mode = WAL"):
        con.execute(f"PRAGMA {pragma}" if pragma != "VACUUM" else pragma)
    pages = con.execute("PRAGMA page_count").fetchone()[0]
    con.close()
    before = _trials(tmp_db)
    _limit_sqlite(monkeypatch, f"PRAGMA max_page_count = {pages}")  # the file cannot grow by one page

    result = _sweep_cli(tmp_db, 200)

    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert lines == [f"Error: {tmp_db} is full (no space left); free space and run again: the sweep resumes."]
    after = _trials(tmp_db)
    assert after[: len(before)] == before
    assert all(None not in (key, h, status) for _, key, h, status, _ in after)  # whole rows only
    assert _integrity(tmp_db) == [("ok",)]
    monkeypatch.undo()
    assert _sweep_cli(tmp_db, len(after) + 2).exit_code == 0  # space again: the sweep resumes
    hashes = [h for _, _, h, _, _ in _trials(tmp_db)]
    assert len(hashes) == len(set(hashes)) == len(after) + 2


def test_a_read_only_database_is_one_error_line_and_changes_nothing(tmp_db, monkeypatch):
    assert _sweep_cli(tmp_db, 1).exit_code == 0
    before = _trials(tmp_db)
    _limit_sqlite(monkeypatch, "PRAGMA query_only = 1")

    result = _sweep_cli(tmp_db, 3)

    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"Error: {tmp_db} is read-only; make it writable or pass another --db."
    ]
    assert _trials(tmp_db) == before
    assert _integrity(tmp_db) == [("ok",)]


# -- PostgreSQL: the server goes away mid-sweep ------------------------------------------------------
@pytest.mark.serial  # it stops the server that every other PostgreSQL test uses
def test_postgresql_server_restarted_mid_sweep_is_reported_retried_and_finished(template, device):
    """With $TUNESVC_TEST_PG_CTL (`.ci/run`: pg_ctlcluster VERSION main) the server really stops and
    starts; otherwise the test database refuses connections for as long (what a client sees is the same)."""
    ctl = os.environ.get("TUNESVC_TEST_PG_CTL")
    problems = [template.problem(**PROBLEM)]
    budget = 6
    for url in pg_database():
        store = Store(url)
        batch = jobs.batch_name("matmul", template, problems, "grid", budget, 0, device)
        jobs.enqueue(store, batch, "matmul", template, problems, "grid", budget, 0)
        lines: list[str] = []
        errors: list[BaseException] = []

        def worker() -> None:
            try:
                jobs.work(url, batch, heartbeat_s=0.2, retry_s=120, log=lines.append)
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=worker)
        thread.start()
        try:
            deadline = time.monotonic() + 60
            while not _pg_trial_count(store) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert 0 < _pg_trial_count(store) < budget, "the sweep never got going, or finished too soon"
            store.close()
            _server(ctl, url, up=False)
            deadline = time.monotonic() + 30
            while not any("retrying" in line for line in lines) and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(1.0)
        finally:
            _server(ctl, url, up=True)
        thread.join(timeout=180)
        assert not thread.is_alive() and errors == []
        assert any(line.startswith("Lost the connection to postgresql") and "retrying in" in line for line in lines), (
            lines
        )
        assert lines[-1].startswith("done ")
        store = Store(url)
        try:
            [job] = jobs.jobs(store, batch)
            assert job.status == "done"
            kv, dev = store.kernel_version_id(template), store.device_id(device)
            hashes = [t.config_hash for t in store.trials(kv, dev, str(template.key(problems[0])))]
            assert len(hashes) == len(set(hashes)) == budget
            assert len(store.winners(kernel="matmul")) == 1
        finally:
            store.close()


def _pg_trial_count(store: Store) -> int:
    return sum(store.trial_counts().values())


def _server(ctl: str | None, url: str, *, up: bool) -> None:
    if ctl:
        subprocess.run([*shlex.split(ctl), "start" if up else "stop"], check=True, capture_output=True, timeout=120)
        if up:
            _wait_for_server(url)
    else:
        set_connections_allowed(url, up)


def _wait_for_server(url: str) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy import text

    deadline = time.monotonic() + 60
    while True:
        engine = create_engine(url)
        try:
            with engine.connect() as connection:
                connection.execute(text("SELECT 1"))
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
        finally:
            engine.dispose()


# -- the command's own reads after its workers finished ---------------------------------------------
def test_sweep_gpus_whose_workers_finished_succeeds_through_a_lost_connection(tmp_path, monkeypatch):
    """A server restart during `tune sweep --gpus`: the workers retry and finish every job; the
    command's reads of their results (jobs, winners) that meet the lost connection are retried too,
    so the command says so and succeeds rather than ending 'Lost the connection' with exit 1."""
    from tunesvc.store import DatabaseUnavailable

    command = os.getpid()  # the workers are forked from this process: only its own reads fail
    failed: list[str] = []

    def lost_once(name: str, read):
        def wrapper(*args, **kwargs):
            if os.getpid() == command and name not in failed:
                failed.append(name)
                raise DatabaseUnavailable("Lost the connection to postgresql://db/tune: server closed the connection")
            return read(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(jobs, "jobs", lost_once("jobs", jobs.jobs))
    monkeypatch.setattr(Store, "winners", lost_once("winners", Store.winners))
    db = tmp_path / "t.db"
    args = ["sweep", "matmul", "--shape", "37x45x29", "--budget", "2", "--gpus", "0", "--db", str(db)]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert failed == ["jobs", "winners"]
    retries = [line for line in result.stderr.splitlines() if line.startswith("Lost the connection")]
    assert len(retries) == 2 and all("retrying in 1 s" in line for line in retries), result.stderr
    [row] = [line for line in result.stdout.splitlines() if "M=64,N=45,K=29,dtype=float16" in line]
    assert " done " in row and "VARIANT=" in row, row
