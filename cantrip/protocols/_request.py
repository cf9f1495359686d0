"""What a request to a session server carries, parsed the one way both servers
(:mod:`._http`, :mod:`._db_http`) promise in ``/openapi.json``: the method, yes/no
query flags, the ``Idempotency-Key``, the JSON body and the prompt in it. Each
failure is an :class:`~cantrip.protocols._asgi.HttpError` with a one-line message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pydantic

from cantrip.protocols._acp import RpcError, prompt_text
from cantrip.protocols._api import PromptRequest
from cantrip.protocols._asgi import HttpError, Receive, Scope
from cantrip.protocols._body import BodyError, read_json_body
from cantrip.protocols._idempotency import BadKeyError, check_key

MAX_BODY = 1 << 20
NUL = "\x00"
NUL_MESSAGE = "text cannot hold a NUL character (U+0000): found in {where}"
"""Issue 28.5: PostgreSQL text (and jsonb) cannot hold U+0000, so ``serve --db`` could not
store such a prompt or look up such an id. Both servers refuse it while the request is
parsed -- one API -- before anything reaches a store."""


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
    """The JSON body: 400 if it holds a NUL (:data:`NUL_MESSAGE`) anywhere but under
    ``args`` -- an answer's edited arguments are free-form JSON for the gate, which the
    in-process server hands on as they are (``serve --db`` cannot store a NUL there:
    PostgreSQL's refusal becomes the same 400, see ``DbHttpApp._db``)."""
    try:
        body = await read_json_body(receive, MAX_BODY)
    except BodyError as exc:
        raise HttpError(exc.status, exc.code, exc.message) from None
    checked = {k: v for k, v in body.items() if k != "args"} if isinstance(body, dict) else body
    where = _nul_in(checked)
    if where is not None:
        raise _nul("the body" + (f" at {where}" if where else ""))
    return body


def refuse_nul(scope: Scope) -> None:
    """400 if the request's path or query holds a NUL (``%00`` included)."""
    if NUL in scope["path"]:
        raise _nul("the path")
    raw = scope.get("query_string", b"")
    if b"\x00" in raw or b"%00" in raw:
        raise _nul("the query")


def _nul(where: str) -> HttpError:
    return HttpError(400, "bad_request", NUL_MESSAGE.format(where=where))


def _nul_in(value: Any, at: str = "") -> str | None:
    """Where in JSON data a NUL is (``content.0.text``; ``x (a key)``), or None.
    Iterative: a body nested as deeply as the guard allows cannot exhaust the stack."""
    stack: list[tuple[Any, str]] = [(value, at)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if NUL in item:
                return where
        elif isinstance(item, dict):
            for key, inner in item.items():
                path = f"{where}.{key}" if where else str(key)
                if NUL in key:
                    return f"{where} (a key)" if where else "a key"
                stack.append((inner, path))
        elif isinstance(item, list):
            stack.extend(
                (inner, f"{where}.{i}" if where else str(i)) for i, inner in enumerate(item)
            )
    return None


async def until_disconnect(receive: Receive) -> None:
    """Once the body is read, the next message is the client hanging up."""
    while (await receive())["type"] != "http.disconnect":
        pass
