"""`tune sweep --gpus` and `--ray`: draw the progress of the batch that :mod:`tunesvc.fleet.batch`
queues and runs on one worker per GPU of this host or of a Ray cluster, then its jobs and
winners, and say what is stored and how to resume when Ctrl-C stops a sweep."""

from __future__ import annotations

from typing import Any
from typing import NoReturn

import typer

from tunesvc.cli._common import TextConsole
from tunesvc.cli._common import _config_text
from tunesvc.cli._common import _count
from tunesvc.cli._common import _keyed_table
from tunesvc.cli._common import _ms
from tunesvc.cli._common import _print_json
from tunesvc.cli._common import wide_when_piped
from tunesvc.errors import TunesvcError
from tunesvc.text import visible


def _interrupted(store, template, hardware_id: str, keys: list[str], before: dict[str, int], command: str) -> None:
    """Ctrl-C during a sweep in this process: what is kept and how to go on (:func:`_say_interrupted`)."""
    from tunesvc.fleet.jobs import trials_stored

    now = trials_stored(store, template, hardware_id, keys)
    _say_interrupted(sum(now.values()) - sum(before.values()), sum(now.values()), len(keys), store.shown_url, command)


def _say_interrupted(new: int, total: int, keys: int, shown_url: str, command: str) -> NoReturn:
    """What a stopped sweep kept and how to go on, then exit 130 (128 + SIGINT), as shells expect."""
    TextConsole(stderr=True).print(
        f"Interrupted: {_count(new, 'trial')} stored by this run ({total} in all for "
        f"{_count(keys, 'shape key')}) in {shown_url}; a trial in flight is lost. Resume with: {command}"
        + (" (the database password in place of ***)" if "***" in command else ""),
        highlight=False,
        soft_wrap=True,
    )
    raise typer.Exit(130)


def _sweep_on_workers(
    kernel: str,
    template,
    problems: list[dict],
    strategy: str,
    budget: int | None,
    seed: int,
    gpus: str | None,
    db: str | None,
    as_json: bool,
    *,
    time_budget: float | None,
    patience: int | None,
    workers: int | None,
    ray_address: str | None = None,
    quiet: bool = False,
    resume: str = "",
) -> None:
    """`tune sweep --gpus` / `--ray`: run the batch (:func:`tunesvc.fleet.batch.run_batch`),
    drawing a bar per job, then its jobs and winners.

    Each worker runs its jobs with the sweep's --time-budget, --patience and --workers.
    """
    from tunesvc.fleet.batch import BatchInterrupted
    from tunesvc.fleet.batch import run_batch

    progress = _jobs_progress(as_json or quiet)
    tasks: dict[str, Any] = {}

    def on_start(start) -> None:
        TextConsole(stderr=True).print(
            f"sweep {start.batch}: {start.added} new of {_count(start.jobs, 'job')}, "
            f"{_count(start.workers, 'worker')}{start.where}",
            highlight=False,
        )
        tasks.update(
            {key: progress.add_task(visible(key), total=n, phase="pending") for key, n in start.limits.items()}
        )
        progress.start()

    def on_progress(jobs: list) -> None:
        for job in jobs:
            progress.update(tasks[job.shape_key], phase=job.status, completed=job.completed)

    def on_log(line: str) -> None:
        progress.console.print(line, highlight=False, soft_wrap=True)

    try:
        try:
            done = run_batch(
                kernel,
                template,
                problems,
                strategy,
                budget,
                seed,
                db=db,
                gpus=gpus,
                ray_address=ray_address,
                time_budget=time_budget,
                patience=patience,
                workers=workers,
                on_start=on_start,
                on_progress=on_progress,
                on_log=on_log,
            )
        finally:
            progress.stop()
    except BatchInterrupted as stop:  # the summary says what is stored and how to resume; exits 130
        _say_interrupted(stop.new, stop.total, stop.keys, stop.shown_url, resume)
    _report_jobs(
        done.jobs,
        done.winners,
        f"{template.name} on {done.device.name}, {_count(done.workers, 'worker')}{done.where} ({done.shown_url})",
        done.codes,
        as_json,
    )


def _report_jobs(rows: list, winners: dict, title: str, codes: list, as_json: bool) -> None:
    """The batch's jobs with their winners, as a table or JSON; one sentence where a job did not finish."""
    if as_json:
        _print_json(
            [
                {
                    "shape_key": j.shape_key,
                    "status": j.status,
                    "attempts": j.attempts,
                    "message": j.message,
                    "winner": winners[j.shape_key].config if j.shape_key in winners else None,
                    "winner_ms": winners[j.shape_key].time_ms if j.shape_key in winners else None,
                }
                for j in rows
            ]
        )
    else:
        out = wide_when_piped(TextConsole())
        table = _keyed_table(
            title,
            ["shape key", "job", "winner", "ms", "attempts"],
            [
                [
                    j.shape_key,
                    j.status,
                    _config_text(winners[j.shape_key].config if j.shape_key in winners else None),
                    _ms(winners[j.shape_key].time_ms if j.shape_key in winners else None),
                    str(j.attempts),
                ]
                for j in rows
            ],
            target=out,
        )
        out.print(table)
    unfinished = [j for j in rows if j.status != "done"]
    if unfinished:
        first = next((j.message for j in unfinished if j.message), f"workers exited with {codes}")
        raise TunesvcError(
            f"{len(unfinished)} of {len(rows)} jobs did not finish ({first}); run the same command again to resume."
        )


def _jobs_progress(quiet: bool) -> Any:
    """A progress display of a queued batch: a bar per job, its status and stored trials of its budget."""
    from tunesvc.cli._progress import sweep_progress

    return sweep_progress(wide_when_piped(TextConsole(stderr=True)), best=False, disable=quiet)
