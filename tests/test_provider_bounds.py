"""What a provider's response may cost us: bounded, and linear (issue 39.14).

Whatever answers at a provider's address decides how much it sends. A body read
whole is at most ``_decode.MAX_BODY`` bytes (refused beyond, as ``response_too_large``,
not retried); a stream's line, and an event's data, at most ``_sse.MAX_EVENT``
characters; and splitting a stream into lines costs time in proportion to its
length, however its lines are cut. Each over a real loopback server (the wire
path, and httpx where it is kept), with the memory it took measured.
"""

from __future__ import annotations

import re
import tracemalloc
from typing import Any

import httpx
import pytest
import trio
from fake_providers import isolate
from test_provider_http11 import HISTORY, SSE, chunked, head, outcome, raw_server

from cantrip.llm import _sse, load_llm
from cantrip.llm.providers import _decode

BOUND = 1 << 20
"""The bounds, made small for the tests (1 MiB)."""
SENT = 16 << 20
"""What the server offers to send past them (16 MiB)."""
PEAK = 8 << 20
"""Memory a refusal may take (the bound, a few chunks, and the copies of a join)."""


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    isolate(monkeypatch, tmp_path)


# -- the line splitter is linear --------------------------------------------------------


class CountingSplit:
    """``_sse._LINE_END`` that counts the characters it is asked to search."""

    def __init__(self) -> None:
        self.scanned = 0
        self.pattern = re.compile("\r\n|\r|\n")

    def split(self, text: str) -> list[str]:
        self.scanned += len(text)
        return self.pattern.split(text)


def scanned_to_split(monkeypatch: pytest.MonkeyPatch, size: int, chunk: int) -> int:
    """Characters searched to split a ``size``-byte line with no end fed ``chunk`` bytes
    at a time, then its end and one more line; checks the lines come out whole."""
    counter = CountingSplit()
    monkeypatch.setattr(_sse, "_LINE_END", counter)
    splitter = _sse.LineSplitter()
    data = b"data: " + b"x" * size + b"\r"  # a CR at a chunk's end: it may begin a CRLF
    lines: list[str] = []
    for at in range(0, len(data), chunk):
        lines += splitter.feed(data[at : at + chunk])
    lines += splitter.feed(b"\nnext\n")
    lines += splitter.close()
    assert lines == ["data: " + "x" * size, "next"]
    return counter.scanned


def test_a_line_without_an_end_is_searched_once_however_it_is_chunked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An 8 MiB line that comes in 4 KiB chunks is searched for its end once, not
    once per chunk: the splitter used to prepend the pending line to each chunk and
    search it all again (2,048 chunks: ~17 G characters searched, ~25 s of CPU).
    A count of characters, not a time: the same on a loaded machine."""
    one = scanned_to_split(monkeypatch, 1 << 20, 4096)
    eight = scanned_to_split(monkeypatch, 8 << 20, 4096)
    assert one <= (1 << 20) + 4096  # each character once, plus the closing pieces
    assert eight <= (8 << 20) + 4096
    assert eight / one < 8.1  # linear: 8x the line, 8x the work (quadratic was 64x)


# -- a stream's line and event are bounded ----------------------------------------------


async def endless_sse(out: trio.SocketStream, pieces: bytes) -> None:
    """A streaming answer's head, then ``pieces`` again and again (``SENT`` bytes in
    all, chunked) until the client hangs up."""
    try:
        await out.send_all(
            head(b"200 OK", b"content-type: text/event-stream", b"transfer-encoding: chunked")
        )
        for _ in range(SENT // len(pieces)):
            await out.send_all(b"%x\r\n%s\r\n" % (len(pieces), pieces))
        await out.send_all(b"0\r\n\r\n")
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the client refused the rest


async def refused_with(url: str, stream: bool, client: httpx.AsyncClient | None) -> Any:
    """The outcome of one request, and the peak of memory it allocated."""
    tracemalloc.start()
    try:
        result = await outcome(url, stream, client)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak


PATHS = ["wire", "httpx"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("case", "piece"),
    [
        ("a line that never ends", b"x" * 65536),
        ("data lines without the blank line that ends their event", b"data: xx\n" * 7000),
    ],
)
async def test_a_stream_line_or_event_past_its_bound_is_refused_in_bounded_memory(
    monkeypatch: pytest.MonkeyPatch, path: str, case: str, piece: bytes
) -> None:
    """16 MiB of one line (or of one event's data lines) against a bound of 1 MiB: a
    final ``response_too_large`` once the bound is passed, the connection dropped, and
    never more than a few MiB held (a 300 MB line used to hold 250 MB)."""
    monkeypatch.setattr(_sse, "MAX_EVENT", BOUND)
    first = b"data: " if "never ends" in case else b""

    async def answer(out: trio.SocketStream, request: bytes) -> bool:
        await endless_sse(out, first + piece if first else piece)
        return False

    async with raw_server(answer) as (url, _):
        client = httpx.AsyncClient() if path == "httpx" else None
        try:
            result, peak = await refused_with(url, True, client)
        finally:
            if client is not None:
                await client.aclose()
    assert result == ("error", "response_too_large", False, None, None)
    assert peak < PEAK, f"{peak:,} bytes allocated while refusing {case}"


async def test_a_stream_longer_than_the_bound_in_small_events_is_read_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bound is on a line and an event, not on the stream: 2 MiB of keep-alive
    comments and a real answer pass a 1 MiB bound."""
    monkeypatch.setattr(_sse, "MAX_EVENT", BOUND)
    monkeypatch.setattr(_decode, "MAX_BODY", BOUND)
    body = b": keep-alive\n\n" * (2 * BOUND // 14) + SSE

    async def answer(out: trio.SocketStream, request: bytes) -> bool:
        await out.send_all(
            head(b"200 OK", b"content-type: text/event-stream", b"transfer-encoding: chunked")
            + chunked(body, 65536)
        )
        return False

    async with raw_server(answer) as (url, _):
        result = await outcome(url, True, None)
    assert result[:2] == ("answer", "hé there")


# -- a body read whole is bounded -------------------------------------------------------

COMPLETION_HEAD = b"content-type: application/json"


async def endless_body(out: trio.SocketStream, framing: str, status: bytes) -> None:
    """A whole answer's head, then ``SENT`` bytes of body framed as ``framing``."""
    piece = b" " * 65536
    try:
        if framing == "content-length":
            await out.send_all(head(status, COMPLETION_HEAD, b"content-length: %d" % SENT))
            for _ in range(SENT // len(piece)):
                await out.send_all(piece)
        elif framing == "chunked":
            await out.send_all(head(status, COMPLETION_HEAD, b"transfer-encoding: chunked"))
            for _ in range(SENT // len(piece)):
                await out.send_all(b"%x\r\n%s\r\n" % (len(piece), piece))
            await out.send_all(b"0\r\n\r\n")
        else:  # read to the connection's end
            await out.send_all(head(status, COMPLETION_HEAD, b"connection: close"))
            for _ in range(SENT // len(piece)):
                await out.send_all(piece)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("framing", ["content-length", "chunked", "to-close"])
@pytest.mark.parametrize(
    ("status", "stream"),
    [(b"200 OK", False), (b"500 Internal Server Error", False), (b"200 OK", True)],
    ids=["answer", "error-status", "answered-whole-to-a-stream"],
)
async def test_a_body_past_its_bound_is_refused_in_bounded_memory(
    monkeypatch: pytest.MonkeyPatch, path: str, framing: str, status: bytes, stream: bool
) -> None:
    """16 MiB of body (by length, chunks or to the end) against a bound of 1 MiB, read
    whole: as an answer, as an error's body, as a JSON answer to a stream request.
    ``response_too_large``, final, with a few MiB held -- before, all of it."""
    monkeypatch.setattr(_decode, "MAX_BODY", BOUND)

    async def answer(out: trio.SocketStream, request: bytes) -> bool:
        await endless_body(out, framing, status)
        return False

    async with raw_server(answer) as (url, _):
        client = httpx.AsyncClient() if path == "httpx" else None
        try:
            result, peak = await refused_with(url, stream, client)
        finally:
            if client is not None:
                await client.aclose()
    assert result == ("error", "response_too_large", False, None, None)
    assert peak < PEAK, f"{peak:,} bytes allocated while refusing the body"


async def test_a_declared_length_past_the_bound_is_refused_before_the_body_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ``Content-Length`` of 1 TB is refused at the head: nothing of it is awaited
    (the server sends none of it and never hangs up), and the connection is closed."""
    monkeypatch.setattr(_decode, "MAX_BODY", BOUND)
    hung_up = trio.Event()

    async def answer(out: trio.SocketStream, request: bytes) -> bool:
        await out.send_all(head(b"200 OK", COMPLETION_HEAD, b"content-length: %d" % 10**12))
        assert await out.receive_some(100) == b""  # the client closed the connection
        hung_up.set()
        return False

    async with raw_server(answer) as (url, _):
        llm: Any = load_llm("openai", base_url=url, timeout_s=30)
        try:
            with trio.fail_after(10):
                with pytest.raises(Exception) as info:
                    await llm.query(HISTORY[:2])
                await hung_up.wait()
        finally:
            await llm.aclose()
    error = info.value
    assert (error.code, error.retryable) == ("response_too_large", False)  # type: ignore[attr-defined]
    assert "1,000,000,000,000 bytes" in str(error)
