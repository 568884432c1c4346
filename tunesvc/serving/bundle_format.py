"""The bundle format that serving reads: the winners of one device as a reviewable, diff-friendly
JSON file, checked against its schema before use.

Format (``format_version`` 2)::

    {"format": "tunesvc-bundle", "format_version": 2,
     "device": {"hardware_id": ..., "name": ..., "capability": ..., "sm_count": ...},
     "kernels": {"matmul": {"version": "<source hash>", "torch": ..., "triton": ...,
                            "configs": {"<config hash>": {...}},
                            "winners": {"<shape key>": {"config": "<config hash>", "time_ms": ...,
                                                         "heuristic_ms": ...}},
                            "selector": {...},
                            "eager_winners": {"<shape key>": {"config": "<config hash>", "time_ms": ...}}}}}

``heuristic_ms``, optional, is the time of the heuristic's config of that key on that device,
from the trial that measured it: the evidence a sibling model needs to be served the winner
blind (see tunesvc.serving.transfer). A tunesvc that predates it ignores it.

``selector``, optional, is the kernel's fitted selector on that device (see tunesvc.serving.selector):
feature names, candidate configs and a decision tree as plain arrays. Bundles without it load
as before, and a tunesvc that predates it ignores it.

``eager_winners``, optional, are the kernel's eager winners on that device (keys tuned with `tune
sweep --timing eager`: times of loops of ordinary launches, see tunesvc.bench), naming configs of
the same ``configs``; ``winners`` are the graph ones. The format version stays 2: a tunesvc that
predates them ignores them, and serves the graph winners.

Each distinct config is written once, under its :func:`~tunesvc.space.config_hash` (the store's
id for it), and winners name it: thousands of winners share a few hundred configs, and one small
object per winner instead of two is what keeps a 10,000-winner load under 50 ms. Version 1 (each
winner's config inline) is still read. Keys are sorted and the file is indented, so a re-tune
shows up as a readable diff.

Writing bundles (`tune export`) and merging them into a database (`tune import`) are
:mod:`tunesvc.bundle`'s, which reads them through this module.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

from tunesvc.errors import TunesvcError

FORMAT = "tunesvc-bundle"
FORMAT_VERSION = 2
#: bundle formats this version reads
READABLE = (1, 2)

#: bundles are JSON files of a few MB (10,000 winners: about 2 MB); anything far larger is not one
MAX_BUNDLE_BYTES = 256 << 20


def bundle_selector(bundle: dict[str, Any], template: Any, device: Any) -> dict[str, Any] | None:
    """The JSON of ``template``'s selector for ``device`` in a bundle read by :func:`read_bundle`
    (None: none, another device, or another kernel version); checked by tunesvc.serving.selector."""
    section = bundle.get("kernels", {}).get(template.name)
    if bundle.get("device", {}).get("hardware_id") != device.hardware_id or not isinstance(section, dict):
        return None
    if section.get("version") != template.version:
        return None
    return section.get("selector")


def bundle_device(path: Path) -> str | None:
    """The hardware id of the tunesvc bundle at ``path``; None when it is not one."""
    from tunesvc.files import read_regular

    try:
        data = json.loads(read_regular(path, MAX_BUNDLE_BYTES, "a bundle file"), parse_constant=_refuse_constant)
    except (OSError, ValueError, RecursionError, TunesvcError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("device"), dict):
        return None
    hardware_id = data["device"].get("hardware_id")
    return hardware_id if isinstance(hardware_id, str) else None


def read_bundle(path: str | os.PathLike, *, check_kernels: bool = True) -> dict[str, Any]:
    """Load and check a bundle; a corrupt or foreign file is one clear error.

    The JSON is read without its non-standard constants (NaN, Infinity) and checked against the
    bundle's schema (:func:`_schemas`, pydantic): the header here, each kernel's section in
    :func:`kernel_configs`. ``check_kernels=False`` checks only the header: the runtime checks one
    kernel's section when it loads it, not the sections of kernels it never launches.
    """
    from tunesvc.files import read_regular

    path = Path(path)
    try:
        if path.is_dir():
            raise TunesvcError(f"{path} is a folder; pass a bundle file (.json from `tune export`).")
        raw = read_regular(path, MAX_BUNDLE_BYTES, "a bundle file")  # a FIFO or /dev/zero is refused at once
    except FileNotFoundError:
        raise TunesvcError(f"No bundle at {path}; check the path or run `tune export`.") from None
    except OSError as exc:
        raise TunesvcError(f"Cannot read {path} ({exc.strerror or exc}); check the path.") from None
    if len(raw) > MAX_BUNDLE_BYTES:
        raise TunesvcError(f"{path} is over {MAX_BUNDLE_BYTES >> 20} MiB, not a tunesvc bundle; check the path.")
    try:
        data = json.loads(raw, parse_constant=_refuse_constant)
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
        raise TunesvcError(f"{path} is not valid JSON ({exc}); re-export it with `tune export`.") from None
    except RecursionError:
        raise TunesvcError(f"{path} is not valid JSON (nested too deeply); re-export it with `tune export`.") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TunesvcError(f"{path} is not a tunesvc bundle; re-export it with `tune export`.")
    if data.get("format_version") not in READABLE or type(data.get("format_version")) is not int:
        raise TunesvcError(
            f"{path} has bundle format {str(data.get('format_version'))[:20]}, this tunesvc reads "
            f"{' and '.join(map(str, READABLE))}; re-export it with this tunesvc's `tune export`."
        )
    _validate(_schemas()["header"], data, path, "")
    if check_kernels:
        for name, section in data["kernels"].items():
            kernel_configs(path, data, name)
            if section.get("selector") is not None:
                # checked here, not in kernel_configs: the runtime drops a damaged selector alone
                from tunesvc.serving.selector import Selector

                Selector.from_dict(section["selector"], f"{path}: kernels.{name}.selector")
    return data


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _validate(schema: Any, data: Any, path: Path | str | os.PathLike, where: str, what: str = "") -> Any:
    """``data`` checked by a pydantic schema; its first problem as one line naming the field."""
    from pydantic import ValidationError

    try:
        return schema.validate_python(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in (where, *error["loc"]) if part not in ("", "[key]"))[:200]
        message = error["msg"].removeprefix("Value error, ")
        detail = f"{what}: " if what else ""
        raise TunesvcError(
            f"{path} is a damaged bundle ({detail}{field or 'its top level'}: {message}); re-export it with `tune export`."
        ) from None
    except RecursionError:
        raise TunesvcError(
            f"{path} is a damaged bundle (nested too deeply); re-export it with `tune export`."
        ) from None


def kernel_configs(
    path: str | os.PathLike, data: dict[str, Any], name: str, timing: str = "graph"
) -> dict[str, dict[str, Any]]:
    """Shape key -> config of kernel ``name`` in a bundle read by :func:`read_bundle` (checked):
    its graph ``winners``, or with ``timing="eager"`` its ``eager_winners`` (none in format 1)."""
    graph, eager = kernel_tables(path, data, name)
    return graph if timing == "graph" else eager


def kernel_tables(
    path: str | os.PathLike, data: dict[str, Any], name: str
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """(graph winners, eager winners) of kernel ``name``, shape key -> config, from one check of
    its section.

    Checked against the section's schema: every config a non-empty table of parameter names
    to whole numbers or short texts, every winner naming a config of the section and giving a
    finite positive time. Whether a config lies in the kernel's space is the runtime's check
    (it knows the kernel; see tunesvc.serving.runtime).
    """
    schemas = _schemas()
    version = data["format_version"]
    section = _validate(
        schemas[f"section{version}"],
        data["kernels"][name],
        path,
        f"kernels.{name}",
        f"a winner of kernels.{name} has no valid config" if isinstance(data["kernels"][name], dict) else "",
    )
    raw = data["kernels"][name]
    if version == 1:
        return {key: raw["winners"][key]["config"] for key in section.winners}, {}
    configs = raw["configs"]
    tables = []
    for field, winners in (("winners", section.winners), ("eager_winners", section.eager_winners)):
        missing = next((key for key, w in winners.items() if w.config not in configs), None)
        if missing is not None:
            raise TunesvcError(
                f"{path} is a damaged bundle (a winner of kernels.{name} has no valid config: {field}.{missing[:120]}"
                f" names config {winners[missing].config[:40]}, which the bundle lacks); re-export it with `tune export`."
            )
        tables.append({key: configs[w.config] for key, w in winners.items()})
    return tables[0], tables[1]


@functools.cache
def _schemas() -> dict[str, Any]:
    """The bundle's pydantic schemas (built on first use): the header, a kernel's section of each format."""
    from typing import Annotated
    from typing import Literal

    from pydantic import BaseModel
    from pydantic import ConfigDict
    from pydantic import Field
    from pydantic import StringConstraints
    from pydantic import TypeAdapter

    # a config, a shape key and a time as the store's rows are checked (tunesvc.checks)
    from tunesvc.schemas import Config
    from tunesvc.schemas import Key
    from tunesvc.schemas import Time

    Text = Annotated[str, StringConstraints(max_length=256)]

    class Strict(BaseModel):
        model_config = ConfigDict(strict=True, extra="ignore")

    class Device(Strict):
        hardware_id: Annotated[str, StringConstraints(min_length=1, max_length=256)]
        name: Text = ""
        capability: Annotated[str, StringConstraints(pattern=r"^[0-9]{1,2}\.[0-9]{1,2}$")] = "0.0"
        sm_count: Annotated[int, Field(ge=0, le=1 << 20)] = 0

    class Header(Strict):
        format: Literal["tunesvc-bundle"]
        format_version: Literal[1, 2]
        device: Device
        kernels: dict[Text, Any]

    class Section(Strict):
        version: Annotated[str, StringConstraints(min_length=1, max_length=64)]
        torch: Text = ""
        triton: Text = ""

    class WinnerRef(Strict):
        config: Annotated[str, StringConstraints(max_length=64)]
        time_ms: Time
        heuristic_ms: Time | None = None

    class Section2(Section):
        configs: dict[Annotated[str, StringConstraints(max_length=64)], Config]
        winners: dict[Key, WinnerRef]
        eager_winners: dict[Key, WinnerRef] = {}

    class Winner1(Strict):
        config: Config
        time_ms: Time

    class Section1(Section):
        winners: dict[Key, Winner1]

    return {"header": TypeAdapter(Header), "section1": TypeAdapter(Section1), "section2": TypeAdapter(Section2)}
