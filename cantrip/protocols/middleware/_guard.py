"""What stands between the network and every HTTP server cantrip runs (issues 20, 21, 28).

``cantrip serve`` (both kinds), ``cantrip loom FILE view`` and ``cantrip mcp --http``
sit behind this one guard, so the rules cannot differ between them (issue 28.12).
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
  ``Authorization: Bearer <token>``, compared in constant time -- all but the
  viewer's page and static files, which hold no data (a token in a URL is never
  checked: URLs end up in history, logs and ``Referer``). A server bound
  to anything but loopback refuses to start without one (:func:`check_bind`).
  (401 ``unauthorized``, with ``WWW-Authenticate: Bearer``)
* **Bodies**: a request with a body must say ``Content-Type:
  application/json`` (400 ``bad_content_type``), be at most ``max_body`` bytes
  (413 ``too_large``, refused from ``Content-Length`` before reading), arrive
  within ``body_timeout_s`` (408 ``timeout``) and parse as JSON, however deeply
  nested (400 ``bad_json``). The body that passed is handed on unchanged.
* **Referrer-Policy: no-referrer** on every answer, the guard's and the app's: a
  page's address (which may hold the viewer's ``?token=``) never travels on.

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

from cantrip.protocols.asgi._responses import HttpError, Receive, Scope, Send, error_response

App = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_MAX_BODY = 1 << 20
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


UNAUTHORIZED = (
    "send 'Authorization: Bearer <token>' (in a browser: add ?token= and the token to "
    "the viewer's address)"
)


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
    server: str = "serving"
    """How the refusal to start names the server (``serving``, ``cantrip mcp --http``)."""
    token_hint: str = "pass --token or set CANTRIP_TOKEN"
    """Where this server takes its token from, for the refusal to start without one."""

    def hosts(self) -> frozenset[str] | None:
        """Host names a request may name; ``None``: any (a wildcard bind with a token)."""
        if self.bind_host in ("0.0.0.0", "::", "") and not self.allow_hosts:
            return None
        return LOOPBACK_NAMES | {self.bind_host.strip("[]").lower()} | self.allow_hosts

    def check_bind(self) -> None:
        """Refuse to serve beyond loopback without a token (issue 21)."""
        if not is_loopback(self.bind_host) and not self.token:
            raise BindError(
                f"{self.server} on {self.bind_host} (not loopback) needs a token: "
                f"{self.token_hint}, and send it as 'Authorization: Bearer <token>'"
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
            send = _no_referrer(send)
            body = _BodyWatch(scope, receive)
            try:
                with arriving(scope) if arriving is not None else nullcontext():
                    receive = await self._admit(scope, body.receive)
            except Refused as exc:
                if not body.read:  # its unread bytes end the connection: say so
                    exc.headers["connection"] = "close"
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
            scheme, _, credential = headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                credential.strip().encode(), self.token.encode()
            ):
                raise Refused(401, "unauthorized", UNAUTHORIZED, {"www-authenticate": "Bearer"})
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


_BODY_REFUSALS = {
    "bad_json": (-32700, "Parse error"),
    "bad_content_type": (-32600, "Invalid Request"),
    "too_large": (-32600, "Payload too large"),
    "timeout": (-32600, "Invalid Request"),
    "bad_request": (-32600, "Invalid Request"),
}


def guard_refusals_as_jsonrpc(app: App, endpoint: str, *, status: int | None = None) -> App:
    """``app`` (the guarded server) with the guard's body refusals on a JSON-RPC
    ``endpoint`` answered in JSON-RPC's own shape: ``-32700`` for a body that is not
    JSON, ``-32600`` for the rest (wrong content type, too large, too slow), id null.
    ``status`` replaces the HTTP status (A2A clients read errors from a 200); None keeps
    the guard's 400/408/413 (MCP's streamable HTTP answers a bad message with a 4xx and
    a JSON-RPC error body). Host, Origin and token refusals stay 403/401: they are
    about the connection, not the message. The app's own answers pass unchanged."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("path") != endpoint:
            await app(scope, receive, send)
            return
        start: dict[str, Any] = {}

        async def translate(message: Mapping[str, Any]) -> None:
            if message["type"] == "http.response.start" and message["status"] in (400, 408, 413):
                start.update(message)
                return
            if start and message["type"] == "http.response.body":
                body = _jsonrpc_body(bytes(message.get("body", b"")))
                if body is not None:
                    headers = [
                        (k, v)
                        for k, v in start.get("headers", [])
                        if k.lower() not in (b"content-length", b"content-type")
                    ]
                    headers += [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                    ]
                    answer = start["status"] if status is None else status
                    await send(
                        {"type": "http.response.start", "status": answer, "headers": headers}
                    )
                    await send({"type": "http.response.body", "body": body})
                    return
                held = dict(start)
                start.clear()
                await send(held)
            await send(message)

        await app(scope, receive, translate)

    return wrapped


def _jsonrpc_body(refusal: bytes) -> bytes | None:
    try:
        error = json.loads(refusal)["error"]
        code, title = _BODY_REFUSALS[error["code"]]
    except (ValueError, KeyError, TypeError):
        return None
    return json.dumps(
        {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": code, "message": f"{title}: {error.get('message', '')}"},
        }
    ).encode()


class Refused(HttpError):
    """A request turned away before it reaches a route (same error shape as a route's)."""


class _BodyWatch:
    """Whether a request's body has been read to its end (``read``; a request without
    one has nothing to read). A refusal sent before that leaves the body's bytes on
    the connection, so the server closes it after the answer (hypercorn does); the
    answer then carries ``Connection: close``, or a client takes the connection for
    kept-alive and sends its next request into a closing socket ("Server
    disconnected", RFC 9112 9.6)."""

    def __init__(self, scope: Scope, receive: Receive) -> None:
        headers = _headers(scope)
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self.read = not chunked and headers.get("content-length", "0").strip() == "0"
        self._receive = receive

    async def receive(self) -> Mapping[str, Any]:
        message = await self._receive()
        if message["type"] == "http.request" and not message.get("more_body"):
            self.read = True
        return message


def _no_referrer(send: Send) -> Send:
    """``send`` that adds ``Referrer-Policy: no-referrer`` to the start of every answer."""

    async def sending(message: Mapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers") or ())
            if not any(name.lower() == b"referrer-policy" for name, _ in headers):
                headers.append((b"referrer-policy", b"no-referrer"))
            message = {**message, "headers": headers}
        await send(message)

    return sending


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
    """The viewer's page and static files (``GET /``, ``/index.html``, ``/ui/...``): code
    shipped in the package, no loom data, so a browser loads them without a token. The
    page takes ``?token=`` into the tab's sessionStorage and out of the address, and
    its script sends the header on every API call (SPEC "The loom viewer")."""
    if scope.get("method") not in ("GET", "HEAD"):
        return False
    path = str(scope.get("path", ""))
    return path in ("/", "/index.html") or path.startswith("/ui/")
