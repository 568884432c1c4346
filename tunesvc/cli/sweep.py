"""`tune sweep`: benchmark a kernel's configs for each shape on this device and store the trials
and winners; with --gpus or --ray the shapes go to workers (:mod:`tunesvc.cli._sweep_workers`)."""

from __future__ import annotations

import os
import shlex
from typing import Annotated
from typing import Any

import typer

from tunesvc.cli._common import DbOption
from tunesvc.cli._common import JsonOption
from tunesvc.cli._common import KernelArgument
from tunesvc.cli._common import TextConsole
from tunesvc.cli._common import _absolute
from tunesvc.cli._common import _check_count
from tunesvc.cli._common import _complete_preset
from tunesvc.cli._common import _complete_strategy
from tunesvc.cli._common import _config_text
from tunesvc.cli._common import _keyed_table
from tunesvc.cli._common import _ms
from tunesvc.cli._common import _print_json
from tunesvc.cli._common import app
from tunesvc.cli._common import program
from tunesvc.cli._common import user_errors
from tunesvc.cli._common import wide_when_piped
from tunesvc.cli._sweep_workers import _interrupted
from tunesvc.cli._sweep_workers import _sweep_on_workers
from tunesvc.errors import TunesvcError
from tunesvc.text import visible
from tunesvc.timeline import mark

#: the most compiling processes of --workers
MAX_WORKERS = 1024


def _problems(template, shapes: list[str], preset: str | None, dtype: str) -> list[dict]:
    problems = [template.parse_shape(s, dtype) for s in shapes]
    if preset is not None:
        if preset not in template.presets:
            names = ", ".join(template.presets) or "none"
            raise TunesvcError(f"{template.name} has no preset '{preset}'; its presets: {names}.")
        problems += [template.problem(**{"dtype": dtype, **p}) for p in template.presets[preset]]
    if not problems:
        raise TunesvcError("Give at least one --shape (e.g. 4096x4096x4096) or a --preset.")
    return problems


@app.command()
@user_errors
def sweep(
    ctx: typer.Context,
    kernel: KernelArgument,
    shape: Annotated[
        list[str] | None, typer.Option("--shape", "-s", help="A problem shape, e.g. 4096x4096x4096 (repeatable).")
    ] = None,
    preset: Annotated[
        str | None,
        typer.Option(help="A named problem set of the kernel (see `tune kernels`).", autocompletion=_complete_preset),
    ] = None,
    dtype: Annotated[str, typer.Option(help="float16, bfloat16 or float32.")] = "float16",
    strategy: Annotated[
        str,
        typer.Option(
            help="grid (every feasible config), random, optuna (TPE), cmaes (CMA-ES) or gp (Gaussian process).",
            autocompletion=_complete_strategy,
        ),
    ] = "grid",
    budget: Annotated[
        int | None, typer.Option(help="Most trials per shape, stored ones included \\[grid: all; others: 50].")
    ] = None,
    time_budget: Annotated[
        float | None,
        typer.Option(help="Most seconds of search per shape, once it has one trial \\[default: no limit]."),
    ] = None,
    patience: Annotated[
        int | None,
        typer.Option(
            help="Stop a shape after this many trials in a row that do not beat the best by 1% \\[default: never]."
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the sampler.")] = 0,
    workers: Annotated[
        int | None,
        typer.Option(
            help="Processes compiling candidates in parallel \\[GPU: a core each, up to 16 (grid, random) or 8 (Optuna); interpreter: 0]."
        ),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress bar (for logs); the result table still prints.")
    ] = False,
    gpus: Annotated[
        str | None,
        typer.Option(
            help="Share the shapes between one worker per GPU: 'all' or indices such as 0,1 (without a GPU: one interpreter worker per index, at most one per CPU core), never more workers than shape keys; each worker applies --budget, --time-budget, --patience and --workers to every shape it takes. The same command on other hosts with the same --db joins the sweep."
        ),
    ] = None,
    timing: Annotated[
        str,
        typer.Option(
            help="How candidates are timed: graph (CUDA graph replays over input copies: the GPU time, as a CUDA graph or fused program runs the kernel) or eager (loops of ordinary launches, one synchronisation per loop: the host's launch cost counts, as in a program that launches kernel by kernel). The winner is the key's winner of that timing; an eager one is stored only where it is at least as fast as the key's graph winner timed eagerly. --gpus and --ray sweep graph only.",
        ),
    ] = "graph",
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            metavar="ADDRESS",
            help="Share the shapes between one worker per GPU of a Ray cluster ('auto': the cluster this host belongs to, or $RAY_ADDRESS; else host:port or ray://host:10001), all pulling jobs from --db, which every node must reach; needs tunesvc\\[ray]. A cluster without GPUs gets one interpreter worker per node.",
        ),
    ] = None,
) -> None:
    """Benchmark configs for each shape on this device, store every trial and the winners.

    Where a GPU may be present, the first sweep leaves a resident process behind with torch, Triton
    and the kernels imported, and the next ones run as its forks, without that import
    (TUNESVC_RESIDENT=0: never; it exits after TUNESVC_RESIDENT_IDLE_S idle, 600 s).
    """
    # the sweep measures (torch, Triton) and stores (SQLAlchemy); rich.progress only draws its bar
    from tunesvc.template import get_template

    mark("command parsed")
    template = get_template(kernel)
    problems = _problems(template, shape or [], preset, dtype)
    _check_options(strategy, budget, time_budget, patience, workers, seed, gpus, ray, timing)
    mark("kernel imported")
    if gpus is not None or ray is not None:
        return _sweep_on_workers(
            kernel,
            template,
            problems,
            strategy,
            budget,
            seed,
            gpus,
            db,
            as_json,
            time_budget=time_budget,
            patience=patience,
            workers=workers,
            ray_address=ray,
            quiet=quiet,
            resume=_command_line(ctx, db),
        )
    options = {"strategy": strategy, "budget": budget, "seed": seed, "workers": workers, "timing": timing}
    _sweep_here(
        template, problems, db, options | {"time_budget": time_budget, "patience": patience}, ctx, as_json, quiet
    )


def _check_options(
    strategy: str,
    budget: int | None,
    time_budget: float | None,
    patience: int | None,
    workers: int | None,
    seed: int,
    gpus: str | None,
    ray: str | None,
    timing: str = "graph",
) -> None:
    """Refuse a sweep's options in one sentence, before any database is opened (a rejected sweep
    creates no file)."""
    from tunesvc.search import STRATEGIES
    from tunesvc.settings import TIMINGS
    from tunesvc.template import did_you_mean
    from tunesvc.tuning.sweep import check_sweep_arguments

    if strategy not in STRATEGIES:
        hint = did_you_mean(strategy, STRATEGIES)
        raise TunesvcError(f"Unknown strategy '{strategy}'{hint}; use one of {', '.join(STRATEGIES)}.")
    _check_count("--budget", budget)
    _check_count("--patience", patience)
    check_sweep_arguments(strategy, budget, time_budget, patience)
    if workers is not None and not 0 <= workers <= MAX_WORKERS:
        raise TunesvcError(f"--workers must be from 0 to {MAX_WORKERS}, got {workers}.")
    if not 0 <= seed < 2**32:
        raise TunesvcError(f"--seed must be from 0 to 2**32 - 1 (what the samplers take), got {seed}.")
    if gpus is not None and ray is not None:
        raise TunesvcError("Use --gpus (this host's GPUs) or --ray (a Ray cluster's), not both.")
    if timing not in TIMINGS:
        hint = did_you_mean(timing, TIMINGS)
        raise TunesvcError(f"Unknown timing '{timing}'{hint}; use one of {', '.join(TIMINGS)}.")
    if timing != "graph" and (gpus is not None or ray is not None):
        raise TunesvcError(
            f"--timing {timing} sweeps in this process only: --gpus and --ray sweep with graph timing; drop one of them."
        )


def _sweep_here(
    template,
    problems: list[dict],
    db: str | None,
    options: dict[str, Any],
    ctx: typer.Context,
    as_json: bool,
    quiet: bool,
) -> None:
    """The sweep in this process, a progress bar per shape key, then the winners' table (or JSON)."""
    from tunesvc.cli._progress import sweep_progress
    from tunesvc.device import fork_safe_current_device
    from tunesvc.fleet.jobs import trials_stored
    from tunesvc.store import Store
    from tunesvc.tuning.sweep import run_sweep

    device = fork_safe_current_device()  # CUDA left uninitialised here: the sweep forks its workers from this process
    _check_fits(template, problems, device)
    store = Store(db)
    keys = list(dict.fromkeys(str(template.key(p)) for p in problems))
    before = trials_stored(store, template, device.hardware_id, keys)
    progress = sweep_progress(wide_when_piped(TextConsole(stderr=True)), best=True, disable=as_json or quiet)
    tasks: dict[str, Any] = {}

    def on_start(problem: dict, key: str, limit: int) -> None:
        tasks[key] = progress.add_task(visible(key), total=limit, best="", phase="starting")

    def on_phase(key: str, what: str) -> None:  # compiling, checking and timing, finalists, peer
        progress.update(tasks[key], phase=what)

    def on_trial(event) -> None:
        best = f"best {event.best_ms:.4g} ms" if event.best_ms is not None else ""
        progress.update(tasks[event.shape_key], completed=event.index, best=best)

    try:
        with progress:
            results = run_sweep(
                template,
                problems,
                store,
                device=device,
                on_start=on_start,
                on_trial=on_trial,
                on_phase=on_phase,
                **options,
            )
    except KeyboardInterrupt:
        _interrupted(store, template, device.hardware_id, keys, before, _command_line(ctx, db))
    finally:
        store.close()
    if as_json:
        return _print_json([r.__dict__ for r in results])
    _print_table(template, device, store.shown_url, results)


def _print_table(template, device, url: str, results: list) -> None:
    rows = [
        [
            r.shape_key,
            "(graph winner kept: none faster eagerly)" if r.graph_kept and r.winner is None else _config_text(r.winner),
            _ms(r.winner_ms),
            _ms(r.heuristic_ms),
            f"{r.heuristic_ms / r.winner_ms:.2f}x" if r.heuristic_ms and r.winner_ms else "-",
            str(r.trials_stored),
            str(r.trials_new),
            str(r.failures),
            f"{r.wall_seconds:.1f}",
        ]
        for r in results
    ]
    out = wide_when_piped(TextConsole())
    eager = any(r.timing == "eager" for r in results)
    out.print(
        _keyed_table(
            f"{template.name} on {device.name} ({url})" + (", eager timing" if eager else ""),
            ["shape key", "winner", "ms", "heuristic ms", "speed-up", "trials", "new", "failed", "s"],
            rows,
            caption=SWEEP_LEGEND,
            target=out,
        )
    )


def _command_line(ctx: typer.Context, db: str | None) -> str:
    """The command as a user types it again, rebuilt from its parsed options; a database named
    by default (./tune.db, $TUNESVC_DB) is named explicitly, so that it resumes from any folder."""
    from tunesvc.store import database_name  # SQLAlchemy, loaded by the sweep already

    words = [*program().split(), ctx.info_name or "sweep"]
    for param in ctx.command.params:
        value = ctx.params.get(param.name or "")
        if value is None or value == param.default or value == [] or param.name == "ctx":
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        if not getattr(param, "opts", None) or param.param_type_name == "argument":
            words += [str(v) for v in values]
            continue
        name = next((o for o in param.opts if o.startswith("--")), param.opts[0])
        if param.name == "db":  # a URL's password is never printed: the user puts it back for ***
            values = [database_name(str(v)) if "://" in str(v) else v for v in values]
        if getattr(param, "is_flag", False):
            words.append(name)
        else:
            for v in values:
                words += [name, str(v)]
    if db is None:
        words += ["--db", _absolute(None)]
    return shlex.join(words)


#: what the sweep table's terse columns mean
SWEEP_LEGEND = (
    "speed-up: heuristic ms / winner ms. trials: stored for the key; new: of them, measured by this run; "
    "failed: did not compile, run or match the reference. s: seconds this run spent on the key."
)


def _check_fits(template, problems: list[dict], device) -> None:
    """Refuse a problem whose inputs and outputs cannot fit in the device's memory (the host's
    for the interpreter), before any database is created: allocating them would fail mid-sweep."""
    limit = device.memory_bytes or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for problem in problems:
        try:
            needed = template.cost(problem).bytes
        except Exception:  # a user's template without a cost: nothing to check
            continue
        if needed > limit:
            raise TunesvcError(
                f"{template.key(problem)} needs about {needed / 2**30:,.0f} GiB for its tensors, more than the "
                f"{limit / 2**30:,.0f} GiB of {device.name}; pick a smaller shape."
            )
