"""A2A (Agent2Agent) on ``cantrip serve``: an Agent Card and the JSON-RPC binding.

Other agents (Google ADK, LangGraph, pydantic-ai, CrewAI...) talk to a remote
agent through A2A: they read its Agent Card at ``/.well-known/agent-card.json``
and send it messages over JSON-RPC at the URL the card names (``/a2a`` here).
The official ``a2a-sdk`` does the protocol: its :class:`JsonRpcDispatcher`
parses and validates every request, answers bad ones with the protocol's own
JSON-RPC errors, serialises the protobuf types and streams over SSE; it speaks
A2A 1.0 (``SendMessage``, ``SendStreamingMessage``, ``GetTask``, ``CancelTask``,
``ListTasks``, ``SubscribeToTask``, the push-notification configs) and, with its
compatibility adapter, 0.3. What is cantrip's is
:class:`~cantrip.protocols.a2a._handler.A2AHandler`, the SDK's
:class:`RequestHandler`, written once over the session seam: an A2A task is one
prompt on a session, and the task's ``contextId`` is the session id, so later
messages in the same context continue the same conversation (and the loom thread).

This module is the mapping (what a message, a result, an event, a pause means in A2A
terms) and the ASGI side; where tasks are stored is the session backend's (rows in
PostgreSQL for ``serve --db`` replicas, where any replica answers for any task; a
bounded map in process).

A paused cast (an approval or an ``ask_user`` question) is a task in
``input-required``: its status message says what is asked, and the next
message sent with that ``taskId`` answers the pause (text answers a question;
``approve``/``yes`` or ``deny``/``no`` answer an approval, or a data part that
is the HTTP API's answer body). ``CancelTask`` cancels the running cast
(recorded as ``cancelled`` in the loom).

The endpoint lives behind the same :class:`~cantrip.protocols.middleware._guard.Guard` as
the HTTP API (Host, Origin, token, body limits); :func:`jsonrpc_refusals` turns
the guard's body refusals on the A2A endpoint into JSON-RPC errors, so an A2A
client gets the protocol's error shape for bad JSON too. Every text that leaves
comes from the redacted result and event dicts of the sessions. Request headers are
checked before anything is submitted: ``A2A-Version`` by the SDK's dispatcher
(``VersionNotSupported``, ``-32009``), before it calls the handler, in both modes.

The SDK is optional (``pip install 'cantrip-runtime[a2a]'``); without it these paths are
not served (404) and nothing of it is imported.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

import attrs

from cantrip._approval import Decision, PauseError
from cantrip._cantrip import Cantrip
from cantrip._plain_doc import plain_doc
from cantrip._redact import get_logger, redact
from cantrip.a2a._parts import parts_text
from cantrip.protocols.asgi._api_models import AnswerRequest
from cantrip.protocols.asgi._responses import Receive, Scope, Send
from cantrip.protocols.middleware._client_faults import demote_client_faults
from cantrip.protocols.middleware._guard import guard_refusals_as_jsonrpc

AGENT_CARD_PATH = "/.well-known/agent-card.json"
ENDPOINT = "/a2a"
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


def agent_card(spell: Cantrip, url: str, *, push: bool = False) -> Any:
    """The Agent Card of ``spell`` served at ``url`` (an ``a2a.types.AgentCard``).

    Name and description come from the cantrip (its name, else its id; the identity's
    system prompt, else what it does), one skill per gate (its name and description,
    reST markup removed: people read a card, not Sphinx),
    and the capabilities the endpoint has: streaming, and push notifications when
    the server delivers them (``push``)."""
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
            description=plain_doc(g.description or g.name).strip()[:500],
            tags=["gate", circle.medium.name],
        )
        for g in gates
    ] or [
        pb.AgentSkill(
            id="answer", name="answer", description=description, tags=[circle.medium.name]
        )
    ]
    return pb.AgentCard(
        name=spell.name or spell.id,
        description=description,
        version="1.0.0",
        supported_interfaces=[
            pb.AgentInterface(
                url=url,
                protocol_binding=TransportProtocol.JSONRPC,
                protocol_version=PROTOCOL_VERSION_CURRENT,
            )
        ],
        capabilities=pb.AgentCapabilities(streaming=True, push_notifications=push),
        default_input_modes=["text/plain", "application/json"],
        default_output_modes=["text/plain", "application/json"],
        skills=skills,
    )


# -- tasks: the mapping ----------------------------------------------------------------


LIST_SCAN = 1000
"""``ListTasks`` looks at the newest this many tasks (of the ``contextId`` asked for)."""


@attrs.define(eq=False)
class TaskView:
    """One A2A task as a client sees it: a prompt (and the answers to its pauses) on one
    session, built from the backend's :class:`~cantrip.protocols.sessions.TaskRecord`
    whenever it is asked for (:func:`~cantrip.protocols.a2a._handler.view_of`)."""

    id: str
    context_id: str
    state: int
    seq: int = 0
    """Creation order (``ListTasks`` lists newest first; its page token is a ``seq``)."""
    history: list[Any] = attrs.field(factory=list)
    artifacts: list[Any] = attrs.field(factory=list)
    status_message: Any = None
    pause_id: str | None = None
    pause_kind: str | None = None
    updated: float = attrs.field(factory=time.time)
    """When the status last changed (seconds since the epoch)."""

    @property
    def working(self) -> bool:
        """Whether the cast behind the task is under way (it will publish more)."""
        from a2a.types import a2a_pb2 as pb

        return self.state in (pb.TASK_STATE_SUBMITTED, pb.TASK_STATE_WORKING)

    @property
    def terminal(self) -> bool:
        """Whether the task has ended (``input-required`` has not: it can be answered or
        cancelled)."""
        from a2a.types import a2a_pb2 as pb

        return self.working is False and self.state != pb.TASK_STATE_INPUT_REQUIRED

    def to_proto(self, history_length: int | None = None, artifacts: bool = True) -> Any:
        from a2a.types import a2a_pb2 as pb

        history = self.history if history_length is None else self.history[-history_length:]
        if history_length == 0:
            history = []
        return pb.Task(
            id=self.id,
            context_id=self.context_id,
            status=self.status(),
            history=history,
            artifacts=self.artifacts if artifacts else [],
        )

    def status(self) -> Any:
        from a2a.types import a2a_pb2 as pb
        from google.protobuf import timestamp_pb2

        stamp = timestamp_pb2.Timestamp()
        stamp.FromNanoseconds(int(self.updated * 1e9))
        status = pb.TaskStatus(state=self.state, timestamp=stamp)  # type: ignore[arg-type]
        if self.status_message is not None:
            status.message.CopyFrom(self.status_message)
        return status

    def status_event(self) -> Any:
        from a2a.types import a2a_pb2 as pb

        return pb.TaskStatusUpdateEvent(
            task_id=self.id, context_id=self.context_id, status=self.status()
        )

    def set_state(self, state: int, message: Any = None) -> None:
        self.state = state
        self.status_message = message
        self.updated = time.time()


def state_name(state: int) -> str:
    from a2a.types import a2a_pb2 as pb

    return str(pb.TaskState.Name(state))


def text_of(message: Any) -> str:
    """A message's parts as one prompt (:func:`~cantrip.a2a._parts.parts_text`)."""
    return parts_text(message.parts)


def _data_of(message: Any) -> dict[str, Any] | None:
    from google.protobuf.json_format import MessageToDict

    for part in message.parts:
        if part.WhichOneof("content") == "data":
            value = MessageToDict(part.data)
            if isinstance(value, dict):
                return value
    return None


def agent_message(task: TaskView, text: str | None, data: Any = None, msg_id: str = "") -> Any:
    """An agent message of ``task`` (text redacted; ``data`` comes redacted already)."""
    from a2a.types import a2a_pb2 as pb
    from google.protobuf import struct_pb2
    from google.protobuf.json_format import ParseDict

    parts = []
    if text:
        parts.append(pb.Part(text=redact(text)))
    if data is not None:
        value = struct_pb2.Value()
        ParseDict(data, value)
        parts.append(pb.Part(data=value))
    return pb.Message(
        message_id=msg_id or uuid.uuid4().hex,
        context_id=task.context_id,
        task_id=task.id,
        role=pb.ROLE_AGENT,
        parts=parts,
    )


def check_message(message: Any) -> None:
    """A message the server can act on at all (errors are the SDK's: JSON-RPC errors)."""
    from a2a.utils.errors import InvalidParamsError

    if not message.parts:
        raise InvalidParamsError(message="the message has no parts")


def prompt_of(message: Any) -> str:
    from a2a.utils.errors import InvalidParamsError

    text = text_of(message)
    if not text.strip():
        raise InvalidParamsError(message="the message has no text or data to act on")
    return text


def check_follow_up(task: TaskView) -> str:
    """The pause a follow-up message to ``task`` answers (or the protocol's error)."""
    from a2a.types import a2a_pb2 as pb
    from a2a.utils.errors import InvalidParamsError

    if task.state != pb.TASK_STATE_INPUT_REQUIRED or task.pause_id is None:
        raise InvalidParamsError(
            message=f"task {task.id} is {state_name(task.state)}: "
            "only a task that needs input takes a follow-up message; send a new "
            "message with its contextId to go on in the conversation"
        )
    return task.pause_id


def decision_for(task: TaskView, message: Any) -> Decision:
    """The answer a follow-up message gives the pause ``task`` waits on."""
    from a2a.utils.errors import InvalidParamsError

    data = _data_of(message)
    try:
        if data is not None:
            decision: Decision = AnswerRequest.model_validate(data).decision_value()
            return decision
        text = text_of(message).strip()
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


def working(task: TaskView) -> None:
    """``task`` is (again) under way."""
    from a2a.types import a2a_pb2 as pb

    task.set_state(pb.TASK_STATE_WORKING)
    task.pause_id = None


def progress(task: TaskView, data: dict[str, Any]) -> Any:
    """The ``working`` status update for one cast event (``data``: its redacted dict as
    ``/events`` has it); None for text deltas and the final response (the final answer
    carries the text)."""
    from a2a.types import a2a_pb2 as pb

    if data["type"] in ("text_delta", "thinking_delta", "final_response"):
        return None
    return pb.TaskStatusUpdateEvent(
        task_id=task.id,
        context_id=task.context_id,
        status=pb.TaskStatus(state=pb.TASK_STATE_WORKING, message=agent_message(task, None, data)),
    )


def failed(task: TaskView, text: str) -> list[Any]:
    from a2a.types import a2a_pb2 as pb

    task.set_state(pb.TASK_STATE_FAILED, agent_message(task, text, msg_id=f"{task.id}-failed"))
    return [task.status_event()]


def cancelled_waiting(task: TaskView) -> list[Any]:
    """A task cancelled while it waited for input (its pause stays in the loom)."""
    from a2a.types import a2a_pb2 as pb

    task.pause_id = None
    message = agent_message(task, "cancelled while waiting for input", msg_id=f"{task.id}-c")
    task.set_state(pb.TASK_STATE_CANCELED, message)
    return [task.status_event()]


def settle(task: TaskView, data: dict[str, Any] | None, stamp: str) -> list[Any]:
    """The task's state from the cast's result (``data``: the redacted result dict, None
    for a cast cancelled before it recorded a turn); the events that tell a stream.
    ``stamp`` names this settling (ids of the messages it makes stay the same however
    often a ``serve --db`` replica rebuilds it)."""
    from a2a.types import a2a_pb2 as pb

    events: list[Any] = []
    data = data or {"stop_reason": "cancelled"}
    reason = data.get("reason")
    pending = data.get("pending") or []
    ids = f"{task.id}-{stamp}"
    if data.get("stop_reason") == "cancelled" or reason == "cancelled":
        message = agent_message(task, data.get("summary") or "cancelled", data, f"{ids}-s")
        task.set_state(pb.TASK_STATE_CANCELED, message)
    elif reason == "paused" and pending:
        pause = pending[0]
        task.pause_id = pause["pause_id"]
        task.pause_kind = pause.get("kind")
        if task.pause_kind == "question":
            ask = pause.get("question") or "the entity asks a question"
        else:
            ask = (
                f"approve the call of {pause['gate']} with {json.dumps(pause['args'])}? "
                "answer 'approve' or 'deny'"
            )
        task.set_state(pb.TASK_STATE_INPUT_REQUIRED, agent_message(task, ask, pause, f"{ids}-s"))
    elif data.get("terminated"):
        task.set_state(pb.TASK_STATE_COMPLETED)
        result = data.get("result")
        text = result if isinstance(result, str) else None
        answer = agent_message(task, text, None if text is not None else result, f"{ids}-a")
        artifact = pb.Artifact(artifact_id=f"{ids}-result", name="result", parts=answer.parts)
        task.artifacts.append(artifact)
        task.history.append(answer)
        events.append(
            pb.TaskArtifactUpdateEvent(
                task_id=task.id, context_id=task.context_id, artifact=artifact, last_chunk=True
            )
        )
    elif data.get("stop_reason") == "refusal":  # a guardrail refused it (A2A's rejected)
        text = f"refused: {data.get('summary') or ''}"
        task.set_state(pb.TASK_STATE_REJECTED, agent_message(task, text, data, f"{ids}-s"))
    else:  # stopped by a ward or a limit without an answer
        text = f"stopped without an answer ({reason}): {data.get('summary') or ''}"
        task.set_state(pb.TASK_STATE_FAILED, agent_message(task, text, data, f"{ids}-s"))
    return [*events, task.status_event()]


# -- the ASGI side ------------------------------------------------------------------------


class _NoRequestBodies(logging.Filter):
    """Drops the SDK dispatcher's ``Request body: ...`` debug record: it holds all a
    client sent, push-notification tokens and credentials included, which never go to
    a log (the rest of the SDK's records are redacted as cantrip's are)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Request body")


_SDK_REFUSALS = {
    "Failed to validate base JSON-RPC request": "not a JSON-RPC request",
    "Failed to validate base JSON-RPC request for v0.3": "not an A2A 0.3 request",
    "Failed to parse request params": "invalid params",
}
"""The SDK's records of a request it refused, each logged at ERROR with a traceback."""
_SDK_LOGGERS = (
    "a2a.server.routes.jsonrpc_dispatcher",
    "a2a.compat.v0_3.jsonrpc_adapter",
    "a2a.utils.version_validator",
)


def _sdk_client_fault(record: logging.LogRecord) -> str | None:
    """What the a2a-sdk's record says a client did wrong (None: not a client's fault).

    Its refusals of a malformed request (ERROR, with a traceback quoting the request),
    the error answer it logs for each (WARNING: every JSON-RPC error but -32603, the
    internal one) and an ``A2A-Version`` it does not serve (WARNING, quoting the
    header). An unhandled exception -- a fault in cantrip's handler -- stays ERROR."""
    message = str(record.msg)
    if message in _SDK_REFUSALS:
        return _SDK_REFUSALS[message]
    if message.startswith("Version mismatch"):
        return "an A2A version not served"
    args = record.args
    if message.startswith("Request Error") and record.levelno < logging.ERROR:
        code = args[1] if isinstance(args, tuple) and len(args) > 1 else None
        return f"JSON-RPC error {code}" if isinstance(code, int) else "a JSON-RPC error"
    return None


def _quiet_sdk_logs() -> None:
    sdk = logging.getLogger("a2a.server.routes.jsonrpc_dispatcher")
    if not any(isinstance(f, _NoRequestBodies) for f in sdk.filters):
        sdk.addFilter(_NoRequestBodies())
    demote_client_faults(_SDK_LOGGERS, "a2a", _sdk_client_fault)
    for name in _SDK_LOGGERS:
        get_logger(name)  # and redacted


_EXTENSION_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:[!-~]+")
"""An extension's URI as ``A2A-Extensions`` lists them: a scheme, then printable ASCII."""


def header_refusal(scope: Scope) -> str | None:
    """What is wrong with a request's A2A headers (None: nothing), checked before the
    request reaches the dispatcher -- before anything is made, queued or cast, in both
    modes. ``A2A-Extensions`` must list extension URIs (comma-separated); ones this
    server does not implement are ignored, as the protocol says (the card declares
    none). ``A2A-Version`` is the SDK's dispatcher's to check (``-32009``), also before
    it calls the handler."""
    for name, raw in scope.get("headers") or ():
        if name.lower() != b"a2a-extensions":
            continue
        entries = [e.strip() for e in raw.decode("latin-1").split(",")]
        if not all(_EXTENSION_URI.fullmatch(e) for e in entries):
            return "A2A-Extensions is not a comma-separated list of extension URIs"
    return None


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
