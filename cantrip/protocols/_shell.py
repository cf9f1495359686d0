"""The server shell both session servers share: the ASGI entry, the shutdown drain,
error answers, long-lived event streams and the hypercorn serve loop.

``cantrip serve`` (:class:`~cantrip.protocols._http.HttpApp`) and ``cantrip serve
--db`` (:class:`~cantrip.protocols._db_http.DbHttpApp`) differ in where a session
lives and who runs its casts, not in how a request is taken in or how the server
goes down. That part is here, once; what each does differently is an override
named for it: :meth:`ServerShell._route` (the routes), :meth:`ServerShell._lifetime`
(what lives as long as the server) and :meth:`ServerShell.shutdown` (what the drain
waits for: the in-process casts, or a replica's waits on its workers).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from cantrip.protocols._asgi import (
    HttpError,
    Receive,
    Scope,
    Send,
    end_body,
    error_response,
    sse,
    sse_comment,
    start_sse,
)
from cantrip.protocols._lifecycle import Drain, ServeOptions
from cantrip.protocols._request import (
    until_disconnect,
)
from cantrip.protocols._sessions import SessionError

SESSION_ERRORS = {"busy": 409, "key_reused": 422, "overloaded": 503, "shutting_down": 503}
"""HTTP status of each SessionError kind (422 for a reused key: the
Idempotency-Key draft, section 2.7)."""


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
        with self.drain.request():
            try:
                if self.drain.closing:
                    raise self._unavailable("shutting_down", "the server is shutting down")
                await self._route(scope, receive, send)
            except HttpError as exc:
                await error_response(send, exc)

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
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
        (409, 422), or no room now (503 + ``Retry-After``)."""
        if exc.kind == "not_found":
            return HttpError(404, "unknown_session", exc.message)
        if SESSION_ERRORS.get(exc.kind) == 503:
            return self._unavailable(exc.kind, exc.message)
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
