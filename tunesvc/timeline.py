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

ENV = "TUNESVC_TIMELINE"

#: set by whatever starts a process in a new interpreter (a sweep worker); forked children call set_role
_role = settings.timeline_role()
_seen: set[str] = set()


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
    line = json.dumps({"t": time.time(), "pid": os.getpid(), "role": _role, "event": event, **detail}) + "\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError:  # a timeline that cannot be written never stops a sweep
        pass


def read(path: str) -> list[dict]:
    """The lines of a timeline file, oldest first."""
    with open(path) as f:
        return sorted((json.loads(line) for line in f if line.strip()), key=lambda e: e["t"])
