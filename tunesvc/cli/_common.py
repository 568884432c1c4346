"""What every command module of `tune` shares: the app, its options, errors as one line, output.

The app object (:data:`app`, whose commands the other modules of :mod:`tunesvc.cli` register),
the top-level callback (--version, --debug), the shared options (--db, --json) and shell
completion of their values, :func:`user_errors` (a TunesvcError or an OSError as one line on
stderr, warnings as one line each, a database file a failed command created removed), and the
console, table and number formatting that the commands print with. Like every module of the
CLI, it imports only typer, rich and light modules of tunesvc's at its top; the rest of the
library is imported inside the functions that call it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
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
from tunesvc.command import named as named
from tunesvc.command import program as program
from tunesvc.errors import TunesvcError
from tunesvc.text import visible


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


def whole_lines(target: Console) -> bool:
    """The ``soft_wrap`` of a message line printed on ``target``: whole, one line per message, to
    a pipe or a file (grep and scripts read it so); word-wrapped at a terminal's width, which would
    otherwise cut words at its edge."""
    return not target.is_terminal


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
#: how long one replay of a captured kernel's recorded call may run (`misses --tune`, `verify`)
TimeLimitOption = Annotated[
    float,
    typer.Option(
        "--time-limit",
        min=1.0,
        max=86400.0,
        help="Seconds one replay of a captured kernel's recorded call may run before its process is stopped.",
    ),
]


def _complete_kernel(incomplete: str) -> list[str]:
    from tunesvc.completion import kernel_names  # only a TAB press needs it

    return [name for name in kernel_names() if name.startswith(incomplete)]


#: --kernel of the commands that read stored winners (show, export, verify, report)
KernelFilter = Annotated[
    str | None,
    typer.Option(help="Only this kernel (a filter that matches nothing is an error).", autocompletion=_complete_kernel),
]
#: the kernel a command builds a template of (sweep, space)
KernelArgument = Annotated[
    str,
    typer.Argument(
        help="Kernel name (see `tune kernels`; the library's names, such as layer_norm, too) or module:attribute.",
        autocompletion=_complete_kernel,
    ),
]


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
    """One message on stderr: "Error: " and ``message`` as text, its hints naming :func:`program`;
    one line to a pipe, wrapped between words at a terminal (see :func:`whole_lines`)."""
    line = Text("Error: ", style="bold red") + Text(visible(named(message)))
    stderr = TextConsole(stderr=True)
    stderr.print(line, highlight=False, soft_wrap=whole_lines(stderr))


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
                stderr.print(line, highlight=False, soft_wrap=whole_lines(stderr))


#: the most trials a --budget or --patience counts: what every store's integer column holds
MAX_COUNT = 2**31 - 1


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
    except BaseException as exc:
        succeeded = isinstance(exc, (typer.Exit, SystemExit)) and not getattr(exc, "exit_code", getattr(exc, "code", 1))
        if not succeeded and not existed and path is not None and path.exists() and _holds_nothing(path):
            for suffix in ("", "-wal", "-shm", "-journal"):
                with contextlib.suppress(OSError):
                    Path(f"{path}{suffix}").unlink()
        raise


#: the tables whose rows are data a user would miss (a command's own device and kernel rows are not)
_DATA_TABLES = ("tunesvc_trials", "tunesvc_winners", "tunesvc_misses", "tunesvc_selectors", "tunesvc_jobs")


def _holds_nothing(path: Path) -> bool:
    """Whether the SQLite file holds no trial, winner, miss, selector or job (the misses a
    program under `tune run` recorded before it failed are kept, with the file)."""
    import sqlite3

    try:
        # read-write, never created: the last connection to close removes SQLite's -wal and -shm
        # files, which a read-only one would leave beside the database
        connection = sqlite3.connect(f"file:{path.resolve()}?mode=rw", uri=True)
        try:
            tables = {r[0] for r in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            return not any(
                connection.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchall()  # table names of ours, never data
                for table in _DATA_TABLES
                if table in tables
            )
        finally:
            connection.close()
    except sqlite3.Error:
        return False


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
    return TunesvcError(f"No {what} in {store.shown_url} match {' and '.join(given)}{hint}; {held}.")


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


def _absolute(db: str | None) -> str:
    """A database as messages name it, a SQLite file by its absolute path (./tune.db depends on the folder)."""
    from tunesvc.store import database_name

    name = database_name(db)
    return str(Path(name).resolve()) if "://" not in name else name
