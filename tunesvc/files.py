"""Files that `tune export` and `tune report` write: whole or not at all, and never through a
link; and files read that anyone may have put in place: a regular file or nothing.

An output folder may be shared (a team's `--out`, /tmp): anyone who can write there can plant a
symbolic link under the name a command is about to write, or under the name of its temporary
file. So the text goes to a temporary file of an unpredictable name made in the target's own
folder (:func:`tempfile.mkstemp`: created, never opened if it exists), which then replaces the
target by a rename (:func:`os.replace`): the rename replaces a name, never the file a link at
that name points to. Before that, :func:`check_replaceable` refuses to replace what the user did
not ask to replace: a link, a folder, or a file that is not one the command itself wrote.

A file read (a bundle) or appended to (a timeline, a summary) may be a FIFO, whose opening waits
for a writer (or a reader) forever, or a device such as /dev/zero, which never ends:
:func:`open_regular` (under :func:`read_regular` and :func:`append_line`) opens without waiting
and refuses any path that is not a regular file, and :func:`check_regular` refuses one before
another library (SQLite) opens it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from tunesvc.errors import TunesvcError


def check_replaceable(path: Path, ours: Callable[[Path], bool], what: str) -> None:
    """Raise unless writing ``path`` creates it or replaces a regular file that ``ours`` recognises
    (``what``, such as "tunesvc bundle", names it in the error)."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        raise TunesvcError(
            f"{path} is a symbolic link, which tunesvc does not write through or replace; remove it, or pass another --out."
        )
    if stat.S_ISDIR(info.st_mode):
        raise TunesvcError(f"{path} is a folder; move it, or pass another --out.")
    if not stat.S_ISREG(info.st_mode) or not ours(path):
        raise TunesvcError(f"{path} exists and is not a {what}, so it is kept; move it, or pass another --out.")


#: what a path that is not a regular file is, as messages name it
FILE_KINDS = {
    stat.S_IFDIR: "a folder",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def _not_regular(path: str | os.PathLike, mode: int, what: str) -> TunesvcError:
    kind = FILE_KINDS.get(stat.S_IFMT(mode), "not a regular file")
    return TunesvcError(f"{path} is {kind}, not {what}; check the path.")


def open_regular(path: str | os.PathLike, flags: int, what: str) -> int:
    """A descriptor of the regular file at ``path`` (a link to one is followed), opened with
    ``flags`` (os.O_RDONLY, os.O_WRONLY | os.O_APPEND | os.O_CREAT ...; a file created gets mode
    0o644 under the umask).

    Opened without blocking (O_NONBLOCK: a FIFO opens at once instead of waiting for a writer or
    a reader; a write-only FIFO with no reader fails with ENXIO, said as a FIFO too) and checked on
    the open file (no other file can take its place between a check and the use); anything but
    a regular file raises TunesvcError saying what it is and that it is not ``what`` ("a bundle
    file"). O_NONBLOCK changes nothing for a regular file. OSError (not there, not allowed) is the
    caller's to word.
    """
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO no process reads: opening it for writing is refused
            with contextlib.suppress(OSError):
                raise _not_regular(path, os.stat(path).st_mode, what) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _not_regular(path, mode, what)
    return fd


def check_regular(path: str | os.PathLike, what: str) -> None:
    """Raise TunesvcError where something that is not a regular file is at ``path`` (a folder, a
    FIFO, a device, a socket; a link to a regular file is one); nothing there is fine. For a
    file another library opens itself, such as SQLite's database and its side files."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # not there, or a name the system refuses: said where it is opened
        return
    if not stat.S_ISREG(mode):
        raise _not_regular(path, mode, what)


def read_regular(path: str | os.PathLike, most: int, what: str) -> bytes:
    """At most ``most`` + 1 bytes of the regular file at ``path`` (see :func:`open_regular`)."""
    with os.fdopen(open_regular(path, os.O_RDONLY, what), "rb") as handle:
        return handle.read(most + 1)


def append_line(path: str | os.PathLike, line: str, what: str) -> None:
    """Append ``line`` (UTF-8, a newline added) to the regular file at ``path``, creating it, in one
    ``write`` of a descriptor opened with O_APPEND: lines of processes appending to one local file
    at once are never interleaved. Refuses what :func:`open_regular` refuses."""
    fd = open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, what)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file of an unpredictable name in the
    same folder, renamed over ``path``: readers see the old file or the new one, never half of
    one, and a failure leaves no temporary file. The new file gets the mode of the file it
    replaces, else the mode a new file gets under the process's umask."""
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name[:64]}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(temporary, _mode_of(path))
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _mode_of(path: Path) -> int:
    with contextlib.suppress(OSError):
        return stat.S_IMODE(path.lstat().st_mode)
    umask = os.umask(0)  # read by setting it: the one way there is
    os.umask(umask)
    return 0o666 & ~umask
