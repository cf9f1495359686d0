"""A provider response on the adapters' own HTTP/1.1 path: its status, headers and body.

Apart from the connection (:mod:`._wire`) because a body is read by rules of its
own -- h11's framing (``Content-Length``, chunked with its trailer, read-to-close),
httpx's content decoding (:mod:`._decode`, bounded as it inflates) and the bound on
a body read whole (``_decode.MAX_BODY``) -- that need nothing of how the connection
was made, only its buffer and its next bytes (:class:`BodySource`, which
:class:`._wire.Connection` is). When the body is done the response gives the
connection back: idle for the next request, or closed (a body not read to its end,
``Connection: close``, bytes after the response).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Protocol

import httpx

from cantrip.llm.providers import _decode
from cantrip.llm.providers._decode import decoder, read_bounded, too_large
from cantrip.llm.providers._wire_head import (
    CHUNK_SIZE,
    HEAD_END,
    LENGTH,
    MAX_HEAD,
    TO_CLOSE,
    Headers,
    fields,
)


class BodySource(Protocol):
    """What a response reads its body from (:class:`._wire.Connection`): bytes already
    received past the head, more on demand, and where the connection goes when the
    response is done with it (declared here so this module needs nothing of the
    connection's module, which imports this one)."""

    buffer: bytearray

    async def receive(self, timeout: float | None, *, wait: bool = False) -> bytes | bytearray:
        """The next bytes from the server (``b""``: it closed the connection)."""
        ...

    def idle(self) -> None:
        """The response was read to its end on a connection that stays open."""
        ...

    def drop(self) -> None:
        """Close the connection now."""
        ...


class Response:
    """A response whose head is read: status, headers, and its body to read once.

    Shaped like the parts of ``httpx.Response`` the adapters use (``status_code``,
    ``headers``, ``aread``, ``aiter_bytes``, ``aclose``, the text encoding)."""

    __slots__ = (
        "_connection",
        "_framing",
        "_keep_alive",
        "_remaining",
        "_timeout",
        "content",
        "headers",
        "status_code",
    )
    default_encoding = "utf-8"

    def __init__(
        self,
        status: int,
        headers: Headers,
        connection: BodySource,
        framing: int,
        length: int,
        keep_alive: bool,
        timeout: float | None,
    ) -> None:
        self.status_code = status
        self.headers = headers
        self._connection: BodySource | None = connection
        self._framing = framing
        self._remaining = length
        self._keep_alive = keep_alive
        self._timeout = timeout
        self.content = b""

    @property
    def encoding(self) -> str:
        """The charset of the ``Content-Type`` (else UTF-8), as httpx tells it."""
        kind = self.headers.get("content-type", "")
        for param in kind.split(";")[1:]:
            key, _, value = param.partition("=")
            if key.strip().lower() == "charset" and value.strip(" \"'"):
                return value.strip(" \"'")
        return self.default_encoding

    async def aread(self) -> bytes:
        """The whole (decoded) body, at most ``_decode.MAX_BODY`` bytes (else
        :class:`._decode.ResponseTooLarge`, the connection closed)."""
        connection = self._connection
        if (
            connection is not None
            and self._framing == LENGTH
            and "content-encoding" not in self.headers
        ):
            # The common case, without a generator: a body of known length, not encoded.
            buffer = connection.buffer
            try:
                if self._remaining > _decode.MAX_BODY:  # refused before a byte is read
                    raise too_large(f"body ({self._remaining:,} bytes)", _decode.MAX_BODY)
                while len(buffer) < self._remaining:
                    data = await connection.receive(self._timeout)
                    if not data:
                        raise _incomplete(len(buffer), self._remaining)
                    buffer += data
            except BaseException:
                self._abandon()
                raise
            self.content = bytes(buffer[: self._remaining])
            del buffer[: self._remaining]
            self._remaining = 0
            self._complete()
            return self.content
        async with aclosing(self.aiter_bytes()) as chunks:  # closed: drops the connection
            self.content = await read_bounded(chunks)
        return self.content

    async def aiter_bytes(self) -> AsyncGenerator[bytes, None]:
        """The body's (decoded) bytes as they arrive."""
        decoding = decoder(self.headers.get("content-encoding"))
        try:
            async for chunk in self._raw():
                if decoding is not None:
                    chunk = decoding.decode(chunk)
                if chunk:
                    yield chunk
            if decoding is not None:
                tail = decoding.flush()
                if tail:
                    yield tail
        except BaseException:
            self._abandon()
            raise
        self._complete()

    async def aclose(self) -> None:
        """Done with the response: a body not read to its end closes the connection."""
        self._abandon()

    def _complete(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if self._keep_alive and not connection.buffer:
            connection.idle()
        else:  # closing, or bytes after the response (a server out of step): not reusable
            connection.drop()

    def _abandon(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.drop()

    async def _raw(self) -> AsyncIterator[bytes]:
        connection = self._connection
        if connection is None:
            return
        buffer = connection.buffer
        if self._framing == LENGTH:
            while self._remaining:
                if not buffer:
                    data = await connection.receive(self._timeout)
                    if not data:
                        raise _incomplete(0, self._remaining)
                    buffer += data
                piece = bytes(buffer[: self._remaining])
                del buffer[: len(piece)]
                self._remaining -= len(piece)
                yield piece
        elif self._framing == TO_CLOSE:
            if buffer:
                yield bytes(buffer)
                buffer.clear()
            while data := await connection.receive(self._timeout):
                yield bytes(data)
        else:
            async for piece in self._chunks(connection, buffer):
                yield piece

    async def _chunks(self, connection: BodySource, buffer: bytearray) -> AsyncIterator[bytes]:
        """A chunked body's data, then its trailer read and dropped (as h11 does)."""

        async def more() -> None:
            data = await connection.receive(self._timeout)
            if not data:
                raise httpx.RemoteProtocolError(
                    "peer closed connection without sending complete message body: "
                    "incomplete chunked read"
                )
            buffer.extend(data)

        while True:
            end = buffer.find(b"\r\n")  # h11: a chunk's size line ends at its CRLF
            while end < 0:
                if len(buffer) > MAX_HEAD:
                    raise httpx.RemoteProtocolError("Receive buffer too long")
                searched = len(buffer)
                await more()
                end = buffer.find(b"\r\n", max(0, searched - 1))
            size_line = CHUNK_SIZE.fullmatch(buffer, 0, end + 2)
            if size_line is None:
                raise httpx.RemoteProtocolError(f"illegal chunk header: {bytes(buffer[:100])!r}")
            size = int(size_line.group(1), 16)
            del buffer[: end + 2]
            if size == 0:
                break
            while size:
                if not buffer:
                    await more()
                piece = bytes(buffer[:size])
                del buffer[: len(piece)]
                size -= len(piece)
                yield piece
            while len(buffer) < 2:
                await more()
            if buffer[:2] != b"\r\n":
                raise httpx.RemoteProtocolError("malformed chunk footer")
            del buffer[:2]
        # The trailer: header lines up to an empty line, checked as a head's and dropped.
        while True:
            if buffer[:1] == b"\n" or buffer[:2] == b"\r\n":  # none
                del buffer[: 1 if buffer[:1] == b"\n" else 2]
                return
            end_of = HEAD_END.search(buffer)
            if end_of is not None:
                fields(bytes(buffer[: end_of.start() + 1]))
                del buffer[: end_of.end()]
                return
            if len(buffer) > MAX_HEAD:
                raise httpx.RemoteProtocolError("Receive buffer too long")
            await more()


def _incomplete(received: int, expected: int) -> httpx.RemoteProtocolError:
    return httpx.RemoteProtocolError(
        "peer closed connection without sending complete message body: "
        f"received {received} bytes, expected {expected}"
    )
