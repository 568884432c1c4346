"""Every ``TUNESVC_*`` environment variable, its default, and the one vocabulary of modes.

Read here and nowhere else (``tests/test_settings.py`` fails when another module reads
``os.environ`` for a ``TUNESVC_`` name). A value that does not parse is never an exception in
the user's program: one warning line names the variable, what it holds and what is used instead
(the default), as Helion's ``runtime/settings.py`` does with its ``_env_get_*`` readers.

Modes, the same for the shipped kernels' runtime, captured ``triton.autotune`` kernels and
``tune run``:

- ``tune``: the stored winner; a miss is tuned now, stored, and used from then on;
- ``lookup``: the stored winner, else the fallback chain (predicted, nearest stored key, a
  sibling GPU model's winner, heuristic);
  nothing is measured, and a captured kernel's miss is recorded for offline tuning;
- ``heuristic``: winners are never read; the kernel's heuristic config (for a captured kernel,
  the first config its pruning keeps, as Triton launches a one-config autotuner);
- ``off``: tunesvc steps aside: a captured kernel runs Triton's own autotuner, a shipped kernel
  (which has no other autotuner) its heuristic config.
"""

from __future__ import annotations

import os

from tunesvc.text import warn

MODES = ("tune", "lookup", "heuristic", "off")
TUNE, LOOKUP, HEURISTIC, OFF = MODES

#: how a sweep times its candidates, and which winner a runtime serves (see tunesvc.bench):
#: ``graph``, CUDA graph replays over input copies (the default: the GPU time of a kernel as a
#: CUDA graph or a fused program runs it); ``eager``, loops of ordinary launches from Python, the
#: host's launch cost counted (a program that launches kernel by kernel)
TIMINGS = ("graph", "eager")
GRAPH, EAGER = TIMINGS

#: the database where none is named: a SQLite file in the working folder
DEFAULT_DB = "tune.db"
#: milliseconds of replay a measurement's timing aims at (sweeps, captured keys, re-measures)
REP_MS = 100.0
#: seconds a recorded call's replay (`tune misses --tune`, `tune verify`) may run before its
#: process is stopped: a record that passes every check may still launch a kernel that never ends
REPLAY_TIME_LIMIT_S = 600.0

#: The tolerance tables, by dtype name: the largest relative error ||out - ref|| / ||ref||.
#: Against a float32/float64 torch reference (a shipped template's or a space= kernel's check):
REFERENCE_TOLERANCE = {"float16": 5e-3, "bfloat16": 2e-2, "float32": 1e-2}
#: ... of a dtype that table does not list
REFERENCE_TOLERANCE_OTHER = 1e-2
#: Between two configs of one captured kernel (a candidate against the first valid config's
#: output): reduction order and atomics differ between configs, a race or a wrong mask gives
#: errors of order one. float64 is not held to float64 rounding: library kernels often compute
#: in float32 whatever the input (fla's softmax: 7.6e-8 between its configs on an H100)
CONFIG_TOLERANCE = {"float64": 1e-5, "float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}
#: ... of a float dtype that table does not list (float8 variants); integer and bool outputs
#: must match exactly
CONFIG_TOLERANCE_OTHER = 0.125

#: the most compile processes TUNESVC_COMPILE_WORKERS (and `--compile-workers`) may ask for
MAX_COMPILE_WORKERS = 256
#: the most distinct keys TUNESVC_MAX_KEYS may allow a kernel (each is a row and an entry in memory)
MAX_KEYS = 1_000_000

#: the variables and what they hold (``tune run --help`` and docs/settings.md list them from here)
VARIABLES = {
    "TUNESVC_DB": "database URL or SQLite path [tune.db]",
    "TUNESVC_BUNDLE": "a bundle (JSON from `tune export`) to serve winners from",
    "TUNESVC_MODE": f"one of {', '.join(MODES)} [runtime: lookup; capture: tune, or lookup with a bundle alone]",
    "TUNESVC_CAPTURE": "1: route every triton.autotune kernel of the process through tunesvc",
    "TUNESVC_SUMMARY": "1: a captured process prints one summary line to stderr when it exits",
    "TUNESVC_SUMMARY_FILE": "a file a captured process appends its summary to as a JSON line (set by `tune run`)",
    "TUNESVC_COMPILE_WORKERS": "processes compiling a captured key's configs ahead [on a GPU: half the cores, at most 8]",
    "TUNESVC_MAX_KEYS": "distinct keys one captured kernel may tune in a process before it is left to Triton [256]",
    "TUNESVC_CLAIM_STALE_S": "seconds without a heartbeat after which another process's key claim is taken over [10]",
    "TUNESVC_REPLAY": "0: shipped kernels skip their recorded launch plans",
    "TUNESVC_TIMING": "graph or eager: the timing whose winners the runtime serves, else a key's only winner [graph]",
    "TUNESVC_TRANSFER": "0: the runtime never serves a sibling GPU model's winners (same capability and SM count) [1]",
    "TUNESVC_TIMELINE": "a file the sweep's timeline events are appended to",
    "TUNESVC_TIMELINE_ROLE": "the role a process's timeline events are written under",
    "TUNESVC_JOB_KERNEL": "the kernel module path a sweep's workers may import (set by the sweep)",
    "TUNESVC_RESIDENT": "1: `tune sweep` runs as a fork of a resident process that has torch, Triton and the kernels imported, started by the sweep before; 0: never [1 where a GPU may be present]",
    "TUNESVC_RESIDENT_IDLE_S": "seconds a resident process waits for the next sweep before it exits [600]",
}

_warned: set[tuple[str, str]] = set()


def _warn(name: str, value: str, fix: str, used: object) -> None:
    if (name, value) not in _warned:  # once per variable and value, however often it is read
        _warned.add((name, value))
        warn(f"tunesvc: {name}={value!r} {fix}; using {used!r}.", RuntimeWarning)


def raw(name: str, default: str | None = None) -> str | None:
    """The variable as it is set (empty text included), or ``default`` where it is unset: for
    variables of other programs (CUDA_VISIBLE_DEVICES, where empty means "no GPU")."""
    return os.environ.get(name, default)


def environment() -> dict[str, str]:
    """A copy of this process's environment, for the environment of a child process."""
    return dict(os.environ)


def interpreting() -> bool:
    """True when Triton kernels run in the CPU interpreter (TRITON_INTERPRET)."""
    return flag("TRITON_INTERPRET")


def text(name: str, default: str | None = None) -> str | None:
    """The variable's value, stripped; ``default`` where it is unset or empty."""
    value = os.environ.get(name, "").strip()
    return value or default


def flag(name: str) -> bool:
    """Whether the variable is set to something other than empty or ``0``."""
    return (text(name) or "0") != "0"


def integer(name: str, default: int, minimum: int = 0, maximum: int | None = None) -> int:
    """A whole number from ``minimum`` to ``maximum`` (None: no bound), else one warning and ``default``."""
    value = text(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        _warn(name, value, "is not a whole number", default)
        return default
    if number < minimum or (maximum is not None and number > maximum):
        _warn(
            name,
            value,
            f"is not between {minimum} and {maximum}" if maximum is not None else f"is below {minimum}",
            default,
        )
        return default
    return number


def seconds(name: str, default: float, minimum: float = 0.0, maximum: float = 86400.0) -> float:
    """Seconds from ``minimum`` to ``maximum`` (a day by default: a value past what a wait or a
    timer takes, such as 1e308, would fail where it is used), else one warning and ``default``."""
    value = text(name)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not minimum <= number <= maximum:  # NaN fails too
        _warn(name, value, f"is not a number of seconds from {minimum:g} to {maximum:g}", default)
        return default
    return number


def check_mode(mode: str) -> str | None:
    """One sentence saying what is wrong with ``mode``, or None where it is one of :data:`MODES`."""
    if mode in MODES:
        return None
    return f"Unknown mode {mode!r}; use one of {', '.join(MODES)}."


def mode(default: str) -> str:
    """$TUNESVC_MODE, else ``default``; an unknown value is one warning and ``default``."""
    value = text("TUNESVC_MODE")
    if value is None:
        return default
    if check_mode(value) is not None:
        _warn("TUNESVC_MODE", value, f"is not a mode (use one of {', '.join(MODES)})", default)
        return default
    return value


def check_timing(value: str) -> str | None:
    """One sentence saying what is wrong with a timing, or None where it is one of :data:`TIMINGS`."""
    if value in TIMINGS:
        return None
    return f"Unknown timing {value!r}; use one of {', '.join(TIMINGS)}."


def timing(default: str = GRAPH) -> str:
    """$TUNESVC_TIMING, else ``default``; an unknown value is one warning and ``default``."""
    value = text("TUNESVC_TIMING")
    if value is None:
        return default
    if check_timing(value) is not None:
        _warn("TUNESVC_TIMING", value, f"is not a timing (use one of {', '.join(TIMINGS)})", default)
        return default
    return value


def db() -> str | None:
    """$TUNESVC_DB: a database URL or SQLite path, or None where unset."""
    return text("TUNESVC_DB")


def bundle() -> str | None:
    return text("TUNESVC_BUNDLE")


def capture_requested() -> bool:
    return flag("TUNESVC_CAPTURE")


def summary_requested() -> bool:
    return flag("TUNESVC_SUMMARY")


def summary_file() -> str | None:
    return text("TUNESVC_SUMMARY_FILE")


def compile_workers() -> int | None:
    """$TUNESVC_COMPILE_WORKERS (0: none), or None where unset (the capture's own rule)."""
    if text("TUNESVC_COMPILE_WORKERS") is None:
        return None
    return integer("TUNESVC_COMPILE_WORKERS", 0, maximum=MAX_COMPILE_WORKERS)


def max_keys() -> int:
    return integer("TUNESVC_MAX_KEYS", 256, minimum=1, maximum=MAX_KEYS)


def claim_stale_s() -> float:
    # at least a second: its holder's heartbeat, every quarter of it, is a database write
    return seconds("TUNESVC_CLAIM_STALE_S", 10.0, minimum=1.0)


def replay_enabled() -> bool:
    return text("TUNESVC_REPLAY", "1") != "0"


def db_url(db: str | os.PathLike | None = None) -> str:
    """``db``, else $TUNESVC_DB, else ./tune.db, as a URL (a plain path names a SQLite file)."""
    chosen = str(db) if db is not None else (text("TUNESVC_DB") or DEFAULT_DB)
    return chosen if "://" in chosen else f"sqlite:///{chosen}"


def timeline_file() -> str | None:
    return text("TUNESVC_TIMELINE")


def timeline_role() -> str:
    return text("TUNESVC_TIMELINE_ROLE", "command") or "command"


def job_kernel() -> str | None:
    return text("TUNESVC_JOB_KERNEL")


def transfer_enabled() -> bool:
    """Whether a GPU model with no winner of its own for a key may be served a sibling model's
    (same compute capability and SM count, e.g. H100 SXM -> H200): on unless $TUNESVC_TRANSFER=0."""
    return text("TUNESVC_TRANSFER", "1") != "0"


#: seconds a resident process (`tunesvc.cli._resident`) waits for the next sweep before it exits
RESIDENT_IDLE_S = 600.0


def resident(default: bool) -> bool:
    """$TUNESVC_RESIDENT as a choice (1 or 0), else ``default``; another value is one warning and ``default``."""
    value = text("TUNESVC_RESIDENT")
    if value is None:
        return default
    if value not in ("0", "1"):
        _warn("TUNESVC_RESIDENT", value, "is not 0 or 1", int(default))
        return default
    return value == "1"


def resident_idle_s() -> float:
    return seconds("TUNESVC_RESIDENT_IDLE_S", RESIDENT_IDLE_S)
