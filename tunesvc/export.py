"""Deployment bundles: the winners of one device as a reviewable, diff-friendly JSON file.

Format (``format_version`` 2)::

    {"format": "tunesvc-bundle", "format_version": 2,
     "device": {"hardware_id": ..., "name": ..., "capability": ..., "sm_count": ...},
     "kernels": {"matmul": {"version": "<source hash>", "torch": ..., "triton": ...,
                            "configs": {"<config hash>": {...}},
                            "winners": {"<shape key>": {"config": "<config hash>", "time_ms": ...}}}}}

Each distinct config is written once, under its :func:`~tunesvc.space.config_hash` (the store's
id for it), and winners name it: thousands of winners share a few hundred configs, and one small
object per winner instead of two is what keeps a 10,000-winner load under 50 ms. Version 1 (each
winner's config inline) is still read. Keys are sorted and the file is indented, so a re-tune
shows up as a readable diff. :func:`import_sources` merges bundles and databases into a database
(faster measured wins).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from tunesvc.errors import TunesvcError
from tunesvc.space import config_hash

if TYPE_CHECKING:
    from tunesvc.store import Store

FORMAT = "tunesvc-bundle"
FORMAT_VERSION = 2
#: bundle formats this version reads
READABLE = (1, 2)


def build_bundles(store: Store, kernel: str | None = None, hardware_id: str | None = None) -> dict[str, dict[str, Any]]:
    """One bundle per device hardware id in the store (filtered by kernel / device).

    Where a kernel was tuned in several versions, a bundle holds the most recently tuned one;
    where several software stacks tuned one key, the newest measurement.
    """
    devices = {d.hardware_id: d for d in store.devices()}  # later rows win: the newest software
    entries = sorted(store.winners(kernel=kernel, hardware_id=hardware_id), key=lambda e: e.updated_at)
    latest = {(e.hardware_id, e.kernel): e.kernel_version for e in entries}
    bundles: dict[str, dict[str, Any]] = {}
    for entry in entries:
        if latest[(entry.hardware_id, entry.kernel)] != entry.kernel_version:
            continue
        device = devices[entry.hardware_id]
        bundle = bundles.setdefault(
            entry.hardware_id,
            {
                "format": FORMAT,
                "format_version": FORMAT_VERSION,
                "device": {
                    "hardware_id": device.hardware_id,
                    "name": device.name,
                    "capability": device.capability,
                    "sm_count": device.sm_count,
                },
                "kernels": {},
            },
        )
        section = bundle["kernels"].setdefault(
            entry.kernel,
            {
                "version": entry.kernel_version,
                "torch": device.torch,
                "triton": device.triton,
                "configs": {},
                "winners": {},
            },
        )
        digest = config_hash(entry.config)
        section["configs"][digest] = entry.config
        section["winners"][entry.shape_key] = {"config": digest, "time_ms": round(entry.time_ms, 6)}
    return bundles


def bundle_filename(hardware_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", hardware_id).strip("_") + ".json"


def write_bundles(bundles: dict[str, dict[str, Any]], out: str | os.PathLike) -> list[Path]:
    """Write to ``out``: a .json file for one device, else a folder with one file per device."""
    out = Path(out)
    if not bundles:
        raise TunesvcError(
            "Nothing to export: the store has no winners for that kernel and device; run `tune sweep` first."
        )
    if out.suffix == ".json":
        if len(bundles) > 1:
            raise TunesvcError(
                f"The store has winners of {len(bundles)} devices; pass --device or give --out a folder."
            )
        targets = {out: next(iter(bundles.values()))}
    else:
        out.mkdir(parents=True, exist_ok=True)
        targets = {out / bundle_filename(hw): b for hw, b in bundles.items()}
    for path, bundle in targets.items():
        path.write_text(json.dumps(bundle, indent=2, sort_keys=True) + "\n")
    return list(targets)


def read_bundle(path: str | os.PathLike, *, check_kernels: bool = True) -> dict[str, Any]:
    """Load and check a bundle; a corrupt or foreign file is one clear error.

    ``check_kernels=False`` checks only the header: the runtime checks one kernel's section
    when it loads it (:func:`kernel_configs`), not the sections of kernels it never launches.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise TunesvcError(f"No bundle at {path}; check the path or run `tune export`.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TunesvcError(f"{path} is not valid JSON ({exc}); re-export it with `tune export`.") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TunesvcError(f"{path} is not a tunesvc bundle; re-export it with `tune export`.")
    if data.get("format_version") not in READABLE:
        raise TunesvcError(
            f"{path} has bundle format {data.get('format_version')}, this tunesvc reads "
            f"{' and '.join(map(str, READABLE))}; re-export it with this tunesvc's `tune export`."
        )
    device, kernels = data.get("device"), data.get("kernels")
    if not isinstance(device, dict) or not isinstance(device.get("hardware_id"), str):
        raise TunesvcError(
            f"{path} is a damaged bundle (device.hardware_id is missing); re-export it with `tune export`."
        )
    if not isinstance(kernels, dict):
        raise TunesvcError(f"{path} is a damaged bundle (kernels is missing); re-export it with `tune export`.")
    if check_kernels:
        for name in kernels:
            kernel_configs(path, data, name)
    return data


def kernel_configs(path: str | os.PathLike, data: dict[str, Any], name: str) -> dict[str, dict[str, Any]]:
    """Shape key -> config of kernel ``name`` in a bundle read by :func:`read_bundle` (checked)."""
    entry = data["kernels"][name]
    if (
        not isinstance(entry, dict)
        or not isinstance(entry.get("version"), str)
        or not isinstance(entry.get("winners"), dict)
    ):
        raise TunesvcError(
            f"{path} is a damaged bundle (kernels.{name} lacks a version or winners); re-export it with `tune export`."
        )
    winners = entry["winners"]
    try:
        if data["format_version"] == 1:
            table = {key: winner["config"] for key, winner in winners.items()}
            configs = table.values()
        else:
            configs = entry["configs"].values()
            table = {key: entry["configs"][winner["config"]] for key, winner in winners.items()}
    except (KeyError, TypeError, AttributeError):
        table = None
    # a set of types per config, not isinstance per value: a deployment loads 10,000s of winners
    if table is None or not all(type(c) is dict and set(map(type, c.values())) <= {int, str} for c in configs):
        raise TunesvcError(
            f"{path} is a damaged bundle (a winner of kernels.{name} has no valid config); re-export it with `tune export`."
        )
    return table


@dataclass(frozen=True)
class ImportChange:
    """What `tune import` did with one incoming winner."""

    source: str
    kernel: str
    version: str
    hardware_id: str
    shape_key: str
    action: str  # added | replaced | kept (the stored one is as fast or faster)
    incoming_ms: float
    stored_ms: float | None
    config: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def import_sources(store: Store, sources: list[str | os.PathLike]) -> list[ImportChange]:
    """Merge bundles (``*.json``) and databases (paths or URLs) into ``store``, in order.

    Conflict rule (see :meth:`tunesvc.store.Store.merge_winner`): for one kernel version,
    device hardware id and shape key, the faster measured time wins; a tie keeps the stored one.
    Every source is read and checked before anything is written.
    """
    incoming = [(str(source), _winners_of(source, store)) for source in sources]
    changes = []
    for source, winners in incoming:
        for kernel, version, device, key, config, time_ms in winners:
            action, stored_ms = store.merge_winner(kernel, version, device, key, config, time_ms, source)
            changes.append(
                ImportChange(source, kernel, version, device.hardware_id, key, action, time_ms, stored_ms, config)
            )
    return changes


def _winners_of(source: str | os.PathLike, target: Store) -> list[tuple]:
    """(kernel, version, device, shape key, config, ms) of every winner in a bundle or database."""
    from tunesvc.store import Store

    if str(source).endswith(".json"):
        return _bundle_winners(source, target)
    if "://" not in str(source) and not Path(source).exists():
        raise TunesvcError(f"No bundle or database at {source}; check the path.")
    store = Store(source, readonly=True)
    try:
        return [
            (e.kernel, e.kernel_version, d, e.shape_key, e.config, e.time_ms) for e, d in store.winners_with_devices()
        ]
    finally:
        store.close()


def _bundle_winners(path: str | os.PathLike, target: Store) -> list[tuple]:
    from tunesvc.device import Device

    bundle = read_bundle(path)
    info = bundle["device"]
    # a bundle names its device's model, not its limits: take those from a row of the same
    # hardware in the target, if there is one (so `tune lookup --device` keeps real limits)
    known = {d.hardware_id: d for d in target.devices()}.get(info["hardware_id"])
    out = []
    for kernel, section in sorted(bundle["kernels"].items()):
        if known is not None:
            fields = {f: getattr(known, f) for f in Device.__dataclass_fields__}
        else:
            capability = str(info.get("capability", "0.0"))
            fields = dict(
                kind="interpreter" if capability == "0.0" else "cuda",
                name=str(info.get("name", "")),
                capability=capability,
                sm_count=int(info.get("sm_count", 0)),
                memory_bytes=0,
                max_shared_memory=0,
                max_num_regs=0,
                driver="",
                cuda="",
            )
        device = Device(**{**fields, "torch": str(section.get("torch", "")), "triton": str(section.get("triton", ""))})
        if device.hardware_id != info["hardware_id"]:
            raise TunesvcError(
                f"{path} is a damaged bundle (its device fields do not give its hardware id); re-export it."
            )
        configs = kernel_configs(path, bundle, kernel)
        for key, winner in sorted(section["winners"].items()):
            time_ms = winner.get("time_ms")
            if not isinstance(time_ms, (int, float)) or not time_ms > 0:
                raise TunesvcError(
                    f"{path} is a damaged bundle (kernels.{kernel}.winners.{key} has no time_ms); re-export it."
                )
            out.append((kernel, section["version"], device, key, dict(configs[key]), float(time_ms)))
    return out
