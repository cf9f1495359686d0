"""Provider faults as cantrip's errors: HTTP statuses, transport failures, broken answers.

Why apart from the adapter: what a failure *means* -- its ``code``, whether a
retry can help (``retryable``), how long the provider asked us to wait
(``retry_after``) -- is one policy that every adapter, streamed or not, must
apply alike, and the retry and fallback layers read. Here:

* an HTTP error status becomes a :class:`~cantrip.ProviderError` with
  ``status``, ``code``, ``retryable`` (429, 5xx) and ``retry_after``
  (``Retry-After``, ``retry-after-ms`` or Google's RetryInfo); a 400 or 413
  that says the context is too long is ``context_length_exceeded``;
* a transport failure (connection refused or dropped, timeout, a body that
  does not decode, one too large) gets its code, retryable where asking again
  can help, with a hint where nothing answers at the provider's address;
* a 200 that is not a whole answer -- a body that is not a JSON object, a
  stream event that is not one -- is retryable too: it carries no status for
  a policy to judge (issues 13 and 23).
"""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import Mapping
from typing import Any

import httpx
import orjson

from cantrip._errors import ProviderError
from cantrip.llm._openai_chat import error_from_payload
from cantrip.llm.providers._decode import ResponseTooLarge

_CONTEXT_HINTS = (
    "context length",
    "context_length",
    "context window",
    "prompt is too long",
    "maximum number of tokens",
    "too many tokens",
    "maximum context",
    "context size",  # llama.cpp's llama-server: "exceeds the available context size"
)
TRANSPORT_CODES = frozenset({"stream_interrupted", "timeout"})
"""Codes of a connection lost mid-stream (harmless once the final event was read)."""
HTTP_FAULTS = (httpx.TransportError, httpx.DecodingError)
"""What a request's HTTP exchange may raise: a transport fault, or a body that does not
decode (``DecodingError`` is no ``TransportError``: it escaped the adapters before)."""


def corrupt_event(provider: str, data: str) -> ProviderError:
    """A stream event whose data is not the JSON object the API promises.

    A stream with a hole in it cannot be folded into a whole answer, so it is
    a transient provider fault: the retry layer asks again inside the turn
    (issue 23); nothing of the broken attempt is recorded.
    """
    snippet = data[:120]
    return ProviderError(
        f"{provider}: the stream carried an event that is not a JSON object: {snippet!r}",
        retryable=True,
        code="malformed_stream",
    )


def event_json(provider: str, data: str) -> Any:
    """A stream event's JSON; an event that is none is :func:`corrupt_event`."""
    try:
        return json.loads(data)
    except ValueError:
        raise corrupt_event(provider, data) from None


def event_object(provider: str, data: str) -> dict[str, Any]:
    """A stream event's JSON object; an event that is none is :func:`corrupt_event`."""
    value = event_json(provider, data)
    if not isinstance(value, dict):
        raise corrupt_event(provider, data)
    return value


def incomplete_stream(provider: str, how: str) -> ProviderError:
    """A stream that ended before its terminal event (``how`` it ended): cut, so no whole
    answer, and retryable like a dropped connection."""
    return ProviderError(
        f"{provider}: the stream ended {how}", retryable=True, code="stream_incomplete"
    )


def read_payload(provider: str, body: bytes, status: int) -> Mapping[str, Any]:
    """The JSON object of a response body; a body that is not one is a retryable fault."""
    payload = _json(body)
    if not isinstance(payload, Mapping):
        snippet = body[:200].decode("utf-8", errors="replace")
        # A 200 whose body is cut or garbled is a transient fault, like a dropped
        # connection (issue 13): it carries no error status for a policy to judge.
        raise ProviderError(
            f"{provider}: the response is not a JSON object: {snippet!r}",
            status=status if status >= 400 else None,
            retryable=True,
            code="malformed_response",
        )
    return payload


def _json(body: bytes) -> Any:
    """The JSON value of a body, None when it holds none.

    orjson reads the bytes ~4x faster, into the same values (but integers beyond
    64 bits, which it reads as floats: no provider sends such counts); what it
    refuses (NaN, lone surrogates, ...) the standard library still reads."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return None


def status_error(
    provider: str, status: int, headers: Mapping[str, str], body: bytes
) -> ProviderError:
    """An HTTP error status (and the error object in its body) as a ProviderError."""
    payload = _json(body)
    if isinstance(payload, list) and payload and isinstance(payload[0], Mapping):
        payload = payload[0]  # Google sometimes wraps the error in a list
    error: Any = payload.get("error") if isinstance(payload, Mapping) else None
    if error is None:
        if isinstance(payload, Mapping) and ("message" in payload or "detail" in payload):
            error = payload
        else:
            error = body[:500].decode("utf-8", errors="replace").strip() or f"HTTP {status}"
    base = error_from_payload(error, status=status)
    code = base.code
    if status in (400, 413) and any(h in base.message.lower() for h in _CONTEXT_HINTS):
        code = "context_length_exceeded"
    return ProviderError(
        f"{provider}: {base.message}",
        status=status,
        retryable=base.retryable,
        retry_after=parse_retry_after(headers, payload),
        code=code,
    )


def transport_error(
    provider: str, base_url: str, exc: httpx.TransportError | httpx.DecodingError
) -> ProviderError:
    """A failed HTTP exchange (see :data:`HTTP_FAULTS`) as a ProviderError."""
    kind = type(exc).__name__
    if isinstance(exc, ResponseTooLarge):
        return ProviderError(
            f"{provider}: {exc}",
            retryable=False,
            code="response_too_large",
        )
    if isinstance(exc, httpx.DecodingError):
        # A 200 whose compressed body is corrupt: like one that is cut or garbled.
        return ProviderError(
            f"{provider}: the response body does not decode ({kind}: {exc})",
            retryable=True,
            code="malformed_response",
        )
    if isinstance(exc, httpx.TimeoutException):
        return ProviderError(
            f"{provider}: the request timed out ({kind})", retryable=True, code="timeout"
        )
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.LocalProtocolError):
        return ProviderError(
            f"{provider}: invalid request ({kind}: {exc})",
            retryable=False,
            code="invalid_request",
        )
    if isinstance(exc, httpx.ConnectError):
        return ProviderError(
            f"{provider}: cannot connect to {base_url} ({exc}) -- {_unreachable_hint(str(exc))}",
            retryable=True,
            code="connect_error",
        )
    return ProviderError(
        f"{provider}: the connection failed ({kind}: {exc})",
        retryable=True,
        code="connection_error",
    )


def parse_retry_after(headers: Mapping[str, str], payload: Any = None) -> float | None:
    """Seconds a provider asked us to wait, from whichever form it used."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(float(ms) / 1000.0, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value:
        try:
            return max(float(value), 0.0)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError):
                when = None
            if when is not None:
                return max(when.timestamp() - time.time(), 0.0)
    error = payload.get("error") if isinstance(payload, Mapping) else None
    details = error.get("details") if isinstance(error, Mapping) else None
    for detail in details if isinstance(details, list) else ():
        if isinstance(detail, Mapping) and str(detail.get("@type", "")).endswith("RetryInfo"):
            delay = str(detail.get("retryDelay", "")).removesuffix("s")
            try:
                return max(float(delay), 0.0)
            except ValueError:
                return None
    return None


def _unreachable_hint(reason: str) -> str:
    """What to do when nothing answers at a provider's address."""
    lowered = reason.lower()
    if "name or service" in lowered or "nodename" in lowered or "getaddrinfo" in lowered:
        return "the host name does not resolve: check base_url (or the provider's config)"
    return "is the server running? Start it, or point base_url in [llm] at where it listens"
