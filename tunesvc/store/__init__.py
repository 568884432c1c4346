"""Persistent storage of devices, kernel versions, sweeps, trials and winners."""

from __future__ import annotations

from tunesvc.records import JobSpec
from tunesvc.records import WinnerEntry
from tunesvc.store._base import BaseStore
from tunesvc.store._migrate import head_revision
from tunesvc.store._store import BUSY_TIMEOUT_S
from tunesvc.store._store import DatabaseLocked
from tunesvc.store._store import DatabaseNotCreated
from tunesvc.store._store import DatabaseUnavailable
from tunesvc.store._store import History
from tunesvc.store._store import Store
from tunesvc.store._store import current_revision
from tunesvc.store._store import database_name
from tunesvc.store._store import resolve_url
from tunesvc.store._store import upgrade

__all__ = [
    "BUSY_TIMEOUT_S",
    "BaseStore",
    "DatabaseLocked",
    "DatabaseNotCreated",
    "DatabaseUnavailable",
    "History",
    "JobSpec",
    "Store",
    "WinnerEntry",
    "current_revision",
    "database_name",
    "head_revision",
    "resolve_url",
    "upgrade",
]
