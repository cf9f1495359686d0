"""What ``serve --db``'s AG-UI and A2A (today's :mod:`cantrip.protocols.agui._db`,
:mod:`cantrip.protocols.a2a._db`) use of the replica that serves them, until they are
written over the seam themselves (issue 41, steps 3 and 4).

They stand apart from the HTTP routes and reach the replica's pieces through one
protocol, :class:`Replica`: database calls in threads (the PostgreSQL backend's, their
failures as the API's answers), the enqueue with the server's admission, the wait for a
work item, the notifier, the drain. :class:`ReplicaView` is that protocol over a
:class:`~cantrip.protocols.sessions.PostgresBackend` and the one
:class:`~cantrip.protocols.http._app.HttpApp`; nothing of it is asked by the routes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from cantrip._cantrip import Cantrip
from cantrip.protocols.middleware._lifecycle import Drain, Tally
from cantrip.protocols.sessions._hub import SessionError
from cantrip.protocols.sessions._notify import Notifier
from cantrip.protocols.sessions._rows import DbSessions, Progress, SessionRow

if TYPE_CHECKING:
    from cantrip.protocols.http._app import HttpApp
    from cantrip.protocols.sessions import PostgresBackend

DATABASE_KINDS = ("database_unavailable", "database_error", "bad_request")
"""The refusals of the database itself (the backend's boundary), answered as the API's
errors; any other :class:`SessionError` of a call goes up as it is."""


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
        """Queue a prompt (the server's admission and ``on_busy``); its work id.
        ``also``: written in the prompt's transaction (``DbSessions.enqueue``)."""

    async def _wait(self, entity_id: str, work_id: int) -> Progress:
        """Until the work item ends."""


class ReplicaView:
    """:class:`Replica` over the PostgreSQL backend and the app serving it."""

    def __init__(self, backend: PostgresBackend, app: HttpApp) -> None:
        self.backend = backend
        self.app = app
        self.spell = backend.spell
        self.cantrip = app.cantrip
        self.sessions = backend.db
        self.notifier = backend.notifier
        self.drain = app.drain
        self.tail_s = backend.tail_s
        self._waits = app.admission.open

    async def _db(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return await self.backend._db(fn, *args)
        except SessionError as exc:
            if exc.kind in DATABASE_KINDS:
                raise self.app.refusal(exc) from None
            raise

    async def _db_waiting(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return await self.backend._db_waiting(fn, *args)
        except SessionError as exc:
            if exc.kind in DATABASE_KINDS:
                raise self.app.refusal(exc) from None
            raise

    async def _enqueue(
        self,
        row: SessionRow,
        intent: str,
        key: str | None,
        on_busy: str = "reject",
        spell: dict[str, Any] | None = None,
        also: Callable[[Any, int], None] | None = None,
    ) -> int:
        try:
            self.app.admission.check()
            queued = await self._db(
                self.sessions.enqueue, row.entity_id, spell or self.spell, intent, key, on_busy,
                also,
            )  # fmt: skip
        except SessionError as exc:
            raise self.app.refusal(exc) from None
        return int(queued.work_id)

    async def _wait(self, entity_id: str, work_id: int) -> Progress:
        ended: list[Progress] = []
        with self.drain.stream():
            ended.append(await self.backend._ended(entity_id, work_id))
        if ended:
            return ended[0]
        raise self.app.unavailable(
            "shutting_down",
            "this replica is shutting down; the cast goes on at its worker: send the "
            "request again (with the same Idempotency-Key) to get its result",
        )
