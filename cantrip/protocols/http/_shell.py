"""The server shell both session servers share: the ASGI entry, the route table,
the shutdown drain, error answers, long-lived event streams and the serve loop.

``cantrip serve`` (:class:`~cantrip.protocols.http._app.HttpApp`) and ``cantrip serve
--db`` (:class:`~cantrip.protocols.http._db_app.DbHttpApp`) promise one API (one
``/openapi.json``) and differ in where a session lives and who runs its casts, not
in how a request is routed, refused or drained. That part is here, once, so a route
or a status cannot change in one server and not the other. What each does
differently is a hook named for it: the answers to the routes (``_create``,
``_prompt_result``, ``_turns``...), :meth:`ServerShell._before_route` (the in-process
server's browser viewer), :meth:`ServerShell._lifetime` (what lives as long as the
server) and :meth:`ServerShell.shutdown` (what the drain waits for: the in-process
casts, or a replica's waits on its workers).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

import trio

from cantrip._approval import Decision
from cantrip.protocols.asgi._openapi import (
    ON_BUSY,
    AnswerRequest,
    CancelRequest,
    CreateSession,
    SteerRequest,
    openapi_document,
)
from cantrip.protocols.asgi._requests import (
    allow,
    idempotency_key,
    prompt_intent,
    read_body,
    refuse_nul,
    truthy,
    until_disconnect,
    validated,
    wants_stream,
)
from cantrip.protocols.asgi._responses import (
    HttpError,
    Receive,
    Scope,
    Send,
    end_body,
    error_response,
    json_response,
    not_found,
    sse,
    sse_comment,
    sse_error,
    start_sse,
)
from cantrip.protocols.middleware._lifecycle import Drain, ServeOptions
from cantrip.protocols.sessions._hub import SessionError
from cantrip.protocols.sessions._steering import FULL as STEERING_FULL

SESSION_ERRORS = {
    "busy": 409,
    "not_running": 409,
    "key_reused": 422,
    "overloaded": 503,
    "shutting_down": 503,
    STEERING_FULL: 429,
}
"""HTTP status of each SessionError kind (422 for a reused key: the
Idempotency-Key draft, section 2.7; 429 for a cast that has taken all the steering it
takes, :mod:`._steering`)."""


class ServerShell:
    """An ASGI application that drains at shutdown and answers errors as JSON."""

    options: ServeOptions
    drain: Drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        started = False

        async def sending(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        with self.drain.request():
            try:
                if self.drain.closing:
                    raise self._unavailable("shutting_down", "the server is shutting down")
                await self._route(scope, receive, sending)
            except* HttpError as group:
                # also one raised inside a stream's nursery (trio groups those)
                exc = _first(group)
                if not started:
                    await error_response(send, exc)
                else:  # an event stream already answered 200: its last event says why
                    await sse_error(send, exc)
                    await end_body(send)

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The routes ``/openapi.json`` documents, the same for every server: the path
        and method are checked here (404 before 405, an unknown session before a wrong
        method), the server answers through the hooks below."""
        if await self._before_route(scope, receive, send):
            return
        refuse_nul(scope)
        method = scope["method"]
        parts = [p for p in scope["path"].split("/") if p]
        query = parse_qs(scope.get("query_string", b"").decode())
        if parts == ["health"]:
            allow(method, "GET")
            await json_response(send, 200, await self._health_report())
        elif parts == ["openapi.json"]:
            allow(method, "GET")
            await json_response(send, 200, self._openapi())
        elif parts == ["agui"]:  # AG-UI (protocols._agui), beside the API it translates
            allow(method, "POST")
            await self._agui(receive, send)
        elif parts == ["sessions"]:
            allow(method, "GET", "POST")
            if method == "POST":
                validated(CreateSession, await read_body(receive))
                info, created = await self._create(idempotency_key(scope))
                # A repeated key gets the response the key first got (201, the same
                # session), marked as a replay -- one status per outcome keeps the
                # documented contract independent of server state.
                replayed = {} if created else {"idempotent-replayed": "true"}
                await json_response(send, 201, info, replayed)
            else:
                await json_response(send, 200, {"sessions": await self._list()})
        elif len(parts) == 4 and parts[0] == "sessions" and parts[2] == "pending":
            allow(method, "POST")
            session = await self._session(parts[1])
            answer = validated(AnswerRequest, await read_body(receive))
            outcome = await self._answer(session, parts[3], answer.decision_value())
            if outcome is None:  # a running prompt waited on it: that prompt answers
                await json_response(send, 202, {"answered": True, "pause_id": parts[3]})
            else:
                await json_response(send, 200, outcome)
        elif len(parts) >= 2 and parts[0] == "sessions" and len(parts) <= 3:
            session = await self._session(parts[1])
            action = parts[2] if len(parts) == 3 else None
            if action is None:
                allow(method, "GET")
                await json_response(send, 200, self._info(session))
            elif action == "prompt":
                allow(method, "POST")
                key = idempotency_key(scope)
                on_busy = self._on_busy(query)
                intent = await self._read_prompt(session, scope, receive)
                if wants_stream(scope, query):
                    hang_up = truthy(query.get("cancel_on_disconnect"))
                    await self._prompt_stream(
                        session, intent, key, scope, receive, send, hang_up, on_busy
                    )
                else:
                    result = await self._prompt_result(
                        session, intent, key, on_busy, scope, receive
                    )
                    if result is not None:  # None: the client hung up, nobody to answer
                        await json_response(send, 200, result, _prompt_id_header(result))
            elif action == "messages":
                allow(method, "POST")
                text = validated(SteerRequest, await read_body(receive)).text.strip()
                if not text:  # what the schema's pattern lets through and str.strip() drops
                    raise HttpError(400, "bad_request", "a steering message needs some text")
                await json_response(send, 202, await self._steer(session, text))
            elif action == "pending":
                allow(method, "GET")
                pending = await self._pending_calls(session)
                await json_response(send, 200, {**self._info(session), "pending": pending})
            elif action == "cancel":
                allow(method, "POST")
                target = validated(CancelRequest, await read_body(receive))
                await json_response(send, 200, await self._cancel(session, target))
            elif action == "thread":
                allow(method, "GET")
                turns = await self._turns(session)
                await json_response(send, 200, {**self._info(session), "turns": turns})
            elif action == "events":
                allow(method, "GET")
                await self._events(session, receive, send)
            else:
                raise not_found(scope)
        else:
            raise not_found(scope)

    # -- what each server answers the routes with (``session`` is its own handle) --------

    async def _before_route(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """True if the request was answered before the API's routes (none by default)."""
        return False

    async def _agui(self, receive: Receive, send: Send) -> None:
        """``POST /agui``: an AG-UI run (each server calls the one run,
        :func:`cantrip.protocols.agui._run.serve_agui`, with its session backend)."""
        raise HttpError(404, "not_found", "this server does not speak AG-UI")

    async def _health_report(self) -> dict[str, Any]:
        """``GET /health``: what the server serves, and how busy it is."""
        raise NotImplementedError

    async def _create(self, key: str | None) -> tuple[dict[str, Any], bool]:
        """A new session's info, and False if ``key`` named an existing one."""
        raise NotImplementedError

    async def _list(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def _session(self, session_id: str) -> Any:
        """The session named (404 ``unknown_session`` if there is none)."""
        raise NotImplementedError

    def _info(self, session: Any) -> dict[str, Any]:
        raise NotImplementedError

    async def _answer(
        self, session: Any, pause_id: str, decision: Decision
    ) -> dict[str, Any] | None:
        """The continued cast's result, or None if a running prompt took the answer."""
        raise NotImplementedError

    async def _read_prompt(self, session: Any, scope: Scope, receive: Receive) -> str:
        return prompt_intent(await read_body(receive))

    def _on_busy(self, query: dict[str, list[str]]) -> str:
        """The prompt's double-texting policy: the request's, else the server's."""
        given = query.get("on_busy")
        if not given:
            return self.options.on_busy
        if given[-1] not in ON_BUSY:
            raise HttpError(400, "bad_request", f"on_busy must be one of {', '.join(ON_BUSY)}")
        return given[-1]

    async def _steer(self, session: Any, text: str) -> dict[str, Any]:
        raise NotImplementedError

    def _openapi(self) -> dict[str, Any]:
        """The document ``/openapi.json`` serves: what this server answers."""
        return openapi_document()

    async def _prompt_result(
        self,
        session: Any,
        intent: str,
        key: str | None,
        on_busy: str,
        scope: Scope,
        receive: Receive,
    ) -> dict[str, Any] | None:
        """The cast's result; its ``prompt_id`` is sent as the ``Prompt-Id`` header too.
        None if the client hung up first: its request ends at once (so its connection
        is released), while the cast runs on and is recorded."""
        raise NotImplementedError

    async def _prompt_stream(
        self,
        session: Any,
        intent: str,
        key: str | None,
        scope: Scope,
        receive: Receive,
        send: Send,
        cancel_on_disconnect: bool,
        on_busy: str,
    ) -> None:
        """The cast's events; the stream starts with a ``Prompt-Id`` header and a
        ``prompt`` event (:func:`start_prompt_stream`) before anything else."""
        raise NotImplementedError

    async def _pending_calls(self, session: Any) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def _cancel(self, session: Any, target: CancelRequest) -> dict[str, Any]:
        """Cancel what ``target`` names (nothing named: the running prompt); the
        ``Cancelled`` answer."""
        raise NotImplementedError

    async def _turns(self, session: Any) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def _events(self, session: Any, receive: Receive, send: Send) -> None:
        raise NotImplementedError

    async def shutdown(self) -> None:
        """Drain: stop taking work, wait for it within the grace period, answer everyone."""
        raise NotImplementedError

    def _lifetime(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """What lives from the lifespan's start to its end (nothing, unless overridden)."""
        return contextlib.nullcontext()

    async def _shutting_down(self) -> None:
        """Run when the lifespan says shutdown, before it is acknowledged."""

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        async with self._lifetime():
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await self._shutting_down()
                    await send({"type": "lifespan.shutdown.complete"})
                    return

    def _unavailable(self, code: str, message: str) -> HttpError:
        """A 503 that tells the client when to come back (RFC 9110 15.6.4, 10.2.3)."""
        headers = {"retry-after": str(self.options.retry_after_s)}
        if code == "shutting_down":
            headers["connection"] = "close"
        return HttpError(503, code, message, headers)

    def _session_error(self, exc: SessionError) -> HttpError:
        """The answer to a session that refused: unknown (404), busy or a reused key
        (409, 422), too much steering (429 + ``Retry-After``), or no room now (503 +
        ``Retry-After``)."""
        if exc.kind == "not_found":
            return HttpError(404, "unknown_session", exc.message)
        if SESSION_ERRORS.get(exc.kind) == 503:
            return self._unavailable(exc.kind, exc.message)
        if SESSION_ERRORS.get(exc.kind) == 429:
            retry = {"retry-after": str(self.options.retry_after_s)}
            return HttpError(429, exc.kind, exc.message, retry)
        return HttpError(SESSION_ERRORS.get(exc.kind, 409), exc.kind, exc.message)

    async def _event_stream(
        self, receive: Receive, send: Send, pump: Callable[[trio.CancelScope], Awaitable[None]]
    ) -> None:
        """``GET /sessions/{id}/events``: ``pump`` sends the events until the client
        hangs up or the server shuts down (then a ``shutdown`` event ends the stream).
        ``pump`` gets the drain's scope: it runs while ``not scope.cancel_called``."""
        await start_sse(send)
        await sse_comment(send, "subscribed")
        async with trio.open_nursery() as nursery:

            async def hang_up() -> None:
                await until_disconnect(receive)
                nursery.cancel_scope.cancel()

            nursery.start_soon(hang_up)
            with self.drain.stream() as closing:
                await pump(closing)
            if closing.cancelled_caught:  # the server shuts down: say so, end the stream
                await sse(send, "shutdown", {"type": "shutdown"})
                await end_body(send)
                nursery.cancel_scope.cancel()


def _first(group: BaseExceptionGroup[HttpError]) -> HttpError:
    """The first error of a group (however nested): the one the client is told."""
    first = group.exceptions[0]
    return first if isinstance(first, HttpError) else _first(first)


def _prompt_id_header(result: dict[str, Any]) -> dict[str, str]:
    prompt_id = result.get("prompt_id")
    return {"prompt-id": prompt_id} if isinstance(prompt_id, str) else {}


async def start_prompt_stream(send: Send, prompt_id: str, session_id: str, key: str | None) -> None:
    """A prompt's event stream begins: its id in the ``Prompt-Id`` header and in the
    first event, so a client can name this prompt in a cancel from the start."""
    await start_sse(send, {"prompt-id": prompt_id})
    data = {"type": "prompt", "prompt_id": prompt_id, "session_id": session_id}
    await sse(send, "prompt", {**data, "idempotency_key": key})


async def serve_asgi(
    app: ServerShell,
    asgi: Any,
    host: str,
    port: int,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None,
    read_timeout_s: int,
    task_status: trio.TaskStatus[list[str]],
) -> None:
    """Serve ``asgi`` (``app`` behind its guard) with hypercorn's trio worker until
    ``shutdown_trigger`` returns and ``app`` has drained (or the task is cancelled);
    ``task_status`` gets the bound URLs. Only idle connections are left when the
    drain ends, so hypercorn's own grace is short."""
    from hypercorn.config import Config
    from hypercorn.trio import serve

    from cantrip.protocols.middleware._hypercorn import install

    install()  # a client that hangs up frees its connection now, not after keep-alive

    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None
    config.keep_alive_timeout = app.options.keep_alive_s
    config.backlog = app.options.backlog
    config.graceful_timeout = 5.0  # only idle connections are left by then
    config.read_timeout = read_timeout_s

    async def drained() -> None:
        if shutdown_trigger is None:
            await trio.sleep_forever()
        else:
            await shutdown_trigger()
        await app.shutdown()

    await serve(asgi, config, shutdown_trigger=drained, task_status=task_status, mode="asgi")
