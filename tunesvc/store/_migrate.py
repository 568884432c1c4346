"""Schema migrations: Alembic revisions in tunesvc/store/alembic/versions, run without alembic.ini.

Revisions are numbered "0001", "0002", ...; ``models.SCHEMA_VERSION`` is the head's number and
every revision writes its number to ``tunesvc_meta.schema_version`` too, so a tunesvc from before
Alembic (which reads only that row) also refuses a database newer than itself. A database made
before Alembic (tunesvc_meta but no revision recorded) is at revision 0001.

Alembic records the revision in ``tunesvc_alembic_version``: ``alembic_version`` belongs to
Optuna, whose studies share the database (revision 0005 renamed our tables to tunesvc_* for
them). Revisions 0001-0004 recorded themselves in ``alembic_version``; a database that holds one
of our revisions there is read as that revision, and its upgrade moves the row to our table
(dropping ``alembic_version`` if nothing else is left in it). A revision there that is not ours
is Optuna's, and left alone.

What :class:`~tunesvc.store.Store` does with each state:

* no tunesvc revision yet (no tables, or only Optuna's: a study made first, by `optuna
  create-study` or optuna-dashboard): a writable open creates tunesvc's tables at head from the
  models and stamps head, as Alembic's cookbook does for a new database. Replaying 0001..head
  would create a table named ``trials`` (prefixed only in 0005), which is also Optuna's. Tests
  check that the two ways give the same schema;
* the head revision: opens;
* an older revision: a read-only open reads it, a writable one refuses it (one line that says
  `tune db upgrade`) and changes nothing, unless opened with ``upgrade=True``;
* a newer revision, or another application's tables: refused, never modified.

Checking a revision reads two small tables with plain SQL and does not import Alembic: opening a
store stays cheap for the runtime. Alembic is imported only to migrate.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from sqlalchemy import Column
from sqlalchemy import MetaData
from sqlalchemy import String
from sqlalchemy import Table
from sqlalchemy import func
from sqlalchemy import inspect as sa_inspect
from sqlalchemy import select
from sqlalchemy import text

from tunesvc.errors import TunesvcError
from tunesvc.store.models import SCHEMA_VERSION
from tunesvc.store.models import Base

if TYPE_CHECKING:
    from alembic.config import Config
    from sqlalchemy.engine import Connection
    from sqlalchemy.engine import Engine

SCRIPT_LOCATION = Path(__file__).parent / "alembic"
#: the revision this tunesvc writes (tests check that Alembic's script directory agrees)
HEAD = f"{SCHEMA_VERSION:04d}"
KNOWN = frozenset(f"{n:04d}" for n in range(1, SCHEMA_VERSION + 1))
#: what a database made by Base.metadata.create_all, before Alembic, is
PRE_ALEMBIC = "0001"
#: where Alembic records our revision
VERSION_TABLE = "tunesvc_alembic_version"
#: where revisions 0001-0004 recorded it, and Optuna records its own
SHARED_VERSION_TABLE = "alembic_version"
#: revisions whose tables have the names they had before revision 0005 prefixed them with tunesvc_
UNPREFIXED = frozenset({"0001", "0002", "0003", "0004"})


def alembic_config(connection: Connection | None = None) -> Config:
    """Alembic's configuration for the store, with no alembic.ini (as Optuna does it)."""
    from alembic.config import Config  # Alembic is imported only to migrate: opening a store stays cheap

    config = Config()
    config.set_main_option("script_location", str(SCRIPT_LOCATION).replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The newest revision of the migration scripts: the schema this tunesvc reads and writes."""
    from alembic.script import ScriptDirectory  # Alembic is imported only to migrate

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise TunesvcError("tunesvc's migration scripts are missing; reinstall tunesvc.")
    return head


# -- used by Store ----------------------------------------------------------------------------------
def revision_of(connection: Connection, where: str) -> tuple[str | None, str | None]:
    """(revision, the table that records it) of the database behind ``connection``, read with plain SQL.

    None: no tunesvc revision yet (no tables at all, or only an Optuna storage's). The table is
    VERSION_TABLE, SHARED_VERSION_TABLE (revisions 0001-0004, not yet moved) or None (a database
    from before Alembic). Another application's database, or one newer than this tunesvc, raises
    one line that says so.
    """
    tables = set(sa_inspect(connection).get_table_names())
    # tunesvc_meta first: a tunesvc database that shares its file with Optuna's study tables is
    # read without importing Optuna (a runtime that only serves winners never needs it)
    if not tables or ("tunesvc_meta" not in tables and _only_optuna(tables)):
        return None, None
    if "tunesvc_meta" not in tables:
        raise TunesvcError(f"{where} holds other tables, not a tunesvc database; pass another --db.")
    row = connection.execute(text("SELECT value FROM tunesvc_meta WHERE key = 'schema_version'")).first()
    found = int(row[0]) if row and str(row[0]).isdigit() else 0
    if found > SCHEMA_VERSION:
        raise TunesvcError(
            f"{where} has schema version {found}, newer than this tunesvc ({SCHEMA_VERSION}); upgrade tunesvc."
        )
    table = VERSION_TABLE if VERSION_TABLE in tables else SHARED_VERSION_TABLE
    revisions = list(connection.execute(text(f"SELECT version_num FROM {table}")).scalars()) if table in tables else []
    if table == SHARED_VERSION_TABLE:
        revisions = [r for r in revisions if r in KNOWN]  # any other is Optuna's
        if not revisions:
            if found != 1:
                raise TunesvcError(
                    f"{where} has schema version {found} but records no schema revision; it is damaged, "
                    "or its revision table was dropped."
                )
            return PRE_ALEMBIC, None
    if len(revisions) != 1:
        raise TunesvcError(
            f"{where} records {len(revisions)} schema revisions in {table} instead of one; "
            "it is damaged, or was migrated by something else."
        )
    [revision] = revisions
    if revision not in KNOWN:
        raise TunesvcError(
            f"{where} has schema revision {revision}, newer than this tunesvc ({HEAD}); upgrade tunesvc."
        )
    return revision, table


def _only_optuna(tables: set[str]) -> bool:
    """Whether ``tables`` are an Optuna RDB storage's and nothing else (a study made before tunesvc).

    Optuna's own models name its tables (importing Optuna only here, for a database that has no
    tunesvc_meta): a table that is not among them, ours included, means another application's.
    """
    if not {"studies", "version_info"} <= tables:
        return False
    from optuna.storages._rdb.models import BaseModel  # optuna is heavy: imported only for such a database

    return tables <= set(BaseModel.metadata.tables) | {SHARED_VERSION_TABLE}


def migrate(engine: Engine, where: str) -> tuple[str | None, str]:
    """Bring the database behind ``engine`` to head in one transaction; (before, head).

    A database with no tunesvc revision gets the head schema from the models, stamped head;
    one with a revision is upgraded through the migrations from there.
    """
    from alembic import command  # Alembic is imported only to migrate

    with engine.connect() as connection, _write_lock(connection):
        before, table = revision_of(connection, where)  # again, now that no one else migrates
        if before is None:
            _create_at_head(connection)
            command.stamp(alembic_config(connection), "head")
        elif before != HEAD:
            config = alembic_config(connection)
            if table != VERSION_TABLE:
                command.stamp(config, before)  # into VERSION_TABLE
                if table == SHARED_VERSION_TABLE:
                    _leave_shared_version_table(connection, before)
            command.upgrade(config, "head")
    return before, HEAD


def _create_at_head(connection: Connection) -> None:
    """tunesvc's tables (and no one else's) as the models define them, schema_version at head."""
    Base.metadata.create_all(connection)
    meta = Base.metadata.tables["tunesvc_meta"]
    connection.execute(meta.insert().values(key="schema_version", value=str(SCHEMA_VERSION)))


def _leave_shared_version_table(connection: Connection, revision: str) -> None:
    """Take our revision out of alembic_version, and the table too if that leaves it empty."""
    shared = Table(SHARED_VERSION_TABLE, MetaData(), Column("version_num", String(32)))
    connection.execute(shared.delete().where(shared.c.version_num == revision))
    if connection.execute(select(func.count()).select_from(shared)).scalar() == 0:
        shared.drop(connection)


def prefixed_views(connection: Connection) -> Callable[[Any, Any], None]:
    """A connect hook that lets a read-only store read a database from before revision 0005.

    Each new connection gets temporary views, under the tunesvc_* names the models use, of the
    database's tables: reading needs no other code, and nothing is written to the database.
    """
    tables = sorted(
        set(sa_inspect(connection).get_table_names()) & {t.removeprefix("tunesvc_") for t in Base.metadata.tables}
    )

    def create_views(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        for table in tables:
            cursor.execute(f"CREATE TEMPORARY VIEW tunesvc_{table} AS SELECT * FROM {table}")
        cursor.close()
        dbapi_connection.commit()  # PostgreSQL's driver began a transaction; the pool would roll it back

    return create_views


#: PostgreSQL advisory lock of tunesvc's schema changes (a fixed number: "tunesvc" in ASCII)
MIGRATION_LOCK_KEY = 0x74756E657376


@contextmanager
def _write_lock(connection: Connection) -> Iterator[None]:
    """Begin the connection's transaction; on SQLite with BEGIN IMMEDIATE and foreign keys off,
    on PostgreSQL holding an advisory lock (DDL there takes no lock that would serialise two
    processes creating the same tables).

    pysqlite by default begins transactions lazily and not before DDL, so a migration would run
    statement by statement in autocommit; here the driver leaves transactions to us, and the
    write lock is taken before the revision is read. Foreign keys are off while a migration runs,
    as Alembic's batch mode needs to copy tables that others reference.
    """
    if connection.dialect.name != "sqlite" or connection.dialect.driver != "pysqlite":
        with connection.begin():
            if (
                connection.dialect.name == "postgresql"
            ):  # held to the commit: hosts creating one database at once wait their turn
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            yield
        return
    dbapi_connection = connection.connection.driver_connection
    assert dbapi_connection is not None  # pysqlite's, checked out by this connection
    saved = dbapi_connection.isolation_level
    dbapi_connection.isolation_level = None
    dbapi_connection.execute("PRAGMA foreign_keys = OFF")
    try:
        connection.exec_driver_sql("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            connection.rollback()
            raise
        connection.commit()
    finally:
        dbapi_connection.execute("PRAGMA foreign_keys = ON")
        dbapi_connection.isolation_level = saved
