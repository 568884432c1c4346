"""The database schema (SQLAlchemy 2 typed ORM).

Every table is named tunesvc_* (revision 0005), so that Optuna's studies can live in the same
database: Optuna's schema has its own ``trials`` and ``alembic_version`` tables.

devices -< sweeps >- kernel_versions; every trial row belongs to one sweep and carries its
(kernel version, device, shape key, config hash), unique together: a config is measured once
per key, device and timing, and re-running a sweep reuses what is there. One winner row per
(kernel version, device, shape key, timing).

``timing`` (revision 0008) says how a trial was timed and which timing a winner was chosen under:
``graph`` (CUDA graph replays over input copies, as every sweep timed before it) or ``eager``
(loops of ordinary launches, the host's launch cost counted); see tunesvc.bench. A key may hold a
winner of each.

Change the schema here and, with it, add a migration in alembic/versions (the next "000N", which
SCHEMA_VERSION then names): a new database is created from these models and stamped at the head
revision, an existing one is upgraded only through the migrations, and tests/test_migrations.py
checks that the two give the same schema.
"""

from __future__ import annotations

from datetime import UTC
from datetime import datetime
from typing import Any

from sqlalchemy import JSON
from sqlalchemy import BigInteger
from sqlalchemy import ForeignKey
from sqlalchemy import Index
from sqlalchemy import String
from sqlalchemy import UniqueConstraint
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.orm import Mapped
from sqlalchemy.orm import mapped_column
from sqlalchemy.orm import relationship

from tunesvc.settings import GRAPH

#: The schema's number: the Alembic head revision ("0007" -> 7) of tunesvc/store/alembic/versions.
#: Each migration writes its number to tunesvc_meta.schema_version, so that a tunesvc from before
#: Alembic (which reads only that row) also refuses a database newer than itself.
SCHEMA_VERSION = 8


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON}


class Meta(Base):
    __tablename__ = "tunesvc_meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(256))


class StoredDevice(Base):
    __tablename__ = "tunesvc_devices"
    id: Mapped[int] = mapped_column(primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(32), unique=True)
    hardware_id: Mapped[str] = mapped_column(String(256), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    name: Mapped[str] = mapped_column(String(256))
    capability: Mapped[str] = mapped_column(String(16))
    sm_count: Mapped[int]
    memory_bytes: Mapped[int] = mapped_column(BigInteger)  # revision 0003: 80 GiB overflows 32 bits
    max_shared_memory: Mapped[int]
    max_num_regs: Mapped[int]
    driver: Mapped[str] = mapped_column(String(64))
    cuda: Mapped[str] = mapped_column(String(64))
    torch: Mapped[str] = mapped_column(String(64))
    triton: Mapped[str] = mapped_column(String(64))
    first_seen: Mapped[datetime] = mapped_column(default=utcnow)


class KernelVersion(Base):
    __tablename__ = "tunesvc_kernel_versions"
    __table_args__ = (UniqueConstraint("kernel", "version"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    kernel: Mapped[str] = mapped_column(String(128), index=True)
    version: Mapped[str] = mapped_column(String(64))
    first_seen: Mapped[datetime] = mapped_column(default=utcnow)


class Sweep(Base):
    __tablename__ = "tunesvc_sweeps"
    id: Mapped[int] = mapped_column(primary_key=True)
    kernel_version_id: Mapped[int] = mapped_column(ForeignKey("tunesvc_kernel_versions.id"))
    device_id: Mapped[int] = mapped_column(ForeignKey("tunesvc_devices.id"))
    shape_key: Mapped[str] = mapped_column(String(512))
    problem: Mapped[dict[str, Any]]
    strategy: Mapped[str] = mapped_column(String(32))
    budget: Mapped[int | None]
    seed: Mapped[int]
    status: Mapped[str] = mapped_column(String(16), default="running")
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]
    wall_seconds: Mapped[float | None]
    host: Mapped[str | None] = mapped_column(String(256))  # revision 0002; None for older sweeps
    #: revision 0004: the template's torch peer timed once on the sweep's inputs; None when it has
    #: none, it failed, or the sweep is older
    peer_ms: Mapped[float | None]


class Trial(Base):
    __tablename__ = "tunesvc_trials"
    __table_args__ = (
        # revision 0008: named, so that a later revision can find it on SQLite too
        UniqueConstraint(
            "kernel_version_id", "device_id", "shape_key", "config_hash", "timing", name="uq_tunesvc_trials_timing"
        ),
        # revision 0002: a key's correct trials in time order, so the winner query reads one row
        Index("ix_tunesvc_trials_key_status_time", "kernel_version_id", "device_id", "shape_key", "status", "time_ms"),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("tunesvc_sweeps.id"))
    kernel_version_id: Mapped[int] = mapped_column(ForeignKey("tunesvc_kernel_versions.id"))
    device_id: Mapped[int] = mapped_column(ForeignKey("tunesvc_devices.id"))
    shape_key: Mapped[str] = mapped_column(String(512), index=True)
    config: Mapped[dict[str, Any]]
    config_hash: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(32))
    time_ms: Mapped[float | None]
    spread: Mapped[float | None]
    reps: Mapped[int] = mapped_column(default=0)
    rel_error: Mapped[float | None]
    message: Mapped[str | None] = mapped_column(String(1024))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    #: revision 0008: graph | eager (tunesvc.settings.TIMINGS); older rows read graph. Deferred:
    #: a read-only store of an older revision loads its rows without it (Store.timed)
    timing: Mapped[str] = mapped_column(String(16), default=GRAPH, server_default=GRAPH, deferred=True)


class Winner(Base):
    __tablename__ = "tunesvc_winners"
    __table_args__ = (
        UniqueConstraint("kernel_version_id", "device_id", "shape_key", "timing", name="uq_tunesvc_winners_timing"),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    kernel_version_id: Mapped[int] = mapped_column(ForeignKey("tunesvc_kernel_versions.id"))
    device_id: Mapped[int] = mapped_column(ForeignKey("tunesvc_devices.id"))
    shape_key: Mapped[str] = mapped_column(String(512))
    config: Mapped[dict[str, Any]]
    config_hash: Mapped[str] = mapped_column(String(32))
    time_ms: Mapped[float]
    trial_id: Mapped[int] = mapped_column(ForeignKey("tunesvc_trials.id"))
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    #: revision 0008: the timing this winner was chosen under (graph | eager); older rows read graph
    timing: Mapped[str] = mapped_column(String(16), default=GRAPH, server_default=GRAPH, deferred=True)

    kernel_version: Mapped[KernelVersion] = relationship(lazy="joined")
    device: Mapped[StoredDevice] = relationship(lazy="joined")


class Job(Base):
    """One (kernel, shape) of a sweep shared by several workers (revision 0003; see tunesvc.fleet.jobs).

    ``batch`` names the sweep: every worker, on any host, that runs the same sweep arguments
    derives the same batch and so shares its jobs. A job is pending, running (claimed by
    ``worker``, alive while its ``heartbeat`` is recent), done or failed.
    """

    __tablename__ = "tunesvc_jobs"
    __table_args__ = (
        UniqueConstraint("batch", "kernel", "shape_key"),
        Index("ix_tunesvc_jobs_batch_status", "batch", "status"),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    batch: Mapped[str] = mapped_column(String(64))
    kernel: Mapped[str] = mapped_column(String(256))
    shape_key: Mapped[str] = mapped_column(String(512))
    problem: Mapped[dict[str, Any]]
    strategy: Mapped[str] = mapped_column(String(32))
    budget: Mapped[int | None]
    seed: Mapped[int]
    status: Mapped[str] = mapped_column(String(16), default="pending")
    worker: Mapped[str | None] = mapped_column(String(256))
    #: the claiming worker's clock, in seconds since the epoch (hosts of one sweep keep NTP time)
    heartbeat: Mapped[float | None]
    attempts: Mapped[int] = mapped_column(default=0)
    message: Mapped[str | None] = mapped_column(String(1024))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]


class Miss(Base):
    """A shape key a captured kernel met with no stored winner, in mode lookup (revision 0006).

    ``call`` describes the call's arguments as data (tensor shapes, strides and dtypes, scalar
    values, the grid of each listed config; see tunesvc._capture.describe_call), so the key can be
    tuned offline on inputs of the same shapes. ``kernel`` is ``module:qualname``, which is also
    where the kernel can be imported from. Tuning the key marks it ``tuned``.
    """

    __tablename__ = "tunesvc_misses"
    __table_args__ = (UniqueConstraint("kernel", "version", "hardware_id", "shape_key"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    kernel: Mapped[str] = mapped_column(String(256), index=True)
    version: Mapped[str] = mapped_column(String(64))
    hardware_id: Mapped[str] = mapped_column(String(256))
    shape_key: Mapped[str] = mapped_column(String(512))
    call: Mapped[dict[str, Any]]
    count: Mapped[int] = mapped_column(default=1)
    status: Mapped[str] = mapped_column(String(16), default="open")
    first_seen: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(default=utcnow)


class StoredSelector(Base):
    """A fitted selector of one kernel version on one device model (revision 0007).

    ``selector`` is the JSON of :meth:`tunesvc.serving.selector.Selector.to_dict`: feature names,
    candidate configs and the tree as arrays; ``keys`` the tuned shape keys it was fitted on.
    Keyed by hardware id, as the runtime matches winners: every software stack of one GPU model
    contributes its trials.
    """

    __tablename__ = "tunesvc_selectors"
    __table_args__ = (UniqueConstraint("kernel_version_id", "hardware_id"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    kernel_version_id: Mapped[int] = mapped_column(ForeignKey("tunesvc_kernel_versions.id"))
    hardware_id: Mapped[str] = mapped_column(String(256))
    selector: Mapped[dict[str, Any]]
    keys: Mapped[int]
    fitted_at: Mapped[datetime] = mapped_column(default=utcnow)
