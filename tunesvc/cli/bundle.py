"""`tune export`, `tune import`, `tune verify`, `tune adopt` and `tune report`: winners written as bundles,
merged from bundles and databases, re-measured against the heuristic, adopted from another GPU
model, and reported as HTML."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Annotated
from typing import Any

import typer
from rich.text import Text

from tunesvc import settings
from tunesvc.cli._common import DbOption
from tunesvc.cli._common import JsonOption
from tunesvc.cli._common import KernelFilter
from tunesvc.cli._common import TextConsole
from tunesvc.cli._common import TimeLimitOption
from tunesvc.cli._common import _check_count
from tunesvc.cli._common import _count
from tunesvc.cli._common import _kernel_filter
from tunesvc.cli._common import _keyed_table
from tunesvc.cli._common import _ms
from tunesvc.cli._common import _nothing_matches
from tunesvc.cli._common import _print_json
from tunesvc.cli._common import app
from tunesvc.cli._common import console
from tunesvc.cli._common import named
from tunesvc.cli._common import user_errors
from tunesvc.cli._common import whole_lines
from tunesvc.errors import TunesvcError
from tunesvc.text import visible

if TYPE_CHECKING:
    from rich.progress import Progress


@app.command()
@user_errors
def export(
    out: Annotated[
        Path,
        typer.Option(
            help="A .json file (one device) or a folder (one file per device). A file is replaced only when it is a tunesvc bundle (in a folder: of the same device); links and other files are refused."
        ),
    ] = Path("tunesvc-bundles"),
    kernel: KernelFilter = None,
    device: Annotated[str | None, typer.Option(help="Only this device hardware id (see `tune show --json`).")] = None,
    db: DbOption = None,
) -> None:
    """Write the winners as JSON bundles for deployment (one per device)."""
    # the database (SQLAlchemy)
    from tunesvc.bundle import build_bundles
    from tunesvc.bundle import write_bundles
    from tunesvc.store import Store

    kernel = _kernel_filter(kernel)
    store = Store(db, readonly=True)
    try:
        bundles = build_bundles(store, kernel=kernel, hardware_id=device)
        if not bundles and (kernel or device):
            raise _nothing_matches(store, "winners", kernel=kernel, device=device)
    finally:
        store.close()
    for path in write_bundles(bundles, out):
        console.print(f"wrote {path}")


@app.command("import")
@user_errors
def import_(
    sources: Annotated[
        list[str], typer.Argument(help="Bundles (*.json from `tune export`) and databases (paths or URLs) to merge.")
    ],
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Merge bundles and databases into --db: per key the faster measured winner stays (a tie, or the same config, keeps --db's); selectors where --db has none."""
    # the databases (SQLAlchemy)
    from tunesvc.bundle import import_sources
    from tunesvc.store import Store

    paths: list[str | os.PathLike] = list(sources)
    store = Store(db)
    try:
        imported = import_sources(store, paths)
    finally:
        store.close()
    changes = imported.winners
    if as_json:
        return _print_json(
            {"winners": [c.to_dict() for c in changes], "selectors": [c.to_dict() for c in imported.selectors]}
        )
    # one table per source, device and kernel version: what repeats goes in the heading and title
    groups = [(c.source, c.hardware_id) for c in changes] + [(c.source, c.hardware_id) for c in imported.selectors]
    for source, hardware_id in dict.fromkeys(groups):
        console.print(
            Text(visible(f"From {source}, winners of {hardware_id}"), style="bold"),
            highlight=False,
            soft_wrap=whole_lines(console),
        )
        group = [c for c in changes if (c.source, c.hardware_id) == (source, hardware_id)]
        for kernel, version in dict.fromkeys((c.kernel, c.version) for c in group):
            table = _keyed_table(
                f"{kernel} {version}",
                ["shape key", "action", "incoming ms", "stored ms"],
                [
                    [
                        c.shape_key if c.timing == "graph" else f"{c.shape_key} (eager)",
                        c.action,
                        _ms(c.incoming_ms),
                        _ms(c.stored_ms),
                    ]
                    for c in group
                    if (c.kernel, c.version) == (kernel, version)
                ],
            )
            console.print(table)
        # selectors under their source's and device's heading: "matmul 5276d6e89cd5 added, ..."
        selectors = [c for c in imported.selectors if (c.source, c.hardware_id) == (source, hardware_id)]
        if selectors:
            kept = named(" (a stored selector is kept: `tune selector --cross-measure` refits it)")
            console.print(
                "Selectors: "
                + ", ".join(f"{c.kernel} {c.version} {c.action}" for c in selectors)
                + (kept if any(c.action == "kept" for c in selectors) else "")
                + ".",
                highlight=False,
                soft_wrap=whole_lines(console),
            )
    counts = {a: sum(c.action == a for c in changes) for a in ("added", "replaced", "kept")}
    console.print(
        f"{counts['added']} added, {counts['replaced']} replaced, {counts['kept']} kept in {store.shown_url}.",
        highlight=False,
        soft_wrap=whole_lines(console),
    )


def _key_progress() -> Progress:
    """A bar on stderr, gone when done: the key being judged (cut to fit, never wrapped), keys done
    of all, the time; fits 80 columns."""
    from rich.progress import BarColumn
    from rich.progress import MofNCompleteColumn
    from rich.progress import Progress
    from rich.progress import TextColumn
    from rich.progress import TimeElapsedColumn
    from rich.table import Column

    description = Column(no_wrap=True, overflow="ellipsis", ratio=1)
    return Progress(
        TextColumn("{task.description}", markup=False, table_column=description), BarColumn(bar_width=20),
        MofNCompleteColumn(), TimeElapsedColumn(),
        console=TextConsole(stderr=True), transient=True, expand=True,
    )  # fmt: skip


@app.command()
@user_errors
def verify(
    kernel: KernelFilter = None,
    margin: Annotated[
        float,
        typer.Option(
            help="Flag a winner when the heuristic is faster by more than this fraction, or when its time now and its stored time differ by more than it and by more than their spreads."
        ),
    ] = 0.05,
    retune: Annotated[
        bool,
        typer.Option(
            "--retune",
            help="Sweep flagged keys again and store the new winners (a captured kernel, named with --kernel: tuned again over its config list on its recorded call).",
        ),
    ] = False,
    budget: Annotated[int, typer.Option(help="New trials per key with --retune.")] = 8,
    drifted: Annotated[
        bool,
        typer.Option(
            "--drifted",
            help="Measure only the winners measured under another driver, CUDA, torch or Triton version than here (or on another GPU: --from-device), judged by their times alone; skip and count the others. Default: measure every winner, and flag those of another Triton stale.",
        ),
    ] = False,
    from_device: Annotated[
        str | None,
        typer.Option(
            "--from-device",
            help="Verify the winners of this stored device (its name or hardware id, as `tune show` lists them), measured here beside this device's heuristic. Default: this device's own.",
        ),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
    time_limit: TimeLimitOption = settings.REPLAY_TIME_LIMIT_S,
) -> None:
    """Re-measure this device's stored winners; flag stale ones (kernel or Triton changed), ones slower than the heuristic, and ones whose time moved from the stored one."""
    # re-measuring (torch, Triton); the database (SQLAlchemy)
    from tunesvc.device import current_device
    from tunesvc.store import Store
    from tunesvc.verify import FASTER_THAN_STORED
    from tunesvc.verify import drift_text
    from tunesvc.verify import verify as verify_winners

    _check_count("--budget", budget)
    kernel = _kernel_filter(kernel)
    store = Store(db, readonly=not retune)
    progress = _key_progress()
    task = progress.add_task("", total=None)

    def on_key(what: str, step: int, total: int) -> None:
        progress.update(task, description=what, completed=step, total=total)

    try:
        source = (
            store.find_device(from_device) if from_device is not None else None
        )  # before the bar: an error is one line
        with progress:  # on stderr: --json's output stays the JSON alone
            verdicts = verify_winners(
                store,
                kernel=kernel,
                margin=margin,
                retune=retune,
                budget=budget,
                progress=on_key,
                time_limit_s=time_limit,
                drifted=drifted,
                winners_of=from_device,
            )
        stored_on = sorted({w.device for w in store.winners(kernel=kernel)}) if not verdicts else []
        if kernel is not None and not verdicts and not stored_on:
            raise _nothing_matches(store, "winners", kernel=kernel)
    finally:
        store.close()
    if as_json:
        return _print_json([v.to_dict() for v in verdicts])
    here = current_device()
    of = source.name if source is not None else here.name
    which = f"{kernel} winners" if kernel else "winners"
    if not verdicts:
        elsewhere = f": it holds {', '.join(stored_on)} {which} only" if stored_on else ""
        measure_here = f", measure them here with --from-device '{stored_on[0]}'" if stored_on else ""
        return _say(
            f"No {which} of {of} in {store.shown_url} to verify{elsewhere} "
            f"(verify on {'that GPU' if len(stored_on) < 2 else 'one of those GPUs'}{measure_here}, "
            "or sweep this one with `tune sweep`)."
        )
    shown = [v for v in verdicts if not v.skipped]
    skipped = len(verdicts) - len(shown)
    if not shown:
        return _say(
            f"All {_count(skipped, which[:-1])} of {of} in {store.shown_url} were measured under "
            f"this device's driver, CUDA, torch and Triton versions: none drifted, none measured "
            "(verify without --drifted to measure them)."
        )
    title = f"Winners of {of} in {store.shown_url}" + (f", measured on {here.name}" if of != here.name else "")
    console.print(Text(visible(title), style="bold"), highlight=False, soft_wrap=whole_lines(console))
    drifts: dict[str, int] = {}
    for v in shown:
        if v.drift:
            drifts[drift_text(v.drift)] = drifts.get(drift_text(v.drift), 0) + 1
    for text, n in drifts.items():
        _say(f"Measured in another environment than this one ({_count(n, 'winner')}): {text}.")
    columns = ["shape key", "stored ms", "now ms", "heuristic ms", "flags", *(["retuned ms"] if retune else [])]
    for name, version in dict.fromkeys((v.kernel, v.version) for v in shown):
        rows = []
        for v in shown:
            if (v.kernel, v.version) != (name, version):
                continue
            flags = ", ".join(v.flags) + (f" ({v.detail})" if v.detail else "") if v.flags else "ok"
            rows.append(
                [
                    v.shape_key if v.timing == "graph" else f"{v.shape_key} (eager)",
                    _ms(v.stored_ms),
                    _ms(v.measured_ms),
                    _ms(v.heuristic_ms),
                    flags,
                    *([_ms(v.retuned_ms)] if retune else []),
                ]
            )
        console.print(_keyed_table(f"{name} {version}", columns, rows))
    flagged = sum(v.retunable for v in shown)
    faster = sum(FASTER_THAN_STORED in v.flags for v in shown)
    unjudged = len(shown) - sum(v.measured for v in shown)
    _say(
        f"{_count(len(shown), 'winner')} checked, {flagged} flagged"
        + (f", {faster} faster than stored (not retuned)" if faster else "")
        + (f", {unjudged} not measured (see their flags)" if unjudged else "")
        + (f"; {skipped} skipped: measured under this device's versions" if skipped else "")
        + "."
        + ("" if retune or not flagged else " Run with --retune to sweep the flagged ones again.")
    )


@app.command()
@user_errors
def adopt(
    from_device: Annotated[
        str,
        typer.Option(
            "--from-device",
            help="The stored GPU model whose winners to adopt (its name or hardware id, as `tune show` lists them): a sibling of this one (same architecture and SM count) is what they suit best.",
        ),
    ],
    kernel: KernelFilter = None,
    db: DbOption = None,
    as_json: JsonOption = False,
    time_limit: TimeLimitOption = settings.REPLAY_TIME_LIMIT_S,
) -> None:
    """Make another GPU model's winners this one's: per key, measure its winner, its winners of the nearest keys and the heuristic (3 at most), and store the fastest correct one, noting where it came from."""
    # measuring (torch, Triton); the database (SQLAlchemy)
    from tunesvc.adopt import OWN
    from tunesvc.adopt import adopt as adopt_winners
    from tunesvc.device import current_device
    from tunesvc.store import Store

    kernel = _kernel_filter(kernel)
    store = Store(db)
    progress = _key_progress()
    task = progress.add_task("", total=None)

    def on_key(what: str, step: int, total: int) -> None:
        progress.update(task, description=what, completed=step, total=total)

    try:
        source = store.find_device(from_device)  # before the bar: an error is one line
        with progress:  # on stderr: --json's output stays the JSON alone
            adoptions = adopt_winners(store, from_device, kernel=kernel, progress=on_key, time_limit_s=time_limit)
        if not adoptions:
            raise (
                _nothing_matches(store, "winners", kernel=kernel)
                if kernel
                else TunesvcError(f"{source.name} has no winners in {store.shown_url} to adopt.")
            )
    finally:
        store.close()
    if as_json:
        return _print_json([a.to_dict() for a in adoptions])
    here = current_device()
    title = f"Winners of {source.name} in {store.shown_url}, measured and adopted on {here.name}"
    console.print(Text(visible(title), style="bold"), highlight=False, soft_wrap=whole_lines(console))
    columns = ["shape key", "theirs ms", "heuristic ms", "adopted ms", "adopted"]
    for name, version in dict.fromkeys((a.kernel, a.version) for a in adoptions):
        rows = [
            [
                a.shape_key,
                _ms(a.theirs_ms),
                _ms(a.heuristic_ms),
                _ms(a.winner_ms),
                (a.chosen or "-") if a.adopted and not a.detail else a.detail or "-",
            ]
            for a in adoptions
            if (a.kernel, a.version) == (name, version)
        ]
        console.print(_keyed_table(f"{name} {version}", columns, rows))
    done = sum(a.adopted for a in adoptions)
    theirs = sum(a.adopted and a.chosen == OWN for a in adoptions)
    _say(
        f"{done} of {_count(len(adoptions), 'key')} adopted: {theirs} with {source.name}'s own winner of the key, "
        f"{done - theirs} with a nearer key's winner or the heuristic, measured faster here."
        + (f" {len(adoptions) - done} not adopted (see the table)." if done < len(adoptions) else "")
    )


def _say(line: str) -> None:
    """A message line: names of the database's (kernels, devices) printed as they are, whole
    lines to a pipe, word-wrapped at a terminal."""
    console.print(named(line), highlight=False, soft_wrap=whole_lines(console))


@app.command()
@user_errors
def report(
    db: DbOption = None,
    kernel: KernelFilter = None,
    out: Annotated[
        Path,
        typer.Option(
            help="Folder for report.html (figures embedded); an existing report.html is replaced only when it is a tunesvc report (a link or another file is refused)."
        ),
    ] = Path("tunesvc-report"),
    all_versions: Annotated[
        bool, typer.Option("--all-versions", help="Also the kernel versions lookups no longer use.")
    ] = False,
) -> None:
    """Write an HTML report: a summary, winners against the heuristic and torch, roofline, convergence, spread."""
    # the database (SQLAlchemy) and the figures (matplotlib); rich.progress only draws its bar
    from rich.progress import BarColumn
    from rich.progress import MofNCompleteColumn
    from rich.progress import Progress
    from rich.progress import TextColumn
    from rich.progress import TimeElapsedColumn

    from tunesvc.report import write_report
    from tunesvc.store import Store

    kernel = _kernel_filter(kernel)
    store = Store(db, readonly=True)
    progress = Progress(
        TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=TextConsole(stderr=True), transient=True,
    )  # fmt: skip
    tasks: dict[str, Any] = {}

    def on_progress(what: str, step: int, total: int) -> None:
        if what not in tasks:
            tasks[what] = progress.add_task(what, total=total)
        progress.update(tasks[what], completed=step, total=total)

    try:
        with progress:
            path = write_report(store, out, kernel=kernel, all_versions=all_versions, progress=on_progress)
    finally:
        store.close()
    console.print(f"wrote {path}")
