"""The README cannot drift from the CLI: every command and option is documented there."""

from __future__ import annotations

import re
from pathlib import Path

import typer.main

from tunesvc.cli import app

README = (Path(__file__).parent.parent / "README.md").read_text()


def _commands():
    return typer.main.get_command(app).commands


def test_every_command_is_in_the_cli_reference():
    names = sorted(_commands())
    assert names == ["export", "kernels", "lookup", "show", "space", "sweep"]
    for name in names:
        assert re.search(rf"`tune {name}\b", README), f"README's CLI reference lacks `tune {name}`"


def test_every_option_is_in_the_readme():
    for name, command in _commands().items():
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
