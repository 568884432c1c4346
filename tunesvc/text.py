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
import os
import re
import sys
import unicodedata
import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import FrameType

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


#: the modules whose frames a warning of tunesvc's looks past to the user's line that called into
#: them: a ``kernel[grid](...)`` launch reaches tunesvc through Triton's frames (and the start-up
#: hook's trampoline), a shipped kernel through torch's autograd
_LOOKED_PAST = ("tunesvc", "tunesvc.kernels", "_tunesvc_capture", "triton", "torch")
#: ... and the file names of code they generate: tunesvc's replayed ops and launch plans, torch.fx's graphs
_GENERATED = ("<tunesvc.", "<eval_with_key>")


def _looked_past() -> tuple[str, ...]:
    """The file-name prefixes of :data:`_LOOKED_PAST`'s modules imported so far (a module not
    imported has no frame on the stack): a package's folders, a module's file; and :data:`_GENERATED`."""
    prefixes = list(_GENERATED)
    for name in _LOOKED_PAST:
        module = sys.modules.get(name)
        if module is None:
            continue
        if hasattr(module, "__path__"):
            prefixes += [os.path.join(folder, "") for folder in module.__path__]
        elif module.__file__:
            prefixes.append(module.__file__)
    return tuple(prefixes)


def _user_stacklevel(prefixes: tuple[str, ...]) -> int:
    """The ``stacklevel`` of :func:`warn`'s call to ``warnings.warn`` that names the first frame
    whose file is outside ``prefixes``, counted as ``warnings`` counts (no frame of the import
    machinery); the outermost frame where every frame is inside."""
    level = 1  # warn itself; the walk starts at warn's caller
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not ("importlib" in name and "_bootstrap" in name):
            level += 1
            if not name.startswith(prefixes):
                break
        frame = frame.f_back
    return level


def warn(message: str, category: type[Warning] = RuntimeWarning) -> None:
    """``warnings.warn`` for a line tunesvc says while it serves a program, its file and line the
    user's: the first frame outside tunesvc, Triton and torch (the ``kernel[grid](...)`` launch,
    the call of a shipped kernel or of :func:`tunesvc.lookup`). Where a filter turns warnings into
    errors (``python -W error``, ``PYTHONWARNINGS=error``, pytest's ``filterwarnings = error``), the
    line goes to stderr instead, since a warning of tunesvc's raised inside a user's launch would
    end a program that runs without tunesvc."""
    prefixes = _looked_past()
    try:
        if sys.version_info >= (3, 12):
            warnings.warn(message, category, stacklevel=2, skip_file_prefixes=prefixes)
        else:  # no skip_file_prefixes before Python 3.12: the same frame, found by walking the stack
            warnings.warn(message, category, stacklevel=_user_stacklevel(prefixes))
    except Exception:  # an error filter raised it (or a showwarning hook failed): said, never raised
        try:
            sys.stderr.write(f"{category.__name__}: {message}\n")
        except Exception:  # no stderr to write to (closed, a broken pipe): nothing left to say it on
            pass
