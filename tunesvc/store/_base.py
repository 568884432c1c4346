"""The store's protocol: what any store of tunesvc's does, and the rules it keeps.

:class:`tunesvc.store.Store` (SQLAlchemy: a SQLite file, a PostgreSQL server) implements it, and
``tests/test_store_contract.py`` runs every method over both backends.
"""

from __future__ import annotations

from abc import ABC
from abc import abstractmethod
from collections.abc import Collection
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

if TYPE_CHECKING:
    from tunesvc.device import Device
    from tunesvc.records import DeviceRecord
    from tunesvc.records import JobRecord
    from tunesvc.records import JobSpec
    from tunesvc.records import Measurement
    from tunesvc.records import MissRecord
    from tunesvc.records import RejectedTrials
    from tunesvc.records import TrialRecord
    from tunesvc.records import WinnerEntry
    from tunesvc.records import WinnerRecord
    from tunesvc.space import Config
    from tunesvc.store._store import History
    from tunesvc.template import Template


class BaseStore(ABC):
    """Where devices, kernel versions, sweeps, trials, winners, jobs, misses and selectors are kept.

    **Records, not rows.** Every method returns plain values or the frozen records of
    :mod:`tunesvc.records` (:class:`~tunesvc.records.TrialRecord`, :class:`~tunesvc.records.WinnerRecord`,
    :class:`~tunesvc.records.JobRecord` ...), never an object bound to a database session: a caller
    can keep one after the store is closed, and cannot write through it. Only the store speaks
    SQL; its callers ask it by method.

    **Transactions.** Every write method is one transaction, committed before it returns: all of
    it or, where it fails, none of it. A process killed midway loses at most the call in flight
    (a sweep: the batch of trials of one :meth:`add_trials`), and the next run finds the rest.

    **Threads and processes.** One store object serves one thread at a time. Any number of
    processes and hosts may open the same database at once: the writes that race are written to
    be safe under concurrency (a trial is stored once per key and config hash; :meth:`update_winner`
    and :meth:`merge_winner` never replace a faster winner with a slower one; identities
    (:meth:`device_id`, :meth:`kernel_version_id`) give every racer the same id).

    **Idempotence.** :meth:`add_job` adds a (batch, kernel, shape key) once, however many workers
    or hosts add it (False for the others); :meth:`claim_job` gives each pending job to one
    worker only, and a worker's job is released, finished or heartbeated only by that worker
    (False otherwise). :meth:`add_trials` skips a config already stored for its key (None).
    :meth:`record_miss` counts on the one row of its key.

    **Timings.** A trial is timed ``graph`` or ``eager`` (tunesvc.settings.TIMINGS), and a key
    holds a winner of each at most: trials, budgets and winners are per timing, the timing
    argument defaulting to graph (what every caller that predates eager timing reads); where a
    method takes ``timing=None``, it means both. A database older than revision 0008 (read-only)
    holds graph rows only.

    **Reading.** A row read back is checked as bundles are (:mod:`tunesvc.checks`: JSON depth and
    size, configs, shape keys of ASCII digits, finite positive times); a row that fails is left
    out with one warning that names its kernel and key (a RuntimeWarning), never an exception:
    the runtime inside a user's program reads through this.

    **Errors.** What a user can fix is raised as :class:`~tunesvc.errors.TunesvcError`, one
    sentence that says what to do: a path that is not a database or not a regular file, a damaged
    file, a full disk, a read-only file, a schema older or newer than this tunesvc, tables renamed
    or dropped by hand. A server that cannot be reached raises
    :class:`~tunesvc.store.DatabaseUnavailable` (a TunesvcError worth retrying). Anything else
    is a bug and keeps its traceback.
    """

    @property
    @abstractmethod
    def where(self) -> str:
        """The database as messages name it: a SQLite file's path, else its URL without the password."""
        ...

    @abstractmethod
    def device_id(self, device: Device) -> int:
        """The id of ``device``'s row (by fingerprint), added if new."""
        ...

    @abstractmethod
    def kernel_version_id(self, template: Template) -> int:
        """The id of the template's (name, version) row, added if new."""
        ...

    @abstractmethod
    def start_sweep(
        self, kv_id: int, device_id: int, shape_key: str, problem: dict, strategy: str, budget: int | None, seed: int
    ) -> int:
        """Record a sweep of one key as running; its id."""
        ...

    @abstractmethod
    def finish_sweep(self, sweep_id: int, wall_seconds: float, peer_ms: float | None = None) -> None:
        """Mark a sweep done, with its wall time and its torch peer's time."""
        ...

    @abstractmethod
    def swept_keys(self, kv_id: int, device_id: int, strategy: str) -> set[str]:
        """The shape keys with a finished sweep of ``strategy`` (e.g. cross-measure's re-timing)."""
        ...

    @abstractmethod
    def trials(self, kv_id: int, device_id: int, shape_key: str, timing: str | None = "graph") -> list[TrialRecord]:
        """The key's trials of ``timing`` that pass their row check, in the order they were stored."""
        ...

    @abstractmethod
    def add_trial(
        self,
        sweep_id: int,
        kv_id: int,
        device_id: int,
        shape_key: str,
        config: Config,
        config_hash: str,
        m: Measurement,
        timing: str = "graph",
    ) -> TrialRecord | None:
        """Store one measurement; None if another writer stored the same config first."""
        ...

    @abstractmethod
    def add_trials(
        self,
        sweep_id: int,
        kv_id: int,
        device_id: int,
        shape_key: str,
        measured: Sequence[tuple[Config, str, Measurement]],
        budget: int | None = None,
        timing: str = "graph",
    ) -> list[int | None]:
        """Store (config, config hash, measurement)s in one transaction: all of them or, if it fails, none."""
        ...

    @abstractmethod
    def trials_per_key(self, kernel: str, version: str, hardware_id: str, keys: Sequence[str]) -> dict[str, int]:
        """Trials stored per shape key of ``keys`` (0 for none) of one kernel version on every
        software stack of one device model: what a shared sweep's progress counts."""
        ...

    @abstractmethod
    def trial_count(self, kv_id: int, device_id: int, shape_key: str, timing: str = "graph") -> int:
        """Trials stored for one key, by every writer (what a sweep's budget counts)."""
        ...

    @abstractmethod
    def replace_measurements(self, measured: Sequence[tuple[int, Measurement]]) -> None:
        """Re-measurements of stored trials (finalists), in one transaction."""
        ...

    @abstractmethod
    def update_winner(
        self,
        kv_id: int,
        device_id: int,
        shape_key: str,
        trial_id: int | None = None,
        tolerance: float = 0.0,
        timing: str = "graph",
    ) -> WinnerRecord | None:
        """Make the fastest correct trial of this key and timing the winner (or none, if none is correct)."""
        ...

    @abstractmethod
    def winners(
        self,
        kernel: str | None = None,
        hardware_id: str | None = None,
        version: str | None = None,
        device: str | None = None,
        shape: str | None = None,
        timing: str | None = "graph",
    ) -> list[WinnerEntry]:
        """Winners, optionally filtered; ``device`` and ``shape`` match case-insensitive substrings
        of the device's name or hardware id and of the shape key."""
        ...

    @abstractmethod
    def devices(self) -> list[DeviceRecord]:
        """Every stored device, oldest first (a hardware id's later rows are newer software stacks)."""
        ...

    @abstractmethod
    def find_device(self, text: str) -> Device:
        """The newest stored device whose hardware id or name is ``text``."""
        ...

    @abstractmethod
    def trial_counts(
        self, kernel: str | None = None, device: str | None = None, shape: str | None = None
    ) -> dict[str, int]:
        """Trials by status (for the summary line of `tune show`), filtered as :meth:`winners` is."""
        ...

    @abstractmethod
    def rejected_trials(
        self, kernel: str | None = None, device: str | None = None, shape: str | None = None
    ) -> list[RejectedTrials]:
        """Per kernel version and device model with trials (filtered as :meth:`winners` is): its
        trials and its ``wrong_result`` trials by message (for `tune show`)."""
        ...

    @abstractmethod
    def history(self, kernel: str | None = None) -> History:
        """Every kernel version, device, trial (of ``kernel``, if given), winner and sweep."""
        ...

    @abstractmethod
    def winners_with_devices(
        self, kernel: str | None = None, hardware_id: str | None = None, timing: str | None = "graph"
    ) -> list[tuple[WinnerEntry, Device]]:
        """Winners, each with the full device (software versions included) it was measured on."""
        ...

    @abstractmethod
    def winner_trial(
        self, kernel: str, version: str, device: Device, shape_key: str, timing: str = "graph"
    ) -> TrialRecord | None:
        """The trial the winner of this key (of ``kernel`` at ``version``, measured on ``device``:
        one software stack) points at, the evidence of its time (its spread, its repetitions);
        None where no winner is stored there. Read only."""
        ...

    @abstractmethod
    def sibling_winners(
        self, kernel: str, version: str, device: Device, timing: str | None = "graph"
    ) -> list[WinnerEntry]:
        """The winners of ``kernel`` at ``version`` on the GPU models that share ``device``'s
        compute capability and SM count but not its hardware id, oldest first; none for the
        interpreter. Read only: the runtime serves them as transferred, never as ``device``'s."""
        ...

    @abstractmethod
    def merge_winner(
        self,
        kernel: str,
        version: str,
        device: Device,
        shape_key: str,
        config: Config,
        time_ms: float,
        source: str,
        timing: str = "graph",
    ) -> tuple[str, float | None]:
        """Take a winner measured elsewhere if it is faster than every stored one of its key."""
        ...

    @abstractmethod
    def add_job(
        self, batch: str, kernel: str, shape_key: str, problem: dict, strategy: str, budget: int | None, seed: int
    ) -> bool:
        """Queue a pending job unless the batch has it already (another host may have added it); True if added."""
        ...

    @abstractmethod
    def release_stale_jobs(self, batch: str, stale_s: float) -> int:
        """Put running jobs whose heartbeat is older than ``stale_s`` back to pending; returns how many."""
        ...

    @abstractmethod
    def claim_job(self, batch: str, worker: str) -> JobSpec | None:
        """Take the batch's first pending job for ``worker`` (which holds at most one), or None."""
        ...

    @abstractmethod
    def peek_job(self, batch: str, offset: int = 0) -> JobSpec | None:
        """The batch's pending job ``offset`` places down the queue (the last one if fewer are
        pending), without claiming it; None when none is pending."""
        ...

    @abstractmethod
    def job_heartbeat(self, job_id: int, worker: str) -> bool:
        """Refresh the job's heartbeat; False if ``worker`` no longer holds it."""
        ...

    @abstractmethod
    def finish_job(self, job_id: int, worker: str, status: str = "done", message: str | None = None) -> bool:
        """Mark the job done (or failed) if ``worker`` still holds it; False if it does not."""
        ...

    @abstractmethod
    def release_job(self, job_id: int, worker: str) -> bool:
        """Put the job back to pending if ``worker`` still holds it (a worker that stops midway)."""
        ...

    @abstractmethod
    def jobs(self, batch: str) -> list[JobRecord]:
        """The batch's jobs, in the order they were queued (a damaged one left out, with a warning)."""
        ...

    @abstractmethod
    def record_miss(self, template: Template, device: Device, shape_key: str, call: dict[str, Any]) -> None:
        """Count one miss of (kernel version, device, key); the first one keeps its call description."""
        ...

    @abstractmethod
    def misses(
        self, kernel: str | None = None, hardware_id: str | None = None, status: str | None = None
    ) -> list[MissRecord]:
        """Recorded misses, most frequent first."""
        ...

    @abstractmethod
    def captured_call(self, kernel: str, shape_key: str, hardware_id: str) -> dict[str, Any] | None:
        """The call description a captured kernel's newest sweep of this key recorded (None: none)."""
        ...

    @abstractmethod
    def captured_kernels(self, kernel: str | None = None) -> list[str]:
        """Names (module:qualname) of kernels that tunesvc.capture tuned into this database."""
        ...

    @abstractmethod
    def set_miss_status(self, miss_id: int, status: str) -> None:
        """Set a recorded miss's status (open | tuned); an unknown id changes nothing."""
        ...

    @abstractmethod
    def trial_times(
        self, kernel: str, version: str, hardware_id: str, hashes: Collection[str] | None = None
    ) -> dict[str, dict[str, float | None]]:
        """Shape key -> config hash -> the newest trial's time (None: it failed or broke a
        constraint) of one kernel version on every software stack of one device model; of the
        configs of ``hashes`` only, where given (one query either way)."""
        ...

    @abstractmethod
    def trial_configs(self, kernel: str, version: str, hardware_id: str, hashes: set[str]) -> dict[str, dict[str, Any]]:
        """Config hash -> config, for those of ``hashes`` that a trial of this kernel version on
        this device model stored."""
        ...

    @abstractmethod
    def save_selector(self, template: Template, hardware_id: str, selector: dict[str, Any], keys: int) -> None:
        """Store (or replace) the selector of this kernel version on this device model; two sweeps
        that refit it at once both succeed (the later write replaces the earlier)."""
        ...

    @abstractmethod
    def merge_selector(self, kernel: str, version: str, hardware_id: str, selector: dict[str, Any], keys: int) -> str:
        """Take a selector fitted elsewhere where none is stored for this kernel version and device
        model: 'added'; a stored one stays ('kept'): it was fitted on this database's own trials."""
        ...

    @abstractmethod
    def delete_selector(self, template: Template, hardware_id: str) -> bool:
        """Remove the selector of this kernel version on this device model; whether one was stored."""
        ...

    @abstractmethod
    def selector(self, kernel: str, version: str, hardware_id: str) -> dict[str, Any] | None:
        """The stored selector's JSON, or None: none fitted, or a database older than revision 0007."""
        ...

    @abstractmethod
    def close(self) -> None:
        """Release the store's connections; the store is not used afterwards."""
        ...
