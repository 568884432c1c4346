"""`tune`: the command line. Each command is a thin layer over a library call.

The app, and what its commands share, is in :mod:`tunesvc.cli._common` (its underscore names
are imported by this package's modules alone); each module imported
below holds a group of commands, which its ``@app.command()`` decorators register on that app:
the order of these imports is the order of `tune --help` (and of docs/cli.md).

`tune --help`, `tune --version` and every TAB press of shell completion import this package,
which imports typer, rich and a few light modules of tunesvc's, so each command imports the
library modules it calls in its body: torch, Triton, SQLAlchemy, Optuna and matplotlib (behind
them) load only for commands that use them, and a start costs typer and rich alone.
"""

from __future__ import annotations

# the command modules, for their commands; isort would sort them out of order
# isort: off
from tunesvc.cli import catalog  # noqa: F401  (kernels, space)
from tunesvc.cli import sweep  # noqa: F401  (sweep)
from tunesvc.cli import winners  # noqa: F401  (show, lookup)
from tunesvc.cli import bundle  # noqa: F401  (export, import, verify, adopt, report)
from tunesvc.cli import capture  # noqa: F401  (run, misses)
from tunesvc.cli import selector  # noqa: F401  (selector, evaluate)
from tunesvc.cli import db  # noqa: F401  (db init, db upgrade, db current)

# isort: on
import sys

from tunesvc.cli._common import app
from tunesvc.cli._common import console
from tunesvc.cli._common import named
from tunesvc.cli._common import program
from tunesvc.cli._common import user_errors
from tunesvc.cli._resident import run_in_resident
from tunesvc.timeline import mark

__all__ = ["app", "console", "main", "named", "program", "user_errors"]


def main() -> None:
    """The `tune` command: where a resident process runs (tunesvc.cli._resident), a sweep runs as its
    fork; everything else, here."""
    mark("cli imported")
    code = run_in_resident(sys.argv)
    if code is not None:
        sys.exit(code)
    app()
