"""Following a session from inside the server: a front end's follow that is never let go.

A session lets a follower that falls :data:`~._positions.WATCHER_BUFFER` events behind
go (``dropped``), so a slow remote client never holds up the cast; the client reconnects
with the last id it had. A protocol front end (an AG-UI run, an ACP connection, an A2A
task, an MCP call) is the session's client inside this process, and its own client
cannot reconnect to the session for it: a model that streams faster than the loop
thread gets round to the front end (the scripted model streams a long answer without a
pause; a slow editor holds an ACP connection) had its follower dropped, and the front
end went on to the prompt's end with the rest of the stream silently missing.
:func:`follow_through` follows again from the last event it was given -- the session
still holds it -- so the front end tells every event once, in order; past what the
session holds the follow says ``reset`` as ever. One implementation for every front end.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import Any

from cantrip.protocols.sessions._backend import (
    EventId,
    SessionBackend,
    SessionEvent,
    SessionRef,
    session_id_of,
)
from cantrip.protocols.sessions._positions import parse_event_id


async def follow_through(
    backend: SessionBackend, session: SessionRef, after: int | EventId = 0, **options: Any
) -> AsyncGenerator[SessionEvent, None]:
    """``backend.follow(session, after, **options)``, followed again from where a
    ``dropped`` left it (never yielded) until the follow ends. ``session``: the front
    end's look of this request (:data:`~._backend.SessionRef`) for the first follow; a
    follow again names the session by id (that look may be older than where it
    rejoins)."""
    since = after
    named: SessionRef = session
    while True:
        rejoin: EventId | int | None = None
        events = backend.follow(named, since, **options)
        async with contextlib.aclosing(events):
            async for event in events:
                if event.type == "dropped":
                    rejoin = parse_event_id(str(event.data["last_event_id"]))
                    break
                yield event
        if rejoin is None:
            return
        since, named = rejoin, session_id_of(session)
