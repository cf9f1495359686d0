"""The tasks of the in-process session backend: what an A2A task records beside its
prompts, and how a prompt's run ended.

Apart from :mod:`cantrip.protocols.sessions._process` because it is bookkeeping,
not serving: a task is a record kept next to the prompts the backend runs (the
seam's :class:`~cantrip.protocols.sessions._backend.TaskRecord`, in memory) and
read from how those runs ended; it starts no cast and follows no session of its
own (it submits and answers through the backend).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from cantrip._approval import Decision, PauseError
from cantrip._outcome import CastResult, result_dict
from cantrip.protocols.sessions._backend import (
    MAX_TASKS,
    BusyPolicy,
    SessionRef,
    Submitted,
    TaskRecord,
)
from cantrip.protocols.sessions._hub import SessionError, Watcher


@attrs.define(eq=False)
class Run:
    """A prompt (or an answer's continuation) this backend started, and how it ended."""

    session_id: str
    done: trio.Event = attrs.field(factory=trio.Event)
    cast: CastResult | None = None
    error: BaseException | None = None
    ended_at: float | None = None
    """When it ended (seconds since the epoch)."""
    watchers: list[Watcher] = attrs.field(factory=list)
    """Followers that end with it (``follow(until=...)``, a prompt's own stream):
    closed once it has ended, after every event of its cast was sent to them."""

    def end(self) -> None:
        self.ended_at = time.time()
        self.done.set()
        for watcher in self.watchers:  # every event of the cast was sent before
            watcher.close()
        self.watchers.clear()


@attrs.define(eq=False)
class Task:
    """A task recorded beside a prompt (the seam's :class:`TaskRecord`, in memory)."""

    task_id: str
    session_id: str
    prompt_id: str
    messages: list[str]
    seq: int
    canceled: bool = False
    changed: float = attrs.field(factory=time.time)


class ProcessTasks:
    """The tasks half of :class:`~cantrip.protocols.sessions._process.ProcessBackend`
    (which sets this state and submits and answers the prompts)."""

    _runs: dict[str, Run]
    _tasks: dict[str, Task]
    _seq: Iterator[int]

    if TYPE_CHECKING:

        async def submit(
            self,
            ref: SessionRef,
            intent: str,
            *,
            key: str | None = None,
            on_busy: BusyPolicy = "reject",
            tools: Sequence[Mapping[str, Any]] = (),
        ) -> Submitted: ...

        async def answer(
            self, session_id: str, pause_id: str, decision: Decision, *, repeat: bool = False
        ) -> Submitted | None: ...

    async def submit_task(
        self,
        session_id: str,
        intent: str,
        *,
        task_id: str,
        message: str,
        on_busy: BusyPolicy = "reject",
    ) -> TaskRecord:
        submitted = await self.submit(session_id, intent, on_busy=on_busy)
        task = Task(task_id, submitted.session_id, submitted.prompt_id, [message], next(self._seq))
        self._tasks[task_id] = task
        self._forget_settled()
        return self._record(task)

    def _forget_settled(self) -> None:
        """Beyond ``MAX_TASKS``, the oldest that will not change again go."""
        for task in list(self._tasks.values()):
            if len(self._tasks) <= MAX_TASKS:
                return
            record = self._record(task)
            waiting = (record.result or {}).get("reason") == "paused" and not record.canceled
            if record.state != "open" and not waiting:
                del self._tasks[task.task_id]

    def _record(self, task: Task) -> TaskRecord:
        run = self._runs.get(task.prompt_id)
        fields: dict[str, Any] = {"state": "open"}
        updated = task.changed
        if run is None:  # forgotten (beyond KEPT_RESULTS): nothing is known of its end
            fields = {"state": "failed", "failure": "the prompt's outcome was forgotten"}
        elif run.done.is_set():
            updated = max(updated, run.ended_at or 0.0)
            if run.error is None:
                fields = {"state": "ended", "result": result_dict(run.cast)}
            else:
                fields = {"state": "failed", "failure": _failure(run.error)}
        return TaskRecord(
            task.task_id,
            task.session_id,
            task.prompt_id,
            tuple(task.messages),
            task.seq,
            task.canceled,
            updated,
            **fields,
        )

    async def task(self, task_id: str) -> TaskRecord | None:
        task = self._tasks.get(task_id)
        return None if task is None else self._record(task)

    async def tasks(
        self, session_id: str | None, *, before: int | None = None, limit: int = MAX_TASKS
    ) -> list[TaskRecord]:
        found = [
            t
            for t in sorted(self._tasks.values(), key=lambda t: -t.seq)
            if (session_id is None or t.session_id == session_id)
            and (before is None or t.seq < before)
        ]
        return [self._record(t) for t in found[:limit]]

    async def answer_task(
        self, task_id: str, prompt_id: str, pause_id: str, decision: Decision, message: str
    ) -> TaskRecord | None:
        task = self._tasks.get(task_id)
        if task is None or task.prompt_id != prompt_id or task.canceled:
            return None
        submitted = await self.answer(task.session_id, pause_id, decision)  # PauseError
        if submitted is not None:
            task.prompt_id = submitted.prompt_id
        task.messages.append(message)
        task.changed = time.time()
        return self._record(task)

    async def cancel_waiting_task(self, task_id: str, prompt_id: str) -> TaskRecord | None:
        task = self._tasks.get(task_id)
        if task is None or task.prompt_id != prompt_id or task.canceled:
            return None
        task.canceled = True
        task.changed = time.time()
        return self._record(task)


def _failure(error: BaseException) -> str:
    """Why a prompt failed, for a client (a session's refusal says its kind)."""
    if isinstance(error, SessionError):
        return f"{error.kind}: {error.message}"
    if isinstance(error, PauseError):
        return f"the answer was refused: {error}"
    return f"the cast failed: {error}"
