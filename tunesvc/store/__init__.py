"""Persistent storage of devices, kernel versions, sweeps, trials and winners."""

from __future__ import annotations

from tunesvc.store._migrate import current_revision
from tunesvc.store._migrate import head_revision
from tunesvc.store._migrate import upgrade
from tunesvc.store._store import DatabaseUnavailable
from tunesvc.store._store import Store
from tunesvc.store._store import WinnerEntry
from tunesvc.store._store import resolve_url

__all__ = ["DatabaseUnavailable", "Store", "WinnerEntry", "current_revision", "head_revision", "resolve_url", "upgrade"]
