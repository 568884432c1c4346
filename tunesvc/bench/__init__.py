"""Measuring candidate configs: one candidate config in, one :class:`Measurement` out, always with a status.

Two measurers implement one protocol (:class:`Measurer`, in ``_base.py``): :class:`Bench` runs
candidates in this process (``_inprocess.py``); :class:`Worker` runs a Bench in a child process
that a crashing or hanging candidate cannot take down with the sweep (``_worker.py``).
:class:`Compiler` compiles candidates in parallel worker processes ahead of their measurement
(``_compile.py``). How those processes start is :mod:`tunesvc._processes`'s policy.
"""

from __future__ import annotations

from tunesvc._processes import start_forkserver
from tunesvc.bench._base import CONTEXT_LOST
from tunesvc.bench._base import FINALIST_ROUNDS
from tunesvc.bench._base import Measurement
from tunesvc.bench._base import Measurer
from tunesvc.bench._base import Status
from tunesvc.bench._base import one_line
from tunesvc.bench._base import relative_error
from tunesvc.bench._base import timed_in_rounds
from tunesvc.bench._choose import measurer_for
from tunesvc.bench._choose import picklable
from tunesvc.bench._compile import CALLER
from tunesvc.bench._compile import Compiler
from tunesvc.bench._compile import pool_size
from tunesvc.bench._inprocess import DEFAULT_L2_BYTES
from tunesvc.bench._inprocess import FIRST_GRAPH_SHARE
from tunesvc.bench._inprocess import GRAPH_BELOW_MS
from tunesvc.bench._inprocess import L2_MULTIPLE
from tunesvc.bench._inprocess import MAX_INPUT_SETS
from tunesvc.bench._inprocess import Bench
from tunesvc.bench._inprocess import compile_error_types
from tunesvc.bench._inprocess import graph_time
from tunesvc.bench._inprocess import input_bytes
from tunesvc.bench._inprocess import input_sets_needed
from tunesvc.bench._inprocess import l2_bytes
from tunesvc.bench._inprocess import out_of_resources_types
from tunesvc.bench._worker import STARTUP_TIMEOUT_S
from tunesvc.bench._worker import Worker

__all__ = [
    "CALLER",
    "CONTEXT_LOST",
    "DEFAULT_L2_BYTES",
    "FINALIST_ROUNDS",
    "FIRST_GRAPH_SHARE",
    "GRAPH_BELOW_MS",
    "L2_MULTIPLE",
    "MAX_INPUT_SETS",
    "STARTUP_TIMEOUT_S",
    "Bench",
    "Compiler",
    "Measurement",
    "Measurer",
    "Status",
    "Worker",
    "compile_error_types",
    "graph_time",
    "input_bytes",
    "input_sets_needed",
    "l2_bytes",
    "measurer_for",
    "one_line",
    "out_of_resources_types",
    "picklable",
    "pool_size",
    "relative_error",
    "start_forkserver",
    "timed_in_rounds",
]
