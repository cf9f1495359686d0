"""A2A's request handler and front (the card, the JSON-RPC endpoint), written once
over the session seam (both modes).

An A2A task is a prompt on a session plus the client's messages: the task's
``contextId`` is the session id, so later messages in the same context continue the
same conversation (and the loom thread). Where tasks are stored is the backend's
(:meth:`~cantrip.protocols.sessions.SessionBackend.submit_task` and its siblings:
rows of ``cantrip_a2a_tasks`` on PostgreSQL, any replica answers for any task; a
bounded map in process); what a request means is decided here:

* ``SendMessage`` submits the prompt with its task (``reject`` while the context runs
  another: the protocol's invalid params); a follow-up to an ``input-required`` task
  answers its pause and moves the task to the continuation in one step
  (``answer_task``), so of two follow-ups one answers and the other is ``-32602``.
* ``GetTask``/``ListTasks`` read the records (a task's state is its prompt's, mapped
  by :func:`~cantrip.protocols.a2a._server.settle`); ``CancelTask`` cancels the prompt
  by id (the cast is cut off and recorded), or marks a task that waits for input
  cancelled (its pause stays in the loom).
* Streams (``SendStreamingMessage``, ``SubscribeToTask``) follow the session until the
  task's prompt ends (``follow(..., until=prompt_id)``): a ``working`` update per
  event (in process every event of the cast, on PostgreSQL one per recorded turn:
  ``capabilities.token_events``), then the final status (and artifact).
* Push notifications where ``backend.capabilities.a2a_push`` says so (a webhook's
  credentials live in one process's memory): each task with a config is followed
  in :meth:`A2AHandler.run`'s nursery and its updates POSTed (:mod:`._push`).

Errors: the seam raises :class:`~cantrip.protocols.sessions._hub.SessionError` and
:class:`~cantrip.PauseError` only; :func:`protocol_errors` maps them to the protocol's
JSON-RPC errors, once, for both modes (a client's mistake is invalid params, the
server's state an internal error). Before anything is submitted, ``admit`` (the
server's lifecycle: room for a session in memory, a replica's drain and load) may
refuse with a ``SessionError``.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import trio

from cantrip._approval import PauseError
from cantrip._cantrip import Cantrip
from cantrip._redact import get_logger
from cantrip.protocols.a2a._push import Pushes
from cantrip.protocols.a2a._server import (
    AGENT_CARD_PATH,
    CANCEL_WAIT_S,
    ENDPOINT,
    LIST_SCAN,
    TaskView,
    _base_url,
    _quiet_sdk_logs,
    agent_card,
    cancelled_waiting,
    check_follow_up,
    check_message,
    decision_for,
    failed,
    header_refusal,
    progress,
    prompt_of,
    settle,
    state_name,
    working,
)
from cantrip.protocols.asgi._responses import Receive, Scope, Send
from cantrip.protocols.sessions import (
    SessionBackend,
    SessionError,
    SessionInfo,
    SessionRef,
    TaskRecord,
    follow_through,
)

log = get_logger("cantrip.a2a")

Admit = Callable[[str | None], Awaitable[None]]
"""Asked before a prompt is submitted for a session (None: a new one is made); raises
:class:`SessionError` (``overloaded``, ``shutting_down``...) to refuse."""

_CLIENT_KINDS = frozenset({"not_found", "busy", "key_reused", "not_running", "bad_request"})
"""Refusals that are the client's to fix: the protocol's invalid params."""


@contextlib.contextmanager
def protocol_errors() -> Iterator[None]:
    """The seam's errors as the protocol's (the one place they are mapped); anything
    else from below (a lost database) is an internal error that names no detail."""
    from a2a.utils.errors import A2AError, InternalError, InvalidParamsError

    try:
        yield
    except A2AError:
        raise
    except SessionError as exc:
        if exc.kind in _CLIENT_KINDS:
            raise InvalidParamsError(message=exc.message) from None
        raise InternalError(message=f"{exc.kind}: {exc.message}") from None
    except PauseError as exc:
        raise InvalidParamsError(message=f"the pause is not waiting: {exc}") from None
    except Exception as exc:  # the protocol's boundary: the client gets JSON-RPC's shape
        log.exception("a2a: the session backend failed")
        raise InternalError(message=f"the server failed: {type(exc).__name__}") from None


def view_of(record: TaskRecord, *, fresh: bool = False) -> tuple[TaskView, list[Any]]:
    """The task a record makes, and the events that told its settling (none while its
    prompt runs; ``fresh``: as it was submitted, working, whatever its prompt did since)."""
    from a2a.types import a2a_pb2 as pb
    from google.protobuf.json_format import Parse

    task = TaskView(
        id=record.task_id,
        context_id=record.session_id,
        state=pb.TASK_STATE_WORKING,
        seq=record.seq,
        history=[Parse(m, pb.Message(), ignore_unknown_fields=True) for m in record.messages],
    )
    working(task)
    final: list[Any] = []
    if fresh:
        pass
    elif record.canceled:
        final = cancelled_waiting(task)
    elif record.state == "failed":
        final = failed(task, record.failure or "the cast failed")
    elif record.state == "ended":
        final = settle(task, record.result, stamp=record.prompt_id)
    task.updated = record.updated
    for event in final:  # the status in the events says when, too
        if isinstance(event, pb.TaskStatusUpdateEvent):
            event.status.CopyFrom(task.status())
    return task, final


class A2AHandler:
    """The SDK's :class:`RequestHandler` over a :class:`SessionBackend`."""

    def __init__(
        self,
        backend: SessionBackend,
        *,
        pushes: Pushes | None = None,
        admit: Admit | None = None,
    ) -> None:
        self.backend = backend
        self.push = pushes if backend.capabilities.a2a_push else None
        """Where task updates go to webhooks (None: not served, the card says so)."""
        self.admit = admit
        self._nursery: trio.Nursery | None = None
        self._pushing: set[tuple[str, str]] = set()
        """(task, prompt) pairs whose updates are being pushed."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Deliver push notifications until cancelled (the server's lifetime)."""
        async with trio.open_nursery() as nursery:
            if self.push is not None:
                await nursery.start(self.push.run)
            self._nursery = nursery
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None

    # -- tasks -------------------------------------------------------------------------

    async def _find(self, task_id: str) -> TaskRecord | None:
        with protocol_errors():
            return await self.backend.task(task_id)

    async def _require(self, task_id: str) -> TaskRecord:
        from a2a.utils.errors import TaskNotFoundError

        record = await self._find(task_id)
        if record is None:
            raise TaskNotFoundError(message=f"no task {task_id!r}")
        return record

    async def _turns(self, session_id: str) -> int:
        """How many turns the session has: a task's events are followed from here."""
        return (await self._session(session_id)).turns

    async def _session(self, session_id: str) -> SessionInfo:
        """The session, read (its ``turns``: a task's events are followed from there)."""
        with protocol_errors():
            return await self.backend.find(session_id)

    async def _send(self, message: Any) -> tuple[TaskRecord, SessionInfo]:
        """Start the task ``message`` asks for (a new prompt, or the answer to a paused
        task); the task, and its session as read before it started (its ``turns``: where
        the task's events begin) -- the request's one read of it, handed down to the
        task's result and events (issue 46)."""
        from a2a.utils.errors import InvalidParamsError
        from google.protobuf.json_format import MessageToJson

        check_message(message)
        backend = self.backend
        if message.task_id:
            record = await self._require(message.task_id)
            task, _ = view_of(record)
            pause_id = check_follow_up(task)
            decision = decision_for(task, message)
            with protocol_errors():
                if self.admit is not None:
                    await self.admit(record.session_id)
                info = await self._session(record.session_id)
                message.context_id = record.session_id
                moved = await backend.answer_task(
                    record.task_id, record.prompt_id, pause_id, decision, MessageToJson(message)
                )
            if moved is None:
                raise InvalidParamsError(message=f"task {record.task_id} moved on meanwhile")
            return moved, info
        text = prompt_of(message)
        with protocol_errors():
            if self.admit is not None:
                await self.admit(message.context_id or None)
            if message.context_id:
                try:
                    info = await backend.find(message.context_id)
                except SessionError as exc:
                    raise InvalidParamsError(message=f"unknown contextId: {exc.message}") from None
            else:
                info, _ = await backend.create()
            message.context_id = info.session_id
            message.task_id = uuid.uuid4().hex
            try:
                record = await backend.submit_task(
                    info.session_id, text, task_id=message.task_id, message=MessageToJson(message)
                )
            except SessionError as exc:
                if exc.kind != "busy":
                    raise
                raise InvalidParamsError(
                    message=f"context {info.session_id} is running another task: "
                    "wait for it or cancel it"
                ) from None
        return record, info

    async def _settled(self, record: TaskRecord, session: SessionRef | None = None) -> TaskRecord:
        """The task once its prompt has ended (``session``: its session as this request
        read it, not read again)."""
        if record.state == "open":
            with protocol_errors(), contextlib.suppress(SessionError):  # failed: it says so
                await self.backend.result(session or record.session_id, record.prompt_id)
        return await self._require(record.task_id)

    async def _events(
        self,
        record: TaskRecord,
        after: int,
        *,
        fresh: bool = False,
        session: SessionRef | None = None,
    ) -> AsyncIterator[Any]:
        """A ``working`` update per event of the task's prompt (the session's turns
        after ``after`` first), then its final events. A task not working now has none
        -- unless it is ``fresh`` (just submitted or answered: its prompt may have ended
        already, and its events are told all the same)."""
        task, _ = view_of(record, fresh=True)
        if record.canceled or not (fresh or record.state == "open"):
            return
        named = session or record.session_id  # (as this request read it: not again)
        events = follow_through(self.backend, named, after, until=record.prompt_id)
        async with contextlib.aclosing(events):
            while True:
                with protocol_errors():
                    event = await anext(events, None)
                if event is None:
                    break
                update = progress(task, event.data)
                if update is not None:
                    yield update
        _, final = view_of(await self._require(record.task_id))
        for event in final:
            yield event

    # -- what the dispatcher calls ----------------------------------------------------

    async def on_message_send(self, params: Any, context: Any) -> Any:
        length = self._history_length(params.configuration)
        push = await self._checked_push(params.configuration)  # refused before anything runs
        record, info = await self._send(params.message)
        self._keep_push(record, push, info.turns)
        if not params.configuration.return_immediately:
            record = await self._settled(record, info)
        return view_of(record)[0].to_proto(length)

    async def on_message_send_stream(self, params: Any, context: Any) -> AsyncIterator[Any]:
        push = await self._checked_push(params.configuration)
        record, info = await self._send(params.message)
        self._keep_push(record, push, info.turns)
        yield view_of(record, fresh=True)[0].to_proto()
        async for event in self._events(record, info.turns, fresh=True, session=info):
            yield event

    async def on_subscribe_to_task(self, params: Any, context: Any) -> AsyncIterator[Any]:
        """The task, then its events until it stops working (a terminal task is the SDK's
        ``UnsupportedOperationError``, as its own handler answers)."""
        from a2a.utils.errors import UnsupportedOperationError

        record = await self._require(params.id)
        task, _ = view_of(record)
        if task.terminal:
            raise UnsupportedOperationError(
                message=f"task {task.id} is in a terminal state: {state_name(task.state)}"
            )
        before = await self._turns(record.session_id)
        yield task.to_proto()
        async for event in self._events(await self._require(params.id), before):
            yield event

    async def on_get_task(self, params: Any, context: Any) -> Any:
        record = await self._find(params.id)
        if record is None:
            return None
        return view_of(record)[0].to_proto(self._history_length(params))

    async def on_cancel_task(self, params: Any, context: Any) -> Any:
        from a2a.types import a2a_pb2 as pb
        from a2a.utils.errors import TaskNotCancelableError

        record = await self._find(params.id)
        if record is None:
            return None
        task, _ = view_of(record)
        if task.terminal:
            raise TaskNotCancelableError(message=f"task {task.id} is {state_name(task.state)}")
        with protocol_errors():
            if task.state == pb.TASK_STATE_INPUT_REQUIRED:
                cut = await self.backend.cancel_waiting_task(record.task_id, record.prompt_id)
                if cut is not None:  # the pause stays in the loom, the task takes no answer
                    self._push_now(cut)
                    return view_of(cut)[0].to_proto()
            now = await self._require(record.task_id)
            if now.state == "open":
                await self.backend.cancel(now.session_id, prompt_id=now.prompt_id)
                with trio.move_on_after(CANCEL_WAIT_S):
                    await self._settled(now)
        return view_of(await self._require(record.task_id))[0].to_proto()

    async def on_list_tasks(self, params: Any, context: Any) -> Any:
        """Newest first; ``pageToken`` is opaque (the ``seq`` of the last task sent)."""
        from a2a.types import a2a_pb2 as pb
        from a2a.utils.constants import DEFAULT_LIST_TASKS_PAGE_SIZE, MAX_LIST_TASKS_PAGE_SIZE
        from a2a.utils.errors import InvalidParamsError

        length = self._history_length(params)
        size = params.page_size if params.HasField("page_size") else DEFAULT_LIST_TASKS_PAGE_SIZE
        if not 1 <= size <= MAX_LIST_TASKS_PAGE_SIZE:
            raise InvalidParamsError(message=f"pageSize must be 1..{MAX_LIST_TASKS_PAGE_SIZE}")
        before = None
        if params.page_token:
            token = params.page_token.removeprefix("t")
            if not (token.isdigit() and len(token) < 19):
                raise InvalidParamsError(message="pageToken is not one this server handed out")
            before = int(token)
        after = (
            params.status_timestamp_after.ToNanoseconds() / 1e9
            if params.HasField("status_timestamp_after")
            else None
        )
        with protocol_errors():
            records = await self.backend.tasks(
                params.context_id or None, before=before, limit=LIST_SCAN
            )
        tasks = [
            t
            for t in (view_of(r)[0] for r in records)
            if (not params.status or t.state == params.status)
            and (after is None or t.updated >= after)
        ]
        page = tasks[:size]
        more = len(tasks) > size
        return pb.ListTasksResponse(
            tasks=[t.to_proto(length, artifacts=params.include_artifacts) for t in page],
            next_page_token=f"t{page[-1].seq}" if more else "",
            page_size=size,
            total_size=len(tasks) if before is None else 0,
        )

    # -- push notifications (where the backend serves them) ---------------------------

    def _pushes(self) -> Pushes:
        from a2a.utils.errors import PushNotificationNotSupportedError

        if self.push is None:
            raise PushNotificationNotSupportedError
        return self.push

    async def _checked_push(self, configuration: Any) -> Any:
        """The push config a message comes with, checked (None if it has none)."""
        if not configuration.HasField("task_push_notification_config"):
            return None
        return await self._pushes().check(configuration.task_push_notification_config)

    def _keep_push(self, record: TaskRecord, config: Any, before: int) -> None:
        if config is not None:
            config.task_id = record.task_id
            self._pushes().keep(config)
        self._push_along(record, before)

    def _push_along(self, record: TaskRecord, before: int) -> None:
        """Push the task's updates from here until its prompt ends, if it has configs."""
        push, nursery = self.push, self._nursery
        key = (record.task_id, record.prompt_id)
        if push is None or nursery is None or not push.configs(record.task_id):
            return
        if record.canceled or key in self._pushing:
            return
        self._pushing.add(key)

        async def along() -> None:
            try:
                push.notify(record.task_id, view_of(record, fresh=True)[0].status_event())
                async for event in self._events(record, before, fresh=True):
                    push.notify(record.task_id, event)
            except Exception:  # the boundary of one task's pushes: the server goes on
                log.exception("a2a task %s: its push notifications stopped", record.task_id)
            finally:
                self._pushing.discard(key)

        nursery.start_soon(along)

    def _push_now(self, record: TaskRecord) -> None:
        """The final events of a task that settled without its prompt (a cancel)."""
        if self.push is not None:
            for event in view_of(record)[1]:
                self.push.notify(record.task_id, event)

    async def on_create_task_push_notification_config(self, params: Any, context: Any) -> Any:
        pushes = self._pushes()
        record = await self._require(params.task_id)
        kept = pushes.keep(await pushes.check(params))
        self._push_along(record, await self._turns(record.session_id))
        return kept

    async def on_get_task_push_notification_config(self, params: Any, context: Any) -> Any:
        pushes = self._pushes()
        await self._require(params.task_id)
        return pushes.get(params.task_id, params.id)

    async def on_list_task_push_notification_configs(self, params: Any, context: Any) -> Any:
        from a2a.types import a2a_pb2 as pb

        pushes = self._pushes()
        await self._require(params.task_id)
        return pb.ListTaskPushNotificationConfigsResponse(configs=pushes.configs(params.task_id))

    async def on_delete_task_push_notification_config(self, params: Any, context: Any) -> None:
        pushes = self._pushes()
        await self._require(params.task_id)
        pushes.delete(params.task_id, params.id)

    async def on_get_extended_agent_card(self, params: Any, context: Any) -> Any:
        from a2a.utils.errors import ExtendedAgentCardNotConfiguredError

        raise ExtendedAgentCardNotConfiguredError

    @staticmethod
    def _history_length(config: Any) -> int | None:
        from a2a.utils.errors import InvalidParamsError

        if not config.HasField("history_length"):
            return None
        if config.history_length < 0:
            raise InvalidParamsError(message="historyLength must not be negative")
        return int(config.history_length)


class A2AFront:
    """The Agent Card and the JSON-RPC endpoint of one server, over its session backend
    (either mode): ``pushes`` where ``backend.capabilities.a2a_push`` says so, ``admit``
    the server's lifecycle check before a prompt is submitted
    (:class:`A2AHandler`). :meth:`run` delivers push
    notifications for as long as the server serves."""

    def __init__(
        self,
        spell: Cantrip,
        backend: SessionBackend,
        *,
        pushes: Pushes | None = None,
        admit: Admit | None = None,
    ) -> None:
        from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher

        self.spell = spell
        self.handler = A2AHandler(backend, pushes=pushes, admit=admit)
        _quiet_sdk_logs()
        self.dispatcher = JsonRpcDispatcher(
            self.handler,  # type: ignore[arg-type]
            enable_v0_3_compat=True,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Deliver push notifications until cancelled (nothing to do without them)."""
        await self.handler.run(task_status=task_status)

    async def dispatch(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Answer the request if it is A2A's (True), else leave it to the API's routes."""
        path = scope.get("path", "")
        if path not in (AGENT_CARD_PATH, ENDPOINT):
            return False
        from cantrip.protocols.asgi._requests import allow
        from cantrip.protocols.asgi._responses import json_response

        if path == AGENT_CARD_PATH:
            allow(scope["method"], "GET")
            from google.protobuf.json_format import MessageToDict

            url = _base_url(scope) + ENDPOINT
            card = agent_card(self.spell, url, push=self.handler.push is not None)
            await json_response(send, 200, MessageToDict(card))
            return True
        allow(scope["method"], "POST")
        refusal = header_refusal(scope)
        if refusal is not None:  # JSON-RPC's shape, as the guard's refusals here
            error = {"code": -32600, "message": f"Invalid Request: {refusal}"}
            await json_response(send, 200, {"jsonrpc": "2.0", "id": None, "error": error})
            return True
        from starlette.requests import Request

        asgi: Any = (scope, receive, send)  # starlette's types want mutable mappings
        response = await self.dispatcher.handle_requests(Request(asgi[0], asgi[1]))
        await response(*asgi)
        return True
