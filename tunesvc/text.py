"""Strings from a database or bundle shown as text: on a terminal, in a figure.

A shared database or a bundle from anyone may hold any string where a shape key, a kernel or a
device name belongs. Shown as it is, ESC and the other control characters act on the terminal
(OSC 52 sets the clipboard, OSC 0 the window title, CSI 2J clears the screen) and a pair of
``$`` makes matplotlib parse mathtext, which fails on ``$\\frac{1}{$``.
"""

from __future__ import annotations

import re

#: characters that a terminal acts on instead of showing (C0 and C1 controls, DEL) and those
#: that reorder what follows them (bidirectional marks, overrides and isolates)
_UNSHOWN = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def visible(text: str) -> str:
    """``text`` with every control character written out as its escape (ESC as ``\\x1b``)."""
    return _UNSHOWN.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def figure_text(text: str) -> str:
    """``text`` for a matplotlib label or title: :func:`visible`, and every ``$`` a literal one
    (``\\$``), so that no part of it is read as mathtext."""
    return visible(text).replace("$", r"\$")


_NUMBERS = re.compile(r"(\d+)")


def natural_order(text: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key that orders the numbers inside ``text`` by value: ``M=16`` before ``M=128``
    before ``M=1024`` (as text, 1024 comes first), the rest by its characters."""
    return tuple((1, int(part)) if part.isdigit() else (0, part) for part in _NUMBERS.split(text) if part)
