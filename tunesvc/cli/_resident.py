"""A resident process for `tune sweep`: torch, Triton, SQLAlchemy, Optuna, the shipped kernels and
this CLI imported once; each sweep is a fork of it that runs in the caller's terminal.

Why: a fresh `tune sweep` spends 3.6-5.5 s of a GPU host's time importing torch, Triton and the
kernels (the start-up timelines of benchmarks/results/startup.csv), more than the rest of its way
to the first stored trial. A sweep that finds no resident process runs in its own process, as
without one, and starts one in the background (a session of its own, no terminal, its output
discarded). A sweep that finds one sends it the command line, working folder, environment, umask
and the three standard streams (the file descriptors themselves, over a Unix socket); the resident
process forks a child that takes them on and runs the command, and the caller relays Ctrl-C,
SIGTERM and SIGHUP to that child and exits with its status. Written here, after multiprocessing's
forkserver and build tools' resident servers (Gradle's daemon, Bazel's server): no maintained
library forks a preloaded CLI for another process's terminal.

What keeps a child the same as a fresh `tune sweep`:

- Its imports are the resident process's, made by the same interpreter with the same flags,
  module path, import-time environment, user, groups, CPU set, cgroup, niceness and limits; those,
  and the paths, sizes and times of the files of tunesvc, its kernels and search spaces and the
  libraries it imports, make the *fingerprint* that names the resident process's socket. A caller
  whose fingerprint differs (an edited kernel, another virtual environment, another ``TRITON_*``
  value) finds no socket under that name and starts a resident process of its own; the stale one
  exits once idle.
- Its environment, argv, working folder, umask and streams are the caller's, and so is each
  TUNESVC_* setting the command reads (:data:`COMMAND_ENV` are left out of the fingerprint).
- The resident process never initialises CUDA and runs no second Python thread (it refuses to
  serve otherwise), so its child forks its GPU workers as a fresh process does (:mod:`tunesvc._processes`).
- It exits TUNESVC_RESIDENT_IDLE_S (600 s) after its last child ended; TUNESVC_RESIDENT=0 turns it
  off, =1 on where no GPU is visible too (the default: on where one may be).

It fails open: where it fails before a child starts (no socket, a socket that does not answer as
a resident process, a folder other users may write), the sweep runs in the caller's process, with
one warning line where the failure is not simply "none running". The socket's folder is the
user's alone (mode 0700, checked before use) and the resident process serves its own user only
(``SO_PEERCRED`` where the system has it). A child's exit status comes back; where the caller
goes away first (killed), its child is interrupted as by Ctrl-C.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.machinery
import importlib.util
import json
import os
import selectors
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tunesvc import settings
from tunesvc.text import warn
from tunesvc.timeline import mark

#: what the resident process imports before it listens: what `tune sweep` imports on its way to
#: the first trial (a module that is not installed, such as Optuna, is skipped)
PRELOAD = (
    "tunesvc",
    "torch",
    "triton",
    "triton.language",
    "tunesvc.kernels",
    "sqlalchemy",
    "optuna",
    "tunesvc.store",
    "tunesvc.search",
    "tunesvc.bench",
    "tunesvc.tuning.sweep",
    "tunesvc.fleet.jobs",
    "tunesvc.fleet.batch",
    "tunesvc.cli",
)
#: the installed packages whose files are part of the fingerprint: every file of tunesvc's own
#: (an edited kernel or search space), the top-level files of the others (an upgrade rewrites them)
OWN_PACKAGES = ("tunesvc", "tunesvc.kernels", "tunesvc.search_spaces")
LIBRARIES = ("torch", "triton", "sqlalchemy", "optuna", "numpy", "typer", "click", "rich")
#: prefixes of the environment variables that what the resident process imports may read at import
IMPORT_ENV = (
    "PYTHON", "TRITON", "TORCH", "PYTORCH", "CUDA", "NVIDIA", "LD_", "TUNESVC_", "OMP_", "MKL_",
    "KMP_", "NCCL_", "HIP", "ROCM", "ROCR", "XDG_CACHE_HOME", "HOME", "PATH", "VIRTUAL_ENV",
    "CONDA_PREFIX", "LANG", "LC_", "TMPDIR", "SQLALCHEMY", "OPTUNA", "NUMPY",
)  # fmt: skip
#: ... of which these are read by the command alone, as it runs (the child has the caller's)
COMMAND_ENV = ("TUNESVC_DB", "TUNESVC_TIMELINE", "TUNESVC_TIMELINE_ROLE", "TUNESVC_RESIDENT", "TUNESVC_RESIDENT_IDLE_S")
#: the commands that run in a resident process's child (those that import torch on every start)
COMMANDS = ("sweep",)
#: the most bytes of one message on the socket (a request carries the caller's environment)
MAX_MESSAGE = 4 << 20
#: seconds a caller waits for the resident process to fork its child, and the resident process
#: for a caller's request
ANSWER_S = 30.0
#: seconds between an idle resident process's checks that its socket is still there
CHECK_S = 30.0
#: the longest path of a Unix socket (sockaddr_un's sun_path, 108 bytes on Linux, less elsewhere)
MAX_SOCKET_PATH = 100


# -- the caller -------------------------------------------------------------------------------
def run_in_resident(argv: list[str]) -> int | None:
    """Run the command ``argv`` in a fork of this host's resident process and return its exit
    status; None where it should run in this process instead (not a resident command, turned
    off, or no resident process to take it; one is then started for the next command)."""
    if len(argv) < 2 or argv[1] not in COMMANDS or not _wanted():
        return None
    try:
        print_ = fingerprint()
    except OSError:  # a file of the fingerprint vanished while it was read: run here
        return None
    where = socket_path(print_)
    if where is None:
        return None
    mark("resident process asked")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        answer = _run_through(client, where, print_)
    if answer is None:
        return None
    code, pid = answer.get("exit"), answer["pid"]
    if not isinstance(code, int) or isinstance(code, bool):
        sys.stderr.write(f"tunesvc: the resident process ended before its sweep (process {pid}) did.\n")
        return 1
    if code < 0:  # the child ended by a signal: so does this process, as a shell expects
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


def _run_through(client: socket.socket, where: Path, print_: str) -> dict[str, Any] | None:
    """The resident process's answer at the end of the command sent through ``client`` (its
    ``exit`` status, its child's ``pid``), or None where the command is to run here."""
    try:
        try:
            client.connect(str(where))
        except (FileNotFoundError, ConnectionRefusedError):  # none running (or a dead one's socket)
            start(where)
            return None
        client.settimeout(ANSWER_S)
        channel = _Channel(client)
        channel.send(_request(print_), fds=[0, 1, 2])
        answer = channel.receive()
        pid = answer.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool):
            refused = answer.get("refused", answer)
            warn(f"tunesvc: the resident process at {where} refused the sweep ({refused}); it runs here.")
            return None
    except (OSError, ValueError) as exc:
        warn(f"tunesvc: the resident process at {where} did not take the sweep ({exc}); it runs here.")
        return None
    except KeyboardInterrupt:  # before the child was known: the resident process interrupts it
        return {"pid": None, "exit": 130}
    with _relaying_signals(pid):
        client.settimeout(None)  # a sweep runs as long as it runs
        try:
            answer = channel.receive()
        except (OSError, ValueError):
            answer = {}
    return {**answer, "pid": pid}


def _wanted() -> bool:
    """Whether this process may use a resident process: TUNESVC_RESIDENT, or by default where a GPU
    may be present; never where fork, fd passing or a signal handler (the main thread) is missing."""
    from tunesvc._processes import may_have_gpu

    if not (hasattr(socket, "send_fds") and hasattr(os, "fork") and sys.platform.startswith("linux")):
        return False
    if threading.current_thread() is not threading.main_thread():
        return False
    if not all(_is_open(fd) for fd in (0, 1, 2)):  # a closed standard stream cannot be passed on
        return False
    return settings.resident(default=may_have_gpu())


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _request(print_: str) -> dict[str, Any]:
    main = sys.modules.get("__main__")

    def encoding(stream: Any) -> list[str | None]:
        return [getattr(stream, "encoding", None), getattr(stream, "errors", None)]

    return {
        "fingerprint": print_,
        "argv": sys.argv,
        "cwd": os.getcwd(),
        "env": settings.environment(),
        "path": sys.path,
        "umask": _umask(),
        "main_package": getattr(main, "__package__", None),  # click names the program from it
        "streams": [encoding(sys.stdin), encoding(sys.stdout), encoding(sys.stderr)],
    }


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def _relaying_signals(pid: int) -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP sent to this process go to the child ``pid`` instead."""

    def relay(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    relayed = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = {signum: signal.signal(signum, relay) for signum in relayed}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def start(where: Path) -> None:
    """Start a resident process that listens at ``where``, detached from this one."""
    if where.with_suffix(".failed").exists():  # one of this fingerprint could not serve: not again
        return
    env = {name: value for name, value in settings.environment().items() if not name.startswith("TUNESVC_TIMELINE")}
    code = "from tunesvc.cli._resident import serve; serve()"
    # the interpreter's flags (-W, -X, -O, -E...) as multiprocessing's spawn passes them on
    flags = subprocess._args_from_interpreter_flags()  # type: ignore[attr-defined]
    args = [sys.executable, *flags, "-c", code, str(where), json.dumps(sys.path)]
    null = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1, 2)]
    try:
        # posix_spawn, not subprocess.Popen: no Popen object left to warn that its child still runs
        os.posix_spawn(sys.executable, args, env, file_actions=null, setsid=True)
    except OSError as exc:
        warn(f"tunesvc: no resident process could be started for the next sweep ({exc}).")


# -- where and which ----------------------------------------------------------------------------
def socket_path(print_: str) -> Path | None:
    """The socket of the resident process of fingerprint ``print_``, in a folder of this user's
    alone; None (one warning where the folder is not the user's alone) where there is none."""
    base = settings.raw("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    folder = Path(base) / f"tunesvc-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        seen = os.lstat(folder)
    except OSError:
        return None
    if not stat.S_ISDIR(seen.st_mode) or seen.st_uid != os.getuid() or seen.st_mode & 0o077:
        warn(
            f"tunesvc: {folder} is not a folder of this user's alone, so `tune sweep` runs without a "
            "resident process; remove it, or make it yours with mode 700."
        )
        return None
    where = folder / f"resident-{print_}.sock"
    return where if len(os.fsencode(where)) <= MAX_SOCKET_PATH else None


def fingerprint() -> str:
    """What the imports of a resident process depend on, as 20 hex digits (see the module docstring)."""
    env = {
        name: value
        for name, value in settings.environment().items()
        if name.startswith(IMPORT_ENV) and name not in COMMAND_ENV
    }
    process: dict[str, Any] = {
        "python": [sys.executable, sys.version, list(sys.flags), sys.warnoptions, sys._xoptions],
        "path": sys.path,
        "env": sorted(env.items()),
        "user": [os.getuid(), os.getgid(), sorted(os.getgroups())],
        "cpus": sorted(os.sched_getaffinity(0)),
        "nice": os.nice(0),
        "limits": _limits(),
        "cgroup": _read("/proc/self/cgroup"),
        "files": list(_installed_files()),
    }
    return hashlib.sha256(json.dumps(process, default=str).encode()).hexdigest()[:20]


def _limits() -> list[tuple[int, int]]:
    import resource

    names = ("RLIMIT_AS", "RLIMIT_CORE", "RLIMIT_CPU", "RLIMIT_DATA", "RLIMIT_NOFILE", "RLIMIT_STACK")
    return [resource.getrlimit(getattr(resource, name)) for name in names if hasattr(resource, name)]


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _installed_files() -> Iterator[tuple[str, int, int]]:
    """(path, size, modification time in ns) of the files whose contents the preloaded modules
    hold: every file of tunesvc's packages, the top-level package files of the libraries."""
    for name in (*OWN_PACKAGES, *LIBRARIES):
        try:
            # the libraries on sys.path alone: a meta path finder may import on a find (tunesvc's
            # own, on a host with a GPU, imports torch when triton is first looked for)
            spec = (
                importlib.util.find_spec(name)
                if name in OWN_PACKAGES
                else importlib.machinery.PathFinder.find_spec(name)
            )
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            yield (name, -1, -1)
            continue
        folders = list(spec.submodule_search_locations or [])
        files = (
            [p for folder in folders for p in sorted(Path(folder).rglob("*")) if p.suffix in (".py", ".toml")]
            if name in OWN_PACKAGES
            else [Path(spec.origin or name), *map(Path, folders)]
        )
        for path in files:
            seen = path.stat()
            yield (str(path), seen.st_size, seen.st_mtime_ns)


# -- the resident process ------------------------------------------------------------------------
def serve() -> None:
    """The resident process (``python -c ... SOCKET SYSPATH``, started by :func:`start`): import
    :data:`PRELOAD`, listen at SOCKET, fork a child per request and return in that child, which
    runs the command and exits; the resident process itself exits once idle."""
    where, path = Path(sys.argv[1]), json.loads(sys.argv[2])
    sys.path[:] = path  # the caller's: the preloaded modules resolve as the caller's imports would
    request = _Resident(where).run()
    if request is not None:
        _become(*request)


class _Resident:
    def __init__(self, where: Path) -> None:
        self.where = where
        self.forked = False  # True in a child, which returns out of the loop to run its command
        # child pid -> its caller (None: gone); a caller's socket is in the selector with its child's pid
        self.children: dict[int, _Channel | None] = {}

    def run(self) -> tuple[dict[str, Any], list[int]] | None:
        """Serve until idle; in a forked child, the request it is to run and its streams."""
        import fcntl

        lock = os.open(self.where.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another resident process of this fingerprint serves, or is starting
            return None
        os.ftruncate(lock, 0)
        os.write(lock, f"{os.getpid()}\n".encode())  # who serves there, for whoever would stop it
        try:
            problem = _preload()
        except BaseException as exc:  # an import that fails: said in the marker, never retried
            problem = f"importing failed: {type(exc).__name__}: {exc}"
        if problem is not None:
            self.where.with_suffix(".failed").write_text(problem + "\n")
            return None
        os.chdir("/")  # holds no caller's folder (each child moves to its own)
        return self._listen(lock)

    def _listen(self, lock: int) -> tuple[dict[str, Any], list[int]] | None:
        with contextlib.suppress(FileNotFoundError):
            self.where.unlink()  # a dead resident process's (this one holds the lock)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.where))
        os.chmod(self.where, 0o600)
        listener.listen(64)
        identity = os.stat(self.where).st_ino
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_read, False)
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes select through the pipe
        selector = selectors.DefaultSelector()
        selector.register(listener, selectors.EVENT_READ, "listener")
        selector.register(wake_read, selectors.EVENT_READ, "wake")
        idle_s, since = settings.resident_idle_s(), time.monotonic()
        try:
            while True:
                if not self.children and (time.monotonic() - since >= idle_s or not _still(self.where, identity)):
                    return None  # idle, or its socket removed (its folder deleted): none can reach it
                left = idle_s - (time.monotonic() - since)
                timeout = None if self.children else max(0.0, min(left, CHECK_S))
                for key, _ in selector.select(timeout):
                    if key.data == "listener":
                        with contextlib.suppress(OSError):
                            conn, _ = listener.accept()
                            since = time.monotonic()
                            request = self._take(conn, selector)
                            if request is not None:  # in the child: nothing of the server's stays open
                                for fd in (wake_read, wake_write, lock):
                                    os.close(fd)
                                for other in list(selector.get_map().values()):
                                    if isinstance(other.data, int):  # a caller's socket
                                        other.fileobj.close()  # type: ignore[union-attr]
                                selector.close()
                                listener.close()
                                return request
                    elif key.data == "wake":
                        with contextlib.suppress(BlockingIOError):
                            os.read(wake_read, 4096)
                    else:  # a caller's socket: it went away (killed), or sent what it must not
                        self._caller_gone(key.fileobj, key.data, selector)  # type: ignore[arg-type]
                if self._reap():
                    since = time.monotonic()
        finally:
            if not self.forked:
                with contextlib.suppress(OSError):
                    if _still(self.where, identity):  # not a successor's socket
                        self.where.unlink()

    def _take(self, conn: socket.socket, selector: selectors.BaseSelector) -> tuple[dict[str, Any], list[int]] | None:
        """Read a caller's request and fork its child; in the child, the request and streams."""
        conn.settimeout(ANSWER_S)
        channel = _Channel(conn)
        fds: list[int] = []
        try:
            request, fds = channel.receive_with_fds()
            refused = _refusal(conn, request, fds)
            if refused is not None:
                channel.send({"refused": refused})
                raise ValueError(refused)
            with warnings.catch_warnings():
                # Python 3.12+ warns of any second thread at a fork: torch's import leaves an idle
                # native one, as in every sweep that forks its workers (Python threads: refused above)
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except (OSError, ValueError):
            for fd in fds:
                os.close(fd)
            conn.close()
            return None
        if pid == 0:
            self.forked = True
            conn.close()
            return request, fds
        for fd in fds:
            os.close(fd)
        self.children[pid] = channel
        selector.register(conn, selectors.EVENT_READ, pid)
        try:
            channel.send({"pid": pid})
        except OSError:  # the caller went away while its child was forked
            self._caller_gone(conn, pid, selector)
            return None
        conn.settimeout(None)
        return None

    def _caller_gone(self, conn: socket.socket, pid: int, selector: selectors.BaseSelector) -> None:
        selector.unregister(conn)
        conn.close()
        if pid in self.children:  # its child still runs
            self.children[pid] = None
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)  # as Ctrl-C would: a sweep gives its jobs back

    def _reap(self) -> bool:
        """Tell each caller whose child ended its status; whether any ended."""
        ended = False
        for pid in list(self.children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if not done:
                continue
            ended = True
            channel = self.children.pop(pid)
            if channel is not None:
                with contextlib.suppress(OSError):
                    channel.send({"exit": os.waitstatus_to_exitcode(status)})
                # the selector holds it until the caller closes its end (its EOF: _caller_gone)
        return ended


def _still(where: Path, identity: int) -> bool:
    """Whether the socket at ``where`` is still the one this process bound (inode ``identity``)."""
    try:
        return os.stat(where).st_ino == identity
    except OSError:
        return False


def _preload() -> str | None:
    """Import :data:`PRELOAD`; what keeps this process from forking sweeps, as one line, or None."""
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # not installed (Optuna is optional)
            continue
    return _cannot_fork()


def _cannot_fork() -> str | None:
    """Why a child forked from this process now could not run a GPU sweep, or None."""
    from tunesvc._processes import can_fork_gpu_children

    if not can_fork_gpu_children():
        return "CUDA is initialised here, so a forked sweep could not use the GPU"
    # Python threads, as a sweep's own forks require: torch's import leaves an idle native thread
    # in every process, the one a fresh `tune sweep` forks its workers with too
    if threading.active_count() > 1:
        return f"a thread was started here ({threading.active_count()} running), so forking could deadlock"
    return None


def _refusal(conn: socket.socket, request: Any, fds: list[int]) -> str | None:
    """Why the request must not be run here, or None."""
    if hasattr(socket, "SO_PEERCRED"):
        _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        if uid != os.getuid():
            return "another user's request"
    if not isinstance(request, dict) or len(fds) != 3:
        return "not a request with three streams"
    expected = {"fingerprint": str, "argv": list, "cwd": str, "env": dict, "path": list, "umask": int, "streams": list}
    for name, kind in expected.items():
        if not isinstance(request.get(name), kind):
            return f"the request's {name} is missing or not a {kind.__name__}"
    if not 0 <= request["umask"] <= 0o777:
        return "the request's umask is not a file mode"
    texts = [*request["argv"], *request["path"], *request["env"], *request["env"].values()]
    if not all(isinstance(text, str) for text in texts):
        return "the request's argv, path or environment holds what is not text"
    if request["fingerprint"] != _own_fingerprint():
        return "another fingerprint: its imports differ from this process's"
    if not request["argv"][1:2] or request["argv"][1] not in COMMANDS:
        return f"not one of the commands {', '.join(COMMANDS)}"
    return _cannot_fork()


def _own_fingerprint() -> str:
    """The fingerprint in this process's socket name (``resident-<fingerprint>.sock``)."""
    return Path(sys.argv[1]).stem.removeprefix("resident-")


def _become(request: dict[str, Any], fds: list[int]) -> None:
    """In a forked child: take on the caller's streams, folder, environment and command, and run
    the command; exits (SystemExit) with its status."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        if fd > 2:
            os.close(fd)
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.set_wakeup_fd(-1)
    try:
        os.chdir(request["cwd"])
    except OSError as exc:  # removed since the caller asked: said on the caller's stderr, as a fresh start would fail
        os.write(2, f"tunesvc: cannot enter the working folder {request['cwd']!r}: {exc.strerror}.\n".encode())
        os._exit(1)
    os.umask(request["umask"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv[:] = request["argv"]
    sys.path[:] = request["path"]
    importlib.invalidate_caches()
    main = sys.modules["__main__"]
    main.__package__ = request.get("main_package")
    _take_streams(request["streams"])
    if "numpy" in sys.modules:  # random and torch reseed or start alike in a fresh process; numpy does not
        sys.modules["numpy"].random.seed()
    from tunesvc import timeline
    from tunesvc.cli import _common

    # the console made when the resident process imported the CLI saw /dev/null: made anew for the caller's terminal
    _common.console.__init__()  # type: ignore[misc]
    timeline.set_role(settings.timeline_role())
    mark("resident process forked")
    _common.app()


def _take_streams(encodings: list[Any]) -> None:
    """sys.stdin, stdout and stderr on descriptors 0-2 (now the caller's), as Python makes them."""

    def stream(fd: int, mode: str, line: bool) -> Any:
        encoding, errors = (list(encodings[fd]) + [None, None])[:2] if fd < len(encodings) else (None, None)
        return open(  # the process's standard stream, open until it exits
            fd, mode, buffering=1 if line else -1, encoding=encoding, errors=errors, closefd=False
        )

    sys.stdin = stream(0, "r", False)
    sys.stdout = stream(1, "w", os.isatty(1))
    sys.stderr = stream(2, "w", True)  # line-buffered, as Python's own stderr


# -- messages ----------------------------------------------------------------------------------
class _Channel:
    """Length-prefixed JSON messages on a stream socket (JSON: nothing received is executed)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def send(self, message: dict[str, Any], fds: list[int] | None = None) -> None:
        data = json.dumps(message).encode()
        framed = struct.pack("!I", len(data)) + data
        if fds:
            sent = socket.send_fds(self.sock, [framed], fds)
            framed = framed[sent:]
        if framed:
            self.sock.sendall(framed)

    def receive(self) -> dict[str, Any]:
        return self._message([])

    def receive_with_fds(self) -> tuple[dict[str, Any], list[int]]:
        fds: list[int] = []
        return self._message(fds), fds

    def _message(self, fds: list[int]) -> dict[str, Any]:
        while len(self.buffer) < 4:
            self._fill(fds)
        (size,) = struct.unpack("!I", self.buffer[:4])
        if size > MAX_MESSAGE:
            raise ValueError(f"a message of {size} bytes, over {MAX_MESSAGE}")
        while len(self.buffer) < 4 + size:
            self._fill(fds)
        data, self.buffer = self.buffer[4 : 4 + size], self.buffer[4 + size :]
        message = json.loads(data)
        if not isinstance(message, dict):
            raise ValueError("a message that is not a JSON object")
        return message

    def _fill(self, fds: list[int]) -> None:
        data, received, _, _ = socket.recv_fds(self.sock, 1 << 16, 3)
        fds.extend(received)
        if not data:
            raise ConnectionAbortedError("the other end closed the socket")
        self.buffer += data
