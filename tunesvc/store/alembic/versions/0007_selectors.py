"""The selectors table: per (kernel version, device hardware), a decision tree as plain JSON.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24

A selector picks among a kernel's stored winners for a shape nobody tuned (see
tunesvc.serving.selector). It is data (feature names, thresholds, child indices, candidate configs),
never pickled code. Additive: no row is rewritten.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def _schema_version(value: int) -> None:
    op.execute(sa.text("UPDATE tunesvc_meta SET value = :v WHERE key = 'schema_version'").bindparams(v=str(value)))


def upgrade() -> None:
    op.create_table(
        "tunesvc_selectors",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kernel_version_id", sa.Integer(), nullable=False),
        sa.Column("hardware_id", sa.String(length=256), nullable=False),
        sa.Column("selector", sa.JSON(), nullable=False),
        sa.Column("keys", sa.Integer(), nullable=False),
        sa.Column("fitted_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["kernel_version_id"], ["tunesvc_kernel_versions.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("kernel_version_id", "hardware_id"),
    )
    _schema_version(7)


def downgrade() -> None:
    op.drop_table("tunesvc_selectors")
    _schema_version(6)
