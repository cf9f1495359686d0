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

Under load and at shutdown (issue 24; :mod:`cantrip.protocols._lifecycle`):
``POST /sessions`` and ``POST /sessions/{id}/prompt`` accept an
``Idempotency-Key`` header (a repeat returns the recorded result, or joins the
running cast); a cancel is sticky (it applies to a prompt starting within
``sticky_cancel_s``) and says what it cancelled; ``?cancel_on_disconnect=1``
cancels a streamed prompt whose client hangs up; too many running prompts, or a
server shutting down, get ``503`` with ``Retry-After``.

Before a request reaches a route, :mod:`._guard` has checked its Host, Origin,
token, content type, size and JSON; :mod:`._limits` bounds the sessions kept in
memory (idle ones are dropped and resumed from the loom when named again).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any
from urllib.parse import parse_qs

import pydantic
import trio

from cantrip._approval import Decision, PauseError
from cantrip._cantrip import Cantrip
from cantrip._entity import CastResult
from cantrip._errors import CantripError
from cantrip._events import Event
from cantrip._providers import ProviderScope
from cantrip._redact import get_logger, redact_value
from cantrip.protocols._acp import RpcError, prompt_text
from cantrip.protocols._api import (
    AnswerRequest,
    CreateSession,
    PromptRequest,
    openapi_document,
)
from cantrip.protocols._body import BodyError, read_json_body
from cantrip.protocols._guard import Guard
from cantrip.protocols._idempotency import BadKeyError, check_key
from cantrip.protocols._lifecycle import Drain, ServeOptions
from cantrip.protocols._limits import SessionLimits, make_room
from cantrip.protocols._sessions import (
    Session,
    SessionError,
    SessionHub,
    event_dict,
    result_dict,
    turn_dict,
)
from cantrip.protocols._viewer import Viewer

log = get_logger("cantrip.http")

Scope = Mapping[str, Any]
Receive = Callable[[], Awaitable[Mapping[str, Any]]]
Send = Callable[[Mapping[str, Any]], Awaitable[None]]

MAX_BODY = 1 << 20
HEARTBEAT_S = 15.0


class HttpError(Exception):
    def __init__(
        self, status: int, code: str, message: str, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})


SESSION_ERRORS = {"busy": 409, "key_reused": 422, "overloaded": 503, "shutting_down": 503}
"""HTTP status of each SessionError kind (422 for a reused key: the
Idempotency-Key draft, section 2.7)."""


class HttpApp:
    """The ASGI application: one cantrip, its sessions."""

    def __init__(
        self,
        spell: Cantrip,
        options: ServeOptions | None = None,
        limits: SessionLimits | None = None,
    ) -> None:
        self.spell = spell
        self.options = options or ServeOptions()
        self.hub = SessionHub(
            spell,
            sticky_cancel_s=self.options.sticky_cancel_s,
            max_running=self.options.max_running,
        )
        self.limits = limits or SessionLimits()
        self.viewer = Viewer.for_hub(self.hub)  # the browser viewer at / and /api/
        self.drain = Drain()

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self.hub.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        with self.drain.request():
            try:
                if self.drain.closing:
                    raise self._unavailable("shutting_down", "the server is shutting down")
                await self._route(scope, receive, send)
            except HttpError as exc:
                body = {"error": {"code": exc.code, "message": exc.message}}
                await _json(send, exc.status, body, exc.headers)

    def _unavailable(self, code: str, message: str) -> HttpError:
        """A 503 that tells the client when to come back (RFC 9110 15.6.4, 10.2.3)."""
        headers = {"retry-after": str(self.options.retry_after_s)}
        if code == "shutting_down":
            headers["connection"] = "close"
        return HttpError(503, code, message, headers)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        # The nursery the sessions' gate providers (MCP sessions) live in.
        providers = await ProviderScope.enter()
        self.hub.nursery = providers.nursery
        try:
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await self.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        finally:
            await self.aclose()  # the entities close their providers first
            self.hub.nursery = None
            await providers.aclose()

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        if await self.viewer.dispatch(scope, receive, send):
            return
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
                session, created = self.hub.create(_idempotency_key(scope))
                # A repeated key gets the response the key first got (201, the same
                # session), marked as a replay -- one status per outcome keeps the
                # documented contract independent of server state.
                replayed = {} if created else {"idempotent-replayed": "true"}
                await _json(send, 201, _session_info(session), replayed)
            else:
                sessions = [_session_info(s) for s in self.hub.sessions.values()]
                await _json(send, 200, {"sessions": sessions})
        elif len(parts) == 4 and parts[0] == "sessions" and parts[2] == "pending":
            _allow(method, "POST")
            session = await self._session(parts[1])
            answer = _validated(AnswerRequest, await _body(receive))
            outcome = await self._answer(session, parts[3], answer.decision_value())
            if outcome is None:  # a running prompt waited on it: that prompt answers
                await _json(send, 202, {"answered": True, "pause_id": parts[3]})
            else:
                await _json(send, 200, result_dict(outcome, session))
        elif len(parts) >= 2 and parts[0] == "sessions" and len(parts) <= 3:
            session = await self._session(parts[1])
            action = parts[2] if len(parts) == 3 else None
            if action is None:
                _allow(method, "GET")
                await _json(send, 200, _session_info(session))
            elif action == "prompt":
                _allow(method, "POST")
                key = _idempotency_key(scope)
                session.starting += 1
                try:
                    intent = _intent(await _body(receive))
                finally:
                    session.starting -= 1
                accept = dict(scope.get("headers") or []).get(b"accept", b"").decode()
                streaming = "text/event-stream" in accept or _truthy(query.get("stream"))
                if streaming:
                    hang_up = _truthy(query.get("cancel_on_disconnect"))
                    await self._prompt_stream(session, intent, receive, send, key, hang_up)
                else:
                    outcome = await self._prompt(session, intent, key=key)
                    await _json(send, 200, result_dict(outcome, session))
            elif action == "pending":
                _allow(method, "GET")
                pending = [p.to_dict() for p in session.entity.pending]
                await _json(send, 200, {**_session_info(session), "pending": pending})
            elif action == "cancel":
                _allow(method, "POST")
                await _json(send, 200, self.hub.request_cancel(session))
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

    @contextlib.contextmanager
    def arriving(self, scope: Scope) -> Iterator[None]:
        """While a prompt's body is still arriving (read by the guard), its session
        counts it as starting, so a cancel sent meanwhile applies to it (sticky)."""
        parts = [p for p in scope.get("path", "").split("/") if p]
        session = None
        if (
            scope.get("method") == "POST"
            and len(parts) == 3
            and parts[0:3:2]
            == [
                "sessions",
                "prompt",
            ]
        ):
            session = self.hub.sessions.get(parts[1])
        if session is not None:
            session.starting += 1
        try:
            yield
        finally:
            if session is not None:
                session.starting -= 1

    def _health(self) -> dict[str, Any]:
        circle = self.spell.circle
        return {
            "ok": True,
            "mode": "process",
            "running": self.hub.running,
            "cantrip": self.spell.id,
            "medium": circle.medium.name,
            "gates": list(circle.gate_names),
            "persistent": self.hub.persistent,
            "sessions": len(self.hub.sessions),
        }

    async def _answer(self, session: Session, pause_id: str, decision: Decision) -> Any:
        try:
            return await self.hub.answer(session, pause_id, decision)
        except PauseError as exc:
            raise HttpError(409, "pause_answered", str(exc)) from None
        except SessionError as exc:
            if SESSION_ERRORS.get(exc.kind) == 503:
                raise self._unavailable(exc.kind, exc.message) from None
            raise HttpError(SESSION_ERRORS.get(exc.kind, 409), exc.kind, exc.message) from None

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
        self,
        session: Session,
        intent: str,
        on_event: Callable[[Event], None] | None = None,
        *,
        key: str | None = None,
    ) -> CastResult | None:
        try:
            return await self.hub.prompt(session, intent, on_event=on_event, key=key)
        except SessionError as exc:
            if SESSION_ERRORS.get(exc.kind) == 503:
                raise self._unavailable(exc.kind, exc.message) from None
            raise HttpError(SESSION_ERRORS.get(exc.kind, 409), exc.kind, exc.message) from None
        except CantripError as exc:
            raise HttpError(500, "cast_failed", f"the cast failed: {exc}") from None
        except Exception as exc:
            log.exception("session %s: the entity crashed", session.id)
            raise HttpError(500, "crashed", f"the entity crashed: {exc!r}") from None
        finally:
            session.last_used = trio.current_time()

    async def _prompt_stream(
        self,
        session: Session,
        intent: str,
        receive: Receive,
        send: Send,
        key: str | None = None,
        cancel_on_disconnect: bool = False,
    ) -> None:
        try:
            joins = key is not None and (
                (session.current is not None and session.current.key == key)
                or self.hub.replay(session, intent, key) is not None
            )
        except SessionError as exc:  # the key was used for another prompt
            raise HttpError(SESSION_ERRORS[exc.kind], exc.kind, exc.message) from None
        if session.running is not None and not joins:
            raise HttpError(409, "busy", f"session {session.id} is already running a prompt")
        await _start_sse(send)
        events_send, events = trio.open_memory_channel[Event](float("inf"))
        sink = events_send.send_nowait
        final: dict[str, Any] = {}
        gone = trio.Event()

        async def run() -> None:
            async with events_send:
                if gone.is_set():
                    final["error"] = {"code": "client_gone", "message": "the client hung up"}
                    return
                try:
                    outcome = await self._prompt(
                        session, intent, on_event=None if joins else sink, key=key
                    )
                except HttpError as exc:
                    final["error"] = {"code": exc.code, "message": exc.message}
                    return
                final["result"] = result_dict(outcome, session)

        async def watch() -> None:
            # The body has been read: the next message is the client hanging up.
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()
            if session.sink == sink:  # our cast is running: cancel it
                log.info("session %s: the client hung up; cancelling its prompt", session.id)
                self.hub.cancel(session)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            if cancel_on_disconnect:
                nursery.start_soon(watch)
            async with events:
                async for event in events:
                    data = event_dict(event)
                    await _sse(send, data["type"], data)
            nursery.cancel_scope.cancel()  # the watcher: the cast has ended
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
            with self.drain.stream() as closing:
                async with subscription:
                    while not closing.cancel_called:
                        with trio.move_on_after(HEARTBEAT_S) as idle:
                            event = await subscription.receive()
                        if idle.cancelled_caught:
                            await send({"type": "http.response.body", "body": b": idle\n\n",
                                        "more_body": True})  # fmt: skip
                            continue
                        data = event_dict(event)
                        await _sse(send, data["type"], data)
            if closing.cancelled_caught:  # the server shuts down: say so, end the stream
                await _sse(send, "shutdown", {"type": "shutdown"})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                nursery.cancel_scope.cancel()


# -- helpers ------------------------------------------------------------------------


def _allow(method: str, *allowed: str) -> None:
    if method not in allowed:
        raise HttpError(405, "method_not_allowed", f"use {' or '.join(allowed)}")


_FLAGS = {"1": True, "true": True, "0": False, "false": False}
"""The values a yes/no query parameter takes (as ``/openapi.json`` documents them)."""


def _truthy(values: list[str] | None) -> bool:
    """A yes/no query parameter; anything else is a 400, not silently "no"."""
    if not values:
        return False
    flag = _FLAGS.get(values[-1])
    if flag is None:
        raise HttpError(400, "bad_request", "a yes/no query parameter takes 1, 0, true or false")
    return flag


def _session_info(session: Session) -> dict[str, Any]:
    return {
        "session_id": session.id,
        "entity_id": session.entity_id,
        "running": session.running is not None,
        "turns": len(session.entity.turns),
    }


def _idempotency_key(scope: Scope) -> str | None:
    for name, value in scope.get("headers") or ():
        if name == b"idempotency-key":
            try:
                return check_key(value.decode("latin-1"))
            except BadKeyError as exc:
                raise HttpError(400, "bad_idempotency_key", str(exc)) from None
    return None


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
    try:
        return await read_json_body(receive, MAX_BODY)
    except BodyError as exc:
        raise HttpError(exc.status, exc.code, exc.message) from None


async def _json(
    send: Send, status: int, data: Any, headers: Mapping[str, str] | None = None
) -> None:
    # Every body passes the redactor here, error bodies included (PROD-8).
    body = json.dumps(redact_value(data), default=str).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *((k.encode(), v.encode()) for k, v in (headers or {}).items()),
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
    options: ServeOptions | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
    guard: Guard | None = None,
    limits: SessionLimits | None = None,
    read_timeout_s: int = 30,
) -> None:
    """Serve the HTTP API with hypercorn's trio worker until ``shutdown_trigger``
    returns (or the task is cancelled); ``task_status`` gets the bound URLs.

    When ``shutdown_trigger`` returns, the server drains first (see
    :class:`~cantrip.protocols._lifecycle.Drain`): every open request is
    answered before hypercorn stops listening and closes connections.

    ``guard`` is the request policy (default: loopback names only, no token);
    it refuses to start on a non-loopback address without a token
    (:class:`~cantrip.protocols._guard.BindError`). ``read_timeout_s`` bounds
    each socket read, so a client that stops sending is dropped."""
    from hypercorn.config import Config
    from hypercorn.trio import serve

    app = HttpApp(spell, options, limits)
    options = app.options
    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None
    config.keep_alive_timeout = options.keep_alive_s
    config.backlog = options.backlog
    config.graceful_timeout = 5.0  # only idle connections are left by then
    config.read_timeout = read_timeout_s
    guard = guard if guard is not None else Guard(bind_host=host)
    guard.check_bind()

    async def drained() -> None:
        if shutdown_trigger is None:
            await trio.sleep_forever()
        else:
            await shutdown_trigger()
        await app.drain.close(app.hub, options)

    try:
        await serve(
            guard.wrap(app, app.arriving),  # type: ignore[arg-type]
            config,
            shutdown_trigger=drained,
            task_status=task_status,
            mode="asgi",
        )
    finally:
        await app.aclose()
