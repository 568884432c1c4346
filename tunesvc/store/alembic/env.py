"""Alembic environment of the tunesvc store (no alembic.ini: see tunesvc/store/_migrate.py).

The caller opens the connection, begins the transaction (on SQLite with BEGIN IMMEDIATE, so
concurrent processes migrate one at a time) and passes it as ``config.attributes["connection"]``;
the whole upgrade then commits or rolls back as one.
"""

from __future__ import annotations

from alembic import context

from tunesvc.store._migrate import VERSION_TABLE
from tunesvc.store.models import Base

config = context.config
connection = config.attributes.get("connection")
if connection is None or context.is_offline_mode():
    raise RuntimeError("tunesvc migrations run through tunesvc.store.upgrade(), with a connection")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    version_table=VERSION_TABLE,  # not alembic_version: Optuna keeps its own revision there
    render_as_batch=True,  # SQLite alters most things by copying the table; batch mode does that
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
