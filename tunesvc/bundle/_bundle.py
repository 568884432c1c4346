"""Deployment bundles: export (one JSON file per device, in the format of
:mod:`tunesvc.serving.bundle_format`, which serving reads) and import (:func:`import_sources`
merges bundles and databases into a database; faster measured wins).
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import asdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from tunesvc.errors import TunesvcError
from tunesvc.serving.bundle_format import FORMAT
from tunesvc.serving.bundle_format import FORMAT_VERSION
from tunesvc.serving.bundle_format import bundle_device
from tunesvc.serving.bundle_format import kernel_tables
from tunesvc.serving.bundle_format import read_bundle
from tunesvc.space import config_hash

if TYPE_CHECKING:
    from tunesvc.store import Store


def build_bundles(store: Store, kernel: str | None = None, hardware_id: str | None = None) -> dict[str, dict[str, Any]]:
    """One bundle per device hardware id in the store (filtered by kernel / device).

    Where a kernel was tuned in several versions, a bundle holds the most recently tuned one;
    where several software stacks tuned one key, the newest measurement. Graph winners are a
    section's ``winners``, eager ones its ``eager_winners`` (only where it has any).
    """
    devices = {d.hardware_id: d for d in store.devices()}  # later rows win: the newest software
    entries = sorted(
        store.winners(kernel=kernel, hardware_id=hardware_id, timing=None), key=lambda e: (e.updated_at, e.timing)
    )
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
        table = section["winners"] if entry.timing == "graph" else section.setdefault("eager_winners", {})
        table[entry.shape_key] = {"config": digest, "time_ms": round(entry.time_ms, TIME_DECIMALS)}
    for hardware_id, bundle in bundles.items():
        for name, section in bundle["kernels"].items():
            selector = store.selector(name, section["version"], hardware_id)
            if selector is not None:
                section["selector"] = selector
            for key, ms in heuristic_times(store, name, section, devices[hardware_id]).items():
                section["winners"][key]["heuristic_ms"] = round(ms, TIME_DECIMALS)
    return bundles


def heuristic_times(store: Store, kernel: str, section: dict[str, Any], record: Any) -> dict[str, float]:
    """Shape key -> the stored time of the heuristic's config of that key, of a bundle's section
    of ``kernel`` on the device of ``record``: the evidence a sibling model is served a winner
    on (tunesvc.serving.transfer). None for a kernel not importable here (a captured kernel: its
    first listed config is its module's), or whose code is not the section's version."""
    from tunesvc.device import Device
    from tunesvc.serving.source import heuristic_at
    from tunesvc.template import template_named_by_data

    try:
        template = template_named_by_data(kernel)
        if template.version != section["version"]:  # another version's heuristic may be another config
            return {}
    except (TunesvcError, ImportError, AttributeError):  # a registered template that does not load here
        return {}
    device = Device(**{f: getattr(record, f) for f in Device.__dataclass_fields__})
    hashes = {key: config_hash(c) for key in section["winners"] if (c := heuristic_at(template, key, device))}
    times = store.trial_times(kernel, section["version"], record.hardware_id, hashes=set(hashes.values()))
    return {key: ms for key, digest in hashes.items() if (ms := times.get(key, {}).get(digest)) is not None}


#: the most characters of a hardware id a bundle's file name keeps (file names end at 255 bytes)
MAX_NAME = 120


def bundle_filename(hardware_id: str) -> str:
    """The file a device's bundle gets in an --out folder: its hardware id with every character
    but letters, digits, ``_``, ``.`` and ``-`` made ``_``
    (``NVIDIA H100 80GB HBM3|sm_90|132SM`` -> ``NVIDIA_H100_80GB_HBM3_sm_90_132SM.json``); a
    long or empty one gets a short hash of the id (see :func:`bundle_filenames`)."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", hardware_id).strip("_.")
    if not stem or len(stem) > MAX_NAME:
        return _hashed_filename(hardware_id)
    return stem + ".json"


def _hashed_filename(hardware_id: str) -> str:
    """``bundle_filename`` with a short hash of the real id: ``GPU_a_b-3f2a9c1d.json``."""
    import hashlib

    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", hardware_id).strip("_.")[:MAX_NAME] or "device"
    return f"{stem}-{hashlib.sha256(hardware_id.encode()).hexdigest()[:8]}.json"


def bundle_filenames(hardware_ids: list[str]) -> dict[str, str]:
    """A distinct file name per device: where two ids give one name (``GPU a/b`` and ``GPU a_b``;
    ``GPU A`` and ``GPU a`` on a file system that ignores case), each gets a hash of its id."""
    plain = {hw: bundle_filename(hw) for hw in hardware_ids}
    counts: dict[str, int] = {}
    for name in plain.values():
        counts[name.casefold()] = counts.get(name.casefold(), 0) + 1
    return {hw: name if counts[name.casefold()] == 1 else _hashed_filename(hw) for hw, name in plain.items()}


def _holds_bundle_of(hardware_id: str, path: Path) -> bool:
    return bundle_device(path) == hardware_id


def write_bundles(bundles: dict[str, dict[str, Any]], out: str | os.PathLike) -> list[Path]:
    """Write to ``out``: a .json file for one device, else a folder with one file per device.

    A file is written whole (:func:`tunesvc.files.write_atomically`) and replaces only a tunesvc
    bundle: in a folder, the bundle of the same device (a bundle of another device whose id
    gives the same file name is kept, and the new one is named with a hash of its id); a .json
    file named by --out, any bundle (a link named by --out is followed: the user named it). A
    link, a folder or another file at a target is refused, and nothing is written.
    """
    from tunesvc.files import check_replaceable
    from tunesvc.files import write_atomically

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
        if out.is_dir():
            raise TunesvcError(f"{out} is a folder; give --out a .json file name, or a folder without .json.")
        named = Path(os.path.realpath(out))  # a link the user names is written through, to its target
        if not named.parent.is_dir():
            raise TunesvcError(f"Cannot write {out}: folder {out.parent} does not exist.")
        check_replaceable(named, lambda p: bundle_device(p) is not None, "tunesvc bundle")
        targets = {named: next(iter(bundles.values()))}
        shown = {named: out}
    else:
        if out.exists() and not out.is_dir():
            raise TunesvcError(f"{out} is a file, not a folder; give --out a folder, or a name ending in .json.")
        names = bundle_filenames(list(bundles))
        targets = {}
        for hardware_id, bundle in bundles.items():
            path = out / names[hardware_id]
            held = bundle_device(path) if path.is_file() and not path.is_symlink() else None
            if held is not None and held != hardware_id:  # another device's bundle of the same file name
                path = out / _hashed_filename(hardware_id)
            check_replaceable(path, functools.partial(_holds_bundle_of, hardware_id), f"bundle of {hardware_id}")
            targets[path] = bundle
        shown = {path: path for path in targets}
    try:
        if out.suffix != ".json":
            out.mkdir(parents=True, exist_ok=True)
        for path, bundle in targets.items():
            write_atomically(path, json.dumps(bundle, indent=2, sort_keys=True) + "\n")
    except OSError as exc:
        raise TunesvcError(f"Cannot write the bundle to {out} ({exc.strerror or exc}); check --out.") from None
    return [shown[path] for path in targets]


@dataclass(frozen=True)
class ImportChange:
    """What `tune import` did with one incoming winner."""

    source: str
    kernel: str
    version: str
    hardware_id: str
    shape_key: str
    action: str  # added | replaced (by another config) | kept (the stored one is as fast, or the same config)
    incoming_ms: float
    stored_ms: float | None
    config: dict[str, int]
    #: the timing it was chosen under (graph | eager): compared with the stored winners of that timing only
    timing: str = "graph"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SelectorChange:
    """What `tune import` did with one incoming selector."""

    source: str
    kernel: str
    version: str
    hardware_id: str
    action: str  # added | kept (one is stored: it was fitted on the target's own trials)
    keys: int  # tuned shape keys the incoming selector was fitted on

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Imported:
    """Everything `tune import` did: each incoming winner and each incoming selector."""

    winners: list[ImportChange]
    selectors: list[SelectorChange]


#: the decimals of a winner's time (ms) in a bundle: 1 ns, below any timing's noise
TIME_DECIMALS = 6


def import_sources(store: Store, sources: list[str | os.PathLike]) -> Imported:
    """Merge bundles (``*.json``) and databases (paths or URLs) into ``store``, in order.

    Conflict rule (see :meth:`tunesvc.store.Store.merge_winner`): for one kernel version,
    device hardware id and shape key, the faster measured time wins; a tie keeps the stored one.
    Graph and eager winners are merged each with the stored winners of its own timing.
    Times are compared as a bundle keeps them (:data:`TIME_DECIMALS`): a winner exported and
    imported again is kept, not "replaced" by its own rounded time. A winner is replaced only
    where what is served changes: an incoming winner of the stored winner's config is kept
    whatever its time (the same answer, timed elsewhere), so the counts say how many keys serve
    another config.
    A selector is taken where the target has none for its kernel version and device model
    (:meth:`tunesvc.store.Store.merge_selector`). Every source is read and checked before
    anything is written.
    """
    incoming = [(str(source), *_read_source(source, store)) for source in sources]
    for source, winners, selectors in incoming:
        _check_spaces(source, winners, selectors)
    changes, taken = [], []
    # the best stored time of each (kernel, version, hardware id, key) that an import may meet
    # and its config's hash
    best: dict[tuple[str, str, str, str, str], tuple[float, str]] = {}
    for kernel, version in {(w[0], w[1]) for _, winners, _ in incoming for w in winners}:
        for w in store.winners(kernel=kernel, version=version, timing=None):
            where = (kernel, version, w.hardware_id, w.shape_key, w.timing)
            best[where] = min(best.get(where, (w.time_ms, config_hash(w.config))), (w.time_ms, config_hash(w.config)))
    for source, winners, selectors in incoming:
        for kernel, version, device, key, config, time_ms, timing in winners:
            where = (kernel, version, device.hardware_id, key, timing)
            stored = best.get(where)
            stored_ms: float | None = stored[0] if stored is not None else None
            if stored is not None and (
                not time_ms < round(stored[0], TIME_DECIMALS) or config_hash(config) == stored[1]
            ):
                action = "kept"  # as fast as stored at the precision a bundle keeps, or the same config
            else:
                action, stored_ms = store.merge_winner(
                    kernel, version, device, key, config, time_ms, source, timing=timing
                )
                if action != "kept":
                    best[where] = (time_ms, config_hash(config))
            changes.append(
                ImportChange(
                    source, kernel, version, device.hardware_id, key, action, time_ms, stored_ms, config, timing
                )
            )
        for selector in selectors:
            data = selector.to_dict()
            action = store.merge_selector(selector.kernel, selector.version, selector.hardware_id, data, selector.keys)
            taken.append(
                SelectorChange(source, selector.kernel, selector.version, selector.hardware_id, action, selector.keys)
            )
    return Imported(changes, taken)


def _checked_selectors(found: list[tuple[str, str, str, Any, str]]) -> list[Any]:
    """(kernel, version, hardware id, JSON, where) of a source's selectors, each checked
    (tunesvc.serving.selector.Selector) and naming its own kernel version and device."""
    from tunesvc.serving.selector import Selector

    selectors = []
    for kernel, version, hardware_id, data, where in found:
        selector = Selector.from_dict(data, where)
        if (selector.kernel, selector.version, selector.hardware_id) != (kernel, version, hardware_id):
            raise TunesvcError(
                f"{where} is damaged (it names {selector.kernel} {selector.version} on {selector.hardware_id}); "
                "refit it with `tune selector`, or re-export the source."
            )
        selectors.append(selector)
    return selectors


def _check_spaces(source: str, winners: list[tuple], selectors: list[Any]) -> None:
    """Refuse a winner, or a selector's candidate, whose config is not in its kernel's space,
    where the kernel is known here (shipped or an entry point: never a module the data names)
    in the same version."""
    from tunesvc.template import template_named_by_data

    spaces: dict[tuple[str, str], Any] = {}
    configs = [
        (kernel, version, f"the winner of {kernel} for {key[:200]}", config)
        for kernel, version, _, key, config, _, _ in winners
    ]
    for selector in selectors:
        what = f"a candidate of {selector.kernel}'s selector"
        configs += [(selector.kernel, selector.version, what, config) for config in selector.candidates]
    for kernel, version, what, config in configs:
        if (kernel, version) not in spaces:
            try:
                template = template_named_by_data(kernel)
                spaces[(kernel, version)] = template.space if template.version == version else None
            except TunesvcError:
                spaces[(kernel, version)] = None  # a kernel unknown here: nothing to check against
        space = spaces[(kernel, version)]
        why = space.stored_config(config) if space is not None else None
        if isinstance(why, str):
            raise TunesvcError(f"{source}: {what} is outside its space ({why}); re-tune it or re-export the source.")


def _read_source(source: str | os.PathLike, target: Store) -> tuple[list[tuple], list[Any]]:
    """Every winner of a bundle or database, as (kernel, version, device, shape key, config, ms,
    timing), and its selectors (checked); each source is read once."""
    from tunesvc.store import Store

    if str(source).endswith(".json"):
        return _bundle_contents(source, target)
    if "://" not in str(source) and not Path(source).exists():
        raise TunesvcError(f"No bundle or database at {source}; check the path.")
    store = Store(source, readonly=True)
    try:
        winners = [
            (e.kernel, e.kernel_version, d, e.shape_key, e.config, e.time_ms, e.timing)
            for e, d in store.winners_with_devices(timing=None)
        ]
        found = []
        for kernel, version, hardware_id in sorted({(w[0], w[1], w[2].hardware_id) for w in winners}):
            data = store.selector(kernel, version, hardware_id)
            if data is not None:
                found.append(
                    (kernel, version, hardware_id, data, f"the selector of {kernel} {version} in {store.where}")
                )
    finally:
        store.close()
    return winners, _checked_selectors(found)


def _bundle_contents(path: str | os.PathLike, target: Store) -> tuple[list[tuple], list[Any]]:
    from tunesvc.device import Device

    bundle = read_bundle(path)
    info = bundle["device"]
    found = [
        (kernel, section["version"], info["hardware_id"], section["selector"], f"{path}: kernels.{kernel}.selector")
        for kernel, section in sorted(bundle["kernels"].items())
        if section.get("selector") is not None
    ]
    # a bundle names its device's model, not its limits: take those from a row of the same
    # hardware in the target, if there is one (so `tune lookup --device` keeps real limits)
    known = {d.hardware_id: d for d in target.devices()}.get(info["hardware_id"])
    out = []
    for kernel, section in sorted(bundle["kernels"].items()):
        if known is not None:
            fields = {f: getattr(known, f) for f in Device.__dataclass_fields__}
        else:
            capability = info.get("capability", "0.0")  # checked by the bundle's schema (read_bundle)
            fields = dict(
                kind="interpreter" if capability == "0.0" else "cuda",
                name=info.get("name", ""),
                capability=capability,
                sm_count=info.get("sm_count", 0),
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
        graph, eager = kernel_tables(path, bundle, kernel)
        for timing, configs, raw in (
            ("graph", graph, section["winners"]),
            ("eager", eager, section.get("eager_winners", {})),
        ):
            for key, winner in sorted(raw.items()):
                # time_ms: a finite positive number, checked by the section's schema (kernel_tables)
                time_ms = float(winner["time_ms"])
                out.append((kernel, section["version"], device, key, dict(configs[key]), time_ms, timing))
    return out, _checked_selectors(found)
