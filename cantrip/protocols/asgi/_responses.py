"""What our HTTP servers send: errors, JSON and server-sent events, over plain ASGI.

``cantrip serve`` and ``cantrip serve --db`` are one app
(:class:`cantrip.protocols.http._app.HttpApp`) over either session backend, with one
OpenAPI document (:mod:`._openapi`), and the request guard
(:mod:`cantrip.protocols.middleware._guard`) answers in the same error shape. Every
answer is built here, once, so no two front ends can drift apart in how a body is
redacted or how an error reads. What a request carries is parsed in :mod:`._requests`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from cantrip._redact import redact_value

Scope = Mapping[str, Any]
Receive = Callable[[], Awaitable[Mapping[str, Any]]]
Send = Callable[[Mapping[str, Any]], Awaitable[None]]

HEARTBEAT_S = 15.0
"""An idle event stream gets a comment this often, so proxies keep it open (the
default of ``cantrip serve --heartbeat-s``)."""
_heartbeat_s = HEARTBEAT_S


def heartbeat_s() -> float:
    """Seconds between the comments an idle event stream gets (see :data:`HEARTBEAT_S`)."""
    return _heartbeat_s


def set_heartbeat_s(seconds: float) -> None:
    """Set :func:`heartbeat_s` for this process's servers (``serve --heartbeat-s``): below
    the idle timeout of every proxy between the server and its clients."""
    global _heartbeat_s
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"--heartbeat-s {seconds} is not a positive number of seconds")
    _heartbeat_s = seconds


class HttpError(Exception):
    """An answer other than success: its status, ``{"error": {"code", "message"}}``
    and any headers (``Retry-After``)."""

    def __init__(
        self, status: int, code: str, message: str, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})


def not_found(scope: Scope) -> HttpError:
    return HttpError(404, "not_found", f"no route {scope['path']!r}")


# -- answers -----------------------------------------------------------------------------


async def json_response(
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


async def error_response(send: Send, exc: HttpError) -> None:
    body = {"error": {"code": exc.code, "message": exc.message}}
    await json_response(send, exc.status, body, exc.headers)


async def start_sse(send: Send, headers: Mapping[str, str] | None = None) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"text/event-stream"),
                (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no"),
                *((k.encode(), v.encode()) for k, v in (headers or {}).items()),
            ],
        }
    )


async def sse(send: Send, event: str, data: Any, *, event_id: str | None = None) -> None:
    """One event; with ``event_id``, its SSE ``id`` (a client reconnects with it as
    ``Last-Event-ID``)."""
    said = f"id: {event_id}\n" if event_id is not None else ""
    payload = f"{said}event: {event}\ndata: {json.dumps(redact_value(data), default=str)}\n\n"
    payload_bytes = payload.encode()
    await send({"type": "http.response.body", "body": payload_bytes, "more_body": True})


async def sse_comment(send: Send, text: str) -> None:
    """A comment line: no event for the client, but bytes that keep the stream open."""
    await send({"type": "http.response.body", "body": f": {text}\n\n".encode(), "more_body": True})


async def sse_error(send: Send, exc: HttpError) -> None:
    """A stream that already answered 200 reports its failure as an ``error`` event."""
    await sse(send, "error", {"error": {"code": exc.code, "message": exc.message}})


async def end_body(send: Send) -> None:
    await send({"type": "http.response.body", "body": b"", "more_body": False})
