"""The PostgreSQL session backend: an adapter over ``serve --db``'s session code
(casts run by ``cantrip worker`` processes, any number of replicas).

Every rule is :class:`~cantrip.protocols.sessions._rows.DbSessions`' (sessions, the
queue's busy policies, keys, cancels, steering, answers, outcomes), following a
session is :func:`~cantrip.protocols.sessions._tail.follow`'s, waking is the
:class:`~cantrip.protocols.sessions._notify.Notifier`'s LISTEN connection. This module adds
the seam's shape only: blocking calls in threads behind the store's limiter, a prompt
id for each work item, events with positions. Prompts arriving together are queued
together, one commit per batch (:class:`~cantrip.protocols.sessions._admit.PromptCommits`),
and the waiters' looks at their work share reads
(:class:`~cantrip.protocols.sessions._looks.ProgressLooks`). A prompt's calls take the
session as the front end's ``find`` read it (:data:`~._backend.SessionRef`): a request
reads its session once (issue 46).

The database's failures are this backend's boundary (drift 12): a lost connection is a
:class:`SessionError` ``database_unavailable`` (said once in the log, and once again when
a call succeeds), input PostgreSQL cannot hold ``bad_request``, any other database error
``database_error`` -- a front end maps kinds to its statuses, never a psycopg error.
Waiting on a prompt (:meth:`PostgresBackend.result`, a prompt's :meth:`follow`) waits a
lost database out instead: the cast goes on at its worker once it is back.

Not here: the A2A task methods (:mod:`._postgres_tasks`, a base class); the replica's
wait count, ``max_running`` and drain -- the server's lifecycle
(:mod:`cantrip.protocols.middleware._lifecycle`), the same for both modes.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import attrs
import trio

from cantrip._approval import Decision, Pause, PauseError
from cantrip._client_gates import CLIENT_TOOLS_KEY, client_gates
from cantrip._errors import ConstructionError
from cantrip._events import PauseEvent
from cantrip._redact import get_logger
from cantrip.distributed._outage import Outage, is_connection_error
from cantrip.distributed._work import DEAD, PAUSED
from cantrip.loom._loom import Loom
from cantrip.loom._model import Turn
from cantrip.loom._postgres import PostgresStore
from cantrip.loom._postgres_retention import BUSY
from cantrip.loom._retention import prune, retention_of
from cantrip.protocols.sessions._admit import (
    DB_UNAVAILABLE,
    MAX_PROMPTS_PER_COMMIT,
    PromptCommits,
    refusal,
    unavailable,
)
from cantrip.protocols.sessions._backend import (
    BusyPolicy,
    Cancelled,
    Capabilities,
    Health,
    PromptOutcome,
    SessionError,
    SessionEvent,
    SessionInfo,
    SessionRef,
    SessionSummary,
    Submitted,
    check_cwd,
    check_user,
    entity_id_for,
    session_id_for,
    session_id_of,
)
from cantrip.protocols.sessions._enqueue import PromptRequest, prompt_id_for, work_id_for
from cantrip.protocols.sessions._looks import ProgressLooks
from cantrip.protocols.sessions._notify import Notifier
from cantrip.protocols.sessions._positions import START, EventId, TurnIds, check_reachable
from cantrip.protocols.sessions._postgres_tasks import PostgresTasks
from cantrip.protocols.sessions._rows import (
    POS_OF,
    DbSessions,
    Progress,
    SessionRow,
    failure_message,
)
from cantrip.protocols.sessions._shapes import event_dict
from cantrip.protocols.sessions._summaries import summaries_on
from cantrip.protocols.sessions._tail import Beat, follow
from cantrip.protocols.sessions._task_rows import TaskRows
from cantrip.protocols.sessions._watches import WatchRows

T = TypeVar("T")

log = get_logger("cantrip.sessions")

CAPABILITIES = Capabilities(
    mode="db",
    token_events=False,
    a2a_push=False,
    viewer_fork=False,
    durable_prompt_ids=True,
    shared=True,
)
"""What this backend offers (the docs' table of modes is generated from it)."""


class PostgresBackend(PostgresTasks):
    """:class:`~cantrip.protocols.sessions.SessionBackend` over ``serve --db``'s tables."""

    def __init__(
        self,
        sessions: DbSessions,
        notifier: Notifier,
        spell: Mapping[str, Any],
        *,
        poll_s: float = 2.0,
        tail_s: float = 0.25,
        humans: bool = True,
        max_batch: int = MAX_PROMPTS_PER_COMMIT,
    ) -> None:
        self.db = sessions
        self.notifier = notifier
        self.spell = dict(spell)
        """The queued spell every prompt is enqueued with."""
        self.poll_s = poll_s
        self.tail_s = tail_s
        self.humans = humans
        """Whether the served circle may pause for a human (if not, a stream asks the
        database for pauses only when told of one: a client's tool, AG-UI's)."""
        self.waiting = 0
        """Prompts this backend is waiting on, for a result or a prompt's stream
        (``health``)."""
        self._outage = Outage("serve --db", log)
        self._task_rows: TaskRows | None = None
        self.loom = Loom(sessions.store, journal=True)
        """The loom the workers record in (every read a query: always fresh)."""
        self.prompts = PromptCommits(sessions, self._db, max_batch=max_batch)
        """The prompts on their way to the queue: one commit per batch (issue 46.1)."""
        self.looks = ProgressLooks(sessions, self._db)
        """The waiters' looks at their prompts' work: one read per batch (issue 46)."""
        self.watches = WatchRows(sessions.store, self._db, work_id_for)
        """Runs following prompts for their clients, at every replica (a table)."""

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        url: str,
        spell: Mapping[str, Any],
        *,
        sticky_cancel_s: float = 5.0,
        max_connections: int = 8,
        **options: Any,
    ) -> AsyncIterator[PostgresBackend]:
        """The backend on the database at ``url`` (its tables made if missing) while the
        block runs, with its LISTEN connection."""
        store = await trio.to_thread.run_sync(
            lambda: PostgresStore(url, max_connections=max_connections)
        )
        try:
            sessions = await trio.to_thread.run_sync(
                lambda: DbSessions(store, sticky_cancel_s=sticky_cancel_s)
            )
            notifier = Notifier(url)
            async with trio.open_nursery() as nursery:
                await nursery.start(notifier.run)
                yield cls(sessions, notifier, spell, **options)
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(store.close)

    @property
    def capabilities(self) -> Capabilities:
        return CAPABILITIES

    async def _db(self, fn: Callable[..., T], *args: Any) -> T:
        """A blocking database call in a thread, behind the store's limiter; its
        failure as a :class:`SessionError` (see the module docstring).

        The boundary of the database (issue 28.5, 29.2): a lost connection is said once
        in the log (and once again when a call succeeds) and the pool's broken
        connections are dropped; input PostgreSQL cannot hold (``DataError``) and any
        other database error are logged once (:func:`~._admit.refusal`)."""
        limiter = self.db.store.limiter
        try:
            result = await trio.to_thread.run_sync(fn, *args, limiter=limiter)
        except Exception as exc:
            refused = refusal(exc)
            if refused is not None:
                raise refused from None
            if not is_connection_error(exc):
                raise
            self._outage.failed(exc)
            with contextlib.suppress(Exception):  # drop the pool's broken connections
                await trio.to_thread.run_sync(self.db.store.pool.check, limiter=limiter)
            raise unavailable() from None
        self._outage.ok()
        return result

    async def _db_waiting(self, fn: Callable[..., T], *args: Any) -> T:
        """:meth:`_db` for a caller waiting on a cast: while the database is away it
        keeps trying every ``poll_s`` (the cast goes on once it is back)."""
        return await self._waiting_out(lambda: self._db(fn, *args))

    async def _waiting_out(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``, tried again every ``poll_s`` while the database is away."""
        while True:
            try:
                return await call()
            except SessionError as exc:
                if exc.kind != DB_UNAVAILABLE:
                    raise
            await trio.sleep(self.poll_s)

    # -- sessions ----------------------------------------------------------------

    async def _row(self, session: SessionRef) -> SessionRow:
        """The session's row: read (``not_found``), or as the caller's ``find`` read it in
        this request (a :class:`SessionInfo`: no second read)."""
        if isinstance(session, str):
            return await self._db(self.db.require, session)
        return SessionRow(
            session.session_id,
            session.entity_id,
            session.running,
            session.turns,
            session.user,
            session.cwd,
        )

    async def create(
        self, key: str | None = None, *, user: str | None = None, cwd: str | None = None
    ) -> tuple[SessionInfo, bool]:
        row, created = await self._db(self.db.create, key, check_user(user), check_cwd(cwd))
        return _info(row), created

    async def sessions(self) -> list[SessionInfo]:
        return [_info(r) for r in await self._db(self.db.all)]

    async def find(self, session_id: str) -> SessionInfo:
        return _info(await self._row(session_id))

    async def summaries(self) -> list[SessionSummary]:
        return await self._db(summaries_on, self.db.store)

    async def thread(self, session: SessionRef) -> list[Turn]:
        row = await self._row(session)
        return await self._db(self.db.thread, row.entity_id)

    async def read_loom(self, read: Callable[[Loom], T]) -> T:
        return await self._db(read, self.loom)

    async def release(self, session_id: str) -> None:
        return None  # a replica holds no session in memory: the database does

    async def delete(self, session_id: str) -> None:
        """The session's tree by the retention rule (:func:`prune`, whose deleting
        transaction checks again, under lock, that no work of it is open); a session
        nobody prompted has no entity yet: its row goes by the same store's delete."""
        row = await self._row(session_id)
        if row.running:
            raise SessionError("busy", f"session {session_id} is running a prompt")
        kept = await self._db(self._delete, row.entity_id)
        if kept is not None:
            kind = "busy" if kept in BUSY else "cannot_delete"
            raise SessionError(kind, f"session {session_id} stays: {kept}")

    def _delete(self, entity_id: str) -> str | None:
        """Delete the tree (blocking); why it stays, or None once it is gone."""
        if not self.loom.has_entity(entity_id):
            late = retention_of(self.loom).delete_entities([entity_id], busy_s=0.0).late
            return next(iter(late.values()), None)
        pruned = prune(self.loom, entity=entity_id, busy_s=0.0, reclaim=False)
        self.loom.forget(pruned.plan.entities)
        if entity_id in pruned.plan.entities:
            return None
        return dict(pruned.plan.kept).get(entity_id, "the retention rule keeps it")

    async def fork(self, turn_id: str) -> SessionInfo:
        raise SessionError(
            "unsupported",
            "forking a session is not offered on PostgreSQL (capabilities.viewer_fork): "
            "a forked entity would run in this process, not in the workers",
        )

    # -- prompts -----------------------------------------------------------------

    async def submit(
        self,
        session: SessionRef,
        intent: str,
        *,
        key: str | None = None,
        on_busy: BusyPolicy = "reject",
        tools: Sequence[Mapping[str, Any]] = (),
    ) -> Submitted:
        """The session is not read here: its batch checks it (``not_found``) and reads
        its user under its entity's lock, in the transaction that queues the prompt
        (:mod:`._enqueue`) -- one read for the whole batch."""
        spell = self.spell
        if tools:  # the worker offers them (and to an answer's continuation of this work)
            try:
                client_gates(tools)  # refused here, not by the worker
            except ConstructionError as exc:
                if isinstance(session, str):  # an unknown session is not_found first
                    await self._row(session)
                raise SessionError("bad_tools", str(exc)) from None
            spell = {**spell, CLIENT_TOOLS_KEY: [dict(t) for t in tools]}
        named = session_id_of(session)
        entity_id = entity_id_for(named)
        queued = await self.prompts.enqueue(
            PromptRequest(entity_id, spell, intent, key, on_busy, session=named)
        )
        return Submitted(queued.prompt_id, session_id_for(entity_id), replayed=queued.replayed)

    async def _work_of(self, row: SessionRow, prompt_id: str) -> int:
        """The work item ``prompt_id`` names, if it is one of the session's."""
        work_id = work_id_for(prompt_id)
        owner = None if work_id is None else await self._db(self._owner, work_id)
        if work_id is None or owner != row.entity_id:
            raise SessionError("not_found", f"no prompt {prompt_id!r} of session {row.session_id}")
        return work_id

    def _owner(self, work_id: int) -> str | None:
        with self.db.store.pool.connection() as conn:
            found = conn.execute(
                "SELECT entity_id FROM cantrip_work WHERE id = %s", (work_id,)
            ).fetchone()
        return None if found is None else str(found[0])

    async def _ended(self, row: SessionRow, prompt_id: str) -> tuple[int, Progress]:
        """Until the prompt's work ends: woken by NOTIFY, checking every ``poll_s``
        regardless. Its first look says too whether the prompt is the session's
        (``not_found`` if not): no read of its own for that."""
        work_id = work_id_for(prompt_id)
        with self.notifier.watching(row.entity_id) as next_event:
            while True:
                woken = next_event()  # before the check: none is missed
                progress = None
                if work_id is not None:  # with the other waiters' looks (:mod:`._looks`)
                    progress = await self._waiting_out(lambda: self.looks.progress(work_id))
                if work_id is None or progress is None or progress.entity_id != row.entity_id:
                    raise SessionError(
                        "not_found", f"no prompt {prompt_id!r} of session {row.session_id}"
                    )
                if progress.ended:
                    return work_id, progress
                with trio.move_on_after(self.poll_s):
                    await woken.wait()

    async def result(self, session: SessionRef, prompt_id: str) -> PromptOutcome:
        row = await self._row(session)
        self.waiting += 1
        try:
            work_id, ended = await self._ended(row, prompt_id)
        finally:
            self.waiting -= 1
        if ended.state == "failed":
            raise SessionError("cast_failed", failure_message(ended.outcome))
        if ended.state == DEAD:  # no worker could finish it within the attempt limit
            raise SessionError("cast_dead_lettered", failure_message(ended.outcome))
        cast, undelivered = await self._db_waiting(
            self.db.outcome, row.entity_id, work_id, ended.base_pos
        )
        return PromptOutcome(prompt_id, cast, tuple(undelivered))

    async def steer(self, session_id: str, text: str) -> None:
        row = await self._row(session_id)
        await self._db(self.db.steer, row.entity_id, text)

    async def cancel(
        self,
        session_id: str,
        *,
        prompt_id: str | None = None,
        key: str | None = None,
        next_prompt: bool = False,
    ) -> Cancelled:
        row = await self._row(session_id)
        answer = await self._db(self.db.cancel, row.entity_id, prompt_id, key, next_prompt)
        return Cancelled.from_dict(answer)

    # -- pauses ------------------------------------------------------------------

    async def pauses(self, session: SessionRef) -> list[Pause]:
        row = await self._row(session)
        return [Pause.from_dict(p) for p in await self._db(self.db.pending, row.entity_id)]

    async def answer(
        self, session_id: str, pause_id: str, decision: Decision, *, repeat: bool = False
    ) -> Submitted | None:
        row = await self._row(session_id)
        try:
            queued = await self._db(self.db.answer, row.entity_id, pause_id, decision.to_dict())
        except PauseError:
            found = None
            if repeat:  # this very answer, sent again: the work it queued
                found = await self._db(
                    self.db.answered, row.entity_id, pause_id, decision.to_dict()
                )
            if found is None:
                raise
            return Submitted(prompt_id_for(found), row.session_id, replayed=True)
        if queued.replayed:  # a running prompt waited on it in place: that prompt answers
            return None
        return Submitted(prompt_id_for(queued.work_id), row.session_id)

    # -- events ------------------------------------------------------------------

    async def follow(
        self,
        session: SessionRef,
        after: int | EventId = 0,
        *,
        until: str | None = None,
        prompt_id: str | None = None,
    ) -> AsyncGenerator[SessionEvent, None]:
        row = await self._row(session)
        if prompt_id is not None:
            own_work = await self._work_of(row, prompt_id)
            resume = after if isinstance(after, EventId) else None
            self.waiting += 1  # a prompt's stream waits on it as a result does
            try:
                async with contextlib.aclosing(self._follow_work(row, own_work, resume)) as own:
                    async for said in own:
                        yield said
            finally:
                self.waiting -= 1
            return
        work_id = None if until is None else await self._work_of(row, until)
        # with ``until``: once its work has ended, one more look reads the last turns
        # it recorded, and that look's beat ends the following
        ending = False
        if not isinstance(session, str) and _turn_of(after) > row.turns:
            # the caller's look is older than the place asked for (a follow again
            # from further on): the session as it is now says whether it is reachable
            row = await self._row(session.session_id)
        check_reachable(after, row.turns)  # (read with the row: not again)
        # the turn named is read again: its events' ids go on from it
        before = max(_turn_of(after) - 1, 0)
        pos = await self._db(self._pos_of, row.entity_id, before)
        ids = TurnIds(before)
        keep = _after(after)
        told: set[str] = set()
        turns = follow(
            _Tail(self.db, self.notifier, self.tail_s), row.entity_id, self._db, after=pos
        )
        first = True
        async with contextlib.aclosing(turns):
            async for item in turns:
                if isinstance(item, Turn):
                    for event in ids.told(item):
                        if keep(event):
                            yield event
                    continue
                # a NOTIFY (work ended, or a pause published) may bring a pause even
                # where no gate asks a human (a client's tool); turns bring one only
                # where one may; the first look tells the present turn's
                if first or item.heard or (self.humans and item.landed):
                    found = await self._db(self.db.pending, row.entity_id)  # (no row again)
                    pending = [Pause.from_dict(p).to_dict() for p in found]
                    for event in _pause_events(ids, row.entity_id, pending, told):
                        if keep(event):
                            yield event
                first = False
                if work_id is not None:
                    if ending:
                        return
                    ending = (await self._db(self.db.progress, work_id)).ended

    async def _follow_work(
        self, row: SessionRow, work_id: int, after: EventId | None
    ) -> AsyncGenerator[SessionEvent, None]:
        """One work item's events: each of its turns as it lands in the loom (from the
        position its first claim recorded: a prompt queued behind another begins where
        that one ended, up to the next cast's), a pause as a worker publishes it while
        it runs, and, if it ended ``paused``, each call it waits on -- with their ids
        (counted from the turns before its base), after ``after`` when resumed."""
        told: set[str] = set()
        keep = _after(START if after is None else after)
        ids: TurnIds | None = None
        turns = follow(
            _Tail(self.db, self.notifier, self.tail_s),
            row.entity_id,
            self._db_waiting,
            work_id=work_id,
        )
        async with contextlib.aclosing(turns):
            async for item in turns:
                if ids is None:  # its base is known once a worker claimed it
                    base = (
                        item.progress.base_pos if isinstance(item, Beat) and item.progress else None
                    )
                    if isinstance(item, Turn) and base is None:
                        base = (await self._db(self.db.progress, work_id)).base_pos
                    if base is not None:
                        ids = TurnIds(await self._db(self._count_to, row.entity_id, base))
                    elif isinstance(item, Beat) and item.last:
                        return  # ended before any worker began it: nothing to tell
                    else:
                        continue
                if isinstance(item, Turn):
                    for step in ids.told(item):
                        if keep(step):
                            yield step
                    continue
                pending: list[dict[str, Any]] = []
                if item.last:
                    assert item.progress is not None
                    if item.progress.state == PAUSED:
                        pending = (item.progress.outcome or {}).get("pending") or []
                elif self.humans:
                    pending = await self._db(self.db.live_pending, row.entity_id)
                for event in _pause_events(ids, row.entity_id, pending, told):
                    if keep(event):
                        yield event
                if item.last:
                    return

    def _count_to(self, entity_id: str, pos: int | None) -> int:
        """How many of the entity's turns lie at or before loom position ``pos``."""
        if pos is None:
            return 0
        with self.db.store.pool.connection() as conn:
            found = conn.execute(
                "SELECT count(*) FROM cantrip_turns WHERE entity_id = %s AND pos <= %s",
                (entity_id, pos),
            ).fetchone()
        return int(found[0]) if found else 0

    def _pos_of(self, entity_id: str, after: int) -> int:
        """The loom position of the entity's ``after``-th turn (0: before its first)."""
        if after <= 0:
            return 0
        with self.db.store.pool.connection() as conn:
            found = conn.execute(POS_OF, (entity_id, after - 1)).fetchone()
        if found is None:
            raise SessionError("bad_request", f"the session has no turn {after} yet")
        return int(found[0])

    async def shutdown(self, grace_s: float) -> None:
        """Nothing to cut off: the casts run at the workers and go on (a client's retry
        with its Idempotency-Key, at any replica, joins or replays them)."""

    async def health(self) -> Health:
        return Health("db", self.waiting, await self._db(self.db.count), True)


@attrs.define
class _Tail:
    """What :func:`~cantrip.protocols.sessions._tail.follow` needs (its ``Tailing``)."""

    sessions: DbSessions
    notifier: Notifier
    tail_s: float


def _info(row: SessionRow) -> SessionInfo:
    return SessionInfo(row.session_id, row.entity_id, row.running, row.turns, row.user, row.cwd)


def _turn_of(after: int | EventId) -> int:
    """The turn a follow's ``after`` names (a count of turns, or an event's turn)."""
    return after.turn if isinstance(after, EventId) else after


def _after(after: int | EventId) -> Callable[[SessionEvent], bool]:
    """Whether a follow from ``after`` tells an event: one with a later id (after a
    count of turns: a later turn's -- a turn's recorded events are the turn's)."""
    if isinstance(after, EventId):
        return lambda e: e.id is None or e.id > after
    return lambda e: e.id is None or e.id.turn > after


def _pause_events(
    ids: TurnIds, entity_id: str, pending: list[dict[str, Any]], told: set[str]
) -> list[SessionEvent]:
    """The pauses not told yet that no turn of the session tells: a child's, or one
    asked in place (a pause of the session's own checkpoint is told with its turn,
    :func:`~cantrip.protocols.sessions._shapes.recorded_events`)."""
    said: list[SessionEvent] = []
    for data in sorted(pending, key=lambda p: str(p["pause_id"])):
        pause_id = data["pause_id"]
        own = data.get("entity_id") == entity_id and data.get("checkpoint_id") is not None
        if pause_id in told or own:
            continue
        told.add(pause_id)
        pause = Pause.from_dict(data)
        said.append(ids.live(event_dict(PauseEvent(pause=pause, entity_id=pause.entity_id))))
    return said
