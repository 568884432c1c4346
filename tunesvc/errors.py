"""The one exception type that means "the user asked for something we cannot do"."""

from __future__ import annotations


class TunesvcError(Exception):
    """A user's mistake or an unusable input, told in one sentence that says what to do.

    The CLI prints its message alone (no traceback) and exits non-zero; anything else that
    escapes is a bug and keeps its traceback.
    """
