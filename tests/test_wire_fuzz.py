"""The hand-written HTTP/1.1 response parser fuzzed against h11, as httpx uses it.

``cantrip/llm/providers/_wire.py`` reads a provider's response itself; httpx reads
it with httpcore over h11. Hypothesis writes responses -- valid and broken: status
lines, framing (length, chunked, to-close, both, neither), chunk sizes and their
extensions, trailers, folded header lines, bare-LF and bare-CR line ends, huge
fields, repeated and contradictory headers, content codings, bodies cut short --
sends each to both in arbitrary pieces, and requires the same outcome: the same
status, headers and body, or an error of the same class.

Both read from memory, so an example costs well under a millisecond: the wire
connection from a stream that hands out the pieces, httpx from httpcore's mock
network backend (its public test double) behind httpx's own transport.
"""

from __future__ import annotations

import gzip
import os
import threading
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import httpcore
import httpx
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cantrip.llm.providers import _wire

URL = "http://provider.test/v1/chat"


class Pieces(trio.abc.Stream):
    """A server that sends ``pieces``, one per receive, then closes the connection."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = list(pieces)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        return self.pieces.pop(0) if self.pieces else b""

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


Outcome = tuple[Any, ...]


def _error(exc: BaseException) -> Outcome:
    return ("error", type(exc).__name__)


async def by_wire(pieces: list[bytes], streamed: bool) -> Outcome:
    """What the wire path reads: the final head, then the whole (decoded) body, read
    whole (``aread``, as an answer) or as it comes (``aiter_bytes``, as a stream)."""
    connection = _wire.Connection()
    connection.stream = Pieces(pieces)
    connection.origin = ("http", "provider.test", 80)
    try:
        response = await connection._head(None)
        if streamed:
            body = b"".join([chunk async for chunk in response.aiter_bytes()])
        else:
            body = await response.aread()
    except (httpx.HTTPError, httpx.StreamError) as exc:
        return _error(exc)
    return ("answer", response.status_code, _headers(response.headers.raw), body)


TRANSPORT = httpx.AsyncHTTPTransport(verify=False)
CLIENT = httpx.AsyncClient(transport=TRANSPORT)
"""One httpx client for every example (making one costs milliseconds): its transport's
pool is replaced by one over the example's mock network."""


async def by_httpx(pieces: list[bytes]) -> Outcome:
    """What httpx reads, through its own transport over httpcore over h11."""
    TRANSPORT._pool = httpcore.AsyncConnectionPool(  # the mock network instead of sockets
        network_backend=httpcore.AsyncMockBackend(list(pieces))
    )
    try:
        response = await CLIENT.post(URL, content=b"{}")
    except (httpx.HTTPError, httpx.StreamError) as exc:
        return _error(exc)
    finally:
        await TRANSPORT._pool.aclose()
    headers = _headers(response.headers.multi_items())
    return ("answer", response.status_code, headers, response.content)


def _headers(pairs: Any) -> list[tuple[str, str]]:
    return [(name.lower(), value) for name, value in pairs]


async def compare(pieces: list[bytes]) -> None:
    oracle = await by_httpx(pieces)
    assert await by_wire(pieces, streamed=False) == oracle, b"".join(pieces)
    assert await by_wire(pieces, streamed=True) == oracle, b"".join(pieces)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True) if b > a]


# -- what responses are made of ----------------------------------------------------------

BODY = b'{"id":"x","choices":[{"message":{"content":"h\xc3\xa9"}}]}'
EOL = st.sampled_from([b"\r\n", b"\r\n", b"\r\n", b"\n", b"\r"])
TOKEN = st.text("abcdefghijklmnopqrstuvwxyz-ABCXYZ0123456789!#$%&'*+.^_`|~", min_size=1, max_size=8)
NAME = st.one_of(
    st.sampled_from(
        [
            b"Content-Length",
            b"content-length",
            b"Transfer-Encoding",
            b"Connection",
            b"Content-Encoding",
            b"Content-Type",
            b"Retry-After",
            b"X-Dup",
        ]
    ),
    TOKEN.map(str.encode),
    st.sampled_from([b"", b"Bad Name", b"bad\x00", b"x\xff", b" lead", b"x:y", b"tail "]),
)
VALUE = st.one_of(
    st.sampled_from(
        [
            b"0",
            b"2",
            b"17",
            b" 5 ",
            b"5, 5",
            b"5,6",
            b"-1",
            b"+5",
            b"0x10",
            b"99999999999999999999999",
            b"chunked",
            b"Chunked",
            b"gzip, chunked",
            b"chunked, chunked",
            b"identity",
            b"close",
            b"keep-alive, Close",
            b"gzip",
            b"deflate",
            b"br",
            b"application/json; charset=utf-8",
            b"",
            b"  ",
            b"a\tb",
            b"caf\xc3\xa9",
            b"caf\xe9",
            b"a\x00b",
            b"a\x7fb",
            b"a\rb",
        ]
    ),
    st.binary(max_size=12),
    st.text(max_size=12).map(lambda t: t.encode("utf-8", "surrogatepass")),
)
FIELD = st.tuples(NAME, st.sampled_from([b": ", b":", b" : ", b":\t", b": \t"]), VALUE)
FOLD = st.tuples(st.sampled_from([b" ", b"\t", b"  "]), VALUE)
"""An obs-fold continuation line."""
STATUS = st.one_of(
    st.sampled_from(
        [
            b"HTTP/1.1 200 OK",
            b"HTTP/1.1 200 OK",
            b"HTTP/1.1 200",
            b"HTTP/1.1 200 ",
            b"HTTP/1.0 200 OK",
            b"HTTP/1.1 204 No Content",
            b"HTTP/1.1 304 Not Modified",
            b"HTTP/1.1 404 Not Found",
            b"HTTP/1.1 500 Oops",
            b"HTTP/1.1 101 Switching Protocols",
            b"HTTP/1.1 099 Low",
            b"HTTP/1.1 600 High",
            b"HTTP/1.1 2000 Long",
            b"HTTP/1.1 20 Short",
            b"HTTP/2.0 200 OK",
            b"HTTP/1.2 200 OK",
            b"HTTP/11 200 OK",
            b"http/1.1 200 OK",
            b"HTTP/1.1  200 OK",
            b"HTTP/1.1 200 caf\xc3\xa9 \xff",
            b"HTTP/1.1 200 a\x00b",
            b"HTTP/1.1 200 a\x7fb",
            b" HTTP/1.1 200 OK",
            b"ICY 200 OK",
            b"",
        ]
    ),
    st.integers(100, 599).map(lambda n: b"HTTP/1.1 %d R" % n),
)
INFORMATIONAL = st.sampled_from(
    [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 103 Early\r\nlink: </x>\r\n\r\n"]
)


@st.composite
def heads(draw: Any, framing: bytes | None) -> bytes:
    """A response head: a status line, fields (some folded), each line with its own end."""
    lines: list[bytes] = [draw(STATUS)]
    fields = draw(st.lists(st.one_of(FIELD, FOLD), max_size=6))
    if framing is not None:
        at = draw(st.integers(0, len(fields)))
        fields.insert(at, framing_field(framing))
    for field in fields:
        lines.append(b"".join(field))
    if draw(st.booleans()) and draw(st.integers(0, 9)) == 0:  # a huge field, near the limit
        size = draw(st.sampled_from([1000, 64 * 1024, 100 * 1024 - 100, 100 * 1024 + 10]))
        lines.insert(1, b"x-big: " + b"v" * size)
    out = b""
    for line in lines:
        out += line + draw(EOL)
    return out + draw(EOL)


def framing_field(framing: bytes) -> tuple[bytes, bytes, bytes]:
    name, _, value = framing.partition(b": ")
    return (name, b": ", value)


@st.composite
def chunked_bodies(draw: Any, body: bytes) -> bytes:
    """``body`` in chunks: sizes in any case, maybe wrong, extensions, bad line ends,
    a trailer, a last chunk or none."""
    out = b""
    at = 0
    while at < len(body):
        size = draw(st.integers(1, max(1, len(body) - at)))
        piece = body[at : at + size]
        at += size
        written = draw(
            st.sampled_from(
                [
                    b"%x" % len(piece),
                    b"%X" % len(piece),
                    b"%x" % len(piece),
                    b"00%x" % len(piece),
                    b"%x" % (len(piece) + 1),
                    b"%x" % max(0, len(piece) - 1),
                    b"%x " % len(piece),
                    b" %x" % len(piece),
                    b"+%x" % len(piece),
                    b"0x%x" % len(piece),
                    b"%x;ext=1" % len(piece),
                    b'%x;name="q"' % len(piece),
                    b"%x ;e" % len(piece),
                    b"ffffffffffffffffffffff",
                    b"",
                ]
            )
        )
        out += written + draw(EOL) + piece + draw(st.sampled_from([b"\r\n", b"\n", b"", b"xx"]))
    last = draw(st.sampled_from([b"0", b"00", b"0;x=y", b"000000000000000000000000", b""]))
    if last:
        trailer = draw(st.sampled_from([b"", b"x-t: 1\r\n", b"x-t: 1\r\n  folded\r\n", b"bad\r\n"]))
        out += last + draw(EOL) + trailer + draw(EOL)
    return out


def coded(body: bytes, coding: str) -> bytes:
    if coding == "gzip":
        return gzip.compress(body)
    if coding == "deflate":
        return zlib.compress(body)
    return body


@st.composite
def responses(draw: Any) -> bytes:
    """A whole response (maybe after 1xx heads), maybe cut short."""
    body = draw(st.sampled_from([BODY, b"", b"x" * 300, b"\r\n\r\n", b"0\r\n\r\n"]))
    coding = draw(st.sampled_from(["", "", "gzip", "deflate"]))
    body = coded(body, coding)
    framing = draw(st.sampled_from(["length", "length", "chunked", "close", "none"]))
    field: bytes | None = None
    payload = body
    if framing == "length":
        delta = draw(st.sampled_from([0, 0, 0, -1, 1, -len(body)]))
        field = b"Content-Length: %d" % max(0, len(body) + delta)
    elif framing == "chunked":
        field = b"Transfer-Encoding: chunked"
        payload = draw(chunked_bodies(body))
    elif framing == "close":
        field = b"Connection: close"
    head = draw(heads(field))
    if coding:
        head = head.replace(
            b"\r\n\r\n", b"\r\nContent-Encoding: " + coding.encode() + b"\r\n\r\n", 1
        )
    data = b"".join(draw(st.lists(INFORMATIONAL, max_size=2))) + head + payload
    if draw(st.integers(0, 4)) == 0:  # the connection dropped mid-response
        data = data[: draw(st.integers(0, len(data)))]
    return data


# -- what the fuzzing found --------------------------------------------------------------
# Each of these read differently before (tests/test_wire_fuzz.py found most; the rest
# came from reading h11 for their fixes); kept as fixed cases, whatever hypothesis draws.

H = b"HTTP/1.1 200 OK\r\n"
TE = H + b"Transfer-Encoding: chunked\r\n\r\n"
FOUND: dict[str, bytes | list[bytes]] = {
    "no header fields": H + b"\r\n",
    "NUL in a folded line": H + b"Connection: close\r\n 0\r\n a\x00b\r\n\r\n{}",
    "Content-Length checked on a 204": b"HTTP/1.1 204 No Content\r\n"
    b"Content-Length: 52\r\nContent-Length: 0\r\n\r\n",
    "a CR before the head's last CRLF": H + b"Connection: close\r\r\n\r\n",
    "a repeated Content-Length": H + b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
    "Content-Length with spaces in a list": H + b"Content-Length: 2, 2\r\n\r\n{}",
    "Transfer-Encoding: Chunked": H + b"Transfer-Encoding: Chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    "a chunk size line ending in LF": TE + b"2\n{}\r\n0\r\n\r\n",
    "a chunk ending in LF": TE + b"2\r\n{}\n0\r\n\r\n",
    "a space before a chunk extension": TE + b"2 ;e\r\n{}\r\n0\r\n\r\n",
    "a 2,000-byte chunk extension, its line in two reads": [
        TE + b"2;" + b"e" * 2000,
        b"\r\n{}\r\n0\r\n\r\n",
    ],
    "a trailer line that is no field": TE + b"2\r\n{}\r\n0\r\nbad\r\n\r\n",
    "DEL in a value, beside a folded line": H
    + b"x-a: a\x7fb\r\nx-b: c\r\n d\r\nContent-Length: 2\r\n\r\n{}",
    "DEL in the reason phrase": b"HTTP/1.1 200 O\x7fK\r\nContent-Length: 2\r\n\r\n{}",
    "NUL in a value": H + b"x-a: a\x00b\r\nContent-Length: 2\r\n\r\n{}",
    "VT in a value": H + b"x-a: a\x0bb\r\nContent-Length: 2\r\n\r\n{}",
    "a 1xx head with a line that is no field": b"HTTP/1.1 100 Continue\r\nbad\r\n\r\n"
    + H
    + b"Content-Length: 2\r\n\r\n{}",
    "a UTF-8 CJK value beside a folded line": H
    + "x-a: 漢字\r\nx-b: c\r\n d\r\nContent-Length: 2\r\n\r\n{}".encode(),
}


@pytest.mark.parametrize("case", list(FOUND))
async def test_each_difference_found_now_reads_as_httpx_reads_it(case: str) -> None:
    data = FOUND[case]
    await compare(data if isinstance(data, list) else [data])


# -- the properties ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def loop() -> Iterator[Callable[[list[bytes]], None]]:
    """Runs :func:`compare` in one trio run for the whole module (a trio run per example
    cost more than the example), on a thread of its own."""
    ready = threading.Event()
    token: list[trio.lowlevel.TrioToken] = []
    done = threading.Event()

    async def host() -> None:
        token.append(trio.lowlevel.current_trio_token())
        ready.set()
        await trio.to_thread.run_sync(done.wait)

    thread = threading.Thread(target=trio.run, args=(host,), daemon=True)
    thread.start()
    ready.wait()
    yield lambda pieces: trio.from_thread.run(compare, pieces, trio_token=token[0])
    done.set()
    thread.join()


FUZZ = settings(
    max_examples=int(os.environ.get("CANTRIP_FUZZ_EXAMPLES", "400")),
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)


@FUZZ
@given(responses(), st.lists(st.integers(0, 1 << 16), max_size=6))
def test_any_response_reads_as_httpx_reads_it(
    loop: Callable[[list[bytes]], None], data: bytes, cuts: list[int]
) -> None:
    loop(split(data, cuts))


@FUZZ
@given(st.binary(max_size=300), st.lists(st.integers(0, 400), max_size=4))
def test_any_bytes_read_as_httpx_reads_them(
    loop: Callable[[list[bytes]], None], data: bytes, cuts: list[int]
) -> None:
    loop(split(b"HTTP/1.1 200 OK\r\n" + data, cuts))
