"""The enqueueing side: :class:`Dispatcher`, the client that queues casts for workers.

``cantrip cast --db``, ``cantrip answer --db`` and the Python API queue work and wait
for its outcome through it; it runs in the caller's process and blocks, so it shares
nothing with the worker but the queue and the outage bookkeeping.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from cantrip._approval import Decision, Pause, PauseError
from cantrip._redact import get_logger
from cantrip.distributed._outage import Outage, database_away
from cantrip.distributed._queue import WorkQueue
from cantrip.distributed._work import ENDED, WORK_CHANNEL
from cantrip.loom._model import new_entity_id
from cantrip.loom._postgres import PostgresStore

dispatch_log = get_logger("cantrip.dispatcher")
T = TypeVar("T")

UNCLAIMED_AFTER_S = 3.0
"""How long queued work may wait before ``cast --db`` says no worker has taken it."""


class Dispatcher:
    """Enqueue casts for the workers and wait for their outcomes (blocking calls:
    from trio, run them with ``trio.to_thread.run_sync``).

    A lost database connection (a restart, a failover) is waited out: every call
    retries with backoff, logging once when the database goes away and once when it is
    back (``cantrip.dispatcher``), and goes on."""

    def __init__(self, url: str) -> None:
        self.store = PostgresStore(url, max_connections=2)
        self.queue = WorkQueue(self.store)

    def _retrying(self, what: str, call: Callable[[bool], T], deadline: float | None = None) -> T:
        """``call(retry)`` until it does not fail on a lost connection (``retry``: an
        earlier try failed, maybe after its statement committed)."""
        outage = Outage(f"dispatcher {what}", dispatch_log)
        retry = False
        while True:
            with database_away() as away:
                result = call(retry)
            if away.exc is not None:
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"{what}: the database is unreachable") from None
                delay = outage.failed(away.exc)
                with contextlib.suppress(Exception):  # drop the pool's broken connections
                    self.store.pool.check()
                time.sleep(delay)
                retry = True
                continue
            outage.ok()
            return result

    def submit(
        self, spell: Mapping[str, Any], intent: str, *, entity_id: str | None = None
    ) -> tuple[int, str]:
        """Queue ``intent`` on a new entity (or ``entity_id``); (work id, entity id).

        A try whose connection broke may have committed: the retry first looks for the
        work it queued (the entity's open work with this intent) and queues it only if
        it is not there."""
        from cantrip._text import require_intent

        require_intent(intent)
        entity_id = entity_id or new_entity_id()

        def enqueue(retry: bool) -> int:
            if retry:
                queued = self.queue.open_work(entity_id, intent)
                if queued is not None:
                    return queued
            return self.queue.enqueue(dict(spell), intent, entity_id)

        return self._retrying("submit", enqueue), entity_id

    def submit_many(
        self, spell: Mapping[str, Any], intents: Sequence[str]
    ) -> list[tuple[int, str]]:
        """Queue each of ``intents`` on a new entity of its own, all in one statement and
        one commit (issue 46.1); (work id, entity id) per intent, in order.

        Every intent is checked before anything is written. The batch commits whole or
        not at all, so a retry after a lost connection finds all of it queued (its
        entities are new: only this batch can have queued work on them) or none."""
        from cantrip._text import require_intent

        for intent in intents:
            require_intent(intent)
        work = [(new_entity_id(), intent) for intent in intents]
        entities = [entity for entity, _ in work]

        def enqueue(retry: bool) -> dict[str, int]:
            if retry:
                queued = self.queue.work_of(entities)
                if queued:
                    return queued
            return self.queue.enqueue_many(dict(spell), work)

        ids = self._retrying("submit", enqueue) if work else {}
        return [(ids[entity], entity) for entity in entities]

    def wait(
        self,
        work_id: int,
        *,
        timeout: float | None = None,
        on_unclaimed: Callable[[float], None] | None = None,
        unclaimed_after: float = UNCLAIMED_AFTER_S,
    ) -> tuple[str, dict[str, Any]]:
        """Block until the work ends (LISTEN, with polling as the fallback): done,
        failed, cancelled, ``dead`` (dead-lettered), or ``paused`` -- its outcome's
        ``pending`` lists the calls that wait for a human (:meth:`answer` them).
        ``on_unclaimed`` is called once (with the seconds waited) if no worker has taken
        the work after ``unclaimed_after`` seconds: an idle worker takes new work within
        a moment, so most likely none is running."""
        import psycopg

        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        conn: psycopg.Connection[Any] | None = None

        def look(_retry: bool) -> tuple[str, dict[str, Any] | None, psycopg.Connection[Any]]:
            nonlocal conn
            if conn is None:
                conn = psycopg.connect(self.store.url, autocommit=True, connect_timeout=5)
                conn.execute(f"LISTEN {WORK_CHANNEL}")
            try:
                return (*self.queue.status(work_id), conn)
            except Exception:
                bad, conn = conn, None
                bad.close()
                raise

        try:
            while True:
                state, outcome, listening = self._retrying("wait", look, deadline)
                if outcome is not None or state in ENDED:
                    return state, outcome or {}
                waited = time.monotonic() - started
                if on_unclaimed is not None and state == "queued" and waited > unclaimed_after:
                    on_unclaimed(waited)
                    on_unclaimed = None
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"work {work_id} still {state} after {timeout} s")
                try:
                    for _ in listening.notifies(timeout=0.5, stop_after=1):
                        pass
                except psycopg.OperationalError:  # heard by the next look, which reconnects
                    listening.close()
                    conn = None
        finally:
            if conn is not None:
                conn.close()

    def cancel(self, entity_id: str) -> int:
        return self._retrying("cancel", lambda _retry: self.queue.cancel(entity_id))

    def dead_letters(self) -> list[dict[str, Any]]:
        """The work items no worker could finish within the attempt limit (state
        ``dead``): id, entity, intent, attempts, crashes, why, when."""
        return self._retrying("dead letters", lambda _retry: self.queue.dead_letters())

    def pending(self, entity_id: str) -> list[Pause]:
        """The calls ``entity_id`` waits on a human for: its work ended ``paused`` and
        nobody has answered yet (empty otherwise)."""
        pending = self._retrying("pending", lambda _retry: self.queue.pending(entity_id))
        return [Pause.from_dict(p) for p in pending]

    def answer(self, entity_id: str, pause_id: str, decision: Decision | Mapping[str, Any]) -> int:
        """Answer a pause of a paused entity, from any process; the id of the work that
        carries the answer out (a worker resumes the entity from the loom and continues
        the cast to its end or its next pause -- :meth:`wait` for it). A pause that is
        not waiting (unknown, or answered already -- by anyone, even at the same moment)
        raises :class:`~cantrip.PauseError`; exactly one of two answers wins. A try whose
        connection broke after its answer committed is found again by the retry."""
        parsed = Decision.parse(decision).to_dict()

        def answer(retry: bool) -> int:
            try:
                return self.queue.answer(entity_id, pause_id, parsed).work_id
            except PauseError:
                mine = self.queue.answered_by(entity_id, pause_id, parsed) if retry else None
                if mine is None:
                    raise
                return mine

        return self._retrying("answer", answer)

    def close(self) -> None:
        self.store.close()
