"""Run-time lookup: which config to launch a kernel with, here and now.

The winners of the current device (matched by hardware id: GPU model, capability, SM count)
and the current kernel version are loaded once per kernel, from a database or from an
exported bundle. Each lookup then walks the fallback chain

    exact shape key  ->  nearest tuned key (log2 distance over dims, same dtype)  ->  heuristic

and says which step answered. Bundles are read with :mod:`json` only: a deployment that
ships a bundle never imports SQLAlchemy.
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from tunesvc.device import current_device
from tunesvc.errors import TunesvcError
from tunesvc.template import ShapeKey
from tunesvc.template import Template
from tunesvc.template import get_template

if TYPE_CHECKING:
    from tunesvc.device import Device
    from tunesvc.space import Config

EXACT, NEAREST, HEURISTIC = "exact", "nearest", "heuristic"


@dataclass(frozen=True)
class LookupResult:
    kernel: str
    config: Config
    source: str  # exact | nearest | heuristic
    key: str
    matched_key: str | None = None
    distance: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel, "config": self.config, "source": self.source, "key": self.key,
            "matched_key": self.matched_key, "distance": self.distance,
        }


class Runtime:
    """Tuned configs for one process. ``db`` or ``bundle`` (a JSON file from `tune export`);
    neither: $TUNESVC_BUNDLE, else $TUNESVC_DB, else ./tune.db if it exists, else heuristics."""

    def __init__(self, db: str | os.PathLike | None = None, bundle: str | os.PathLike | None = None, device: Device | None = None) -> None:
        if db is not None and bundle is not None:
            raise TunesvcError("Give a database or a bundle, not both.")
        if db is None and bundle is None:
            bundle = os.environ.get("TUNESVC_BUNDLE") or None
            db = os.environ.get("TUNESVC_DB") or None
        self.db = db
        self.bundle = bundle
        self._device = device
        self._tables: dict[str, dict[str, Config]] = {}
        self._keys: dict[str, list[tuple[ShapeKey, str]]] = {}
        self._memo: dict[tuple, LookupResult] = {}
        self._lock = threading.Lock()
        self.counters: Counter[tuple[str, str]] = Counter()

    @property
    def device(self) -> Device:
        if self._device is None:
            self._device = current_device()
        return self._device

    def _table(self, template: Template) -> dict[str, Config]:
        table = self._tables.get(template.name)
        if table is None:
            with self._lock:
                table = self._tables.get(template.name)
                if table is None:
                    table = self._load(template)
                    self._keys[template.name] = [(ShapeKey.parse(k), k) for k in table]
                    self._tables[template.name] = table
        return table

    def _load(self, template: Template) -> dict[str, Config]:
        if self.bundle is not None:
            return load_bundle_table(self.bundle, template, self.device)
        db = self.db
        if db is None:
            if not Path("tune.db").exists():
                return {}
            db = "tune.db"
        from tunesvc.store import Store  # the database path only

        store = Store(db, readonly=True)
        try:
            entries = store.winners(kernel=template.name, hardware_id=self.device.hardware_id, version=template.version)
        finally:
            store.close()
        # the newest measurement wins when several software stacks tuned the same key
        return {e.shape_key: e.config for e in sorted(entries, key=lambda e: e.updated_at)}

    def lookup(self, kernel: str | Template, **problem: Any) -> LookupResult:
        template = kernel if isinstance(kernel, Template) else get_template(kernel)
        normalized = template.problem(**problem)
        key = template.key(normalized)
        text = str(key)
        table = self._table(template)
        if text in table:
            result = LookupResult(template.name, table[text], EXACT, text, text, 0.0)
        else:
            nearest = min(((key.distance(k), s) for k, s in self._keys[template.name]), default=None)
            if nearest is not None and nearest[0] != float("inf"):
                distance, matched = nearest
                config = table[matched]
                if template.violations(config, normalized, self.device):
                    config = None
                result = (
                    LookupResult(template.name, config, NEAREST, text, matched, distance)
                    if config is not None
                    else None
                )
            else:
                result = None
            if result is None:
                result = LookupResult(template.name, template.heuristic(normalized, self.device), HEURISTIC, text)
        self.counters[(template.name, result.source)] += 1
        return result

    def config_for(self, template: Template, **problem: Any) -> Config:
        """The config to launch with (memoised per problem: the hot path is one dict hit)."""
        memo_key = (template.name, *sorted(problem.items()))
        hit = self._memo.get(memo_key)
        if hit is None:
            hit = self.lookup(template, **problem)
            self._memo[memo_key] = hit
        return hit.config


def load_bundle_table(path: str | os.PathLike, template: Template, device: Device) -> dict[str, Config]:
    """The winners of one kernel for this device from a bundle file (see tunesvc.export)."""
    from tunesvc.export import read_bundle

    bundle = read_bundle(path)
    if bundle["device"]["hardware_id"] != device.hardware_id:
        return {}
    entry = bundle["kernels"].get(template.name)
    if entry is None or entry["version"] != template.version:
        return {}
    return {key: w["config"] for key, w in entry["winners"].items()}


_default: Runtime | None = None


def default_runtime() -> Runtime:
    global _default
    if _default is None:
        _default = Runtime()
    return _default


def configure(db: str | os.PathLike | None = None, bundle: str | os.PathLike | None = None) -> Runtime:
    """Point the process-wide runtime (used by tunesvc.kernels.*) at a database or bundle."""
    global _default
    _default = Runtime(db=db, bundle=bundle)
    return _default


def lookup(kernel: str, **problem: Any) -> LookupResult:
    """The tuned config for ``kernel`` on this device and problem, and how it was found.

    >>> tunesvc.lookup("matmul", M=1000, N=3000, K=777, dtype="bfloat16").source
    'exact'
    """
    return default_runtime().lookup(kernel, **problem)
