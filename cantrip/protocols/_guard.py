"""What stands between the network and ``cantrip serve``'s routes (issues 20 and 21).

An ASGI middleware, so the application behind it only ever sees requests that
passed; it answers everything else itself with the API's error shape
(``{"error": {"code", "message"}}``, JSON, redacted like every body):

* **Host** must name the server (default: the loopback names and the bound
  address; ``--allow-host`` adds names). A page on another site cannot reach a
  local server through DNS rebinding, because its requests carry its own host
  name. (403 ``bad_host``)
* **Origin**, when a browser sends one, must be the server's own or allowed
  with ``--allow-origin``; cross-site requests (even "simple" ones a page may
  send without a preflight) are refused. (403 ``bad_origin``)
* **Token**: with ``--token`` / ``CANTRIP_TOKEN`` every request needs
  ``Authorization: Bearer <token>``, compared in constant time. A server bound
  to anything but loopback refuses to start without one (:func:`check_bind`).
  (401 ``unauthorized``)
* **Bodies**: a request with a body must say ``Content-Type:
  application/json`` (400 ``bad_content_type``), be at most ``max_body`` bytes
  (413 ``too_large``, refused from ``Content-Length`` before reading), arrive
  within ``body_timeout_s`` (408 ``timeout``) and parse as JSON, however deeply
  nested (400 ``bad_json``). The body that passed is handed on unchanged.

The stdio transports (ACP, MCP) have no such exposure and are not involved.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import attrs
import trio

from cantrip.protocols._asgi import HttpError, Receive, Scope, Send, error_response

App = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_MAX_BODY = 1 << 20
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class BindError(ValueError):
    """A server configuration that must not start (one line for the user)."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@attrs.frozen
class Guard:
    """The request policy of one server; see the module docstring."""

    bind_host: str = "127.0.0.1"
    allow_hosts: frozenset[str] = frozenset()
    allow_origins: frozenset[str] = frozenset()
    token: str | None = None
    max_body: int = DEFAULT_MAX_BODY
    body_timeout_s: float = 30.0

    def hosts(self) -> frozenset[str] | None:
        """Host names a request may name; ``None``: any (a wildcard bind with a token)."""
        if self.bind_host in ("0.0.0.0", "::", "") and not self.allow_hosts:
            return None
        return LOOPBACK_NAMES | {self.bind_host.strip("[]").lower()} | self.allow_hosts

    def check_bind(self) -> None:
        """Refuse to serve beyond loopback without a token (issue 21)."""
        if not is_loopback(self.bind_host) and not self.token:
            raise BindError(
                f"serving on {self.bind_host} (not loopback) needs a token: pass --token or "
                "set CANTRIP_TOKEN, and send it as 'Authorization: Bearer <token>'"
            )
        if self.max_body < 1:
            raise BindError("--max-body must be at least 1 byte")

    def wrap(
        self,
        app: App,
        arriving: Callable[[Scope], AbstractContextManager[object]] | None = None,
    ) -> App:
        """``app`` behind the checks. ``arriving(scope)`` is entered while a request's
        body is read here, so the app can know of a request before it reaches a
        route (a sticky cancel applies to a prompt whose body is still arriving)."""

        async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            try:
                with arriving(scope) if arriving is not None else nullcontext():
                    receive = await self._admit(scope, receive)
            except Refused as exc:
                await error_response(send, exc)
                return
            await app(scope, receive, send)

        return guarded

    async def _admit(self, scope: Scope, receive: Receive) -> Receive:
        headers = _headers(scope)
        allowed = self.hosts()
        host = _host_name(headers.get("host", ""))
        if allowed is not None and host not in allowed:
            raise Refused(403, "bad_host", f"the Host header {host!r} does not name this server")
        origin = headers.get("origin")
        if origin is not None and not self._origin_ok(origin, headers.get("host", "")):
            raise Refused(403, "bad_origin", f"requests from origin {origin!r} are not allowed")
        if self.token is not None and not _public_asset(scope):
            given = headers.get("authorization", "")
            scheme, _, credential = given.partition(" ")
            if scheme.lower() != "bearer" and _is_page(scope):
                # A browser opening the viewer cannot send a header: the page takes the
                # token once as ?token= (its script then sends the header on every call).
                scheme, credential = "bearer", _query_token(scope)
            expected = self.token.encode()
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                credential.strip().encode(), expected
            ):
                raise Refused(401, "unauthorized", "send 'Authorization: Bearer <token>'")
        return await self._body(scope, headers, receive)

    def _origin_ok(self, origin: str, host_header: str) -> bool:
        if origin in self.allow_origins or "*" in self.allow_origins:
            return True
        own = {f"http://{host_header}", f"https://{host_header}"}
        allowed = self.hosts()
        return origin in own and (allowed is None or _host_name(host_header) in allowed)

    async def _body(self, scope: Scope, headers: Mapping[str, str], receive: Receive) -> Receive:
        length = headers.get("content-length")
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        declared = _int(length) if length is not None else None
        if length is not None and declared is None:
            raise Refused(400, "bad_request", "Content-Length is not a number")
        if declared is not None and declared > self.max_body:
            raise Refused(413, "too_large", f"the body is larger than {self.max_body} bytes")
        has_body = chunked or bool(declared)
        if scope["method"] not in STATE_CHANGING and not has_body:
            return receive
        content_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if (has_body or content_type) and content_type != "application/json":
            raise Refused(
                400,
                "bad_content_type",
                f"send the body as Content-Type: application/json (not {content_type or 'none'!r})",
            )
        body = bytearray()
        more = True
        with trio.move_on_after(self.body_timeout_s) as late:
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise Refused(400, "bad_request", "the client went away")
                body.extend(message.get("body", b""))
                more = bool(message.get("more_body"))
                if len(body) > self.max_body:
                    raise Refused(413, "too_large", f"the body is over {self.max_body} bytes")
        if late.cancelled_caught:
            raise Refused(408, "timeout", f"the body did not arrive within {self.body_timeout_s} s")
        if body.strip():
            if content_type != "application/json":
                raise Refused(400, "bad_content_type", "send the body as application/json")
            try:
                json.loads(body)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise Refused(400, "bad_json", f"the body is not JSON: {exc}") from None
            except RecursionError:
                raise Refused(400, "bad_json", "the body is not JSON: nested too deeply") from None
        return _replay(bytes(body), receive)


class Refused(HttpError):
    """A request turned away before it reaches a route (same error shape as a route's)."""


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the buffered body to the app, then the real channel."""
    sent = False

    async def replay() -> Mapping[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _headers(scope: Scope) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in scope.get("headers") or ():
        out[key.decode("latin-1").lower()] = value.decode("latin-1")
    return out


def _host_name(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _int(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def _public_asset(scope: Scope) -> bool:
    """The viewer's static files (``GET /ui/...``): code shipped in the package, no loom
    data, so a browser can load them without a token."""
    return scope.get("method") == "GET" and str(scope.get("path", "")).startswith("/ui/")


def _is_page(scope: Scope) -> bool:
    return scope.get("method") == "GET" and scope.get("path") in ("/", "/index.html")


def _query_token(scope: Scope) -> str:
    from urllib.parse import parse_qs

    raw = scope.get("query_string", b"")
    query = raw.decode("latin-1") if isinstance(raw, bytes) else ""
    values: list[str] = parse_qs(query).get("token") or [""]
    return values[0]
