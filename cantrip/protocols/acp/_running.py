"""A ``session/prompt`` being carried out: what a cancel of it reaches (its own module,
so the v1 server and the v2 draft's connection share it without importing each other)."""

from __future__ import annotations

import attrs
import trio


@attrs.define(eq=False)
class Running:
    """A ``session/prompt`` being carried out: what a cancel of it reaches."""

    session_id: str
    prompt_id: str | None = None
    """The prompt (or answer's continuation) the backend runs for it now."""
    asking: trio.CancelScope | None = None
    """Set while a question is asked of the client for it."""
    cancelled: bool = False
    """A ``$/cancel_request`` named it: it answers ``-32800``."""
