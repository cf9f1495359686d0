"""The Agent Client Protocol (ACP) over JSON-RPC 2.0: sessions are summoned entities.

Transport-independent core: :meth:`AcpServer.handle` takes one decoded
JSON-RPC message and returns the response (or ``None`` for a notification);
``session/update`` notifications go out through the ``notify`` callback as
they happen. The file is split by job: :mod:`._rpc` (JSON-RPC framing, a prompt's
parameters), :mod:`._updates` (events to ``session/update``), :mod:`._stdio` (the
line-delimited stdio transport, ``serve_stdio``).

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
from cantrip._outcome import CastResult, stop_reason
from cantrip._redact import get_logger
from cantrip.llm._contract import plain_json
from cantrip.llm._stream import Event
from cantrip.protocols.acp._rpc import (
    INTERNAL,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PROTOCOL_VERSION,
    RESOURCE_NOT_FOUND,
    RpcError,
    on_busy,
    prompt_text,
)
from cantrip.protocols.acp._rpc import error_response as _error
from cantrip.protocols.acp._updates import Translator, message, replay
from cantrip.protocols.sessions._hub import Session, SessionError, SessionHub
from cantrip.protocols.sessions._ids import BadIdError, client_id

log = get_logger("cantrip.acp")

Notify = Callable[[dict[str, Any]], Awaitable[None]]


@attrs.define(eq=False)
class _Reply:
    done: trio.Event = attrs.field(factory=trio.Event)
    result: Any = None
    error: Mapping[str, Any] | None = None


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
            for update in replay(turn):
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
        translator = Translator(session)
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
            await self._update(session.id, message(outcome.summary or "truncated"))
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
