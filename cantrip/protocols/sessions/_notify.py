"""How a ``cantrip serve --db`` replica hears that work ended, without a thread per waiter.

One LISTEN connection per replica (``LISTEN cantrip_work; LISTEN
cantrip_cancel``): a worker that finishes an entity's work and a cancel of
queued work both NOTIFY with the entity id. :class:`Notifier` turns each
notification into a ``trio.Event`` set for the tasks watching that entity; the
tasks re-check the database themselves (notifications are a wake-up, never the
answer), and poll as the fallback. The connection is opened again if it is
lost, and every watcher is woken then, since notifications sent meanwhile are
gone. Its one blocking call at a time runs in ``trio.to_thread`` behind a
``CapacityLimiter(1)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import trio

from cantrip._redact import get_logger
from cantrip.distributed._outage import Outage
from cantrip.distributed._work import CANCEL_CHANNEL, WORK_CHANNEL, parse_cancel

log = get_logger("cantrip.http")

LISTENER_NAME = "cantrip serve --db"
"""The ``application_name`` of a replica's LISTEN connection (seen in ``pg_stat_activity``)."""


class Notifier:
    """One LISTEN connection per replica: wakes the tasks waiting on an entity."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._events: dict[str, trio.Event] = {}
        self._watchers: dict[str, int] = {}
        self.heard = 0

    @contextmanager
    def watching(self, entity_id: str) -> Iterator[Callable[[], trio.Event]]:
        """While a task waits on ``entity_id``: ``next_event()`` is set at the next
        notification about it (take it *before* checking the database, so none is
        missed). Nothing is kept once no task watches the entity."""
        self._watchers[entity_id] = self._watchers.get(entity_id, 0) + 1

        def next_event() -> trio.Event:
            event = self._events.get(entity_id)
            if event is None:
                event = self._events[entity_id] = trio.Event()
            return event

        try:
            yield next_event
        finally:
            self._watchers[entity_id] -= 1
            if not self._watchers[entity_id]:
                del self._watchers[entity_id]
                self._events.pop(entity_id, None)

    def _wake(self, entity_id: str) -> None:
        event = self._events.pop(entity_id, None)
        if event is not None:
            event.set()

    def _wake_all(self) -> None:
        events, self._events = self._events, {}
        for event in events.values():
            event.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled. A connection lost later is opened again (the
        waiters poll meanwhile); one that cannot be opened at start-up is an error."""
        import psycopg

        started = False

        def listening() -> None:
            nonlocal started
            if not started:
                started = True
                task_status.started()
            else:  # notifications sent while we were away are lost: look again
                self._wake_all()

        outage = Outage("serve --db LISTEN", log)
        while True:
            try:
                await self._listen(psycopg, listening, outage)
            except psycopg.OperationalError as exc:  # the database went away: the boundary
                if not started:
                    raise
                self._wake_all()  # let every waiter look for itself
                await trio.sleep(outage.failed(exc))

    async def _listen(self, psycopg: Any, listening: Callable[[], None], outage: Outage) -> None:
        """Wake the waiters an entity's notification concerns, until the connection fails."""
        conn = await trio.to_thread.run_sync(
            lambda: psycopg.connect(self.url, autocommit=True, application_name=LISTENER_NAME)
        )
        limiter = trio.CapacityLimiter(1)
        try:
            await trio.to_thread.run_sync(
                lambda: conn.execute(f"LISTEN {WORK_CHANNEL}; LISTEN {CANCEL_CHANNEL}"),
                limiter=limiter,
            )
            listening()
            outage.ok()
            while True:
                notes = await trio.to_thread.run_sync(
                    lambda: [
                        parse_cancel(n.payload)[0] if n.channel == CANCEL_CHANNEL else n.payload
                        for n in conn.notifies(timeout=0.25, stop_after=1)
                    ],
                    limiter=limiter,
                )
                self.heard += len(notes)
                for entity_id in notes:
                    self._wake(entity_id)
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(conn.close)
