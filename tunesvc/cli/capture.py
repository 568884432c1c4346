"""`tune run` and `tune misses`: run a command with its triton.autotune kernels captured by
tunesvc, and list (or tune) the shape keys that captured kernels met with no stored winner."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from tunesvc import settings
from tunesvc.cli._common import DbOption
from tunesvc.cli._common import JsonOption
from tunesvc.cli._common import TextConsole
from tunesvc.cli._common import TimeLimitOption
from tunesvc.cli._common import _config_text
from tunesvc.cli._common import _count
from tunesvc.cli._common import _keyed_table
from tunesvc.cli._common import _print_json
from tunesvc.cli._common import app
from tunesvc.cli._common import console
from tunesvc.cli._common import named
from tunesvc.cli._common import user_errors
from tunesvc.cli._common import whole_lines
from tunesvc.errors import TunesvcError
from tunesvc.text import visible


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@user_errors
def run(
    command: Annotated[list[str] | None, typer.Argument(help="The command to run, after --.")] = None,
    mode: Annotated[
        str | None,
        typer.Option(
            help="tune (a miss is tuned and stored), lookup (serve; record misses), heuristic (the first config "
            "pruning keeps; nothing read) or off (Triton's own autotuner) \\[default: $TUNESVC_MODE, else lookup with "
            "--bundle alone, else tune]."
        ),
    ] = None,
    db: DbOption = None,
    bundle: Annotated[Path | None, typer.Option(help="Serve winners from this bundle (no database needed).")] = None,
    tune_misses: Annotated[
        bool,
        typer.Option("--tune-misses", help="Afterwards, tune the misses of the --kernel kernels recorded in --db."),
    ] = False,
    kernel: Annotated[
        list[str] | None,
        typer.Option(
            help="A kernel (module:qualname) whose misses --tune-misses tunes; imports its module. Repeatable."
        ),
    ] = None,
    compile_workers: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=settings.MAX_COMPILE_WORKERS,
            help="Processes that compile a long-tuning key's configs ahead of their measurement; 0: none "
            "\\[default: $TUNESVC_COMPILE_WORKERS, else on a GPU half the cores, at most 8].",
        ),
    ] = None,
    time_limit: TimeLimitOption = settings.REPLAY_TIME_LIMIT_S,
) -> None:
    """Run COMMAND with every triton.autotune kernel captured by tunesvc; exit with its exit code.

    Ends with one line on stderr over all of COMMAND's processes: kernels captured, keys served
    from the store, tuned (and their seconds), served untuned, and kernels left to Triton's own
    autotuner and why."""
    import os
    import tempfile

    from tunesvc._capture import summary_line
    from tunesvc._processes import run_command
    from tunesvc.settings import MODES

    if mode is not None and mode not in MODES:
        raise TunesvcError(f"Unknown mode '{mode}'; use one of {', '.join(MODES)}.")
    if not command and not tune_misses:
        raise TunesvcError("Give the command to run after --, e.g. `tune run -- python serve.py`.")
    code = 0
    if command:
        env = {**settings.environment(), "TUNESVC_CAPTURE": "1"}
        handle, summary = tempfile.mkstemp(prefix="tunesvc-summary-", suffix=".jsonl")
        os.close(handle)
        env["TUNESVC_SUMMARY_FILE"] = summary  # each captured process appends its record at exit
        env.pop("TUNESVC_SUMMARY", None)  # one line for the whole command, not one per process
        for name, value in (
            ("TUNESVC_MODE", mode),
            ("TUNESVC_DB", db),
            ("TUNESVC_BUNDLE", bundle),
            ("TUNESVC_COMPILE_WORKERS", compile_workers),
        ):
            if value is not None:
                env[name] = str(value)
        try:
            code = run_command(command, env)
        except OSError as exc:
            raise TunesvcError(f"Cannot run {command[0]}: {exc.strerror}.") from None
        finally:
            with open(summary) as f:
                records = [_summary_record(line) for line in f if line.strip()]
            os.unlink(summary)
        stderr = TextConsole(stderr=True)
        stderr.print(
            summary_line([r for r in records if r is not None]), highlight=False, soft_wrap=whole_lines(stderr)
        )
    if tune_misses and _tune_misses(db, kernel or [], time_limit):
        code = code or 1  # a key not tuned (said, one line each)
    raise typer.Exit(code)


def _summary_record(line: str) -> dict | None:
    """One process's summary record (None: a line cut short, by a process killed while writing it)."""
    import json

    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


@app.command()
@user_errors
def misses(
    kernel: Annotated[
        list[str] | None, typer.Option(help="Only this kernel (module:qualname); repeatable. --tune needs it.")
    ] = None,
    tune: Annotated[
        bool,
        typer.Option(
            "--tune", help="Tune this device's open misses of the --kernel kernels now (imports their modules)."
        ),
    ] = False,
    db: DbOption = None,
    as_json: JsonOption = False,
    time_limit: TimeLimitOption = settings.REPLAY_TIME_LIMIT_S,
) -> None:
    """List the shape keys captured kernels met with no stored winner in mode lookup (or tune them)."""
    if tune:
        if _tune_misses(db, kernel or [], time_limit):
            raise typer.Exit(1)  # a key not tuned (said, one line each)
        return
    from tunesvc.store import Store

    store = Store(db, readonly=True)
    try:
        stored = store.misses()
    finally:
        store.close()
    rows = [m for m in stored if not kernel or m.kernel in kernel]
    if kernel and not rows:
        from tunesvc.template import did_you_mean

        names = sorted({m.kernel for m in stored})
        hint = did_you_mean(kernel[0], names) if len(kernel) == 1 else ""
        held = (
            f"it holds misses of {_count(len(names), 'kernel')}, which `tune misses` lists"
            if names
            else "it holds no misses"
        )
        raise TunesvcError(f"No misses in {store.shown_url} of --kernel {', '.join(kernel)}{hint}; {held}.")
    if as_json:
        return _print_json(
            [
                {
                    "kernel": m.kernel,
                    "version": m.version,
                    "hardware_id": m.hardware_id,
                    "shape_key": m.shape_key,
                    "count": m.count,
                    "status": m.status,
                    "last_seen": m.last_seen.isoformat(),
                }
                for m in rows
            ]
        )
    for hardware_id in dict.fromkeys(m.hardware_id for m in rows):
        console.print(
            Text(visible(f"Misses of {hardware_id} in {store.shown_url}"), style="bold"),
            highlight=False,
            soft_wrap=whole_lines(console),
        )
        for name in dict.fromkeys(m.kernel for m in rows if m.hardware_id == hardware_id):
            table = _keyed_table(
                name,
                ["shape key", "count", "status"],
                [
                    [m.shape_key, str(m.count), m.status]
                    for m in rows
                    if (m.hardware_id, m.kernel) == (hardware_id, name)
                ],
            )
            console.print(table)
    console.print(
        f"{_count(len(rows), 'miss', 'misses')}, {sum(m.status == 'open' for m in rows)} open. "
        + named("Tune a kernel's with `tune misses --tune --kernel module:qualname`.")
    )


def _tune_misses(db: str | None, kernels: list[str], time_limit_s: float) -> int:
    """Tune the open misses of ``kernels``: named on the command line, since tuning imports each
    one's module and stored data never chooses a module to import. Returns how many were not
    tuned (each said in one line, and left open): a recorded call refused as unsafe to replay, a
    key whose every candidate failed, a module that does not import."""
    from tunesvc._capture import tune_recorded
    from tunesvc.device import current_device
    from tunesvc.store import Store

    if not kernels:
        raise TunesvcError(
            "Name the kernels to tune with --kernel module:qualname (repeatable): tuning imports each one's "
            "module, which stored data never chooses; `tune misses` lists them."
        )
    store = Store(db)
    untuned = 0
    try:
        device = current_device()
        todo = [m for m in store.misses(hardware_id=device.hardware_id, status="open") if m.kernel in kernels]
        if not todo:
            console.print(f"No open misses of {device.name} in {store.shown_url}.")
        for m in todo:
            console.print(f"{m.kernel} {m.shape_key}: importing {m.kernel.partition(':')[0]} to tune it")
            try:
                winner = tune_recorded(store, m.kernel, m.version, m.shape_key, m.call, time_limit_s=time_limit_s)
            except TunesvcError as exc:
                console.print(f"  not tuned: {exc}", markup=False, highlight=False, soft_wrap=whole_lines(console))
                untuned += 1
                continue
            store.set_miss_status(m.id, "tuned")
            console.print(f"  tuned: {_config_text(winner)}")
    finally:
        store.close()
    return untuned
