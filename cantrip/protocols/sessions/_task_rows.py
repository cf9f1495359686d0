"""Tasks beside prompts on PostgreSQL: ``cantrip_a2a_tasks``, so any replica answers for
any task (the seam's task operations, :class:`~cantrip.protocols.sessions.TaskRecord`).

A task is a row naming its session's entity and its current work item (the prompt,
then the work carrying out each answer to its pauses) and holding the client's
messages. Nothing else about it is stored: its state is read from the work item
whenever it is asked for (queued or running: open; ended: the worker's redacted
result dict), so a task is as current at every replica, and a replica that dies
loses nothing but its connections. The row is written in its prompt's transaction
(``DbSessions.enqueue``'s ``also``) and an answer moves it in the answer's, so a task
exists exactly when its prompt does and of two answers at two replicas one wins.

Blocking (psycopg) calls: :class:`~cantrip.protocols.sessions.PostgresBackend` runs
them in threads behind the store's limiter.
"""

from __future__ import annotations

import json
from typing import Any

from cantrip.distributed._pauses import answer_on
from cantrip.distributed._work import DEAD, ENDED
from cantrip.loom._postgres import PostgresStore
from cantrip.protocols.sessions._backend import TaskRecord, session_id_for
from cantrip.protocols.sessions._rows import failure_message, prompt_id_for

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


class TaskRows:
    """``cantrip_a2a_tasks`` (made if missing)."""

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

    def record(self, task_id: str) -> TaskRecord | None:
        row = self.get(task_id)
        return None if row is None else record_of(row)

    def newest(self, entity_id: str | None, before: int | None, limit: int) -> list[TaskRecord]:
        """Tasks newest first (of one entity if named; older than ``before`` if given)."""
        with self.store.pool.connection() as conn:
            rows = conn.execute(
                f"{_SELECT} WHERE (%(e)s::text IS NULL OR t.entity_id = %(e)s) "
                "AND (%(b)s::bigint IS NULL OR t.seq < %(b)s) ORDER BY t.seq DESC LIMIT %(n)s",
                {"e": entity_id, "b": before, "n": limit},
            ).fetchall()
        return [record_of(r) for r in rows]

    def answer(
        self, task_id: str, work_id: int, pause_id: str, decision: dict[str, Any], message: str
    ) -> bool:
        """Answer the pause the task waits on and move the task to the work carrying the
        answer out, in one transaction (False: the task moved on or was cancelled since
        it was read; a pause answered already is a :class:`~cantrip.PauseError`)."""
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


def record_of(row: tuple[Any, ...]) -> TaskRecord:
    """The record a row and its work item make."""
    task_id, seq, entity_id, work_id, history, canceled, changed, state, result, at = row
    outcome = json.loads(result) if result and state in ENDED else None
    failed = state in ("failed", DEAD)
    return TaskRecord(
        task_id=task_id,
        session_id=session_id_for(entity_id),
        prompt_id=prompt_id_for(int(work_id)),
        messages=tuple(json.loads(history)),
        seq=int(seq),
        canceled=bool(canceled),
        updated=float(changed if canceled else at),
        state="failed" if failed else "ended" if state in ENDED else "open",
        result=None if failed else outcome,
        failure=failure_message(outcome) if failed else None,
    )
