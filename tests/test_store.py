"""Store: a real SQLite file through SQLAlchemy; read-only opens never touch a file."""

from __future__ import annotations

import os
import socket
import sqlite3
import threading
import time
import warnings
from pathlib import Path

import pytest
from _backends import db_url  # noqa: F401  (fixture: a SQLite file, a PostgreSQL database)
from _backends import pg_admin_url
from _backends import pg_database
from _devices import H100
from _forks import exit_status_within
from sqlalchemy import create_engine
from sqlalchemy import text
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

import tunesvc
from tunesvc import Status
from tunesvc import TunesvcError
from tunesvc import config_hash
from tunesvc.bench import Measurement
from tunesvc.cli import app
from tunesvc.store import DatabaseUnavailable
from tunesvc.store import Store
from tunesvc.store import resolve_url
from tunesvc.store.models import SCHEMA_VERSION

KEY = "M=64,N=45,K=29,dtype=float16"


def cfg(bm: int, stages: int = 2) -> dict:
    return {"BLOCK_M": bm, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 1, "num_warps": 4, "num_stages": stages}


def ok(ms: float) -> Measurement:
    return Measurement(Status.OK, time_ms=ms, spread=0.1, reps=3, rel_error=1e-4)


@pytest.fixture
def store(db_url):
    """A new store on each backend: a SQLite file, a PostgreSQL database."""
    s = Store(db_url)
    yield s
    s.close()


@pytest.fixture
def file_store(tmp_db):
    """A new store in a SQLite file, for what is about the file itself."""
    s = Store(tmp_db)
    yield s
    s.close()


def _ids(store, template, device) -> tuple[int, int, int]:
    kv = store.kernel_version_id(template)
    dev = store.device_id(device)
    sweep = store.start_sweep(kv, dev, KEY, {"M": 37, "N": 45, "K": 29, "dtype": "float16"}, "grid", 3, 0)
    return kv, dev, sweep


@pytest.fixture
def ids(store, template, device):
    return _ids(store, template, device)


@pytest.fixture
def file_ids(file_store, template, device):
    return _ids(file_store, template, device)


def add(store, ids, config, m, key=KEY):
    kv, dev, sweep = ids
    return store.add_trial(sweep, kv, dev, key, config, config_hash(config), m)


def test_resolve_url(monkeypatch):
    assert resolve_url("x.db") == "sqlite:///x.db"
    assert resolve_url("/abs/x.db") == "sqlite:////abs/x.db"
    assert resolve_url("postgresql://u@h/db") == "postgresql://u@h/db"
    assert resolve_url() == "sqlite:///tune.db"
    monkeypatch.setenv("TUNESVC_DB", "env.db")
    assert resolve_url() == "sqlite:///env.db"


def test_new_store_creates_the_schema(tmp_db):
    Store(tmp_db).close()
    assert Path(tmp_db).is_file()
    con = sqlite3.connect(tmp_db)
    try:
        tables = {r[0] for r in con.execute("select name from sqlite_master where type='table'")}
        version = con.execute("select value from tunesvc_meta where key='schema_version'").fetchone()
    finally:
        con.close()
    # every table is tunesvc's own (revision 0005): Optuna's tables can sit beside them
    assert tables == {
        "tunesvc_meta",
        "tunesvc_alembic_version",
        "tunesvc_devices",
        "tunesvc_kernel_versions",
        "tunesvc_sweeps",
        "tunesvc_trials",
        "tunesvc_winners",
        "tunesvc_jobs",
        "tunesvc_misses",
        "tunesvc_selectors",
    }
    assert version == (str(SCHEMA_VERSION),)


def test_identities_are_idempotent(store, template, device):
    kv = store.kernel_version_id(template)
    dev = store.device_id(device)
    assert store.kernel_version_id(template) == kv
    assert store.device_id(device) == dev
    # a reopened store finds the same rows
    again = Store(store.path)
    try:
        assert again.kernel_version_id(template) == kv
        assert again.device_id(device) == dev
        [row] = again.devices()
        assert row.fingerprint == device.fingerprint
        assert row.hardware_id == device.hardware_id
    finally:
        again.close()


def test_add_trial_round_trip(store, ids):
    kv, dev, _ = ids
    row = add(store, ids, cfg(16), ok(2.5))
    assert row is not None and row.id is not None
    add(store, ids, cfg(32), Measurement(Status.WRONG_RESULT, rel_error=float("inf"), message="relative error inf"))
    add(store, ids, cfg(16), ok(9.0), key="M=64,N=45,K=30,dtype=float16")  # another key
    trials = store.trials(kv, dev, KEY)
    assert [t.config for t in trials] == [cfg(16), cfg(32)]
    assert trials[0].status == "ok" and trials[0].time_ms == 2.5 and trials[0].reps == 3
    assert trials[0].config_hash == config_hash(cfg(16))
    assert trials[1].status == "wrong_result"
    assert trials[1].rel_error is None  # inf is not stored as a number
    assert trials[1].time_ms is None
    assert store.trial_counts() == {"ok": 2, "wrong_result": 1}
    assert store.trial_counts(kernel="nope") == {}


def test_duplicate_trial_returns_none(store, ids):
    kv, dev, _ = ids
    assert add(store, ids, cfg(16), ok(2.5)) is not None
    assert add(store, ids, dict(reversed(list(cfg(16).items()))), ok(1.0)) is None
    trials = store.trials(kv, dev, KEY)
    assert len(trials) == 1 and trials[0].time_ms == 2.5


@pytest.mark.parametrize("on_conflict", [True, False], ids=["on-conflict", "savepoints"])
def test_add_trials_stores_a_batch_in_order_and_skips_stored_configs(store, ids, on_conflict):
    """Both ways in: INSERT ... ON CONFLICT DO NOTHING, and a savepoint per row (other dialects)."""
    kv, dev, sweep = ids
    if not on_conflict:
        store._insert_new_trials = None
    first = add(store, ids, cfg(16), ok(2.5))
    batch = [cfg(32), dict(reversed(list(cfg(16).items()))), cfg(64), cfg(32, stages=3), cfg(32)]
    times = [3.0, 1.0, 4.0, 5.0, 0.5]
    ids = store.add_trials(sweep, kv, dev, KEY, [(c, config_hash(c), ok(ms)) for c, ms in zip(batch, times)])
    # cfg(16) was stored before, cfg(32) comes twice: skipped, the others still go in
    assert [i is not None for i in ids] == [True, False, True, True, False]
    trials = store.trials(kv, dev, KEY)
    assert [(t.id, t.config, t.config_hash, t.time_ms) for t in trials] == [
        (first.id, cfg(16), config_hash(cfg(16)), 2.5),
        (ids[0], cfg(32), config_hash(cfg(32)), 3.0),
        (ids[2], cfg(64), config_hash(cfg(64)), 4.0),
        (ids[3], cfg(32, 3), config_hash(cfg(32, 3)), 5.0),
    ]
    assert store.add_trials(sweep, kv, dev, KEY, []) == []


def test_a_batch_that_does_not_fit_stores_none_of_its_trials(tmp_db, file_ids, file_store, monkeypatch):
    kv, dev, sweep = file_ids
    add(file_store, file_ids, cfg(16), ok(2.5))
    file_store.close()
    pages = sqlite3.connect(tmp_db).execute("PRAGMA page_count").fetchone()[0]
    original = Store._sqlite_pragmas

    def pragmas(self, dbapi_connection, record):  # SQLite's own limit stands in for a full disk
        original(self, dbapi_connection, record)
        dbapi_connection.execute(f"PRAGMA max_page_count = {pages + 2}")

    monkeypatch.setattr(Store, "_sqlite_pragmas", pragmas)
    full = Store(tmp_db)
    try:
        # 40 rows of 1 KB messages need about 10 more 4 KB pages: the batch fails part-way
        batch = [
            (cfg(b, s), config_hash(cfg(b, s)), Measurement(Status.OK, time_ms=1.0, reps=1, message="x" * 1000))
            for b in (32, 64, 128, 256)
            for s in range(10)
        ]
        with pytest.raises(TunesvcError, match="is full"):
            full.add_trials(sweep, kv, dev, KEY, batch)
        assert [t.config for t in full.trials(kv, dev, KEY)] == [cfg(16)]
        assert full.add_trials(sweep, kv, dev, KEY, batch[:1])[0] is not None  # a small batch still fits
    finally:
        full.close()


def test_update_winner_picks_fastest_ok(store, ids):
    kv, dev, _ = ids
    assert store.update_winner(kv, dev, KEY) is None  # nothing measured
    add(store, ids, cfg(16, 2), ok(3.0))
    add(store, ids, cfg(16, 3), Measurement(Status.WRONG_RESULT, time_ms=0.01, rel_error=0.9))  # faster, but wrong
    add(store, ids, cfg(16, 4), Measurement(Status.ERROR, message="boom"))
    add(store, ids, cfg(32, 2), ok(2.0))
    add(store, ids, cfg(32, 3), ok(2.7))
    winner = store.update_winner(kv, dev, KEY)
    assert winner.config == cfg(32, 2) and winner.time_ms == 2.0
    add(store, ids, cfg(32, 4), ok(1.5))
    winner = store.update_winner(kv, dev, KEY)
    assert winner.config == cfg(32, 4) and winner.time_ms == 1.5
    [entry] = store.winners()
    assert entry.config == cfg(32, 4)
    assert entry.shape_key == KEY
    assert entry.kernel == "matmul"


def test_update_winner_follows_its_own_re_measured_trial_with_other_keys_stored(store, ids):
    """The stored winner's own trial is looked up for this key's row only, not any key's."""
    kv, dev, _ = ids
    other_key = "M=128,N=45,K=29,dtype=float16"
    add(store, ids, cfg(64), ok(1.0), key=other_key)  # another key's winner, stored first, same time
    store.update_winner(kv, dev, other_key)
    first = add(store, ids, cfg(16), ok(1.0))
    add(store, ids, cfg(32), ok(1.5))
    assert store.update_winner(kv, dev, KEY).config == cfg(16)
    store.replace_measurements([(first.id, ok(2.0))])  # the winner re-measured slower
    winner = store.update_winner(kv, dev, KEY)
    assert winner.config == cfg(32) and winner.time_ms == 1.5
    assert {w.shape_key: w.config for w in store.winners()} == {KEY: cfg(32), other_key: cfg(64)}


def test_a_chosen_trial_replaces_a_winner_re_timed_slower_than_it(store, ids):
    """A re-tune's choice (``trial_id``) is compared with the stored winner as just re-timed
    beside it, not with the time the winner was first stored at."""
    kv, dev, _ = ids
    first = add(store, ids, cfg(16), ok(1.0))
    second = add(store, ids, cfg(32), ok(1.5))
    assert store.update_winner(kv, dev, KEY, trial_id=first.id).config == cfg(16)
    store.replace_measurements([(first.id, ok(2.0))])  # re-timed slower beside the other
    [entry] = store.winners()
    assert entry.time_ms == 2.0
    winner = store.update_winner(kv, dev, KEY, trial_id=second.id, tolerance=0.01)
    assert winner.config == cfg(32) and winner.time_ms == 1.5


def test_update_winner_none_when_nothing_is_correct(store, ids):
    kv, dev, _ = ids
    add(store, ids, cfg(16), Measurement(Status.WRONG_RESULT, time_ms=0.01, rel_error=0.9))
    add(store, ids, cfg(32), Measurement(Status.INVALID, message="breaks constraint group"))
    assert store.update_winner(kv, dev, KEY) is None
    assert store.winners() == []


def test_winners_filters(store, ids, template, device):
    kv, dev, _ = ids
    other_key = "M=128,N=45,K=29,dtype=float16"
    add(store, ids, cfg(16), ok(3.0))
    add(store, ids, cfg(32), ok(1.0), key=other_key)
    store.update_winner(kv, dev, KEY)
    store.update_winner(kv, dev, other_key)
    assert {w.shape_key for w in store.winners()} == {KEY, other_key}
    assert len(store.winners(kernel="matmul")) == 2
    assert store.winners(kernel="conv") == []
    assert len(store.winners(hardware_id=device.hardware_id)) == 2
    assert store.winners(hardware_id="H100|sm_90|132SM") == []
    assert len(store.winners(version=template.version)) == 2
    assert store.winners(version="000000000000") == []
    entry = store.winners()[0].to_dict()
    assert isinstance(entry["updated_at"], str) and entry["hardware_id"] == device.hardware_id


# -- read-only and bad paths ------------------------------------------------------------------------
def test_readonly_on_missing_path_creates_nothing(tmp_path, tmp_db):
    with pytest.raises(TunesvcError, match="No database at"):
        Store(tmp_db, readonly=True)
    assert list(tmp_path.iterdir()) == []


def test_default_readonly_store_needs_tune_db(tmp_path):
    with pytest.raises(TunesvcError, match="No database at tune.db"):
        Store(readonly=True)
    assert not (tmp_path / "tune.db").exists()


TEXT = b"this is a text file, not a database; " * 40


@pytest.mark.parametrize("readonly", [True, False])
def test_text_file_is_not_a_sqlite_database(tmp_path, readonly):
    path = tmp_path / "notes.txt"
    path.write_bytes(TEXT)
    with pytest.raises(TunesvcError, match="is not a SQLite database") as info:
        Store(path, readonly=readonly)
    assert "\n" not in str(info.value)
    assert path.read_bytes() == TEXT
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("readonly", [True, False])
def test_directory_is_refused(tmp_path, readonly):
    folder = tmp_path / "folder.db"
    folder.mkdir()
    with pytest.raises(TunesvcError, match="is a directory"):
        Store(folder, readonly=readonly)
    assert list(folder.iterdir()) == []


def test_missing_folder_is_refused(tmp_path):
    with pytest.raises(TunesvcError, match="does not exist"):
        Store(tmp_path / "no" / "such" / "x.db")
    assert not (tmp_path / "no").exists()


def test_readonly_store_refuses_an_empty_sqlite_file(tmp_path):
    path = tmp_path / "empty.db"
    sqlite3.connect(path).close()
    before = path.read_bytes()
    with pytest.raises(TunesvcError, match="not a tunesvc database yet; create its tables with `tune db init`"):
        Store(path, readonly=True)
    assert path.read_bytes() == before


@pytest.mark.parametrize("readonly", [True, False])
def test_foreign_database_is_refused_and_left_unchanged(tmp_path, readonly):
    """Another application's database is refused and left byte for byte as it was: it is not
    switched to WAL (header bytes 18/19) by a command that then says it is not a tunesvc
    database, read-only or not."""
    path = tmp_path / "other.db"
    con = sqlite3.connect(path)
    con.execute("create table customers (id integer primary key, name text)")
    con.commit()
    con.close()
    before = path.read_bytes()
    with pytest.raises(TunesvcError, match="holds other tables"):
        Store(path, readonly=readonly)
    assert path.read_bytes() == before


def test_readonly_open_leaves_the_file_bytes_unchanged(tmp_db, file_ids, file_store):
    ids, store = file_ids, file_store
    kv, dev, _ = ids
    add(store, ids, cfg(16), ok(3.0))
    store.update_winner(kv, dev, KEY)
    store.close()  # checkpoint the WAL into the file
    before = Path(tmp_db).read_bytes()
    ro = Store(tmp_db, readonly=True)
    assert len(ro.winners()) == 1
    assert ro.trial_counts() == {"ok": 1}
    ro.close()
    result = CliRunner().invoke(app, ["show", "--db", tmp_db, "--json"])
    assert result.exit_code == 0, result.output
    assert Path(tmp_db).read_bytes() == before


def test_readonly_store_cannot_write(tmp_db, file_ids, file_store):
    file_store.close()
    before = Path(tmp_db).read_bytes()
    ro = Store(tmp_db, readonly=True)
    try:
        with pytest.raises(TunesvcError, match="read-only"):
            ro.device_id(_other_device())  # a device not stored yet: needs an insert
        assert len(ro.devices()) == 1
    finally:
        ro.close()
    assert Path(tmp_db).read_bytes() == before


def _other_device() -> tunesvc.Device:
    return H100


@pytest.mark.parametrize("readonly", [True, False])
def test_newer_schema_is_refused(tmp_db, readonly):
    Store(tmp_db).close()
    con = sqlite3.connect(tmp_db)
    con.execute("update tunesvc_meta set value = ? where key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    con.commit()
    con.close()
    before = Path(tmp_db).read_bytes()
    with pytest.raises(TunesvcError, match=f"schema version {SCHEMA_VERSION + 1}, newer than"):
        Store(tmp_db, readonly=readonly)
    assert Path(tmp_db).read_bytes() == before


def test_store_survives_reopen_with_data(db_url, ids, store):
    kv, dev, _ = ids
    add(store, ids, cfg(16), ok(3.0))
    store.close()
    again = Store(db_url)
    try:
        assert [t.config for t in again.trials(kv, dev, KEY)] == [cfg(16)]
    finally:
        again.close()


# -- PostgreSQL ---------------------------------------------------------------------------------------
def test_postgresql_newer_schema_is_refused_unchanged():
    for url in pg_database():
        Store(url).close()
        engine = create_engine(url)
        with engine.begin() as connection:
            connection.execute(
                text("UPDATE tunesvc_meta SET value = :v WHERE key = 'schema_version'"), {"v": str(SCHEMA_VERSION + 1)}
            )
        with pytest.raises(TunesvcError, match=f"schema version {SCHEMA_VERSION + 1}, newer than"):
            Store(url)
        with engine.connect() as connection:
            assert connection.execute(text("SELECT value FROM tunesvc_meta")).scalar() == str(SCHEMA_VERSION + 1)
        engine.dispose()


def test_unreachable_postgresql_server_is_one_line():
    url = make_url(pg_admin_url()).set(port=1).render_as_string(hide_password=False)  # nothing listens on port 1
    with pytest.raises(DatabaseUnavailable, match="Lost the connection to postgresql") as info:
        Store(url)
    assert "\n" not in str(info.value) and "tunesvc:***@" in str(info.value)


def test_racing_stores_add_one_device_and_kernel_version(db_url, template, device):
    """Workers of one sweep start together: each must get the one row, none may fail on the unique key."""
    import threading

    Store(db_url).close()
    out, errors = [], []
    start = threading.Barrier(6)

    def open_and_identify() -> None:
        store = Store(db_url)
        try:
            start.wait()
            out.append((store.kernel_version_id(template), store.device_id(device)))
        except Exception as exc:
            errors.append(exc)
        finally:
            store.close()

    threads = [threading.Thread(target=open_and_identify) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert len(out) == 6 and len(set(out)) == 1
    store = Store(db_url, readonly=True)
    try:
        assert len(store.devices()) == 1
    finally:
        store.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_fork_while_another_thread_holds_the_file_lock_leaves_the_child_writing(tmp_db, file_store, template):
    """A thread following a replaced file holds the store's file lock at a fork: the child's
    first write after the file at the path changed takes the same lock, and must not wait for
    ever on a thread the child does not have."""
    held, forked = threading.Event(), threading.Event()

    def hold() -> None:
        with file_store._file_lock:
            held.set()
            forked.wait(60)

    holder = threading.Thread(target=hold, name="following")
    holder.start()
    assert held.wait(60)
    Path(tmp_db).unlink()  # the next write follows the path to a new file
    pid = os.fork()
    if pid == 0:  # the child: a write, into the new file at the path
        code = 3
        try:
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                file_store.kernel_version_id(template)
            code = 0 if Path(tmp_db).exists() and any("was deleted" in str(w.message) for w in said) else 1
        finally:
            os._exit(code)
    forked.set()
    holder.join(60)
    assert exit_status_within(pid, 60) == 0, "the child hung at its first write, or wrote elsewhere"


def test_merge_selector_adds_where_none_is_stored_and_keeps_a_stored_one(store, template):
    hardware_id = "NVIDIA H100 80GB HBM3|sm_90|132SM"
    first, second = {"format": "first"}, {"format": "second"}
    assert store.merge_selector(template.name, template.version, hardware_id, first, 4) == "added"
    assert store.merge_selector(template.name, template.version, hardware_id, second, 9) == "kept"
    assert store.selector(template.name, template.version, hardware_id) == first
    # another device model, another kernel version: their own rows
    assert store.merge_selector(template.name, template.version, "other|sm_80|108SM", second, 9) == "added"
    assert store.merge_selector(template.name, "0123456789ab", hardware_id, second, 9) == "added"
    assert store.selector(template.name, template.version, hardware_id) == first
    # a sweep's refit replaces it
    store.save_selector(template, hardware_id, second, 9)
    assert store.selector(template.name, template.version, hardware_id) == second


@pytest.mark.parametrize("query", ["", "?connect_timeout=1"], ids=["default", "the-urls-own"])
def test_a_postgresql_server_that_never_answers_is_given_up_on(query):
    """A server (or a proxy) that accepts the connection and never answers: libpq alone waits for
    ever, which hung every command and a captured program; the store gives up after
    CONNECT_TIMEOUT_S, or the URL's own connect_timeout, in one sentence."""
    from tunesvc.store._store import CONNECT_TIMEOUT_S

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        start = time.monotonic()
        with pytest.raises(TunesvcError, match="timeout"):
            Store(f"postgresql+psycopg://tunesvc@127.0.0.1:{silent.getsockname()[1]}/x{query}")
        waited = time.monotonic() - start
    finally:
        silent.close()
    assert waited < (3 if query else CONNECT_TIMEOUT_S + 5), waited
