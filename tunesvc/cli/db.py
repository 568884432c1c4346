"""`tune db init`, `tune db upgrade` and `tune db current`: a database's schema (the Alembic
migrations in tunesvc/store/alembic; every row is kept)."""

from __future__ import annotations

from tunesvc.cli._common import DbOption
from tunesvc.cli._common import JsonOption
from tunesvc.cli._common import _App
from tunesvc.cli._common import _Group
from tunesvc.cli._common import _print_json
from tunesvc.cli._common import app
from tunesvc.cli._common import console
from tunesvc.cli._common import named
from tunesvc.cli._common import user_errors
from tunesvc.cli._common import whole_lines

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
        console.print(f"Created tunesvc's tables in {name} at schema revision {after}.", soft_wrap=whole_lines(console))
    elif before == after:
        console.print(f"{name} is already at schema revision {after}, the newest.", soft_wrap=whole_lines(console))
    else:
        console.print(f"Upgraded {name} from schema revision {before} to {after}.", soft_wrap=whole_lines(console))


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
    console.print(f"{_db_name(db)}: schema revision {revision} ({state}).", soft_wrap=whole_lines(console))
