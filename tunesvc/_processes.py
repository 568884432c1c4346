"""How tunesvc starts the processes it compiles and measures in, and which Triton backend they run.

The policy, in one place:

* **Triton backend.** Without a GPU, kernels run in Triton's CPU interpreter
  (``TRITON_INTERPRET=1``). The flag must be set before triton is first imported (triton.language
  builds its own jit helpers at import), so ``import tunesvc`` settles it
  (:func:`use_interpreter_without_gpu`) without importing torch: where no GPU device node exists
  (``/dev/nvidia0``..., ``/dev/kfd``, ``/dev/dxg``; macOS has no CUDA) or CUDA_VISIBLE_DEVICES
  hides every GPU, torch finds none either. Where one may be present, torch decides
  (``torch.cuda.device_count()``, which asks NVML and leaves the CUDA driver uninitialised) just
  before triton is first imported, so importing tunesvc costs no torch import on any machine.
* **Start method.** Compile and measuring workers are forked (:func:`worker_context`) while this
  process has not initialised CUDA: a forked worker starts in milliseconds with torch, triton and
  tunesvc already imported. A process that has initialised CUDA cannot fork GPU children, so
  then a forkserver starts them (:func:`forkserver_context`); it imports torch, triton and
  tunesvc's kernels once (none of them initialises CUDA on import). A sweep reads its device in a
  forked child (:func:`call_in_forked_child`, used by
  :func:`tunesvc.device.fork_safe_current_device`) to stay a process that can fork. The children
  never touch the parent's database connections and end with ``os._exit``, so fork leaves those
  alone.
* **Locks across a fork.** A lock another thread held at a fork stays held in the child for
  ever, since that thread does not exist there; each module whose locks a child may take makes
  them anew in an ``os.register_at_fork(after_in_child=...)`` handler (:func:`remake_unheld`,
  :func:`remake_cached_property_locks`).
* **Every worker** (:func:`start_worker`) uses one CPU thread and exits once the sweep's process
  is gone; a measuring child (:func:`start_child`) sees the parent's ``sys.path``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import multiprocessing
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import forkserver
from multiprocessing.connection import Connection
from multiprocessing.context import ForkContext
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any
from typing import TypeVar

T = TypeVar("T")

#: what a forkserver imports once, so that each worker it forks starts with them loaded; tunesvc
#: first, so that it settles the Triton backend before the server imports triton
FORKSERVER_PRELOAD = ["tunesvc", "torch", "triton", "triton.language", "tunesvc.kernels"]


# -- the Triton backend -------------------------------------------------------------------------
def use_interpreter_without_gpu() -> None:
    """Without a GPU, run kernels in Triton's CPU interpreter (see the module docstring).

    Sets ``TRITON_INTERPRET=1`` now where no GPU can be visible; where one may be, lets torch
    decide now if torch or triton is already imported, else just before triton is first
    imported. A ``TRITON_INTERPRET`` already set is left as it is.
    """
    if "TRITON_INTERPRET" in os.environ:
        return
    if not _may_have_gpu():
        os.environ["TRITON_INTERPRET"] = "1"
    elif "torch" in sys.modules or "triton" in sys.modules:
        _ask_torch()
    elif not any(isinstance(finder, _BeforeTriton) for finder in sys.meta_path):
        sys.meta_path.insert(0, _BeforeTriton())


def may_have_gpu() -> bool:
    """Whether a GPU may be visible to this process, told without importing torch (:func:`_may_have_gpu`)."""
    return _may_have_gpu()


def _may_have_gpu() -> bool:
    """False where torch certainly finds no GPU: CUDA_VISIBLE_DEVICES hides every one, or no GPU
    device node exists (NVIDIA's driver, ROCm and WSL's GPU each show one in /dev; macOS has no
    CUDA). True where that cannot be told without the driver (Windows)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    if sys.platform == "darwin":
        return False
    if not sys.platform.startswith("linux"):
        return True
    dev = Path("/dev")
    return any(dev.glob("nvidia[0-9]*")) or (dev / "kfd").exists() or (dev / "dxg").exists()


def _ask_torch() -> None:
    # torch is heavy (a second or more): imported only where a GPU may be present
    import torch

    # device_count() asks NVML, not the CUDA driver: is_available() would initialise the driver,
    # and a process forked after that (a compile or measuring worker) could not use the GPU
    if torch.cuda.device_count() == 0:
        os.environ.setdefault("TRITON_INTERPRET", "1")


class _BeforeTriton(importlib.abc.MetaPathFinder):
    """Settles the Triton backend with torch on the first import of triton, then steps aside.

    A finder, not an import of torch at ``import tunesvc``: tunesvc's light commands (``tune
    --help``, shell completion) never import torch or triton. It finds nothing itself: the import
    goes on through the other finders.
    """

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> None:
        if fullname.partition(".")[0] == "triton":
            with contextlib.suppress(ValueError):  # another thread's import got here first
                sys.meta_path.remove(self)
            _ask_torch()
        return None


# -- start methods ------------------------------------------------------------------------------
def can_fork_gpu_children() -> bool:
    """Whether a child forked from this process now could use the GPU: fork exists (POSIX, not
    macOS's, where it is unsafe with the frameworks torch loads) and CUDA is not initialised here."""
    # torch is heavy: imported by the callers' sweeps anyway, not by importing this module
    import torch

    return (
        sys.platform.startswith("linux")
        and "fork" in multiprocessing.get_all_start_methods()
        and not torch.cuda.is_initialized()
    )


def worker_context() -> ForkContext | ForkServerContext:
    """The process context of compile and measuring workers: fork while this process has not
    initialised CUDA, the forkserver once it has."""
    return multiprocessing.get_context("fork") if can_fork_gpu_children() else forkserver_context()


def forkserver_context() -> ForkServerContext:
    """The process context of workers started from a process that has initialised CUDA.

    A forkserver, not fork: a child forked from a process that has touched CUDA cannot use the
    GPU. The server imports torch, triton and tunesvc with its kernels once, so each worker starts
    in milliseconds instead of importing them again (seconds, and sixteen compile workers doing
    it at once contend for the cores).
    """
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(FORKSERVER_PRELOAD)
    return context


def start_forkserver(wait: bool = False) -> None:
    """Start the process server of compile and measuring workers now.

    Sweeps use it only from a process that has initialised CUDA (one that has not forks its
    workers itself). Its imports (torch, triton, tunesvc: seconds) then overlap the caller's own
    work instead of holding up the first compile: a long-lived process that uses the GPU and
    will sweep later (a notebook, a serving process that tunes on a miss) can start it at
    start-up. With ``wait``, return once the server can fork a worker.
    """
    context = forkserver_context()
    forkserver.ensure_running()
    if wait:  # the server forks its first child only after its imports
        child = context.Process(target=int)
        child.start()
        child.join()


def call_in_forked_child(fn: Callable[[], T]) -> T | None:
    """``fn()`` computed in a child forked for the purpose, so that whatever it initialises (the
    CUDA driver) stays out of this process; None if the child died before answering."""
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_answer, args=(sender, fn), daemon=True)
    child.start()
    sender.close()
    try:
        return receiver.recv()
    except EOFError:
        return None
    finally:
        receiver.close()
        child.join()


def _answer(sender: Connection, fn: Callable[[], Any]) -> None:
    sender.send(fn())
    sender.close()


# -- locks across a fork ------------------------------------------------------------------------
def remake_unheld(lock: Any) -> None:
    """``lock`` unheld, in place (for a forked child): CPython's ``_at_fork_reinit`` (what
    threading and logging call after a fork), else a release (a plain Lock may be released by
    any thread)."""
    reinit = getattr(lock, "_at_fork_reinit", None)
    if reinit is not None:
        reinit()
    elif lock.locked():
        lock.release()


def remake_cached_property_locks(cls: type) -> None:
    """The locks of ``cls``'s functools.cached_property attributes unheld (for a forked child):
    Python 3.11 computes each attribute under one lock shared by every instance (3.12 takes none),
    so a thread computing one at a fork would leave that attribute of every instance unreadable
    in the child."""
    for attribute in vars(cls).values():
        lock = getattr(attribute, "lock", None) if isinstance(attribute, functools.cached_property) else None
        if lock is not None:
            remake_unheld(lock)


# -- workers ------------------------------------------------------------------------------------
#: every pool :func:`worker_pool` made in this process, for :func:`_pools_left_to_the_parent`
_POOLS: weakref.WeakSet[ProcessPoolExecutor] = weakref.WeakSet()


def worker_pool(size: int, forkserver: bool = False) -> ProcessPoolExecutor:
    """A pool of ``size`` compile workers, started as :func:`start_worker` says; from the
    forkserver where asked (a pool that a background thread fills must not fork this process,
    whose other threads may hold locks the child would inherit held)."""
    context = forkserver_context() if forkserver else worker_context()
    pool = ProcessPoolExecutor(size, mp_context=context, initializer=start_worker, initargs=(os.getpid(),))
    _POOLS.add(pool)
    return pool


def _pools_left_to_the_parent() -> None:
    """In a forked child: the parent's pools never woken from here. When a pool is collected,
    its weakref callback takes the pool's shutdown lock and writes to its manager thread's pipe;
    in a child forked while that thread (the parent's) held the lock, the callback waited for
    ever (an H200 measuring child hung so at its first garbage collection, inside an import, and
    a sweep said its measuring process did not start). The callback is dropped with the weakref
    (CPython 3.9+ keeps it as the manager thread's ``executor_reference``), and the lock made
    unheld besides."""
    for pool in list(_POOLS):
        thread = getattr(pool, "_executor_manager_thread", None)
        if thread is not None and hasattr(thread, "executor_reference"):
            thread.executor_reference = None
        lock = getattr(pool, "_shutdown_lock", None)
        if lock is not None:
            remake_unheld(lock)


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_pools_left_to_the_parent)


def start_child(main: Callable[..., None], *args: Any) -> tuple[BaseProcess, Connection]:
    """Start ``main(connection, *args)`` in a measuring child; returns it and this side's end of
    their duplex pipe. ``main`` and ``args`` must pickle where the forkserver starts the child."""
    context = worker_context()
    parent_end, child_end = context.Pipe()
    # a forked child also holds this end (fork copies every descriptor): it closes its copy and
    # watches this process, since EOF no longer tells it that the parent is gone
    forked = context.get_start_method() == "fork"
    process = context.Process(
        target=_child_main,
        args=(main, child_end, parent_end if forked else None, os.getpid(), list(sys.path), args),
        daemon=True,
    )
    process.start()
    child_end.close()
    return process, parent_end


def receive_within(process: BaseProcess, connection: Connection, time_limit_s: float | None) -> Any:
    """The answer a child started by :func:`start_child` sends on ``connection``: EOFError where
    it ended without one; TimeoutError where none came within ``time_limit_s`` (None: no limit),
    the child then killed (SIGKILL: a kernel that never ends never reads a gentler signal) and
    reaped."""
    if time_limit_s is not None and not connection.poll(time_limit_s):  # poll is True at EOF too
        process.kill()
        process.join()
        raise TimeoutError(f"no answer within {time_limit_s:g} s")
    return connection.recv()


def _child_main(
    main: Callable[..., None],
    connection: Connection,
    parent_end: Connection | None,
    owner: int,
    path: list[str],
    args: tuple[Any, ...],
) -> None:
    if parent_end is not None:
        parent_end.close()
    start_worker(owner)
    sys.path[:] = path  # the template may live in a module only the parent's path reaches (a test's)
    use_interpreter_without_gpu()  # before the child's first import of triton
    main(connection, *args)


def start_worker(owner: int) -> None:
    """What a worker (compile or measuring) does first: use one CPU thread, and exit once ``owner``
    (the sweep's process) is gone.

    One thread: GNU OpenMP's thread pool does not survive fork, and a child forked after its
    parent ran a parallel torch CPU op hangs in its own first one (as in torch's DataLoader
    workers; the GPU does the work here). The watch: neither kind of worker can count on EOF when
    a sweep is killed with SIGKILL: a pool worker waits on a queue whose writer it holds itself
    (and one from the forkserver has the server, which lives on, for parent), and a forked
    measuring worker may share its pipe's other end with workers forked after it. Without it they
    would never exit. A poll, because a forkserver's child is not the owner's (no PDEATHSIG).
    """
    # torch is heavy: a worker has it imported already (forked, or preloaded by the forkserver)
    import torch

    torch.set_num_threads(1)

    def watch() -> None:
        while True:
            time.sleep(1.0)
            try:
                os.kill(owner, 0)
            except ProcessLookupError:
                os._exit(1)

    threading.Thread(target=watch, name="tunesvc-owner-watch", daemon=True).start()


# -- a command run in place of this process (`tune run`) ----------------------------------------
#: the signals a command run by :func:`run_command` is sent when this process is (SIGINT: see
#: :func:`_from_the_terminal`); those a terminal or a supervisor sends to stop or notify a program
FORWARDED_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")


def run_command(command: Sequence[str], env: dict[str, str]) -> int:
    """Run ``command`` as if it ran in this process's place, and return the exit status a shell
    gives it: its own, else 128 + the signal that ended it (137 for SIGKILL).

    Every signal of :data:`FORWARDED_SIGNALS` this process gets while the command runs is sent on
    to it (a supervisor's SIGTERM stops the command, not only its wrapper); a SIGINT or SIGQUIT a
    terminal sent to its foreground process group has reached the command already and is not sent
    twice. OSError where the command cannot start.
    """
    import signal
    import subprocess

    process = subprocess.Popen(list(command), env=env)
    kept: dict[int, Any] = {}

    def forward(signum: int, _frame: Any) -> None:
        if signum in (signal.SIGINT, signal.SIGQUIT) and _from_the_terminal():
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signum)

    if threading.current_thread() is threading.main_thread():  # handlers can be set from it alone
        for name in FORWARDED_SIGNALS:
            number = getattr(signal, name, None)
            if number is not None:
                kept[number] = signal.signal(number, forward)
    try:
        code = process.wait()  # a handler runs in between, and the wait resumes (PEP 475)
    finally:
        for number, handler in kept.items():
            signal.signal(number, handler)
    return 128 - code if code < 0 else code


def _from_the_terminal() -> bool:
    """Whether this process is in its terminal's foreground process group, where the terminal's
    SIGINT (Ctrl-C) and SIGQUIT reach every process of the group, a child run in it included.
    A heuristic (a signal handler is not told who sent the signal): a ``kill -INT`` aimed at this
    process alone while it runs in the foreground is then not forwarded, as under ``uv run``."""
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        try:
            fd = stream.fileno()
            if os.isatty(fd):
                return os.tcgetpgrp(fd) == os.getpgrp()
        except (AttributeError, OSError, ValueError):
            continue
    return False
