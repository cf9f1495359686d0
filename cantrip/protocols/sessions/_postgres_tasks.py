"""The A2A task methods of the PostgreSQL session backend (:class:`~._postgres.PostgresBackend`):
a task's row written with its prompt, read, answered and cancelled in the task table
(:class:`~cantrip.protocols.sessions._task_rows.TaskRows`).

Apart from :mod:`._postgres` because tasks are a job of their own over a table of their
own, used by one front end (A2A), while the backend's module holds sessions, prompts,
pauses and events; the backend takes them as a base class, so its interface -- the
:class:`~cantrip.protocols.sessions.SessionBackend` seam -- is unchanged."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from cantrip._approval import Decision
from cantrip.protocols.sessions._admit import PromptCommits
from cantrip.protocols.sessions._backend import (
    MAX_TASKS,
    BusyPolicy,
    TaskRecord,
    entity_id_for,
)
from cantrip.protocols.sessions._enqueue import PromptRequest, work_id_for
from cantrip.protocols.sessions._rows import DbSessions
from cantrip.protocols.sessions._task_rows import TaskRows

T = TypeVar("T")


class PostgresTasks:
    """The task methods; :class:`~._postgres.PostgresBackend` provides what they use."""

    db: DbSessions
    spell: dict[str, Any]
    prompts: PromptCommits
    _task_rows: TaskRows | None

    if TYPE_CHECKING:

        async def _db(self, fn: Callable[..., T], *args: Any) -> T: ...

    async def _tasks(self) -> TaskRows:
        """The task rows (their table made on first use)."""
        if self._task_rows is None:
            self._task_rows = await self._db(TaskRows, self.db.store)
        return self._task_rows

    async def submit_task(
        self,
        session_id: str,
        intent: str,
        *,
        task_id: str,
        message: str,
        on_busy: BusyPolicy = "reject",
    ) -> TaskRecord:
        rows = await self._tasks()
        entity_id = entity_id_for(session_id)  # (its batch checks the session, as submit's)
        also = functools.partial(rows.add_on, task_id=task_id, entity_id=entity_id, message=message)
        await self.prompts.enqueue(
            PromptRequest(entity_id, self.spell, intent, None, on_busy, also, session=session_id)
        )
        found = await self._db(rows.record, task_id)
        assert found is not None  # written with its prompt
        return found

    async def task(self, task_id: str) -> TaskRecord | None:
        rows = await self._tasks()
        return await self._db(rows.record, task_id)

    async def tasks(
        self, session_id: str | None, *, before: int | None = None, limit: int = MAX_TASKS
    ) -> list[TaskRecord]:
        rows = await self._tasks()
        entity = None if session_id is None else entity_id_for(session_id)
        return await self._db(rows.newest, entity, before, limit)

    async def answer_task(
        self, task_id: str, prompt_id: str, pause_id: str, decision: Decision, message: str
    ) -> TaskRecord | None:
        rows = await self._tasks()
        work_id = work_id_for(prompt_id)
        if work_id is None:
            return None
        moved = await self._db(rows.answer, task_id, work_id, pause_id, decision.to_dict(), message)
        return await self._db(rows.record, task_id) if moved else None

    async def cancel_waiting_task(self, task_id: str, prompt_id: str) -> TaskRecord | None:
        rows = await self._tasks()
        work_id = work_id_for(prompt_id)
        if work_id is None or not await self._db(rows.cancel_waiting, task_id, work_id):
            return None
        return await self._db(rows.record, task_id)
