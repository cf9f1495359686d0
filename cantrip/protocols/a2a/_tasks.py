"""A2A tasks of the in-process ``cantrip serve``: held in memory beside the sessions.

The mapping is :mod:`._a2a`'s; this is the source of tasks for the server that runs
its entities itself. Casts run in the hub's nursery (the server's lifetime), not in
the request: a task goes on when the client that sent it hangs up, so ``GetTask``,
``SubscribeToTask`` and ``CancelTask`` from another connection see and reach it.
Each event a running task publishes goes to its subscribed streams and, when a
client configured one, to its push-notification webhooks (:mod:`._a2a_push`).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import attrs
import trio

from cantrip._approval import PauseError
from cantrip._errors import CantripError
from cantrip._outcome import CastResult, result_dict
from cantrip._redact import get_logger
from cantrip.llm._stream import Event
from cantrip.protocols.a2a._push import Pushes
from cantrip.protocols.a2a._server import (
    CANCEL_WAIT_S,
    MAX_TASKS,
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
from cantrip.protocols.middleware._limits import SessionLimits, make_room
from cantrip.protocols.sessions._hub import Session, SessionError, SessionHub, event_dict

log = get_logger("cantrip.a2a")


@attrs.define(eq=False)
class Task(TaskView):
    """A task and what runs it: its session, its cast's state, its subscribed streams."""

    session: Session | None = None
    settled: trio.Event = attrs.field(factory=trio.Event)
    """Set when the task stops working (a terminal state or ``input-required``)."""
    watchers: list[trio.MemorySendChannel[Any]] = attrs.field(factory=list)
    running: bool = False


class SessionTasks(A2AHandler):
    """The SDK's request handler over a :class:`SessionHub`."""

    def __init__(
        self,
        hub: SessionHub,
        limits: SessionLimits | None = None,
        max_tasks: int = MAX_TASKS,
        pushes: Pushes | None = None,
    ) -> None:
        self.hub = hub
        self.limits = limits or SessionLimits()
        self.tasks: dict[str, Task] = {}
        self.max_tasks = max_tasks
        self.push = pushes
        self._seq = itertools.count(1)

    # -- the source's hooks ---------------------------------------------------------------

    async def _find(self, task_id: str) -> TaskView | None:
        return self.tasks.get(task_id)

    async def _settled(self, task: TaskView) -> TaskView:
        assert isinstance(task, Task)
        await task.settled.wait()
        return task

    def _follow(self, task: TaskView) -> AsyncIterator[Any]:
        assert isinstance(task, Task)
        send, receive = trio.open_memory_channel[Any](float("inf"))
        if task.running:
            task.watchers.append(send)
        else:
            send.close()

        async def events() -> AsyncIterator[Any]:
            async with receive:
                async for event in receive:
                    yield event

        return events()

    async def _cancel(self, task: TaskView) -> TaskView:
        assert isinstance(task, Task)
        if task.running and task.session is not None:
            self.hub.cancel(task.session)
            with trio.move_on_after(CANCEL_WAIT_S):
                while task.running:
                    await task.settled.wait()
        elif not task.running:  # paused: the pause stays in the loom, the task takes no answer
            self._publish(task, cancelled_waiting(task))
            self._close(task)
        return task

    async def _candidates(self, context_id: str, before: int | None) -> list[TaskView]:
        return [
            t
            for t in sorted(self.tasks.values(), key=lambda t: -t.seq)
            if (not context_id or t.context_id == context_id) and (before is None or t.seq < before)
        ]

    async def _send(self, message: Any) -> TaskView:
        """Start the task ``message`` asks for (a new prompt, or the answer to a paused
        task); errors are the SDK's, so the client gets JSON-RPC errors."""
        from a2a.types import a2a_pb2 as pb
        from a2a.utils.errors import InternalError, InvalidParamsError, TaskNotFoundError

        check_message(message)
        nursery = self.hub.nursery
        if nursery is None:
            raise InternalError(message="the server is not running")
        if message.task_id:
            task = self.tasks.get(message.task_id)
            if task is None:
                raise TaskNotFoundError(message=f"no task {message.task_id!r}")
            pause_id = check_follow_up(task)
            decision = decision_for(task, message)
            await self._room(adding=task.context_id not in self.hub.sessions)
            session = self._session(task.context_id)  # it may have been evicted meanwhile
            task.session = session
            task.history.append(message)
            self._working(task)
            answer = functools.partial(self.hub.answer, session, pause_id, decision)
            nursery.start_soon(self._run, task, answer)
            return task
        await self._room(adding=message.context_id not in self.hub.sessions)
        if message.context_id:
            session = self._session(message.context_id)
        else:
            session, _ = self.hub.create()
        if session.running is not None:
            raise InvalidParamsError(
                message=f"context {session.id} is running another task: wait for it or cancel it"
            )
        text = prompt_of(message)
        task = Task(
            id=self.hub_task_id(),
            context_id=session.id,
            state=pb.TASK_STATE_SUBMITTED,
            seq=next(self._seq),
            session=session,
        )
        message.context_id = session.id
        message.task_id = task.id
        task.history.append(message)
        self._remember(task)
        self._working(task)
        nursery.start_soon(self._run, task, functools.partial(self.hub.prompt, session, text))
        return task

    @staticmethod
    def hub_task_id() -> str:
        import uuid

        return uuid.uuid4().hex

    # -- running a task -------------------------------------------------------------------

    async def _room(self, *, adding: bool) -> None:
        """The server's session limits, as for the HTTP API (idle sessions are dropped
        from memory and resumed from the loom when named again)."""
        from a2a.utils.errors import InternalError

        try:
            await make_room(self.hub, self.limits, adding=adding)
        except SessionError as exc:
            raise InternalError(message=f"no room for another session: {exc.message}") from None

    def _session(self, session_id: str) -> Session:
        from a2a.utils.errors import InvalidParamsError

        try:
            session = self.hub.get(session_id)
        except SessionError as exc:
            raise InvalidParamsError(message=f"unknown contextId: {exc.message}") from None
        session.last_used = trio.current_time()
        return session

    def _remember(self, task: Task) -> None:
        self.tasks[task.id] = task
        while len(self.tasks) > self.max_tasks:
            oldest = next(
                (t for t in self.tasks.values() if not t.running and t.pause_id is None), None
            )
            if oldest is None:
                break
            del self.tasks[oldest.id]
            if self.push is not None:
                self.push.forget(oldest.id)

    def _working(self, task: Task) -> None:
        working(task)
        task.running = True
        task.settled = trio.Event()
        self._publish(task, [task.status_event()], streams=False)

    def _publish(self, task: Task, events: list[Any], *, streams: bool = True) -> None:
        for event in events:
            if streams:
                for channel in list(task.watchers):
                    try:
                        channel.send_nowait(event)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        task.watchers.remove(channel)
            if self.push is not None:
                self.push.notify(task.id, event)

    def _close(self, task: Task) -> None:
        for channel in task.watchers:
            channel.close()
        task.watchers.clear()

    async def _run(self, task: Task, cast: Callable[..., Awaitable[CastResult | None]]) -> None:
        """The cast behind ``task``; its outcome becomes the task's state (the boundary of a
        child entity: a crash fails the task, the server goes on)."""

        def sink(event: Event) -> None:
            update = progress(task, event_dict(event))
            if update is not None:
                self._publish(task, [update], streams=True)

        try:
            outcome = await cast(on_event=sink)
        except SessionError as exc:
            self._publish(task, failed(task, f"{exc.kind}: {exc.message}"))
        except PauseError as exc:
            self._publish(task, failed(task, f"the answer was refused: {exc}"))
        except CantripError as exc:
            self._publish(task, failed(task, f"the cast failed: {exc}"))
        except Exception as exc:
            log.exception("a2a task %s: the entity crashed", task.id)
            self._publish(task, failed(task, f"the entity crashed: {exc!r}"))
        else:
            data = None if outcome is None else result_dict(outcome, task.session)  # redacted
            self._publish(task, settle(task, data, stamp=str(len(task.history))))
        finally:
            task.running = False
            task.settled.set()
            self._close(task)
