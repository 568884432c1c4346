"""The misses table: shape keys that captured kernels met untuned in mode lookup.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24

A serving process (mode lookup) never measures: it launches a fallback config and records the
key here, with a description of the call, so that `tune misses --tune` can tune it offline.
Additive: no row is rewritten.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def _schema_version(value: int) -> None:
    op.execute(sa.text("UPDATE tunesvc_meta SET value = :v WHERE key = 'schema_version'").bindparams(v=str(value)))


def upgrade() -> None:
    op.create_table(
        "tunesvc_misses",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kernel", sa.String(length=256), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("hardware_id", sa.String(length=256), nullable=False),
        sa.Column("shape_key", sa.String(length=512), nullable=False),
        sa.Column("call", sa.JSON(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("first_seen", sa.DateTime(), nullable=False),
        sa.Column("last_seen", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("kernel", "version", "hardware_id", "shape_key"),
    )
    op.create_index("ix_tunesvc_misses_kernel", "tunesvc_misses", ["kernel"])
    _schema_version(6)


def downgrade() -> None:
    op.drop_index("ix_tunesvc_misses_kernel", table_name="tunesvc_misses")
    op.drop_table("tunesvc_misses")
    _schema_version(5)
