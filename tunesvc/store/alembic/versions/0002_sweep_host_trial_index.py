"""sweeps.host (the machine that ran the sweep) and an index for the winner query.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22

The winner of a key is the fastest correct trial: trials filtered by (kernel version, device,
shape key, status = 'ok') in time_ms order. The index serves that filter and order (SQLite reads
one row instead of sorting all the key's trials); its first three columns also serve every
other per-key trial query. Both changes are additive: no row is rewritten.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

INDEX = "ix_trials_key_status_time"
COLUMNS = ["kernel_version_id", "device_id", "shape_key", "status", "time_ms"]


def _schema_version(value: int) -> None:
    op.execute(sa.text("UPDATE tunesvc_meta SET value = :v WHERE key = 'schema_version'").bindparams(v=str(value)))


def upgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.add_column(sa.Column("host", sa.String(length=256), nullable=True))
    with op.batch_alter_table("trials") as batch:
        batch.create_index(INDEX, COLUMNS)
    _schema_version(2)


def downgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.drop_index(INDEX)
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_column("host")
    _schema_version(1)
