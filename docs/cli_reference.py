"""Write docs/cli.md, the CLI reference, from the CLI itself: ``python docs/cli_reference.py docs/cli.md``.

Typer's own generator (``typer tunesvc.cli utils docs``) renders each help text to HTML through
rich, which writes an apostrophe as ``&#x27;`` and ``>`` as ``&gt;``: Markdown viewers show some
entities and not others, and a reader of the file sees them all. This takes typer's Markdown
and turns those back into the text of ``tune --help``: no HTML entity, no tag.
"""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path

import typer
import typer.cli
import typer.main

from tunesvc.cli import app

NAME = "tune"


def reference() -> str:
    """The Markdown reference of every command and option, as typer generates it, in plain text."""
    command = typer.main.get_command(app)
    ctx = typer.Context(command, info_name=NAME, obj={typer.cli.MARKUP_MODE_KEY: app.rich_markup_mode})
    markdown = typer.cli.get_docs_for_click(obj=command, ctx=ctx, name=NAME)
    # rich's HTML of a help text: styled spans (none in tunesvc's help) and escaped characters
    text = html.unescape(re.sub(r"</?span[^>]*>", "", markdown))
    return text.strip() + "\n"


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        sys.exit("usage: python docs/cli_reference.py OUTPUT.md")
    Path(argv[0]).write_text(reference(), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1:])
