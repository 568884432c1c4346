"""Values that cross layers: a measurement and its status, made by the measurers
(:mod:`tunesvc.bench`) and kept by the store (:mod:`tunesvc.store`), which does not import the
measurers. Imports nothing of tunesvc's.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


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
