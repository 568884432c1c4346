"""Values that cross layers: a measurement and its status, made by the measurers
(:mod:`tunesvc.bench`) and kept by the store (:mod:`tunesvc.store`), which does not import the
measurers; and the records the store returns (rows as frozen values, as Optuna's storages
return ``FrozenTrial``), and the values that cross layers beside them (a winner as users see it,
a claimed job). Imports nothing of tunesvc's.
"""

from __future__ import annotations

import re
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import replace
from datetime import datetime
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    OK = "ok"
    INVALID = "invalid"  # breaks a space constraint or does not fit the device
    COMPILE_ERROR = "compile_error"
    WRONG_RESULT = "wrong_result"
    ERROR = "error"  # raised while running
    CRASH = "crash"  # killed its measuring process (illegal memory access, a corrupted CUDA context)
    TIMEOUT = "timeout"  # did not finish within the measuring timeout


@dataclass
class Measurement:
    status: Status
    time_ms: float | None = None
    spread: float | None = None
    reps: int = 0
    rel_error: float | None = None
    message: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @property
    def noise(self) -> float | None:
        """The half-width of this time's noise interval, a fraction of it: its spread (the
        width of its central 60% over its median), at least :data:`MIN_NOISE`; None without a time."""
        return None if self.time_ms is None else noise_of(self.spread)

    def interval(self) -> tuple[float, float] | None:
        """The times this one cannot be told apart from: ``time_ms`` +- :attr:`noise`."""
        if self.time_ms is None or self.noise is None:
            return None
        return self.time_ms * (1 - self.noise), self.time_ms * (1 + self.noise)

    def within(self, time_ms: float) -> bool:
        """Whether ``time_ms`` lies inside this measurement's noise interval."""
        bounds = self.interval()
        return bounds is not None and bounds[0] <= time_ms <= bounds[1]

    def noted(self, note: str | None) -> Measurement:
        """This measurement with ``note`` after its message (where its config came from)."""
        if not note:
            return self
        return replace(self, message="; ".join(p for p in (self.message, note) if p))


#: the narrowest noise interval a time is given (a fraction of it, each side): a GPU's timings of
#: one config from one graph move by about this much from one replay to the next at a steady clock
MIN_NOISE = 0.01


def noise_of(spread: float | None) -> float:
    """A time's noise interval's half-width, a fraction of it, from its spread: at least MIN_NOISE."""
    return max(spread or 0.0, MIN_NOISE)


# -- what the store returns (tunesvc.store): frozen values, never ORM rows ---------------------
# Each has the field names of its table's columns (tunesvc.store.models), so code that read a row
# reads its record unchanged; none is bound to a database session, and none can write one back.


@dataclass(frozen=True)
class DeviceRecord:
    """A stored device: its fingerprint's fields (tunesvc.device.Device) and when it was first seen."""

    id: int
    fingerprint: str
    hardware_id: str
    kind: str
    name: str
    capability: str
    sm_count: int
    memory_bytes: int
    max_shared_memory: int
    max_num_regs: int
    driver: str
    cuda: str
    torch: str
    triton: str
    first_seen: datetime


@dataclass(frozen=True)
class TrialRecord:
    """One measured config of a key: its status, and its time where it ran correctly."""

    id: int
    sweep_id: int
    kernel_version_id: int
    device_id: int
    shape_key: str
    config: dict[str, Any]
    config_hash: str
    status: str
    time_ms: float | None
    spread: float | None = None
    reps: int = 0
    rel_error: float | None = None
    message: str | None = None
    #: None in the record :meth:`~tunesvc.store.BaseStore.add_trial` returns (the database sets it)
    created_at: datetime | None = None
    #: how it was timed: graph | eager (tunesvc.settings.TIMINGS)
    timing: str = "graph"


@dataclass(frozen=True)
class RejectedTrials:
    """One kernel version's trials on one device model, and those stored as ``wrong_result``
    (a candidate whose output differs from the reference's), counted by their message."""

    kernel: str
    kernel_version: str
    hardware_id: str
    trials: int
    #: message -> wrong_result trials that say it
    wrong: dict[str, int]

    @property
    def rejected(self) -> int:
        return sum(self.wrong.values())

    def reasons(self) -> list[tuple[str, int, str]]:
        """The wrong results by reason, most first: (reason, trials, one message saying it)."""
        return wrong_reasons(self.wrong)


def wrong_reasons(messages: dict[str, int]) -> list[tuple[str, int, str]]:
    """Messages of wrong results (message -> trials) by reason, most first: (reason, trials, the
    most frequent message). A reason is what a message says before its first ": " (capture's
    name the output that differed: ``tensor argument 1 (dw_ptr)``), else before its first figure
    (a template's ``relative error 0.31 > 0.005``, ``inf`` included): figures differ from trial to trial."""
    grouped: dict[str, list[tuple[int, str]]] = {}
    for message, n in messages.items():
        text = message or "no reason stored"
        head, colon, _ = text.partition(": ")
        reason = head if colon else re.split(r"\s(?:[-+]?\.?\d|inf\b|nan\b)", text, maxsplit=1)[0]
        grouped.setdefault(reason.strip() or text, []).append((n, text))
    out = [(reason, sum(n for n, _ in said), max(said)[1]) for reason, said in grouped.items()]
    return sorted(out, key=lambda r: (-r[1], r[0]))


@dataclass(frozen=True)
class WinnerRecord:
    """The fastest correct trial of one (kernel version, device, shape key), as the winners table keeps it."""

    id: int
    kernel_version_id: int
    device_id: int
    shape_key: str
    config: dict[str, Any]
    config_hash: str
    time_ms: float
    trial_id: int
    updated_at: datetime
    #: the timing it was chosen under: graph | eager (tunesvc.settings.TIMINGS)
    timing: str = "graph"


@dataclass(frozen=True)
class JobRecord:
    """One (kernel, shape) of a sweep shared by several workers, and where it stands."""

    id: int
    batch: str
    kernel: str
    shape_key: str
    problem: dict[str, Any]
    strategy: str
    budget: int | None
    seed: int
    status: str
    worker: str | None
    heartbeat: float | None
    attempts: int
    message: str | None
    created_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True)
class MissRecord:
    """A shape key a captured kernel met untuned in mode lookup, with its first call's description."""

    id: int
    kernel: str
    version: str
    hardware_id: str
    shape_key: str
    call: dict[str, Any]
    count: int
    status: str
    first_seen: datetime
    last_seen: datetime


# -- values the store returns that are not one row's columns -----------------------------------


@dataclass(frozen=True)
class WinnerEntry:
    """A winner as users see it (detached from the ORM session)."""

    kernel: str
    kernel_version: str
    device: str
    hardware_id: str
    shape_key: str
    config: dict[str, Any]
    time_ms: float
    updated_at: datetime
    #: its trial's spread (see Measurement.noise); None where the trial records none
    spread: float | None = None
    #: the timing it was chosen under: graph | eager (tunesvc.settings.TIMINGS)
    timing: str = "graph"

    @property
    def noise(self) -> float:
        """The half-width of the winner's noise interval, a fraction of its time (Measurement.noise)."""
        return noise_of(self.spread)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "updated_at": self.updated_at.isoformat()}


@dataclass(frozen=True)
class JobSpec:
    """A claimed job of a shared sweep (see :mod:`tunesvc.fleet.jobs`), detached from the database session."""

    id: int
    kernel: str
    shape_key: str
    problem: dict
    strategy: str
    budget: int | None
    seed: int
