"""The store's logic: one :class:`Store` over any SQLAlchemy URL (SQLite file by default).

Every write is its own transaction, committed before the sweep moves on: a sweep killed
midway loses at most the batch of trials in flight (``Store.add_trials``), and the next run
finds the rest, each committed trial once.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import socket
import stat
import threading
import time
import weakref
import zlib
from collections.abc import Collection
from collections.abc import Iterator
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from urllib.parse import quote

from sqlalchemy import create_engine
from sqlalchemy import delete
from sqlalchemy import event
from sqlalchemy import false
from sqlalchemy import func
from sqlalchemy import insert
from sqlalchemy import inspect
from sqlalchemy import literal
from sqlalchemy import literal_column
from sqlalchemy import null
from sqlalchemy import select
from sqlalchemy import text
from sqlalchemy import update
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import IntegrityError
from sqlalchemy.exc import InterfaceError
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.orm import Session
from sqlalchemy.orm import aliased
from sqlalchemy.orm import sessionmaker
from sqlalchemy.orm import undefer

from tunesvc import settings
from tunesvc._processes import remake_unheld
from tunesvc.checks import json_problem
from tunesvc.checks import key_problem
from tunesvc.checks import load_json
from tunesvc.device import Device
from tunesvc.errors import TunesvcError
from tunesvc.files import open_regular
from tunesvc.records import DeviceRecord
from tunesvc.records import JobRecord
from tunesvc.records import JobSpec
from tunesvc.records import MissRecord
from tunesvc.records import RejectedTrials
from tunesvc.records import TrialRecord
from tunesvc.records import WinnerEntry
from tunesvc.records import WinnerRecord
from tunesvc.settings import GRAPH
from tunesvc.space import config_hash
from tunesvc.store import _migrate
from tunesvc.store._base import BaseStore
from tunesvc.store.models import Job
from tunesvc.store.models import KernelVersion
from tunesvc.store.models import Miss
from tunesvc.store.models import StoredDevice
from tunesvc.store.models import StoredSelector
from tunesvc.store.models import Sweep
from tunesvc.store.models import Trial
from tunesvc.store.models import Winner
from tunesvc.store.models import utcnow
from tunesvc.text import visible
from tunesvc.text import warn

if TYPE_CHECKING:
    from tunesvc.records import Measurement
    from tunesvc.space import Config
    from tunesvc.template import Template

DEFAULT_DB = settings.DEFAULT_DB
#: how long a SQLite writer waits for another one's lock before it fails
BUSY_TIMEOUT_S = 30
#: how long the damage check reads again while another process writes the file (seconds)
WRITER_WAIT_S = 5.0
#: seconds to wait for a PostgreSQL server to answer a new connection (libpq waits for ever by
#: default: a server or proxy that accepts and never answers would hang every command and a
#: captured program); a URL's own ?connect_timeout= wins
CONNECT_TIMEOUT_S = 10
#: a transaction open this long is said to be waiting (see Store._said_if_waiting)
LOCK_NOTICE_S = 5.0


def resolve_url(db: str | os.PathLike | None = None) -> str:
    """--db value, else $TUNESVC_DB, else ./tune.db; a plain path means a SQLite file."""
    return settings.db_url(db)


def database_name(db: str | os.PathLike | None = None) -> str:
    """The database as messages name it: a SQLite file's path, else its URL without the password."""
    url = resolve_url(db)
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # not a URL: named as given
        return url
    if parsed.get_backend_name() == "sqlite" and parsed.database:
        return parsed.database
    return parsed.render_as_string(hide_password=True)


def _device_matches(text: str) -> Any:
    """The stored devices whose name or hardware id holds ``text``, in any case (a filter's --device)."""
    text = text.lower()
    return func.lower(StoredDevice.name).contains(text, autoescape=True) | func.lower(
        StoredDevice.hardware_id
    ).contains(text, autoescape=True)


@dataclass(frozen=True)
class History:
    """What a database recorded, as named columns (not ORM rows), for reading in bulk (`tune report`).

    Columns, not whole rows: a database of an older schema, which a read-only store cannot
    upgrade, still has every column read here; ``sweeps``' ``peer_ms`` (revision 0004) reads None
    where it is missing.
    """

    #: id -> (id, kernel, version)
    kernel_versions: dict[int, Any]
    #: id -> (id, hardware_id and every field of :class:`~tunesvc.device.Device`)
    devices: dict[int, Any]
    #: (id, sweep_id, kernel_version_id, device_id, shape_key, config_hash, status, time_ms, created_at,
    #: message), by id
    trials: list[Any]
    #: (kernel_version_id, device_id, shape_key) -> (..., config, time_ms, trial_id)
    winners: dict[tuple[int, int, str], Any]
    #: (id, kernel_version_id, device_id, shape_key, problem, wall_seconds, strategy, started_at, peer_ms), by id
    sweeps: list[Any]


class DatabaseUnavailable(TunesvcError):
    """The database server cannot be reached (restarting, network): worth retrying, unlike other errors."""


class DatabaseLocked(TunesvcError):
    """Another process held the SQLite file's write lock for longer than this store waits for it."""


class DatabaseNotCreated(TunesvcError):
    """A file with no tables yet, opened read-only: empty, or another process is creating them."""


class Store(BaseStore):
    """The store over SQLAlchemy (the rules: :class:`BaseStore`), for sweeps, the CLI and the runtime loader.

    ``readonly=True`` opens a SQLite file without changing it in any way (not even its journal
    mode) and refuses a path with no database: inspection must never create or alter files.
    ``busy_timeout_s`` is how long a write waits for another process's write lock on a SQLite
    file before it fails with :class:`DatabaseLocked` (a captured program waits briefly: it has a
    launch to run).

    The schema is versioned by Alembic migrations (see :mod:`tunesvc.store._migrate`): a new
    database is created at the head revision; one at an older revision is read, but a writable
    open refuses it (`tune db upgrade` migrates it) unless ``upgrade=True``. ``revision`` is the
    database's revision once open, ``revision_found`` the one it had (None: it was created).
    """

    def __init__(
        self,
        db: str | os.PathLike | None = None,
        *,
        readonly: bool = False,
        upgrade: bool = False,
        busy_timeout_s: float = BUSY_TIMEOUT_S,
    ) -> None:
        self.busy_timeout_s = busy_timeout_s
        if readonly and upgrade:
            raise ValueError("a read-only store cannot upgrade its database")
        if db is not None and not str(db).strip():
            raise TunesvcError("The database name is empty; pass a file path or a SQLAlchemy URL to --db.")
        self.url = resolve_url(db)
        try:
            url = make_url(self.url)
        except ArgumentError:
            raise TunesvcError(
                f"'{_hide_password(self.url)}' is not a database URL; pass a file path or a SQLAlchemy URL to --db."
            ) from None
        except ValueError:  # a port that is not a number
            raise TunesvcError(
                f"'{_hide_password(self.url)}' is not a database URL (its port is not a number); check the --db URL."
            ) from None
        self.is_sqlite = url.get_backend_name() == "sqlite"
        self.path = url.database if self.is_sqlite else None
        self.readonly = readonly
        #: the SQLite file's absolute path: a process that changes its working folder keeps its file
        self._file_path: str | None = None
        if self.is_sqlite and self.path not in (None, "", ":memory:"):
            path = Path(self.path)
            self._file_path = os.path.abspath(path)
            _check_regular_file(path)  # before anything opens it: opening a FIFO waits for a writer
            if readonly and not path.exists():
                raise TunesvcError(f"No database at {path}; run `tune sweep` first or pass --db.")
            if not readonly and not path.parent.exists():
                raise TunesvcError(f"Cannot create {path}: folder {path.parent} does not exist.")
            if path.exists():
                _check_sqlite_file(path)
            if readonly:
                url = url.set(database=_readonly_uri(path), query={"uri": "true"})
            else:
                url = url.set(database=self._file_path)
        try:
            # no pool_pre_ping (a round trip per transaction): a connection that died with its server
            # fails once, SQLAlchemy then drops the whole pool, and callers retry (tunesvc.fleet.jobs)
            # every JSON column decoded by load_json: a value nested too deep or too long reads as
            # Unreadable (the row's check skips it) instead of raising while the query fetches
            waits = url.get_driver_name() in ("psycopg", "psycopg2") and "connect_timeout" not in url.query
            connect_args = {"connect_timeout": CONNECT_TIMEOUT_S} if waits else {}
            self.engine = create_engine(url, json_deserializer=load_json, connect_args=connect_args)
        except Exception as exc:  # a missing DBAPI driver, a malformed URL
            raise TunesvcError(f"Cannot use database '{_hide_password(self.url)}': {exc}.") from None
        if self.is_sqlite:
            event.listen(self.engine, "connect", self._sqlite_pragmas)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._skipped: set[tuple[str, str, str]] = set()  # rows already warned about
        with self._errors():
            created = self._create_whole() if self.is_sqlite and not readonly and self.path else False
            self._prepare_schema(upgrade, created)
        #: the SQLite file this store writes, as (device, inode): see _follow_the_path
        self._file = _file_identity(self._file_path) if self._file_path and not readonly else None
        self._file_lock = threading.Lock()
        _STORES.add(self)
        self._insert_new_trials = _insert_new_trials(
            self.engine.dialect
        )  # once connected: the dialect knows its server

    def _sqlite_pragmas(self, dbapi_connection, _record) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
        # in WAL mode NORMAL syncs at checkpoints, not at every commit: a killed process still loses
        # no committed trial and the file never corrupts; only a power cut may undo the last few
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()
        # text that is not UTF-8 (written by another program) is read with U+FFFD in place of its
        # bad bytes, so the row fails its own checks and is skipped, not the whole command stopped
        dbapi_connection.text_factory = _utf8_or_replaced

    def _create_whole(self) -> bool:
        """Create a new SQLite file whole: its tables and WAL mode are made in a file of its own in
        the same folder, which is then linked to the path only if nothing is there yet. Processes
        that create one database at once (the runtime's first misses, a fleet's workers) thus
        never read a file another is still creating, nor open it while it changes journal mode.
        True when this process's file is the one at the path."""
        if self._file_path is None:
            return False
        path = Path(self._file_path)
        if path.exists():
            return False
        new = path.with_name(_creation_name(path.name))
        engine = create_engine(f"sqlite:///{new}")
        event.listen(engine, "connect", self._sqlite_pragmas)
        try:
            _migrate.migrate(engine, self._where())
            with engine.connect() as connection:
                connection.exec_driver_sql("PRAGMA journal_mode = WAL")
            engine.dispose()  # the last connection closes: its -wal is checkpointed and removed
            os.link(new, path)
            return True
        except FileExistsError:  # another process linked its file first: that one is used
            return False
        except OSError:  # a file system without hard links: the file is created in place, as before
            return False
        finally:
            engine.dispose()
            for side in ("", *SIDE_FILES):
                Path(f"{new}{side}").unlink(missing_ok=True)

    def _prepare_schema(self, upgrade: bool = False, created: bool = False) -> None:
        if self._file_path is not None and Path(self._file_path).exists():
            self._quick_check()
        with self.engine.connect() as connection:
            found, _ = _migrate.revision_of(connection, self._where())  # refuses foreign and newer ones
            views = _migrate.prefixed_views(connection) if self.readonly and found in _migrate.UNPREFIXED else None
        if views is not None:
            event.listen(self.engine, "connect", views)
            self.engine.dispose()  # the connection pooled above has no views
        self.revision_found, self.revision = (None if created else found), found
        if found is None and self.readonly:
            raise DatabaseNotCreated(
                f"{self._where()} is not a tunesvc database yet; create its tables with `tune db init` (or `tune sweep`) first."
            )
        if found != _migrate.HEAD and not self.readonly:
            if found is not None and not upgrade:
                raise TunesvcError(
                    f"{self._where()} has schema revision {found}, older than this tunesvc ({_migrate.HEAD}); "
                    f"run `tune db upgrade{self._db_flag()}` first (it keeps every row)."
                )
            self.revision_found, self.revision = _migrate.migrate(self.engine, self._where())
        if self.is_sqlite and not self.readonly:
            # WAL lets readers (the runtime, `tune show`) run beside a sweep that writes; set only
            # once the file is known to be ours, since it rewrites the file's header
            self._use_wal()

    def _quick_check(self) -> None:
        """Refuse a damaged file before reading or writing it: SQLite's quick_check (the
        integrity check without its index cross-checks, linear in the file's size; about 10 ms
        for 6 MB), through a read-only connection that creates no side file (see _readonly_uri),
        so a damaged file is left exactly as it was."""
        import sqlite3

        path = Path(str(self._file_path))
        deadline = time.monotonic() + WRITER_WAIT_S
        while True:
            before = _file_state(path)
            try:
                connection = sqlite3.connect(_readonly_uri(path), uri=True, timeout=self.busy_timeout_s)
                try:
                    problems = [row[0] for row in connection.execute("PRAGMA quick_check(1)")]
                finally:
                    connection.close()
            except sqlite3.DatabaseError as exc:
                problems = [str(exc)]
            # an immutable read races a writer (another process creating the file, in rollback
            # journal mode until it switches to WAL, or one that opened it meanwhile): while the
            # file changes under the read, or a rollback journal says a write is under way, read
            # again; a file at rest that fails is damaged
            after = _file_state(path)
            at_rest = before == after and not after[3]
            if problems == ["ok"] or at_rest or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if problems != ["ok"]:
            if "file is not a database" in str(problems[0]):
                raise TunesvcError(f"{self._where()} is not a SQLite database; pass another --db path.")
            raise TunesvcError(
                f"{self._where()} is damaged ({' '.join(str(problems[0]).split())[:160]}); "
                "restore it from a copy or pass another --db."
            )

    def _use_wal(self) -> None:
        """Switch the file to WAL once (the mode persists in the file).

        The switch needs the file to itself, and SQLite answers "database is locked" at once,
        without its busy timeout, while another process holds it (several processes creating the
        same new database): retry for as long as the busy timeout would have waited.
        """
        deadline = time.monotonic() + self.busy_timeout_s
        with self.engine.connect() as connection:
            while connection.exec_driver_sql("PRAGMA journal_mode").scalar() != "wal":
                try:
                    connection.exec_driver_sql("PRAGMA journal_mode = WAL")
                    return  # WAL, or a mode that cannot change (an in-memory database)
                except OperationalError as exc:
                    connection.rollback()
                    if "locked" not in str(exc.orig) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)

    def _db_flag(self) -> str:
        """` --db ...` for a command line that names this database, if it is not the default."""
        if self.url == resolve_url(None):
            return ""
        return f" --db {shlex.quote(self._where())}"

    def _where(self) -> str:
        return self.path if self.is_sqlite and self.path else self.engine.url.render_as_string(hide_password=True)

    @property
    def shown_url(self) -> str:
        """The URL as output shows it: a password in it written as ***."""
        return _hide_password(self.url)

    @property
    def where(self) -> str:
        """The database as messages name it: a SQLite file's path, else its URL without the password."""
        return self._where()

    @property
    def timed(self) -> bool:
        """Whether the database has revision 0008's timing columns (a read-only open of an older
        one has not: every row of it is graph's)."""
        return self.revision is None or self.revision >= "0008"

    def _timing_is(self, column: Any, timing: str | None) -> tuple[Any, ...]:
        """WHERE clauses keeping the rows of ``timing`` (None: every row)."""
        if timing is None:
            return ()
        if self.timed:
            return (column == timing,)
        return () if timing == GRAPH else (false(),)

    def _with_timing(self, query: Any, *entities: Any) -> Any:
        """``query`` loading the (deferred) timing column of ``entities`` where the database has it."""
        return query.options(*(undefer(e.timing) for e in entities)) if self.timed else query

    def _checked_records(self, rows: list[Any], record: type, what: str, field: str, label: str) -> list[Any]:
        """The records of the rows whose shape key and JSON ``field`` pass their checks; the
        others left out, each with one warning (see :meth:`_skip`)."""
        out = []
        for row in rows:
            why = key_problem(row.shape_key) or json_problem(getattr(row, field), label)
            if why is not None:
                self._skip(what, row.kernel, row.shape_key, why)
                continue
            out.append(_record(record, row))
        return out

    def _skip(self, what: str, kernel: str, key: str, why: str) -> None:
        """One warning for a row that fails its check (:mod:`tunesvc.checks`), which is then left
        out of what a reader returns: a damaged row never breaks a query, nor a user's program."""
        if (what, kernel, key) in self._skipped:
            return
        self._skipped.add((what, kernel, key))
        shown = visible(key if len(key) <= 120 else key[:120] + "...")
        warn(
            f"tunesvc: skipped {what} of {visible(kernel)[:200]} for key '{shown}' in {self._where()}: "
            f"{why}; re-tune the key or restore the database from a copy.",
            RuntimeWarning,
        )

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """Turn the database's own failures into one line that says what to do."""
        try:
            yield
        except TunesvcError:
            raise
        except (ValueError, TypeError) as exc:
            # a stored value its column type cannot read back (a JSON config that is not JSON, a
            # date that is not a date): a file damaged inside a record, which quick_check cannot see
            raise TunesvcError(
                f"{self._where()} holds a row that cannot be read ({type(exc).__name__}: "
                f"{' '.join(str(exc).split())[:160]}); it may be damaged: restore it from a copy or pass another --db."
            ) from exc
        except DBAPIError as exc:  # DatabaseError, and InterfaceError of a closed connection
            text = str(exc.orig) if getattr(exc, "orig", None) else str(exc)
            where = self._where()
            if "file is not a database" in text or "file is encrypted" in text:
                raise TunesvcError(f"{where} is not a SQLite database; pass another --db path.") from None
            if "malformed" in text or "corrupt" in text:
                raise TunesvcError(
                    f"{where} is damaged ({' '.join(text.split())[:160]}); restore it from a copy or pass another --db."
                ) from None
            if self.is_sqlite and "database is locked" in text:
                raise DatabaseLocked(
                    f"{where} is locked by another process's write for over {self.busy_timeout_s:g} s; run again once it is done"
                ) from None
            if "readonly" in text or "read-only" in text:
                raise TunesvcError(f"{where} is read-only; make it writable or pass another --db.") from None
            if "unable to open" in text:
                raise TunesvcError(f"Cannot open {where}; check that the folder exists and is writable.") from None
            if (
                "disk is full" in text
                or "No space left" in text
                or "could not extend file" in text
                or (self.is_sqlite and "disk I/O error" in text and _nearly_full(self.path))
            ):
                raise TunesvcError(
                    f"{where} is full (no space left); free space and run again: the sweep resumes."
                ) from None
            if "disk I/O error" in text:
                raise TunesvcError(
                    f"Reading or writing {where} failed (disk I/O error); check the disk and its free space."
                ) from None
            missing = _missing_schema(exc, text)
            if missing is not None:
                raise TunesvcError(
                    f"{where} lacks {missing} that tunesvc needs (tables renamed or dropped by hand?); "
                    "restore it from a copy, or pass another --db."
                ) from None
            if self.is_sqlite and not isinstance(exc, IntegrityError):
                raise TunesvcError(
                    f"Database {where} failed: {text.splitlines()[0] if text else type(exc).__name__}; "
                    "check the file, or pass another --db."
                ) from None
            lost = exc.connection_invalidated or "connection" in text.lower()
            if not self.is_sqlite and isinstance(exc, (OperationalError, InterfaceError)) and lost:
                raise DatabaseUnavailable(f"Lost the connection to {where}: {text.splitlines()[0]}") from None
            if isinstance(exc, OperationalError):
                raise TunesvcError(
                    f"Database {where} failed: {text.splitlines()[0]}; check the --db URL and server."
                ) from None
            raise

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One transaction: committed on success, rolled back on any error."""
        with self._errors():
            if self._file is not None and _file_identity(self._file_path) != self._file:
                self._follow_the_path()
        with self._errors(), self._said_if_waiting(), self._sessions() as session, session.begin():
            yield session

    def _follow_the_path(self) -> None:
        """The SQLite file at the path is not the one this store opened (deleted, or replaced by
        another file: a restored copy, a `mv`): what is written from now on goes to the file at the
        path, created where none is, said in one warning. Without it every later write would go
        to a file no other process can open, silently, and be lost when this one exits. The
        identity is one stat before each transaction (about a microsecond)."""
        with self._file_lock:
            now = _file_identity(self._file_path)
            if now == self._file:  # another thread followed it first
                return
            path = Path(str(self._file_path))
            self._empty_the_old_wal()
            self.engine.dispose()  # the old file's connections: none is used again
            if now is None and not path.parent.is_dir():
                self._file = None  # said once: the writes that follow fail as on any missing folder
                raise TunesvcError(
                    f"{self._where()} was deleted with its folder while this process ran; recreate the folder "
                    "(a later run tunes what this one could not store)"
                )
            created = False
            if now is None:
                created = self._create_whole()
            else:
                _check_regular_file(path)
                _check_sqlite_file(path)
            self._prepare_schema(created=created)
            self._file = _file_identity(self._file_path)
            what = "deleted" if now is None else "replaced by another file"
            warn(
                f"tunesvc: {self._where()} was {what} while this process ran; what it stores from now on goes to "
                f"the {'new ' if now is None else ''}file at that path.",
                RuntimeWarning,
            )

    def _empty_the_old_wal(self) -> None:
        """Before the connections to a moved file close: move its write-ahead log into it and
        truncate the log (``wal_checkpoint(TRUNCATE)``), through a connection opened before the
        move (a new one would open the file now at the path). SQLite closes a moved file without
        its checkpoint and leaves its ``-wal`` at the path, where the next file there would read
        the old file's pages as its own."""
        pool = self.engine.pool
        if not getattr(pool, "checkedin", lambda: 0)():  # no connection of the old file is open
            return
        try:
            with self.engine.connect() as connection:  # a pooled one: the queue's first
                connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        except Exception:  # the old file's log is the old file's loss, never this store's failure
            pass

    @contextmanager
    def _said_if_waiting(self) -> Iterator[None]:
        """A SQLite transaction still open after LOCK_NOTICE_S is said in one warning, and its end
        with the seconds: SQLite's busy timeout waits for another process's write lock silently,
        for up to BUSY_TIMEOUT_S. A timer thread, as sqlite3 offers no busy callback; it cannot
        tell such a wait from a transaction that works on much data, so the warning names both."""
        if not self.is_sqlite or self.busy_timeout_s < LOCK_NOTICE_S:  # fails before it would be said
            yield
            return
        started = time.monotonic()
        where = self._where()
        said = threading.Event()

        def notice() -> None:
            said.set()
            warn(
                f"tunesvc: a transaction on {where} is still open after {LOCK_NOTICE_S:g} s: it waits for "
                f"another process's write lock (up to {self.busy_timeout_s:g} s), or works on much data.",
                RuntimeWarning,
            )

        timer = threading.Timer(LOCK_NOTICE_S, notice)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            if said.is_set():
                warn(
                    f"tunesvc: the transaction on {where} took {time.monotonic() - started:.1f} s.",
                    RuntimeWarning,
                )

    # -- identities ---------------------------------------------------------------------
    def device_id(self, device: Device) -> int:
        fields = {k: v for k, v in device.to_dict().items() if k != "fingerprint"}
        return self._get_or_add(
            select(StoredDevice.id).where(StoredDevice.fingerprint == device.fingerprint),
            lambda: StoredDevice(fingerprint=device.fingerprint, **fields),
        )

    def kernel_version_id(self, template: Template) -> int:
        return self._kernel_version_id(template.name, template.version)

    def _kernel_version_id(self, kernel: str, version: str) -> int:
        return self._get_or_add(
            select(KernelVersion.id).where(KernelVersion.kernel == kernel, KernelVersion.version == version),
            lambda: KernelVersion(kernel=kernel, version=version),
        )

    def _get_or_add(self, query, make) -> int:
        """The id the query finds, else of a new row; two workers adding the same row at once
        both get the one that won (the loser's insert breaks the unique constraint)."""
        for _ in range(2):
            with self.session() as session:
                found = session.scalar(query)
                if found is not None:
                    return found
            try:
                with self.session() as session:
                    row = make()
                    session.add(row)
                    session.flush()
                    return row.id
            except IntegrityError:
                continue
        raise TunesvcError(
            f"{self._where()} keeps refusing a new row of {query.get_final_froms()[0].name}; is it damaged?"
        )

    # -- sweeps and trials --------------------------------------------------------------
    def start_sweep(
        self, kv_id: int, device_id: int, shape_key: str, problem: dict, strategy: str, budget: int | None, seed: int
    ) -> int:
        with self.session() as session:
            row = Sweep(
                kernel_version_id=kv_id,
                device_id=device_id,
                shape_key=shape_key,
                problem=problem,
                strategy=strategy,
                budget=budget,
                seed=seed,
                host=socket.gethostname(),
            )
            session.add(row)
            session.flush()
            return row.id

    def finish_sweep(self, sweep_id: int, wall_seconds: float, peer_ms: float | None = None) -> None:
        with self.session() as session:
            session.execute(
                update(Sweep)
                .where(Sweep.id == sweep_id)
                .values(status="done", finished_at=utcnow(), wall_seconds=wall_seconds, peer_ms=peer_ms)
            )

    def swept_keys(self, kv_id: int, device_id: int, strategy: str) -> set[str]:
        """The shape keys with a finished sweep of ``strategy`` (e.g. cross-measure's re-timing)."""
        with self.session() as session:
            query = select(Sweep.shape_key).where(
                Sweep.kernel_version_id == kv_id,
                Sweep.device_id == device_id,
                Sweep.strategy == strategy,
                Sweep.status == "done",
            )
            return set(session.scalars(query))

    def trials(self, kv_id: int, device_id: int, shape_key: str, timing: str | None = GRAPH) -> list[TrialRecord]:
        with self.session() as session:
            query = (
                select(Trial)
                .where(
                    Trial.kernel_version_id == kv_id,
                    Trial.device_id == device_id,
                    Trial.shape_key == shape_key,
                    *self._timing_is(Trial.timing, timing),
                )
                .order_by(Trial.id)
            )
            rows = list(session.scalars(self._with_timing(query, Trial)))
        out = []
        for row in rows:
            why = key_problem(row.shape_key) or _config_problem(row.config)
            if why is not None:
                self._skip(f"trial {row.id}", f"kernel version {kv_id}", row.shape_key, why)
                continue
            out.append(_record(TrialRecord, row))
        return out

    def add_trial(
        self,
        sweep_id: int,
        kv_id: int,
        device_id: int,
        shape_key: str,
        config: Config,
        config_hash: str,
        m: Measurement,
        timing: str = GRAPH,
    ) -> TrialRecord | None:
        """Store one measurement; None if another writer stored the same config first."""
        [new] = self.add_trials(sweep_id, kv_id, device_id, shape_key, [(config, config_hash, m)], timing=timing)
        if new is None:
            return None
        return TrialRecord(
            id=new,
            sweep_id=sweep_id,
            kernel_version_id=kv_id,
            device_id=device_id,
            shape_key=shape_key,
            config=dict(config),
            config_hash=config_hash,
            status=m.status.value,
            time_ms=m.time_ms,
            spread=m.spread,
            reps=m.reps,
            rel_error=_finite(m.rel_error),
            message=m.message,
            timing=timing,
        )

    def add_trials(
        self,
        sweep_id: int,
        kv_id: int,
        device_id: int,
        shape_key: str,
        measured: Sequence[tuple[Config, str, Measurement]],
        budget: int | None = None,
        timing: str = GRAPH,
    ) -> list[int | None]:
        """Store (config, config hash, measurement)s in one transaction: all of them or, if it fails, none.
        ``timing``: how they were timed (graph | eager); a key's trials and budget are counted per timing.

        The new trial's id per item, in order; None for a config already stored (by another
        writer, or earlier in ``measured``): it is skipped and the others still go in. Ids, not
        ORM rows: building a Trial object cost a fifth of the CPU per stored row.

        With ``budget``, the key never holds more than ``budget`` trials, whatever other writers
        store at once: the items past it are not stored (None). The count is taken after this
        transaction's insert, under the write lock that the insert holds (SQLite) or under a
        transaction-scoped advisory lock of the key (PostgreSQL), so concurrent sweeps of one key
        count each other's trials.
        """
        now = utcnow()
        values = [
            {
                "sweep_id": sweep_id,
                "kernel_version_id": kv_id,
                "device_id": device_id,
                "shape_key": shape_key,
                "config": config,
                "config_hash": digest,
                "status": m.status.value,
                "time_ms": m.time_ms,
                "spread": m.spread,
                "reps": m.reps,
                "rel_error": _finite(m.rel_error),
                "message": m.message,
                "created_at": now,
                "timing": timing,
            }
            for config, digest, m in measured
        ]
        with self._errors(), self.engine.begin() as connection:
            if budget is not None and values and connection.dialect.name == "postgresql":
                lock = zlib.crc32(f"{kv_id}:{device_id}:{shape_key}:{timing}".encode())
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": lock})
            if self._insert_new_trials is not None:
                ids = dict(connection.execute(self._insert_new_trials, values).all()) if values else {}
            else:
                ids = {v["config_hash"]: new for v in values if (new := _insert_one(connection, v)) is not None}
            if budget is not None and ids:
                over = self._count_trials(connection, kv_id, device_id, shape_key, timing) - budget
                if over > 0:  # other writers filled the budget meanwhile: drop this batch's last ones
                    dropped = sorted(ids.values())[-over:]
                    connection.execute(delete(Trial).where(Trial.id.in_(dropped)))
                    ids = {h: i for h, i in ids.items() if i not in dropped}
        return [
            ids.pop(v["config_hash"], None) for v in values
        ]  # popped: a config twice in ``measured`` is stored once

    def _count_trials(self, connection, kv_id: int, device_id: int, shape_key: str, timing: str = GRAPH) -> int:
        return connection.scalar(
            select(func.count())
            .select_from(Trial)
            .where(
                Trial.kernel_version_id == kv_id,
                Trial.device_id == device_id,
                Trial.shape_key == shape_key,
                *self._timing_is(Trial.timing, timing),
            )
        )

    def trials_per_key(self, kernel: str, version: str, hardware_id: str, keys: Sequence[str]) -> dict[str, int]:
        """Trials stored per shape key of ``keys`` (0 for none) of one kernel version on every
        software stack of one device model: what a shared sweep's progress counts."""
        query = self._trials_of(kernel, version, hardware_id, Trial.shape_key, func.count())
        query = query.where(Trial.shape_key.in_(list(keys))).group_by(Trial.shape_key)
        with self.session() as session:
            counts = {key: n for key, n in session.execute(query).all()}
        return {key: counts.get(key, 0) for key in keys}

    def trial_count(self, kv_id: int, device_id: int, shape_key: str, timing: str = GRAPH) -> int:
        """Trials stored for one key and timing, by every writer (what a sweep's budget counts)."""
        with self._errors(), self.engine.connect() as connection:
            return self._count_trials(connection, kv_id, device_id, shape_key, timing)

    def replace_measurements(self, measured: Sequence[tuple[int, Measurement]]) -> None:
        """Re-measurements of stored trials (finalists), in one transaction.

        An OK measurement replaces the trial's time, spread, repetitions and how it was timed
        (its message; and makes a trial that had failed an OK one: a re-measured key, `tune
        verify --retune`), and the time of the winner made from that trial; a failed one its
        status and message, and drops its time, so that it can no longer win.
        """
        with self.session() as session:
            for trial_id, m in measured:
                trial = session.get(Trial, trial_id)
                if trial is None:  # trials are never deleted; a wrong id changes nothing
                    continue
                if m.ok:
                    trial.time_ms, trial.spread, trial.reps = m.time_ms, m.spread, m.reps
                    if m.message is not None or trial.status != m.status.value:  # a failure's line goes
                        trial.message = m.message
                    trial.status = m.status.value
                    # a winner's copy of this trial's time follows it: a re-tune then compares its
                    # choice with the winner as just re-timed beside it, not as first stored
                    session.execute(update(Winner).where(Winner.trial_id == trial_id).values(time_ms=m.time_ms))
                else:
                    trial.status, trial.time_ms, trial.message = m.status.value, None, m.message

    def update_winner(
        self,
        kv_id: int,
        device_id: int,
        shape_key: str,
        trial_id: int | None = None,
        tolerance: float = 0.0,
        timing: str = GRAPH,
    ) -> WinnerRecord | None:
        """Make the fastest correct trial of this key the winner (or none, if none is correct);
        with ``trial_id``, that trial (a correct one of the key: the tie rule's choice, see
        tunesvc.tuning.key), which replaces a stored winner up to ``tolerance`` faster than it
        (a fraction: the chosen time's noise).

        One INSERT ... SELECT ... ON CONFLICT DO UPDATE (SQLite, PostgreSQL): choosing the best
        trial and writing it is one statement, so sweeps of one key that finish at once neither
        break the winners' unique constraint nor replace a faster winner with a slower one
        (``_winner_upsert`` says when a stored winner is replaced). ``timing``: the winner of that
        timing (graph | eager), chosen among the trials timed so.
        """
        dialect_insert = _dialect_insert(self.engine.dialect)
        if dialect_insert is None:
            return self._update_winner_by_select(kv_id, device_id, shape_key, trial_id, timing)
        chosen = () if trial_id is None else (Trial.id == trial_id,)
        best = (
            select(
                Trial.kernel_version_id,
                Trial.device_id,
                Trial.shape_key,
                Trial.config,
                Trial.config_hash,
                Trial.time_ms,
                Trial.id,
                literal(utcnow(), Winner.updated_at.type),
                Trial.timing,
            )
            .where(
                Trial.kernel_version_id == kv_id,
                Trial.device_id == device_id,
                Trial.shape_key == shape_key,
                Trial.status == "ok",
                Trial.timing == timing,
                *chosen,
            )
            .order_by(Trial.time_ms, Trial.id)
            .limit(1)
        )
        columns = ["kernel_version_id", "device_id", "shape_key", "config", "config_hash", "time_ms", "trial_id"]
        statement = dialect_insert(Winner).from_select([*columns, "updated_at", "timing"], best)
        with self.session() as session:
            session.execute(_winner_upsert(statement, replace_own_trial=True, tolerance=tolerance))
        with self.session() as session:
            row = session.scalar(self._winner_row(kv_id, device_id, shape_key, timing))
            return _record(WinnerRecord, row) if row is not None else None

    def _winner_row(self, kv_id: int, device_id: int, shape_key: str, timing: str) -> Any:
        """SELECT the winner of one key and timing, its timing loaded."""
        query = select(Winner).where(
            Winner.kernel_version_id == kv_id,
            Winner.device_id == device_id,
            Winner.shape_key == shape_key,
            Winner.timing == timing,
        )
        return self._with_timing(query, Winner)

    def _update_winner_by_select(
        self, kv_id: int, device_id: int, shape_key: str, trial_id: int | None = None, timing: str = GRAPH
    ) -> WinnerRecord | None:
        """update_winner for a dialect without ON CONFLICT: select, then insert or update."""
        chosen = () if trial_id is None else (Trial.id == trial_id,)
        with self.session() as session:
            best = session.scalar(
                select(Trial)
                .where(
                    Trial.kernel_version_id == kv_id,
                    Trial.device_id == device_id,
                    Trial.shape_key == shape_key,
                    Trial.status == "ok",
                    Trial.timing == timing,
                    *chosen,
                )
                .order_by(Trial.time_ms, Trial.id)
                .limit(1)
            )
            if best is None or best.time_ms is None:  # a correct trial always has a time
                return None
            winner = session.scalar(self._winner_row(kv_id, device_id, shape_key, timing))
            if winner is None:
                winner = Winner(kernel_version_id=kv_id, device_id=device_id, shape_key=shape_key, timing=timing)
                session.add(winner)
            winner.config, winner.config_hash = best.config, best.config_hash
            winner.time_ms, winner.trial_id = best.time_ms, best.id
            session.flush()
            return _record(WinnerRecord, winner)

    # -- reading ------------------------------------------------------------------------
    def winners(
        self,
        kernel: str | None = None,
        hardware_id: str | None = None,
        version: str | None = None,
        device: str | None = None,
        shape: str | None = None,
        timing: str | None = GRAPH,
    ) -> list[WinnerEntry]:
        """Winners, optionally filtered; ``device`` and ``shape`` match case-insensitive substrings
        of the device's name or hardware id and of the shape key; ``timing``: graph's (the
        default), eager's, or None for both."""
        with self.session() as session:
            query = select(Winner).join(Winner.kernel_version).join(Winner.device)
            query = self._with_timing(query.where(*self._timing_is(Winner.timing, timing)), Winner)
            if kernel is not None:
                query = query.where(KernelVersion.kernel == kernel)
            if hardware_id is not None:
                query = query.where(StoredDevice.hardware_id == hardware_id)
            if version is not None:
                query = query.where(KernelVersion.version == version)
            if device is not None:
                query = query.where(_device_matches(device))
            if shape is not None:
                query = query.where(func.lower(Winner.shape_key).contains(shape.lower(), autoescape=True))
            query = query.order_by(
                KernelVersion.kernel, StoredDevice.name, Winner.shape_key, Winner.updated_at, Winner.id
            )
            spreads = self._winner_spreads(session, query)
            return [
                _winner_entry(w, spreads.get(w.trial_id))
                for w in session.scalars(query).unique()
                if self._usable_winner(w)
            ]

    @staticmethod
    def _winner_spreads(session: Session, query: Any) -> dict[int, float | None]:
        """The spread of each winner's trial in ``query`` (a select of winners), by trial id."""
        ids = query.with_only_columns(Winner.trial_id, maintain_column_froms=True).order_by(None)
        return dict(session.execute(select(Trial.id, Trial.spread).where(Trial.id.in_(ids))).all())

    def sibling_winners(
        self, kernel: str, version: str, device: Device, timing: str | None = GRAPH
    ) -> list[WinnerEntry]:
        """The winners of ``kernel`` at ``version`` on the GPU models that share ``device``'s compute
        capability and SM count but not its hardware id (an H100 SXM's for an H200), oldest first.

        Only GPUs have siblings: the interpreter's timings are its host's own. Nothing is written:
        the runtime serves these as transferred, never as this device's winners.
        """
        if not device.is_gpu:
            return []
        with self.session() as session:
            query = (
                select(Winner)
                .join(Winner.kernel_version)
                .join(Winner.device)
                .where(
                    KernelVersion.kernel == kernel,
                    KernelVersion.version == version,
                    StoredDevice.kind == device.kind,
                    StoredDevice.capability == device.capability,
                    StoredDevice.sm_count == device.sm_count,
                    StoredDevice.hardware_id != device.hardware_id,
                    *self._timing_is(Winner.timing, timing),
                )
                .order_by(Winner.updated_at, Winner.id)
            )
            query = self._with_timing(query, Winner)
            spreads = self._winner_spreads(session, query)
            return [
                _winner_entry(w, spreads.get(w.trial_id))
                for w in session.scalars(query).unique()
                if self._usable_winner(w)
            ]

    def _usable_winner(self, w: Winner) -> bool:
        why = _winner_problem(w.shape_key, w.config, w.time_ms)
        if why is not None:
            self._skip("the winner", w.kernel_version.kernel, w.shape_key, why)
        return why is None

    def devices(self) -> list[DeviceRecord]:
        """Every stored device, oldest first (a hardware id's later rows are newer software stacks)."""
        with self.session() as session:
            return [_record(DeviceRecord, d) for d in session.scalars(select(StoredDevice).order_by(StoredDevice.id))]

    def find_device(self, text: str) -> Device:
        """The newest stored device whose hardware id or name is ``text``."""
        rows = [d for d in self.devices() if text in (d.hardware_id, d.name)]
        if not rows:
            known = "; ".join(sorted({d.name for d in self.devices()})) or "none"
            raise TunesvcError(f"No device '{text}' in {self._where()}; stored devices: {known}.")
        row = rows[-1]
        return Device(**{f: getattr(row, f) for f in Device.__dataclass_fields__})

    def trial_counts(
        self, kernel: str | None = None, device: str | None = None, shape: str | None = None
    ) -> dict[str, int]:
        """Trials by status (for the summary line of `tune show`), filtered as :meth:`winners` is."""
        query = select(Trial.status, func.count()).group_by(Trial.status)
        if kernel is not None:
            query = query.join(KernelVersion, Trial.kernel_version_id == KernelVersion.id).where(
                KernelVersion.kernel == kernel
            )
        if device is not None:
            query = query.join(StoredDevice, Trial.device_id == StoredDevice.id).where(_device_matches(device))
        if shape is not None:
            query = query.where(func.lower(Trial.shape_key).contains(shape.lower(), autoescape=True))
        with self.session() as session:
            return {status: count for status, count in session.execute(query).all()}

    def rejected_trials(
        self, kernel: str | None = None, device: str | None = None, shape: str | None = None
    ) -> list[RejectedTrials]:
        """Per kernel version and device model with trials (filtered as :meth:`winners` is): its
        trials and its ``wrong_result`` trials by message (for `tune show`)."""
        # plain columns grouped (no expression of a bound value: PostgreSQL takes two of those as different)
        group = (KernelVersion.kernel, KernelVersion.version, StoredDevice.hardware_id, Trial.status, Trial.message)
        query = (
            select(*group, func.count().label("n"))
            .join(KernelVersion, Trial.kernel_version_id == KernelVersion.id)
            .join(StoredDevice, Trial.device_id == StoredDevice.id)
            .group_by(*group)
        )
        if kernel is not None:
            query = query.where(KernelVersion.kernel == kernel)
        if device is not None:
            query = query.where(_device_matches(device))
        if shape is not None:
            query = query.where(func.lower(Trial.shape_key).contains(shape.lower(), autoescape=True))
        totals: dict[tuple[str, str, str], int] = {}
        messages: dict[tuple[str, str, str], dict[str, int]] = {}
        with self.session() as session:
            for row in session.execute(query):
                at = (row.kernel, row.version, row.hardware_id)
                totals[at] = totals.get(at, 0) + row.n
                said = messages.setdefault(at, {})
                if row.status == "wrong_result":
                    said[row.message or ""] = said.get(row.message or "", 0) + row.n
        return [
            RejectedTrials(
                kernel=k, kernel_version=v, hardware_id=h, trials=totals[(k, v, h)], wrong=messages[(k, v, h)]
            )
            for k, v, h in sorted(totals)
        ]

    def history(self, kernel: str | None = None) -> History:
        """Every kernel version, device, graph-timed trial (of ``kernel``, if given), graph winner
        and sweep (`tune report` reads graph timings only)."""
        device_columns = [getattr(StoredDevice, f) for f in ("id", "hardware_id", *Device.__dataclass_fields__)]
        trials = (
            select(
                Trial.id,
                Trial.sweep_id,
                Trial.kernel_version_id,
                Trial.device_id,
                Trial.shape_key,
                Trial.config_hash,
                Trial.status,
                Trial.time_ms,
                Trial.created_at,
                Trial.message,
            )
            .where(*self._timing_is(Trial.timing, GRAPH))
            .order_by(Trial.id)
        )
        if kernel is not None:
            trials = trials.join(KernelVersion, Trial.kernel_version_id == KernelVersion.id).where(
                KernelVersion.kernel == kernel
            )
        winners = select(
            Winner.kernel_version_id, Winner.device_id, Winner.shape_key, Winner.config, Winner.time_ms, Winner.trial_id
        ).where(*self._timing_is(Winner.timing, GRAPH))
        with self.session() as session:
            has_peer = "peer_ms" in {c["name"] for c in inspect(session.connection()).get_columns(Sweep.__tablename__)}
            sweeps = select(
                Sweep.id,
                Sweep.kernel_version_id,
                Sweep.device_id,
                Sweep.shape_key,
                Sweep.problem,
                Sweep.wall_seconds,
                Sweep.strategy,
                Sweep.started_at,
                Sweep.peer_ms if has_peer else null().label("peer_ms"),
            ).order_by(Sweep.id)
            kernel_versions = {
                kv.id: kv
                for kv in session.execute(select(KernelVersion.id, KernelVersion.kernel, KernelVersion.version))
            }
            devices = {d.id: d for d in session.execute(select(*device_columns))}
            trial_rows = session.execute(trials).all()
            winner_rows = session.execute(winners).all()
            sweep_rows = session.execute(sweeps).all()

        def kernel_of(row: Any) -> str:
            kv = kernel_versions.get(row.kernel_version_id)
            return kv.kernel if kv is not None else f"kernel version {row.kernel_version_id}"

        def usable(what: str, row: Any, why: str | None) -> bool:
            if why is not None:
                self._skip(what, kernel_of(row), row.shape_key, why)
            return why is None

        return History(
            kernel_versions=kernel_versions,
            devices=devices,
            trials=[t for t in trial_rows if usable("trials", t, key_problem(t.shape_key))],
            winners={
                (w.kernel_version_id, w.device_id, w.shape_key): w
                for w in winner_rows
                if usable("the winner", w, _winner_problem(w.shape_key, w.config, w.time_ms))
            },
            sweeps=[
                s
                for s in sweep_rows
                if usable("a sweep", s, key_problem(s.shape_key) or json_problem(s.problem, "recorded problem"))
            ],
        )

    # -- merging winners measured elsewhere (`tune import`) and re-checking them (`tune verify`) --
    def winners_with_devices(
        self, kernel: str | None = None, hardware_id: str | None = None, timing: str | None = GRAPH
    ) -> list[tuple[WinnerEntry, Device]]:
        """Winners (of ``timing``; None: both), each with the full device (software versions
        included) it was measured on."""
        with self.session() as session:
            query = select(Winner).join(Winner.kernel_version).join(Winner.device)
            query = self._with_timing(query.where(*self._timing_is(Winner.timing, timing)), Winner)
            if kernel is not None:
                query = query.where(KernelVersion.kernel == kernel)
            if hardware_id is not None:
                query = query.where(StoredDevice.hardware_id == hardware_id)
            query = query.order_by(KernelVersion.kernel, Winner.shape_key, Winner.updated_at, Winner.id)
            spreads = self._winner_spreads(session, query)
            return [
                (
                    _winner_entry(w, spreads.get(w.trial_id)),
                    Device(**{f: getattr(w.device, f) for f in Device.__dataclass_fields__}),
                )
                for w in session.scalars(query).unique()
                if self._usable_winner(w)
            ]

    def winner_trial(
        self, kernel: str, version: str, device: Device, shape_key: str, timing: str = GRAPH
    ) -> TrialRecord | None:
        """The trial the winner of this key (of ``kernel`` at ``version``, measured on ``device``:
        one software stack) points at, the evidence of its time (its spread, its repetitions);
        None where no winner is stored there. Read only."""
        query = (
            select(Trial)
            .join(Winner, Winner.trial_id == Trial.id)
            .join(KernelVersion, Winner.kernel_version_id == KernelVersion.id)
            .join(StoredDevice, Winner.device_id == StoredDevice.id)
            .where(
                KernelVersion.kernel == kernel,
                KernelVersion.version == version,
                StoredDevice.fingerprint == device.fingerprint,
                Winner.shape_key == shape_key,
                *self._timing_is(Winner.timing, timing),
            )
        )
        query = self._with_timing(query, Trial)
        with self.session() as session:
            row = session.scalar(query)
            if row is None:
                return None
            why = key_problem(row.shape_key) or _config_problem(row.config)
            if why is not None:
                self._skip(f"trial {row.id}", kernel, row.shape_key, why)
                return None
            return _record(TrialRecord, row)

    def merge_winner(
        self,
        kernel: str,
        version: str,
        device: Device,
        shape_key: str,
        config: Config,
        time_ms: float,
        source: str,
        timing: str = GRAPH,
    ) -> tuple[str, float | None]:
        """Take a winner measured elsewhere if it is faster than every stored one of its key
        and ``timing`` (winners of the other timing are not compared with it).

        Conflict rule: among the stored winners of (kernel, version, hardware id, shape key), from
        any software stack, the fastest measured time stays unless this one is strictly faster; a
        tie keeps what is stored. Returns ('added' | 'replaced' | 'kept', the best stored time).
        The winner points at a trial of a sweep with strategy 'import', so it keeps a measurement row.
        """
        device_id = self.device_id(device)
        with self.session() as session:
            kv = session.scalar(
                select(KernelVersion).where(KernelVersion.kernel == kernel, KernelVersion.version == version)
            )
            if kv is None:
                kv = KernelVersion(kernel=kernel, version=version)
                session.add(kv)
                session.flush()
            stored = (
                session.scalars(
                    select(Winner)
                    .join(Winner.device)
                    .where(
                        Winner.kernel_version_id == kv.id,
                        Winner.shape_key == shape_key,
                        StoredDevice.hardware_id == device.hardware_id,
                        Winner.timing == timing,
                    )
                )
                .unique()
                .all()
            )
            best = min((w.time_ms for w in stored), default=None)
            if best is not None and not time_ms < best:
                return "kept", best
            digest = config_hash(config)
            trial = self._imported_trial(session, kv.id, device_id, shape_key, config, time_ms, source, timing)
            values = {
                "kernel_version_id": kv.id,
                "device_id": device_id,
                "shape_key": shape_key,
                "config": config,
                "config_hash": digest,
                "time_ms": time_ms,
                "trial_id": trial.id,
                "timing": timing,
                # the runtime takes the newest winner of a key among software stacks: make it this one
                "updated_at": utcnow(),
            }
            dialect_insert = _dialect_insert(self.engine.dialect)
            if dialect_insert is not None:
                # one statement: an import beside a sweep of the same key never breaks the unique
                # constraint, and a winner stored meanwhile stays if it is as fast
                session.execute(_winner_upsert(dialect_insert(Winner).values(values), replace_own_trial=False))
            else:
                winner = next((w for w in stored if w.device_id == device_id), None)
                if winner is None:
                    winner = Winner(kernel_version_id=kv.id, device_id=device_id, shape_key=shape_key)
                    session.add(winner)
                for name, value in values.items():
                    setattr(winner, name, value)
            return ("added" if best is None else "replaced"), best

    def _imported_trial(
        self,
        session: Session,
        kv_id: int,
        device_id: int,
        shape_key: str,
        config: Config,
        time_ms: float,
        source: str,
        timing: str = GRAPH,
    ) -> Trial:
        """The stored trial of this config and timing, else a new one in a sweep with strategy 'import'."""
        digest = config_hash(config)
        trial = session.scalar(
            select(Trial).where(
                Trial.kernel_version_id == kv_id,
                Trial.device_id == device_id,
                Trial.shape_key == shape_key,
                Trial.config_hash == digest,
                Trial.timing == timing,
            )
        )
        if trial is not None:
            return trial
        sweep = Sweep(
            kernel_version_id=kv_id,
            device_id=device_id,
            shape_key=shape_key,
            problem={},
            strategy="import",
            budget=None,
            seed=0,
            status="done",
            host=socket.gethostname(),
        )
        session.add(sweep)
        session.flush()
        trial = Trial(
            sweep_id=sweep.id,
            kernel_version_id=kv_id,
            device_id=device_id,
            shape_key=shape_key,
            config=config,
            config_hash=digest,
            status="ok",
            time_ms=time_ms,
            reps=0,
            message=f"imported from {source}"[:1024],
            timing=timing,
        )
        session.add(trial)
        session.flush()
        return trial

    # -- the job queue of sweeps shared by several workers (tunesvc.fleet.jobs) ---------------
    def add_job(
        self, batch: str, kernel: str, shape_key: str, problem: dict, strategy: str, budget: int | None, seed: int
    ) -> bool:
        """Queue a pending job unless the batch has it already (another host may have added it); True if added."""
        with self.session() as session:
            if session.scalar(
                select(Job.id).where(Job.batch == batch, Job.kernel == kernel, Job.shape_key == shape_key)
            ):
                return False
        try:
            with self.session() as session:
                session.add(
                    Job(
                        batch=batch,
                        kernel=kernel,
                        shape_key=shape_key,
                        problem=dict(problem),
                        strategy=strategy,
                        budget=budget,
                        seed=seed,
                        status="pending",
                        attempts=0,
                    )
                )
        except IntegrityError:  # another host added it between the two transactions
            return False
        return True

    def release_stale_jobs(self, batch: str, stale_s: float) -> int:
        """Put running jobs whose heartbeat is older than ``stale_s`` back to pending; returns how many."""
        with self.session() as session:
            result = session.execute(
                update(Job)
                .where(Job.batch == batch, Job.status == "running", Job.heartbeat < time.time() - stale_s)
                .values(status="pending", worker=None)
            )
            return int(result.rowcount)  # type: ignore[attr-defined]  # an UPDATE's CursorResult

    def claim_job(self, batch: str, worker: str) -> JobSpec | None:
        """Take the batch's first pending job for ``worker`` (which holds at most one), or None.

        One ``UPDATE ... WHERE status = 'pending'`` whose subquery is ``SELECT ... FOR UPDATE
        SKIP LOCKED`` on PostgreSQL (workers never wait on each other's rows) and plain on SQLite
        (whose one writer at a time makes the update atomic).
        """
        other = aliased(Job)  # not correlated with the updated table: its own scan of jobs
        pending = (
            select(other.id)
            .where(other.batch == batch, other.status == "pending")
            .order_by(other.id)
            .limit(1)
            .with_for_update(skip_locked=True)  # PostgreSQL; SQLite renders no locking clause
            .scalar_subquery()
        )
        while True:
            with self.session() as session:
                claimed = session.execute(
                    update(Job)
                    .where(Job.id == pending, Job.status == "pending")
                    .values(status="running", worker=worker, heartbeat=time.time(), attempts=Job.attempts + 1)
                    .execution_options(synchronize_session=False)
                ).rowcount  # type: ignore[attr-defined]
                if not claimed:
                    return None
                job = session.scalar(
                    select(Job).where(Job.batch == batch, Job.worker == worker, Job.status == "running")
                )
                assert job is not None  # the row this transaction has just claimed
                why = key_problem(job.shape_key) or json_problem(job.problem, "problem")
                if why is None:
                    return JobSpec(
                        job.id, job.kernel, job.shape_key, dict(job.problem), job.strategy, job.budget, job.seed
                    )
                job.status, job.message, job.finished_at = "failed", f"unreadable job: {why}"[:1024], utcnow()
            self._skip("the job", job.kernel, job.shape_key, why)  # failed, and the next one claimed

    def peek_job(self, batch: str, offset: int = 0) -> JobSpec | None:
        """The batch's pending job ``offset`` places down the queue (the last one if fewer are
        pending), without claiming it; None when none is pending."""
        with self.session() as session:
            pending = select(Job).where(Job.batch == batch, Job.status == "pending")
            job = session.scalar(pending.order_by(Job.id).offset(offset).limit(1)) or session.scalar(
                pending.order_by(Job.id.desc()).limit(1)
            )
            if job is None or key_problem(job.shape_key) or json_problem(job.problem, "problem"):
                return None  # a damaged job: claim_job fails it, saying why
            return JobSpec(job.id, job.kernel, job.shape_key, dict(job.problem), job.strategy, job.budget, job.seed)

    def job_heartbeat(self, job_id: int, worker: str) -> bool:
        """Refresh the job's heartbeat; False if ``worker`` no longer holds it."""
        return self._update_held_job(job_id, worker, {"heartbeat": time.time()})

    def finish_job(self, job_id: int, worker: str, status: str = "done", message: str | None = None) -> bool:
        """Mark the job done (or failed) if ``worker`` still holds it; False if it does not."""
        return self._update_held_job(
            job_id, worker, {"status": status, "message": message and message[:1024], "finished_at": utcnow()}
        )

    def release_job(self, job_id: int, worker: str) -> bool:
        """Put the job back to pending if ``worker`` still holds it (a worker that stops midway)."""
        return self._update_held_job(job_id, worker, {"status": "pending", "worker": None})

    def _update_held_job(self, job_id: int, worker: str, values: dict[str, Any]) -> bool:
        with self.session() as session:
            result = session.execute(
                update(Job).where(Job.id == job_id, Job.worker == worker, Job.status == "running").values(**values)
            )
            return result.rowcount == 1  # type: ignore[attr-defined]

    def jobs(self, batch: str) -> list[JobRecord]:
        """The batch's jobs, in the order they were queued (a damaged one left out, with a warning)."""
        with self.session() as session:
            rows = list(session.scalars(select(Job).where(Job.batch == batch).order_by(Job.id)))
        return self._checked_records(rows, JobRecord, "the job", "problem", "problem")

    # -- keys that captured kernels met untuned in mode lookup (tunesvc.capture) -------------
    def record_miss(self, template: Template, device: Device, shape_key: str, call: dict[str, Any]) -> None:
        """Count one miss of (kernel version, device, key); the first one keeps its call description."""
        where = (
            Miss.kernel == template.name,
            Miss.version == template.version,
            Miss.hardware_id == device.hardware_id,
            Miss.shape_key == shape_key,
        )
        for _ in range(2):  # two processes adding the same miss: the loser counts on the winner's row
            try:
                with self.session() as session:
                    row = session.scalar(select(Miss).where(*where))
                    if row is None:
                        session.add(
                            Miss(
                                kernel=template.name,
                                version=template.version,
                                hardware_id=device.hardware_id,
                                shape_key=shape_key,
                                call=call,
                            )
                        )
                    else:
                        row.count += 1
                        row.last_seen = utcnow()
                        if row.status != "open":
                            row.status = "open"
                return
            except IntegrityError:
                continue

    def misses(
        self, kernel: str | None = None, hardware_id: str | None = None, status: str | None = None
    ) -> list[MissRecord]:
        """Recorded misses, most frequent first."""
        with self.session() as session:
            query = select(Miss)
            if kernel is not None:
                query = query.where(Miss.kernel == kernel)
            if hardware_id is not None:
                query = query.where(Miss.hardware_id == hardware_id)
            if status is not None:
                query = query.where(Miss.status == status)
            rows = list(session.scalars(query.order_by(Miss.count.desc(), Miss.kernel, Miss.shape_key)))
        return self._checked_records(rows, MissRecord, "the miss", "call", "recorded call")

    def captured_call(self, kernel: str, shape_key: str, hardware_id: str) -> dict[str, Any] | None:
        """The call description a captured kernel's newest finished sweep of this key recorded (None:
        none). A sweep that never finished (its process died replaying a call) vouches for no call."""
        with self.session() as session:
            row = session.scalar(
                select(Sweep.problem)
                .join(KernelVersion, Sweep.kernel_version_id == KernelVersion.id)
                .join(StoredDevice, Sweep.device_id == StoredDevice.id)
                .where(
                    KernelVersion.kernel == kernel,
                    Sweep.shape_key == shape_key,
                    StoredDevice.hardware_id == hardware_id,
                    Sweep.strategy == "capture",
                    Sweep.status == "done",
                )
                .order_by(Sweep.id.desc())
                .limit(1)
            )
        why = json_problem(row, "recorded call") if row is not None else None
        if why is not None:
            self._skip("the recorded call", kernel, shape_key, why)
            return None
        return dict(row) if row and row.get("grids") else None

    def captured_kernels(self, kernel: str | None = None) -> list[str]:
        """Names (module:qualname) of kernels that tunesvc.capture tuned into this database."""
        with self.session() as session:
            query = (
                select(KernelVersion.kernel)
                .join(Sweep, Sweep.kernel_version_id == KernelVersion.id)
                .where(Sweep.strategy == "capture")
                .distinct()
            )
            if kernel is not None:
                query = query.where(KernelVersion.kernel == kernel)
            return sorted(session.scalars(query))

    def set_miss_status(self, miss_id: int, status: str) -> None:
        with self.session() as session:
            row = session.get(Miss, miss_id)
            if row is not None:
                row.status = status

    # -- selectors (revision 0007; see tunesvc.serving.selector) ----------------------------------
    def trial_times(
        self, kernel: str, version: str, hardware_id: str, hashes: Collection[str] | None = None
    ) -> dict[str, dict[str, float | None]]:
        """Shape key -> config hash -> the newest trial's time (None: it failed or broke a
        constraint) of one kernel version on every software stack of one device model; of the
        configs of ``hashes`` only, where given (one query either way)."""
        query = self._trials_of(
            kernel, version, hardware_id, Trial.shape_key, Trial.config_hash, Trial.status, Trial.time_ms
        )
        if hashes is not None:
            query = query.where(Trial.config_hash.in_(sorted(hashes)))
        query = query.order_by(Trial.created_at, Trial.id)
        out: dict[str, dict[str, float | None]] = {}
        with self.session() as session:
            for key, digest, status, time_ms in session.execute(query):
                why = key_problem(key)
                if why is not None:
                    self._skip("trials", kernel, key, why)
                    continue
                out.setdefault(key, {})[digest] = time_ms if status == "ok" else None
        return out

    def trial_configs(self, kernel: str, version: str, hardware_id: str, hashes: set[str]) -> dict[str, dict[str, Any]]:
        """Config hash -> config, for those of ``hashes`` that a trial of this kernel version on
        this device model stored."""
        query = self._trials_of(kernel, version, hardware_id, Trial.config_hash, Trial.config)
        query = query.where(Trial.config_hash.in_(sorted(hashes)))
        query = query.add_columns(Trial.shape_key)
        out = {}
        with self.session() as session:
            for digest, config, key in session.execute(query):
                why = _config_problem(config)
                if why is not None:
                    self._skip("a trial", kernel, key, why)
                    continue
                out[digest] = dict(config)
        return out

    def _trials_of(self, kernel: str, version: str, hardware_id: str, *columns: Any) -> Any:
        """SELECT ``columns`` of the graph-timed trials of one kernel version on every software
        stack of one device model (what selectors, transfer and shared sweeps read)."""
        return (
            select(*columns)
            .join(KernelVersion, Trial.kernel_version_id == KernelVersion.id)
            .join(StoredDevice, Trial.device_id == StoredDevice.id)
            .where(
                KernelVersion.kernel == kernel,
                KernelVersion.version == version,
                StoredDevice.hardware_id == hardware_id,
                *self._timing_is(Trial.timing, GRAPH),
            )
        )

    def save_selector(self, template: Template, hardware_id: str, selector: dict[str, Any], keys: int) -> None:
        """Store (or replace) the selector of this kernel version on this device model; two sweeps
        that refit it at once both succeed (the later write replaces the earlier)."""
        self._put_selector(self.kernel_version_id(template), hardware_id, selector, keys, replace=True)

    def merge_selector(self, kernel: str, version: str, hardware_id: str, selector: dict[str, Any], keys: int) -> str:
        """Take a selector fitted elsewhere where none is stored for this kernel version and device
        model: 'added'; a stored one stays ('kept'): it was fitted on this database's own trials."""
        return self._put_selector(self._kernel_version_id(kernel, version), hardware_id, selector, keys, replace=False)

    def _put_selector(self, kv_id: int, hardware_id: str, selector: dict[str, Any], keys: int, *, replace: bool) -> str:
        for attempt in range(2):
            try:
                with self.session() as session:
                    row = session.scalar(
                        select(StoredSelector).where(
                            StoredSelector.kernel_version_id == kv_id, StoredSelector.hardware_id == hardware_id
                        )
                    )
                    if row is not None and not replace:
                        return "kept"
                    action = "added" if row is None else "replaced"
                    if row is None:
                        row = StoredSelector(kernel_version_id=kv_id, hardware_id=hardware_id)
                        session.add(row)
                    row.selector, row.keys, row.fitted_at = selector, keys, utcnow()
                return action
            except IntegrityError:  # another writer inserted the row first: update it (or keep it)
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def delete_selector(self, template: Template, hardware_id: str) -> bool:
        """Remove the selector of this kernel version on this device model; whether one was stored."""
        if self.revision is not None and self.revision < "0007":
            return False
        kv_id = self.kernel_version_id(template)
        with self.session() as session:
            found = session.execute(
                delete(StoredSelector).where(
                    StoredSelector.kernel_version_id == kv_id, StoredSelector.hardware_id == hardware_id
                )
            )
            return bool(found.rowcount)  # type: ignore[attr-defined]  # a DELETE's CursorResult

    def selector(self, kernel: str, version: str, hardware_id: str) -> dict[str, Any] | None:
        """The stored selector's JSON, or None: none fitted, or a database older than revision 0007."""
        if self.revision is not None and self.revision < "0007":
            return None
        with self.session() as session:
            found = session.scalar(
                select(StoredSelector.selector)
                .join(KernelVersion, StoredSelector.kernel_version_id == KernelVersion.id)
                .where(
                    KernelVersion.kernel == kernel,
                    KernelVersion.version == version,
                    StoredSelector.hardware_id == hardware_id,
                )
            )
        if found is None:
            return None
        why = json_problem(found, "selector")
        if why is not None:
            self._skip("the selector", kernel, f"{version} on {hardware_id}", why)
            return None
        return dict(found)

    def close(self) -> None:
        self.engine.dispose()


#: every store of this process, for the fork handler below
_STORES: weakref.WeakSet[Store] = weakref.WeakSet()


def _locks_remade_in_the_child() -> None:
    """In a forked child: each store's file lock made anew, unheld (one a parent's thread held at
    the fork, following a replaced file, would otherwise stay held in the child for ever). The
    connections are their owner's to leave to the parent (tunesvc._capture.sharing does)."""
    for store in list(_STORES):
        remake_unheld(store._file_lock)


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_locks_remade_in_the_child)


def _winner_problem(key: Any, config: Any, time_ms: Any) -> str | None:
    from tunesvc.schemas import winner_problem  # pydantic, imported once a row is checked

    return winner_problem(key, config, time_ms)


def _config_problem(config: Any) -> str | None:
    from tunesvc.schemas import config_problem

    return config_problem(config)


def _record(cls: Any, row: Any) -> Any:
    """``row`` (an ORM row) as the record ``cls``, field by field; its JSON copied, never shared."""
    # a deferred column not loaded (timing, of a database older than revision 0008) keeps its default
    loaded = vars(row) if hasattr(row, "__dict__") else {}
    values = {f.name: getattr(row, f.name) for f in fields(cls) if f.name != "timing" or "timing" in loaded}
    for name in ("config", "problem", "call"):
        if isinstance(values.get(name), dict):
            values[name] = dict(values[name])
    return cls(**values)


def _winner_entry(w: Winner, spread: float | None = None) -> WinnerEntry:
    return WinnerEntry(
        kernel=w.kernel_version.kernel,
        kernel_version=w.kernel_version.version,
        device=w.device.name,
        hardware_id=w.device.hardware_id,
        shape_key=w.shape_key,
        config=dict(w.config),
        time_ms=w.time_ms,
        updated_at=w.updated_at,
        spread=spread,
        timing=vars(w).get("timing", GRAPH),
    )


def _dialect_insert(dialect):
    """The dialect's INSERT with ON CONFLICT (SQLite, PostgreSQL), else None."""
    return {"sqlite": sqlite.insert, "postgresql": postgresql.insert}.get(dialect.name)


def _winner_upsert(statement, *, replace_own_trial: bool, tolerance: float = 0.0):
    """``statement`` (an INSERT of a winner row) as INSERT ... ON CONFLICT DO UPDATE.

    A stored winner of the key is replaced when the new one is strictly faster (or slower by at
    most ``tolerance``, a fraction: a tie rule's choice within the noise); with
    ``replace_own_trial`` also when both are the same trial (its time was re-measured), or when
    the stored one's trial failed or its time no longer matches the winner's (that trial was
    re-measured slower): the winner then follows the trials, as a sweep's re-timed finalists need.
    """
    excluded = statement.excluded
    replace = excluded.time_ms < Winner.time_ms * (1 + tolerance)
    if replace_own_trial:
        # The stored row's trial_id as a bare column: SQLAlchemy does not correlate a subquery
        # with an INSERT's target, and would add the winners table to its FROM (every row).
        stored_trial: Any = literal_column(f"{Winner.__tablename__}.trial_id")
        # each read is NULL where the stored trial is not in this statement's snapshot (PostgreSQL's
        # READ COMMITTED: another writer's winner and trial, committed after the snapshot): no
        # comparison with NULL holds, so a winner this writer cannot see is never replaced by a slower one
        own_status = select(Trial.status).where(Trial.id == stored_trial).scalar_subquery()
        own_time = select(Trial.time_ms).where(Trial.id == stored_trial).scalar_subquery()
        replace = replace | (excluded.trial_id == Winner.trial_id) | (own_status != "ok") | (own_time != Winner.time_ms)
    return statement.on_conflict_do_update(
        index_elements=["kernel_version_id", "device_id", "shape_key", "timing"],
        set_={name: excluded[name] for name in ("config", "config_hash", "time_ms", "trial_id", "updated_at")},
        where=replace,
    )


# -- `tune db`: a database's revision, and migrating it (see tunesvc.store._migrate) -------------
def current_revision(db: str | os.PathLike | None = None) -> str:
    """The revision of an existing tunesvc database (opened read-only: nothing is changed).

    A database from before Alembic is "0001". Raises :class:`TunesvcError` for a missing path, an
    empty database, another application's database or one newer than this tunesvc.
    """
    store = Store(db, readonly=True)
    try:
        revision = store.revision
    finally:
        store.close()
    assert revision is not None  # a read-only open refuses a database without one
    return revision


def upgrade(db: str | os.PathLike | None = None, *, create: bool = True) -> tuple[str | None, str]:
    """Bring a database to the head revision; returns (revision before or None if new, head).

    ``create=False`` (`tune db upgrade`) refuses a path with no tunesvc database instead of
    creating one. A database from before Alembic is stamped 0001, then upgraded. The whole
    upgrade is one transaction (on SQLite under the write lock, so concurrent processes migrate
    one at a time and the later ones find the work done): it applies completely or not at all.
    """
    if not create:
        try:
            url = make_url(resolve_url(db))
        except ArgumentError:
            url = None  # Store says what is wrong with it
        if (
            url is not None
            and url.get_backend_name() == "sqlite"
            and url.database not in (None, "", ":memory:")
            and not Path(url.database).exists()
        ):
            raise TunesvcError(f"No database at {url.database}; `tune db init` creates one.")
        current_revision(db)  # an existing tunesvc database, or one line that says why not
    store = Store(db, upgrade=True)
    try:
        before, after = store.revision_found, store.revision
    finally:
        store.close()
    assert after is not None  # a writable open leaves the database at head
    return before, after


def _insert_new_trials(dialect):
    """INSERT ... ON CONFLICT DO NOTHING RETURNING (config_hash, id): the rows that went in.

    Built once per store: building and coercing an INSERT per row took three quarters of the CPU
    per stored trial (benchmarks/write_throughput.py). None where the dialect has no ON CONFLICT,
    or no RETURNING (SQLite before 3.35).
    """
    if not dialect.insert_returning:
        return None
    # no conflict target: the trials' one unique constraint, by whatever name a migration gives it
    if dialect.name == "sqlite":
        return sqlite.insert(Trial).on_conflict_do_nothing().returning(Trial.config_hash, Trial.id)
    if dialect.name == "postgresql":
        return postgresql.insert(Trial).on_conflict_do_nothing().returning(Trial.config_hash, Trial.id)
    return None


def _insert_one(connection, values: dict) -> int | None:
    """A dialect without INSERT ... ON CONFLICT: a savepoint per row, so a duplicate is refused
    alone and the batch's transaction goes on."""
    try:
        with connection.begin_nested():
            return connection.execute(insert(Trial), values).inserted_primary_key[0]
    except IntegrityError:
        return None


#: a SQLite file's first 16 bytes (https://www.sqlite.org/fileformat.html#the_database_header)
SQLITE_HEADER = b"SQLite format 3\x00"


def _check_sqlite_file(path: Path) -> None:
    """Refuse a file that is not a whole SQLite database, from its 100-byte header alone.

    An empty file is a new database (SQLite's own rule). Otherwise the header must be SQLite's,
    and the file at least as long as the page count the header records (valid where the header
    says so: its version-valid-for number equals its change counter), and a whole number of pages:
    a truncated copy fails here, before SQLite reads a page that is not there.
    """
    try:
        with os.fdopen(open_regular(path, os.O_RDONLY, "a database file"), "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            header = handle.read(100)
    except OSError as exc:
        raise TunesvcError(f"Cannot read {path} ({exc.strerror or exc}); check its permissions.") from None
    if size == 0:
        return
    if len(header) < 100 or not header.startswith(SQLITE_HEADER):
        raise TunesvcError(f"{path} is not a SQLite database (its header is not SQLite's); pass another --db path.")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    if page_size < 512 or page_size & (page_size - 1):
        raise TunesvcError(f"{path} is damaged (page size {page_size} in its header); restore it from a copy.")
    pages = int.from_bytes(header[28:32], "big")
    header_valid = header[92:96] == header[24:28] and pages > 0
    if size % page_size or (header_valid and size < pages * page_size):
        raise TunesvcError(
            f"{path} is damaged (truncated: {size} bytes, its header records {pages} pages of {page_size}); "
            "restore it from a copy or pass another --db."
        )


_FILE_KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


#: the longest file name most file systems take (ext4, XFS, APFS, NTFS: 255 bytes)
NAME_MAX = 255


def _creation_name(name: str) -> str:
    """The name a new database is made under before it is linked to ``name``: hidden, of this
    process and random, and short enough for its own side files (``-journal``, the longest) to
    stay within NAME_MAX bytes wherever ``name``'s own side files do; a long ``name`` is cut."""
    tail = f".{os.getpid()}-{secrets.token_hex(4)}.new"
    room = NAME_MAX - len(".") - len(tail) - len("-journal")
    kept = name.encode()[:room].decode("utf-8", "ignore")  # a character cut in two is dropped
    return f".{kept}{tail}"


def _utf8_or_replaced(data: bytes) -> str:
    return data.decode("utf-8", "replace")


#: the files SQLite opens beside a database (its rollback journal, its write-ahead log and index)
SIDE_FILES = ("-journal", "-wal", "-shm")


def _check_regular_file(path: Path) -> None:
    """Refuse a path that is there but is not a regular file (a link to one is one), and the same
    at a side file's name (SQLite opens a ``-journal`` it finds to see whether it is hot, a
    ``-wal`` and a ``-shm`` to read): opening a FIFO waits for a writer forever, and a device or
    a socket is no database."""
    try:
        mode = path.stat().st_mode
    except OSError:  # not there, or a path the system refuses (a name too long): said where it is opened
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        raise TunesvcError(f"{path} is a directory, not a database file; name a database file instead.")
    if mode is not None and not stat.S_ISREG(mode):
        kind = _FILE_KINDS.get(stat.S_IFMT(mode), "not a regular file")
        raise TunesvcError(f"{path} is {kind}, not a database file; name a database file instead.")
    for side in SIDE_FILES:
        try:
            side_mode = os.stat(f"{path}{side}").st_mode
        except OSError:
            continue
        if not stat.S_ISREG(side_mode):
            kind = (
                "a directory"
                if stat.S_ISDIR(side_mode)
                else _FILE_KINDS.get(stat.S_IFMT(side_mode), "not a regular file")
            )
            raise TunesvcError(
                f"{path}{side} is {kind}, where SQLite keeps the database's {side[1:]} file; "
                "remove it, or pass another --db."
            )


_UNDEFINED = re.compile(
    r'no such (table|column): (\S+)|relation "([^"]+)" does not exist|column "?([^" ]+)"? (?:of relation "([^"]+)" )?does not exist'
)


def _missing_schema(exc: DBAPIError, text: str) -> str | None:
    """The table or column (``table X``, ``column Y``) that a statement names and the database
    lacks (SQLite's OperationalError, PostgreSQL's ProgrammingError of SQLSTATE 42P01 or 42703)."""
    if not isinstance(exc, (OperationalError, ProgrammingError)):
        return None
    code = getattr(exc.orig, "sqlstate", None)
    if code is not None and code not in ("42P01", "42703"):
        return None
    found = _UNDEFINED.search(text)
    if found is None:
        return None
    if found.group(1):
        return f"{found.group(1)} {found.group(2)}"
    if found.group(3):
        return f"table {found.group(3)}"
    return f"column {found.group(5) + '.' if found.group(5) else ''}{found.group(4)}"


def _hide_password(url: str) -> str:
    """A URL that SQLAlchemy cannot parse, with any password between ':' and '@' masked."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def _file_state(path: Path) -> tuple[int, int, bool, bool]:
    """A SQLite file's size and modification time, and whether its -wal and -journal side files exist."""
    try:
        info = path.stat()
    except OSError:
        return (-1, -1, False, False)
    return (info.st_size, info.st_mtime_ns, Path(f"{path}-wal").exists(), Path(f"{path}-journal").exists())


def _file_identity(path: str | None) -> tuple[int, int] | None:
    """The (device, inode) of the file at ``path`` (a link followed), or None where none is."""
    try:
        info = os.stat(str(path))
    except OSError:
        return None
    return (info.st_dev, info.st_ino)


def _readonly_uri(path: Path) -> str:
    """The URI that reads a SQLite file without creating or changing any file.

    ``mode=ro`` alone still creates the ``-wal`` and ``-shm`` files beside a WAL database (and so
    fails on read-only media). Where no ``-wal`` file exists, nothing is mid-write and no writer
    has the file open (a writer's connection keeps its ``-wal`` until it closes), so the file is
    opened ``immutable``: no locks, no side files. Where one exists, a writer may be at work, and
    ``mode=ro`` reads its committed pages through the existing side files.
    """
    resolved = path.resolve()
    quoted = quote(str(resolved))
    if Path(f"{resolved}-wal").exists():
        return f"file:{quoted}?mode=ro"
    return f"file:{quoted}?mode=ro&immutable=1"


def _nearly_full(path: str | None) -> bool:
    """Whether the disk holding ``path`` has under 1 MiB free (SQLite reports a full disk as a
    disk I/O error where a write of its journal fails)."""
    if not path:
        return False
    try:
        return shutil.disk_usage(Path(path).resolve().parent).free < (1 << 20)
    except OSError:
        return False


def _finite(x: float | None) -> float | None:
    return x if x is None or (x == x and abs(x) != float("inf")) else None
