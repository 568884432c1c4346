"""Every table named tunesvc_*, so that Optuna's studies can share the database.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23

Optuna's RDBStorage schema has its own ``trials`` table (and keeps its revision in
``alembic_version``, where revisions 0001-0004 kept ours; tunesvc.store._migrate moves ours to
``tunesvc_alembic_version`` before this revision runs). Renaming keeps every row: SQLite's
ALTER TABLE RENAME rewrites the foreign keys that point at a renamed table, PostgreSQL's keeps
them (they refer to the table, not its name). Indexes named after a table get the new name;
on PostgreSQL so do the primary key, unique and foreign key constraints and the id sequences
(``trials_pkey`` is also the name of Optuna's, and PostgreSQL names indexes per schema). Each
constraint gets the name PostgreSQL gives it in a table created under the new name, so that a
database upgraded to this revision and one created at head from the models (as a new database
is, see tunesvc/store/_migrate.py) have the same schema.
"""

from __future__ import annotations

from typing import Callable

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

TABLES = ("devices", "kernel_versions", "sweeps", "trials", "winners", "jobs")
PREFIX = "tunesvc_"
#: (table, what follows "ix_<table>_", columns) of every named index at revision 0004
INDEXES = (
    ("devices", "hardware_id", ["hardware_id"]),
    ("kernel_versions", "kernel", ["kernel"]),
    ("trials", "shape_key", ["shape_key"]),
    ("trials", "key_status_time", ["kernel_version_id", "device_id", "shape_key", "status", "time_ms"]),
    ("jobs", "batch_status", ["batch", "status"]),
)
#: PostgreSQL's longest identifier (NAMEDATALEN - 1); it truncates longer names to this
PG_NAME_LENGTH = 63
#: pg_constraint.contype -> the suffix of PostgreSQL's default constraint name
SUFFIXES = {"p": "pkey", "u": "key", "f": "fkey"}


def _schema_version(value: int) -> None:
    op.execute(sa.text("UPDATE tunesvc_meta SET value = :v WHERE key = 'schema_version'").bindparams(v=str(value)))


def _rename(before: Callable[[str], str], after: Callable[[str], str]) -> None:
    """Rename each table from before(name) to after(name), its indexes (and on PostgreSQL its
    constraints and sequence) with it; ``name`` is the table's name at revision 0004."""
    postgresql = op.get_bind().dialect.name == "postgresql"
    # SQLite cannot rename an index: each is made again under its new name (on PostgreSQL too,
    # for one way on both; they are small)
    for table, rest, _ in INDEXES:
        op.drop_index(f"ix_{before(table)}_{rest}", table_name=before(table))
    for table in TABLES:
        op.rename_table(before(table), after(table))
        if postgresql:
            _rename_pg_constraints_and_sequence(before(table), after(table))
    for table, rest, columns in INDEXES:
        op.create_index(f"ix_{after(table)}_{rest}", after(table), columns)


def _pg_default_name(table: str, columns: list[str], label: str) -> str:
    """The name PostgreSQL gives a constraint that is not named: makeObjectName() in its
    src/backend/commands/indexcmds.c, which shortens the longer of the table name and the joined
    columns a character at a time until the whole fits in 63 (prefixing and then cutting the
    end, as this revision first did, gave ``tunesvc_trials_..._config_has`` instead of ``..._key``).
    """
    middle = "_".join(columns)
    room = PG_NAME_LENGTH - len(label) - 1 - (1 if middle else 0)
    n_table, n_middle = len(table), len(middle)
    while n_table + n_middle > room:
        if n_table > n_middle:
            n_table -= 1
        else:
            n_middle -= 1
    return "_".join(part for part in (table[:n_table], middle[:n_middle], label) if part)


def _rename_pg_constraints_and_sequence(old: str, new: str) -> None:
    """Name the constraints and the id sequence of a renamed PostgreSQL table after its new name.

    Each constraint gets PostgreSQL's default name for the new table, made from its columns:
    upgrading renames those whose name starts with the old table's (every one that revision 0001
    or 0003 made), downgrading every one, so a round trip restores the names of revision 0004.
    """
    bind = op.get_bind()
    constraints = bind.execute(sa.text(
        "SELECT c.conname, c.contype, array_agg(a.attname ORDER BY k.ord) FROM pg_constraint c"
        " CROSS JOIN LATERAL unnest(c.conkey) WITH ORDINALITY AS k(attnum, ord)"
        " JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum"
        " WHERE c.conrelid = CAST(:table AS regclass) AND c.contype IN ('p', 'u', 'f')"
        " GROUP BY c.conname, c.contype"
    ), {"table": new}).all()
    for name, kind, columns in constraints:
        if new.startswith(PREFIX) and not name.startswith(old + "_"):
            continue
        renamed = _pg_default_name(new, [] if kind == "p" else columns, SUFFIXES[kind])
        if renamed == name:
            continue
        op.execute(f'ALTER TABLE "{new}" RENAME CONSTRAINT "{name}" TO "{renamed}"')
    sequence = bind.execute(sa.text("SELECT pg_get_serial_sequence(:table, 'id')"), {"table": new}).scalar()
    if sequence is not None:
        # the column's default calls nextval() by the sequence's oid: renaming it keeps ids coming
        op.execute(f'ALTER SEQUENCE {sequence} RENAME TO "{new}_id_seq"')


def upgrade() -> None:
    _rename(lambda table: table, lambda table: PREFIX + table)
    _schema_version(5)


def downgrade() -> None:
    _rename(lambda table: PREFIX + table, lambda table: table)
    _schema_version(4)
