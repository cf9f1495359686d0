"""A2A (Agent2Agent) on ``cantrip serve``: an Agent Card and the JSON-RPC binding.

Other agents (Google ADK, LangGraph, pydantic-ai, CrewAI...) talk to a remote
agent through A2A: they read its Agent Card at ``/.well-known/agent-card.json``
and send it messages over JSON-RPC at the URL the card names (``/a2a`` here).
The official ``a2a-sdk`` does the protocol: its :class:`JsonRpcDispatcher`
parses and validates every request, answers bad ones with the protocol's own
JSON-RPC errors, serialises the protobuf types and streams over SSE; it speaks
A2A 1.0 (``SendMessage``, ``SendStreamingMessage``, ``GetTask``, ``CancelTask``)
and, with its compatibility adapter, 0.3 (``message/send``, ``message/stream``,
``tasks/get``, ``tasks/cancel``). What is cantrip's is :class:`SessionTasks`, the
SDK's :class:`RequestHandler`: an A2A task is one prompt on a session, and the
task's ``contextId`` is the session id, so later messages in the same context
continue the same conversation (and the loom thread).

A paused cast (an approval or an ``ask_user`` question) is a task in
``input-required``: its status message says what is asked, and the next
message sent with that ``taskId`` answers the pause (text answers a question;
``approve``/``yes`` or ``deny``/``no`` answer an approval, or a data part that
is the HTTP API's answer body). ``CancelTask`` cancels the running cast
(recorded as ``cancelled`` in the loom).

The endpoint lives behind the same :class:`~cantrip.protocols._guard.Guard` as
the HTTP API (Host, Origin, token, body limits); :func:`jsonrpc_refusals` turns
the guard's body refusals on the A2A endpoint into JSON-RPC errors, so an A2A
client gets the protocol's error shape for bad JSON too. Every text that leaves
comes from the redacted result and event dicts of :mod:`._sessions`.

The SDK is optional (``pip install 'cantrip-runtime[a2a]'``); without it these paths are
not served (404) and nothing of it is imported.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import attrs
import trio

from cantrip._approval import Decision, PauseError
from cantrip._cantrip import Cantrip
from cantrip._errors import CantripError
from cantrip._events import Event
from cantrip._outcome import CastResult, result_dict
from cantrip._redact import get_logger, redact
from cantrip.protocols._api import AnswerRequest
from cantrip.protocols._asgi import Receive, Scope, Send
from cantrip.protocols._guard import guard_refusals_as_jsonrpc
from cantrip.protocols._limits import SessionLimits, make_room
from cantrip.protocols._sessions import (
    Session,
    SessionError,
    SessionHub,
    event_dict,
)

log = get_logger("cantrip.a2a")

AGENT_CARD_PATH = "/.well-known/agent-card.json"
ENDPOINT = "/a2a"
MAX_TASKS = 1000
"""Tasks kept for ``GetTask`` (the oldest settled ones are forgotten first)."""
CANCEL_WAIT_S = 10.0
"""How long ``CancelTask`` waits for the cast to record its cancellation."""

_YES = frozenset({"approve", "approved", "yes", "y", "ok", "allow"})
_NO = frozenset({"deny", "denied", "no", "n", "reject"})


@functools.cache
def available() -> bool:
    """Whether the ``a2a-sdk`` extra (with Starlette for its JSON-RPC binding) is installed.

    The first call imports the SDK (protobuf and all: a few hundred ms), so a server
    makes it in a worker thread before it starts (:func:`serve_http`)."""
    try:
        import a2a.server.routes.jsonrpc_dispatcher  # noqa: F401
        import sse_starlette  # noqa: F401
    except ImportError:
        return False
    return True


def agent_card(spell: Cantrip, url: str) -> Any:
    """The Agent Card of ``spell`` served at ``url`` (an ``a2a.types.AgentCard``).

    Name and description come from the cantrip (its id; the identity's system
    prompt, else what it does), one skill per gate (its name and description),
    and the capability the endpoint has: streaming, no push notifications."""
    from a2a.types import a2a_pb2 as pb
    from a2a.utils.constants import PROTOCOL_VERSION_CURRENT, TransportProtocol

    circle = spell.circle
    system = (spell.identity.system_prompt or "").strip()
    gates = [g for g in circle.gates if g.name != "done"]
    description = system.split("\n\n")[0][:500] or (
        f"A cantrip entity ({circle.medium.name} medium) with the gates "
        + (", ".join(g.name for g in gates) or "done")
    )
    skills = [
        pb.AgentSkill(
            id=g.name,
            name=g.name,
            description=(g.description or g.name).strip()[:500],
            tags=["gate", circle.medium.name],
        )
        for g in gates
    ] or [
        pb.AgentSkill(
            id="answer", name="answer", description=description, tags=[circle.medium.name]
        )
    ]
    return pb.AgentCard(
        name=spell.id,
        description=description,
        version="1.0.0",
        supported_interfaces=[
            pb.AgentInterface(
                url=url,
                protocol_binding=TransportProtocol.JSONRPC,
                protocol_version=PROTOCOL_VERSION_CURRENT,
            )
        ],
        capabilities=pb.AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=["text/plain", "application/json"],
        default_output_modes=["text/plain", "application/json"],
        skills=skills,
    )


# -- tasks ------------------------------------------------------------------------


@attrs.define(eq=False)
class Task:
    """One A2A task: a prompt (and the answers to its pauses) on one session."""

    id: str
    session: Session
    state: int
    history: list[Any] = attrs.field(factory=list)
    artifacts: list[Any] = attrs.field(factory=list)
    status_message: Any = None
    pause_id: str | None = None
    pause_kind: str | None = None
    settled: trio.Event = attrs.field(factory=trio.Event)
    """Set when the task stops working (a terminal state or ``input-required``)."""
    watchers: list[trio.MemorySendChannel[Any]] = attrs.field(factory=list)
    running: bool = False

    def to_proto(self, history_length: int | None = None) -> Any:
        from a2a.types import a2a_pb2 as pb

        history = self.history if history_length is None else self.history[-history_length:]
        if history_length == 0:
            history = []
        status = pb.TaskStatus(state=self.state)  # type: ignore[arg-type]
        if self.status_message is not None:
            status.message.CopyFrom(self.status_message)
        return pb.Task(
            id=self.id,
            context_id=self.session.id,
            status=status,
            history=history,
            artifacts=self.artifacts,
        )

    def status_event(self) -> Any:
        from a2a.types import a2a_pb2 as pb

        return pb.TaskStatusUpdateEvent(
            task_id=self.id, context_id=self.session.id, status=self.to_proto().status
        )

    def publish(self, event: Any) -> None:
        for channel in list(self.watchers):
            try:
                channel.send_nowait(event)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.watchers.remove(channel)

    def close_watchers(self) -> None:
        for channel in self.watchers:
            channel.close()
        self.watchers.clear()


def _state_name(state: int) -> str:
    from a2a.types import a2a_pb2 as pb

    return str(pb.TaskState.Name(state))


def _text_of(message: Any) -> str:
    """A message's parts as one prompt: text as is, data as JSON."""
    from google.protobuf.json_format import MessageToDict

    pieces: list[str] = []
    for part in message.parts:
        kind = part.WhichOneof("content")
        if kind == "text":
            pieces.append(part.text)
        elif kind == "data":
            pieces.append(json.dumps(MessageToDict(part.data)))
        elif kind == "url":
            pieces.append(part.url)
    return "\n".join(p for p in pieces if p)


def _data_of(message: Any) -> dict[str, Any] | None:
    from google.protobuf.json_format import MessageToDict

    for part in message.parts:
        if part.WhichOneof("content") == "data":
            value = MessageToDict(part.data)
            if isinstance(value, dict):
                return value
    return None


def _agent_message(task: Task, text: str | None, data: Any = None) -> Any:
    from a2a.types import a2a_pb2 as pb
    from google.protobuf import struct_pb2

    parts = []
    if text:
        parts.append(pb.Part(text=redact(text)))
    if data is not None:
        value = struct_pb2.Value()
        from google.protobuf.json_format import ParseDict

        ParseDict(data, value)
        parts.append(pb.Part(data=value))
    return pb.Message(
        message_id=uuid.uuid4().hex,
        context_id=task.session.id,
        task_id=task.id,
        role=pb.ROLE_AGENT,
        parts=parts,
    )


class SessionTasks:
    """The SDK's request handler over a :class:`SessionHub` (see the module docstring).

    Casts run in the hub's nursery (the server's lifetime), not in the request:
    a task goes on when the client that sent it hangs up, so ``GetTask`` and
    ``CancelTask`` from another connection see and reach it."""

    def __init__(
        self, hub: SessionHub, limits: SessionLimits | None = None, max_tasks: int = MAX_TASKS
    ) -> None:
        self.hub = hub
        self.limits = limits or SessionLimits()
        self.tasks: dict[str, Task] = {}
        self.max_tasks = max_tasks

    # -- what the dispatcher calls ----------------------------------------------------

    async def on_message_send(self, params: Any, context: Any) -> Any:
        task = await self._start(params)
        if not params.configuration.return_immediately:
            await task.settled.wait()
        return task.to_proto(self._history_length(params))

    async def on_message_send_stream(self, params: Any, context: Any) -> AsyncGenerator[Any]:
        task = await self._start(params)
        send, receive = trio.open_memory_channel[Any](float("inf"))
        task.watchers.append(send)
        yield task.to_proto()
        if task.settled.is_set():  # settled before we subscribed (a replayed answer)
            send.close()
        async with receive:
            async for event in receive:
                yield event

    async def on_get_task(self, params: Any, context: Any) -> Any:
        task = self.tasks.get(params.id)
        if task is None:
            return None
        return task.to_proto(params.history_length if params.HasField("history_length") else None)

    async def on_cancel_task(self, params: Any, context: Any) -> Any:
        from a2a.types import a2a_pb2 as pb
        from a2a.utils.errors import TaskNotCancelableError

        task = self.tasks.get(params.id)
        if task is None:
            return None
        if task.state not in (
            pb.TASK_STATE_SUBMITTED,
            pb.TASK_STATE_WORKING,
            pb.TASK_STATE_INPUT_REQUIRED,
        ):
            raise TaskNotCancelableError(message=f"task {task.id} is {_state_name(task.state)}")
        if task.running:
            self.hub.cancel(task.session)
            with trio.move_on_after(CANCEL_WAIT_S):
                while task.running:
                    await task.settled.wait()
        else:  # paused: the pause stays in the loom, the task no longer takes its answer
            task.state = pb.TASK_STATE_CANCELED
            task.pause_id = None
            task.status_message = _agent_message(task, "cancelled while waiting for input")
            task.publish(task.status_event())
            task.close_watchers()
        return task.to_proto()

    async def on_list_tasks(self, params: Any, context: Any) -> Any:
        from a2a.utils.errors import UnsupportedOperationError

        raise UnsupportedOperationError(message="tasks/list is not served")

    async def _unsupported(self, *args: Any, **kwargs: Any) -> Any:
        from a2a.utils.errors import PushNotificationNotSupportedError

        raise PushNotificationNotSupportedError

    on_create_task_push_notification_config = _unsupported
    on_get_task_push_notification_config = _unsupported
    on_list_task_push_notification_configs = _unsupported
    on_delete_task_push_notification_config = _unsupported

    def on_subscribe_to_task(self, params: Any, context: Any) -> AsyncGenerator[Any]:
        """Refused when called (the dispatcher answers the error before streaming)."""
        from a2a.utils.errors import UnsupportedOperationError

        raise UnsupportedOperationError(message="resubscribing is not served")

    async def on_get_extended_agent_card(self, params: Any, context: Any) -> Any:
        from a2a.utils.errors import ExtendedAgentCardNotConfiguredError

        raise ExtendedAgentCardNotConfiguredError

    # -- starting and running a task ----------------------------------------------------

    @staticmethod
    def _history_length(params: Any) -> int | None:
        config = params.configuration
        return config.history_length if config.HasField("history_length") else None

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

    async def _start(self, params: Any) -> Task:
        """Start the task ``params.message`` asks for (a new prompt, or the answer to a
        paused task); errors are the SDK's, so the client gets JSON-RPC errors."""
        from a2a.types import a2a_pb2 as pb
        from a2a.utils.errors import InternalError, InvalidParamsError, TaskNotFoundError

        message = params.message
        if not message.parts:
            raise InvalidParamsError(message="the message has no parts")
        nursery = self.hub.nursery
        if nursery is None:
            raise InternalError(message="the server is not running")
        if message.task_id:
            task = self.tasks.get(message.task_id)
            if task is None:
                raise TaskNotFoundError(message=f"no task {message.task_id!r}")
            if task.state != pb.TASK_STATE_INPUT_REQUIRED or task.pause_id is None:
                raise InvalidParamsError(
                    message=f"task {task.id} is {_state_name(task.state)}: "
                    "only a task that needs input takes a follow-up message; send a new "
                    "message with its contextId to go on in the conversation"
                )
            decision = self._decision(task, message)
            await self._room(adding=task.session.id not in self.hub.sessions)
            task.session = self._session(task.session.id)  # it may have been evicted meanwhile
            task.history.append(message)
            self._working(task)
            pause_id, task.pause_id = task.pause_id, None
            answer = functools.partial(self.hub.answer, task.session, pause_id, decision)
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
        text = _text_of(message)
        if not text.strip():
            raise InvalidParamsError(message="the message has no text or data to act on")
        task = Task(id=uuid.uuid4().hex, session=session, state=pb.TASK_STATE_SUBMITTED)
        message.context_id = session.id
        message.task_id = task.id
        task.history.append(message)
        self._remember(task)
        self._working(task)
        nursery.start_soon(self._run, task, functools.partial(self.hub.prompt, session, text))
        return task

    def _decision(self, task: Task, message: Any) -> Decision:
        from a2a.utils.errors import InvalidParamsError

        data = _data_of(message)
        try:
            if data is not None:
                decision: Decision = AnswerRequest.model_validate(data).decision_value()
                return decision
            text = _text_of(message).strip()
            if task.pause_kind == "question":
                return Decision("answer", text=text)
            word = text.lower().rstrip(".!")
            if word in _YES:
                return Decision.approve()
            if word in _NO:
                return Decision.deny()
        except (PauseError, ValueError) as exc:
            raise InvalidParamsError(message=f"not an answer to the pause: {exc}") from None
        raise InvalidParamsError(
            message="the task waits for approval: answer 'approve' or 'deny' (or send a data "
            'part such as {"decision": "approve"})'
        )

    def _remember(self, task: Task) -> None:
        self.tasks[task.id] = task
        while len(self.tasks) > self.max_tasks:
            oldest = next(
                (t for t in self.tasks.values() if not t.running and t.pause_id is None), None
            )
            if oldest is None:
                break
            del self.tasks[oldest.id]

    def _working(self, task: Task) -> None:
        from a2a.types import a2a_pb2 as pb

        task.state = pb.TASK_STATE_WORKING
        task.status_message = None
        task.running = True
        task.settled = trio.Event()

    async def _run(self, task: Task, cast: Callable[..., Awaitable[CastResult | None]]) -> None:
        """The cast behind ``task``; its outcome becomes the task's state (the boundary of a
        child entity: a crash fails the task, the server goes on)."""
        from a2a.types import a2a_pb2 as pb

        def sink(event: Event) -> None:
            data = event_dict(event)
            if data["type"] in ("text_delta", "thinking_delta"):
                return  # deltas: the final answer carries the text
            update = pb.TaskStatusUpdateEvent(
                task_id=task.id,
                context_id=task.session.id,
                status=pb.TaskStatus(
                    state=pb.TASK_STATE_WORKING, message=_agent_message(task, None, data)
                ),
            )
            task.publish(update)

        try:
            outcome = await cast(on_event=sink)
        except SessionError as exc:
            self._fail(task, f"{exc.kind}: {exc.message}")
        except PauseError as exc:
            self._fail(task, f"the answer was refused: {exc}")
        except CantripError as exc:
            self._fail(task, f"the cast failed: {exc}")
        except Exception as exc:
            log.exception("a2a task %s: the entity crashed", task.id)
            self._fail(task, f"the entity crashed: {exc!r}")
        else:
            self._settle(task, outcome)
        finally:
            task.running = False
            task.settled.set()
            task.close_watchers()

    def _fail(self, task: Task, text: str) -> None:
        from a2a.types import a2a_pb2 as pb

        task.state = pb.TASK_STATE_FAILED
        task.status_message = _agent_message(task, text)
        task.publish(task.status_event())

    def _settle(self, task: Task, outcome: Any) -> None:
        """The task's state from the cast's outcome, published to its streams."""
        from a2a.types import a2a_pb2 as pb

        data = result_dict(outcome, task.session)  # redacted
        reason = data.get("reason")
        pending = data.get("pending") or []
        if outcome is None or data["stop_reason"] == "cancelled":
            task.state = pb.TASK_STATE_CANCELED
            task.status_message = _agent_message(task, data.get("summary") or "cancelled", data)
        elif reason == "paused" and pending:
            pause = pending[0]
            task.state = pb.TASK_STATE_INPUT_REQUIRED
            task.pause_id = pause["pause_id"]
            task.pause_kind = pause.get("kind")
            if task.pause_kind == "question":
                ask = pause.get("question") or "the entity asks a question"
            else:
                ask = (
                    f"approve the call of {pause['gate']} with {json.dumps(pause['args'])}? "
                    "answer 'approve' or 'deny'"
                )
            task.status_message = _agent_message(task, ask, pause)
        elif data.get("terminated"):
            task.state = pb.TASK_STATE_COMPLETED
            result = data.get("result")
            text = result if isinstance(result, str) else None
            answer = _agent_message(task, text, None if text is not None else result)
            artifact = pb.Artifact(artifact_id=uuid.uuid4().hex, name="result", parts=answer.parts)
            task.artifacts.append(artifact)
            task.history.append(answer)
            task.publish(
                pb.TaskArtifactUpdateEvent(
                    task_id=task.id,
                    context_id=task.session.id,
                    artifact=artifact,
                    last_chunk=True,
                )
            )
        else:  # stopped by a ward or a limit without an answer
            task.state = pb.TASK_STATE_FAILED
            task.status_message = _agent_message(
                task, f"stopped without an answer ({reason}): {data.get('summary') or ''}", data
            )
        task.publish(task.status_event())


# -- the ASGI side ------------------------------------------------------------------------


class A2AFront:
    """The Agent Card and the JSON-RPC endpoint of one server (in-process sessions)."""

    def __init__(
        self, spell: Cantrip, hub: SessionHub, limits: SessionLimits | None = None
    ) -> None:
        from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher

        self.spell = spell
        self.handler = SessionTasks(hub, limits)
        self.dispatcher = JsonRpcDispatcher(
            self.handler,  # type: ignore[arg-type]
            enable_v0_3_compat=True,
        )

    async def dispatch(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Answer the request if it is A2A's (True), else leave it to the API's routes."""
        path = scope.get("path", "")
        if path not in (AGENT_CARD_PATH, ENDPOINT):
            return False
        from cantrip.protocols._asgi import json_response
        from cantrip.protocols._request import allow

        if path == AGENT_CARD_PATH:
            allow(scope["method"], "GET")
            from google.protobuf.json_format import MessageToDict

            card = agent_card(self.spell, _base_url(scope) + ENDPOINT)
            await json_response(send, 200, MessageToDict(card))
            return True
        allow(scope["method"], "POST")
        from starlette.requests import Request

        asgi: Any = (scope, receive, send)  # starlette's types want mutable mappings
        response = await self.dispatcher.handle_requests(Request(asgi[0], asgi[1]))
        await response(*asgi)
        return True


def _base_url(scope: Scope) -> str:
    """The URL the client reached us at (the guard has checked the Host header)."""
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    host = headers.get("host")
    if not host:
        server = scope.get("server") or ("127.0.0.1", 80)
        host = f"{server[0]}:{server[1]}"
    return f"{scope.get('scheme', 'http')}://{host}"


def jsonrpc_refusals(app: Callable[[Scope, Receive, Send], Any]) -> Any:
    """``app`` (the guarded server) with the guard's body refusals on the A2A endpoint
    answered as JSON-RPC errors (``-32700`` for bad JSON, ``-32600`` otherwise) with
    HTTP 200, the shape an A2A client reads. Host, Origin and token refusals stay
    HTTP 403/401."""
    return guard_refusals_as_jsonrpc(app, ENDPOINT, status=200)
