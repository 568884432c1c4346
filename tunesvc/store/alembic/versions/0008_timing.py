"""trials.timing and winners.timing: how a trial was timed, which timing a winner was chosen under.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25

A sweep times its candidates from CUDA graphs (``graph``, every sweep before this revision) or
in loops of ordinary launches (``eager``, the host's launch cost counted). Both columns are
NOT NULL with the server default ``graph``, so every existing row reads graph. The timing joins
the unique constraints of both tables (a key may hold a graph and an eager winner, and a config
one trial under each), which get names here: revisions 0001-0007 left them unnamed, and SQLite
keeps no name for an unnamed constraint, so batch mode names it by a convention to drop it.
On PostgreSQL the unnamed constraint is found by its columns in the catalogue.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

#: table -> (its unique columns at revision 0007, the name its constraint gets here)
UNIQUE = {
    "tunesvc_trials": (["kernel_version_id", "device_id", "shape_key", "config_hash"], "uq_tunesvc_trials_timing"),
    "tunesvc_winners": (["kernel_version_id", "device_id", "shape_key"], "uq_tunesvc_winners_timing"),
}
#: what batch mode names a reflected unnamed unique constraint on SQLite, so that it can be dropped
UNNAMED = {"uq": "uq_%(table_name)s_%(column_0_N_name)s"}


def _schema_version(value: int) -> None:
    op.execute(sa.text("UPDATE tunesvc_meta SET value = :v WHERE key = 'schema_version'").bindparams(v=str(value)))


def _pg_unique_name(table: str, columns: list[str]) -> str | None:
    """The name of ``table``'s unique constraint over exactly ``columns`` (PostgreSQL's catalogue)."""
    rows = op.get_bind().execute(sa.text(
        "SELECT c.conname, array_agg(a.attname ORDER BY k.ord) FROM pg_constraint c"
        " CROSS JOIN LATERAL unnest(c.conkey) WITH ORDINALITY AS k(attnum, ord)"
        " JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum"
        " WHERE c.conrelid = CAST(:table AS regclass) AND c.contype = 'u' GROUP BY c.conname"
    ), {"table": table}).all()
    return next((name for name, cols in rows if list(cols) == columns), None)


def upgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    for table, (columns, name) in UNIQUE.items():
        old = _pg_unique_name(table, columns) if postgresql else "uq_" + "_".join([table, *columns])
        with op.batch_alter_table(table, naming_convention=UNNAMED) as batch:
            batch.add_column(sa.Column("timing", sa.String(length=16), nullable=False, server_default="graph"))
            if old is not None:
                batch.drop_constraint(old, type_="unique")
            batch.create_unique_constraint(name, [*columns, "timing"])
    _schema_version(8)


def downgrade() -> None:
    # an eager winner or trial has no place in revision 0007's constraints: only graph rows stay
    op.execute(sa.text("DELETE FROM tunesvc_winners WHERE timing <> 'graph'"))
    op.execute(sa.text(
        "DELETE FROM tunesvc_trials WHERE timing <> 'graph'"
        " AND id NOT IN (SELECT trial_id FROM tunesvc_winners)"
    ))
    postgresql = op.get_bind().dialect.name == "postgresql"
    for table, (columns, name) in UNIQUE.items():
        # SQLite: the copy of the table gets revision 0007's unnamed constraint back
        unnamed = () if postgresql else (sa.UniqueConstraint(*columns),)
        with op.batch_alter_table(table, table_args=unnamed) as batch:
            batch.drop_constraint(name, type_="unique")
            batch.drop_column("timing")
        if postgresql:  # unnamed, as revision 0005 left it: PostgreSQL gives it its default name
            op.execute(f'ALTER TABLE "{table}" ADD UNIQUE ({", ".join(columns)})')
    _schema_version(7)
