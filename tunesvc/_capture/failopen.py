"""Capture fails open: a failure inside tunesvc leaves the kernel to Triton's own autotuner, said once.

:func:`give_up` turns a kernel's capture off for the rest of the process with one warning line
(the kernel, the reason, what to do); :data:`STAGE` names what the failing thread was doing;
:class:`LeftToTriton` leaves one key to Triton, already said; :class:`Off` is the state of a
kernel whose own could not be made. Also the process's counters (:data:`STATS`,
:data:`FAILED_OPEN`, :data:`KERNELS`, :data:`TUNE_SECONDS`) and the summary made of them
(:func:`summary_record`, :func:`summary_line`; :func:`write_summary` at exit).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING
from typing import Any

from tunesvc import settings
from tunesvc.bench import one_line as _one_line
from tunesvc.errors import TunesvcError
from tunesvc.text import visible
from tunesvc.text import warn

if TYPE_CHECKING:
    from triton.runtime.autotuner import Autotuner


#: what happened to the keys this process met, across kernels: ``stored`` (served from the database or bundle, nothing measured), ``tuned``
#: (measured here), ``benchmarks`` (candidates measured), ``fallback`` (mode lookup, no stored
#: winner), ``heuristic`` (mode heuristic), ``untuned`` (one config survived pruning), ``nested``
#: (met while tunesvc was measuring: stored winner or fallback, see
#: :func:`~tunesvc._capture.bench.measuring_context`), ``in_graph`` (met inside CUDA-graph capture:
#: stored winner or fallback, tuned at a later launch outside a graph), ``precompiled`` (candidates a compile worker
#: compiled before their measurement), ``failed_open`` (kernels left to Triton's own autotuner
#: after a failure inside tunesvc); and, with a ``compiled_`` prefix, the keys met where Dynamo traces a
#: kernel inside ``torch.compile`` (see :mod:`tunesvc._capture.compiled`): ``compiled_stored``
#: (its stored winner compiled alone), ``compiled_fallback`` (modes lookup and heuristic),
#: ``compiled_untuned``, ``compiled_missed`` (no stored winner: tuned by Inductor, the miss
#: recorded), ``compiled_dynamic`` (a key symbolic at trace time: tuned by Inductor) and
#: ``compiled_failed_open``
STATS: Counter[str] = Counter()
#: seconds spent tuning keys (``tuned``), and why kernels were left to Triton's own autotuner
TUNE_SECONDS = [0.0]
FAILED_OPEN: Counter[str] = Counter()
#: why compiled regions are Inductor's alone in this process (a torch without the method hooked)
COMPILED_UNHOOKED: list[str] = []
#: the names of the captured kernels this process launched
KERNELS: set[str] = set()


def stats() -> dict[str, int]:
    """Counters of this process's captured keys (see :data:`STATS`)."""
    return dict(STATS)


def summary_record() -> dict[str, Any]:
    """What this process's capture did, as data (what `tune run` adds up over its processes)."""
    return {
        "kernels": len(KERNELS),
        "stored": STATS["stored"],
        "tuned": STATS["tuned"],
        "failed": STATS["failed"],
        "tune_s": round(TUNE_SECONDS[0], 3),
        "untuned": STATS["untuned"],
        "fallback": STATS["fallback"] + STATS["heuristic"],
        "failed_open": dict(FAILED_OPEN),
        "compiled": {k.removeprefix("compiled_"): n for k, n in STATS.items() if k.startswith("compiled_") and n},
        "compiled_unhooked": list(COMPILED_UNHOOKED),
    }


#: what the summary says of each count of keys met inside torch.compile, in its order
_COMPILED_PARTS = (
    ("stored", "served from the store"),
    ("missed", "tuned by Inductor (no stored winner; recorded for `tune misses --tune`)"),
    ("dynamic", "tuned by Inductor (a key argument symbolic at trace time)"),
    ("fallback", "served untuned"),
    ("untuned", "with one config"),
    ("failed_open", "tuned by Inductor after a failure inside tunesvc"),
)


def _compiled_clause(compiled: Counter[str], unhooked: set[str]) -> str:
    """What happened inside torch.compile, for the summary ('' where no compiled region met a key)."""
    if unhooked:
        return f"; compiled regions (torch.compile) are tuned by Inductor: {', '.join(sorted(unhooked))}"
    if not any(compiled.values()):
        return ""
    parts = [f"{compiled[k]} {what}" for k, what in _COMPILED_PARTS if compiled[k] or k == "stored"]
    return "; keys inside torch.compile: " + ", ".join(parts)


def summary_line(records: list[dict[str, Any]]) -> str:
    """One line over the records of one or more processes (see :func:`summary_record`)."""
    total: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    compiled: Counter[str] = Counter()
    unhooked: set[str] = set()
    seconds = 0.0
    for r in records:
        total.update({k: int(r.get(k, 0)) for k in ("kernels", "stored", "tuned", "failed", "untuned", "fallback")})
        seconds += float(r.get("tune_s", 0.0))
        reasons.update(r.get("failed_open", {}))
        compiled.update({k: int(n) for k, n in r.get("compiled", {}).items()})
        unhooked.update(r.get("compiled_unhooked", []))
    text = (
        f"tunesvc: {total['kernels']} kernel{'s' * (total['kernels'] != 1)} captured; keys: "
        f"{total['stored']} served from the store, {total['tuned']} tuned in {seconds:.1f} s, "
        f"{total['untuned']} with one config, {total['fallback']} served untuned"
    )
    if total["failed"]:  # measured, and no candidate ran correctly: no winner stored
        text += f", {total['failed']} failed (no candidate ran correctly)"
    if reasons:
        why = ", ".join(f"{n} {reason}" for reason, n in reasons.most_common())
        text += f"; left to Triton's autotuner: {why}"
    return text + _compiled_clause(compiled, unhooked) + "."


def write_summary() -> None:
    """At exit: the summary line on stderr ($TUNESVC_SUMMARY) and/or a JSON line for `tune run`."""
    import json
    import sys

    if not KERNELS and not FAILED_OPEN and not COMPILED_UNHOOKED:
        return
    try:
        if settings.summary_requested():
            print(summary_line([summary_record()]), file=sys.stderr)
        path = settings.summary_file()
        if path:
            from tunesvc.files import append_line

            try:
                append_line(path, json.dumps(summary_record()), "a summary file")
            except TunesvcError as exc:  # a FIFO or a device: never waited on
                print(f"tunesvc: TUNESVC_SUMMARY_FILE: {exc} No summary is written.", file=sys.stderr)
    except Exception:  # a summary must never change how the program ends
        pass


class LeftToTriton(Exception):
    """A key tunesvc leaves to Triton's own autotuner, already said (see :func:`give_up`), or Triton's
    own to say (a call the kernel's pruning refuses: Triton's run raises its own exception)."""


class _Stage(threading.local):
    """What this thread's capture is doing, for the warning of a failure (``look up``, ``claim``...)."""

    name = "look up"

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        outer, self.name = self.name, name
        try:
            yield
        except Exception as exc:  # the innermost stage names the failure: the outer ones are restored
            if not hasattr(exc, "_tunesvc_stage"):
                try:
                    exc._tunesvc_stage = name  # type: ignore[attr-defined]
                except Exception:  # an exception type that takes no attributes: the outer stage
                    pass
            raise
        finally:
            self.name = outer

    def of(self, exc: BaseException) -> str:
        """The stage ``exc`` was raised in."""
        return getattr(exc, "_tunesvc_stage", self.name)


STAGE = _Stage()


def give_up(state: Any, exc: BaseException | str, stage: str) -> None:
    """Leave the kernel to Triton's own autotuner for the rest of the process, said in one line
    naming the kernel, the reason and what to do, at the user's launch (see :func:`tunesvc.text.warn`).
    ``exc`` is an exception, or a reason of tunesvc's own."""
    state.off = True
    if isinstance(exc, str):
        category, reason, fix = stage, exc, "nothing is wrong with the program"
    elif isinstance(exc, TunesvcError):
        category, reason, fix = stage, str(exc).rstrip("."), "fix that and run again"
    else:
        category = f"{stage} failed"
        reason = f"{category} with {type(exc).__name__}: {_one_line(exc)}"
        if stage in _DATABASE_STAGES or isinstance(exc, OSError) or "sqlalchemy" in type(exc).__module__:
            fix = "check the database TUNESVC_DB names, or set TUNESVC_MODE=off to leave the kernels to Triton"
        else:
            fix = "set TUNESVC_MODE=off to leave it to Triton quietly, and report this tunesvc bug"
    FAILED_OPEN[category] += 1
    warn(
        visible(f"tunesvc: {state.name}: {reason}; it runs with Triton's own autotuner in this process ({fix})."),
        RuntimeWarning,
    )


#: stages whose failures come from the database rather than from tunesvc's own code
_DATABASE_STAGES = ("look up", "open the database", "claim", "store")


class Off:
    """The state of a kernel whose own state could not be made: Triton's own autotuner runs it."""

    off = True

    def __init__(self, tuner: Autotuner) -> None:
        self.name = getattr(getattr(tuner, "base_fn", None), "__qualname__", type(tuner).__name__)
