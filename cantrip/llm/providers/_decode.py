"""The content codings of a provider's response, decoded with a bound on their size.

Why our own: the wire path (:mod:`._wire`) used httpx's decoders from the private
``httpx._decoders``, which any httpx release may change or move. gzip and
deflate are a few lines over :mod:`zlib`; br and zstd would need packages cantrip
does not depend on, so they are not offered (``Accept-Encoding: gzip, deflate``,
what httpx offers without them).

Why the bound: a few kilobytes of gzip can inflate to gigabytes, and a body sent as
it is (identity) can be as long as its sender cares to send. A provider (or
whatever answers at its address) sending such a body must not take the process's
memory, so a body read whole is at most :data:`MAX_BODY` bytes, as it arrives or
decoded; past that it is refused (:class:`ResponseTooLarge`), and no single read
inflates further than that either (``zlib``'s ``max_length``). A streamed body is
not held whole: its events are bounded instead (``cantrip.llm._sse.MAX_EVENT``),
and its decoding by the same bound as a whole body's.

Decoding is httpx's in what it accepts: codings listed in ``Content-Encoding`` are
undone last to first, unknown ones and ``identity`` are passed over, ``deflate``
is read zlib-wrapped or raw (whichever the first bytes are), a gzip body ends
with its first member, and a corrupt body is an ``httpx.DecodingError``.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator

import httpx

ACCEPT_ENCODING = "gzip, deflate"
"""The codings the adapters offer, and all they decode."""

MAX_BODY = 64 * 1024 * 1024
"""Bytes a response's body may take, read whole (as it arrives, and decoded) or
decoded as a stream. A long streamed answer is a few tens of megabytes of events at
most (128k tokens at ~250 bytes an event: ~32 MB); a whole answer, far less."""

_WBITS = {"gzip": zlib.MAX_WBITS | 16, "deflate": zlib.MAX_WBITS}


class ResponseTooLarge(httpx.DecodingError):
    """A body past its bound (:data:`MAX_BODY`): an endless one, or a compression bomb.

    Raised where httpx raises its decoding errors (so it reaches the adapters' one
    mapping of a transport's faults) and mapped to ``response_too_large``, not
    retried: asking again would get the same."""


def too_large(what: str, limit: int) -> ResponseTooLarge:
    return ResponseTooLarge(f"the response's {what} is longer than {limit:,} bytes; refused")


async def read_bounded(chunks: AsyncIterator[bytes], limit: int | None = None) -> bytes:
    """A body's (decoded) bytes, all of them, unless they come to more than ``limit``
    (:data:`MAX_BODY`): then :class:`ResponseTooLarge`, having held at most that."""
    bound = MAX_BODY if limit is None else limit
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > bound:
            raise too_large("body", bound)
        parts.append(chunk)
    return b"".join(parts)


class _Inflate:
    """One gzip or deflate coding; its output counted against ``limit``."""

    __slots__ = ("coding", "first", "limit", "made", "stream")

    def __init__(self, coding: str, limit: int) -> None:
        self.coding = coding
        self.stream = zlib.decompressobj(_WBITS[coding])
        self.first = coding == "deflate"
        """Not fed yet: a deflate body may still turn out to be raw (no zlib header)."""
        self.limit = limit
        self.made = 0

    def decode(self, data: bytes) -> bytes:
        first, self.first = self.first, False
        try:
            out = self.stream.decompress(data, self.limit - self.made + 1)
        except zlib.error as exc:
            if first:  # as httpx: deflate sent without its zlib wrapper
                self.stream = zlib.decompressobj(-zlib.MAX_WBITS)
                return self.decode(data)
            raise httpx.DecodingError(str(exc)) from exc
        return self._counted(out)

    def flush(self) -> bytes:
        try:
            out = self.stream.flush(self.limit - self.made + 1)
        except zlib.error as exc:
            raise httpx.DecodingError(str(exc)) from exc
        return self._counted(out)

    def _counted(self, out: bytes) -> bytes:
        self.made += len(out)
        if self.made > self.limit:
            raise too_large(f"{self.coding} body, decoded,", self.limit)
        return out


class Decoder:
    """A body's codings, undone in turn: feed it the body's bytes as they arrive."""

    __slots__ = ("steps",)

    def __init__(self, steps: list[_Inflate]) -> None:
        self.steps = steps

    def decode(self, data: bytes) -> bytes:
        for step in self.steps:
            data = step.decode(data)
        return data

    def flush(self) -> bytes:
        data = b""
        for step in self.steps:
            data = step.decode(data) + step.flush()
        return data


def decoder(content_encoding: str | None, limit: int | None = None) -> Decoder | None:
    """The decoder of a response whose ``Content-Encoding`` is this (None: nothing to undo)."""
    if not content_encoding:
        return None
    bound = MAX_BODY if limit is None else limit
    codings = [part.strip().lower() for part in content_encoding.split(",")]
    steps = [_Inflate(coding, bound) for coding in reversed(codings) if coding in _WBITS]
    return Decoder(steps) if steps else None
