"""``read``: read a text file below a root directory the circle fixes (CIRCLE-10).

The root is a dependency, bound at construction. Paths are resolved against it
and must stay inside it: ``..``, absolute paths elsewhere and symlinks that
lead out are refused with an error observation.

Some files below the root are not the entity's to read (issue 21): ``hidden``
lists them (a spec file binds its own path and its loom's files -- the
database and its ``-wal``/``-shm``/``-journal`` companions -- unless the spec
sets ``hidden`` itself), and SQLite databases and write-ahead logs are refused
whatever their name, because another loom is other sessions' transcripts. A
hidden file is reported as not existing, so its presence is not disclosed.

Only regular files are read (issue 28): a FIFO, a socket or a device below the
root is refused by what ``stat`` says, before anything opens it (opening a FIFO
waits for a writer, forever). The path is opened once, non-blocking and without
following a last-moment symlink, and checked again on the open descriptor, so a
file swapped for a FIFO in between is refused too. All of it -- resolving,
``stat``, reading -- runs in a worker thread behind a small limiter, and the call
gives up after ``timeout_s`` (a hung network file system): the event loop, and
with it every other task, is never held by a file.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

import trio

from cantrip import GateError, gate

MAX_BYTES = 1_000_000
THREADS = 4
"""File reads in flight at once (per trio run); a hung read holds one until it ends."""
_DATABASE_MAGIC = (b"SQLite format 3\x00", b"\x37\x7f\x06\x82", b"\x37\x7f\x06\x83")
"""The first bytes of an SQLite database, and of its write-ahead log (either byte order)."""
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
_limiter: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("read_limiter")


def confine(root: str | Path, path: str) -> Path:
    """``path`` resolved inside ``root``, or :class:`GateError` if it escapes."""
    base = Path(root).resolve()
    candidate = Path(path)
    if candidate.is_absolute():
        candidate = Path(*candidate.parts[1:])
    target = (base / candidate).resolve()
    if target != base and base not in target.parents:
        raise GateError(f"path {path!r} is outside this circle's root")
    return target


def is_hidden(target: Path, root: str | Path, hidden: Iterable[str | Path]) -> bool:
    """Whether ``target`` (resolved) is one of ``hidden`` (relative entries: to ``root``)."""
    base = Path(root).resolve()
    return any(target == (base / Path(h)).resolve() for h in hidden)


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a file"


def _refuse_unless_file(mode: int, path: str) -> None:
    if stat.S_ISDIR(mode):
        raise GateError(f"EISDIR: {path!r} is a directory")
    if not stat.S_ISREG(mode):
        raise GateError(f"{path!r} is not a regular file ({_kind(mode)}); read opens only files")


def _read_file(root: Path, path: str, hidden: Sequence[str | Path]) -> str:
    """The blocking part, run in a worker thread: resolve, check, open once, read."""
    target = confine(root, path)
    missing = GateError(f"ENOENT: no such file or directory: {path!r}")
    if is_hidden(target, root, hidden):
        raise missing
    try:
        _refuse_unless_file(os.stat(target).st_mode, path)  # nothing opened yet
        fd = os.open(target, _OPEN_FLAGS)
    except FileNotFoundError:
        raise missing from None
    except OSError as exc:
        raise GateError(f"{path!r} cannot be opened: {exc.strerror}") from None
    with open(fd, "rb") as handle:
        info = os.fstat(fd)
        _refuse_unless_file(info.st_mode, path)  # swapped since the stat above
        if info.st_size > MAX_BYTES:
            raise GateError(f"{path!r} is {info.st_size} bytes; read is limited to {MAX_BYTES}")
        data = handle.read(MAX_BYTES + 1)
    if data.startswith(_DATABASE_MAGIC):
        raise GateError(f"{path!r} is a database, not a text file; read does not open it")
    if len(data) > MAX_BYTES:
        raise GateError(f"{path!r} grew past {MAX_BYTES} bytes while read; read is limited")
    return data.decode("utf-8", errors="replace")


@gate(dependencies=("root", "hidden", "timeout_s"))
async def read(
    path: str, root: Path, hidden: Sequence[str | Path] = (), timeout_s: float = 10.0
) -> str:
    """Read the text file at ``path`` (relative to the circle's data root)."""
    try:
        limiter = _limiter.get()
    except LookupError:
        limiter = trio.CapacityLimiter(THREADS)
        _limiter.set(limiter)
    with trio.move_on_after(timeout_s):
        return await trio.to_thread.run_sync(
            _read_file, root, path, hidden, limiter=limiter, abandon_on_cancel=True
        )
    raise GateError(f"read {path!r} took longer than {timeout_s:g} s; gave up")
