"""What a stored or shipped value must be: bundles (:mod:`tunesvc.bundle`) and database rows
(:mod:`tunesvc.store`) are read by the same rules, so a value one refuses the other refuses too.

- JSON is decoded only where it nests at most :data:`MAX_JSON_DEPTH` deep and is at most
  :data:`MAX_JSON_BYTES` long, checked without recursion before :func:`json.loads` (which
  recurses, and raises RecursionError on a document nested a few thousand deep).
- A config is a non-empty table of parameter names to whole numbers or short texts; a winner's
  time a finite positive number (pydantic's types of them, and the checks that use them, are in
  :mod:`tunesvc.schemas`, imported only where a value is checked).
- A shape key is at most 512 characters, and its digits are ASCII digits: ``int()`` reads
  ``M=١٢`` as 12 and fails on ``M=²``, which ``str.isdigit`` accepts, so such a key could never
  match the key it claims to be; and it holds no NUL, which PostgreSQL's text cannot store and
  SQLite's string functions end at. Any other character is allowed: the CLI shows stored
  strings as text (tunesvc.text), control characters escaped.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

#: deeper than any JSON tunesvc writes (a config is 1 deep, a selector or a recorded call under 10)
MAX_JSON_DEPTH = 64
#: one stored JSON value (a selector of a large tree is under 1 MiB)
MAX_JSON_BYTES = 16 << 20
#: a shape key's longest text (the store's column is 512 characters)
MAX_KEY = 512

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


class Unreadable:
    """What a JSON column reads as when its text cannot be decoded safely: the row's check
    (:func:`json_problem`) names the reason, and the row is skipped instead of breaking a query."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"Unreadable({self.reason!r})"


def json_depth(text: str) -> int:
    """How deep ``text``'s arrays and objects nest, counted without recursion (strings skipped)."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:  # the common case, at C speed
        return MAX_JSON_DEPTH
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(1 if c in "[{" else -1 for c in brackets), default=0)


def load_json(data: str | bytes | bytearray | memoryview) -> Any:
    """JSON decoded as SQLAlchemy's JSON columns do, or :class:`Unreadable` instead of an exception.

    The store's engines decode every JSON column through this (``json_deserializer``): an
    exception raised while a row is fetched would abort the whole query, where one bad row
    should be skipped alone.
    """
    try:
        text = bytes(data).decode() if not isinstance(data, str) else data
    except UnicodeDecodeError:
        return Unreadable("not UTF-8")
    if len(text) > MAX_JSON_BYTES:
        return Unreadable(f"over {MAX_JSON_BYTES >> 20} MiB of JSON")
    if json_depth(text) > MAX_JSON_DEPTH:
        return Unreadable(f"JSON nested over {MAX_JSON_DEPTH} deep")
    try:
        return json.loads(text)
    except RecursionError:  # json_depth counts what json.loads recurses on; kept as the last guard
        return Unreadable(f"JSON nested over {MAX_JSON_DEPTH} deep")
    except ValueError as exc:
        return Unreadable(f"not JSON: {' '.join(str(exc).split())[:80]}")


def json_problem(value: Any, what: str) -> str | None:
    """Why a JSON column's value cannot be used as ``what`` (a table), else None."""
    if isinstance(value, Unreadable):
        return f"its {what} is {value.reason}"
    if not isinstance(value, dict):
        return f"its {what} is not a JSON object"
    return None


def key_problem(key: Any) -> str | None:
    """Why ``key`` is not a shape key, else None (see the module's docstring)."""
    if not isinstance(key, str):
        return "its shape key is not text"
    if len(key) > MAX_KEY:
        return f"its shape key is over {MAX_KEY} characters"
    if not key.isascii() and any(c.isdigit() and not c.isascii() for c in key):
        return "its shape key holds a digit that is not ASCII (0-9)"
    if "\x00" in key:
        return "its shape key holds a NUL character"
    return None
