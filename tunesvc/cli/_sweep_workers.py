"""`tune sweep --gpus` and `--ray`: queue the sweep's jobs in the database, run one worker per GPU
of this host or of a Ray cluster, draw the batch's progress from the database, and say what is
stored and how to resume when Ctrl-C stops a sweep."""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Callable
from typing import Any

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
from tunesvc.timeline import mark


def _interrupted(store, template, hardware_id: str, keys: list[str], before: dict[str, int], command: str) -> None:
    """Ctrl-C during a sweep: what is kept and how to go on, then exit 130 (128 + SIGINT), as shells expect."""
    from tunesvc.fleet.jobs import trials_stored

    now = trials_stored(store, template, hardware_id, keys)
    new = sum(now.values()) - sum(before.values())
    TextConsole(stderr=True).print(
        f"Interrupted: {_count(new, 'trial')} stored by this run ({sum(now.values())} in all for "
        f"{_count(len(keys), 'shape key')}) in {store.shown_url}; a trial in flight is lost. Resume with: {command}"
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
    """`tune sweep --gpus` / `--ray`: queue the (kernel x shape) jobs in the database, run one
    worker per GPU of this host or of the Ray cluster.

    Each worker runs its jobs with the sweep's --time-budget, --patience and --workers.
    """
    # the GPU count (torch); the job queue (SQLAlchemy)
    import torch

    from tunesvc.device import current_device
    from tunesvc.fleet import jobs
    from tunesvc.store import Store
    from tunesvc.store import resolve_url

    processes: list[jobs.WorkerProcess] = []
    connected = False
    if ray_address is None:
        # device_count() asks NVML: CUDA stays uninitialised here, so the workers are forked from this process
        shape_keys = len(dict.fromkeys(str(template.key(p)) for p in problems))  # one job per key
        slots = jobs.worker_slots(gpus or "all", torch.cuda.device_count(), jobs=shape_keys)
        # started first: they read their devices while this process opens the database and queues the jobs
        processes = jobs.spawn_workers(
            resolve_url(db),
            None,
            slots,
            time_budget=time_budget,
            patience=patience,
            compile_workers=workers,
            first_jobs=jobs.planned_jobs(kernel, template, problems, strategy, budget, seed),
            kernel=kernel,
        )
        mark("workers started")
        count, where = len(slots), ""
    else:
        from tunesvc.fleet import cluster

        connected = cluster.connect(ray_address)  # before queuing: a cluster that cannot be reached queues nothing
        count, where = cluster.placement()[0], " on Ray"
    store = None
    try:
        store = Store(db)
        mark("database open")
        device = current_device()
        mark("device read")
        batch = jobs.batch_name(kernel, template, problems, strategy, budget, seed, device, time_budget, patience)
        added = jobs.enqueue(store, batch, kernel, template, problems, strategy, budget, seed)
        mark("jobs queued")
        keys = list(dict.fromkeys(str(template.key(p)) for p in problems))
        before = jobs.trials_stored(store, template, device.hardware_id, keys)  # before any worker begins
        for p in processes:
            p.begin(batch)
        TextConsole(stderr=True).print(
            f"sweep {batch}: {added} new of {_count(len(problems), 'job')}, {_count(count, 'worker')}{where}",
            highlight=False,
        )
        progress, update = _jobs_progress(store, batch, template, problems, device, strategy, budget, as_json or quiet)
        try:
            if ray_address is None:
                codes: list = _wait_showing_progress(processes, progress, update)
            else:
                with progress:
                    codes = cluster.run_on_ray(
                        store.url,
                        batch,
                        time_budget=time_budget,
                        patience=patience,
                        compile_workers=workers,
                        kernel=kernel,
                        log=lambda line: progress.console.print(line, highlight=False),
                        tick=update,
                    )
                    update(final=True)
        except KeyboardInterrupt:  # the summary says what is stored and how to resume; exits 130
            _interrupted(store, template, device.hardware_id, keys, before, resume)
        mark("workers done")
        # the workers' results, read again while the database is unreachable (a server restarted
        # during the sweep, which the workers rode out): finished work is not reported as an error
        said = TextConsole(stderr=True)
        log = functools.partial(said.print, highlight=False, soft_wrap=True)
        rows = jobs.retrying(lambda: jobs.jobs(store, batch), log)
        # Ray's workers may hold other GPUs than this host (a head node without one)
        hardware = {c[1] for c in codes if isinstance(c, tuple)} or {device.hardware_id}
        stored = jobs.retrying(lambda: store.winners(kernel=template.name, version=template.version), log)
        winners = {w.shape_key: w for w in stored if w.hardware_id in hardware}
    finally:
        for p in processes:  # a failure before the jobs were queued: the workers exit quietly
            p.abandon()
        for p in processes:
            p.wait()
        if store is not None:
            store.close()
        if connected:
            _ray_shutdown()
    _report_jobs(
        rows,
        winners,
        f"{template.name} on {device.name}, {_count(count, 'worker')}{where} ({store.shown_url})",
        codes,
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


def _jobs_progress(
    store, batch: str, template, problems: list[dict], device, strategy: str, budget: int | None, quiet: bool
) -> tuple[Any, Callable[..., None]]:
    """A progress display of a queued batch (a bar per job: its status and stored trials of its
    budget) and the function that redraws it from the database, where the workers report."""
    from rich.progress import BarColumn
    from rich.progress import MofNCompleteColumn
    from rich.progress import Progress
    from rich.progress import TextColumn
    from rich.progress import TimeElapsedColumn

    from tunesvc.fleet.jobs import retrying
    from tunesvc.fleet.jobs import trials_stored
    from tunesvc.store import DatabaseUnavailable
    from tunesvc.tuning.sweep import DEFAULT_OPTUNA_BUDGET

    keys = list(dict.fromkeys(str(template.key(p)) for p in problems))
    limits: dict[str, int] = {}
    for problem in problems:  # the trials each job's sweep will run at most, as run_sweep counts them
        feasible = len(template.feasible(problem, device))
        wanted = feasible if budget is None and strategy == "grid" else budget or DEFAULT_OPTUNA_BUDGET
        limits[str(template.key(problem))] = min(wanted, feasible)
    progress = Progress(
        TextColumn("{task.description}", markup=False),
        TextColumn("[dim]{task.fields[phase]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=wide_when_piped(TextConsole(stderr=True)),
        disable=quiet,
    )
    tasks = {key: progress.add_task(visible(key), total=limits[key], phase="pending") for key in keys}

    def read() -> None:
        stored = trials_stored(store, template, device.hardware_id, keys)
        for job in store.jobs(batch):
            if job.shape_key in tasks:
                done = job.status == "done"
                progress.update(
                    tasks[job.shape_key],
                    phase=job.status,
                    completed=limits[job.shape_key] if done else min(stored[job.shape_key], limits[job.shape_key]),
                )

    def update(final: bool = False) -> None:
        """Redraw from the database; while it is unreachable (a server restart, which the workers
        retry through), a redraw is skipped, and the final one waits for it as the workers do."""
        if final:
            retrying(read, lambda line: progress.console.print(line, highlight=False, soft_wrap=True))
            return
        try:
            read()
        except DatabaseUnavailable:
            pass

    return progress, update


def _wait_showing_progress(processes: list, progress: Any, update: Callable[..., None]) -> list[int]:
    """Wait for this host's workers, drawing the batch's progress (:func:`_jobs_progress`).

    On Ctrl-C (SIGINT, which a terminal sends to the workers too) the workers give their running
    jobs back to the queue; this waits for them to end, then raises KeyboardInterrupt."""
    import time

    try:
        with progress:
            while any(p.poll() is None for p in processes):
                update()
                time.sleep(0.5)
            update(final=True)
        return [p.wait() for p in processes]
    except KeyboardInterrupt:
        # a terminal's Ctrl-C reached the workers too, and they are giving their jobs back: a
        # second SIGINT is for those that did not get one (`kill -INT` of this process alone)
        deadline = time.monotonic() + 1
        while any(p.poll() is None for p in processes) and time.monotonic() < deadline:
            time.sleep(0.1)
        for p in processes:
            p.interrupt()
        for p in processes:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        raise


def _ray_shutdown() -> None:
    import ray

    ray.shutdown()
