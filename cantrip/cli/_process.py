"""Process-wide settings cantrip's own commands apply, and the library never does.

A library must not change its host process behind the user's back: the
descriptor limit and the garbage collector belong to the program. ``cantrip``
the command *is* the program, so it sets them for what it runs -- many
entities at once, each with a connection of its own to its provider.
"""

from __future__ import annotations

import contextlib
import gc
import io
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

from cantrip._gc import THROUGHPUT_YOUNG_THRESHOLD, gc_for_throughput

OPEN_FILES_CAP = 65_536
"""The most descriptors the command asks for, however high the hard limit (some
systems' hard limit is unlimited or a million; nothing here needs that many)."""


def escape_unencodable_output() -> None:
    """Write what standard output cannot encode as its escape (``\\udfff``), not fail.

    A loom keeps text as it came, and a provider may answer with a lone surrogate
    (JSON allows ``"\\ud800"``); a UTF-8 standard output refuses to encode one, so a
    command printing it (``loom X list``, ``show``, ``cast``) ended in an internal
    error. The escape is visible and the rest of the output unchanged, as standard
    error already does by Python's default."""
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(errors="backslashreplace")


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


def command_gc(young: int | None) -> contextlib.AbstractContextManager[None]:
    """The collector setting the long-running commands run under (``--gc-young``):
    ``cantrip serve`` and ``cantrip worker``, each a process of its own running many
    entities at once.

    That is the case :func:`cantrip.gc_for_throughput` is for: with 200 sessions
    prompting at once, collections took ~0.3 s of each 1.9 s of server CPU per 1,000
    turns (bench/serve_load.py), ~0.08 s with it. And what the command holds from its
    start (imports, the spec) is frozen out of the collector's sight
    (:func:`settled_heap`): full collections scan only what the entities made.
    ``None`` is the default threshold; 0 keeps Python's thresholds and freezes
    nothing; a negative one is a ValueError (the user's mistake, one line). Nothing
    changes until the returned context is entered, and everything comes back when it
    ends."""
    if young is None:
        young = THROUGHPUT_YOUNG_THRESHOLD
    if young < 0:
        raise ValueError(f"--gc-young {young}: give 0 (Python's own) or a positive threshold")
    if not young:
        return contextlib.nullcontext()
    return _collecting(young)


@contextlib.contextmanager
def _collecting(young: int) -> Iterator[None]:
    with gc_for_throughput(young), settled_heap():
        yield


def debug_log(path: Path | None) -> None:
    """``--log FILE`` of the servers (``serve``, ``acp``, ``mcp``): every logger's debug
    records into FILE, so a protocol exchange can be read after the fact."""
    if path is not None:
        logging.basicConfig(
            filename=path,
            level=logging.DEBUG,
            format="%(asctime)s %(name)s %(levelname)s %(message)s",
        )
