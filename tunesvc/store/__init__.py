"""Persistent storage of devices, kernel versions, sweeps, trials and winners."""

from __future__ import annotations

from tunesvc.store._store import Store
from tunesvc.store._store import WinnerEntry
from tunesvc.store._store import resolve_url

__all__ = ["Store", "WinnerEntry", "resolve_url"]
