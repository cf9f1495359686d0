"""``read``: read a text file below a root directory the circle fixes (CIRCLE-10).

The root is a dependency, bound at construction. Paths are resolved against it
and must stay inside it: ``..``, absolute paths elsewhere and symlinks that
lead out are refused with an error observation.
"""

from __future__ import annotations

from pathlib import Path

from cantrip import GateError, gate

MAX_BYTES = 1_000_000


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


@gate(dependencies=("root",))
def read(path: str, root: Path) -> str:
    """Read the text file at ``path`` (relative to the circle's data root)."""
    target = confine(root, path)
    if not target.exists():
        raise GateError(f"ENOENT: no such file or directory: {path!r}")
    if target.is_dir():
        raise GateError(f"EISDIR: {path!r} is a directory")
    size = target.stat().st_size
    if size > MAX_BYTES:
        raise GateError(f"{path!r} is {size} bytes; read is limited to {MAX_BYTES}")
    return target.read_text(encoding="utf-8", errors="replace")
