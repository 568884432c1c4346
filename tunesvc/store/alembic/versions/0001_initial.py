"""The schema of tunesvc 0.1.0 (what Base.metadata.create_all made before Alembic).

Revision ID: 0001
Revises:
Create Date: 2026-11-22

A database made before Alembic has these tables and tunesvc_meta.schema_version = 1 but no
alembic_version table: `tune db upgrade` stamps it 0001 and upgrades from there.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tunesvc_meta",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("value", sa.String(length=256), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    op.create_table(
        "devices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.String(length=32), nullable=False),
        sa.Column("hardware_id", sa.String(length=256), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("capability", sa.String(length=16), nullable=False),
        sa.Column("sm_count", sa.Integer(), nullable=False),
        sa.Column("memory_bytes", sa.Integer(), nullable=False),
        sa.Column("max_shared_memory", sa.Integer(), nullable=False),
        sa.Column("max_num_regs", sa.Integer(), nullable=False),
        sa.Column("driver", sa.String(length=64), nullable=False),
        sa.Column("cuda", sa.String(length=64), nullable=False),
        sa.Column("torch", sa.String(length=64), nullable=False),
        sa.Column("triton", sa.String(length=64), nullable=False),
        sa.Column("first_seen", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("fingerprint"),
    )
    op.create_index("ix_devices_hardware_id", "devices", ["hardware_id"])
    op.create_table(
        "kernel_versions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kernel", sa.String(length=128), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("first_seen", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("kernel", "version"),
    )
    op.create_index("ix_kernel_versions_kernel", "kernel_versions", ["kernel"])
    op.create_table(
        "sweeps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kernel_version_id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("shape_key", sa.String(length=512), nullable=False),
        sa.Column("problem", sa.JSON(), nullable=False),
        sa.Column("strategy", sa.String(length=32), nullable=False),
        sa.Column("budget", sa.Integer(), nullable=True),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("wall_seconds", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.ForeignKeyConstraint(["kernel_version_id"], ["kernel_versions.id"]),
        sa.ForeignKeyConstraint(["device_id"], ["devices.id"]),
    )
    op.create_table(
        "trials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("kernel_version_id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("shape_key", sa.String(length=512), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("config_hash", sa.String(length=32), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("time_ms", sa.Double(), nullable=True),
        sa.Column("spread", sa.Double(), nullable=True),
        sa.Column("reps", sa.Integer(), nullable=False),
        sa.Column("rel_error", sa.Double(), nullable=True),
        sa.Column("message", sa.String(length=1024), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("kernel_version_id", "device_id", "shape_key", "config_hash"),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweeps.id"]),
        sa.ForeignKeyConstraint(["kernel_version_id"], ["kernel_versions.id"]),
        sa.ForeignKeyConstraint(["device_id"], ["devices.id"]),
    )
    op.create_index("ix_trials_shape_key", "trials", ["shape_key"])
    op.create_table(
        "winners",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kernel_version_id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("shape_key", sa.String(length=512), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("config_hash", sa.String(length=32), nullable=False),
        sa.Column("time_ms", sa.Double(), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("kernel_version_id", "device_id", "shape_key"),
        sa.ForeignKeyConstraint(["kernel_version_id"], ["kernel_versions.id"]),
        sa.ForeignKeyConstraint(["device_id"], ["devices.id"]),
        sa.ForeignKeyConstraint(["trial_id"], ["trials.id"]),
    )
    op.execute(sa.text("INSERT INTO tunesvc_meta (key, value) VALUES ('schema_version', '1')"))


def downgrade() -> None:
    for table in ("winners", "trials", "sweeps", "kernel_versions", "devices", "tunesvc_meta"):
        op.drop_table(table)
