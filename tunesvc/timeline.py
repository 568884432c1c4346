"""Start-up timeline: where the time between a command's start and its first stored trial goes.

With ``TUNESVC_TIMELINE=FILE`` in the environment, every tunesvc process of a sweep (the `tune`
command, its sweep workers, their compile and measuring processes) appends one JSON line per
milestone to FILE: ``{"t": <unix time>, "pid": ..., "role": "command", "event": "tunesvc imported"}``.
``benchmarks/startup.py`` turns the lines into a breakdown. Unset (the default), :func:`mark`
returns after one environment lookup.

A file, not a pipe or a queue, because the processes are started in different ways (a
subprocess, a fork, a forkserver child, a Ray actor on another host sharing a folder) and each
writes its own lines; one ``write`` of a line opened with ``O_APPEND`` is not interleaved with
another process's on a local file system.
"""

from __future__ import annotations

import json
import os
import time

from tunesvc import settings
from tunesvc.errors import TunesvcError
from tunesvc.files import append_line
from tunesvc.files import read_regular
from tunesvc.text import warn

ENV = "TUNESVC_TIMELINE"
#: the most of a timeline file :func:`read` reads (a sweep's is a few KiB)
MAX_READ_BYTES = 256 << 20

#: set by whatever starts a process in a new interpreter (a sweep worker); forked children call set_role
_role = settings.timeline_role()
_seen: set[str] = set()
_refused: set[str] = set()


def set_role(role: str) -> None:
    """Name this process's lines (command, worker, compile, measurer); a forked child calls it first."""
    global _role
    _role = role
    _seen.clear()  # a forked child's own milestones are not its parent's


def mark(event: str, *, once: bool = True, **detail: object) -> None:
    """Append ``event`` at the current time; with ``once``, only its first occurrence in this process."""
    path = settings.timeline_file()
    if not path or (once and event in _seen):
        return
    _seen.add(event)
    line = json.dumps({"t": time.time(), "pid": os.getpid(), "role": _role, "event": event, **detail})
    try:
        append_line(path, line, "a timeline file")
    except TunesvcError as exc:  # a FIFO or a device: said once, never waited on
        if path not in _refused:
            _refused.add(path)
            warn(f"tunesvc: {ENV}: {exc} No timeline is written.", RuntimeWarning)
    except OSError:  # a timeline that cannot be written never stops a sweep
        pass


def read(path: str) -> list[dict]:
    """The lines of a timeline file, oldest first."""
    text = read_regular(path, MAX_READ_BYTES, "a timeline file").decode("utf-8", "replace")
    return sorted((json.loads(line) for line in text.splitlines() if line.strip()), key=lambda e: e["t"])
