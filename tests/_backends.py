"""The store's two backends for tests: a SQLite file, and a fresh database on a PostgreSQL server.

PostgreSQL tests need $TUNESVC_TEST_PG_URL (a role that may create databases; `.ci/run` starts a
server on loopback and sets it) and skip, saying so, only when it is unset. Each test gets its
own database, dropped afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine
from sqlalchemy import text
from sqlalchemy.engine import make_url

PG_ENV = "TUNESVC_TEST_PG_URL"
BACKENDS = ["sqlite", "postgresql"]


def pg_admin_url() -> str:
    url = os.environ.get(PG_ENV)
    if not url:
        pytest.skip(
            f"PostgreSQL tests need ${PG_ENV} (a server URL, e.g. postgresql+psycopg://user:pw@127.0.0.1/db); .ci/run sets it"
        )
    return url


def _admin(statement: str) -> None:
    engine = create_engine(pg_admin_url(), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(text(statement))
    finally:
        engine.dispose()


def pg_database() -> Iterator[str]:
    """A new, empty PostgreSQL database's URL (as a string with its password); dropped after use."""
    name = f"tunesvc_test_{uuid.uuid4().hex[:12]}"
    _admin(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(pg_admin_url()).set(database=name).render_as_string(hide_password=False)
    finally:
        _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def set_connections_allowed(url: str, allowed: bool) -> None:
    """Open or close a database to new connections, and drop its current ones when closing."""
    name = make_url(url).database
    _admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(allowed).lower()}')
    if not allowed:
        _admin(
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}' AND pid <> pg_backend_pid()"
        )


@pytest.fixture(params=BACKENDS)
def db_url(request, tmp_path) -> Iterator[str]:
    """A database that does not exist yet: a SQLite path, or an empty PostgreSQL database."""
    if request.param == "sqlite":
        yield str(tmp_path / "test.db")
    else:
        yield from pg_database()
