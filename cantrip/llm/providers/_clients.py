"""An adapter's HTTP connections: one single-connection httpx client per connection.

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

import ssl
from collections.abc import Mapping
from typing import Any

import httpx
import trio

from cantrip._errors import ProviderError
from cantrip._redact import get_logger

log = get_logger("cantrip.llm.providers")

CONNECTIONS = 256
"""Concurrent requests (so connections) per adapter and trio run before one waits."""


class Cookies(httpx.Cookies):
    """httpx's cookie jar, minus the cost of reading a response that sets no cookie.

    httpx hands every response to :mod:`http.cookiejar` through urllib-shaped
    wrappers (~100 us a response); without a ``Set-Cookie`` (or ``Set-Cookie2``)
    header the jar takes nothing from it, so that work is skipped."""

    def extract_cookies(self, response: httpx.Response) -> None:
        headers = response.headers
        if "set-cookie" in headers or "set-cookie2" in headers:
            super().extract_cookies(response)


class Client(httpx.AsyncClient):
    """One connection's client; its cookies are its pool's jar, shared by all of them,
    so a cookie a provider sets is sent on every connection (as with one httpx pool)."""

    def __init__(self, jar: Cookies, **options: Any) -> None:
        super().__init__(**options)
        self._jar = jar

    @property
    def cookies(self) -> httpx.Cookies:
        return self._jar

    @cookies.setter
    def cookies(self, cookies: Any) -> None:
        self._jar = Cookies(cookies)


class ClientPool:
    """Hands out single-connection clients, at most ``limit`` at a time."""

    def __init__(
        self,
        *,
        timeout: httpx.Timeout,
        trust_env: bool,
        provider: str,
        limit: int = CONNECTIONS,
    ) -> None:
        self.timeout = timeout
        self.trust_env = trust_env
        self.provider = provider
        self.limit = limit
        self.idle: list[httpx.AsyncClient] = []
        self.clients: list[httpx.AsyncClient] = []
        self._slots = trio.Semaphore(limit)
        self._ssl: ssl.SSLContext | None = None
        self.jar = Cookies()
        self._prepared: dict[
            tuple[str, int], tuple[httpx.URL, httpx.Headers, Mapping[str, str]]
        ] = {}
        self._closed = False
        trio.lowlevel.spawn_system_task(self._close_at_run_end, name="cantrip-http-close")

    @property
    def busy(self) -> int:
        """Requests holding a client now."""
        return len(self.clients) - len(self.idle)

    async def take(self) -> httpx.AsyncClient:
        """A free client (a new one if none is free); give it back with :meth:`give`.

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
                return self._client()
            raise ProviderError(
                f"{self.provider}: no connection became free in time (PoolTimeout)",
                retryable=True,
                code="timeout",
            ) from None
        return self._client()

    def request(
        self, client: httpx.AsyncClient, url: str, content: bytes, headers: Mapping[str, str]
    ) -> httpx.Request:
        """The POST ``client.build_request("POST", url, content=..., headers=...)`` builds.

        Every client of the pool has httpx's default headers and no base URL,
        query parameters or auth of its own, so the parsed URL and the merged
        headers are made once per (URL, headers) and copied per request: merging
        them anew (parsing the URL, normalising every header) cost ~80 us a turn."""
        key = (url, id(headers))
        prepared = self._prepared.get(key)
        if prepared is None:
            merged = httpx.Headers(client.headers)
            merged.update(headers)
            prepared = self._prepared[key] = (httpx.URL(url), merged, headers)
        target, merged, _kept_alive = prepared
        request = httpx.Request(
            "POST",
            target,
            content=content,
            headers=merged,
            extensions={"timeout": self.timeout.as_dict()},
        )
        if self.jar:
            self.jar.set_cookie_header(request)
        return request

    def give(self, client: httpx.AsyncClient) -> None:
        """A request taken with :meth:`take` has ended (however it ended)."""
        if self._closed:
            return
        self.idle.append(client)
        self._slots.release()

    def _client(self) -> httpx.AsyncClient:
        if self.idle:
            return self.idle.pop()
        if self._ssl is None:
            # One TLS context for all of them: building one reads the CA bundle (~15 ms).
            self._ssl = httpx.create_ssl_context(trust_env=self.trust_env)
        client = Client(
            self.jar,
            timeout=self.timeout,
            trust_env=self.trust_env,
            verify=self._ssl,
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
        )
        self.clients.append(client)
        return client

    async def aclose(self) -> None:
        """Close every client (an adapter's ``aclose``, or the run's end)."""
        self._closed = True
        clients, self.clients, self.idle = self.clients, [], []
        for client in clients:
            await client.aclose()

    async def _close_at_run_end(self) -> None:
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                try:
                    await self.aclose()
                except (httpx.HTTPError, OSError) as exc:  # a system task must not crash the run
                    log.debug("closing http clients failed: %s", exc)
