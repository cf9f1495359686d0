"""The HTTP wire both session servers speak: errors, JSON and SSE responses, and the
parsing of what a request carries.

``cantrip serve`` (:mod:`._http`, entities in process) and ``cantrip serve --db``
(:mod:`._db_http`, a replica over PostgreSQL) promise the same routes, JSON shapes
and errors (one OpenAPI document, :mod:`._api`). Their answers are built here, once,
so the two cannot drift apart in how a body is redacted, how an error reads or how
a query flag is parsed. Plain ASGI, no framework.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import pydantic

from cantrip._redact import redact_value
from cantrip.protocols._acp import RpcError, prompt_text
from cantrip.protocols._api import PromptRequest
from cantrip.protocols._body import BodyError, read_json_body
from cantrip.protocols._idempotency import BadKeyError, check_key

Scope = Mapping[str, Any]
Receive = Callable[[], Awaitable[Mapping[str, Any]]]
Send = Callable[[Mapping[str, Any]], Awaitable[None]]

MAX_BODY = 1 << 20
HEARTBEAT_S = 15.0
"""An idle event stream gets a comment this often, so proxies keep it open."""


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


# -- what a request carries --------------------------------------------------------------


def allow(method: str, *allowed: str) -> None:
    if method not in allowed:
        raise HttpError(405, "method_not_allowed", f"use {' or '.join(allowed)}")


_FLAGS = {"1": True, "true": True, "0": False, "false": False}
"""The values a yes/no query parameter takes (as ``/openapi.json`` documents them)."""


def truthy(values: list[str] | None) -> bool:
    """A yes/no query parameter; anything else is a 400, not silently "no"."""
    if not values:
        return False
    flag = _FLAGS.get(values[-1])
    if flag is None:
        raise HttpError(400, "bad_request", "a yes/no query parameter takes 1, 0, true or false")
    return flag


def wants_stream(scope: Scope, query: Mapping[str, list[str]]) -> bool:
    """A prompt answered as server-sent events: ``Accept: text/event-stream`` or ``?stream=1``."""
    accept = dict(scope.get("headers") or []).get(b"accept", b"").decode()
    return "text/event-stream" in accept or truthy(query.get("stream"))


def idempotency_key(scope: Scope) -> str | None:
    for name, value in scope.get("headers") or ():
        if name == b"idempotency-key":
            try:
                return check_key(value.decode("latin-1"))
            except BadKeyError as exc:
                raise HttpError(400, "bad_idempotency_key", str(exc)) from None
    return None


def validated(model: type[pydantic.BaseModel], body: Any) -> Any:
    """``body`` checked by the model ``/openapi.json`` publishes for it (one line on failure)."""
    try:
        return model.model_validate(body)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise HttpError(400, "bad_request", f"{where}: {first['msg']}{more}") from None


def prompt_intent(body: Any) -> str:
    """The prompt's text from a ``POST /sessions/{id}/prompt`` body."""
    if not isinstance(body, Mapping):
        raise HttpError(400, "bad_request", "the body must be a JSON object with a prompt")
    request: PromptRequest = validated(PromptRequest, body)
    try:
        return prompt_text(request.as_params())
    except RpcError as exc:
        raise HttpError(400, "bad_request", exc.message) from None


async def read_body(receive: Receive) -> Any:
    try:
        return await read_json_body(receive, MAX_BODY)
    except BodyError as exc:
        raise HttpError(exc.status, exc.code, exc.message) from None


async def until_disconnect(receive: Receive) -> None:
    """Once the body is read, the next message is the client hanging up."""
    while (await receive())["type"] != "http.disconnect":
        pass


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


async def start_sse(send: Send) -> None:
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


async def sse(send: Send, event: str, data: Any) -> None:
    payload = f"event: {event}\ndata: {json.dumps(redact_value(data), default=str)}\n\n".encode()
    await send({"type": "http.response.body", "body": payload, "more_body": True})


async def sse_comment(send: Send, text: str) -> None:
    """A comment line: no event for the client, but bytes that keep the stream open."""
    await send({"type": "http.response.body", "body": f": {text}\n\n".encode(), "more_body": True})


async def sse_error(send: Send, exc: HttpError) -> None:
    """A stream that already answered 200 reports its failure as an ``error`` event."""
    await sse(send, "error", {"error": {"code": exc.code, "message": exc.message}})


async def end_body(send: Send) -> None:
    await send({"type": "http.response.body", "body": b"", "more_body": False})
