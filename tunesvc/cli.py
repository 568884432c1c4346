"""`tune`: the command line. Each command is a thin layer over a library call.

`tune --help`, `tune --version` and every TAB press of shell completion import this module and
nothing else of tunesvc's, so each command imports the library modules it calls in its body:
torch, Triton, SQLAlchemy, Optuna and matplotlib (behind them) load only for commands that use
them, and a start costs typer and rich alone.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import re
import shlex
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Annotated
from typing import Any

import typer
import typer.core
from rich.console import Console
from rich.console import Group
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from tunesvc import __version__
from tunesvc import settings
from tunesvc.errors import TunesvcError
from tunesvc.text import natural_order
from tunesvc.text import visible
from tunesvc.timeline import mark


class _Readable:
    """Help that reads: a flag shows no value type (typer writes `<bool>` beside --json and --help)
    and a repeatable argument its element type (`<str>...`, not `<list[str]>`)."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)  # type: ignore[misc]
        for param in params:
            if isinstance(param, typer.core.TyperOption) and param.is_flag and param.metavar is None:
                param.metavar = ""
                continue
            bare_type = getattr(param, "bare_type", None)  # typer's metavar type, in the versions that write one
            if bare_type is None:
                continue
            element = f"<{bare_type().removeprefix('list[').removesuffix(']')}>"
            if isinstance(param, typer.core.TyperOption) and param.multiple and param.metavar is None:
                param.metavar = element  # its help says "repeatable"
            elif isinstance(param, typer.core.TyperArgument) and param.nargs != 1:
                param.display_type_rich = _shown(f"{element}...")  # type: ignore[method-assign]
        return params


def _shown(text: str) -> Callable[..., str]:
    return lambda ctx: text


class _Command(_Readable, typer.core.TyperCommand):
    pass


class _Group(_Readable, typer.core.TyperGroup):
    pass


class _App(typer.Typer):
    """Every command of the app is a :class:`_Command`."""

    def command(self, *args: Any, **kwargs: Any) -> Callable:
        kwargs.setdefault("cls", _Command)
        return super().command(*args, **kwargs)


app = _App(
    cls=_Group,
    name="tune",
    help="Tune Triton kernels once per GPU and shape, keep the results, look them up at run time. "
    "Installed as `tune` and as `tunesvc`, a name no other package claims (Ray installs a `tune` of its own).",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)


class TextConsole(Console):
    """A rich Console that prints every string as text: no markup (a stored ``[/x]`` is shown,
    not parsed), no emoji codes, control characters escaped (:func:`visible`). Table cells and
    titles given as strings go through :meth:`render_str` too; a :class:`~rich.text.Text` made
    by hand is the caller's to build with :func:`visible`."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        kwargs.update(markup=False, emoji=False)
        return super().render_str(visible(text), **kwargs)


console = TextConsole()

#: the width of a sweep's output to a pipe or a file where $COLUMNS sets none: no terminal to fit,
#: and at rich's 80 columns its progress lines are cut and its table folds into one column
PIPE_WIDTH = 200


def wide_when_piped(target: Console) -> Console:
    """``target`` as wide as :data:`PIPE_WIDTH` where it writes to a pipe or a file and $COLUMNS
    sets no width (a terminal's width, or $COLUMNS, is kept): `tune sweep ... | cat` prints a line
    per key, whole, and the table's columns side by side."""
    if not target.is_terminal and not settings.text("COLUMNS"):
        target.width = PIPE_WIDTH
    return target


def program() -> str:
    """The command that runs this CLI, as hints name it: the script the user typed (`tune` or
    `tunesvc`), `python -m tunesvc`, else `tune`. Ray installs a `tune` command of its own, and
    whichever of the two distributions pip installed last owns that name: a hint names the
    command that reached tunesvc, which surely is tunesvc's."""
    invoked = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("tune")
    if invoked.stem in ("tune", "tunesvc"):
        return invoked.stem
    if invoked.name == "__main__.py" and invoked.parent.name == "tunesvc":
        return "python -m tunesvc"
    return "tune"


def named(text: str) -> str:
    """``text`` with its hints (`` `tune show` ``, in backquotes) naming :func:`program`; words such
    as "tune it" are left alone."""
    name = program()
    return text if name == "tune" else re.sub(r"(?<=`)tune(?=[ `])", name, text)


def _check_db(value: str | None) -> str | None:
    """--db: refuse what names no file or server (an empty name, an in-memory SQLite database):
    a sweep into memory would report success and keep nothing."""
    if value is None:
        return value
    text = value.strip()
    if not text:
        raise typer.BadParameter("is empty; pass a database file path or a SQLAlchemy URL.")
    if text == ":memory:" or (
        text.startswith("sqlite:")
        and text.split("?")[0].rstrip("/") in ("sqlite:", "sqlite:/", "sqlite://", "sqlite:///:memory:")
    ):
        raise typer.BadParameter(f"'{text}' names no database file (SQLite in memory keeps nothing); pass a file path.")
    return value


DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        envvar="TUNESVC_DB",
        help="SQLite file or SQLAlchemy URL \\[default: ./tune.db].",
        callback=_check_db,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of a table.")]


def _complete_kernel(incomplete: str) -> list[str]:
    from tunesvc.completion import kernel_names  # only a TAB press needs it

    return [name for name in kernel_names() if name.startswith(incomplete)]


def _complete_strategy(incomplete: str) -> list[str]:
    from tunesvc.completion import strategy_names  # only a TAB press needs it

    return [name for name in strategy_names() if name.startswith(incomplete)]


def _complete_preset(ctx: typer.Context, incomplete: str) -> list[str]:
    from tunesvc.completion import preset_names  # only a TAB press needs it

    # while completing an option's value, click leaves the positional kernel unparsed in ctx.args
    kernel = ctx.params.get("kernel") or next(iter(ctx.args), None)
    return [name for name in preset_names(kernel) if name.startswith(incomplete)] if kernel else []


#: `tune --debug`: user errors keep their traceback (set by the app callback on every run)
_DEBUG = False


def _version(value: bool) -> None:
    if value:
        console.print(f"tunesvc {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
    debug: Annotated[
        bool, typer.Option("--debug", help="Show errors with their traceback instead of one line.")
    ] = False,
) -> None:
    """Tune Triton kernels once per GPU and shape, keep the results, look them up at run time."""
    global _DEBUG
    _DEBUG = debug


def user_errors(fn: Callable) -> Callable:
    """A TunesvcError becomes one line on stderr and exit code 1, never a traceback (unless --debug)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with (
                _warnings_as_lines(),
                _removed_if_new_and_failing(kwargs.get("db"), "db" in inspect.signature(fn).parameters),
            ):
                return fn(*args, **kwargs)
        except TunesvcError as exc:
            if _DEBUG:
                raise
            # the message is text, never markup: it may quote a user's input such as --shape '[/x]'
            _error(str(exc))
            raise typer.Exit(1) from None
        except OSError as exc:  # a path the system refuses (a name too long, a folder not allowed)
            if _DEBUG:
                raise
            where = f" {_short(str(exc.filename))}" if exc.filename else ""
            _error(f"Cannot use{where}: {exc.strerror or exc}; check the paths given.")
            raise typer.Exit(1) from None

    return wrapper


def _error(message: str) -> None:
    """One line on stderr: "Error: " and ``message`` as text, its hints naming :func:`program`."""
    line = Text("Error: ", style="bold red") + Text(visible(named(message)))
    TextConsole(stderr=True).print(line, highlight=False, soft_wrap=True)


def _short(text: str, most: int = 80) -> str:
    """A long path or name cut to ``most`` characters for a message (a 300-character --out)."""
    return text if len(text) <= most else f"{text[: most - 20]}...{text[-17:]}"


@contextlib.contextmanager
def _warnings_as_lines():
    """Python warnings as one line each on stderr ("Warning: ..."), not Python's two lines with a
    file name and a source line; the filters stay Python's, so only what it would show is shown."""
    with warnings.catch_warnings(record=True) as caught:
        try:
            yield
        finally:
            stderr = TextConsole(stderr=True)
            for message in dict.fromkeys(str(w.message) for w in caught):
                line = Text("Warning: ", style="yellow") + Text(visible(named(message)))
                stderr.print(line, highlight=False, soft_wrap=True)


#: the most trials a --budget or --patience counts: what every store's integer column holds
MAX_COUNT = 2**31 - 1
#: the most compiling processes of --workers
MAX_WORKERS = 1024


def _check_count(option: str, value: int | None) -> None:
    """A count of trials that a store can keep (its columns are 32-bit on PostgreSQL)."""
    if value is not None and value > MAX_COUNT:
        raise TunesvcError(f"{option} must be at most {MAX_COUNT:,} trials, got {_short(str(value), 30)}.")


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


_SHORT = {"num_warps": "warps", "num_stages": "stages"}


def _ms(value: float | None) -> str:
    """A time in ms for a table cell; "-" where none was measured."""
    return f"{value:.4g}" if value is not None else "-"


def _config_text(config: dict[str, int | str] | None) -> str:
    """Compact, so a config fits a table cell: BLOCK_M=128 -> BM=128."""
    if not config:
        return "-"
    return " ".join(f"{_SHORT.get(k, k.replace('BLOCK_', 'B'))}={v}" for k, v in config.items())


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
def kernels(as_json: JsonOption = False) -> None:
    """List the kernel templates, their dims, version and space size."""
    from tunesvc.template import list_templates  # shipped templates: no torch; users' own may import it

    rows: list[dict[str, Any]] = [
        {
            "name": t.name,
            "dims": list(t.dims),
            "version": t.version,
            "space_size": t.space.size,
            "presets": sorted(t.presets),
            "space_file": str(t.space_path),
        }
        for t in list_templates()
    ]
    if as_json:
        return _print_json(rows)
    table = _keyed_table(
        "Kernel templates",
        ["kernel", "dims", "version", "configs", "presets"],
        [[r["name"], "x".join(r["dims"]), r["version"], str(r["space_size"]), ", ".join(r["presets"])] for r in rows],
        # the room that a 21-character kernel name needs beside the presets at 80 columns
        show_edge=False,
        pad_edge=False,
    )
    console.print(table)


@app.command()
@user_errors
def space(
    kernel: Annotated[
        str,
        typer.Argument(
            help="Kernel name (see `tune kernels`; the library's names, such as layer_norm, too) or module:attribute.",
            autocompletion=_complete_kernel,
        ),
    ],
    shape: Annotated[
        str | None, typer.Option(help="Count feasible configs for this shape, e.g. 4096x4096x4096.")
    ] = None,
    dtype: Annotated[str, typer.Option(help="float16, bfloat16 or float32.")] = "float16",
    as_json: JsonOption = False,
) -> None:
    """Show a kernel's config space: parameters, constraints, and feasible configs for a shape."""
    # the template (a shipped one imports neither torch nor Triton); the device (torch on a GPU machine)
    from tunesvc.device import current_device
    from tunesvc.template import get_template

    template = get_template(kernel)
    sp = template.space
    data: dict[str, Any] = {
        "kernel": template.name,
        "file": sp.source,
        "size": sp.size,
        "parameters": {n: list(p.choices) for n, p in sp.parameters.items()},
        "constraints": {n: e.source for n, e in sp.constraints.items()},
    }
    if shape is not None:
        problem = template.parse_shape(shape, dtype)
        device = current_device()
        feasible = len(template.feasible(problem, device))
        if not feasible:  # a template's heuristic has nothing to pick from (an IndexError, for one)
            raise TunesvcError(
                f"No config of {template.name}'s space fits {template.key(problem)} on {device.name}: every one "
                "breaks a constraint; widen the space or give another shape."
            )
        data.update(
            shape_key=str(template.key(problem)),
            device=device.name,
            feasible=feasible,
            heuristic=template.heuristic(problem, device),
        )
    if as_json:
        return _print_json(data)
    table = Table(title=f"{template.name}: {sp.size} configs ({sp.source})")
    table.add_column("parameter")
    table.add_column("choices")
    for name, choices in data["parameters"].items():
        table.add_row(name, ", ".join(map(str, choices)))
    console.print(table)
    constraints = Table(title="Constraints")
    constraints.add_column("name")
    constraints.add_column("expression")
    for name, source in data["constraints"].items():
        constraints.add_row(name, source)
    console.print(constraints)
    if shape is not None:
        console.print(
            f"{data['shape_key']} on {data['device']}: {data['feasible']} feasible of {sp.size}; "
            f"heuristic {_config_text(data['heuristic'])}"
        )


@app.command()
@user_errors
def sweep(
    ctx: typer.Context,
    kernel: Annotated[
        str,
        typer.Argument(
            help="Kernel name (see `tune kernels`; the library's names, such as layer_norm, too) or module:attribute.",
            autocompletion=_complete_kernel,
        ),
    ],
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
        float | None, typer.Option(help="Most seconds of search per shape \\[default: no limit].")
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
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            metavar="ADDRESS",
            help="Share the shapes between one worker per GPU of a Ray cluster ('auto': the cluster this host belongs to, or $RAY_ADDRESS; else host:port or ray://host:10001), all pulling jobs from --db, which every node must reach; needs tunesvc\\[ray]. A cluster without GPUs gets one interpreter worker per node.",
        ),
    ] = None,
) -> None:
    """Benchmark configs for each shape on this device, store every trial and the winners."""
    # the sweep measures (torch, Triton) and stores (SQLAlchemy); rich.progress only draws its bar
    from rich.progress import BarColumn
    from rich.progress import MofNCompleteColumn
    from rich.progress import Progress
    from rich.progress import TextColumn
    from rich.progress import TimeElapsedColumn

    from tunesvc.device import fork_safe_current_device
    from tunesvc.fleet.jobs import trials_stored
    from tunesvc.search import STRATEGIES
    from tunesvc.store import Store
    from tunesvc.sweep import check_sweep_arguments
    from tunesvc.sweep import run_sweep
    from tunesvc.template import did_you_mean
    from tunesvc.template import get_template

    mark("command parsed")
    template = get_template(kernel)
    problems = _problems(template, shape or [], preset, dtype)
    if strategy not in STRATEGIES:
        hint = did_you_mean(strategy, STRATEGIES)
        raise TunesvcError(f"Unknown strategy '{strategy}'{hint}; use one of {', '.join(STRATEGIES)}.")
    _check_count("--budget", budget)
    _check_count("--patience", patience)
    check_sweep_arguments(strategy, budget, time_budget, patience)  # before Store(): a rejected sweep creates no file
    if workers is not None and not 0 <= workers <= MAX_WORKERS:
        raise TunesvcError(f"--workers must be from 0 to {MAX_WORKERS}, got {workers}.")
    if not 0 <= seed < 2**32:
        raise TunesvcError(f"--seed must be from 0 to 2**32 - 1 (what the samplers take), got {seed}.")
    mark("kernel imported")
    if gpus is not None and ray is not None:
        raise TunesvcError("Use --gpus (this host's GPUs) or --ray (a Ray cluster's), not both.")
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
    device = fork_safe_current_device()  # CUDA left uninitialised here: the sweep forks its workers from this process
    _check_fits(template, problems, device)
    store = Store(db)
    keys = list(dict.fromkeys(str(template.key(p)) for p in problems))
    before = trials_stored(store, template, device.hardware_id, keys)
    progress = Progress(
        TextColumn("{task.description}", markup=False),
        TextColumn("[dim]{task.fields[phase]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[best]}"),
        TimeElapsedColumn(),
        console=wide_when_piped(TextConsole(stderr=True)),
        disable=as_json or quiet,
    )
    tasks: dict[str, Any] = {}

    def on_start(problem: dict, key: str, limit: int) -> None:
        tasks[key] = progress.add_task(key, total=limit, best="", phase="starting")

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
                strategy=strategy,
                budget=budget,
                seed=seed,
                device=device,
                on_start=on_start,
                on_trial=on_trial,
                on_phase=on_phase,
                workers=workers,
                time_budget=time_budget,
                patience=patience,
            )
    except KeyboardInterrupt:
        _interrupted(store, template, device.hardware_id, keys, before, _command_line(ctx, db))
    finally:
        store.close()
    if as_json:
        return _print_json([r.__dict__ for r in results])
    rows = [
        [
            r.shape_key,
            _config_text(r.winner),
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
    out.print(
        _keyed_table(
            f"{template.name} on {device.name} ({store.url})",
            ["shape key", "winner", "ms", "heuristic ms", "speed-up", "trials", "new", "failed", "s"],
            rows,
            caption=SWEEP_LEGEND,
            target=out,
        )
    )


def _command_line(ctx: typer.Context, db: str | None) -> str:
    """The command as a user types it again, rebuilt from its parsed options; a database named
    by default (./tune.db, $TUNESVC_DB) is named explicitly, so that it resumes from any folder."""
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
        if getattr(param, "is_flag", False):
            words.append(name)
        else:
            for v in values:
                words += [name, str(v)]
    if db is None:
        words += ["--db", _absolute(None)]
    return shlex.join(words)


def _interrupted(store, template, hardware_id: str, keys: list[str], before: dict[str, int], command: str) -> None:
    """Ctrl-C during a sweep: what is kept and how to go on, then exit 130 (128 + SIGINT), as shells expect."""
    from tunesvc.fleet.jobs import trials_stored

    now = trials_stored(store, template, hardware_id, keys)
    new = sum(now.values()) - sum(before.values())
    TextConsole(stderr=True).print(
        f"Interrupted: {_count(new, 'trial')} stored by this run ({sum(now.values())} in all for "
        f"{_count(len(keys), 'shape key')}) in {store.url}; a trial in flight is lost. Resume with: {command}",
        highlight=False,
        soft_wrap=True,
    )
    raise typer.Exit(130)


#: what the sweep table's terse columns mean
SWEEP_LEGEND = (
    "speed-up: heuristic ms / winner ms. trials: stored for the key; new: of them, measured by this run; "
    "failed: did not compile, run or match the reference. s: seconds this run spent on the key."
)


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
            f"{template.name} on {device.name}, {_count(count, 'worker')}{where} ({store.url})",
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
    from tunesvc.sweep import DEFAULT_OPTUNA_BUDGET

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
    tasks = {key: progress.add_task(key, total=limits[key], phase="pending") for key in keys}

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


@contextlib.contextmanager
def _removed_if_new_and_failing(db: str | None, uses_db: bool):
    """A command that fails leaves no database file it created: the file (and SQLite's side
    files) is removed if it did not exist before, the command failed, and it holds no trial."""
    path = None
    if uses_db:
        url = settings.db_url(db)
        if url.startswith("sqlite:///") and "?" not in url and url != "sqlite:///":
            path = Path(url.removeprefix("sqlite:///"))
    existed = path is None or path.exists()
    try:
        yield
    except BaseException:
        if not existed and path is not None and path.exists() and _holds_no_trials(path):
            for suffix in ("", "-wal", "-shm", "-journal"):
                with contextlib.suppress(OSError):
                    Path(f"{path}{suffix}").unlink()
        raise


def _holds_no_trials(path: Path) -> bool:
    import sqlite3

    try:
        connection = sqlite3.connect(f"file:{path.resolve()}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            return (
                "tunesvc_trials" not in tables
                or not connection.execute("SELECT 1 FROM tunesvc_trials LIMIT 1").fetchall()
            )
        finally:
            connection.close()
    except sqlite3.Error:
        return False


def _ray_shutdown() -> None:
    import ray

    ray.shutdown()


@app.command()
@user_errors
def show(
    kernel: Annotated[
        str | None,
        typer.Option(
            help="Only this kernel (a filter that matches nothing is an error).", autocompletion=_complete_kernel
        ),
    ] = None,
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
    """Show the stored winners of each kernel's current version, one table per device and kernel; filters that match nothing exit with an error."""
    from tunesvc.store import Store  # SQLAlchemy

    kernel = _kernel_filter(kernel)
    store = Store(db, readonly=True)
    try:
        winners = store.winners(kernel=kernel, device=device, shape=shape)
        counts = store.trial_counts(kernel=kernel, device=device, shape=shape)
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
            }
        )
    for hardware_id in sorted({w.hardware_id for w in shown}):
        on_device = [w for w in shown if w.hardware_id == hardware_id]
        console.print(Text(visible(f"Winners on {hardware_id}"), style="bold"), highlight=False, soft_wrap=True)
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
                    key=lambda w: natural_order(w.shape_key),
                )
                if version != current[name][0]:
                    which = "older version, not used by lookups"
                elif current[name][1]:
                    which = "current version, used by lookups"
                else:  # a captured kernel or a template this command does not import
                    which = "newest stored version, used by lookups"
                console.print(
                    _keyed_table(
                        f"{name} {version} ({which})",
                        ["shape key", "config", "ms"],
                        [[w.shape_key, _config_text(w.config), f"{w.time_ms:.4g}"] for w in rows],
                    )
                )
    failed = sum(n for status, n in counts.items() if status != "ok")
    hidden = f" ({len(older)} of older kernel versions: --all-versions)" if older and not all_versions else ""
    console.print(
        f"{_count(len(shown), 'winner')}{hidden}; {_count(sum(counts.values()), 'trial')}, "
        f"{failed} failed or invalid, in {store.url}.",
        highlight=False,
        soft_wrap=True,
    )


def _kernel_filter(kernel: str | None) -> str | None:
    """A --kernel filter as stored: the library's name of a shipped kernel (``layer_norm``) is
    its template's (``layernorm``)."""
    from tunesvc.template import canonical_name

    return canonical_name(kernel) if kernel is not None else None


def _nothing_matches(
    store: Any, what: str, *, kernel: str | None = None, device: str | None = None, shape: str | None = None
) -> TunesvcError:
    """The error of filters that match nothing stored: which filters, the nearest stored kernel or
    device name to a misspelt one, and what to run instead."""
    from tunesvc.template import SHIPPED
    from tunesvc.template import did_you_mean

    stored = store.winners()
    given = [
        f"--{name} '{value}'" for name, value in (("kernel", kernel), ("device", device), ("shape", shape)) if value
    ]
    hint = ""
    kernels = sorted({w.kernel for w in stored})
    if kernel is not None and kernel not in kernels and kernel not in SHIPPED:  # misspelt, not only untuned
        hint = did_you_mean(kernel, [*kernels, *SHIPPED])
    elif device is not None and not any(device.lower() in f"{w.device}\n{w.hardware_id}".lower() for w in stored):
        hint = did_you_mean(device, sorted({w.device for w in stored}))
    if not stored:
        held = "it holds no winners; `tune sweep` makes some"
    elif len(kernels) <= 4:
        held = f"it holds winners of {', '.join(kernels)}, which `tune show` lists"
    else:
        held = f"it holds winners of {len(kernels)} kernels, which `tune show` lists"
    return TunesvcError(f"No {what} in {store.url} match {' and '.join(given)}{hint}; {held}.")


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


def _count(n: int, noun: str, plural: str | None = None) -> str:
    """'1 winner', '2 winners': counts that read as English."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def _keyed_table(
    title: str,
    columns: list[str],
    rows: list[list[str]],
    caption: str | None = None,
    target: Console | None = None,
    **options: Any,
) -> Table:
    """A table whose first column (shape keys, kernel names) is never cut nor broken inside.

    rich shrinks and wraps columns to fit ``target``'s width (the terminal's): the first column
    keeps its whole width, the others wrap at spaces. Where even that does not fit (a 56-character
    decode key beside five numbers at 80 columns), each row stacks: the key on its line, the other
    columns' values below it, so that nothing is cut.
    """
    wide = Table(title=title, caption=caption, caption_justify="left", **options)
    wide.add_column(columns[0], no_wrap=True, overflow="fold")
    for column in columns[1:]:
        wide.add_column(column, overflow="fold")
    for row in rows:
        wide.add_row(*row)
    target = target or console  # the console that prints it, whose width it must fit
    unbounded = target.options.update_width(10_000)
    if Measurement.get(target, unbounded, wide).minimum <= target.width:
        return wide
    stacked = Table(title=title, caption=caption, caption_justify="left", **options)
    stacked.add_column(f"{columns[0]}; {', '.join(columns[1:])}", overflow="fold")
    for first, *rest in rows:
        details = " · ".join(f"{column} {value}" for column, value in zip(columns[1:], rest, strict=True))
        stacked.add_row(Group(Text(visible(first)), Padding(Text(visible(details), style="dim"), (0, 0, 0, 2))))
    return stacked


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
    from tunesvc.runtime import Runtime
    from tunesvc.template import ShapeKey
    from tunesvc.template import get_template

    if ":" in kernel and _captured_lookup(kernel, shape, db, bundle, as_json):
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
    console.print(f"key     {result.key}: {how}", highlight=False, soft_wrap=True)
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
    console.print(f"answer  {result.source} for {runtime.device.name}{detail}; {read}", highlight=False, soft_wrap=True)
    console.print(f"config  {_config_text(result.config)}", highlight=False, soft_wrap=True)
    if other_dtypes:
        held = ", ".join(f"{_count(n, 'key')} in {dtype}" for dtype, n in sorted(other_dtypes.items()))
        first = sorted(other_dtypes, key=lambda d: -other_dtypes[d])[0]
        console.print(
            f"note    {template.name} is tuned on {runtime.device.name} for {held}, which a {problem['dtype']} "
            f"lookup does not use; pass --dtype {first} to look one of those up.",
            highlight=False,
            soft_wrap=True,
        )


def _absolute(db: str | None) -> str:
    """A database as messages name it, a SQLite file by its absolute path (./tune.db depends on the folder)."""
    from tunesvc.store import database_name

    name = database_name(db)
    return str(Path(name).resolve()) if "://" not in name else name


def _bucketing(problem: dict[str, Any], key: str) -> dict[str, tuple[int, int]]:
    """The dims that a shape key rounds: {'M': (90, 128)} for matmul's 90x70x50."""
    from tunesvc.template import ShapeKey

    dims = dict(ShapeKey.parse(key).dims)
    return {
        dim: (value, dims[dim])
        for dim, value in problem.items()
        if dim in dims and isinstance(value, int) and dims[dim] != value
    }


def _captured_lookup(kernel: str, key: str, db: str | None, bundle: Path | None, as_json: bool) -> bool:
    """`tune lookup module:qualname --shape KEY` of a captured kernel: its stored winner for that
    key text (``n=1000,x_ptr.dtype=float16``), else the nearest stored key's, read without
    importing the kernel. False when ``kernel`` is not a captured kernel of --db / --bundle."""
    from tunesvc._capture import CapturedKey
    from tunesvc._capture import CapturedTemplate
    from tunesvc.device import current_device
    from tunesvc.serving import chain
    from tunesvc.template import ShapeKey

    device = current_device()
    if bundle is not None:
        from tunesvc.bundle import kernel_configs
        from tunesvc.bundle import read_bundle

        data = read_bundle(bundle)
        if kernel not in data["kernels"] or data["device"]["hardware_id"] != device.hardware_id:
            return False
        table = kernel_configs(bundle, data, kernel)
    else:
        from tunesvc.store import Store

        store = Store(db, readonly=True)
        try:
            if not store.captured_kernels(kernel):
                return False
            entries = sorted(store.winners(kernel=kernel, hardware_id=device.hardware_id), key=lambda e: e.updated_at)
        finally:
            store.close()
        table = {e.shape_key: e.config for e in entries}  # the newest version's winner of each key
    parsed: list[tuple[ShapeKey, str]] = [(CapturedKey.of(k), k) for k in table]

    def names(text: str) -> list[str]:
        return [part.partition("=")[0] for part in text.split(",")]

    if key not in table and table and all(names(key) != names(k) for k in table):
        example = min(table, key=natural_order)
        raise TunesvcError(
            f"--shape '{_short(key)}' is not a whole key of {kernel}: its stored keys name "
            f"{', '.join(names(example))} (such as {_short(example)}); give every one."
        )
    # the one chain's exact and nearest steps (its config list, and so its heuristic, is the module's)
    template = CapturedTemplate(kernel, "", [])
    found = chain.answer(template, {"key": key}, template.key({"key": key}), device, table, lambda: parsed)
    source, matched, distance = found.source, found.matched_key, found.distance
    if source == chain.HEURISTIC:
        source, matched, distance = "first listed config", None, None
    result = {
        "kernel": kernel,
        "key": key,
        "source": source,
        "matched_key": matched,
        "distance": distance,
        "config": table.get(matched) if matched else None,
    }
    if as_json:
        _print_json(result)
        return True
    detail = ""
    if source == "nearest":
        detail = f": stored key {matched}, {distance:.2f} doublings away (the distance between the keys' numbers on a log2 scale)"
    where = f"bundle {bundle.resolve()}" if bundle is not None else f"database {_absolute(db)}"
    console.print(f"key     {key}", highlight=False, soft_wrap=True)
    console.print(f"answer  {source} for {device.name}{detail}; read from {where}", highlight=False, soft_wrap=True)
    config = result["config"]
    shown = (
        _config_text(config)
        if isinstance(config, dict)
        else "the kernel's first config that its pruning keeps (not read here: that needs its module imported)"
    )
    console.print(f"config  {shown}", highlight=False, soft_wrap=True)
    return True


@app.command()
@user_errors
def export(
    out: Annotated[
        Path,
        typer.Option(
            help="A .json file (one device) or a folder (one file per device). A file is replaced only when it is a tunesvc bundle (in a folder: of the same device); links and other files are refused."
        ),
    ] = Path("tunesvc-bundles"),
    kernel: Annotated[
        str | None,
        typer.Option(
            help="Only this kernel (a filter that matches nothing is an error).", autocompletion=_complete_kernel
        ),
    ] = None,
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
    """Merge bundles and databases into --db: per key the faster measured winner stays (a tie keeps --db's); selectors where --db has none."""
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
            Text(visible(f"From {source}, winners of {hardware_id}"), style="bold"), highlight=False, soft_wrap=True
        )
        group = [c for c in changes if (c.source, c.hardware_id) == (source, hardware_id)]
        for kernel, version in dict.fromkeys((c.kernel, c.version) for c in group):
            table = _keyed_table(
                f"{kernel} {version}",
                ["shape key", "action", "incoming ms", "stored ms"],
                [
                    [c.shape_key, c.action, _ms(c.incoming_ms), _ms(c.stored_ms)]
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
                soft_wrap=True,
            )
    counts = {a: sum(c.action == a for c in changes) for a in ("added", "replaced", "kept")}
    console.print(
        f"{counts['added']} added, {counts['replaced']} replaced, {counts['kept']} kept in {store.url}.",
        highlight=False,
        soft_wrap=True,
    )


@app.command()
@user_errors
def verify(
    kernel: Annotated[
        str | None,
        typer.Option(
            help="Only this kernel (a filter that matches nothing is an error).", autocompletion=_complete_kernel
        ),
    ] = None,
    margin: Annotated[
        float, typer.Option(help="Flag a winner when the heuristic is faster by more than this fraction.")
    ] = 0.05,
    retune: Annotated[
        bool,
        typer.Option(
            "--retune",
            help="Sweep flagged keys again and store the new winners (a captured kernel, named with --kernel: tuned again over its config list on its recorded call).",
        ),
    ] = False,
    budget: Annotated[int, typer.Option(help="New trials per key with --retune.")] = 8,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Re-measure this device's stored winners; flag stale ones (kernel or Triton changed) and ones slower than the heuristic."""
    # re-measuring (torch, Triton); the database (SQLAlchemy)
    from tunesvc.device import current_device
    from tunesvc.store import Store
    from tunesvc.verify import verify as verify_winners

    _check_count("--budget", budget)
    kernel = _kernel_filter(kernel)
    store = Store(db, readonly=not retune)
    try:
        verdicts = verify_winners(store, kernel=kernel, margin=margin, retune=retune, budget=budget)
        stored_on = sorted({w.device for w in store.winners(kernel=kernel)}) if not verdicts else []
        if kernel is not None and not verdicts and not stored_on:
            raise _nothing_matches(store, "winners", kernel=kernel)
    finally:
        store.close()
    if as_json:
        return _print_json([v.to_dict() for v in verdicts])
    here = current_device()
    if not verdicts:
        which = f"{kernel} winners" if kernel else "winners"
        elsewhere = f": it holds {', '.join(stored_on)} {which} only" if stored_on else ""
        console.print(
            named(
                f"No {which} of {here.name} in {store.url} to verify{elsewhere} "
                "(verify on that GPU, or sweep this one with `tune sweep`)."
            ),
            highlight=False,
            soft_wrap=True,
        )
        return
    console.print(
        Text(visible(f"Winners of {here.name} in {store.url}"), style="bold"), highlight=False, soft_wrap=True
    )
    columns = ["shape key", "stored ms", "now ms", "heuristic ms", "flags", *(["retuned ms"] if retune else [])]
    for name, version in dict.fromkeys((v.kernel, v.version) for v in verdicts):
        rows = []
        for v in verdicts:
            if (v.kernel, v.version) != (name, version):
                continue
            flags = ", ".join(v.flags) + (f" ({v.detail})" if v.detail else "") if v.flags else "ok"
            rows.append(
                [
                    v.shape_key,
                    _ms(v.stored_ms),
                    _ms(v.measured_ms),
                    _ms(v.heuristic_ms),
                    flags,
                    *([_ms(v.retuned_ms)] if retune else []),
                ]
            )
        console.print(_keyed_table(f"{name} {version}", columns, rows))
    flagged = sum(v.retunable for v in verdicts)
    unjudged = len(verdicts) - sum(v.measured for v in verdicts)
    console.print(
        f"{_count(len(verdicts), 'winner')} checked, {flagged} flagged"
        + (f", {unjudged} not measured (see their flags)" if unjudged else "")
        + "."
        + ("" if retune or not flagged else " Run with --retune to sweep the flagged ones again.")
    )


@app.command()
@user_errors
def report(
    db: DbOption = None,
    kernel: Annotated[
        str | None,
        typer.Option(
            help="Only this kernel (a filter that matches nothing is an error).", autocompletion=_complete_kernel
        ),
    ] = None,
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


# -- captured triton.autotune kernels (tunesvc.capture) ---------------------------------------------
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
            help="Processes that compile a long-tuning key's configs ahead of their measurement; 0: none "
            "\\[default: $TUNESVC_COMPILE_WORKERS, else on a GPU half the cores, at most 8].",
        ),
    ] = None,
) -> None:
    """Run COMMAND with every triton.autotune kernel captured by tunesvc; exit with its exit code.

    Ends with one line on stderr over all of COMMAND's processes: kernels captured, keys served
    from the store, tuned (and their seconds), served untuned, and kernels left to Triton's own
    autotuner and why."""
    import json
    import os
    import subprocess
    import tempfile

    from tunesvc._capture import summary_line
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
            code = subprocess.call(command, env=env)
        except OSError as exc:
            raise TunesvcError(f"Cannot run {command[0]}: {exc.strerror}.") from None
        finally:
            with open(summary) as f:
                records = [json.loads(line) for line in f if line.strip()]
            os.unlink(summary)
        typer.echo(summary_line(records), err=True)
    if tune_misses and _tune_misses(db, kernel or []):
        code = code or 1  # a key not tuned (said, one line each)
    raise typer.Exit(code)


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
) -> None:
    """List the shape keys captured kernels met with no stored winner in mode lookup (or tune them)."""
    if tune:
        if _tune_misses(db, kernel or []):
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
        raise TunesvcError(f"No misses in {store.url} of --kernel {', '.join(kernel)}{hint}; {held}.")
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
            Text(visible(f"Misses of {hardware_id} in {store.url}"), style="bold"), highlight=False, soft_wrap=True
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


def _tune_misses(db: str | None, kernels: list[str]) -> int:
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
            console.print(f"No open misses of {device.name} in {store.url}.")
        for m in todo:
            console.print(f"{m.kernel} {m.shape_key}: importing {m.kernel.partition(':')[0]} to tune it")
            try:
                winner = tune_recorded(store, m.kernel, m.version, m.shape_key, m.call)
            except TunesvcError as exc:
                console.print(f"  not tuned: {exc}", markup=False, highlight=False, soft_wrap=True)
                untuned += 1
                continue
            store.set_miss_status(m.id, "tuned")
            console.print(f"  tuned: {_config_text(winner)}")
    finally:
        store.close()
    return untuned


# -- tune selector / tune evaluate: configs for shapes nobody tuned (tunesvc/selector.py) ----------
def _ratio(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else "-"


def _pct(value: float | None) -> str:
    return f"{value:.0%}" if value is not None else "-"


MinCoverageOption = Annotated[
    float,
    typer.Option(
        "--min-coverage",
        help="Fit on a tuned key only where at least this fraction of the candidates was measured (1.0: all).",
    ),
]


@app.command()
@user_errors
def selector(
    kernel: Annotated[
        str,
        typer.Argument(
            help="Kernel name (see `tune kernels`; the library's names, such as layer_norm, too).",
            autocompletion=_complete_kernel,
        ),
    ],
    cross_measure: Annotated[
        bool,
        typer.Option(
            "--cross-measure",
            help="First measure every distinct winner and runner-up on every tuned key of this device (stored).",
        ),
    ] = False,
    time_budget: Annotated[
        float | None,
        typer.Option(
            help="With --cross-measure: start no further tuned key after this many seconds (a rerun measures "
            "the keys left) \\[default: no limit]."
        ),
    ] = None,
    retime: Annotated[
        bool,
        typer.Option(
            "--retime",
            help="With --cross-measure: also time every candidate on every tuned key once more, as a sweep's "
            "finalists are timed (long graph replays), once per key (stored).",
        ),
    ] = False,
    shard: Annotated[
        str | None,
        typer.Option(
            metavar="I/N",
            help="With --cross-measure: measure only every N-th tuned key from the I-th (0-based) and fit "
            "nothing, so that N processes, one per GPU (CUDA_VISIBLE_DEVICES), split the work on one "
            "--db; then run `tune selector` once to fit.",
        ),
    ] = None,
    min_coverage: MinCoverageOption = 1.0,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Fit the kernel's selector on this device from the stored trials, store it, and print it (the model kept, whether it projects a first pick that does not fit the shape onto the nearest config that does, and its leave-one-out score beside the nearest rule's)."""
    from tunesvc import selector as selectors  # fitting (scikit-learn), measuring (torch, Triton)
    from tunesvc.device import current_device
    from tunesvc.store import Store
    from tunesvc.sweep import check_time_budget
    from tunesvc.template import get_template

    if time_budget is not None and not cross_measure:
        raise TunesvcError("--time-budget limits --cross-measure; add --cross-measure, or drop --time-budget.")
    if retime and not cross_measure:
        raise TunesvcError("--retime is part of --cross-measure; add --cross-measure, or drop --retime.")
    share = _shard(shard, cross_measure)
    check_time_budget(time_budget)
    template, device = get_template(kernel), current_device()
    store = Store(db)
    try:
        measured = 0
        if cross_measure:
            measured = selectors.cross_measure(
                store,
                template,
                device,
                on_key=lambda key, n: console.print(f"measuring {n} candidates on {key}"),
                time_budget=time_budget,
                retime=retime,
                shard=share,
            )
        if shard is not None:
            if as_json:
                return _print_json({"trials_measured": measured, "shard": list(share)})
            console.print(f"Measured {measured} trials on share {shard} of the tuned keys; fit nothing.")
            return
        data = selectors.training_set(store, template, device, min_coverage=min_coverage)
        fitted, scores = selectors.keep(store, template, device, data)
    finally:
        store.close()
    if as_json:
        return _print_json(
            {
                "selector": fitted.to_dict() if fitted else None,
                "leave_one_out": {"selector": scores[0], "nearest": scores[1]} if scores else None,
                "trials_measured": measured,
                "keys": list(data.keys),
                "skipped": [{"shape_key": k, "why": why} for k, why in data.skipped],
            }
        )
    for key, why in data.skipped:
        console.print(f"skipped {key}: {why}", highlight=False, markup=False, soft_wrap=True)
    if fitted is None:
        raise TunesvcError(
            f"{len(data.keys)} tuned key(s) of {kernel} on {device.name} are usable, too few to fit a selector "
            f"and judge it (it needs {selectors.MIN_KEYS_KEPT}); tune more shapes, or run with --cross-measure."
        )
    for line in fitted.describe():
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    console.print(
        f"Fitted on {fitted.keys} tuned keys, {len(fitted.candidates)} candidates"
        + (f" ({measured} trials measured first)" if cross_measure else "")
        + f"; kept the {fitted.model} model"
        + (", projecting a first pick that does not fit" if fitted.project else "")
        + f"; stored in {store.url}."
    )
    if scores is not None:
        console.print(
            f"Each tuned key left out in turn, on the stored times, its picks run {scores[0]:.3f}x as long as "
            f"the key's fastest candidate (geometric mean), the nearest rule's {scores[1]:.3f}x.",
            highlight=False,
        )


def _shard(text: str | None, cross_measure: bool) -> tuple[int, int]:
    """``--shard I/N`` as (I, N); (0, 1) without it."""
    if text is None:
        return 0, 1
    if not cross_measure:
        raise TunesvcError("--shard splits --cross-measure; add --cross-measure, or drop --shard.")
    index, _, count = text.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        raise TunesvcError(f"--shard takes I/N with 0 <= I < N, such as 0/4, not {text!r}.")
    return int(index), int(count)


@app.command()
@user_errors
def evaluate(
    kernel: Annotated[
        str,
        typer.Argument(
            help="Kernel name (see `tune kernels`; the library's names, such as layer_norm, too).",
            autocompletion=_complete_kernel,
        ),
    ],
    min_coverage: MinCoverageOption = 1.0,
    csv: Annotated[
        Path | None,
        typer.Option("--csv", help="Also append one row per held-out key to this CSV file, as each is measured."),
    ] = None,
    time_budget: Annotated[
        float | None,
        typer.Option(
            help="Hold out no further key after this many seconds (the first always is); "
            "the table and the CSV have the keys measured \\[default: no limit]."
        ),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Leave-one-shape-out on this device: each tuned key's winner against what the selector and the nearest rule pick without it, all measured."""
    from tunesvc import selector as selectors  # fitting (scikit-learn), measuring (torch, Triton)
    from tunesvc.device import current_device
    from tunesvc.store import Store
    from tunesvc.sweep import check_time_budget
    from tunesvc.template import get_template

    check_time_budget(time_budget)
    if csv is not None:
        selectors.check_csv_path(csv)
    template, device = get_template(kernel), current_device()
    store = Store(db, readonly=True)
    try:
        progress = None if as_json else (lambda key: console.print(f"held out: {key}", highlight=False))
        rows = selectors.evaluate(
            store,
            template,
            device,
            min_coverage=min_coverage,
            on_key=progress,
            on_row=None if csv is None else (lambda row: selectors.append_csv([row], csv)),
            time_budget=time_budget,
        )
        tuned = len(selectors.tuned_winners(store, template, device.hardware_id))
    finally:
        store.close()
    totals = selectors.summary(rows)
    if as_json:
        return _print_json({"rows": [r.to_dict() for r in rows], "summary": totals})
    table = Table(title=f"{kernel} on {device.name}: held-out keys, measured (ratio = tuned ms / pick ms)")
    for column in ("shape key", "tuned ms", "selector", "selector ms", "ratio", "nearest", "nearest ms", "ratio "):
        table.add_column(column)
    for r in rows:
        table.add_row(
            r.shape_key,
            _ms(r.tuned_ms),
            r.selector_source,
            _ms(r.selector_ms),
            _ratio(r.selector_ratio),
            r.nearest_source,
            _ms(r.nearest_ms),
            _ratio(r.nearest_ratio),
        )
    console.print(table)
    summary = Table(title="Within 5% of the tuned best, and the worst ratio")
    for column in ("kernel", "held out", "selector within 5%", "selector worst", "nearest within 5%", "nearest worst"):
        summary.add_column(column)
    for name, t in totals.items():
        summary.add_row(
            name,
            str(t["held_out"]),
            _pct(t["selector_within_5pct"]),
            _ratio(t["selector_worst_ratio"]),
            _pct(t["nearest_within_5pct"]),
            _ratio(t["nearest_worst_ratio"]),
        )
    console.print(summary)
    if len(rows) < tuned:
        console.print(
            f"The time budget held out {len(rows)} of the {tuned} tuned keys; a rerun starts again from the first."
        )


# -- tune db: the schema (Alembic migrations in tunesvc/store/alembic) -------------------------------
db_app = _App(
    cls=_Group,
    help="Create, upgrade and inspect a database's schema (Alembic migrations; every row is kept).",
    no_args_is_help=True,
)
app.add_typer(db_app, name="db")


def _db_name(db: str | None) -> str:
    from tunesvc.store import database_name

    return database_name(db)


def _upgraded(db: str | None, before: str | None, after: str) -> None:
    name = _db_name(db)
    if before is None:
        console.print(f"Created tunesvc's tables in {name} at schema revision {after}.", soft_wrap=True)
    elif before == after:
        console.print(f"{name} is already at schema revision {after}, the newest.", soft_wrap=True)
    else:
        console.print(f"Upgraded {name} from schema revision {before} to {after}.", soft_wrap=True)


@db_app.command("init")
@user_errors
def db_init(db: DbOption = None) -> None:
    """Create a database at the current schema, or upgrade an older one to it."""
    from tunesvc.store import upgrade  # SQLAlchemy, Alembic

    _upgraded(db, *upgrade(db))


@db_app.command("upgrade")
@user_errors
def db_upgrade(db: DbOption = None) -> None:
    """Upgrade an existing database to the current schema; says from which revision to which."""
    from tunesvc.store import upgrade  # SQLAlchemy, Alembic

    _upgraded(db, *upgrade(db, create=False))


@db_app.command("current")
@user_errors
def db_current(db: DbOption = None, as_json: JsonOption = False) -> None:
    """Print a database's schema revision and whether `tune db upgrade` has work to do (reads only)."""
    # SQLAlchemy, Alembic
    from tunesvc.store import current_revision
    from tunesvc.store import head_revision

    revision, head = current_revision(db), head_revision()
    if as_json:
        return _print_json({"db": _db_name(db), "revision": revision, "head": head, "up_to_date": revision == head})
    state = (
        "the newest" if revision == head else named(f"older than this tunesvc's {head}; `tune db upgrade` migrates it")
    )
    console.print(f"{_db_name(db)}: schema revision {revision} ({state}).", soft_wrap=True)


def main() -> None:
    mark("cli imported")
    app()


if __name__ == "__main__":
    main()
