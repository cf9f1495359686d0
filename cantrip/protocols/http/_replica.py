"""What the front ends of ``cantrip serve --db`` use of the replica that serves them.

A2A and AG-UI run on a replica (:class:`._db_http.DbHttpApp`) but stand apart from
its routes: they reach its
pieces -- database calls in threads behind the store's limiter, the enqueue with its
limits, the wait for a work item, the notifier, the drain -- through this one
protocol, so the replica module imports them and not the other way round.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from cantrip._cantrip import Cantrip
from cantrip.protocols.middleware._lifecycle import Drain, Tally
from cantrip.protocols.sessions._notify import Notifier
from cantrip.protocols.sessions._rows import DbSessions, Progress, SessionRow


class Replica(Protocol):
    """A ``serve --db`` replica, as its front ends see it."""

    spell: dict[str, Any]
    """The queued spell every prompt is enqueued with."""
    cantrip: Cantrip
    sessions: DbSessions
    notifier: Notifier
    drain: Drain
    tail_s: float
    _waits: Tally

    async def _db(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A blocking database call in a thread; its errors as the replica's answers."""

    async def _db_waiting(self, fn: Callable[..., Any], *args: Any) -> Any:
        """:meth:`_db` that waits out an unreachable database instead of a ``503``."""

    async def _enqueue(
        self,
        row: SessionRow,
        intent: str,
        key: str | None,
        on_busy: str = "reject",
        spell: dict[str, Any] | None = None,
        also: Callable[[Any, int], None] | None = None,
    ) -> int:
        """Queue a prompt (the replica's limits and ``on_busy``); its work id. ``also``:
        written in the prompt's transaction (``DbSessions.enqueue``)."""

    async def _wait(self, entity_id: str, work_id: int) -> Progress:
        """Until the work item ends."""
