"""Pauses ``cantrip mcp`` holds between a 2026-07-28 client's requests, and their end.

At 2026-07-28 a client is reachable only between requests: a call that pauses answers
``InputRequiredResult`` and the client's retry carries the answer
(:mod:`cantrip.protocols.mcp_server._server`). Until the retry comes the server holds
the pause -- the session in memory, and for a pause that waits in place (a child's, a
question asked during a call) its running prompt. A client that never comes back would
hold them for ever, so a held pause lives ``ttl_s`` (``cantrip mcp --input-ttl``):
then its prompt is cut off (the loom records ``cancelled``, as for any cancel) and the
session let go of. A retry after that finds the pause no longer pending -- except one
that ended its cast: the loom holds that pause, and the retry resumes the session from
it (letting go only freed the memory).
"""

from __future__ import annotations

import contextlib
import time

import attrs
import trio

from cantrip._redact import get_logger
from cantrip.protocols.sessions import SessionBackend, SessionError

log = get_logger("cantrip.mcp.held")

INPUT_TTL_S = 3600.0
"""How long a pause is held for the client's next request by default (an hour, as a
task is kept)."""
LET_GO_S = 5.0
"""How long a cut-off prompt is given to end before its session is let go of."""


async def let_go(backend: SessionBackend, session_id: str, prompt_id: str) -> None:
    """Wait (a little) for a cut-off prompt to end, then let go of its session: its
    entity closes, the loom keeps what it recorded."""
    with trio.move_on_after(LET_GO_S), contextlib.suppress(SessionError):
        await backend.result(session_id, prompt_id)  # how it ended is the loom's to say
    await backend.release(session_id)


@attrs.define
class _Held:
    prompt_id: str
    until: float


class HeldPauses:
    """The sessions waiting for a client's next request, each until its deadline."""

    def __init__(self, ttl_s: float = INPUT_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._held: dict[str, _Held] = {}
        self._changed = trio.Event()

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, session_id: str, prompt_id: str) -> None:
        """The call answered ``InputRequiredResult``: hold the session for a retry."""
        self._held[session_id] = _Held(prompt_id, time.monotonic() + self.ttl_s)
        self._changed.set()

    def take(self, session_id: str) -> None:
        """A retry came for the session: it is no longer waiting to be let go of."""
        self._held.pop(session_id, None)

    async def expire(self, backend: SessionBackend) -> None:
        """Until cancelled: cut off and let go of each held session past its deadline."""
        while True:
            now = time.monotonic()
            due = [sid for sid, held in self._held.items() if held.until <= now]
            for session_id in due:
                held = self._held.pop(session_id)
                log.info("a pause held for %.0f s was not answered: letting go", self.ttl_s)
                with contextlib.suppress(SessionError):  # the session went meanwhile
                    await backend.cancel(session_id, prompt_id=held.prompt_id)
                    await let_go(backend, session_id, held.prompt_id)
            if due:
                continue
            soonest = min((held.until for held in self._held.values()), default=None)
            self._changed = trio.Event()
            wait_s = float("inf") if soonest is None else soonest - now
            with trio.move_on_after(wait_s):
                await self._changed.wait()
