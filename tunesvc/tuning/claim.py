"""The one key claim: one process tunes a key, shipped or captured; the others wait for its
winner, and say that they wait.

A claim is a job row in the store's jobs table (one per kernel, version, device and key, in a
batch of its own), held by a worker named ``host:pid:thread`` that refreshes its heartbeat from
a thread while it tunes. Processes on every host sharing the database see the same row, so the
key is tuned once. A claim is taken over when its holder is gone: at once where the holder ran
on this host and its process no longer exists (a ``kill -9``), else once its heartbeat is older
than $TUNESVC_CLAIM_STALE_S (a host that died, or a process stopped by SIGSTOP or a debugger,
whose heartbeat thread stops with it). A waiting process says so in one warning line once it
has waited :data:`NOTICE_S`, and again, with the seconds, when the wait ends.
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any

from tunesvc import settings
from tunesvc.text import visible
from tunesvc.text import warn

if TYPE_CHECKING:
    from tunesvc.store import Store

#: how often a waiting process looks for the winner and the holder's heartbeat (seconds)
POLL_S = 0.2
#: a wait longer than this is said (seconds)
NOTICE_S = 2.0

_HOST = socket.gethostname()


def _alive(worker: str | None) -> bool:
    """Whether the process a worker name points to may still run (False only where it surely does not)."""
    host, _, rest = (worker or "").partition(":")
    pid_text = rest.partition(":")[0]
    if host != _HOST or not pid_text.isdigit() or sys.platform == "win32":
        # another host's process: its heartbeat decides (and on Windows os.kill(pid, 0) would
        # send a Ctrl-C event, not ask whether the process exists)
        return True
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by another user
        return True
    return True


class KeyClaim:
    """``with KeyClaim(...) as claim:`` holds the key's claim, or finds it tuned.

    ``winner_of()`` returns the key's stored winner (None: none yet); on entry ``claim.winner`` is
    set where one turned up (before the claim, or while waiting for another process), else this
    process holds the claim (``claim.held``) or tunes unclaimed because the holder finished with
    no winner. Leaving the block marks the job done (or failed, on an exception).
    """

    def __init__(self, store: Store, kernel: str, ident: str, key: str, winner_of: Callable[[], Any]) -> None:
        self.store = store
        self.kernel = kernel
        self.key = key
        self.batch = "capture-" + hashlib.sha256(ident.encode()).hexdigest()[:16]
        self.worker = f"{_HOST}:{os.getpid()}:{threading.get_ident()}"
        self.winner_of = winner_of
        self.winner: Any = None
        self.held = False
        self.waited_s = 0.0
        self._job_id: int | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._stale_s = settings.claim_stale_s()

    def __enter__(self) -> KeyClaim:
        started = time.monotonic()
        noticed = False
        holder: str | None = None
        try:
            while True:
                self.winner = self.winner_of()
                if self.winner is not None:
                    return self
                self.store.add_job(self.batch, self.kernel, self.key, {}, "capture", None, 0)
                job = next(iter(self.store.jobs(self.batch)), None)
                if job is not None and job.status in ("done", "failed"):
                    # finished since the look above (its winner is stored before its job ends), or
                    # with no correct config stored: then tune here, unclaimed
                    self.winner = self.winner_of()
                    return self
                if job is not None and job.status == "running":
                    holder = job.worker
                    stale = 0.0 if not _alive(holder) else self._stale_s
                    self.store.release_stale_jobs(self.batch, stale)
                held = self.store.claim_job(self.batch, self.worker)
                if held is not None:
                    self._job_id, self.held = held.id, True
                    self._beat = threading.Thread(target=self._heartbeat, name="tunesvc-claim", daemon=True)
                    self._beat.start()
                    self.winner = self.winner_of()  # tuned between the look and the claim
                    return self
                waited = time.monotonic() - started
                if not noticed and waited >= NOTICE_S:
                    noticed = True
                    warn(
                        visible(
                            f"tunesvc: waiting for {holder or 'another process'} to finish tuning {self.kernel} "
                            f"[{self.key}]; its claim is taken over after {self._stale_s:g} s without a heartbeat."
                        ),
                        RuntimeWarning,
                    )
                time.sleep(POLL_S)
        finally:
            self.waited_s = time.monotonic() - started
            if noticed:
                found = "its winner" if self.winner is not None else "the claim"
                warn(
                    visible(f"tunesvc: waited {self.waited_s:.1f} s for {self.kernel} [{self.key}]; took {found}."),
                    RuntimeWarning,
                )

    def _heartbeat(self) -> None:
        assert self._job_id is not None
        while not self._stop.wait(max(self._stale_s / 4, 0.05)):
            try:
                self.store.job_heartbeat(self._job_id, self.worker)
            except Exception:  # a missed beat only risks another process taking the key over
                pass

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        if self._job_id is not None:
            self.store.finish_job(self._job_id, self.worker, "failed" if exc_type else "done")
