"""What the fork tests share: waiting for a forked child with a deadline, so that a child that
hangs fails its test instead of hanging it."""

from __future__ import annotations

import os
import time


def exit_status_within(pid: int, seconds: float) -> int | None:
    """The exit status of child ``pid``, or None (after killing it) where it runs past ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None
