"""What `tune` prints for people: help with every default, tables that keep whole shape keys and
kernel names at 80 and 120 columns, lookups that say where their answer came from."""

from __future__ import annotations

import re

import pytest
import typer.main
from typer.testing import CliRunner

from tunesvc.cli import app


def invoke(*args: str, width: int = 80):
    # rich reads COLUMNS when stdout is not a terminal (CliRunner's, or a pipe)
    return CliRunner().invoke(app, list(args), env={"COLUMNS": str(width)})


def _leaves(commands=None, prefix=""):
    for name, command in (commands if commands is not None else typer.main.get_command(app).commands).items():
        if hasattr(command, "commands"):
            yield from _leaves(command.commands, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", command


def _flat(text: str) -> str:
    """Help text with the panels' borders gone and the lines joined, as one line of words."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


@pytest.mark.parametrize("name", [name for name, _ in _leaves()])
def test_help_shows_every_bracketed_default_and_readable_types(name):
    command = dict(_leaves())[name]
    result = invoke(*name.split(), "--help", width=200)
    assert result.exit_code == 0, result.output
    shown = _flat(result.stdout)
    assert "<bool>" not in shown and "<list[" not in shown, shown
    for param in command.params:
        # rich markup would eat "[default: ./tune.db]" and "[grid: all; others: 50]" unless escaped
        for bracketed in re.findall(r"\\?\[[^\]]*\]", param.help or ""):
            assert " ".join(bracketed.lstrip("\\").split()) in shown, (name, param.name, bracketed)


def test_help_of_sweep_names_the_defaults_that_matter():
    shown = _flat(invoke("sweep", "--help", width=100).stdout)
    for text in ("[default: ./tune.db]", "[grid: all; others: 50]", "[default: no limit]", "tunesvc[ray]"):
        assert text in shown, text
