"""Long casts as MCP tasks: the ``io.modelcontextprotocol/tasks`` extension (SEP-2663).

MCP 2026-07-28 moved tasks out of the core protocol into this official extension;
the SDK serves extension methods but implements none of it, so this module does,
for ``cantrip mcp``. A client that declares the extension on its ``tools/call``
of ``cast`` gets a task handle at once (``resultType: "task"``) instead of waiting:
a task is a prompt of the server's session backend (its id the prompt's, then its
continued cast's), driven in the server's own nursery (:mod:`._calls`), and

* ``tasks/get`` answers its state: ``working`` (the status message is the latest
  turn), ``input_required`` with the ``inputRequests`` of the pause it waits on
  (an approval, an ``ask_user`` question, a question one of the circle's MCP
  servers asked -- as elicitations, :mod:`cantrip.protocols.mcp_server._pauses`), ``completed``
  with the same ``CallToolResult`` the call would have answered
  (:mod:`cantrip.protocols.mcp_server._result`; a cast that raised is a completed tool error), or
  ``cancelled``;
* ``tasks/update`` carries the answer to a pause (keyed by its pause id), taken
  like any answer (recorded in the loom; one that does not fill the form is
  JSON-RPC invalid params and the question stays open);
* ``tasks/cancel`` cancels the cast (the backend's ``cancel``, naming its prompt),
  which the loom records as cut off.

A task lives in this process: the server's end cancels its running casts (each
recorded as cancelled). Finished tasks are kept for ``TTL_MS`` and at most
``MAX_TASKS`` are held; over that, a new call runs without a task. A task id is
128 random bits, the only handle on it (the server has one token at most, so
there is no finer authorization context to bind it to).
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import attrs
import pydantic
import trio

from cantrip._approval import Decision, Pause
from cantrip._elicit import AnswerError
from cantrip._redact import get_logger
from cantrip.loom._model import Turn
from cantrip.protocols.mcp_server._calls import Driven, drive, failure_text
from cantrip.protocols.mcp_server._held import let_go
from cantrip.protocols.mcp_server._pauses import can_elicit, decision_from, elicitation_params
from cantrip.protocols.mcp_server._result import (
    cast_tool_result,
    failed_tool_result,
    progress_message,
)
from cantrip.protocols.sessions import SessionBackend, SessionError, SessionInfo

log = get_logger("cantrip.mcp.tasks")

TASKS = "io.modelcontextprotocol/tasks"
TTL_MS = 3_600_000
"""How long a task is kept after it was created (an hour)."""
POLL_MS = 500
MAX_TASKS = 1000

Status = str  # "working" | "input_required" | "completed" | "cancelled" | "failed"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@attrs.define(eq=False)
class _Question:
    pause: Pause
    answered: trio.Event = attrs.field(factory=trio.Event)
    decision: Decision | None = None


@attrs.define(eq=False)
class Task:
    """One cast run as a task."""

    task_id: str
    created: str = attrs.field(factory=_now)
    updated: str = attrs.field(factory=_now)
    born: float = attrs.field(factory=time.monotonic)
    status: Status = "working"
    message: str | None = None
    result: dict[str, Any] | None = None
    questions: dict[str, _Question] = attrs.field(factory=dict)
    prompt_id: str = ""
    """The prompt the task drives now (a continued cast's, once a pause is answered)."""
    cancel: Callable[[], Awaitable[None]] | None = None
    scope: trio.CancelScope | None = None
    """The scope its driving runs in: ``tasks/cancel`` of a task that waits for input
    cancels it (no prompt may be running to cancel: the cast ended paused)."""
    form: bool = False
    """Whether the client takes elicitations (then a pause asks it; else the cast
    returns ``paused`` as the synchronous call does)."""
    url_mode: bool = False

    def touch(self, status: Status | None = None, message: str | None = None) -> None:
        if status is not None:
            self.status = status
        if message is not None:
            self.message = message
        self.updated = _now()

    @property
    def finished(self) -> bool:
        return self.status in ("completed", "cancelled", "failed")

    def to_wire(self) -> dict[str, Any]:
        """The task as ``tasks/get`` (and ``CreateTaskResult``) say it."""
        data: dict[str, Any] = {
            "taskId": self.task_id,
            "status": self.status,
            "createdAt": self.created,
            "lastUpdatedAt": self.updated,
            "ttlMs": TTL_MS,
            "pollIntervalMs": POLL_MS,
        }
        if self.message is not None:
            data["statusMessage"] = self.message
        if self.status == "completed" and self.result is not None:
            data["result"] = self.result
        if self.status == "input_required":
            data["inputRequests"] = {
                key: {
                    "method": "elicitation/create",
                    "params": params.model_dump(by_alias=True, mode="json", exclude_none=True),
                }
                for key, question in self.questions.items()
                if question.decision is None
                and (params := elicitation_params(question.pause, url_mode=self.url_mode))
                is not None
            }
        return data


class TaskBoard:
    """The tasks of one ``cantrip mcp`` process: each a prompt of the session backend
    (:mod:`._calls`), driven in the server's nursery."""

    def __init__(self) -> None:
        self.tasks: dict[str, Task] = {}
        self.backend: SessionBackend | None = None
        self.nursery: trio.Nursery | None = None

    def _expire(self) -> None:
        horizon = time.monotonic() - TTL_MS / 1000
        for task_id in [t.task_id for t in self.tasks.values() if t.born < horizon and t.finished]:
            del self.tasks[task_id]
        if len(self.tasks) > MAX_TASKS:
            done = [t.task_id for t in self.tasks.values() if t.finished]
            for task_id in done[: len(self.tasks) - MAX_TASKS]:
                del self.tasks[task_id]

    def room(self) -> bool:
        self._expire()
        return self.nursery is not None and len(self.tasks) < MAX_TASKS

    async def start(self, intent: str, form: bool, url_mode: bool) -> Task:
        """Create the task (so ``tasks/get`` finds it), submit its prompt and drive it."""
        assert self.nursery is not None and self.backend is not None
        backend = self.backend
        info, _ = await backend.create()
        submitted = await backend.submit(info, intent)  # as created: not read again
        task = Task(task_id="task-" + os.urandom(16).hex(), form=form, url_mode=url_mode)
        self.tasks[task.task_id] = task

        async def cancel() -> None:
            await backend.cancel(info.session_id, prompt_id=task.prompt_id)

        task.prompt_id, task.cancel = submitted.prompt_id, cancel
        self.nursery.start_soon(self._run, backend, task, info)
        return task

    def get(self, task_id: str) -> Task:
        from mcp import MCPError
        from mcp_types import INVALID_PARAMS

        self._expire()
        task = self.tasks.get(task_id)
        if task is None:
            raise MCPError(INVALID_PARAMS, f"no task {task_id!r} (unknown, or expired)")
        return task

    async def _run(self, backend: SessionBackend, task: Task, session: SessionInfo) -> None:
        session_id = session.session_id
        done = [0]

        def on_turn(turn: Turn) -> None:
            done[0] += 1
            task.touch(message=progress_message(done[0], turn.utterance))

        async def ask(pause: Pause) -> Decision:
            if elicitation_params(pause, url_mode=task.url_mode) is None:
                return Decision.deny("the MCP client cannot open pages (no URL-mode elicitation)")
            question = task.questions[pause.pause_id] = _Question(pause)
            task.touch("input_required")
            try:
                await question.answered.wait()
            finally:
                if not any(
                    q.decision is None for q in task.questions.values() if q is not question
                ):
                    task.touch("working")
            assert question.decision is not None
            return question.decision

        def driving(prompt_id: str) -> None:
            task.prompt_id = prompt_id  # a continued cast: what a cancel names now

        with trio.CancelScope() as scope:
            task.scope = scope
            driven = await self._drive(backend, task, session, on_turn, ask, driving)
        if scope.cancelled_caught:  # tasks/cancel while it waited for input
            await let_go(backend, session_id, task.prompt_id)
            task.questions.clear()
            task.touch("cancelled", "cancelled")
            return
        if driven is None:
            return
        outcome = driven.cast
        if outcome is None or (
            outcome.truncated and outcome.reason in ("cancelled", "parent_terminated")
        ):
            task.touch("cancelled", "cancelled")
            return
        result = cast_tool_result(outcome)
        task.result = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        task.touch("completed", "done" if outcome.terminated else f"stopped: {outcome.reason}")

    async def _drive(
        self,
        backend: SessionBackend,
        task: Task,
        session: SessionInfo,
        on_turn: Callable[[Turn], None],
        ask: Callable[[Pause], Awaitable[Decision]],
        driving: Callable[[str], None],
    ) -> Driven | None:
        """Drive the task's prompt (None: it could not run, the task says why)."""
        try:
            # A client that takes no elicitation is not asked: the cast returns paused.
            return await drive(
                backend,
                session,
                task.prompt_id,
                after=0,
                on_turn=on_turn,
                ask=ask if task.form else None,
                on_prompt=driving,
            )
        except SessionError as exc:  # the cast could not run: a completed tool error
            result = failed_tool_result(failure_text(exc))
            task.result = result.model_dump(by_alias=True, mode="json", exclude_none=True)
            task.touch("completed")
            return None
        except BaseException:
            task.touch("cancelled", "the server stopped")  # its nursery was cancelled
            raise
        finally:
            task.cancel = task.scope = None

    def update(self, task_id: str, responses: dict[str, Any]) -> None:
        """Answers to the task's open questions; unknown or answered keys are ignored."""
        from mcp import MCPError
        from mcp_types import INVALID_PARAMS, ElicitResult

        task = self.get(task_id)
        for key, raw in responses.items():
            question = task.questions.get(key)
            if question is None or question.decision is not None:
                continue
            try:
                response = ElicitResult.model_validate(raw)
                decision = decision_from(question.pause, response)
            except (pydantic.ValidationError, AnswerError) as exc:
                raise MCPError(INVALID_PARAMS, f"the answer to {key} does not fit: {exc}") from None
            question.decision = decision
            question.answered.set()

    async def cancel(self, task_id: str) -> None:
        """Cut the task's running prompt off (recorded ``cancelled``); a task waiting for
        input stops waiting too -- its cast may have ended paused, with no prompt to cut
        off (the loom keeps it paused), or a child may wait in place in a prompt that
        was just cut off."""
        task = self.get(task_id)
        if task.cancel is not None:
            await task.cancel()
        if task.scope is not None and task.status == "input_required":
            task.scope.cancel()


class _TaskId(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")
    task_id: str = pydantic.Field(alias="taskId", min_length=1, max_length=200)


class _Update(_TaskId):
    input_responses: dict[str, Any] = pydantic.Field(alias="inputResponses")


def tasks_extension(board: TaskBoard) -> Any:
    """The SDK extension that serves ``board``: ``tasks/get``, ``tasks/update``,
    ``tasks/cancel``, and ``tools/call`` of ``cast`` answered with a task handle when
    the client declared the extension on the call."""
    from mcp.server.extension import Extension, MethodBinding

    class CastTasks(Extension):
        identifier = TASKS

        def methods(self) -> Sequence[MethodBinding]:
            return (
                MethodBinding("tasks/get", _TaskId, self._get),
                MethodBinding("tasks/update", _Update, self._update),
                MethodBinding("tasks/cancel", _TaskId, self._cancel),
            )

        async def _get(self, ctx: Any, params: _TaskId) -> dict[str, Any]:
            return {"resultType": "complete", **board.get(params.task_id).to_wire()}

        async def _update(self, ctx: Any, params: _Update) -> dict[str, Any]:
            board.update(params.task_id, params.input_responses)
            return {"resultType": "complete"}

        async def _cancel(self, ctx: Any, params: _TaskId) -> dict[str, Any]:
            await board.cancel(params.task_id)
            return {"resultType": "complete"}

        async def intercept_tool_call(
            self, params: Any, ctx: Any, call_next: Callable[[Any], Awaitable[Any]]
        ) -> Any:
            capabilities = ctx.session.client_capabilities
            declared = TASKS in (getattr(capabilities, "extensions", None) or {})
            intent = (params.arguments or {}).get("intent")
            if params.name != "cast" or not declared or not isinstance(intent, str):
                return await call_next(ctx)
            if not intent.strip() or not board.room():
                return await call_next(ctx)  # a refusal or a full board: answered at once
            task = await board.start(intent, *can_elicit(capabilities))
            return {"resultType": "task", **task.to_wire()}

    return CastTasks()
