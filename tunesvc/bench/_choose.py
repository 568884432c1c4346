"""Which measurer a problem gets: the policy sweeps, cross-measuring and evaluation share."""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING

from tunesvc import settings
from tunesvc.bench._inprocess import Bench
from tunesvc.bench._worker import Worker

if TYPE_CHECKING:
    from tunesvc.bench._base import Measurer
    from tunesvc.device import Device
    from tunesvc.template import Problem
    from tunesvc.template import Template


def picklable(*objects: object) -> bool:
    try:
        pickle.dumps(objects)
    except Exception:  # pickle raises AttributeError, TypeError or PicklingError, by object
        return False
    return True


def measurer_for(
    template: Template,
    problem: Problem,
    device: Device,
    *,
    isolate: bool | None = None,
    timeout_s: float = 60.0,
    rep_ms: float = settings.REP_MS,
    timing: str = settings.GRAPH,
) -> Measurer:
    """A :class:`Worker` (default on a GPU: a crashing or hanging candidate cannot take the caller
    down), else a :class:`Bench` in this process.

    A template the child cannot unpickle (e.g. a decorated kernel with local functions) is
    measured in this process, as before isolation existed. ``timing``: graph or eager (see
    :class:`Bench`).
    """
    if (device.is_gpu if isolate is None else isolate) and picklable(template, problem):
        return Worker(template, problem, device, timeout_s=timeout_s, rep_ms=rep_ms, timing=timing)
    return Bench(template, problem, device, rep_ms=rep_ms, timing=timing)
