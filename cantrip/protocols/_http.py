"""An HTTP session API: the same sessions as ACP, over HTTP with server-sent events.

A small ASGI application (no framework: seven routes) served by hypercorn's
trio worker, so the server runs in the same trio world as the entities it
serves -- cancellation, nurseries and the loom behave exactly as under ACP and
the CLI (PROD-1). Sessions come from the same :class:`SessionHub` as ACP's.

Routes (JSON in and out; errors are ``{"error": {"code", "message"}}``):

* ``GET  /health`` -- liveness, and what the cantrip is;
* ``GET  /openapi.json`` -- this API as an OpenAPI 3.1 document, generated from
  the pydantic models that validate the requests (:mod:`._api`);
* ``POST /sessions`` -- summon an entity: ``{"session_id", "entity_id"}`` (201);
* ``GET  /sessions`` -- the live sessions;
* ``GET  /sessions/{id}`` -- one session (a session in the loom file is resumed);
* ``POST /sessions/{id}/prompt`` -- ``{"prompt": ...}`` (also ``intent``,
  ``content``, text blocks): one cast; the answer is the cast's result, or,
  with ``Accept: text/event-stream`` or ``?stream=1``, a stream of its events
  ending with a ``result`` event; 409 while another prompt runs;
* ``POST /sessions/{id}/cancel`` -- cancel the running prompt (recorded as
  ``cancelled``; the session stays): ``{"cancelled": bool}``;
* ``GET  /sessions/{id}/thread`` -- the session's turns, root first;
* ``GET  /sessions/{id}/events`` -- server-sent events of every prompt of the
  session from now on (heartbeat comments keep idle connections open).

Before a request reaches a route, :mod:`._guard` has checked its Host, Origin,
token, content type, size and JSON; :mod:`._limits` bounds the sessions kept in
memory (idle ones are dropped and resumed from the loom when named again).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import parse_qs

import pydantic
import trio

from cantrip._cantrip import Cantrip
from cantrip._entity import CastResult
from cantrip._errors import CantripError
from cantrip._events import Event
from cantrip._redact import get_logger, redact_value
from cantrip.protocols._acp import RpcError, prompt_text
from cantrip.protocols._api import CreateSession, PromptRequest, openapi_document
from cantrip.protocols._guard import Guard
from cantrip.protocols._limits import SessionLimits, make_room
from cantrip.protocols._sessions import (
    Session,
    SessionError,
    SessionHub,
    event_dict,
    result_dict,
    turn_dict,
)

log = get_logger("cantrip.http")

Scope = Mapping[str, Any]
Receive = Callable[[], Awaitable[Mapping[str, Any]]]
Send = Callable[[Mapping[str, Any]], Awaitable[None]]

MAX_BODY = 1 << 20
HEARTBEAT_S = 15.0


class HttpError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class HttpApp:
    """The ASGI application: one cantrip, its sessions."""

    def __init__(self, spell: Cantrip, limits: SessionLimits | None = None) -> None:
        self.spell = spell
        self.hub = SessionHub(spell)
        self.limits = limits or SessionLimits()

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self.hub.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            await self._route(scope, receive, send)
        except HttpError as exc:
            await _json(send, exc.status, {"error": {"code": exc.code, "message": exc.message}})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"]
        parts = [p for p in scope["path"].split("/") if p]
        query = parse_qs(scope.get("query_string", b"").decode())
        log.debug("%s %s", method, scope["path"])
        if parts == ["health"]:
            _allow(method, "GET")
            await _json(send, 200, self._health())
        elif parts == ["openapi.json"]:
            _allow(method, "GET")
            await _json(send, 200, openapi_document())
        elif parts == ["sessions"]:
            _allow(method, "GET", "POST")
            if method == "POST":
                _validated(CreateSession, await _body(receive))
                await self._make_room(adding=True)
                session = self.hub.new()
                await _json(send, 201, _session_info(session))
            else:
                sessions = [_session_info(s) for s in self.hub.sessions.values()]
                await _json(send, 200, {"sessions": sessions})
        elif len(parts) >= 2 and parts[0] == "sessions" and len(parts) <= 3:
            session = await self._session(parts[1])
            action = parts[2] if len(parts) == 3 else None
            if action is None:
                _allow(method, "GET")
                await _json(send, 200, _session_info(session))
            elif action == "prompt":
                _allow(method, "POST")
                body = await _body(receive)
                intent = _intent(body)
                accept = dict(scope.get("headers") or []).get(b"accept", b"").decode()
                streaming = "text/event-stream" in accept or _truthy(query.get("stream"))
                if streaming:
                    await self._prompt_stream(session, intent, send)
                else:
                    outcome = await self._prompt(session, intent)
                    await _json(send, 200, result_dict(outcome, session))
            elif action == "cancel":
                _allow(method, "POST")
                await _json(send, 200, {"cancelled": self.hub.cancel(session)})
            elif action == "thread":
                _allow(method, "GET")
                turns = [turn_dict(t) for t in self.hub.history(session)]
                await _json(send, 200, {**_session_info(session), "turns": turns})
            elif action == "events":
                _allow(method, "GET")
                await self._events(session, receive, send)
            else:
                raise HttpError(404, "not_found", f"no route {scope['path']!r}")
        else:
            raise HttpError(404, "not_found", f"no route {scope['path']!r}")

    def _health(self) -> dict[str, Any]:
        circle = self.spell.circle
        return {
            "ok": True,
            "cantrip": self.spell.id,
            "medium": circle.medium.name,
            "gates": list(circle.gate_names),
            "persistent": self.hub.persistent,
            "sessions": len(self.hub.sessions),
        }

    async def _session(self, session_id: str) -> Session:
        await self._make_room(adding=session_id not in self.hub.sessions)
        try:
            session = self.hub.get(session_id)
        except SessionError as exc:
            raise HttpError(404, "unknown_session", exc.message) from None
        session.last_used = trio.current_time()
        return session

    async def _make_room(self, *, adding: bool) -> None:
        try:
            await make_room(self.hub, self.limits, adding=adding)
        except SessionError as exc:
            raise HttpError(503, "too_many_sessions", exc.message) from None

    async def _prompt(
        self, session: Session, intent: str, on_event: Callable[[Event], None] | None = None
    ) -> CastResult | None:
        try:
            return await self.hub.prompt(session, intent, on_event=on_event)
        except SessionError as exc:
            raise HttpError(409, "busy", exc.message) from None
        except CantripError as exc:
            raise HttpError(500, "cast_failed", f"the cast failed: {exc}") from None
        except Exception as exc:
            log.exception("session %s: the entity crashed", session.id)
            raise HttpError(500, "crashed", f"the entity crashed: {exc!r}") from None
        finally:
            session.last_used = trio.current_time()

    async def _prompt_stream(self, session: Session, intent: str, send: Send) -> None:
        if session.running is not None:
            raise HttpError(409, "busy", f"session {session.id} is already running a prompt")
        await _start_sse(send)
        events_send, events = trio.open_memory_channel[Event](float("inf"))
        final: dict[str, Any] = {}

        async def run() -> None:
            async with events_send:
                try:
                    outcome = await self._prompt(session, intent, on_event=events_send.send_nowait)
                except HttpError as exc:
                    final["error"] = {"code": exc.code, "message": exc.message}
                    return
                final["result"] = result_dict(outcome, session)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            async with events:
                async for event in events:
                    data = event_dict(event)
                    await _sse(send, data["type"], data)
        if "error" in final:
            await _sse(send, "error", {"error": final["error"]})
        else:
            await _sse(send, "result", final["result"])
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _events(self, session: Session, receive: Receive, send: Send) -> None:
        subscription = session.subscribe()
        await _start_sse(send)
        await send({"type": "http.response.body", "body": b": subscribed\n\n", "more_body": True})
        async with trio.open_nursery() as nursery:

            async def until_disconnect() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                nursery.cancel_scope.cancel()

            nursery.start_soon(until_disconnect)
            async with subscription:
                while True:
                    with trio.move_on_after(HEARTBEAT_S) as idle:
                        event = await subscription.receive()
                    if idle.cancelled_caught:
                        await send({"type": "http.response.body", "body": b": idle\n\n",
                                    "more_body": True})  # fmt: skip
                        continue
                    data = event_dict(event)
                    await _sse(send, data["type"], data)


# -- helpers ------------------------------------------------------------------------


def _allow(method: str, *allowed: str) -> None:
    if method not in allowed:
        raise HttpError(405, "method_not_allowed", f"use {' or '.join(allowed)}")


def _truthy(values: list[str] | None) -> bool:
    return bool(values) and values[-1].lower() not in ("0", "false", "no", "")  # type: ignore[index]


def _session_info(session: Session) -> dict[str, Any]:
    return {
        "session_id": session.id,
        "entity_id": session.entity_id,
        "running": session.running is not None,
        "turns": len(session.entity.turns),
    }


def _validated(model: type[pydantic.BaseModel], body: Any) -> Any:
    """``body`` checked by the model ``/openapi.json`` publishes for it (one line on failure)."""
    try:
        return model.model_validate(body)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise HttpError(400, "bad_request", f"{where}: {first['msg']}{more}") from None


def _intent(body: Any) -> str:
    if not isinstance(body, Mapping):
        raise HttpError(400, "bad_request", "the body must be a JSON object with a prompt")
    request: PromptRequest = _validated(PromptRequest, body)
    try:
        return prompt_text(request.as_params())
    except RpcError as exc:
        raise HttpError(400, "bad_request", exc.message) from None


async def _body(receive: Receive) -> Any:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise HttpError(400, "bad_request", "the client went away")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise HttpError(413, "too_large", f"the body is larger than {MAX_BODY} bytes")
        chunks.append(chunk)
        if not message.get("more_body"):
            break
    raw = b"".join(chunks)
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HttpError(400, "bad_json", f"the body is not JSON: {exc}") from None
    except RecursionError:
        raise HttpError(400, "bad_json", "the body is not JSON: nested too deeply") from None


async def _json(send: Send, status: int, data: Any) -> None:
    # Every body passes the redactor here, error bodies included (PROD-8).
    body = json.dumps(redact_value(data), default=str).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _start_sse(send: Send) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"text/event-stream"),
                (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no"),
            ],
        }
    )


async def _sse(send: Send, event: str, data: Any) -> None:
    payload = f"event: {event}\ndata: {json.dumps(redact_value(data), default=str)}\n\n".encode()
    await send({"type": "http.response.body", "body": payload, "more_body": True})


# -- serving --------------------------------------------------------------------------


async def serve_http(
    spell: Cantrip,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
    guard: Guard | None = None,
    limits: SessionLimits | None = None,
    read_timeout_s: int = 30,
) -> None:
    """Serve the HTTP API with hypercorn's trio worker until ``shutdown_trigger``
    returns (or the task is cancelled); ``task_status`` gets the bound URLs.

    ``guard`` is the request policy (default: loopback names only, no token);
    it refuses to start on a non-loopback address without a token
    (:class:`~cantrip.protocols._guard.BindError`). ``read_timeout_s`` bounds
    each socket read, so a client that stops sending is dropped."""
    from hypercorn.config import Config
    from hypercorn.trio import serve

    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 2.0
    config.read_timeout = read_timeout_s
    guard = guard if guard is not None else Guard(bind_host=host)
    guard.check_bind()
    app = HttpApp(spell, limits)
    try:
        await serve(
            guard.wrap(app),  # type: ignore[arg-type]
            config,
            shutdown_trigger=shutdown_trigger,
            task_status=task_status,
            mode="asgi",
        )
    finally:
        await app.aclose()
