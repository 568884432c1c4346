"""Schema migrations: revision 0001 is the schema before Alembic; upgrades to head keep every row.

Databases at 0001 are built the way a user's would be: Alembic upgraded to "0001" on a fresh
SQLite file, rows inserted with raw SQL (the ORM models are at head and cannot write them), the
revision recorded in alembic_version as tunesvc before revision 0005 did.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import socket
import sqlite3
from pathlib import Path

import optuna
import pytest
from _backends import db_url  # noqa: F401  (fixture: a SQLite file, a PostgreSQL database)
from _backends import pg_database
from _devices import H100
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine
from sqlalchemy import inspect
from sqlalchemy import text
from typer.testing import CliRunner

import tunesvc
from tunesvc import TunesvcError
from tunesvc import get_template
from tunesvc.cli import app
from tunesvc.report import collect
from tunesvc.store import Store
from tunesvc.store import current_revision
from tunesvc.store import head_revision
from tunesvc.store import resolve_url
from tunesvc.store import upgrade
from tunesvc.store._migrate import HEAD
from tunesvc.store._migrate import KNOWN
from tunesvc.store._migrate import SHARED_VERSION_TABLE
from tunesvc.store._migrate import VERSION_TABLE
from tunesvc.store._migrate import alembic_config
from tunesvc.store.models import SCHEMA_VERSION
from tunesvc.store.models import Base
from tunesvc.tuning.sweep import run_sweep

#: an H100 sweep of 6 GEMM shapes written at schema 1, before Alembic: the
#: database from an older schema revision that the migration tests start from
SCHEMA1 = Path(__file__).parent / "data" / "tune-schema1.db"
EXAMPLE = Path(__file__).parent.parent / "tune.db.example"
KEY = "M=16,N=16,K=16,dtype=float16"
#: revision 0001's tables, by their names before revision 0005 prefixed them with tunesvc_
TABLES = ("devices", "kernel_versions", "sweeps", "trials", "winners")
VERSION_TABLES = (VERSION_TABLE, SHARED_VERSION_TABLE)
#: columns that later revisions add to revision 0001's tables (NULL in upgraded rows)
ADDED = {"host", "peer_ms", "timing"}


def md5(path) -> str:
    return hashlib.md5(Path(path).read_bytes()).hexdigest()


def alembic_to(path, revision: str, step=command.upgrade) -> None:
    """Run Alembic's ``step`` (upgrade or downgrade) on the SQLite file at ``path`` to ``revision``."""
    engine = create_engine(f"sqlite:///{path}")
    try:
        with engine.begin() as connection:
            step(alembic_config(connection), revision)
    finally:
        engine.dispose()


def record_revision_as_before_0005(path) -> None:
    """Move the revision to alembic_version, where tunesvc recorded it before revision 0005."""
    con = sqlite3.connect(path)
    with con:
        con.execute(f"ALTER TABLE {VERSION_TABLE} RENAME TO {SHARED_VERSION_TABLE}")
    con.close()


def database_at_0001(path, recorded_in: str = SHARED_VERSION_TABLE) -> None:
    """A database at revision 0001 holding one device, kernel version, sweep, 3 trials, 1 winner.

    ``recorded_in=VERSION_TABLE`` for a database that the test then migrates with Alembic directly.
    """
    alembic_to(path, "0001")
    if recorded_in == SHARED_VERSION_TABLE:
        record_revision_as_before_0005(path)
    con = sqlite3.connect(path)
    with con:
        con.execute(
            "INSERT INTO devices (id, fingerprint, hardware_id, kind, name, capability, sm_count, memory_bytes,"
            " max_shared_memory, max_num_regs, driver, cuda, torch, triton, first_seen) VALUES"
            " (1, 'fp0001', 'H100|sm_90|132SM', 'cuda', 'NVIDIA H100 80GB HBM3', '9.0', 132, 85899345920,"
            " 232448, 65536, '550', '12.4', '2.4', '3.0', '2026-01-01 00:00:00')"
        )
        con.execute(
            "INSERT INTO kernel_versions (id, kernel, version, first_seen) VALUES (1, 'matmul', 'abc123', '2026-01-01 00:00:00')"
        )
        con.execute(
            "INSERT INTO sweeps (id, kernel_version_id, device_id, shape_key, problem, strategy, budget, seed, status,"
            " started_at, finished_at, wall_seconds) VALUES (1, 1, 1, ?, ?, 'grid', 3, 0, 'done',"
            " '2026-01-01 00:00:00', '2026-01-01 00:01:00', 60.0)",
            (KEY, json.dumps({"M": 16, "N": 16, "K": 16, "dtype": "float16"})),
        )
        for i, (status, ms) in enumerate([("ok", 2.5), ("ok", 1.5), ("wrong_result", None)], start=1):
            con.execute(
                "INSERT INTO trials (id, sweep_id, kernel_version_id, device_id, shape_key, config, config_hash, status,"
                " time_ms, spread, reps, rel_error, message, created_at) VALUES (?, 1, 1, 1, ?, ?, ?, ?, ?, 0.1, 3, NULL,"
                " NULL, '2026-01-01 00:00:00')",
                (i, KEY, json.dumps({"BLOCK_M": 16 * i}), f"hash{i}", status, ms),
            )
        con.execute(
            "INSERT INTO winners (id, kernel_version_id, device_id, shape_key, config, config_hash, time_ms, trial_id,"
            " updated_at) VALUES (1, 1, 1, ?, ?, 'hash2', 1.5, 2, '2026-01-01 00:01:00')",
            (KEY, json.dumps({"BLOCK_M": 32})),
        )
    con.close()


def rows(path) -> dict[str, list[tuple]]:
    """Every row of every table of revision 0001 (under its old or its tunesvc_ name), in its columns."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        out = {}
        for table in TABLES:
            name = f"tunesvc_{table}" if f"tunesvc_{table}" in names else table
            columns = [r[1] for r in con.execute(f"PRAGMA table_info({name})") if r[1] not in ADDED]
            out[table] = con.execute(f"SELECT {', '.join(columns)} FROM {name} ORDER BY id").fetchall()
        return out
    finally:
        con.close()


def schema(path) -> set[tuple]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return set(
            con.execute(f"SELECT type, name, tbl_name, sql FROM sqlite_master WHERE tbl_name NOT IN {VERSION_TABLES}")
        )
    finally:
        con.close()


def structure(path) -> dict[str, tuple]:
    """Columns, indexes and foreign keys of each table, as SQLite reports them (not the DDL text)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [
            r[0]
            for r in con.execute(
                f"SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT IN {VERSION_TABLES}"
            )
        ]
        return {
            t: (
                con.execute(f"PRAGMA table_info({t})").fetchall(),
                sorted(
                    (r[1], r[2], tuple(c[2] for c in con.execute(f"PRAGMA index_info('{r[1]}')")))
                    for r in con.execute(f"PRAGMA index_list({t})")
                    if not r[1].startswith("sqlite_autoindex")
                ),
                sorted(r[2:5] for r in con.execute(f"PRAGMA foreign_key_list({t})")),
                sorted(
                    tuple(c[2] for c in con.execute(f"PRAGMA index_info('{r[1]}')"))
                    for r in con.execute(f"PRAGMA index_list({t})")
                    if r[2]
                ),  # unique constraints
            )
            for t in sorted(tables)
        }
    finally:
        con.close()


def revision_rows(path, table: str = VERSION_TABLE) -> tuple[list, list]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return (
            con.execute(f"SELECT version_num FROM {table}").fetchall(),
            con.execute("SELECT value FROM tunesvc_meta WHERE key = 'schema_version'").fetchall(),
        )
    finally:
        con.close()


def table_names(path) -> set[str]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        con.close()


#: what PostgreSQL's catalogue says of tunesvc's relations, constraints and sequences
PG_CATALOG = {
    "pg relations": "SELECT relname, relkind, COALESCE(pg_get_indexdef(oid), '') FROM pg_class"
    " WHERE relnamespace = 'public'::regnamespace AND relname LIKE 'tunesvc%'",
    "pg constraints": "SELECT conname, contype, conrelid::regclass::text, pg_get_constraintdef(oid) FROM pg_constraint"
    " WHERE connamespace = 'public'::regnamespace AND conrelid::regclass::text LIKE 'tunesvc%'",
    "pg sequences": "SELECT sequencename, data_type::text, start_value, min_value, max_value, increment_by, cycle"
    " FROM pg_sequences WHERE schemaname = 'public' AND sequencename LIKE 'tunesvc%'",
    "pg owned sequences": "SELECT t.relname, pg_get_serial_sequence(quote_ident(t.relname), 'id') FROM pg_class t"
    " WHERE t.relnamespace = 'public'::regnamespace AND t.relkind = 'r' AND t.relname LIKE 'tunesvc%'"
    " AND t.relname <> 'tunesvc_meta' AND t.relname <> 'tunesvc_alembic_version'",
}


def tunesvc_schema(url: str) -> dict:
    """Everything of tunesvc's tables that a schema is: per table its columns (type, nullability,
    default), primary key, indexes, unique constraints and foreign keys with their names, as
    SQLAlchemy's inspector reflects them; on PostgreSQL also every tunesvc_* relation (tables,
    indexes, sequences) and constraint in the catalog with its definition, and the sequences'
    types and ranges; on SQLite what its PRAGMAs report. Other applications' tables are left out.
    """
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            inspector = inspect(connection)
            out: dict = {}
            for table in sorted(t for t in inspector.get_table_names() if t.startswith("tunesvc_")):
                out[table] = {
                    "columns": [
                        (c["name"], str(c["type"]), c["nullable"], c["default"], c.get("autoincrement"))
                        for c in inspector.get_columns(table)
                    ],
                    "primary key": inspector.get_pk_constraint(table),
                    "indexes": sorted(
                        (i["name"], tuple(i["column_names"]), i["unique"]) for i in inspector.get_indexes(table)
                    ),
                    "unique": sorted(
                        (u["name"], tuple(u["column_names"])) for u in inspector.get_unique_constraints(table)
                    ),
                    "foreign keys": sorted(
                        (
                            f["name"],
                            tuple(f["constrained_columns"]),
                            f["referred_table"],
                            tuple(f["referred_columns"]),
                            tuple(sorted(f["options"].items())),
                        )
                        for f in inspector.get_foreign_keys(table)
                    ),
                }
            if connection.dialect.name == "postgresql":
                for name, query in PG_CATALOG.items():
                    out[name] = sorted(connection.execute(text(query)).all())
            else:
                for table in [t for t in out if t.startswith("tunesvc_")]:
                    out[table]["pragmas"] = (
                        connection.exec_driver_sql(f"PRAGMA table_info({table})").all(),
                        sorted(
                            (
                                r[1],
                                r[2],
                                r[3],
                                tuple(c[2] for c in connection.exec_driver_sql(f"PRAGMA index_info('{r[1]}')")),
                            )
                            for r in connection.exec_driver_sql(f"PRAGMA index_list({table})")
                        ),
                        sorted(r[2:] for r in connection.exec_driver_sql(f"PRAGMA foreign_key_list({table})")),
                    )
            out["rows"] = (
                connection.execute(text("SELECT key, value FROM tunesvc_meta ORDER BY key")).all(),
                connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).all(),
            )
            return out
    finally:
        engine.dispose()


def optuna_rows(url: str) -> dict[str, list[tuple]]:
    """Every row of every table of Optuna's (its alembic_version too), to check that none changed."""
    from optuna.storages._rdb.models import BaseModel

    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return {
                t: sorted(map(tuple, connection.execute(text(f"SELECT * FROM {t}")).all()), key=repr)
                for t in [*BaseModel.metadata.tables, SHARED_VERSION_TABLE]
            }
    finally:
        engine.dispose()


def optuna_study_first(url: str) -> list[tuple]:
    """What `optuna create-study` and a few trials leave in a database: its study's trials."""
    study = optuna.create_study(study_name="made-first", storage=url)
    study.optimize(lambda trial: trial.suggest_float("x", 0.0, 1.0), n_trials=3)
    return [(t.number, t.params, t.value) for t in study.trials]


def tune(*args: str):
    return CliRunner().invoke(app, list(args))


# -- the revisions ----------------------------------------------------------------------------------
def test_revisions_are_numbered_and_linear():
    script = ScriptDirectory.from_config(alembic_config())
    assert head_revision() == HEAD == f"{SCHEMA_VERSION:04d}"
    assert script.get_heads() == [HEAD]
    revisions = list(reversed(list(script.walk_revisions())))
    assert [r.revision for r in revisions] == sorted(KNOWN)
    assert [r.down_revision for r in revisions] == [None] + sorted(KNOWN)[:-1]


def test_head_schema_is_the_models(tmp_db):
    Store(tmp_db).close()
    engine = create_engine(f"sqlite:///{tmp_db}")
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection, opts={"compare_type": True, "version_table": VERSION_TABLE}
            )
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()
    assert revision_rows(tmp_db) == ([(HEAD,)], [(str(SCHEMA_VERSION),)])
    assert all(name.startswith("tunesvc_") for name in table_names(tmp_db))


@pytest.mark.parametrize("optuna_first", [False, True], ids=["empty", "optuna-first"])
def test_schema_created_at_head_is_the_schema_migrated_from_0001(db_url, tmp_path, optuna_first):
    """A new database (empty, or holding only Optuna's tables) gets the head schema from the
    models, stamped head; one migrated 0001..head through every revision must be the same schema,
    named alike to the last index, constraint and sequence, or later migrations would meet two."""
    url = resolve_url(db_url)
    if optuna_first:
        optuna_study_first(url)
    store = Store(db_url)
    try:
        assert (store.revision_found, store.revision) == (None, HEAD)
    finally:
        store.close()

    def migrated(other: str) -> dict:
        engine = create_engine(other)
        try:
            with engine.begin() as connection:
                command.upgrade(alembic_config(connection), "head")
        finally:
            engine.dispose()
        return tunesvc_schema(other)

    if "://" in db_url:
        [expected] = [migrated(other) for other in pg_database()]
    else:
        expected = migrated(f"sqlite:///{tmp_path / 'migrated.db'}")
    created = tunesvc_schema(url)
    assert created == expected
    assert "tunesvc_trials" in created and created["rows"] == ([("schema_version", str(SCHEMA_VERSION))], [(HEAD,)])


def test_revision_0001_is_the_schema_from_before_alembic(tmp_db):
    """tests/data/tune-schema1.db was made by create_all at schema 1: 0001 must create exactly that."""
    alembic_to(tmp_db, "0001")
    assert schema(tmp_db) == schema(SCHEMA1)
    assert revision_rows(tmp_db) == ([("0001",)], [("1",)])


def test_downgrade_to_0001_and_back_keeps_rows(tmp_db):
    database_at_0001(tmp_db)
    before = rows(tmp_db)
    assert upgrade(tmp_db) == ("0001", HEAD)
    assert rows(tmp_db) == before
    alembic_to(tmp_db, "0001", command.downgrade)
    assert structure(tmp_db) == structure(SCHEMA1)  # batch mode rebuilt sweeps: same table, other DDL text
    assert rows(tmp_db) == before
    assert revision_rows(tmp_db) == ([("0001",)], [("1",)])


def test_revision_0004_adds_sweeps_peer_ms_keeping_rows(tmp_db):
    """0003 -> 0004 adds a nullable sweeps.peer_ms (NULL in every older sweep); down again drops it."""
    database_at_0001(tmp_db, recorded_in=VERSION_TABLE)
    alembic_to(tmp_db, "0003")
    before, before_structure = rows(tmp_db), structure(tmp_db)
    alembic_to(tmp_db, "0004")
    assert rows(tmp_db) == before
    con = sqlite3.connect(tmp_db)
    try:
        [peer] = [c for c in con.execute("PRAGMA table_info(sweeps)") if c[1] == "peer_ms"]
        assert peer[2] == "DOUBLE" and peer[3] == 0  # nullable
        assert con.execute("SELECT peer_ms FROM sweeps").fetchall() == [(None,)]
    finally:
        con.close()
    assert revision_rows(tmp_db) == ([("0004",)], [("4",)])
    alembic_to(tmp_db, "0003", command.downgrade)
    assert structure(tmp_db) == before_structure and rows(tmp_db) == before
    assert revision_rows(tmp_db) == ([("0003",)], [("3",)])


def test_revision_0007_adds_the_selectors_table_keeping_rows(tmp_db):
    """0006 -> 0007 adds an empty tunesvc_selectors table; down again drops it, rows kept both ways."""
    database_at_0001(tmp_db, recorded_in=VERSION_TABLE)
    alembic_to(tmp_db, "0006")
    before, before_structure = rows(tmp_db), structure(tmp_db)
    alembic_to(tmp_db, "0007")
    assert rows(tmp_db) == before
    con = sqlite3.connect(tmp_db)
    try:
        columns = [c[1] for c in con.execute("PRAGMA table_info(tunesvc_selectors)")]
        assert columns == ["id", "kernel_version_id", "hardware_id", "selector", "keys", "fitted_at"]
        assert con.execute("SELECT COUNT(*) FROM tunesvc_selectors").fetchone() == (0,)
    finally:
        con.close()
    assert revision_rows(tmp_db) == ([("0007",)], [("7",)])
    alembic_to(tmp_db, "0006", command.downgrade)
    assert structure(tmp_db) == before_structure and rows(tmp_db) == before
    assert "tunesvc_selectors" not in table_names(tmp_db)
    assert revision_rows(tmp_db) == ([("0006",)], [("6",)])


def test_revision_0008_adds_timing_reading_graph_and_lets_a_key_hold_an_eager_winner(tmp_db):
    """0007 -> 0008 adds trials.timing and winners.timing, 'graph' in every older row, with the
    timing in both unique constraints; down again drops them (and the eager rows), rows kept."""
    database_at_0001(tmp_db, recorded_in=VERSION_TABLE)
    alembic_to(tmp_db, "0007")
    before, before_structure = rows(tmp_db), structure(tmp_db)
    alembic_to(tmp_db, "0008")
    assert rows(tmp_db) == before
    con = sqlite3.connect(tmp_db)
    try:
        assert con.execute("SELECT DISTINCT timing FROM tunesvc_trials").fetchall() == [("graph",)]
        assert con.execute("SELECT timing FROM tunesvc_winners").fetchall() == [("graph",)]
        with con:  # the same key and config, timed eagerly: a trial and a winner of their own
            con.execute(
                "INSERT INTO tunesvc_trials (id, sweep_id, kernel_version_id, device_id, shape_key, config, config_hash,"
                " status, time_ms, spread, reps, created_at, timing) SELECT 10, sweep_id, kernel_version_id, device_id,"
                " shape_key, config, config_hash, status, 1.2, spread, reps, created_at, 'eager' FROM tunesvc_trials"
                " WHERE id = 2"
            )
            con.execute(
                "INSERT INTO tunesvc_winners (id, kernel_version_id, device_id, shape_key, config, config_hash, time_ms,"
                " trial_id, updated_at, timing) SELECT 2, kernel_version_id, device_id, shape_key, config, config_hash,"
                " 1.2, 10, updated_at, 'eager' FROM tunesvc_winners WHERE id = 1"
            )
        with pytest.raises(sqlite3.IntegrityError), con:  # one eager winner per key
            con.execute(
                "INSERT INTO tunesvc_winners (kernel_version_id, device_id, shape_key, config, config_hash, time_ms,"
                " trial_id, updated_at, timing) SELECT kernel_version_id, device_id, shape_key, config, config_hash,"
                " 1.1, 10, updated_at, 'eager' FROM tunesvc_winners WHERE id = 1"
            )
        assert con.execute("SELECT COUNT(*) FROM tunesvc_winners").fetchone() == (2,)
    finally:
        con.close()
    assert revision_rows(tmp_db) == ([("0008",)], [("8",)])
    alembic_to(tmp_db, "0007", command.downgrade)
    assert structure(tmp_db) == before_structure and rows(tmp_db) == before
    assert revision_rows(tmp_db) == ([("0007",)], [("7",)])


def test_a_database_before_revision_0007_reads_no_selector(tmp_db, template, device):
    """A read-only store of an older revision has no selectors table: the runtime's query is skipped."""
    database_at_0001(tmp_db, recorded_in=VERSION_TABLE)
    alembic_to(tmp_db, "0006")
    store = Store(tmp_db, readonly=True)
    try:
        assert store.revision == "0006"
        assert store.selector("matmul", template.version, device.hardware_id) is None
    finally:
        store.close()


def test_winner_query_reads_the_new_index(tmp_db):
    Store(tmp_db).close()
    con = sqlite3.connect(tmp_db)
    try:
        plan = " ".join(
            r[3]
            for r in con.execute(
                "EXPLAIN QUERY PLAN SELECT * FROM tunesvc_trials WHERE kernel_version_id = 1 AND device_id = 1"
                " AND shape_key = 'k' AND status = 'ok' ORDER BY time_ms, id LIMIT 1"
            )
        )
    finally:
        con.close()
    assert "ix_tunesvc_trials_key_status_time" in plan and "TEMP B-TREE" not in plan, plan


# -- an older database ------------------------------------------------------------------------------
def test_tune_db_upgrade_keeps_every_row_and_the_store_then_sweeps(tmp_db):
    database_at_0001(tmp_db)
    before = rows(tmp_db)
    assert [len(before[t]) for t in TABLES] == [1, 1, 1, 3, 1]
    assert current_revision(tmp_db) == "0001"

    result = tune("db", "upgrade", "--db", tmp_db)
    assert result.exit_code == 0, result.output
    assert f"from schema revision 0001 to {HEAD}" in result.output
    assert rows(tmp_db) == before
    assert revision_rows(tmp_db) == ([(HEAD,)], [(str(SCHEMA_VERSION),)])
    assert SHARED_VERSION_TABLE not in table_names(tmp_db)  # it held only our revision: left to Optuna
    con = sqlite3.connect(tmp_db)
    assert con.execute("SELECT host, peer_ms FROM tunesvc_sweeps").fetchall() == [(None, None)]
    con.close()

    store = Store(tmp_db)
    try:
        [winner] = store.winners()
        assert winner.config == {"BLOCK_M": 32} and winner.time_ms == 1.5
        template = get_template("matmul")
        [result] = run_sweep(template, [template.parse_shape("16x16x16", "float16")], store, strategy="grid", budget=1)
        assert result.trials_new == 1
    finally:
        store.close()
    con = sqlite3.connect(tmp_db)
    try:
        assert con.execute("SELECT count(*) FROM tunesvc_trials").fetchone() == (4,)
        assert con.execute("SELECT host FROM tunesvc_sweeps ORDER BY id").fetchall() == [
            (None,),
            (socket.gethostname(),),
        ]
        # the new sweep timed matmul's torch peer (revision 0004's column); the old one has none
        [(old,), (new,)] = con.execute("SELECT peer_ms FROM tunesvc_sweeps ORDER BY id").fetchall()
        assert old is None and new > 0
    finally:
        con.close()

    again = tune("db", "upgrade", "--db", tmp_db)
    assert again.exit_code == 0 and f"already at schema revision {HEAD}" in again.output


def test_older_database_is_read_but_a_writable_open_refuses_it_unchanged(tmp_db):
    database_at_0001(tmp_db)
    before = md5(tmp_db)
    with pytest.raises(
        TunesvcError, match=r"schema revision 0001, older than .*run `tune db upgrade --db .*` first"
    ) as info:
        Store(tmp_db)
    assert "\n" not in str(info.value)
    ro = Store(tmp_db, readonly=True)
    try:
        assert ro.revision == "0001"
        assert [w.shape_key for w in ro.winners()] == [KEY]
        assert ro.trial_counts() == {"ok": 2, "wrong_result": 1}
    finally:
        ro.close()
    result = tune("sweep", "matmul", "--shape", "16x16x16", "--budget", "1", "--db", tmp_db)
    assert result.exit_code == 1 and "tune db upgrade" in result.output
    assert tune("show", "--db", tmp_db).exit_code == 0
    # the report reads it too, with no sweeps.peer_ms (revision 0004) to read: "-" peers
    # (its matmul is of an older version than the installed one: by default the page says so)
    out = Path(tmp_db).parent / "report"
    report = tune("report", "--db", tmp_db, "--out", str(out))
    assert report.exit_code == 0, report.output
    assert (
        'matmul</td><td class="l" colspan="6">no trials of the version lookups use' in (out / "report.html").read_text()
    )
    report = tune("report", "--db", tmp_db, "--out", str(out), "--all-versions")
    assert report.exit_code == 0, report.output
    assert "peer ms</th>" in (out / "report.html").read_text()
    ro = Store(tmp_db, readonly=True)
    try:
        assert [k.peer_ms for s in collect(ro) for k in s.keys] == [None]
    finally:
        ro.close()
    assert md5(tmp_db) == before


def test_database_from_before_alembic(tmp_path):
    """A copy of the first H100 sweep: schema_version 1 and no alembic_version table."""
    path = tmp_path / "old.db"
    shutil.copyfile(SCHEMA1, path)
    before_md5, before = md5(path), rows(path)

    assert current_revision(path) == "0001"
    current = tune("db", "current", "--db", str(path), "--json")
    assert current.exit_code == 0, current.output
    assert json.loads(current.output) == {"db": str(path), "revision": "0001", "head": HEAD, "up_to_date": False}
    with pytest.raises(TunesvcError, match="run `tune db upgrade"):
        Store(path)
    assert md5(path) == before_md5

    result = tune("db", "upgrade", "--db", str(path))
    assert result.exit_code == 0, result.output
    assert f"from schema revision 0001 to {HEAD}" in result.output
    assert rows(path) == before
    assert len(before["trials"]) == 240 and len(before["winners"]) == 6
    assert revision_rows(path) == ([(HEAD,)], [(str(SCHEMA_VERSION),)])
    con = sqlite3.connect(path)
    try:
        assert con.execute("SELECT count(*), count(peer_ms) FROM tunesvc_sweeps").fetchone() == (
            len(before["sweeps"]),
            0,
        )
    finally:
        con.close()
    Store(path).close()


@pytest.mark.parametrize("path", [EXAMPLE, SCHEMA1], ids=["example", "schema1"])
def test_databases_shipped_open_read_only_and_unchanged(path):
    before = md5(path)
    result = tune("show", "--db", str(path))
    assert result.exit_code == 0, result.output
    assert re.search(r"\d+ winners? (\(\d+ of older kernel versions: --all-versions\))?; \d+ trials", result.output)
    assert tune("db", "current", "--db", str(path)).exit_code == 0
    assert md5(path) == before


def test_tune_db_example_is_current_and_holds_every_shipped_family():
    """The README's tour runs on it: at the current schema, a winner for every shipped kernel at
    its current version, measured on an H100 (matmul's on an H200)."""
    from tunesvc.template import SHIPPED
    from tunesvc.template import get_template

    assert current_revision(EXAMPLE) == HEAD
    con = sqlite3.connect(f"file:{EXAMPLE}?mode=ro", uri=True)
    try:  # a WAL database would leave -wal and -shm files beside a checkout that only reads it
        assert con.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    finally:
        con.close()
    store = Store(EXAMPLE, readonly=True)
    try:
        for name in SHIPPED:
            winners = store.winners(kernel=name, version=get_template(name).version)
            assert winners, f"tune.db.example has no winner of {name} at its current version"
            # measured on an H100; matmul's current version, on an H200
            assert all(("H200" if name == "matmul" else "H100") in w.hardware_id for w in winners), name
    finally:
        store.close()


def test_failed_upgrade_changes_nothing(tmp_db):
    """The upgrade is one transaction: 0002 fails halfway (its index name is taken), 0001 stays."""
    database_at_0001(tmp_db)
    con = sqlite3.connect(tmp_db)
    with con:
        con.execute("CREATE INDEX ix_trials_key_status_time ON winners (shape_key)")
    con.close()
    before_schema, before = schema(tmp_db), rows(tmp_db)
    result = tune("db", "upgrade", "--db", tmp_db)
    assert result.exit_code != 0
    assert schema(tmp_db) == before_schema  # no sweeps.host
    assert rows(tmp_db) == before
    assert revision_rows(tmp_db, SHARED_VERSION_TABLE) == ([("0001",)], [("1",)])  # not moved either
    assert VERSION_TABLE not in table_names(tmp_db)


# -- newer and foreign databases ---------------------------------------------------------------------
@pytest.mark.parametrize("readonly", [True, False])
def test_newer_alembic_revision_is_refused_unchanged(tmp_db, readonly):
    """Like tests/test_store.py's schema_version check, for a revision this tunesvc does not know."""
    Store(tmp_db).close()
    con = sqlite3.connect(tmp_db)
    with con:
        con.execute(f"UPDATE {VERSION_TABLE} SET version_num = '0099'")
    con.close()
    before = md5(tmp_db)
    with pytest.raises(TunesvcError, match="schema revision 0099, newer than this tunesvc") as info:
        Store(tmp_db, readonly=readonly)
    assert "\n" not in str(info.value)
    for args in (["db", "upgrade"], ["db", "init"], ["db", "current"]):
        result = tune(*args, "--db", tmp_db)
        assert result.exit_code == 1 and "newer than this tunesvc" in result.output
    assert md5(tmp_db) == before


def test_a_database_holding_an_optuna_study_and_our_tables(tmp_db, device):
    """Optuna's tables and its revision in alembic_version sit beside ours: tunesvc reads and writes
    its own, refuses a newer revision of its own, and leaves Optuna's untouched."""
    Store(tmp_db).close()
    url = f"sqlite:///{tmp_db}"
    study = optuna.create_study(study_name="beside", storage=url)
    study.optimize(lambda trial: trial.suggest_float("x", 0.0, 1.0), n_trials=3)
    optuna_revision = revision_rows(tmp_db, SHARED_VERSION_TABLE)[0]
    assert len(optuna_revision) == 1 and optuna_revision[0][0] not in KNOWN
    assert {"trials", "studies", "tunesvc_trials"} <= table_names(tmp_db)

    assert current_revision(tmp_db) == HEAD
    for args in (["db", "current"], ["db", "upgrade"], ["db", "init"], ["show"]):
        result = tune(*args, "--db", tmp_db)
        assert result.exit_code == 0, result.output
    template = get_template("matmul")
    store = Store(tmp_db)
    try:
        [result] = run_sweep(
            template, [template.parse_shape("16x16x16", "float16")], store, strategy="optuna", budget=2, device=device
        )
        assert result.trials_new == 2 and len(store.winners()) == 1
    finally:
        store.close()
    assert revision_rows(tmp_db, SHARED_VERSION_TABLE)[0] == optuna_revision
    assert revision_rows(tmp_db) == ([(HEAD,)], [(str(SCHEMA_VERSION),)])
    assert sorted(optuna.get_all_study_names(storage=url))[0] == "beside"
    assert [t.params for t in optuna.load_study(study_name="beside", storage=url).trials] == [
        t.params for t in study.trials
    ]

    con = sqlite3.connect(tmp_db)
    with con:
        con.execute(f"UPDATE {VERSION_TABLE} SET version_num = '0099'")
    con.close()
    before = md5(tmp_db)
    for args in (["db", "upgrade"], ["show"]):
        result = tune(*args, "--db", tmp_db)
        assert result.exit_code == 1 and "schema revision 0099, newer than this tunesvc" in result.output
    assert md5(tmp_db) == before


def test_tune_db_init_on_a_database_where_optuna_made_a_study_first(db_url):
    """`optuna create-study --storage URL` first, then `tune db init --db URL`: tunesvc's tables are
    created at head beside Optuna's (whose `trials` revision 0001 would have collided with), and
    Optuna's rows, revision and study stay as they were."""
    url = resolve_url(db_url)
    trials = optuna_study_first(url)
    optuna_before = optuna_rows(url)
    [(optuna_revision,)] = optuna_before[SHARED_VERSION_TABLE]
    assert optuna_revision not in KNOWN
    with pytest.raises(TunesvcError, match="not a tunesvc database yet"):
        Store(db_url, readonly=True)  # reading creates nothing

    result = tune("db", "init", "--db", db_url)
    assert result.exit_code == 0, result.output
    assert "Created tunesvc's tables in " in result.output and f"at schema revision {HEAD}" in result.output
    again = tune("db", "init", "--db", db_url)
    assert again.exit_code == 0 and f"already at schema revision {HEAD}" in again.output
    current = tune("db", "current", "--db", db_url, "--json")
    assert current.exit_code == 0 and json.loads(current.output)["up_to_date"] is True
    assert tune("show", "--db", db_url).exit_code == 0
    assert optuna_rows(url) == optuna_before
    assert [
        (t.number, t.params, t.value) for t in optuna.load_study(study_name="made-first", storage=url).trials
    ] == trials


def test_optuna_tables_beside_another_applications_are_refused_unchanged(tmp_db):
    """Only Optuna's own tables make a database that tunesvc may add its tables to."""
    url = f"sqlite:///{tmp_db}"
    optuna_study_first(url)
    con = sqlite3.connect(tmp_db)
    with con:
        con.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY)")
    con.close()
    before = md5(tmp_db)
    for args in (["db", "init"], ["db", "upgrade"], ["show"]):
        result = tune(*args, "--db", tmp_db)
        assert result.exit_code == 1 and "holds other tables" in result.output
        assert len(result.output.strip().splitlines()) == 1, result.output
    with pytest.raises(TunesvcError, match="holds other tables"):
        Store(tmp_db)
    assert md5(tmp_db) == before


def test_tune_db_upgrade_does_not_initialise_an_optuna_database(tmp_db):
    """`tune db upgrade` upgrades only a tunesvc database; on Optuna's alone it says so, changing nothing."""
    optuna_study_first(f"sqlite:///{tmp_db}")
    before = md5(tmp_db)
    result = tune("db", "upgrade", "--db", tmp_db)
    assert result.exit_code == 1 and "not a tunesvc database yet" in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert md5(tmp_db) == before


def test_a_failed_creation_beside_optuna_leaves_nothing_behind(tmp_db):
    """Creating the schema at head is one transaction too: it fails halfway (an index of ours
    already taken by a name on Optuna's table), and the database is left as Optuna made it."""
    url = f"sqlite:///{tmp_db}"
    trials = optuna_study_first(url)
    con = sqlite3.connect(tmp_db)
    with con:
        con.execute("CREATE INDEX ix_tunesvc_trials_shape_key ON trials (number)")
    con.close()
    before, names = md5(tmp_db), table_names(tmp_db)
    result = tune("db", "init", "--db", tmp_db)
    assert result.exit_code == 1, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert md5(tmp_db) == before and table_names(tmp_db) == names
    assert [
        (t.number, t.params, t.value) for t in optuna.load_study(study_name="made-first", storage=url).trials
    ] == trials


def test_upgrade_moves_only_our_revision_out_of_alembic_version(tmp_db):
    """A revision in alembic_version that is not in our script directory is someone else's: kept."""
    database_at_0001(tmp_db)
    con = sqlite3.connect(tmp_db)
    with con:
        con.execute(f"INSERT INTO {SHARED_VERSION_TABLE} (version_num) VALUES ('v3.2.0.a')")
    con.close()
    before = rows(tmp_db)
    assert current_revision(tmp_db) == "0001"
    assert upgrade(tmp_db) == ("0001", HEAD)
    assert rows(tmp_db) == before
    assert revision_rows(tmp_db) == ([(HEAD,)], [(str(SCHEMA_VERSION),)])
    assert revision_rows(tmp_db, SHARED_VERSION_TABLE)[0] == [("v3.2.0.a",)]


def test_a_database_that_lost_its_revision_table_is_refused_unchanged(tmp_db):
    Store(tmp_db).close()
    con = sqlite3.connect(tmp_db)
    with con:
        con.execute(f"DROP TABLE {VERSION_TABLE}")
    con.close()
    before = md5(tmp_db)
    for args in (["db", "upgrade"], ["db", "current"], ["show"]):
        result = tune(*args, "--db", tmp_db)
        assert (
            result.exit_code == 1
            and f"has schema version {SCHEMA_VERSION} but records no schema revision" in result.output
        )
    assert md5(tmp_db) == before


def test_db_upgrade_needs_an_existing_database(tmp_path):
    result = tune("db", "upgrade", "--db", "missing.db")
    assert result.exit_code == 1 and "`tune db init` creates one" in result.output
    other = tmp_path / "other.db"
    con = sqlite3.connect(other)
    with con:
        con.execute("create table customers (id integer primary key)")
    con.close()
    before = md5(other)
    for args in (["db", "upgrade"], ["db", "init"]):
        result = tune(*args, "--db", str(other))
        assert result.exit_code == 1 and "holds other tables" in result.output
    assert md5(other) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]


def test_db_init_creates_then_reports_and_current(tmp_db):
    result = tune("db", "init", "--db", tmp_db)
    assert result.exit_code == 0 and f"at schema revision {HEAD}" in result.output
    result = tune("db", "init", "--db", tmp_db)
    assert result.exit_code == 0 and "already at schema revision" in result.output
    result = tune("db", "current", "--db", tmp_db, "--json")
    assert json.loads(result.output) == {"db": tmp_db, "revision": HEAD, "head": HEAD, "up_to_date": True}
    assert upgrade(tmp_db) == (HEAD, HEAD)


def test_db_init_upgrades_an_older_database(tmp_db):
    database_at_0001(tmp_db)
    result = tune("db", "init", "--db", tmp_db)
    assert result.exit_code == 0 and f"from schema revision 0001 to {HEAD}" in result.output


def test_store_cannot_be_readonly_and_upgrade(tmp_db):
    with pytest.raises(ValueError):
        Store(tmp_db, readonly=True, upgrade=True)


# -- PostgreSQL ---------------------------------------------------------------------------------------
def test_postgresql_head_schema_is_the_models_and_an_older_database_upgrades_keeping_rows():
    for url in pg_database():
        engine = create_engine(url)
        try:
            with engine.begin() as connection:
                command.upgrade(alembic_config(connection), "0001")
                # where tunesvc before revision 0005 recorded it
                connection.execute(text(f"ALTER TABLE {VERSION_TABLE} RENAME TO {SHARED_VERSION_TABLE}"))
                connection.execute(
                    text(
                        f"ALTER TABLE {SHARED_VERSION_TABLE} RENAME CONSTRAINT {VERSION_TABLE}_pkc TO {SHARED_VERSION_TABLE}_pkc"
                    )
                )
                connection.execute(
                    text(
                        "INSERT INTO devices (fingerprint, hardware_id, kind, name, capability, sm_count, memory_bytes,"
                        " max_shared_memory, max_num_regs, driver, cuda, torch, triton, first_seen) VALUES ('fp0001',"
                        " 'V100|sm_70|80SM', 'cuda', 'Tesla V100', '7.0', 80, 2147483647, 98304, 65536, '550', '12.4',"
                        " '2.4', '3.0', '2026-01-01 00:00:00')"
                    )
                )
                connection.execute(
                    text(
                        "INSERT INTO kernel_versions (kernel, version, first_seen) VALUES ('matmul', 'abc123', '2026-01-01')"
                    )
                )
                connection.execute(
                    text(
                        "INSERT INTO sweeps (kernel_version_id, device_id, shape_key, problem, strategy, budget, seed,"
                        " status, started_at) VALUES (1, 1, :key, '{}', 'grid', 3, 0, 'done', '2026-01-01 00:00:00')"
                    ),
                    {"key": KEY},
                )
                for i, ms in enumerate([2.5, 1.5], start=1):
                    connection.execute(
                        text(
                            "INSERT INTO trials (sweep_id, kernel_version_id, device_id, shape_key, config, config_hash,"
                            " status, time_ms, reps, created_at) VALUES (1, 1, 1, :key, '{}', :h, 'ok', :ms, 3,"
                            " '2026-01-01 00:00:00')"
                        ),
                        {"key": KEY, "h": f"hash{i}", "ms": ms},
                    )
            before = {t: _pg_rows(engine, t) for t in TABLES}
            assert tune("db", "current", "--db", url).output.count("0001") >= 1
            ro = Store(url, readonly=True)  # reads the old table names through temporary views
            try:
                assert ro.revision == "0001" and ro.trial_counts() == {"ok": 2}
            finally:
                ro.close()
            assert {t: _pg_rows(engine, t) for t in TABLES} == before

            result = tune("db", "upgrade", "--db", url)
            assert result.exit_code == 0, result.output
            assert f"from schema revision 0001 to {HEAD}" in result.output
            assert {t: _pg_rows(engine, f"tunesvc_{t}") for t in TABLES} == before
            with engine.connect() as connection:
                context = MigrationContext.configure(
                    connection, opts={"compare_type": True, "version_table": VERSION_TABLE}
                )
                assert compare_metadata(context, Base.metadata) == []
                assert connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all() == [HEAD]
                # every table, index, constraint and sequence is named tunesvc_*: none can collide with Optuna's
                names = (
                    connection.execute(
                        text(
                            "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace"
                            " UNION SELECT conname FROM pg_constraint WHERE connamespace = 'public'::regnamespace"
                        )
                    )
                    .scalars()
                    .all()
                )
                assert names and sorted(n for n in names if "tunesvc_" not in n) == []
            store = Store(url)  # revision 0003 widened devices.memory_bytes: an 80 GiB GPU now fits
            try:
                assert store.find_device(store.find_device("Tesla V100").name).memory_bytes == 2147483647
                h100 = H100
                # the renamed sequences still hand out ids after the rows that were there
                assert store.device_id(h100) == 2
                assert store.find_device("NVIDIA H100 80GB HBM3").memory_bytes == 80 << 30
                template, here = get_template("matmul"), tunesvc.current_device()
                [swept] = run_sweep(
                    template,
                    [template.parse_shape("16x16x16", "float16")],
                    store,
                    strategy="optuna",
                    budget=1,
                    device=here,
                )
                assert store.device_id(here) == 3
                assert [t.id for t in store.trials(store.kernel_version_id(template), 3, swept.shape_key)] == [3]
            finally:
                store.close()
            # Optuna's tables beside ours: its study is there, and the store still opens at head
            [name] = optuna.get_all_study_names(storage=url)
            assert len(optuna.load_study(study_name=name, storage=url).trials) >= 1
            assert upgrade(url) == (HEAD, HEAD)
        finally:
            engine.dispose()


def test_postgresql_revision_0005_round_trip_restores_every_name():
    """0004 -> 0005 -> 0004 on PostgreSQL: tables, indexes, constraints and sequences named as before."""
    names = (
        "SELECT 'class', relname FROM pg_class WHERE relnamespace = 'public'::regnamespace"
        " UNION SELECT 'constraint', conname FROM pg_constraint WHERE connamespace = 'public'::regnamespace"
    )
    for url in pg_database():
        engine = create_engine(url)
        try:
            with engine.begin() as connection:
                command.upgrade(alembic_config(connection), "0004")
            with engine.connect() as connection:
                before = set(connection.execute(text(names)).all())
            with engine.begin() as connection:
                command.upgrade(alembic_config(connection), "0005")
            with engine.connect() as connection:
                prefixed = set(connection.execute(text(names)).all())
            with engine.begin() as connection:
                command.downgrade(alembic_config(connection), "0004")
            with engine.connect() as connection:
                assert set(connection.execute(text(names)).all()) == before
        finally:
            engine.dispose()
        assert ("class", "trials_pkey") in before and ("class", "tunesvc_trials_pkey") in prefixed
        assert ("class", "tunesvc_trials_id_seq") in prefixed and (
            "constraint",
            "tunesvc_winners_trial_id_fkey",
        ) in prefixed


def _pg_rows(engine, table: str) -> list[tuple]:
    with engine.connect() as connection:
        columns = [c for c in connection.execute(text(f"SELECT * FROM {table} LIMIT 0")) if c not in ADDED]
        return [tuple(r) for r in connection.execute(text(f"SELECT {', '.join(columns)} FROM {table} ORDER BY id"))]
