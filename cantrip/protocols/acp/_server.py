"""The Agent Client Protocol (ACP) over JSON-RPC 2.0: sessions are summoned entities.

Transport-independent core: :meth:`AcpServer.handle` takes one decoded
JSON-RPC message and returns the response (or ``None`` for a notification);
``session/update`` notifications go out through the ``notify`` callback as
they happen. :func:`serve_stdio` is the line-delimited stdio transport.

Mapping (PROD-6/7, ENTITY-5):

* ``session/new`` summons an entity; the session id embeds the entity id.
* ``session/prompt`` is one cast on it, so a session keeps its conversation.
  While the cast runs, ``session/update`` notifications stream what it does:
  ``agent_message_chunk`` (text), ``agent_thought_chunk`` (thinking),
  ``tool_call`` when a gate call is announced and ``tool_call_update`` as it
  runs (``in_progress``) and ends (``completed`` / ``failed``). The response
  carries ACP's ``stopReason`` (``end_turn``; ``max_turn_requests`` or
  ``max_tokens`` for a ward; ``cancelled``) and the cast's answer under
  ``_meta.cantrip``.
* ``session/cancel`` cancels the running cast: the loom records it as
  ``cancelled``, the prompt answers ``stopReason: "cancelled"``, and the
  session lives on.
* ``session/load`` continues a session from the loom -- after a restart too,
  when the loom is a file (then ``loadSession`` is advertised) -- replaying its
  history as notifications before it answers.

The prompt's text may be a string, a list of content blocks, or given as
``content``; when the client leaves out ``sessionId`` and exactly one session
exists, that session is meant. Malformed messages, unknown methods and
unknown sessions get JSON-RPC errors; the server keeps serving.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
import trio

from cantrip._approval import Decision, Pause
from cantrip._cantrip import Cantrip
from cantrip._elicit import yes_no_field
from cantrip._errors import CantripError
from cantrip._events import (
    FinalResponse,
    MessageComplete,
    StepComplete,
    StepStart,
    ToolResultEvent,
)
from cantrip._outcome import CastResult, stop_reason
from cantrip._providers import ProviderScope
from cantrip._redact import get_logger, redact_value
from cantrip._text import TextError, check_text
from cantrip.llm._contract import plain_json
from cantrip.llm._stream import Event, TextDelta, ThinkingDelta, ToolCallEvent
from cantrip.loom._model import GateCallRecord, Turn, result_text
from cantrip.protocols.asgi._ids import BadIdError, client_id
from cantrip.protocols.sessions._hub import Session, SessionError, SessionHub

PROTOCOL_VERSION = 1
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL = (
    -32700,
    -32600,
    -32601,
    -32602,
    -32603,
)
MAX_LINE = 16 << 20
"""The longest JSON-RPC message line accepted on stdio (bytes)."""
RESOURCE_NOT_FOUND = -32002
"""ACP's code for an unknown session."""

log = get_logger("cantrip.acp")

Notify = Callable[[dict[str, Any]], Awaitable[None]]

_KINDS = {
    "read": "read",
    "fetch": "fetch",
    "call_agent": "think",
    "call_agent_batch": "think",
    "js": "execute",
    "python": "execute",
    "bash": "execute",
}
"""ACP tool kinds (icons in a client) for gates and code tools cantrip knows."""


@attrs.define(eq=False)
class _Reply:
    done: trio.Event = attrs.field(factory=trio.Event)
    result: Any = None
    error: Mapping[str, Any] | None = None


class RpcError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class AcpServer:
    """One ACP agent: a cantrip, and a summoned entity per session."""

    def __init__(self, spell: Cantrip, notify: Notify | None = None) -> None:
        self.spell = spell
        self.hub = SessionHub(spell)
        self._notify = notify
        self._locks: dict[str, trio.Lock] = {}
        self._requests = itertools.count(1)
        self._waiting: dict[str, _Reply] = {}
        """Requests this agent sent the client (``session/request_permission``), by id."""

    async def aclose(self) -> None:
        await self.hub.aclose()

    async def handle(self, message: Any) -> dict[str, Any] | None:
        """Answer one JSON-RPC message; notifications return None."""
        if not isinstance(message, Mapping):
            return _error(None, INVALID_REQUEST, "a JSON-RPC message must be an object")
        msg_id = message.get("id")
        if not isinstance(message.get("method"), str):
            if msg_id is not None and ("result" in message or "error" in message):
                self._deliver(message)  # the client's answer to a request of ours
                return None
            return _error(msg_id, INVALID_REQUEST, "not a JSON-RPC request (needs a method)")
        method = str(message["method"])
        params = message.get("params")
        params = {} if params is None else params
        handler = _METHODS.get(method)
        try:
            if handler is None:
                raise RpcError(METHOD_NOT_FOUND, f"unknown method {method!r}")
            if not isinstance(params, Mapping):
                raise RpcError(INVALID_PARAMS, "params must be an object")
            result = await handler(self, params)
        except RpcError as exc:
            log.debug("%s -> error %d: %s", method, exc.code, exc.message)
            return None if msg_id is None else _error(msg_id, exc.code, exc.message)
        if msg_id is None:
            return None
        return {"jsonrpc": "2.0", "id": msg_id, "result": result}

    # -- methods ---------------------------------------------------------------

    async def _initialize(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": {
                "loadSession": self.hub.persistent,
                "promptCapabilities": {"image": False, "audio": False, "embeddedContext": True},
            },
            "authMethods": [],
            "agentInfo": {"name": "cantrip", "title": "cantrip", "version": "0.1.0"},
        }

    async def _new_session(self, params: Mapping[str, Any]) -> dict[str, Any]:
        session = self.hub.new()
        log.info("session %s: new entity %s", session.id, session.entity_id)
        return {"sessionId": session.id}

    async def _load_session(self, params: Mapping[str, Any]) -> dict[str, Any]:
        session = self._session(params, required=True)
        for turn in self.hub.history(session):
            for update in _replay(turn):
                await self._update(session.id, update)
        log.info("session %s loaded (entity %s)", session.id, session.entity_id)
        return {"_meta": {"cantrip": {"entityId": session.entity_id}}}

    async def _prompt(self, params: Mapping[str, Any]) -> dict[str, Any]:
        session = self._session(params)
        return await self._run_locked(session, prompt_text(params), on_busy(params))

    def prepare_prompt(
        self, message: Mapping[str, Any]
    ) -> dict[str, Any] | Callable[[], Awaitable[dict[str, Any] | None]]:
        """Check a ``session/prompt`` now and run it later: either the error
        response, or a coroutine function that runs the cast and answers.

        Transports that run prompts in the background use this, so a prompt
        names the sessions that exist when it arrives, not when it starts."""
        msg_id = message.get("id")
        params = message.get("params")
        try:
            if not isinstance(params, Mapping):
                raise RpcError(INVALID_PARAMS, "params must be an object")
            session = self._session(params)
            text = prompt_text(params)
            policy = on_busy(params)
        except RpcError as exc:
            return _error(msg_id, exc.code, exc.message)

        async def run() -> dict[str, Any] | None:
            try:
                result = await self._run_locked(session, text, policy)
            except RpcError as exc:
                return None if msg_id is None else _error(msg_id, exc.code, exc.message)
            return None if msg_id is None else {"jsonrpc": "2.0", "id": msg_id, "result": result}

        return run

    # -- requests to the client -------------------------------------------------

    async def request_client(self, method: str, params: Mapping[str, Any]) -> Any:
        """Send the client a JSON-RPC request and wait for its result."""
        if self._notify is None:
            raise RpcError(INTERNAL, f"no client to send {method} to")
        request_id = f"cantrip-{next(self._requests)}"
        reply = self._waiting[request_id] = _Reply()
        try:
            await self._notify(
                {"jsonrpc": "2.0", "id": request_id, "method": method, "params": dict(params)}
            )
            await reply.done.wait()
        finally:
            self._waiting.pop(request_id, None)
        if reply.error is not None:
            raise RpcError(int(reply.error.get("code", INTERNAL)), str(reply.error.get("message")))
        return reply.result

    def _deliver(self, message: Mapping[str, Any]) -> None:
        reply = self._waiting.get(str(message.get("id")))
        if reply is None:
            log.info("a response to no request of ours: %r", message.get("id"))
            return
        error = message.get("error")
        reply.error = error if isinstance(error, Mapping) else None
        reply.result = message.get("result")
        reply.done.set()

    async def _ask_permission(self, session: Session, pause: Pause) -> Decision:
        """A pause as ACP's ``session/request_permission``: allow or reject, once or always."""
        if pause.kind == "question":
            return await self._ask_consent(session, pause)
        arguments = json.dumps(plain_json(pause.args), ensure_ascii=False, default=str)
        params = {
            "sessionId": session.id,
            "toolCall": {
                "toolCallId": pause.tool_call_id or pause.pause_id,
                "title": f"{pause.gate}({arguments[:200]})",
                "kind": "execute",
                "status": "pending",
                "rawInput": plain_json(pause.args),
            },
            "options": [
                {"optionId": kind, "name": name, "kind": kind}
                for kind, name in (
                    ("allow_once", "Allow"),
                    ("allow_always", f"Always allow {pause.gate}"),
                    ("reject_once", "Reject"),
                    ("reject_always", f"Always reject {pause.gate}"),
                )
            ],
        }
        try:
            answer = await self.request_client("session/request_permission", params)
        except RpcError as exc:
            return Decision.deny(f"the client could not ask: {exc.message}")
        outcome = answer.get("outcome") if isinstance(answer, Mapping) else None
        chosen = outcome.get("optionId") if isinstance(outcome, Mapping) else None
        if chosen == "allow_once":
            return Decision.approve()
        if chosen == "allow_always":
            return Decision.approve(always=True)
        if chosen in ("reject_once", "reject_always"):
            return Decision.deny("rejected in the editor")
        return Decision.deny("the permission request was cancelled")

    async def _ask_consent(self, session: Session, pause: Pause) -> Decision:
        """A question as ``session/request_permission``, when allow / reject can answer it:
        an MCP server's yes/no form (allow is yes) or a page it asks the user to open
        (allow is consent). Any other question is declined: ACP has no way to ask it."""
        field = yes_no_field(pause.schema) if pause.origin is not None else None
        if pause.origin is None or (pause.url is None and field is None):
            return Decision.deny(
                "this ACP client can only allow or reject calls, not answer a question: "
                "ask it in your reply instead"
            )
        title = f"{pause.origin} asks: {pause.question or ''}"
        if pause.url is not None:
            title += f" (open {pause.url})"
        params = {
            "sessionId": session.id,
            "toolCall": {
                "toolCallId": pause.pause_id,
                "title": title[:500],
                "kind": "other",
                "status": "pending",
                "rawInput": {"question": pause.question, "url": pause.url},
            },
            "options": [
                {"optionId": "allow_once", "name": "Yes", "kind": "allow_once"},
                {"optionId": "reject_once", "name": "No", "kind": "reject_once"},
            ],
        }
        try:
            answer = await self.request_client("session/request_permission", params)
        except RpcError as exc:
            return Decision.deny(f"the client could not ask: {exc.message}")
        outcome = answer.get("outcome") if isinstance(answer, Mapping) else None
        chosen = outcome.get("optionId") if isinstance(outcome, Mapping) else None
        if chosen == "allow_once":
            return Decision.answer("true" if field is not None else "ok")
        if chosen == "reject_once" and field is not None:
            return Decision.answer("false")
        return Decision.deny("declined in the editor")

    async def _run_locked(self, session: Session, text: str, policy: str) -> dict[str, Any]:
        """Prompts of one session run one after the other (``enqueue``, ACP's default);
        ``_meta.cantrip.onBusy`` may ask instead to ``steer`` the running cast (the text
        joins its next turn, answered at once), ``interrupt`` or ``rollback`` it (it is
        cancelled, recorded; rollback then continues from before it) or ``reject``."""
        rewind_to: list[str | None] = []
        current = session.current
        if session.running is not None and current is not None and policy != "enqueue":
            if policy == "reject":
                raise RpcError(INVALID_REQUEST, f"session {session.id} is running a prompt")
            if policy == "steer":
                try:
                    self.hub.steer(session, text)
                except SessionError as exc:
                    raise RpcError(INVALID_REQUEST, exc.message) from None
                meta = {"entityId": session.entity_id, "steered": True}
                return {"stopReason": "end_turn", "_meta": {"cantrip": meta}}
            rewind_to.append(current.before)
            self.hub.cancel(session, "interrupted")
        lock = self._locks.setdefault(session.id, trio.Lock())
        async with lock:
            if policy == "rollback" and rewind_to:
                await session.entity.rewind(rewind_to[0])
            return await self._run_prompt(session, text)

    async def _run_prompt(self, session: Session, text: str) -> dict[str, Any]:
        # The editor is asked before a call that needs a human (a crash-resumed
        # entity is a new object, so this is set on every prompt).
        session.entity.answer_pauses_with(lambda pause: self._ask_permission(session, pause))
        translator = _Translator(session)
        send, receive = trio.open_memory_channel[Event](math.inf)

        async def forward() -> None:
            async with receive:
                async for event in receive:
                    for update in translator.updates(event):
                        await self._update(session.id, update)

        outcome: CastResult | None = None
        error: RpcError | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(forward)
            async with send:
                try:
                    outcome = await self.hub.prompt(session, text, on_event=send.send_nowait)
                except SessionError as exc:
                    error = RpcError(INVALID_REQUEST, exc.message)
                except CantripError as exc:
                    error = RpcError(INTERNAL, f"the cast failed: {exc}")
                except Exception as exc:
                    log.exception("session %s: prompt crashed", session.id)
                    error = RpcError(INTERNAL, f"the entity crashed: {exc!r}")
        if error is not None:
            raise error  # after the updates the cast produced went out
        stop = stop_reason(outcome)
        if outcome is not None and outcome.truncated and stop != "cancelled":
            await self._update(session.id, _message(outcome.summary or "truncated"))
        meta: dict[str, Any] = {"entityId": session.entity_id, "reason": "cancelled"}
        if outcome is not None:
            meta = {
                "result": plain_json(outcome.result) if outcome.terminated else outcome.summary,
                "entityId": outcome.entity_id,
                "turns": len(outcome.turns),
                "reason": outcome.reason,
                "usage": outcome.usage.to_dict(),
                "costUsd": outcome.cost_usd,
            }
            if outcome.partial is not None:
                meta["partial"] = outcome.partial  # cut off by the token limit: not a result
        return {"stopReason": stop, "_meta": {"cantrip": meta}}

    async def _cancel(self, params: Mapping[str, Any]) -> None:
        session = self._session(params)
        if self.hub.cancel(session):
            log.info("session %s: prompt cancelled", session.id)

    def _session(self, params: Mapping[str, Any], *, required: bool = False) -> Session:
        session_id = params.get("sessionId")
        try:
            if session_id is None:
                if required:
                    raise RpcError(INVALID_PARAMS, "sessionId is required")
                return self.hub.only()
            if not isinstance(session_id, str):
                raise RpcError(INVALID_PARAMS, "sessionId must be a string")
            return self.hub.get(client_id(session_id, "sessionId"))
        except BadIdError as exc:
            raise RpcError(INVALID_PARAMS, str(exc)) from None
        except SessionError as exc:
            code = RESOURCE_NOT_FOUND if session_id is not None else INVALID_PARAMS
            raise RpcError(code, exc.message) from None

    async def _update(self, session_id: str, update: dict[str, Any]) -> None:
        if self._notify is None:
            return
        await self._notify(
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {"sessionId": session_id, "update": update},
            }
        )


_METHODS: dict[str, Callable[[AcpServer, Mapping[str, Any]], Awaitable[Any]]] = {
    "initialize": AcpServer._initialize,
    "session/new": AcpServer._new_session,
    "session/load": AcpServer._load_session,
    "session/prompt": AcpServer._prompt,
    "session/cancel": AcpServer._cancel,
}


# -- events to session/update ------------------------------------------------------


class _Translator:
    """Turns one prompt's streaming events into ACP session updates.

    Only the session's own entity is shown (its children appear as the
    delegation gate's tool call). Tool calls are announced once (``tool_call``,
    ``pending``), finalized (``in_progress``) and completed with their result
    (``completed`` / ``failed``); a code tool call that ran no further gate
    call is completed with the turn's observation when the turn is recorded.
    LLMs that do not stream still produce the same updates, from the complete
    message.
    """

    def __init__(self, session: Session) -> None:
        self.entity_id = session.entity_id
        self.announced: set[str] = set()
        self.open: dict[str, str] = {}
        self.step_text = False
        self.step_thinking = False
        self.any_text = False
        self.last_reason: str | None = None
        self.anonymous = 0
        self.sequence = 0
        """The turn being taken; tool call ids are ``<sequence>:<call id>``, unique in
        the session's thread (a provider's ids may repeat after a restart)."""

    def updates(self, event: Event) -> list[dict[str, Any]]:
        if event.entity_id and event.entity_id != self.entity_id:
            return []
        if isinstance(event, StepStart):
            self.step_text = self.step_thinking = False
            self.sequence = event.sequence
            self.anonymous = 0
        elif isinstance(event, TextDelta) and event.text:
            self.step_text = self.any_text = True
            return [_message(event.text)]
        elif isinstance(event, ThinkingDelta) and event.text:
            self.step_thinking = True
            return [_chunk("agent_thought_chunk", event.text)]
        elif isinstance(event, ToolCallEvent):
            return self._tool_call(event.call_id, event.name, event.arguments, event.final)
        elif isinstance(event, MessageComplete):
            return self._complete_message(event)
        elif isinstance(event, ToolResultEvent):
            return self._tool_result(event.record)
        elif isinstance(event, StepComplete) and event.turn is not None:
            self.last_reason = event.turn.reason
            return self._close_open(event.turn)
        elif isinstance(event, FinalResponse) and self.last_reason != "text":
            text = result_text(event.result)
            prefix = "\n\n" if self.any_text else ""
            self.any_text = True
            return [_message(prefix + text)]
        return []

    def _tool_call(
        self, call_id: str, name: str, arguments: Mapping[str, Any] | str, final: bool
    ) -> list[dict[str, Any]]:
        raw = plain_json(arguments) if isinstance(arguments, Mapping) else None
        call_id = f"{self.sequence}:{call_id}"
        if call_id not in self.announced:
            self.announced.add(call_id)
            self.open[call_id] = name
            update: dict[str, Any] = {
                "sessionUpdate": "tool_call",
                "toolCallId": call_id,
                "title": name,
                "kind": _KINDS.get(name, "other"),
                "status": "in_progress" if final else "pending",
            }
            if raw is not None:
                update["rawInput"] = raw
            return [update]
        if final:
            return [
                {
                    "sessionUpdate": "tool_call_update",
                    "toolCallId": call_id,
                    "status": "in_progress",
                    "rawInput": raw if raw is not None else {},
                }
            ]
        return []

    def _complete_message(self, event: MessageComplete) -> list[dict[str, Any]]:
        """What a non-streaming LLM did not stream, from the complete message."""
        response = event.response
        out: list[dict[str, Any]] = []
        if response.thinking and not self.step_thinking:
            out.append(_chunk("agent_thought_chunk", response.thinking))
        if response.content and not self.step_text:
            self.step_text = self.any_text = True
            out.append(_message(response.content))
        for call in response.tool_calls:
            if f"{self.sequence}:{call.id}" not in self.announced:
                out.extend(self._tool_call(call.id, call.name, call.arguments, True))
        return out

    def _tool_result(self, record: GateCallRecord) -> list[dict[str, Any]]:
        status = "completed" if record.status == "ok" else "failed"
        call_id = f"{self.sequence}:{record.tool_call_id}"
        content = [{"type": "content", "content": {"type": "text", "text": record.text}}]
        if record.tool_call_id is not None and call_id in self.open:
            del self.open[call_id]
            return [
                {
                    "sessionUpdate": "tool_call_update",
                    "toolCallId": call_id,
                    "status": status,
                    "rawOutput": plain_json(record.result),
                    "content": content,
                }
            ]
        # A gate called from code (its code tool call is the one announced).
        self.anonymous += 1
        return [
            {
                "sessionUpdate": "tool_call",
                "toolCallId": f"{self.sequence}:{record.gate}#{self.anonymous}",
                "title": record.gate,
                "kind": _KINDS.get(record.gate, "other"),
                "status": status,
                "rawInput": plain_json(record.args),
                "rawOutput": plain_json(record.result),
                "content": content,
            }
        ]

    def _close_open(self, turn: Turn) -> list[dict[str, Any]]:
        out = []
        for call_id in list(self.open):
            del self.open[call_id]
            failed = turn.is_error or turn.reason in ("cancelled", "timeout", "crashed")
            out.append(
                {
                    "sessionUpdate": "tool_call_update",
                    "toolCallId": call_id,
                    "status": "failed" if failed else "completed",
                    "content": [
                        {"type": "content", "content": {"type": "text", "text": turn.observation}}
                    ],
                }
            )
        return out


def _chunk(kind: str, text: str) -> dict[str, Any]:
    return {"sessionUpdate": kind, "content": {"type": "text", "text": text}}


def _message(text: str) -> dict[str, Any]:
    return _chunk("agent_message_chunk", text)


def _replay(turn: Turn) -> list[dict[str, Any]]:
    """A recorded turn as the updates a client shows for it (``session/load``)."""
    out: list[dict[str, Any]] = []
    if turn.intent:
        out.append(_chunk("user_message_chunk", turn.intent))
    if turn.thinking:
        out.append(_chunk("agent_thought_chunk", turn.thinking))
    if turn.content:
        out.append(_message(turn.content))
    recorded = {r.tool_call_id for r in turn.gate_calls}
    calls = {call.id for call in turn.tool_calls}
    for call in turn.tool_calls:
        if call.id not in recorded:  # a code tool call: its gates follow
            out.append(
                {
                    "sessionUpdate": "tool_call",
                    "toolCallId": f"{turn.sequence}:{call.id}",
                    "title": call.name,
                    "kind": _KINDS.get(call.name, "other"),
                    "status": "failed" if turn.is_error else "completed",
                    "rawInput": plain_json(call.arguments),
                    "content": [
                        {"type": "content", "content": {"type": "text", "text": turn.observation}}
                    ],
                }
            )
    anonymous = 0
    for record in turn.gate_calls:
        if record.tool_call_id is None or record.tool_call_id not in calls:
            anonymous += 1
            call_id = f"{turn.sequence}:{record.gate}#{anonymous}"
        else:
            call_id = f"{turn.sequence}:{record.tool_call_id}"
        out.append(
            {
                "sessionUpdate": "tool_call",
                "toolCallId": call_id,
                "title": record.gate,
                "kind": _KINDS.get(record.gate, "other"),
                "status": "completed" if record.status == "ok" else "failed",
                "rawInput": plain_json(record.args),
                "rawOutput": plain_json(record.result),
                "content": [{"type": "content", "content": {"type": "text", "text": record.text}}],
            }
        )
    if turn.terminated and turn.reason == "done":
        out.append(_message(result_text(turn.result)))
    return out


# -- prompts -----------------------------------------------------------------------


def prompt_text(params: Mapping[str, Any]) -> str:
    """The intent of a prompt, from the variants clients send (PROD-6)."""
    raw = params.get("prompt", params.get("content"))
    if isinstance(raw, str):
        text = raw
    elif isinstance(raw, list):
        parts = []
        for block in raw:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, Mapping) and block.get("type", "text") == "text":
                parts.append(str(block.get("text", "")))
            elif isinstance(block, Mapping) and block.get("type") == "resource":
                resource = block.get("resource") or {}
                if isinstance(resource, Mapping) and "text" in resource:
                    parts.append(str(resource["text"]))
        text = "\n".join(p for p in parts if p)
    elif isinstance(raw, Mapping) and "text" in raw:
        text = str(raw["text"])
    else:
        raise RpcError(INVALID_PARAMS, "the prompt needs text: a string or text content blocks")
    if not text.strip():
        raise RpcError(INVALID_PARAMS, "the prompt is empty")
    try:
        return check_text(text, "the prompt")
    except TextError as exc:
        raise RpcError(INVALID_PARAMS, str(exc)) from None


def _error(msg_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}}


# -- stdio transport -------------------------------------------------------------


async def serve_stdio(
    spell: Cantrip,
    *,
    stdin: trio.abc.ReceiveStream | None = None,
    stdout: trio.abc.SendStream | None = None,
) -> None:
    """Serve ACP on stdin/stdout, one JSON message per line, until stdin closes.

    Waiting idle for the next request is normal. Messages are taken in order;
    prompts run in the background, so a ``session/cancel`` reaches a running
    prompt (two prompts of one session run one after the other). Nothing but
    protocol messages is written to stdout, with secrets redacted (PROD-8).
    When stdin closes, running prompts finish and the server exits.
    """
    reader = stdin if stdin is not None else trio.lowlevel.FdStream(0)
    writer = stdout if stdout is not None else trio.lowlevel.FdStream(1)
    write_lock = trio.Lock()

    async def send(message: dict[str, Any]) -> None:
        data = json.dumps(redact_value(message), default=str).encode() + b"\n"
        log.debug("-> %s", data[:2000])
        async with write_lock:
            try:
                await writer.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                log.info("the client went away; a message was not delivered")

    server = AcpServer(spell, notify=send)

    async def answer(message: Any) -> None:
        response = await server.handle(message)
        if response is not None:
            await send(response)

    async def finish(run: Callable[[], Awaitable[dict[str, Any] | None]]) -> None:
        response = await run()
        if response is not None:
            await send(response)

    buffer = bytearray()
    skipping = False
    log.info("serving ACP on stdio (idle until a request arrives)")
    providers = await ProviderScope.enter()  # sessions' gate providers live here
    server.hub.nursery = providers.nursery
    try:
        async with trio.open_nursery() as nursery:
            while True:
                chunk = await reader.receive_some(65536)
                if not chunk:
                    break
                scanned = len(buffer)  # what is already buffered holds no newline
                buffer.extend(chunk)
                if skipping:  # the rest of an oversized line: dropped unread
                    newline = buffer.find(b"\n")
                    if newline < 0:
                        buffer.clear()
                        continue
                    del buffer[: newline + 1]
                    skipping = False
                    scanned = 0
                while (newline := buffer.find(b"\n", scanned)) >= 0:
                    line = bytes(buffer[:newline]).strip()
                    del buffer[: newline + 1]
                    scanned = 0
                    if not line:
                        continue
                    log.debug("<- %s", line[:2000])
                    try:
                        message = json.loads(line)
                    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                        await send(_error(None, PARSE_ERROR, f"not JSON: {exc}"))
                        continue
                    except RecursionError:
                        await send(_error(None, PARSE_ERROR, "not JSON: nested too deeply"))
                        continue
                    if isinstance(message, list):
                        await send(
                            _error(None, INVALID_REQUEST, "batch requests are not supported")
                        )
                    elif isinstance(message, Mapping) and message.get("method") == "session/prompt":
                        prepared = server.prepare_prompt(message)
                        if callable(prepared):
                            nursery.start_soon(finish, prepared)
                        elif message.get("id") is not None:
                            await send(prepared)
                    else:
                        await answer(message)
                if len(buffer) > MAX_LINE:
                    # One message may not hold the server's memory hostage: the
                    # oversized line is answered with an error and skipped.
                    await send(_error(None, INVALID_REQUEST, f"a message over {MAX_LINE} bytes"))
                    buffer.clear()
                    skipping = True
            log.info("stdin closed; finishing running prompts")
    finally:
        with trio.CancelScope(shield=True):
            await server.aclose()
        await providers.aclose()


ACP_ON_BUSY = ("enqueue", "steer", "interrupt", "rollback", "reject")


def on_busy(params: Mapping[str, Any]) -> str:
    """A ``session/prompt``'s double-texting policy: ``_meta.cantrip.onBusy``."""
    meta = params.get("_meta")
    cantrip_meta = meta.get("cantrip") if isinstance(meta, Mapping) else None
    policy = cantrip_meta.get("onBusy") if isinstance(cantrip_meta, Mapping) else None
    if policy is None:
        return "enqueue"
    if policy not in ACP_ON_BUSY:
        raise RpcError(
            INVALID_PARAMS, f"_meta.cantrip.onBusy must be one of {', '.join(ACP_ON_BUSY)}"
        )
    return str(policy)
