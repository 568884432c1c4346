"""The isolated measurer: :class:`Worker`, a :class:`~tunesvc.bench.Bench` in a child process.

One per GPU, so that a candidate that faults, corrupts the CUDA context or hangs is recorded
(``crash``, ``timeout``) and the child is replaced while the sweep goes on.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING
from typing import Any

from tunesvc import settings
from tunesvc._processes import start_child
from tunesvc.bench._base import FINALIST_ROUNDS
from tunesvc.bench._base import Measurement
from tunesvc.bench._base import Measurer
from tunesvc.bench._base import Status
from tunesvc.bench._base import context_lost
from tunesvc.bench._base import one_line
from tunesvc.bench._inprocess import Bench
from tunesvc.device import current_device
from tunesvc.errors import TunesvcError
from tunesvc.serving.launch import use_static_launcher
from tunesvc.timeline import mark
from tunesvc.timeline import set_role

if TYPE_CHECKING:
    from tunesvc.device import Device
    from tunesvc.space import Config
    from tunesvc.template import Problem
    from tunesvc.template import Template

#: how long a Worker's child may take to start and make its inputs and reference
STARTUP_TIMEOUT_S = 300.0


class Worker(Measurer):
    """A :class:`Bench` in a child process, replaced whenever a candidate kills or hangs it.

    One per GPU: the child makes its own inputs and reference and answers one request at a
    time. The parent waits at most ``timeout_s`` for each answer. No answer is a ``timeout``
    (the child is killed); a child that dies (a segfault, ``os._exit``, the driver killing it)
    or reports a CUDA error that poisons its context is a ``crash``. Either way the next
    request starts a fresh child and the sweep goes on. Written on multiprocessing because a
    CUDA context belongs to a process: only a process boundary contains a kernel that faults.
    """

    def __init__(
        self,
        template: Template,
        problem: Problem,
        device: Device,
        *,
        timeout_s: float = 60.0,
        rep_ms: float = settings.REP_MS,
        timing: str = settings.GRAPH,
    ) -> None:
        self.template = template
        self.problem = problem
        self.device = device
        self.timeout_s = timeout_s
        self.rep_ms = rep_ms
        self.timing = timing
        #: how many children were replaced after a crash or a timeout
        self.restarts = 0
        self._process: BaseProcess | None = None
        self._conn: Connection  # this side of the pipe to the child; set by _start
        self._ready = False
        self._start()  # the child makes its inputs while the caller compiles the first candidates

    def measure(self, config: Config) -> Measurement:
        return self._request("measure", config)

    def time_only(self, config: Config, rep_ms: float | None = None, graph_ms: float | None = None) -> Measurement:
        return self._request("time", config, (rep_ms, graph_ms))

    def time_peer(self) -> Measurement:
        return self._request("peer", None)

    def time_together(
        self, configs: Sequence[Config], rep_ms: float | None = None, rounds: int = FINALIST_ROUNDS
    ) -> list[Measurement]:
        """The child's Bench times them side by side (one request: the child interleaves them)."""
        if not configs:
            return []
        answer = self._request("together", [dict(c) for c in configs], (rep_ms, float(rounds)))
        if isinstance(answer, list):
            return answer
        return [answer for _ in configs]  # the child crashed or timed out: every config says so

    def load(self, template: Template, problem: Problem) -> None:
        """Measure ``problem`` (of ``template``) from now on, in the same child: a worker that runs
        one job after another keeps its process, CUDA context and loaded kernels, and only makes
        the new inputs and reference (while the caller sets up the job)."""
        if template is self.template and problem == self.problem:
            return
        self.template, self.problem = template, problem
        if self._process is None or self._conn is None:
            return  # the next request starts a child for the new problem
        try:
            self._conn.send(("load", pickle.dumps((template, problem, self.rep_ms, self.timing)), None))
        except OSError:  # the child is gone: start a fresh one for the new problem
            self._stop(grace_s=0.0)
            self._start()
        self._ready = False

    def wait_ready(self) -> None:
        """Wait until the child has made its inputs and reference (TunesvcError if it cannot)."""
        if self._process is None:
            self._start()
        if not self._ready:
            self._wait_ready()

    def _request(self, kind: str, config: Any, times: tuple[float | None, float | None] | None = None) -> Any:
        self.wait_ready()
        try:
            self._conn.send((kind, config, times))
            if self._conn.poll(self.timeout_s):
                measurement = self._conn.recv()
                if isinstance(measurement, Measurement) and measurement.status is Status.CRASH:
                    self._replace()  # the child exits after saying so
                return measurement
        except (EOFError, OSError):  # the pipe broke: the child is gone
            pass
        else:
            self._replace()
            return Measurement(
                Status.TIMEOUT, message=f"no result within {self.timeout_s:g} s; measuring process replaced"
            )
        code = self._replace()
        return Measurement(Status.CRASH, message=f"measuring process died (exit code {code}); replaced")

    def _start(self) -> None:
        # pickled here, unpickled by the child once it has this process's sys.path
        payload = pickle.dumps((self.template, self.problem, self.rep_ms, self.timing))
        self._process, self._conn = start_child(_worker_main, payload)
        self._ready = False

    def _wait_ready(self) -> None:
        # making the inputs and the reference is not a candidate's time: it has its own, long wait
        try:
            said = self._conn.recv() if self._conn.poll(max(self.timeout_s, STARTUP_TIMEOUT_S)) else None
        except (EOFError, OSError):
            said = None
        if said != "ready":
            self._stop(grace_s=0.0)
            if isinstance(said, tuple) and said[:1] == ("failed",):
                raise TunesvcError(
                    f"The measuring process for {self.template.name} could not make the inputs and reference "
                    f"of {self.problem}: {said[1]}"
                )
            raise TunesvcError(
                f"The measuring process for {self.template.name} did not start; run the sweep with isolate=False to see why."
            )
        self._ready = True

    def _replace(self) -> int | None:
        """Stop the child (killing it if it does not exit at once); the next request starts one."""
        code = self._stop(grace_s=1.0)
        self.restarts += 1
        return code

    def _stop(self, grace_s: float) -> int | None:
        if self._process is None:
            return None
        process, self._process = self._process, None
        self._conn.close()
        process.join(grace_s)
        if process.is_alive():
            process.kill()
            process.join()
        return process.exitcode

    def close(self) -> None:
        if self._process is not None:
            try:  # said, not left to EOF: processes forked since (compile workers) hold this end too
                self._conn.send(("stop", None, None))
            except OSError:
                pass
        self._stop(grace_s=5.0)


def _made(conn: Connection, template: Any, problem: Any, rep_ms: float, timing: str) -> Bench | None:
    """The problem's Bench (its inputs and reference); None where they cannot be made (out of
    memory, a template's error), after telling the parent why in one line. Timed in CUDA graphs,
    its kernels launch through Triton's launcher (no host time is measured; the static one's import
    would delay the first trial by seconds)."""
    use_static_launcher(timing != "graph")
    try:
        return Bench(template, problem, current_device(), rep_ms=rep_ms, timing=timing)
    except Exception as exc:
        conn.send(("failed", f"{type(exc).__name__}: {one_line(exc)}"))
        return None


def _worker_main(conn: Connection, payload: bytes) -> None:
    """The child of a :class:`Worker`: a Bench answering (kind, config, times) requests until told
    to stop, EOF, or the sweep's process exiting (kind: measure, time, or peer, which has no config;
    times: a time request's (rep_ms, graph_ms))."""
    set_role("measurer")
    mark("measurer process started")
    template, problem, default_rep_ms, timing = pickle.loads(payload)
    bench = _made(conn, template, problem, default_rep_ms, timing)
    if bench is None:
        return
    mark("inputs and reference made")
    conn.send("ready")
    while True:
        try:
            kind, config, times = conn.recv()
        except EOFError:
            return
        if kind == "stop":
            return
        if kind == "load":  # the next problem (Worker.load): its pickled (template, problem, rep_ms, timing)
            template, problem, default_rep_ms, timing = pickle.loads(config)
            del bench  # the old inputs go before the new ones are made
            made = _made(conn, template, problem, default_rep_ms, timing)
            if made is None:
                return
            bench = made
            conn.send("ready")
            continue
        if kind == "together":  # config holds the configs; times (rep_ms, rounds)
            ms = bench.time_together(config, times[0], int(times[1]))
            lost = next((m for m in ms if bench.device.is_gpu and not m.ok and context_lost(m.message)), None)
            if lost is None:
                conn.send(ms)
                continue
            m = lost
        elif kind == "measure":
            m = bench.measure(config)
        elif kind == "peer":
            m = bench.time_peer()
        else:
            m = bench.time_only(config, *times)
        if bench.device.is_gpu and not m.ok and context_lost(m.message):
            conn.send(Measurement(Status.CRASH, message=m.message))
            conn.close()
            os._exit(1)  # the CUDA context is unusable: no clean-up can run on it
        conn.send(m)
