"""What a request to a session server carries, parsed the one way the HTTP API
(:mod:`cantrip.protocols.http`, both modes) promises in ``/openapi.json``: the method, yes/no
query flags, the ``Idempotency-Key``, the JSON body and the prompt in it. Each
failure is an :class:`~cantrip.protocols.asgi._responses.HttpError` with a one-line message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pydantic

from cantrip.protocols.asgi._api_models import PromptRequest
from cantrip.protocols.asgi._body import BodyError, read_json_body
from cantrip.protocols.asgi._responses import HttpError, Receive, Scope
from cantrip.protocols.sessions._idempotency import BadKeyError, check_key
from cantrip.protocols.sessions._ids import MAX_ID, BadIdError, client_id
from cantrip.protocols.sessions._prompts import PromptError, read_prompt

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


def last_event_id(scope: Scope) -> str | None:
    """The ``Last-Event-ID`` a reconnecting SSE client sends (the last one, if it sent
    several), stripped; None if none. Each stream reads its own id grammar from it
    (a session's ``/events`` an event id or a turn count, an AG-UI run a place in the
    run): the header is read here once for both."""
    raw: str | None = None
    for name, value in scope.get("headers") or ():
        if name.lower() == b"last-event-id":
            raw = value.decode("latin-1").strip()
    return raw


def request_id(raw: str, what: str, max_length: int = MAX_ID) -> str:
    """An id the request carries, checked by the one parse of client ids
    (:func:`~cantrip.protocols.sessions._ids.client_id`): a 400 if it is not usable."""
    try:
        return client_id(raw, what, max_length)
    except BadIdError as exc:
        raise HttpError(400, "bad_request", str(exc)) from None


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
        return read_prompt(request.as_params())
    except PromptError as exc:
        raise HttpError(400, "bad_request", str(exc)) from None


async def read_body(receive: Receive) -> Any:
    """The JSON body: 400 if a text field the server stores holds a NUL
    (:data:`NUL_MESSAGE`; :func:`_nul_in`)."""
    try:
        body = await read_json_body(receive, MAX_BODY)
    except BodyError as exc:
        raise HttpError(exc.status, exc.code, exc.message) from None
    where = _nul_in(body)
    if where is not None:
        raise _nul(f"the body at {where}")
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


_TEXT_FIELDS = ("prompt", "intent", "text", "content", "reason")
"""The body fields whose text the servers keep (a prompt's, an answer's reason or reply):
checked here against the NUL the published schema excludes (``/openapi.json``). Other
members -- an answer's free-form ``args`` for the gate, extra members of a content
block -- are not: the in-process server hands them on as they are, and ``serve --db``
answers a NUL there with the 400 PostgreSQL's refusal becomes (``PostgresBackend._db``)."""


def _nul_in(body: Any) -> str | None:
    """Where in a body's text fields a NUL is (``prompt``, ``content.0.text``), or None."""
    if not isinstance(body, Mapping):
        return None
    for key in _TEXT_FIELDS:
        value = body.get(key)
        if isinstance(value, str):
            if NUL in value:
                return key
        elif isinstance(value, list):
            for i, block in enumerate(value):
                for where, text in _block_texts(block):
                    if NUL in text:
                        return f"{key}.{i}{where}"
    return None


def _block_texts(block: Any) -> list[tuple[str, str]]:
    """A content block's texts: itself (a string), ``text``, and a resource's ``text``
    and ``uri``."""
    if isinstance(block, str):
        return [("", block)]
    if not isinstance(block, Mapping):
        return []
    found = [(".text", block["text"])] if isinstance(block.get("text"), str) else []
    resource = block.get("resource")
    if isinstance(resource, Mapping):
        for name in ("text", "uri"):
            if isinstance(resource.get(name), str):
                found.append((f".resource.{name}", resource[name]))
    return found


async def until_disconnect(receive: Receive) -> None:
    """Once the body is read, the next message is the client hanging up."""
    while (await receive())["type"] != "http.disconnect":
        pass
