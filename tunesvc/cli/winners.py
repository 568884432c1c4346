"""`tune show` and `tune lookup`: the stored winners of each kernel, and the config the runtime
would launch with for one shape (a captured kernel's too) and how it was found."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Annotated
from typing import Any

import typer
from rich.text import Text

from tunesvc.cli._common import DbOption
from tunesvc.cli._common import JsonOption
from tunesvc.cli._common import KernelFilter
from tunesvc.cli._common import TextConsole
from tunesvc.cli._common import _complete_kernel
from tunesvc.cli._common import _config_text
from tunesvc.cli._common import _count
from tunesvc.cli._common import _kernel_filter
from tunesvc.cli._common import _keyed_table
from tunesvc.cli._common import _nothing_matches
from tunesvc.cli._common import _print_json
from tunesvc.cli._common import _short
from tunesvc.cli._common import app
from tunesvc.cli._common import console
from tunesvc.cli._common import user_errors
from tunesvc.cli._common import whole_lines
from tunesvc.cli._common import wide_when_piped
from tunesvc.errors import TunesvcError
from tunesvc.text import natural_order
from tunesvc.text import visible

if TYPE_CHECKING:
    from tunesvc.records import RejectedTrials
    from tunesvc.serving.source import WinnerSource
    from tunesvc.serving.transfer import SiblingTable
    from tunesvc.space import Config


@app.command()
@user_errors
def show(
    kernel: KernelFilter = None,
    device: Annotated[
        str | None, typer.Option(help="Only devices whose name or hardware id contains this text.")
    ] = None,
    shape: Annotated[
        str | None, typer.Option(help="Only shape keys that contain this text, e.g. M=4096 or bfloat16.")
    ] = None,
    all_versions: Annotated[
        bool,
        typer.Option(
            "--all-versions", help="Also the winners of older kernel versions (lookups use the current one's)."
        ),
    ] = False,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show the stored winners of each kernel's current version, one table per device and kernel, and how many of its candidates were rejected as wrong results and why; filters that match nothing exit with an error."""
    from tunesvc.store import Store  # SQLAlchemy

    kernel = _kernel_filter(kernel)
    store = Store(db, readonly=True)
    try:
        winners = store.winners(kernel=kernel, device=device, shape=shape, timing=None)
        counts = store.trial_counts(kernel=kernel, device=device, shape=shape)
        rejected = {
            (r.kernel, r.kernel_version, r.hardware_id): r for r in store.rejected_trials(kernel, device, shape)
        }
        if not winners and (kernel or device or shape):
            raise _nothing_matches(store, "winners", kernel=kernel, device=device, shape=shape)
    finally:
        store.close()
    current = _current_versions(winners)
    older = [w for w in winners if w.kernel_version != current[w.kernel][0]]
    shown = winners if all_versions else [w for w in winners if w.kernel_version == current[w.kernel][0]]
    if as_json:
        return _print_json(
            {
                "winners": [{**w.to_dict(), "current": w.kernel_version == current[w.kernel][0]} for w in shown],
                "trials": counts,
                "rejected": [_rejected_json(r) for r in rejected.values() if r.rejected],
            }
        )
    # a row per key, whole, to a pipe or a file (grep reads it); a terminal's width where there is one
    out = wide_when_piped(TextConsole())
    for hardware_id in sorted({w.hardware_id for w in shown}):
        on_device = [w for w in shown if w.hardware_id == hardware_id]
        out.print(Text(visible(f"Winners on {hardware_id}"), style="bold"), highlight=False, soft_wrap=whole_lines(out))
        for name in sorted({w.kernel for w in on_device}):
            newest: dict[str, float] = {}  # version -> its newest winner's time
            for w in on_device:
                if w.kernel == name:
                    newest[w.kernel_version] = max(newest.get(w.kernel_version, 0.0), w.updated_at.timestamp())
            # the current version first, then the newest
            versions = sorted(newest, key=lambda v: (v != current[name][0], -newest[v]))
            for version in versions:
                rows = sorted(
                    (w for w in on_device if w.kernel == name and w.kernel_version == version),
                    key=lambda w: (natural_order(w.shape_key), w.timing != "graph"),
                )
                if version != current[name][0]:
                    which = "older version, not used by lookups"
                elif current[name][1]:
                    which = "current version, used by lookups"
                else:  # a captured kernel or a template this command does not import
                    which = "newest stored version, used by lookups"
                out.print(
                    _keyed_table(
                        f"{name} {version} ({which})",
                        ["shape key", "timing", "config", "ms"],
                        [
                            [w.shape_key, w.timing, _config_text(w.config), f"{w.time_ms:.4g} ±{w.noise:.0%}"]
                            for w in rows
                        ],
                    )
                )
                said = rejected.get((name, version, hardware_id))
                if said is not None and said.rejected:
                    out.print(Text(visible(_rejected_line(said))), highlight=False)
    failed = sum(n for status, n in counts.items() if status != "ok")
    hidden = f" ({len(older)} of older kernel versions: --all-versions)" if older and not all_versions else ""
    out.print(
        f"{_count(len(shown), 'winner')}{hidden}; {_count(sum(counts.values()), 'trial')}, "
        f"{failed} failed or invalid, in {store.shown_url}.",
        highlight=False,
        soft_wrap=whole_lines(out),
    )


def _rejected_line(rejected: RejectedTrials) -> str:
    """How many of a kernel version's candidates were stored as wrong results, and why: a user
    sees when most of a space could never win."""
    reasons = "; ".join(f"{n} for {reason} (most often '{said}')" for reason, n, said in rejected.reasons())
    return f"{rejected.rejected} of {_count(rejected.trials, 'candidate')} rejected as wrong results: {reasons}"


def _rejected_json(rejected: RejectedTrials) -> dict[str, Any]:
    return {
        "kernel": rejected.kernel,
        "kernel_version": rejected.kernel_version,
        "hardware_id": rejected.hardware_id,
        "trials": rejected.trials,
        "wrong_result": rejected.rejected,
        "reasons": [{"reason": r, "trials": n, "example": example} for r, n, example in rejected.reasons()],
    }


def _current_versions(winners: list) -> dict[str, tuple[str, bool]]:
    """Per kernel of ``winners``: the version lookups use, and whether it is the installed code's.

    A shipped or registered template's version is its code's hash. A captured kernel or a
    template named by module path is not imported for a listing (stored names never choose a
    module to import): its newest stored version stands for it, as in lookups of captured kernels.
    """
    from tunesvc.template import template_named_by_data  # a registered template's module may import torch

    out: dict[str, tuple[str, bool]] = {}
    for name in {w.kernel for w in winners}:
        try:
            out[name] = (template_named_by_data(name).version, True)
        except (TunesvcError, ImportError, AttributeError):  # a registered template that does not load here
            newest = max((w for w in winners if w.kernel == name), key=lambda w: w.updated_at)
            out[name] = (newest.kernel_version, False)
    return out


@app.command()
@user_errors
def lookup(
    kernel: Annotated[
        str,
        typer.Argument(
            help="Kernel name (the library's, such as layer_norm, too) or module:attribute.",
            autocompletion=_complete_kernel,
        ),
    ],
    shape: Annotated[str, typer.Option("--shape", "-s", help="The problem, e.g. 1000x3000x777.")],
    dtype: Annotated[str, typer.Option(help="float16, bfloat16 or float32.")] = "float16",
    db: DbOption = None,
    bundle: Annotated[Path | None, typer.Option(help="Read winners from this bundle instead of a database.")] = None,
    device: Annotated[
        str | None, typer.Option(help="Answer for a device stored in --db (name or hardware id), not this one.")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """The config the runtime would launch with on this device, and how it was found."""
    # the runtime reads the database (SQLAlchemy) where there is one; a shipped template imports
    # neither torch nor Triton, and the interpreter's device is read without them
    from tunesvc.serving.runtime import Runtime
    from tunesvc.template import ShapeKey
    from tunesvc.template import get_template

    if ":" in kernel and _captured_lookup(kernel, shape, db, bundle, as_json, device):
        return
    template = get_template(kernel)
    problem = template.parse_shape(shape, dtype)
    target = None
    if device is not None:
        from tunesvc.store import Store  # SQLAlchemy: only a database names other devices

        target = Store(db, readonly=True).find_device(device)
    # no --db: like the runtime, use ./tune.db if there is one, else the heuristic
    runtime = Runtime(db=db, bundle=bundle, device=target, strict=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="tunesvc: no tuned config")  # the answer below says so
        result = runtime.lookup(template, **problem)
    bucketed = _bucketing(problem, result.key)
    # tuned keys of another dtype that this lookup cannot use: a lookup without --dtype is float16's
    other_dtypes: dict[str, int] = {}
    if result.source != "exact":
        for stored in runtime.tuned_keys(template):
            other = dict(ShapeKey.parse(stored).fields).get("dtype")
            if other is not None and other != problem["dtype"]:
                other_dtypes[other] = other_dtypes.get(other, 0) + 1
    if as_json:
        return _print_json(
            {**result.to_dict(), "read": runtime.where(), "bucketed": bucketed, "other_dtypes": other_dtypes}
        )
    rounded = [
        f"{dim}={given} rounded up to the power of two {to} (every {dim} from {to // 2 + 1} to {to} shares it)"
        if to & (to - 1) == 0 and given < to
        else f"{dim}={given} bucketed to {to}"
        for dim, (given, to) in bucketed.items()
    ]
    how = f"{'; '.join(rounded)}; other dims as given" if rounded else "every dim as given"
    console.print(f"key     {result.key}: {how}", highlight=False, soft_wrap=whole_lines(console))
    detail = ""
    if result.source == "nearest" and result.distance is not None:
        detail = (
            f": tuned key {result.matched_key}, {result.distance:.2f} doublings away "
            "(the distance between the keys' dims on a log2 scale)"
        )
    elif result.source == "transferred" and result.distance is not None:
        which = (
            "the same key"
            if result.distance == 0
            else f"tuned key {result.matched_key}, {result.distance:.2f} doublings away"
        )
        detail = (
            f": {result.transferred_from}'s winner of {which} (a sibling GPU model: same compute capability "
            "and SM count; TUNESVC_TRANSFER=0 turns this off)"
        )
    where = runtime.where()
    read = f"read from {where}" if where.startswith(("database", "bundle")) else where
    console.print(
        f"answer  {result.source} for {runtime.device.name}{detail}; {read}",
        highlight=False,
        soft_wrap=whole_lines(console),
    )
    console.print(f"config  {_config_text(result.config)}", highlight=False, soft_wrap=whole_lines(console))
    if result.source in ("transferred", "heuristic"):  # the answer line says why for the others; --json has it for all
        console.print(f"why     {result.reason}", highlight=False, soft_wrap=whole_lines(console))
    if other_dtypes:
        held = ", ".join(f"{_count(n, 'key')} in {dtype}" for dtype, n in sorted(other_dtypes.items()))
        first = sorted(other_dtypes, key=lambda d: -other_dtypes[d])[0]
        console.print(
            f"note    {template.name} is tuned on {runtime.device.name} for {held}, which a {problem['dtype']} "
            f"lookup does not use; pass --dtype {first} to look one of those up.",
            highlight=False,
            soft_wrap=whole_lines(console),
        )


def _bucketing(problem: dict[str, Any], key: str) -> dict[str, tuple[int, int]]:
    """The dims that a shape key rounds: {'M': (90, 128)} for matmul's 90x70x50."""
    from tunesvc.template import ShapeKey

    dims = dict(ShapeKey.parse(key).dims)
    return {
        dim: (value, dims[dim])
        for dim, value in problem.items()
        if dim in dims and isinstance(value, int) and dims[dim] != value
    }


def _captured_lookup(
    kernel: str, key: str, db: str | None, bundle: Path | None, as_json: bool, device_name: str | None = None
) -> bool:
    """`tune lookup module:qualname --shape KEY` of a captured kernel: the one chain's answer for
    that key text (``n=1000,x_ptr.dtype=float16``) read without importing the kernel: its stored
    winner, else the nearest stored key's, else a sibling GPU model's winner of its newest version
    (transferred). False when ``kernel`` is not a captured kernel of --db / --bundle."""
    from tunesvc._capture import CapturedKey
    from tunesvc._capture import CapturedTemplate
    from tunesvc.serving import chain
    from tunesvc.template import ShapeKey

    read = _captured_winners(kernel, db, bundle, device_name)
    if read is None:
        return False
    source, table, sibling = read
    device = source.device
    parsed: list[tuple[ShapeKey, str]] = [(CapturedKey.of(k), k) for k in table]

    def names(text: str) -> list[str]:
        return [part.partition("=")[0] for part in text.split(",")]

    known = table or (sibling.winners if sibling is not None else {})
    if key not in known and known and all(names(key) != names(k) for k in known):
        example = min(known, key=natural_order)
        raise TunesvcError(
            f"--shape '{_short(key)}' is not a whole key of {kernel}: its stored keys name "
            f"{', '.join(names(example))} (such as {_short(example)}); give every one."
        )
    # the one chain (its config list, and so its heuristic, is the module's: not read here)
    template = CapturedTemplate(kernel, "", [])
    moved: chain.Sibling | None = None
    if sibling is not None:
        moved = (sibling, [(CapturedKey.of(k), k) for k in sibling.winners])
    found = chain.answer(
        template, {"key": key}, template.key({"key": key}), device, table, lambda: parsed, sibling=lambda: moved
    )
    answered, matched, distance, reason = found.source, found.matched_key, found.distance, found.reason
    if answered == chain.HEURISTIC:
        answered, matched, distance = "first listed config", None, None
        reason = f"first listed config: {reason.partition(': ')[2]}"
        if moved is not None and found.reason != chain.NOTHING_TUNED and not moved[0].heuristic_ms:
            # the first listed config is the module's: its trials on the sibling cannot be told apart here
            reason += (
                f" Which config is {kernel}'s first listed one is not known without importing it; "
                "the runtime, which imports it, serves the sibling's winner where its trials say it wins."
            )
    result = {
        "kernel": kernel,
        "key": key,
        "source": answered,
        "matched_key": matched,
        "distance": distance,
        "config": found.config if matched else None,
        "transferred_from": found.transferred_from,
        "reason": reason,
    }
    if as_json:
        _print_json(result)
        return True
    detail = ""
    if answered == "nearest":
        detail = f": stored key {matched}, {distance:.2f} doublings away (the distance between the keys' numbers on a log2 scale)"
    elif answered == "transferred":
        which = "the same key" if distance == 0 else f"stored key {matched}, {distance:.2f} doublings away"
        detail = (
            f": {found.transferred_from}'s winner of {which} (a sibling GPU model: same compute capability "
            "and SM count; TUNESVC_TRANSFER=0 turns this off)"
        )
    console.print(f"key     {key}", highlight=False, soft_wrap=True)
    console.print(
        f"answer  {answered} for {device.name}{detail}; read from {source.where()}", highlight=False, soft_wrap=True
    )
    config = result["config"]
    shown = (
        _config_text(config)
        if isinstance(config, dict)
        else "the kernel's first config that its pruning keeps (not read here: that needs its module imported)"
    )
    console.print(f"config  {shown}", highlight=False, soft_wrap=True)
    if answered in ("transferred", "first listed config"):  # as for a shipped kernel: the answer line says the rest
        console.print(f"why     {reason}", highlight=False, soft_wrap=True)
    return True


def _captured_winners(
    kernel: str, db: str | None, bundle: Path | None, device_name: str | None
) -> tuple[WinnerSource, dict[str, Config], SiblingTable | None] | None:
    """The source, this device's winners and a sibling model's (None: none, or transfer off) of
    captured kernel ``kernel`` in --bundle or --db; None where it is not a captured kernel there
    (or the bundle is of neither this device nor a sibling). The kernel is not imported, so its
    version is unknown: the source's newest, unchecked against a space (its configs are the module's)."""
    from tunesvc import settings
    from tunesvc.device import current_device
    from tunesvc.serving.source import BundleSource
    from tunesvc.serving.source import DatabaseSource

    device = current_device()
    transfer = settings.transfer_enabled()
    if bundle is not None:
        from tunesvc.bundle import read_bundle

        in_bundle = BundleSource(bundle, device, data=read_bundle(bundle))  # every section checked
        if not in_bundle.captured(kernel):
            return None
        sibling = in_bundle.sibling_stored(kernel, None) if transfer else None
        if in_bundle.hardware_id != device.hardware_id and sibling is None:
            return None
        return in_bundle, in_bundle.stored(kernel, None), sibling
    from tunesvc.store import Store

    store = Store(db, readonly=True)
    try:
        if not DatabaseSource(store, device).captured(kernel):
            return None
        if device_name is not None:
            device = store.find_device(device_name)
        source = DatabaseSource(store, device)
        return source, source.stored(kernel, None), source.sibling_stored(kernel, None) if transfer else None
    finally:
        store.close()
