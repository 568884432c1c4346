"""Strings from a database or bundle shown as text: on a terminal, in a figure, in a page.

A shared database or a bundle from anyone may hold any string where a shape key, a kernel or a
device name belongs. Shown as it is, ESC and the other control characters act on the terminal
(OSC 52 sets the clipboard, OSC 0 the window title, CSI 2J clears the screen), bidirectional
overrides and zero-width characters make a name read as another, a lone surrogate cannot be
written as UTF-8 at all, a pair of ``$`` makes matplotlib parse mathtext (which fails on
``$\\frac{1}{$``), and a string of megabytes floods a terminal or stalls matplotlib's layout.
"""

from __future__ import annotations

import html
import re
import sys
import unicodedata
import warnings

#: Unicode categories a terminal acts on or shows as nothing instead of a glyph: controls (Cc:
#: C0, C1, DEL), format characters (Cf: zero-width spaces and joiners, bidirectional marks,
#: overrides and isolates, the BOM, tags), lone surrogates (Cs), line and paragraph separators
#: (Zl, Zp) and code points Unicode has not assigned (Cn)
_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp", "Cn"})
#: the longest string a terminal line or a table cell shows whole (a config or a long key fits)
MAX_SHOWN = 4096
#: the longest string a figure's title or label shows: matplotlib lays text out slowly (a
#: 100,000-character title takes 18 s to draw), and no figure has room for more
MAX_FIGURE_TEXT = 240


def _escaped(char: str) -> str:
    return char if unicodedata.category(char) not in _HIDDEN else char.encode("unicode_escape").decode("ascii")


def visible(text: str, most: int = MAX_SHOWN) -> str:
    """``text`` with every character of :data:`_HIDDEN` written out as its escape (ESC as
    ``\\x1b``, U+202E as ``\\u202e``), cut after ``most`` characters with a note of how many more
    it holds."""
    more = len(text) - most
    if more > 0:
        text = text[:most]
    if not text.isprintable():  # the common case returns at C speed: every character shown as itself
        text = "".join(map(_escaped, text))
    return f"{text}... ({more:,} more characters)" if more > 0 else text


def figure_text(text: str) -> str:
    """``text`` for a matplotlib label or title: :func:`visible` (at most
    :data:`MAX_FIGURE_TEXT` characters), and every ``$`` a literal one (``\\$``), so that no part
    of it is read as mathtext."""
    return visible(text, MAX_FIGURE_TEXT).replace("$", r"\$")


def html_text(text: str) -> str:
    """``text`` for an HTML page: :func:`visible`, then HTML's special characters escaped."""
    return html.escape(visible(text))


_NUMBERS = re.compile(r"([0-9]+)")


def natural_order(text: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key that orders the numbers inside ``text`` by value: ``M=16`` before ``M=128``
    before ``M=1024`` (as text, 1024 comes first), the rest by its characters."""
    return tuple(
        (1, int(part)) if part.isascii() and part.isdigit() else (0, part) for part in _NUMBERS.split(text) if part
    )


def warn(message: str, category: type[Warning] = RuntimeWarning, stacklevel: int = 1) -> None:
    """``warnings.warn`` for a line tunesvc says while it serves a program: where a filter turns
    warnings into errors (``python -W error``, ``PYTHONWARNINGS=error``, pytest's
    ``filterwarnings = error``), the line goes to stderr instead, since a warning of tunesvc's
    raised inside a user's launch would end a program that runs without tunesvc."""
    try:
        warnings.warn(message, category, stacklevel=stacklevel + 1)
    except Exception:  # an error filter raised it (or a showwarning hook failed): said, never raised
        try:
            sys.stderr.write(f"{category.__name__}: {message}\n")
        except Exception:  # no stderr to write to (closed, a broken pipe): nothing left to say it on
            pass
