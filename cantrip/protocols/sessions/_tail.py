"""Following an entity's turns in the PostgreSQL loom, for ``cantrip serve --db``.

A replica runs no entity: what a stream tells of a cast is the turns its worker
records, read back as they land. Every stream of the PostgreSQL backend (its
``follow``: the HTTP API's prompt stream and ``/events``, AG-UI's and A2A's) follows
them the same way, here:

* woken by the queue's notifications about the entity (:class:`._notify.Notifier`;
  the wake-up is taken *before* each look, so none is missed) and looking every
  ``tail_s`` regardless, in case one was;
* every read is a query through the caller's ``read`` (a thread behind the store's
  limiter; the turns are decoded there, never on the loop);
* following a work item, its turns are the entity's after the position its first
  claim recorded, up to its end -- or to the next cast's first turn (a turn with an
  intent after the first): a prompt queued behind it may begin before this look
  sees its end, and a replayed prompt's work ended long ago. That is where
  :func:`cantrip._outcome.recorded_cast` ends a cast, so a stream tells the turns
  its result counts.

It yields each :class:`~cantrip.loom._model.Turn`, and a :class:`Beat` after each
look, so a caller does its own between looks (pauses, heartbeats, its stop) without
a second loop. It is an async generator holding no cancel scope across a yield:
the caller's scope (a drain's, a hung-up client's) cancels the read or wait it is
in; use it under :func:`contextlib.aclosing`.

:func:`while_connected` runs such a follower for a client: until the work ends, the
client hangs up (then, if asked, the work is cancelled) or the replica shuts down.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, Protocol

import attrs
import trio

from cantrip.loom._model import Turn
from cantrip.protocols.sessions._notify import Notifier
from cantrip.protocols.sessions._rows import DbSessions, Progress


class Tailing(Protocol):
    """What following needs of a ``serve --db`` replica."""

    sessions: DbSessions
    notifier: Notifier
    tail_s: float


@attrs.frozen
class Beat:
    """The end of one look at the loom (the turns it found were yielded before it)."""

    progress: Progress | None
    """The work item's state at this look (None when following no work item)."""
    heard: bool
    """A notification (not the poll timer) woke this look."""
    landed: bool
    """Turns landed at this look."""
    last: bool = False
    """The work item ended (or the next cast began): nothing follows this beat."""


async def follow(
    replica: Tailing,
    entity_id: str,
    read: Callable[..., Awaitable[Any]],
    *,
    work_id: int | None = None,
    after: int | None = None,
    stop: Callable[[], bool] | None = None,
) -> AsyncGenerator[Turn | Beat, None]:
    """The entity's turns as they land, each look ending with a :class:`Beat`.

    With ``work_id``: the work item's turns (from its base position), until it ends;
    the last beat carries how it ended. Without: every turn after loop position
    ``after``, for as long as the caller iterates. ``stop`` is asked before each
    look: when it says so, the following ends (no last beat)."""
    sessions = replica.sessions
    seen = after
    first = True
    heard = False
    with replica.notifier.watching(entity_id) as next_event:
        while stop is None or not stop():
            woken = next_event()  # before the look: none is missed
            status: Progress | None = None
            if work_id is not None:
                status = await read(sessions.progress, work_id)
                if seen is None:
                    seen = status.base_pos
            landed: list[tuple[int, Turn]] = []
            if seen is not None:
                landed = await read(sessions.turns_after, entity_id, seen)
            for pos, turn in landed:
                if work_id is not None and turn.intent is not None and not first:
                    ended: Progress = await read(sessions.progress, work_id)  # the next cast
                    yield Beat(ended, heard, True, last=True)
                    return
                first, seen = False, pos
                yield turn
            done = status is not None and status.ended
            yield Beat(status, heard, bool(landed), last=done)
            if done:
                return
            with trio.move_on_after(replica.tail_s):
                await woken.wait()
            heard = woken.is_set()
