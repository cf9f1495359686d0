"""The Agent Client Protocol (ACP) over JSON-RPC 2.0: sessions are summoned entities.

Transport-independent core: :meth:`AcpServer.handle` takes one decoded
JSON-RPC message and returns the response (or ``None`` for a notification);
``session/update`` notifications go out through the ``notify`` callback as
they happen. :func:`serve_stdio` is the line-delimited stdio transport.

Mapping (PROD-6/7, ENTITY-5): ``session/new`` summons an entity; each
``session/prompt`` is one cast on it, so a session keeps its conversation;
``session/cancel`` cancels the running cast (recorded in the loom, the
session survives). The prompt's text may be a string, a list of content
blocks, or given as ``content``; when the client leaves out ``sessionId`` and
exactly one session exists, that session is meant. The prompt's response
carries ACP's ``stopReason`` plus the cast's answer under ``_meta.cantrip``.

Malformed messages, unknown methods and unknown sessions get JSON-RPC errors;
the server keeps serving.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
import trio

from cantrip._cantrip import Cantrip
from cantrip._entity import CastResult, Entity
from cantrip._errors import CantripError
from cantrip._redact import get_logger

PROTOCOL_VERSION = 1
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL = (
    -32700,
    -32600,
    -32601,
    -32602,
    -32603,
)

log = get_logger("cantrip.acp")

Notify = Callable[[dict[str, Any]], Awaitable[None]]


class RpcError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@attrs.define
class _Session:
    entity: Entity
    running: trio.CancelScope | None = None


class AcpServer:
    """One ACP agent: a cantrip, and a summoned entity per session."""

    def __init__(self, spell: Cantrip, notify: Notify | None = None) -> None:
        self.spell = spell
        self._notify = notify
        self._sessions: dict[str, _Session] = {}
        self._counter = 0

    async def aclose(self) -> None:
        for session in self._sessions.values():
            await session.entity.aclose()

    async def handle(self, message: Any) -> dict[str, Any] | None:
        """Answer one JSON-RPC message; notifications return None."""
        if not isinstance(message, Mapping) or not isinstance(message.get("method"), str):
            return _error(None, INVALID_REQUEST, "not a JSON-RPC request (needs a method)")
        msg_id = message.get("id")
        method = str(message["method"])
        params = message.get("params") or {}
        handler = _METHODS.get(method)
        try:
            if handler is None:
                raise RpcError(METHOD_NOT_FOUND, f"unknown method {method!r}")
            if not isinstance(params, Mapping):
                raise RpcError(INVALID_PARAMS, "params must be an object")
            result = await handler(self, params)
        except RpcError as exc:
            return None if msg_id is None else _error(msg_id, exc.code, exc.message)
        if msg_id is None:
            return None
        return {"jsonrpc": "2.0", "id": msg_id, "result": result}

    # -- methods ---------------------------------------------------------------

    async def _initialize(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": {
                "loadSession": False,
                "promptCapabilities": {"image": False, "audio": False, "embeddedContext": True},
            },
            "authMethods": [],
            "agentInfo": {"name": "cantrip", "version": "0.1.0"},
        }

    async def _new_session(self, params: Mapping[str, Any]) -> dict[str, Any]:
        entity = self.spell.summon()
        self._counter += 1
        session_id = f"session-{self._counter}-{entity.id.removeprefix('entity-')[:8]}"
        self._sessions[session_id] = _Session(entity)
        return {"sessionId": session_id}

    async def _prompt(self, params: Mapping[str, Any]) -> dict[str, Any]:
        session_id, session = self._session(params)
        text = prompt_text(params)
        if session.running is not None:
            raise RpcError(INVALID_REQUEST, f"session {session_id} is already running a prompt")
        with trio.CancelScope() as scope:
            session.running = scope
            try:
                outcome: CastResult | None = await session.entity.send(text)
            except CantripError as exc:
                raise RpcError(INTERNAL, f"the cast failed: {exc}") from None
            finally:
                session.running = None
        if scope.cancelled_caught or outcome is None:
            return {"stopReason": "cancelled"}
        await self._emit(session_id, outcome)
        stop = "end_turn" if outcome.terminated else "max_turn_requests"
        return {
            "stopReason": stop,
            "_meta": {
                "cantrip": {
                    "result": outcome.result if outcome.terminated else outcome.summary,
                    "entityId": outcome.entity_id,
                    "turns": len(outcome.turns),
                    "reason": outcome.reason,
                }
            },
        }

    async def _cancel(self, params: Mapping[str, Any]) -> None:
        _session_id, session = self._session(params)
        if session.running is not None:
            session.running.cancel()

    def _session(self, params: Mapping[str, Any]) -> tuple[str, _Session]:
        session_id = params.get("sessionId")
        if session_id is None:
            if len(self._sessions) == 1:
                return next(iter(self._sessions.items()))
            raise RpcError(INVALID_PARAMS, "sessionId is required (there is not exactly one)")
        session = self._sessions.get(str(session_id))
        if session is None:
            raise RpcError(INVALID_PARAMS, f"unknown session {session_id!r}")
        return str(session_id), session

    async def _emit(self, session_id: str, outcome: CastResult) -> None:
        if self._notify is None:
            return
        for turn in outcome.turns:
            for record in turn.gate_calls:
                await self._update(
                    session_id,
                    {
                        "sessionUpdate": "tool_call",
                        "toolCallId": record.tool_call_id or f"{turn.id}:{record.gate}",
                        "title": record.gate,
                        "kind": "other",
                        "status": "failed" if record.is_error else "completed",
                        "rawInput": dict(record.args),
                    },
                )
        text = outcome.text if outcome.terminated else (outcome.summary or "")
        await self._update(
            session_id,
            {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}},
        )

    async def _update(self, session_id: str, update: dict[str, Any]) -> None:
        assert self._notify is not None
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
    "session/prompt": AcpServer._prompt,
    "session/cancel": AcpServer._cancel,
}


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
    return text


def _error(msg_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}}


async def serve_stdio(spell: Cantrip) -> None:
    """Serve ACP on stdin/stdout, one JSON message per line, until stdin closes.

    Waiting idle for the next request is normal. Requests run concurrently, so
    a ``session/cancel`` reaches a running prompt. Nothing but protocol
    messages is written to stdout.
    """
    stdin = trio.lowlevel.FdStream(0)
    stdout = trio.lowlevel.FdStream(1)
    write_lock = trio.Lock()

    async def send(message: dict[str, Any]) -> None:
        data = json.dumps(message, default=str).encode() + b"\n"
        async with write_lock:
            await stdout.send_all(data)

    server = AcpServer(spell, notify=send)

    async def answer(raw: bytes) -> None:
        try:
            message = json.loads(raw)
        except json.JSONDecodeError as exc:
            await send(_error(None, PARSE_ERROR, f"not JSON: {exc}"))
            return
        response = await server.handle(message)
        if response is not None:
            await send(response)

    buffer = bytearray()
    try:
        async with trio.open_nursery() as nursery:
            while True:
                chunk = await stdin.receive_some(65536)
                if not chunk:
                    break
                buffer.extend(chunk)
                while (newline := buffer.find(b"\n")) >= 0:
                    line = bytes(buffer[:newline]).strip()
                    del buffer[: newline + 1]
                    if line:
                        nursery.start_soon(answer, line)
    finally:
        with trio.CancelScope(shield=True):
            await server.aclose()
