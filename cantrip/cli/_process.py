"""Process-wide settings cantrip's own commands apply, and the library never does.

A library must not change its host process behind the user's back: the
descriptor limit and the garbage collector belong to the program. ``cantrip``
the command *is* the program, so it sets them for what it runs -- many
entities at once, each with a connection of its own to its provider.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

OPEN_FILES_CAP = 65_536
"""The most descriptors the command asks for, however high the hard limit (some
systems' hard limit is unlimited or a million; nothing here needs that many)."""


def raise_open_files_limit(cap: int = OPEN_FILES_CAP) -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (at most ``cap``); the soft
    limit in force after.

    The soft limit is often 1,024 while the hard one is far higher; an adapter
    opens up to a quarter of the soft limit in connections
    (:func:`cantrip.llm.providers._clients.default_connections`), so a
    command raising it serves more entities at once without making them wait
    for a connection. Lowering is never done; a refusal (a platform's own
    ceiling below the hard limit) leaves the limit as it was."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = cap if hard == resource.RLIM_INFINITY else min(hard, cap)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return soft
        return target
    return soft


@contextlib.contextmanager
def settled_heap() -> Iterator[None]:
    """While the block runs, the objects alive at its start are out of the collector's sight.

    ``gc.freeze()``: a full collection no longer rescans the ~60,000 objects a
    started command holds and never frees (imports, the loaded spec), only what
    its entities made since; ``gc.unfreeze()`` when the block ends. Entered
    once the command has loaded what it runs, around running it."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
