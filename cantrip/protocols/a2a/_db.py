"""A2A tasks of ``cantrip serve --db``: in PostgreSQL, so any replica answers for any task.

The mapping is :mod:`._a2a`'s; this is the source of tasks for a replica, which runs
no entity. A task is a row of ``cantrip_a2a_tasks`` naming its session's entity and
its current work item (the prompt, then the work carrying out each answer to its
pauses) and holding the client's messages. Nothing else about it is stored: its
state is read from the work item whenever it is asked for (queued or running:
``working``; ended: the worker's redacted result dict, mapped by
:func:`~cantrip.protocols.a2a._server.settle` as in process; a cast that paused is
``input-required``), so a task is as current at every replica, and a replica that
dies loses nothing but its connections.

* ``SendMessage`` enqueues the prompt (the replica's own path: the same ``busy``
  check, the same limits) and records the task; a follow-up to an
  ``input-required`` task answers its pause through the queue's answer path, in one
  transaction with the task's move to the new work item, so of two follow-ups at
  two replicas one answers and the other is ``-32602``.
* ``GetTask``/``ListTasks`` read the rows; ``CancelTask`` cancels the work item
  through the queue (its worker cuts the cast off and records it), or marks a task
  that waits for input cancelled (its pause stays in the loom).
* Streams (``SendStreamingMessage``, ``SubscribeToTask``) tail the loom as the
  replica's HTTP streams do: woken by the LISTEN connection, a ``working`` update
  per recorded turn (``step_complete``), then the final status (and artifact).
* Push notifications are not served here (the card says so): a config's token and
  credentials are secrets, never written to a table, and held in one replica's memory
  the pushes would stop with that replica.

Every blocking call runs through the replica's ``_db`` (a thread behind the store's
limiter, database errors turned into the replica's answers, which this module turns
into the protocol's errors).
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import attrs
import trio

from cantrip._approval import PauseError
from cantrip._events import StepComplete
from cantrip.distributed._pauses import answer_on
from cantrip.distributed._work import DEAD, ENDED
from cantrip.loom._model import Turn
from cantrip.loom._postgres import PostgresStore
from cantrip.protocols.a2a._server import (
    CANCEL_WAIT_S,
    LIST_SCAN,
    A2AFront,
    A2AHandler,
    TaskView,
    cancelled_waiting,
    check_follow_up,
    check_message,
    decision_for,
    failed,
    progress,
    prompt_of,
    settle,
    working,
)
from cantrip.protocols.asgi._responses import HttpError
from cantrip.protocols.http._mounts import Replica
from cantrip.protocols.sessions._hub import SessionError, entity_id_for, event_dict, session_id_for
from cantrip.protocols.sessions._rows import (
    SessionRow,
    failure_message,
    prompt_id_for,
)
from cantrip.protocols.sessions._tail import follow

_SCHEMA_LOCK = 0x61326174  # "a2at": schema creation, once per database
_SCHEMA = """
CREATE TABLE IF NOT EXISTS cantrip_a2a_tasks (
    task_id TEXT PRIMARY KEY,
    seq BIGSERIAL UNIQUE,
    entity_id TEXT NOT NULL,
    work_id BIGINT NOT NULL,
    history TEXT NOT NULL,
    canceled BOOLEAN NOT NULL DEFAULT false,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS cantrip_a2a_tasks_by_entity ON cantrip_a2a_tasks (entity_id, seq);
"""
_SELECT = (
    "SELECT t.task_id, t.seq, t.entity_id, t.work_id, t.history, t.canceled, "
    "extract(epoch FROM t.updated_at)::float8, w.state, w.result, "
    "extract(epoch FROM coalesce(w.finished_at, w.claimed_at, w.enqueued_at))::float8 "
    "FROM cantrip_a2a_tasks t JOIN cantrip_work w ON w.id = t.work_id"
)


@attrs.define(eq=False)
class DbTask(TaskView):
    """A task as its row and its work item say now."""

    entity_id: str = ""
    work_id: int = 0
    final: list[Any] = attrs.field(factory=list)
    """The events its settling makes (artifact, final status) once its work ended."""


class TaskRows:
    """``cantrip_a2a_tasks``: blocking (psycopg) calls, run through the replica's ``_db``."""

    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        with store.pool.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            conn.execute(_SCHEMA)

    @staticmethod
    def add_on(conn: Any, work_id: int, *, task_id: str, entity_id: str, message: str) -> None:
        """The task of a prompt being queued, on ``conn``: in the prompt's transaction
        (``DbSessions.enqueue``'s ``also``), so a task exists exactly when its prompt does."""
        conn.execute(
            "INSERT INTO cantrip_a2a_tasks (task_id, entity_id, work_id, history) "
            "VALUES (%s, %s, %s, %s)",
            (task_id, entity_id, work_id, json.dumps([message])),
        )

    def get(self, task_id: str) -> tuple[Any, ...] | None:
        with self.store.pool.connection() as conn:
            row: tuple[Any, ...] | None = conn.execute(
                f"{_SELECT} WHERE t.task_id = %s", (task_id,)
            ).fetchone()
        return row

    def newest(self, entity_id: str | None, before: int | None, limit: int) -> list[Any]:
        """Tasks newest first (of one entity if named; older than ``before`` if given)."""
        with self.store.pool.connection() as conn:
            return conn.execute(
                f"{_SELECT} WHERE (%(e)s::text IS NULL OR t.entity_id = %(e)s) "
                "AND (%(b)s::bigint IS NULL OR t.seq < %(b)s) ORDER BY t.seq DESC LIMIT %(n)s",
                {"e": entity_id, "b": before, "n": limit},
            ).fetchall()

    def answer(
        self, task_id: str, work_id: int, pause_id: str, decision: dict[str, Any], message: str
    ) -> bool:
        """Answer the pause the task waits on and move the task to the work carrying the
        answer out, in one transaction (False: the task moved on or was cancelled since
        it was read; a pause answered already is a :class:`PauseError`)."""
        with self.store.pool.connection() as conn, conn.transaction():
            row = conn.execute(
                "SELECT entity_id, history FROM cantrip_a2a_tasks WHERE task_id = %s "
                "AND work_id = %s AND NOT canceled FOR UPDATE",
                (task_id, work_id),
            ).fetchone()
            if row is None:
                return False
            entity_id, history = row
            answered = answer_on(conn, entity_id, pause_id, decision)  # the entity's lock
            conn.execute(
                "UPDATE cantrip_a2a_tasks SET work_id = %s, history = %s, "
                "updated_at = clock_timestamp() WHERE task_id = %s",
                (answered.work_id, json.dumps([*json.loads(history), message]), task_id),
            )
        return True

    def cancel_waiting(self, task_id: str, work_id: int) -> bool:
        """Mark a task that waits for input cancelled (False: it moved on meanwhile)."""
        with self.store.pool.connection() as conn:
            row = conn.execute(
                "UPDATE cantrip_a2a_tasks SET canceled = true, updated_at = clock_timestamp() "
                "WHERE task_id = %s AND work_id = %s AND NOT canceled RETURNING 1",
                (task_id, work_id),
            ).fetchone()
        return row is not None


def task_of(row: tuple[Any, ...]) -> DbTask:
    """The task a row and its work item make (the mapping of :mod:`._a2a`)."""
    from a2a.types import a2a_pb2 as pb
    from google.protobuf.json_format import Parse

    task_id, seq, entity_id, work_id, history, canceled, changed, state, result, at = row
    task = DbTask(
        id=task_id,
        context_id=session_id_for(entity_id),
        state=pb.TASK_STATE_WORKING,
        seq=int(seq),
        history=[Parse(m, pb.Message(), ignore_unknown_fields=True) for m in json.loads(history)],
        entity_id=entity_id,
        work_id=int(work_id),
    )
    working(task)
    outcome = json.loads(result) if result and state in ENDED else None
    if canceled:
        task.final = cancelled_waiting(task)
        at = changed
    elif state in ("failed", DEAD):
        task.final = failed(task, failure_message(outcome))
    elif state in ENDED:
        task.final = settle(task, outcome, stamp=f"w{work_id}")
    task.updated = float(at)
    for event in task.final:  # the status in the events says when, too
        if isinstance(event, pb.TaskStatusUpdateEvent):
            event.status.CopyFrom(task.status())
    return task


@contextlib.contextmanager
def protocol_errors() -> Iterator[None]:
    """The replica's answers (:class:`HttpError`) as the protocol's errors."""
    from a2a.utils.errors import InternalError, InvalidParamsError

    try:
        yield
    except HttpError as exc:
        if exc.status in (400, 404, 409, 422):
            raise InvalidParamsError(message=exc.message) from None
        raise InternalError(message=f"{exc.code}: {exc.message}") from None


class DbTasks(A2AHandler):
    """The SDK's request handler over a ``serve --db`` replica."""

    def __init__(self, replica: Replica, rows: TaskRows) -> None:
        self.replica = replica
        self.rows = rows

    async def _find(self, task_id: str) -> TaskView | None:
        with protocol_errors():
            task: DbTask | None = await self.replica._db(self._read, task_id)
        return task

    def _read(self, task_id: str) -> DbTask | None:
        """The task, read and mapped in the worker thread (its messages may be long)."""
        row = self.rows.get(task_id)
        return task_of(row) if row is not None else None

    def _read_newest(self, entity_id: str | None, before: int | None) -> list[DbTask]:
        return [task_of(r) for r in self.rows.newest(entity_id, before, LIST_SCAN)]

    async def _send(self, message: Any) -> TaskView:
        import uuid

        from a2a.utils.errors import InvalidParamsError, TaskNotFoundError
        from google.protobuf.json_format import MessageToJson

        check_message(message)
        replica = self.replica
        with protocol_errors():
            if message.task_id:
                task = await self._find(message.task_id)
                if task is None:
                    raise TaskNotFoundError(message=f"no task {message.task_id!r}")
                assert isinstance(task, DbTask)
                pause_id = check_follow_up(task)
                decision = decision_for(task, message)
                if replica.drain.closing:
                    raise HttpError(503, "shutting_down", "the server is shutting down")
                message.context_id = task.context_id
                try:
                    moved = await replica._db(
                        self.rows.answer,
                        task.id,
                        task.work_id,
                        pause_id,
                        decision.to_dict(),
                        MessageToJson(message),
                    )
                except PauseError as exc:
                    raise InvalidParamsError(message=f"the pause is not waiting: {exc}") from None
                if not moved:
                    raise InvalidParamsError(message=f"task {task.id} moved on meanwhile")
                found = await self._find(task.id)
                assert found is not None
                return found
            if message.context_id:
                try:
                    session: SessionRow = await replica._db(
                        replica.sessions.require, message.context_id
                    )
                except SessionError as exc:
                    raise InvalidParamsError(message=f"unknown contextId: {exc.message}") from None
            else:
                session, _ = await replica._db(replica.sessions.create, None)
            text = prompt_of(message)
            task_id = uuid.uuid4().hex
            message.context_id = session.session_id
            message.task_id = task_id
            task_row = functools.partial(
                self.rows.add_on,
                task_id=task_id,
                entity_id=session.entity_id,
                message=MessageToJson(message),
            )
            try:
                await replica._enqueue(session, text, None, also=task_row)
            except HttpError as exc:
                if exc.code == "busy":
                    raise InvalidParamsError(
                        message=f"context {session.session_id} is running another task: "
                        "wait for it or cancel it"
                    ) from None
                raise
        found = await self._find(task_id)
        assert found is not None
        return found

    async def _settled(self, task: TaskView) -> TaskView:
        assert isinstance(task, DbTask)
        if task.working:
            with protocol_errors():
                await self.replica._wait(task.entity_id, task.work_id)
        found = await self._find(task.id)
        assert found is not None
        return found

    def _follow(self, task: TaskView) -> AsyncIterator[Any]:
        assert isinstance(task, DbTask)
        return self._tail(task)

    async def _tail(self, task: DbTask) -> AsyncIterator[Any]:
        """A ``working`` update per turn the work records (:mod:`._db_follow`), then the
        task's final events; the stream ends when the replica begins to shut down."""
        if not task.working:
            return
        replica = self.replica
        turns = follow(
            replica,
            task.entity_id,
            replica._db_waiting,
            work_id=task.work_id,
            stop=lambda: replica.drain.closing,
        )
        async with contextlib.aclosing(turns):
            while True:
                with protocol_errors():
                    item = await anext(turns, None)
                if item is None:
                    return
                if isinstance(item, Turn):
                    yield progress(task, event_dict(StepComplete(item, entity_id=item.entity_id)))
                elif item.last:
                    ended = await self._find(task.id)
                    assert isinstance(ended, DbTask)
                    for event in ended.final:
                        yield event
                    return

    async def _cancel(self, task: TaskView) -> TaskView:
        from a2a.types import a2a_pb2 as pb

        assert isinstance(task, DbTask)
        replica = self.replica
        with protocol_errors():
            if task.state == pb.TASK_STATE_INPUT_REQUIRED and await replica._db(
                self.rows.cancel_waiting, task.id, task.work_id
            ):
                return await self._settled(task)
            now = await self._find(task.id)
            assert isinstance(now, DbTask)
            if now.working:
                prompt = prompt_id_for(now.work_id)
                await replica._db(replica.sessions.cancel, now.entity_id, prompt)
                with trio.move_on_after(CANCEL_WAIT_S):
                    await replica._wait(now.entity_id, now.work_id)
        found = await self._find(task.id)
        assert found is not None
        return found

    async def _candidates(self, context_id: str, before: int | None) -> list[TaskView]:
        entity = entity_id_for(context_id) if context_id else None
        with protocol_errors():
            tasks: list[TaskView] = await self.replica._db(self._read_newest, entity, before)
        return tasks


def a2a_front(replica: Replica) -> A2AFront:
    """The Agent Card and JSON-RPC endpoint of a replica (its table made if missing)."""
    return A2AFront(replica.cantrip, DbTasks(replica, TaskRows(replica.sessions.store)))
