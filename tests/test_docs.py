"""The README cannot drift from the CLI: every command and option is documented there."""

from __future__ import annotations

import re
from pathlib import Path

import typer.main

from tunesvc.cli import app

README = (Path(__file__).parent.parent / "README.md").read_text()


def _commands():
    return typer.main.get_command(app).commands


def _leaves(commands=None, prefix=""):
    """(name, command) of every command that runs, sub-commands of groups as "db upgrade"."""
    for name, command in (commands if commands is not None else _commands()).items():
        if hasattr(command, "commands"):  # a group (typer.Typer added with add_typer)
            yield from _leaves(command.commands, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", command


def test_every_command_is_in_the_cli_reference():
    names = sorted(_commands())
    assert names == ["db", "export", "import", "kernels", "lookup", "report", "show", "space", "sweep", "verify"]
    for name in names:
        assert re.search(rf"`tune {name}\b", README), f"README's CLI reference lacks `tune {name}`"


def test_every_sub_command_is_in_the_cli_reference():
    names = [name for name, _ in _leaves() if " " in name]
    assert {"db init", "db upgrade", "db current"} <= set(names)
    for name in names:
        assert re.search(rf"`tune {name}\b", README), f"README's CLI reference lacks `tune {name}`"


def test_every_option_is_in_the_readme():
    for name, command in _leaves():
        for param in command.params:
            for opt in param.opts:
                if opt.startswith("--") and opt != "--help":
                    assert opt in README, f"README does not mention {opt} of `tune {name}`"


def test_version_flag():
    from typer.testing import CliRunner

    from tunesvc import __version__

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert f"tunesvc {__version__}" in result.output
