"""One database, many writers at once: on SQLite, WAL and the busy timeout serialise them; no one fails.

Each writer is a fresh process (never a fork of this one, which holds open SQLite connections):
the forkserver start method, whose server imports tunesvc once (spawn would import torch once
per process: about 25 s for 8 processes on a 2-core machine instead of about 3); spawn where
there is no forkserver.
"""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

import pytest
from _backends import db_url  # noqa: F401  (fixture: a SQLite file, a PostgreSQL database)
from sqlalchemy import create_engine
from sqlalchemy import text

WRITERS = 8
TRIALS = 50
KEY = "M=64,N=45,K=29,dtype=float16"


def _context():
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        # one forkserver serves the whole pytest process: preload what tunesvc.bench.Compiler's
        # workers need too, so whichever test starts it, later ones find their modules loaded
        context.set_forkserver_preload(
            ["torch", "triton", "triton.language", "tunesvc.store", "tunesvc.bench", "alembic.command"]
        )
        return context
    return multiprocessing.get_context("spawn")


def _write_trials(path: str, ids: tuple[int, int, int], writer: int, barrier, results) -> None:
    errors: list[str] = []
    stored = 0
    try:
        from tunesvc.bench import Measurement
        from tunesvc.bench import Status
        from tunesvc.store import Store

        kv, dev, sweep = ids
        store = Store(path)
        barrier.wait(timeout=120)  # every writer has its store open: now all write at once
        for i in range(TRIALS):
            config = {"writer": writer, "i": i}
            try:
                row = store.add_trial(
                    sweep, kv, dev, KEY, config, f"w{writer}-{i}", Measurement(Status.OK, time_ms=1.0 + i, reps=1)
                )
                stored += row is not None
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
        store.close()
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    results.put((writer, stored, errors))


def _open_store(path: str, barrier, results) -> None:
    try:
        from tunesvc.store import Store

        barrier.wait(timeout=120)
        store = Store(path)  # all at once, on a file that does not exist yet
        results.put((store.revision, []))
        store.close()
    except Exception as exc:
        results.put((None, [f"{type(exc).__name__}: {exc}"]))


def _open_study(url: str, study: str, barrier, results) -> None:
    try:
        import optuna

        from tunesvc.search._optuna import rdb_storage

        barrier.wait(timeout=120)
        storage = rdb_storage(url)  # all at once, on a database with no Optuna tables yet
        optuna.create_study(study_name=study, storage=storage)
        results.put((study, []))
    except Exception as exc:
        results.put((None, [f"{type(exc).__name__}: {exc}"]))


def _run(target, args_of, n: int) -> list:
    context = _context()
    barrier, results = context.Barrier(n), context.Queue()
    processes = [context.Process(target=target, args=(*args_of(i), barrier, results)) for i in range(n)]
    for p in processes:
        p.start()
    try:
        out = [results.get(timeout=180) for _ in processes]
    finally:
        for p in processes:
            p.join(timeout=60)
    assert [p.exitcode for p in processes] == [0] * n
    return out


def _integrity(path: str) -> list:
    con = sqlite3.connect(path)
    try:
        return con.execute("PRAGMA integrity_check").fetchall()
    finally:
        con.close()


def test_eight_processes_write_trials_into_one_database(db_url, template, device):
    from tunesvc.store import Store

    store = Store(db_url)
    kv, dev = store.kernel_version_id(template), store.device_id(device)
    sweep = store.start_sweep(kv, dev, KEY, {"M": 64, "N": 45, "K": 29, "dtype": "float16"}, "grid", None, 0)
    store.close()

    out = _run(_write_trials, lambda i: (db_url, (kv, dev, sweep), i), WRITERS)

    errors = [e for _, _, errs in out for e in errs]
    assert not [e for e in errors if "locked" in e], errors
    assert errors == []
    assert sorted(w for w, _, _ in out) == list(range(WRITERS))
    assert sum(n for _, n, _ in out) == WRITERS * TRIALS
    store = Store(db_url, readonly=True)
    try:
        hashes = [t.config_hash for t in store.trials(kv, dev, KEY)]
    finally:
        store.close()
    assert sorted(hashes) == sorted(f"w{w}-{i}" for w in range(WRITERS) for i in range(TRIALS))
    if "://" not in db_url:
        assert _integrity(db_url) == [("ok",)]


def test_eight_processes_create_one_database_at_once(db_url):
    """The creation at head runs under a lock (SQLite's write lock, a PostgreSQL advisory lock):
    one process creates, the rest find it."""
    from tunesvc.store import resolve_url
    from tunesvc.store._migrate import HEAD

    out = _run(_open_store, lambda i: (db_url,), WRITERS)
    assert [e for _, errs in out for e in errs] == []
    assert [revision for revision, _ in out] == [HEAD] * WRITERS
    engine = create_engine(resolve_url(db_url))
    try:
        with engine.connect() as connection:
            assert connection.execute(text("SELECT version_num FROM tunesvc_alembic_version")).all() == [(HEAD,)]
            assert connection.execute(text("SELECT count(*) FROM tunesvc_meta")).scalar() == 1
    finally:
        engine.dispose()
    if "://" not in db_url:
        assert _integrity(db_url) == [("ok",)]
        # each process made its file apart and linked it in only where none was: one file, in WAL
        # mode from its first byte, and none of the eight processes' own files left beside it
        folder = Path(db_url).parent
        assert sorted(p.name for p in folder.iterdir() if ".new" in p.name) == []
        assert Path(db_url).read_bytes()[18:20] == bytes([2, 2])  # the header's WAL mode


def test_six_sweeps_start_optuna_studies_in_one_new_store_at_once(db_url):
    """Optuna creates its tables by check-then-create, so processes that start at once on a new
    database race (without rdb_storage's retry this test failed 3 runs of 3, on SQLite and on
    PostgreSQL); every one must succeed."""
    import optuna

    from tunesvc.store import Store
    from tunesvc.store import resolve_url

    Store(db_url).close()
    url = resolve_url(db_url)
    out = _run(_open_study, lambda i: (url, f"study-{i}"), 6)
    assert [e for _, errs in out for e in errs] == []
    assert sorted(optuna.get_all_study_names(storage=url)) == [f"study-{i}" for i in range(6)]
    engine = create_engine(url)
    try:
        with engine.connect() as connection:  # Optuna's revision, stamped once
            assert len(connection.execute(text("SELECT version_num FROM alembic_version")).all()) == 1
    finally:
        engine.dispose()
    if "://" not in db_url:
        assert _integrity(db_url) == [("ok",)]


ROUNDS = 12
BUDGET = 10


def _race_winners(path: str, ids: tuple[int, int, int], writer: int, barrier, results) -> None:
    """Each round, a new key: store one trial of it, then make its winner, all writers at once
    (a new key is when two writers can both find no winner and both insert one)."""
    errors: list[str] = []
    try:
        from tunesvc.bench import Measurement
        from tunesvc.bench import Status
        from tunesvc.store import Store

        kv, dev, sweep = ids
        store = Store(path)
        for i in range(ROUNDS):
            barrier.wait(timeout=120)
            key = f"{KEY},round={i}"
            try:
                store.add_trial(
                    sweep, kv, dev, key, {"w": writer}, f"w{writer}", Measurement(Status.OK, time_ms=1.0 + writer)
                )
                store.update_winner(kv, dev, key)
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
        store.close()
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    results.put((writer, errors))


def _fill_budget(path: str, ids: tuple[int, int, int], writer: int, barrier, results) -> None:
    """Store batches of 3 trials of one key under a budget, all writers at once."""
    errors: list[str] = []
    stored = 0
    try:
        from tunesvc.bench import Measurement
        from tunesvc.bench import Status
        from tunesvc.store import Store

        kv, dev, sweep = ids
        store = Store(path)
        barrier.wait(timeout=120)
        for batch in range(3):
            items = [
                ({"w": writer, "b": batch, "i": i}, f"w{writer}-{batch}-{i}", Measurement(Status.OK, time_ms=1.0))
                for i in range(3)
            ]
            try:
                stored += sum(i is not None for i in store.add_trials(sweep, kv, dev, KEY, items, budget=BUDGET))
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
        store.close()
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    results.put((stored, errors))


def _key_ids(db_url, template, device) -> tuple[int, int, int]:
    from tunesvc.store import Store

    store = Store(db_url)
    kv, dev = store.kernel_version_id(template), store.device_id(device)
    sweep = store.start_sweep(kv, dev, KEY, {"M": 64, "N": 45, "K": 29, "dtype": "float16"}, "grid", None, 0)
    store.close()
    return kv, dev, sweep


def test_eight_processes_update_one_winner_at_once(db_url, template, device):
    """Winners are written by one INSERT ... ON CONFLICT DO UPDATE: no writer breaks the unique
    constraint, and the winner left is the fastest trial of all writers."""
    from tunesvc.store import Store

    ids = _key_ids(db_url, template, device)
    out = _run(_race_winners, lambda i: (db_url, ids, i), WRITERS)
    assert [e for _, errs in out for e in errs] == []
    store = Store(db_url, readonly=True)
    try:
        winners = {w.shape_key: w.time_ms for w in store.winners()}
    finally:
        store.close()
    assert winners == {f"{KEY},round={i}": 1.0 for i in range(ROUNDS)}  # writer 0's trial, the fastest
    if "://" not in db_url:
        assert _integrity(db_url) == [("ok",)]


def test_eight_writers_of_one_key_respect_its_budget(db_url, template, device):
    """Eight writers offering 9 trials each under a budget of 10: exactly 10 are stored."""
    from tunesvc.store import Store

    ids = _key_ids(db_url, template, device)
    out = _run(_fill_budget, lambda i: (db_url, ids, i), WRITERS)
    assert [e for _, errs in out for e in errs] == []
    store = Store(db_url, readonly=True)
    try:
        stored = store.trial_count(*ids[:2], KEY)
    finally:
        store.close()
    assert stored == sum(n for n, _ in out) == BUDGET


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])


def test_a_write_that_waits_for_another_processs_lock_says_so_and_for_how_long(tmp_path):
    """SQLite's busy timeout waits silently: a transaction still open after LOCK_NOTICE_S is said,
    then its end with the seconds; the write lands once the other process lets go."""
    import sqlite3
    import subprocess
    import sys
    import warnings

    from tunesvc.store import Store

    db = str(tmp_path / "locked.db")
    Store(db).close()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
            "c.execute('BEGIN IMMEDIATE'); print('held', flush=True); time.sleep(7); c.execute('COMMIT')",
            db,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    store = Store(db)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            store.add_job("b", "k", "M=1", {}, "grid", None, 0)
    finally:
        store.close()
        holder.wait()
    said = [str(w.message) for w in caught if "transaction on" in str(w.message)]
    assert len(said) == 2 and "still open after 5 s" in said[0] and said[1].endswith(" s."), said
    assert float(said[1].split(" took ")[1].split(" s")[0]) >= 5.0
    with sqlite3.connect(db) as connection:
        assert connection.execute("SELECT count(*) FROM tunesvc_jobs").fetchone()[0] == 1
