"""A gate call's checkpoint: what lets a crashed call be picked up, not run again.

The gate journal (:mod:`cantrip._journal`) records a call as started before the gate
runs; after a crash a started call of a gate that is not idempotent is answered
"outcome unknown" -- it may have taken effect, so it is never run a second time.
Some calls start work that outlives the process: an MCP server's task runs on in
the server, and its id is all a client needs to follow it to its end. Such a gate
saves what it needs (a small JSON object) as soon as it has it, and a resumed call
is given it back: it follows the work it already started instead of starting it
again or giving up on it.

The journal sets :data:`CURRENT` around each journaled call (in the calling task,
so the gate, which runs there, sees it); outside a journaled call it is None and a
gate simply has nothing to save to.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from typing import Any

import attrs

MAX_CHECKPOINT = 4096
"""Characters a checkpoint may take once encoded: a handle on work, not its data."""


@attrs.define
class CallCheckpoint:
    """One journaled gate call's checkpoint: what a crashed attempt saved, and how
    this attempt saves its own."""

    saved: Mapping[str, Any] | None
    """What the crashed attempt of this call saved (None: a first attempt)."""
    save: Callable[[Mapping[str, Any]], Awaitable[None]]
    """Write a checkpoint into the journal now. Written once, as a call's result is:
    the first checkpoint a call saves is the one a resumed call is given."""


CURRENT: ContextVar[CallCheckpoint | None] = ContextVar("cantrip_call_checkpoint", default=None)
