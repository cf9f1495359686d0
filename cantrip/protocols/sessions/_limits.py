"""How many sessions a server keeps in memory, and for how long (issue 20).

A session in memory is an entity object (and its sandbox); its turns are in
the loom either way. So a server can drop a session it has not heard about for
``idle_s`` seconds -- or the least recently used idle one, when a new session
would exceed ``max_sessions`` -- and lose nothing: the next request that names
it resumes the entity from its loom thread (:meth:`SessionHub.get`). Sessions
that are running a prompt or have an event subscriber are never dropped; when
every session is busy and the cap is reached, a new one is refused (503).

Eviction happens on requests (no background task): each request first drops
what has been idle too long, which costs O(live sessions) <= ``max_sessions``.
"""

from __future__ import annotations

import attrs
import trio

from cantrip._redact import get_logger
from cantrip.protocols.sessions._budgets import ServeBudgets
from cantrip.protocols.sessions._hub import Session, SessionError, SessionHub

log = get_logger("cantrip.sessions")


@attrs.frozen
class SessionLimits:
    max_sessions: int = attrs.field(default=256, validator=attrs.validators.ge(1))
    idle_s: float = attrs.field(default=900.0, validator=attrs.validators.gt(0))
    budgets: ServeBudgets = attrs.field(factory=ServeBudgets)
    """What each session, and all of them together, may spend (``serve --session-budget``,
    ``--token-budget``; cantrip.protocols.sessions._budgets)."""


def _evictable(session: Session) -> bool:
    return session.running is None and not session.watched


async def evict(hub: SessionHub, session: Session) -> None:
    """Drop a session from memory; its loom thread stays and resumes it later."""
    hub.sessions.pop(session.id, None)
    log.info("session %s evicted from memory (its loom thread stays)", session.id)
    with trio.CancelScope(shield=True):
        await session.entity.aclose()


async def make_room(hub: SessionHub, limits: SessionLimits, *, adding: bool) -> None:
    """Evict idle sessions; with ``adding``, make room for one more or refuse ("full")."""
    now = trio.current_time()
    for session in list(hub.sessions.values()):
        if now - session.last_used >= limits.idle_s and _evictable(session):
            await evict(hub, session)
    if not adding or len(hub.sessions) < limits.max_sessions:
        return
    idle = [s for s in hub.sessions.values() if _evictable(s)]
    if not idle:
        raise SessionError(
            "full", f"{limits.max_sessions} sessions are live and busy; try again later"
        )
    await evict(hub, min(idle, key=lambda s: s.last_used))
