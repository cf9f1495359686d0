"""HTTP/1.1 for the provider hot path, spoken directly on trio streams.

Why: a turn's request went through httpx's client, its transport, httpcore's
connection and h11's state machine -- layers of objects, events and checks that
cost ~0.6 ms of CPU per request, six times what a lean server spends parsing
the same request and answering it (``bench/realsocket.py``). An adapter sends
one kind of request: a POST of a JSON body whose head changes only in its
``Content-Length``. Here the head is made once per shape and a request is one
``send``; the response's head and body are parsed straight from the bytes.

What is kept from httpx, so nothing changes on the wire or for the adapters:

* the request bytes: the head is the one httpx builds (its ``Request``: URL,
  default and merged headers, ``Content-Length``), written as h11 writes it
  (``Host`` first) and checked against h11's own output once per shape (a
  header h11 refuses raises the same ``LocalProtocolError``);
* TLS: httpx's SSL context (``httpx.create_ssl_context``: its CA bundle and
  verification, ``SSL_CERT_FILE`` when the environment is trusted), ALPN
  ``http/1.1``, SNI the URL's host, through ``trio.SSLStream`` as httpcore does;
* timeouts: ``connect`` (TCP and TLS handshake), ``write``, ``read`` (each
  receive), raised as httpx's exceptions, as are connection faults, so the
  adapters' error mapping (:func:`._faults.transport_error`) is the same;
* responses: h11's framing (``Content-Length``, chunked, read-to-close;
  1xx checked and skipped; 204/304 empty) and its checks of every head and
  trailer (``tests/test_wire_fuzz.py`` holds h11 as the oracle), its keep-alive
  rules (``Connection: close``, HTTP/1.0 and read-to-close bodies end the
  connection) and its limit on a head's size as httpcore set it; httpx's content
  decoding (gzip, deflate) by :mod:`._decode`, which bounds what a body may inflate
  to -- and a body read
  whole is bounded as it arrives too (``_decode.MAX_BODY``: a ``Content-Length``
  past it is refused before a byte is read);
* reuse: an idle connection the server closed (readable while idle) or that
  idled past httpx's 5 s keep-alive expiry is not reused; a request cut short
  (an error, a cancellation, a stream not read to its end) closes its
  connection.

The response -- its body's framing, decoding and bound -- is read by
:mod:`._wire_body`; this module makes the request and holds the connection.

Not covered here -- the pool keeps httpx for it (:mod:`._clients`): proxies from
the environment, URLs carrying credentials, a client the user gives.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import select
import socket
import ssl
from collections.abc import Callable
from math import inf

import h11
import httpx
import trio

from cantrip.llm.providers._wire_body import Response
from cantrip.llm.providers._wire_head import HEAD_END, MAX_HEAD, read_head

READ_SIZE = 64 * 1024
"""Bytes asked of the socket per receive (httpcore's)."""
_CONNECTING = frozenset({errno.EINPROGRESS, errno.EAGAIN, errno.EWOULDBLOCK})
"""What a non-blocking ``connect`` answers while the connection is being made."""
KEEPALIVE_EXPIRY = 5.0
"""Seconds an idle connection is kept (``httpx.Limits``' default ``keepalive_expiry``)."""


class Shape:
    """The head of every request of one shape (method, URL, headers): all but its length.

    ``head(n)`` is what h11 writes for that request with ``Content-Length: n``;
    made from the ``httpx.Request`` httpx would send, so the same bytes."""

    __slots__ = ("after", "before", "family", "origin", "server_hostname")

    def __init__(self, request: httpx.Request) -> None:
        url = request.url
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"not an http(s) URL: {url}")
        self.origin = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        self.server_hostname = str(request.extensions.get("sni_hostname") or url.host)
        self.family = _address_family(url.host)
        """The host's address family when it is an IP address (0: a name to resolve)."""
        raw = request.headers.raw
        method = request.method.encode("ascii")
        target = url.raw_path
        try:
            written = h11.Connection(h11.CLIENT).send(
                h11.Request(method=method, target=target, headers=raw)
            )
        except h11.LocalProtocolError as exc:  # as httpcore reports a header h11 refuses
            raise httpx.LocalProtocolError(str(exc)) from exc
        # h11 writes Host first, then the rest in order.
        ordered = [p for p in raw if p[0].lower() == b"host"]
        ordered += [p for p in raw if p[0].lower() != b"host"]
        at = [i for i, (name, _) in enumerate(ordered) if name.lower() == b"content-length"]
        if len(at) != 1:
            raise ValueError("a request shape needs exactly one Content-Length")
        i = at[0]
        self.before = b"%s %s HTTP/1.1\r\n%s%s: " % (
            method,
            target,
            b"".join(b"%s: %s\r\n" % pair for pair in ordered[:i]),
            ordered[i][0],
        )
        self.after = b"\r\n%s\r\n" % b"".join(b"%s: %s\r\n" % pair for pair in ordered[i + 1 :])
        if self.head(int(ordered[i][1])) != written:
            raise ValueError("the request head differs from h11's")

    def head(self, length: int) -> bytes:
        return b"%s%d%s" % (self.before, length, self.after)


def _address_family(host: str) -> int:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return 0
    return socket.AF_INET6 if address.version == 6 else socket.AF_INET


class Connection:
    """One keep-alive HTTP/1.1 connection, opened on first use and again after it closed.

    Belongs to a pool (one request at a time); :meth:`exchange` sends a request
    and reads the response's head; the body is read through the
    :class:`Response` (which frees the connection for the next request)."""

    __slots__ = (
        "buffer",
        "closed",
        "deadline",
        "expired",
        "fd",
        "idle_since",
        "origin",
        "poller",
        "sock",
        "stream",
    )

    def __init__(self) -> None:
        self.stream: trio.abc.Stream | None = None
        self.sock: socket.socket | trio.socket.SocketType | None = None
        self.fd = -1
        """The socket's descriptor when it is read and written directly (plain TCP)."""
        self.origin: tuple[str, str, int] | None = None
        self.buffer = bytearray()
        self.idle_since = 0.0
        self.poller: select.poll | None = None
        """Watches the idle socket for a close by the server (made once per socket)."""
        self.closed = False
        """Closed for good (its pool was closed)."""
        self.deadline = inf
        """When the write or read under way times out (trio's clock); ``inf`` between
        them. Watched by its pool (``ClientPool.watch``), which calls :meth:`expire`."""
        self.expired = False
        """The deadline passed while a write or read was under way: it ends as a timeout."""

    @property
    def is_closed(self) -> bool:
        return self.closed

    def drop(self) -> None:
        """Close the socket now (synchronously: also from a cancelled request)."""
        sock = self.sock
        if sock is not None:
            if isinstance(sock, socket.socket):  # a direct one: trio may hold it registered
                trio.lowlevel.notify_closing(sock)
            sock.close()
        self.stream = self.sock = self.origin = self.poller = None
        self.fd = -1
        self.buffer.clear()

    def close(self) -> None:
        self.drop()
        self.closed = True

    def expire(self) -> None:
        """The deadline passed: the write or read under way ends as a timeout.

        Wakes a task waiting on the socket (with ``ClosedResourceError``, which
        :meth:`_send` and :meth:`receive` report as the timeout); a task not waiting
        at this moment finds :attr:`expired` at its next write or read. The task
        itself drops the connection."""
        self.expired = True
        if self.sock is not None:
            trio.lowlevel.notify_closing(self.sock)

    def _reusable(self, origin: tuple[str, str, int]) -> bool:
        """Whether the open connection may carry the next request (httpcore's checks)."""
        if origin != self.origin or trio.current_time() - self.idle_since > KEEPALIVE_EXPIRY:
            return False
        poller = self.poller
        if poller is None:
            assert self.sock is not None
            poller = self.poller = select.poll()
            poller.register(self.sock.fileno(), select.POLLIN)
        return not poller.poll(0)  # readable while idle: closed by the server (or garbage)

    async def _connect(
        self, shape: Shape, timeout: float | None, context: Callable[[], ssl.SSLContext]
    ) -> None:
        scheme, host, port = shape.origin
        if shape.family and scheme == "http":
            await self._connect_direct(shape.family, host, port, timeout)
            self.origin = shape.origin
            return
        with trio.move_on_after(float("inf") if timeout is None else timeout) as scope:
            try:
                tcp = await _open_tcp(shape.family, host, port)
                self.sock = tcp.socket
                stream: trio.abc.Stream = tcp
                if scheme == "https":
                    tls = trio.SSLStream(
                        tcp, context(), server_hostname=shape.server_hostname, https_compatible=True
                    )
                    await tls.do_handshake()
                    stream = tls
            except (OSError, trio.BrokenResourceError) as exc:
                self.drop()
                cause = exc.__cause__ if isinstance(exc, trio.BrokenResourceError) else exc
                raise httpx.ConnectError(str(cause or exc)) from exc
        if scope.cancelled_caught:
            self.drop()
            raise httpx.ConnectTimeout("timed out while connecting")
        self.stream, self.origin = stream, shape.origin
        self.fd = tcp.socket.fileno() if scheme == "http" else -1

    async def _connect_direct(
        self, family: int, host: str, port: int, timeout: float | None
    ) -> None:
        """Plain TCP to an IP address: a socket, one non-blocking ``connect``, a wait until
        it is writable -- what trio's socket does, without its wrapper and address
        normalising (~10 us a connection) -- its connect timeout kept by
        :attr:`deadline` like a write's (the pool's watcher), not by a cancel scope.
        ``TCP_NODELAY`` as ``trio.SocketStream`` sets it."""
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        self.sock = sock
        address = (host, port)
        try:
            if timeout is not None:
                self.deadline = trio.current_time() + timeout
            error = sock.connect_ex(address)
            if error in _CONNECTING:
                await trio.lowlevel.wait_writable(sock)
                error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if error:
                raise OSError(error, f"Error connecting to {address!r}: {os.strerror(error)}")
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except (OSError, trio.ClosedResourceError) as exc:
            self.drop()
            if self.expired:
                raise httpx.ConnectTimeout("timed out while connecting") from None
            raise httpx.ConnectError(str(exc)) from exc
        except BaseException:
            self.drop()
            raise
        finally:
            self.deadline = inf
        self.fd = sock.fileno()

    async def exchange(
        self,
        shape: Shape,
        content: bytes,
        timeout: httpx.Timeout,
        context: Callable[[], ssl.SSLContext],
        *,
        whole: bool = False,
    ) -> Response:
        """Send one request; the response with its head read (and its body, if ``whole``).

        The write and each read time out by :attr:`deadline`, which the pool's
        watcher enforces: a cancel scope per request (its deadline in trio's heap,
        entered and left, moved before each read) cost ~10 us of every turn."""
        if self.closed:
            raise httpx.ConnectError("the connection pool is closed")
        if self.sock is not None and not self._reusable(shape.origin):
            self.drop()
        self.expired = False
        try:
            if self.sock is None:
                await self._connect(shape, timeout.connect, context)
            data = b"%s%d%s%s" % (shape.before, len(content), shape.after, content)
            if timeout.write is not None:
                self.deadline = trio.current_time() + timeout.write
            await self._send(data)
            response = await self._head(timeout.read)
            if whole:
                await response.aread()
            return response
        except BaseException:
            self.drop()
            raise
        finally:
            self.deadline = inf

    async def _send(self, data: bytes) -> None:
        """Write ``data`` whole (by :attr:`deadline`, set by the caller)."""
        fd = self.fd
        try:
            if self.expired:
                raise trio.ClosedResourceError
            if fd < 0:
                assert self.stream is not None
                await self.stream.send_all(data)
                return
            view = memoryview(data)
            while view:
                try:
                    view = view[os.write(fd, view) :]
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(fd)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            if self.expired:
                raise httpx.WriteTimeout("timed out while sending the request") from None
            raise httpx.WriteError(str(exc.__cause__ or exc)) from exc

    async def receive(self, timeout: float | None, *, wait: bool = False) -> bytes | bytearray:
        """The next bytes from the server (``b""``: it closed the connection).

        ``wait``: none can be there yet (a request was just sent), so wait for
        them before the first read. A plain TCP connection is read with
        ``os.read`` once trio says the socket is readable: trio's socket stream
        costs a context manager, a failed read and a scheduling round per
        receive. ``timeout`` bounds this receive alone (httpx's read timeout)."""
        try:
            if self.expired:
                raise trio.ClosedResourceError
            self.deadline = inf if timeout is None else trio.current_time() + timeout
            return await self._receive(wait)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            if self.expired:
                raise httpx.ReadTimeout("timed out while reading the response") from None
            raise httpx.ReadError(str(exc.__cause__ or exc)) from exc
        finally:
            self.deadline = inf

    async def _receive(self, wait: bool) -> bytes | bytearray:
        fd = self.fd
        if fd < 0:
            assert self.stream is not None
            return await self.stream.receive_some(READ_SIZE)
        if wait:
            await trio.lowlevel.wait_readable(fd)
        else:
            try:
                data = os.read(fd, READ_SIZE)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(fd)
            else:
                await trio.lowlevel.cancel_shielded_checkpoint()  # as trio's streams do
                return data
        while True:
            try:
                return os.read(fd, READ_SIZE)
            except BlockingIOError:  # woken for nothing
                await trio.lowlevel.wait_readable(fd)

    async def _head(self, timeout: float | None) -> Response:
        """Read up to the end of the final response's head (1xx ones are skipped)."""
        buffer = self.buffer
        wait = not buffer
        while True:
            end = HEAD_END.search(buffer)
            while end is None:
                if len(buffer) > MAX_HEAD:
                    raise httpx.RemoteProtocolError("the response head is too large")
                data = await self.receive(timeout, wait=wait)
                wait = False
                if not data:
                    raise httpx.RemoteProtocolError(
                        "Server disconnected without sending a response."
                        if not buffer
                        else "peer closed connection without sending a complete response head"
                    )
                buffer += data
                end = HEAD_END.search(buffer)
            head = bytes(buffer[: end.start() + 1])  # each of its lines with its LF
            del buffer[: end.end()]
            parsed = read_head(head)
            if parsed is not None:
                status, headers, framing, length, keep_alive = parsed
                return Response(status, headers, self, framing, length, keep_alive, timeout)

    def idle(self) -> None:
        """The response was read to its end on a connection that stays open."""
        self.idle_since = trio.current_time()


async def _open_tcp(family: int, host: str, port: int) -> trio.SocketStream:
    """A TCP connection to ``host``: ``trio.open_tcp_stream`` for a name, which resolves it
    and races its addresses (happy eyeballs); one ``connect`` for an IP address, which
    has nothing to resolve or race -- the same socket (``SocketStream`` sets
    ``TCP_NODELAY`` either way) for a third of the CPU (~30 us, not ~100 us: with a
    connection per entity in flight, 1,000 entities open 1,000)."""
    if not family:
        return await trio.open_tcp_stream(host, port)
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    try:
        await sock.connect((host, port))
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)


def tls_context(trust_env: bool) -> ssl.SSLContext:
    """httpx's SSL context (its CA bundle and checks), offering HTTP/1.1 by ALPN, as httpcore."""
    context = httpx.create_ssl_context(trust_env=trust_env)
    context.set_alpn_protocols(["http/1.1"])
    return context
