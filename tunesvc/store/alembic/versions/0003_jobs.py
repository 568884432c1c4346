"""The jobs table (jobs of a sweep that several workers share); devices.memory_bytes as BIGINT.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23

Workers claim pending jobs atomically (tunesvc.fleet.jobs), heartbeat while they run them, and a job
whose worker stopped heartbeating goes back to pending.

devices.memory_bytes was a 32-bit INTEGER: harmless on SQLite (whose integers are 64-bit), but
PostgreSQL refused any GPU with 2 GiB or more. SQLite rebuilds the devices table (batch mode),
keeping its rows; PostgreSQL widens the column in place.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def _schema_version(value: int) -> None:
    op.execute(sa.text("UPDATE tunesvc_meta SET value = :v WHERE key = 'schema_version'").bindparams(v=str(value)))


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("batch", sa.String(length=64), nullable=False),
        sa.Column("kernel", sa.String(length=256), nullable=False),
        sa.Column("shape_key", sa.String(length=512), nullable=False),
        sa.Column("problem", sa.JSON(), nullable=False),
        sa.Column("strategy", sa.String(length=32), nullable=False),
        sa.Column("budget", sa.Integer(), nullable=True),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("worker", sa.String(length=256), nullable=True),
        sa.Column("heartbeat", sa.Double(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("message", sa.String(length=1024), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("batch", "kernel", "shape_key"),
    )
    op.create_index("ix_jobs_batch_status", "jobs", ["batch", "status"])
    with op.batch_alter_table("devices") as batch:
        batch.alter_column("memory_bytes", type_=sa.BigInteger(), existing_type=sa.Integer(), existing_nullable=False)
    _schema_version(3)


def downgrade() -> None:
    with op.batch_alter_table("devices") as batch:
        batch.alter_column("memory_bytes", type_=sa.Integer(), existing_type=sa.BigInteger(), existing_nullable=False)
    op.drop_index("ix_jobs_batch_status", table_name="jobs")
    op.drop_table("jobs")
    _schema_version(2)
