"""An adapter's HTTP connections: a pool of keep-alive connections per trio run.

Requests go out on :mod:`._wire` connections (HTTP/1.1 straight on trio
streams, the same bytes as httpx's); where that path does not reach -- proxies
taken from the environment, a URL with credentials -- on httpx clients, one
single-connection client per connection, as follows.

httpcore's connection pool rescans every connection it holds on each request's
start and end, and its keep-alive check is itself a scan, so a pool's cost per
request grows with the square of its size: with 200 concurrent casts, one pool of
64 connections cost ~4.8 ms of server CPU per turn, and 8 pools of 32 still
~0.8 ms (``bench/serve_load.py``). Here every connection lives in its own
``httpx.AsyncClient`` (a pool of one, so httpcore's scan is one check), and
the free clients wait in a last-in-first-out list: taking and giving one back
is O(1) whatever the concurrency, and the most recently used connection (the
one least likely to have been closed by the server) is reused first.

A :class:`ClientPool` belongs to one trio run: clients (and their sockets) must
not outlive the run whose I/O they registered with, so the pool closes them all
when the run ends, from one system task.
"""

from __future__ import annotations

import functools
import math
import ssl
import urllib.request
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing, asynccontextmanager
from typing import Any, Protocol

import httpx
import trio

from cantrip._errors import ProviderError
from cantrip._redact import get_logger
from cantrip.llm._sse import StreamedResponse
from cantrip.llm.providers._decode import ACCEPT_ENCODING, read_bounded
from cantrip.llm.providers._wire import Connection, Shape, tls_context
from cantrip.llm.providers._wire_body import Response

log = get_logger("cantrip.llm.providers")

CONNECTIONS = 256
"""Connections per adapter and trio run where the descriptor limit is not known (Windows)."""
MIN_CONNECTIONS = 16
MAX_CONNECTIONS = 4096
"""Bounds of :func:`default_connections`."""


def default_connections() -> int:
    """Concurrent requests (so connections) per adapter and trio run before one waits.

    A quarter of the file descriptors this process may open (its soft
    ``RLIMIT_NOFILE``), within 16..4,096: 256 under Linux's usual soft limit of
    1,024, 4,096 where the limit is 16,384 or more. A fixed pool of 256 set a
    floor under many concurrent entities -- 1,000 casts of 5 turns each at 50 ms
    a request waited 20 rounds for a connection, 5 with one each
    (``bench/realsocket.py``) -- while a pool larger than the descriptor limit
    would fail with "too many open files" instead of waiting. A quarter leaves
    the rest for looms, gates, sandboxes and other adapters. ``cantrip``'s own
    commands raise the soft limit to the hard one first
    (``cantrip.cli._process.raise_open_files_limit``); a program embedding
    cantrip keeps its own limit.
    """
    try:
        import resource
    except ImportError:  # not on POSIX
        return CONNECTIONS
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(MIN_CONNECTIONS, min(MAX_CONNECTIONS, soft // 4))


class Cookies(httpx.Cookies):
    """httpx's cookie jar, minus the cost of reading a response that sets no cookie.

    httpx hands every response to :mod:`http.cookiejar` through urllib-shaped
    wrappers (~100 us a response); without a ``Set-Cookie`` (or ``Set-Cookie2``)
    header the jar takes nothing from it, so that work is skipped."""

    def extract_cookies(self, response: httpx.Response) -> None:
        headers = response.headers
        if "set-cookie" in headers or "set-cookie2" in headers:
            super().extract_cookies(response)


def client(jar: Cookies, **options: Any) -> httpx.AsyncClient:
    """One connection's client; its cookies live in its pool's jar, shared by all of them,
    so a cookie a provider sets is sent on every connection (as with one httpx pool).

    Shared through httpx's public API: a client given a ``CookieJar`` keeps that very
    jar (``httpx.Cookies(jar)``), where a subclass overriding ``cookies`` relied on
    httpx reading its cookies through the property, never through its private
    attribute."""
    return httpx.AsyncClient(cookies=jar.jar, **options)


class Reply(StreamedResponse, Protocol):
    """What a request returns: ``httpx.Response`` or :class:`._wire_body.Response`."""

    @property
    def status_code(self) -> int: ...

    async def aread(self) -> bytes: ...

    async def aclose(self) -> None: ...


async def read_whole(response: Reply) -> bytes:
    """A response's whole (decoded) body, bounded as the wire path bounds it
    (``_decode.MAX_BODY``, else ``ResponseTooLarge``), whichever client read it:
    httpx's own ``aread`` holds whatever a server sends."""
    if isinstance(response, Response):
        return await response.aread()
    async with aclosing(response.aiter_bytes()) as chunks:  # type: ignore[type-var]
        return await read_bounded(chunks)


def proxied(trust_env: bool) -> bool:
    """Whether httpx would route requests through a proxy named by the environment."""
    if not trust_env:
        return False
    proxies = urllib.request.getproxies()  # what httpx's get_environment_proxies reads
    return any(proxies.get(scheme) for scheme in ("http", "https", "all"))


class GivenClient:
    """The user's own ``httpx.AsyncClient`` (``load_llm(client=...)``): every request on it."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def post(
        self, url: str, content: bytes, headers: Mapping[str, str]
    ) -> tuple[int, Mapping[str, str], bytes]:
        client = self.client
        request = client.build_request("POST", url, content=content, headers=headers)
        response = await client.send(request, stream=True)
        try:
            return response.status_code, response.headers, await read_whole(response)
        finally:
            await response.aclose()

    @asynccontextmanager
    async def stream(
        self, url: str, content: bytes, headers: Mapping[str, str]
    ) -> AsyncIterator[Reply]:
        client = self.client
        request = client.build_request("POST", url, content=content, headers=headers)
        response = await client.send(request, stream=True)
        try:
            yield response
        finally:
            await response.aclose()


class _Prepared:
    """One (URL, headers) of the pool's requests: httpx's parsed URL and merged headers,
    and the request head they make on the wire (None: not for the wire path)."""

    __slots__ = ("headers", "kept", "shape", "url")

    def __init__(self, url: httpx.URL, headers: httpx.Headers, kept: Mapping[str, str]) -> None:
        self.url = url
        self.headers = headers
        self.kept = kept  # the caller's mapping, alive while its id() keys this entry
        self.shape: Shape | None = None


class ClientPool:
    """Hands out connections, at most ``limit`` at a time; sends requests on them.

    A connection is a :class:`._wire.Connection` unless httpx would have used a
    proxy from the environment (``trust_env`` and ``HTTPS_PROXY`` and the like),
    then an httpx client of one connection (:func:`client`)."""

    def __init__(
        self,
        *,
        timeout: httpx.Timeout,
        trust_env: bool,
        provider: str,
        limit: int | None = None,
    ) -> None:
        self.timeout = timeout
        self.trust_env = trust_env
        self.provider = provider
        self.limit = limit = default_connections() if limit is None else limit
        self.wire = not proxied(trust_env)
        """Whether requests go on wire connections (else on httpx clients)."""
        self.idle: list[Any] = []
        self.clients: list[Any] = []
        """Every connection (or client) made; closed with the pool."""
        self._slots = trio.Semaphore(limit)
        self._ssl: ssl.SSLContext | None = None
        self.jar = Cookies()
        self._prepared: dict[tuple[str, int], _Prepared] = {}
        self._closed = False
        bounds = [t for t in (timeout.connect, timeout.write, timeout.read) if t is not None]
        self._horizon = min(bounds, default=math.inf)
        """The shortest connect, write or read timeout: no deadline set later comes sooner
        than this long after it is set (see :meth:`watch`)."""
        trio.lowlevel.spawn_system_task(self.watch, name="cantrip-http-deadlines")

    @property
    def busy(self) -> int:
        """Requests holding a connection now."""
        return len(self.clients) - len(self.idle)

    async def take(self) -> Any:
        """A free connection (a new one if none is free); give it back with :meth:`give`.

        When ``limit`` requests hold one, waits for one to end, as long as the
        timeout's ``pool`` allows (then a retryable ``timeout``, as httpx's own
        pool timeout was)."""
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            with trio.move_on_after(
                self.timeout.pool if self.timeout.pool is not None else float("inf")
            ):
                await self._slots.acquire()
                return self._connection()
            raise ProviderError(
                f"{self.provider}: no connection became free in time (PoolTimeout)",
                retryable=True,
                code="timeout",
            ) from None
        return self._connection()

    def give(self, connection: Any) -> None:
        """A request taken with :meth:`take` has ended (however it ended)."""
        if self._closed:
            return
        self.idle.append(connection)
        self._slots.release()

    async def post(
        self, url: str, content: bytes, headers: Mapping[str, str]
    ) -> tuple[int, Mapping[str, str], bytes]:
        """(status, headers, body) of one POST; the connection is free again after."""
        connection = await self.take()
        try:
            if self.wire:  # the body read whole (and bounded) with the head
                response = await self._send(connection, url, content, headers, stream=False)
                return response.status_code, response.headers, response.content
            response = await self._send(connection, url, content, headers, stream=True)
            try:
                return response.status_code, response.headers, await read_whole(response)
            finally:
                await response.aclose()
        finally:
            self.give(connection)

    @asynccontextmanager
    async def stream(
        self, url: str, content: bytes, headers: Mapping[str, str]
    ) -> AsyncIterator[Reply]:
        """One POST whose body is read as it arrives; the connection is freed on exit."""
        connection = await self.take()
        try:
            response = await self._send(connection, url, content, headers, stream=True)
            try:
                yield response
            finally:
                await response.aclose()
        finally:
            self.give(connection)

    async def _send(
        self, connection: Any, url: str, content: bytes, headers: Mapping[str, str], stream: bool
    ) -> Any:
        prepared = self._prepare(url, headers)
        if not isinstance(connection, Connection):
            return await connection.send(self.request(prepared, content), stream=stream)
        shape = prepared.shape
        if shape is None or self.jar:
            # A cookie to send (rare): this request's own head, as httpx builds it.
            shape = Shape(self.request(prepared, content))
        response = await connection.exchange(
            shape, content, self.timeout, self._context, whole=not stream
        )
        if "set-cookie" in response.headers or "set-cookie2" in response.headers:
            self._keep_cookies(prepared, content, response.status_code, response.headers.raw)
        return response

    def _prepare(self, url: str, headers: Mapping[str, str]) -> _Prepared:
        """The parsed URL and merged headers of every request to ``url`` with ``headers``.

        Every connection of the pool has httpx's default headers and no base URL,
        query parameters or auth of its own, so they are made once per (URL,
        headers) and reused: merging them anew (parsing the URL, normalising
        every header) cost ~80 us a turn."""
        key = (url, id(headers))
        prepared = self._prepared.get(key)
        if prepared is None:
            merged = httpx.Headers(default_headers())
            merged.update(headers)
            prepared = _Prepared(httpx.URL(url), merged, headers)
            if self.wire and not (prepared.url.username or prepared.url.password):
                # A body of one byte: httpx places the length of an empty one elsewhere.
                prepared.shape = Shape(self.request(prepared, b"{"))
            self._prepared[key] = prepared
        return prepared

    def request(self, prepared: _Prepared, content: bytes) -> httpx.Request:
        """The POST ``client.build_request("POST", url, content=..., headers=...)`` builds."""
        request = httpx.Request(
            "POST",
            prepared.url,
            content=content,
            headers=prepared.headers,
            extensions={"timeout": self.timeout.as_dict()},
        )
        if self.jar:
            self.jar.set_cookie_header(request)
        return request

    def _keep_cookies(
        self, prepared: _Prepared, content: bytes, status: int, raw: list[tuple[str, str]]
    ) -> None:
        """The jar takes a wire response's cookies as httpx takes an httpx response's."""
        response = httpx.Response(status, headers=raw, request=self.request(prepared, content))
        self.jar.extract_cookies(response)

    def _context(self) -> ssl.SSLContext:
        if self._ssl is None:
            # One TLS context for all connections: building one reads the CA bundle (~15 ms).
            self._ssl = tls_context(self.trust_env)
        return self._ssl

    def _connection(self) -> Any:
        if self.idle:
            return self.idle.pop()
        connection: Any
        if self.wire:
            connection = Connection()
        else:
            connection = client(
                self.jar,
                timeout=self.timeout,
                trust_env=self.trust_env,
                verify=self._context(),
                limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
            )
        self.clients.append(connection)
        return connection

    async def aclose(self) -> None:
        """Close every connection (an adapter's ``aclose``, or the run's end)."""
        self._closed = True
        clients, self.clients, self.idle = self.clients, [], []
        for client in clients:
            if isinstance(client, Connection):
                client.close()
            else:
                await client.aclose()

    async def watch(self) -> None:
        """Time out the writes and reads of this pool's connections, until the run ends
        (then close them all).

        A request's deadline is a number on its connection (``Connection.deadline``),
        not a cancel scope of its own: this one task sleeps until the earliest
        deadline in the pool and expires what has passed. It also wakes
        ``horizon`` after it fell asleep -- every deadline is set at least
        that long ahead, so one set while it sleeps comes no sooner than its waking.
        So timeouts fire on time and a busy pool pays nothing per request (a scope
        per request cost ~10 us of every turn; issue 34)."""
        try:
            while True:
                now = trio.current_time()
                earliest = now + self._horizon
                if self.wire:
                    for connection in self.clients:
                        deadline = connection.deadline
                        if deadline <= now:
                            if not connection.expired:
                                connection.expire()
                        elif deadline < earliest:
                            earliest = deadline
                await trio.sleep_until(earliest)
        finally:
            with trio.CancelScope(shield=True):
                try:
                    await self.aclose()
                except (httpx.HTTPError, OSError) as exc:  # a system task must not crash the run
                    log.debug("closing http clients failed: %s", exc)


@functools.cache
def default_headers() -> httpx.Headers:
    """The headers every httpx client starts with (its user agent, ...), offering the
    encodings :mod:`._decode` decodes: httpx offers br and zstd too when their packages
    happen to be installed, and the wire path decodes neither."""
    headers = httpx.AsyncClient(transport=httpx.AsyncBaseTransport(), trust_env=False).headers
    headers["Accept-Encoding"] = ACCEPT_ENCODING
    return headers
