"""MCP tasks as a client: the ``io.modelcontextprotocol/tasks`` extension (SEP-2663).

MCP 2026-07-28 moved tasks out of the core protocol into an official extension; the
SDK (2.3) ships the mechanism a client extension needs -- a *result claim* on
``tools/call`` for an extra ``resultType`` -- but no tasks client. This module is
that client, the counterpart of what ``cantrip mcp`` serves
(:mod:`cantrip.protocols.mcp_server._tasks`):

* cantrip declares the extension on every connection at 2026-07-28 (the SDK advertises
  a claim-bearing extension only where its claim is active, so an older revision never
  sees it); a server that does not offer tasks answers ``tools/call`` as ever;
* a server that does answers ``resultType: "task"`` with a task handle; the claim's
  resolver -- still inside the gate call, in its task and cancel scope -- polls
  ``tasks/get`` (50 ms after, doubling up to the server's ``pollIntervalMs``, itself
  bounded to 50 ms..5 s) until the task is
  ``completed`` (its ``result`` is the ``CallToolResult``), ``failed`` or
  ``cancelled``; an ``input_required`` task's ``inputRequests`` are asked like any
  question a server asks during a call (the calling entity's pause, through the
  connection's elicitation callback) and answered with ``tasks/update``;
* a gate call cut off (the cast cancelled, a ward) sends ``tasks/cancel`` before it
  unwinds, shielded and bounded, so the server stops the work -- the task does not
  outlive the call that made it;
* each new ``statusMessage`` is told as the call's progress (a ``GateProgress``
  event), as a plain call's progress notifications are;
* the task's id and last status are written into the gate call's record
  (``detail["mcp_task"]``), so the loom says which task a result came from. A process
  that dies mid-task leaves the call to the gate journal's rule (not idempotent:
  "outcome unknown", never a second call) -- except that the task's id is saved as
  the call's checkpoint (:mod:`cantrip._checkpoint`) the moment the server gives it,
  so the resumed call follows that task to its end (``tasks/get``) instead of calling
  the tool again; a task the server no longer knows is an ``is_error`` observation.

*Why poll rather than wait for a notification:* the extension's status notifications
need a stream the server holds open; a poll works over stdio and stateless HTTP alike,
and the server says how often to ask.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, Literal

import attrs
import pydantic
import trio

from cantrip._checkpoint import CURRENT as CURRENT_CHECKPOINT
from cantrip._redact import get_logger

log = get_logger("cantrip.mcp.tasks")

TASKS = "io.modelcontextprotocol/tasks"
"""The extension's identifier, as servers advertise it and clients declare it."""
MIN_POLL_S = 0.05
MAX_POLL_S = 5.0
"""The server's ``pollIntervalMs`` is followed within these bounds (seconds)."""


def poll_wait(interval_ms: float | None, polls: int) -> float:
    """Seconds before the next ``tasks/get``: the first polls come sooner (50 ms,
    doubling) up to the server's interval, so a short task is not held for a whole
    interval (measured with ``cantrip mcp``'s 500 ms: a 10 ms task took 519 ms as a
    task, 12 ms as a plain call)."""
    interval = min(MAX_POLL_S, max(MIN_POLL_S, (interval_ms or 500.0) / 1000))
    return min(interval, MIN_POLL_S * 2.0**polls)


CANCEL_GRACE_S = 5.0
"""How long a cancelled call waits for the server to take ``tasks/cancel``."""


@attrs.define
class TaskNote:
    """What the gate call's record says of its task: its id and its last status."""

    task_id: str | None = None
    status: str | None = None
    cancel_sent: bool = False
    on_progress: Callable[[float, float | None, str | None], Awaitable[None]] | None = None
    """The call's progress callback: each new status message of the task is told as
    progress (a task's call has returned, so the server's progress notifications for
    it have nowhere to go; its status message is how it reports)."""
    told: int = 0
    last_message: str | None = None

    async def tell(self, message: str | None) -> None:
        if message is None or message == self.last_message or self.on_progress is None:
            return
        self.last_message = message
        self.told += 1
        await self.on_progress(float(self.told), None, message)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"task_id": self.task_id, "status": self.status}
        if self.cancel_sent:
            data["cancel_sent"] = True
        return data


CURRENT_NOTE: ContextVar[TaskNote | None] = ContextVar("cantrip_mcp_task_note", default=None)
"""Set by the gate call around ``tools/call``: the resolver (run in the call's own task)
writes the task it made there."""

Ask = Callable[[Any, Any], Awaitable[Any]]
"""The connection's elicitation callback: ``(context, params) -> ElicitResult | ErrorData``."""


@functools.cache
def _wire() -> Any:
    """The extension's messages as SDK models (built on first use: the SDK is imported
    only by a circle that has MCP servers)."""
    import mcp_types

    class _TaskId(mcp_types.RequestParams):
        task_id: str = pydantic.Field(alias="taskId")

    class _Update(_TaskId):
        input_responses: dict[str, Any] = pydantic.Field(alias="inputResponses")

    class _Get(mcp_types.Request[_TaskId, Literal["tasks/get"]]):
        method: Literal["tasks/get"] = "tasks/get"
        params: _TaskId
        name_param = "taskId"

    class _UpdateTask(mcp_types.Request[_Update, Literal["tasks/update"]]):
        method: Literal["tasks/update"] = "tasks/update"
        params: _Update
        name_param = "taskId"

    class _Cancel(mcp_types.Request[_TaskId, Literal["tasks/cancel"]]):
        method: Literal["tasks/cancel"] = "tasks/cancel"
        params: _TaskId
        name_param = "taskId"

    class _State(mcp_types.Result):
        model_config = pydantic.ConfigDict(extra="allow", populate_by_name=True)
        task_id: str = pydantic.Field(alias="taskId", min_length=1, max_length=200)
        status: str
        status_message: str | None = pydantic.Field(default=None, alias="statusMessage")
        poll_interval_ms: float | None = pydantic.Field(default=None, alias="pollIntervalMs")
        input_requests: dict[str, Any] | None = pydantic.Field(default=None, alias="inputRequests")
        result: dict[str, Any] | None = None

    class _Created(mcp_types.Result):
        """The task handle a ``tools/call`` answers (no ``inputRequests`` here: the SDK
        reserves that name of a result for the core protocol's rounds)."""

        model_config = pydantic.ConfigDict(extra="allow", populate_by_name=True)
        result_type: Literal["task"] = pydantic.Field(default="task", alias="resultType")
        task_id: str = pydantic.Field(alias="taskId", min_length=1, max_length=200)
        status: str
        status_message: str | None = pydantic.Field(default=None, alias="statusMessage")
        poll_interval_ms: float | None = pydantic.Field(default=None, alias="pollIntervalMs")
        result: dict[str, Any] | None = None

    return types.SimpleNamespace(
        TaskId=_TaskId,
        Update=_Update,
        Get=_Get,
        UpdateTask=_UpdateTask,
        Cancel=_Cancel,
        State=_State,
        Created=_Created,
    )


async def _answers(ask: Ask | None, requests: dict[str, Any]) -> dict[str, Any]:
    """The task's open questions asked (each an ``elicitation/create``), answered."""
    import mcp_types

    out: dict[str, Any] = {}
    for key, request in requests.items():
        method = request.get("method") if isinstance(request, dict) else None
        result: Any
        if method != "elicitation/create" or ask is None:
            result = mcp_types.ElicitResult(action="decline")
        else:
            params = pydantic.TypeAdapter(mcp_types.ElicitRequestParams).validate_python(
                request.get("params") or {}, by_alias=True
            )
            result = await ask(None, params)
            if isinstance(result, mcp_types.ErrorData):
                result = mcp_types.ElicitResult(action="decline")
        out[key] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return out


async def follow(session: Any, state: Any, ask: Ask | None, timeout_s: float) -> Any:
    """A task followed from ``state`` to its end: polled, its questions asked and
    answered, cancelled on the server if this call is cut off. The ``CallToolResult``."""
    import mcp_types

    wire = _wire()
    task_id = state.task_id
    note = CURRENT_NOTE.get()
    if note is not None:
        note.task_id = task_id
    answered: set[str] = set()
    polls = 0
    try:
        while True:
            if note is not None:
                note.status = state.status
                await note.tell(state.status_message)
            if state.status == "completed":
                if state.result is None:
                    raise ValueError(f"task {task_id} completed without a result")
                return mcp_types.CallToolResult.model_validate(state.result)
            if state.status in ("failed", "cancelled"):
                return mcp_types.CallToolResult(
                    content=[
                        mcp_types.TextContent(
                            text=f"the server's task {state.status}: "
                            f"{state.status_message or 'no message'}"
                        )
                    ],
                    is_error=True,
                )
            requests = getattr(state, "input_requests", None) or {}
            open_ = {k: v for k, v in requests.items() if k not in answered}
            if state.status == "input_required" and open_:
                responses = await _answers(ask, open_)
                answered.update(responses)
                await session.send_request(
                    wire.UpdateTask(params=wire.Update(taskId=task_id, inputResponses=responses)),
                    mcp_types.EmptyResult,
                    request_read_timeout_seconds=timeout_s,
                )
            else:
                await trio.sleep(poll_wait(state.poll_interval_ms, polls))
                polls += 1
            state = await get_task(session, task_id, timeout_s)
    except BaseException:
        # Cut off (cancelled, timed out, the connection lost): the server stops the
        # work. Bounded, and a server that cannot take it any more is only logged.
        with trio.CancelScope(shield=True), trio.move_on_after(CANCEL_GRACE_S):
            try:
                await session.send_request(
                    wire.Cancel(params=wire.TaskId(taskId=task_id)),
                    mcp_types.EmptyResult,
                    request_read_timeout_seconds=CANCEL_GRACE_S,
                )
                if note is not None:
                    note.cancel_sent = True
                log.info("task %s cancelled on the server", task_id)
            except Exception as exc:  # noqa: BLE001 -- the external-server boundary
                log.warning("task %s: tasks/cancel failed: %s", task_id, type(exc).__name__)
        raise


async def get_task(session: Any, task_id: str, timeout_s: float) -> Any:
    """``tasks/get``: the task's state as the server answers it."""
    wire = _wire()
    return await session.send_request(
        wire.Get(params=wire.TaskId(taskId=task_id)),
        wire.State,
        request_read_timeout_seconds=timeout_s,
    )


async def resume_task(session: Any, task_id: str, ask: Ask | None, timeout_s: float) -> Any:
    """A task a crashed attempt of this call started, followed to its end from what the
    server says of it now (its result, if it finished meanwhile); the call is never
    made a second time."""
    log.info("following task %s, started before a crash", task_id)
    return await follow(session, await get_task(session, task_id, timeout_s), ask, timeout_s)


def tasks_extension(ask: Ask | None, timeout_s: float) -> Any:
    """The SDK client extension that runs a task-augmented ``tools/call`` to its end;
    ``ask`` answers the task's input requests (None: they are declined). The task's id
    is saved as the call's checkpoint (:mod:`cantrip._checkpoint`) as soon as the server
    gives it, so a call cut off by a crash is followed, not made again."""
    import mcp_types
    from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim

    wire = _wire()

    async def resolve(created: Any, ctx: ClaimContext) -> mcp_types.CallToolResult:
        log.info("tools/call %s runs as task %s", ctx.tool_name, created.task_id)
        checkpoint = CURRENT_CHECKPOINT.get()
        if checkpoint is not None:
            await checkpoint.save({"mcp_task": created.task_id})
        result: mcp_types.CallToolResult = await follow(ctx.session, created, ask, timeout_s)
        return result

    class Tasks(ClientExtension):
        identifier = TASKS

        def claims(self) -> list[ResultClaim[Any]]:
            return [ResultClaim(result_type="task", model=wire.Created, resolve=resolve)]

    return Tasks()
