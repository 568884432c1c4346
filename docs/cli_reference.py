"""Write docs/cli.md, the CLI reference, from the CLI itself: ``python docs/cli_reference.py docs/cli.md``.

Typer's own generator (``typer tunesvc.cli utils docs``) renders each help text to HTML through
rich, which writes an apostrophe as ``&#x27;`` and ``>`` as ``&gt;``: Markdown viewers show some
entities and not others, and a reader of the file sees them all. This takes typer's Markdown
and turns those back into the text of ``tune --help``: no HTML entity, no tag. A group's list of
commands gives each command's first paragraph whole, where click would cut it at 45 characters
with "...".
"""

from __future__ import annotations

import html
import inspect
import re
import sys
from pathlib import Path

import click
import typer
import typer.cli
import typer.main

from tunesvc.cli import app

NAME = "tune"


def reference() -> str:
    """The Markdown reference of every command and option, as typer generates it, in plain text."""
    command = typer.main.get_command(app)
    _whole_short_help(command)
    ctx = typer.Context(command, info_name=NAME, obj={typer.cli.MARKUP_MODE_KEY: app.rich_markup_mode})
    markdown = typer.cli.get_docs_for_click(obj=command, ctx=ctx, name=NAME)
    # rich's HTML of a help text: styled spans (none in tunesvc's help) and escaped characters
    text = html.unescape(re.sub(r"</?span[^>]*>", "", markdown))
    return text.strip() + "\n"


def _whole_short_help(group: click.Command) -> None:
    """Give every sub-command without a short help its help's first paragraph, so that the list
    of commands is not cut (click's ``get_short_help_str`` cuts a long help at 45 characters)."""
    for sub in getattr(group, "commands", {}).values():
        if sub.short_help is None and sub.help:
            sub.short_help = " ".join(inspect.cleandoc(sub.help).split("\n\n")[0].split())
        _whole_short_help(sub)


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        sys.exit("usage: python docs/cli_reference.py OUTPUT.md")
    Path(argv[0]).write_text(reference(), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1:])
