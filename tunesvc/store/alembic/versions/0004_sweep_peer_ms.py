"""sweeps.peer_ms: the torch peer's time on the sweep's problem (tune report's "tuned / peer").

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23

A sweep times the template's torch equivalent (cuBLAS through torch.matmul, SDPA, ...) once,
on the inputs and in the way it times the candidates. NULL where the template has no peer, the
peer failed, or the sweep predates this revision. Additive: no row is rewritten.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def _schema_version(value: int) -> None:
    op.execute(sa.text("UPDATE tunesvc_meta SET value = :v WHERE key = 'schema_version'").bindparams(v=str(value)))


def upgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.add_column(sa.Column("peer_ms", sa.Double(), nullable=True))
    _schema_version(4)


def downgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_column("peer_ms")
    _schema_version(3)
