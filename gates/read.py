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
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from cantrip import GateError, gate

MAX_BYTES = 1_000_000
_DATABASE_MAGIC = (b"SQLite format 3\x00", b"\x37\x7f\x06\x82", b"\x37\x7f\x06\x83")
"""The first bytes of an SQLite database, and of its write-ahead log (either byte order)."""


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


@gate(dependencies=("root", "hidden"))
def read(path: str, root: Path, hidden: Sequence[str | Path] = ()) -> str:
    """Read the text file at ``path`` (relative to the circle's data root)."""
    target = confine(root, path)
    if not target.exists() or is_hidden(target, root, hidden):
        raise GateError(f"ENOENT: no such file or directory: {path!r}")
    if target.is_dir():
        raise GateError(f"EISDIR: {path!r} is a directory")
    with target.open("rb") as head:
        if head.read(16).startswith(_DATABASE_MAGIC):
            raise GateError(f"{path!r} is a database, not a text file; read does not open it")
    size = target.stat().st_size
    if size > MAX_BYTES:
        raise GateError(f"{path!r} is {size} bytes; read is limited to {MAX_BYTES}")
    return target.read_text(encoding="utf-8", errors="replace")
