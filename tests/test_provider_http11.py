"""The adapters' own HTTP/1.1 path (cantrip/llm/providers/_wire.py) against httpx's.

httpx is the oracle: every adapter's requests, streamed and not, must be the
same bytes on the wire whichever path sends them, and every response -- framed
by length, by chunks or by the connection's end, compressed, split into odd
pieces, preceded by 1xx heads, cut short or garbled -- must give the adapter the
same answer or the same error. Then what the path must keep of httpx's
connection handling: a connection the server closed while idle is not reused,
nor one idle past the keep-alive expiry; a cancelled request closes its
connection; TLS verifies the server as httpx did; proxies from the environment
still work (they keep httpx).
"""

from __future__ import annotations

import datetime
import functools
import gzip
import ipaddress
import json
import ssl
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from fake_providers import FAKES, PREFIXES, Answer, FakeOpenAI, _connection, isolate, serve
from fake_reasoning import FakeResponses
from loop_watch import MachineTime

from cantrip import ProviderError, ToolCall
from cantrip.llm import Message, ToolDefinition, load_llm
from cantrip.llm.providers import _clients
from cantrip.llm.providers._base import dumps
from cantrip.llm.providers._render_memo import render

ADAPTERS = [
    (name, FAKES[name], PREFIXES[name], "llama3.1:8b" if name == "ollama" else None)
    for name in FAKES
] + [("openai_responses", FakeResponses, "/v1", "gpt-5-mini")]
TOOLS = [
    ToolDefinition(
        "lookup",
        "Look a word up.",
        {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
    )
]
HISTORY = [
    Message("system", "You are terse."),
    Message("user", "Look up 'wire', then say it — in one word: é."),
    Message("assistant", tool_calls=(ToolCall("call_1", "lookup", {"word": "wire"}),)),
    Message("tool", "a thin metal thread", tool_call_id="call_1", name="lookup"),
]


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    isolate(monkeypatch, tmp_path)


# -- the same bytes on the wire --------------------------------------------------------------


@pytest.mark.parametrize(("provider", "fake_type", "prefix", "model"), ADAPTERS)
async def test_every_adapter_sends_the_bytes_httpx_sends_streamed_and_not(
    monkeypatch: pytest.MonkeyPatch, provider: str, fake_type: Any, prefix: str, model: Any
) -> None:
    """Three paths to one server, each on a connection of its own: the pool's wire
    connections, the pool's httpx clients (as with a proxy), and a user's httpx client."""
    fake = fake_type([Answer(text=f"a{i}") for i in range(6)])
    sent: dict[str, bytes] = {}
    async with serve(fake, prefix) as url:
        for how in ("wire", "pool-httpx", "given-httpx"):
            monkeypatch.setattr(_clients, "proxied", lambda trust_env, h=how: h == "pool-httpx")
            client = httpx.AsyncClient() if how == "given-httpx" else None
            llm: Any = load_llm(provider, model, base_url=url, client=client)
            start = len(fake.received)
            try:
                await llm.query(HISTORY, TOOLS, "auto", {"temperature": 0.5})
                await llm.stream(HISTORY, TOOLS, on_event=lambda _: None)
            finally:
                await llm.aclose()
                if client is not None:
                    await client.aclose()
            if how != "given-httpx":
                assert llm._pool is None  # closed by aclose; it was used
            sent[how] = bytes(fake.received[start:])
    assert fake.served == 6 and fake.connections == 3
    assert b"Content-Length" in sent["wire"] and sent["wire"].count(b"POST ") == 2
    assert sent["wire"] == sent["pool-httpx"] == sent["given-httpx"]


async def test_a_growing_conversation_sends_what_its_whole_history_makes() -> None:
    """The wire forms an adapter keeps of a conversation's history (made once, not
    every turn) are what the history makes anew: each body equals the one built
    from the whole rendered history as a plain tuple (no view, nothing kept)."""
    turns = 6
    fake = FakeOpenAI([Answer(text=f"a{i}") for i in range(turns)])
    async with serve(fake, "/v1") as url:
        llm: Any = load_llm("openai", base_url=url)
        history = list(HISTORY)
        expected = []
        try:
            for turn in range(turns):
                if turn == 3:  # a second system message joins mid-conversation
                    history.append(Message("system", "Now be verbose."))
                history.append(Message("user", f"and {turn}?"))
                await llm.query(history, TOOLS)
                whole = tuple(render(history, llm.render_family, llm.keep_thinking).messages)
                expected.append(dumps(llm.build_request(whole, TOOLS, None, {}, False)[1]))
                history.append(Message("assistant", f"a{turn}"))
        finally:
            await llm.aclose()
    assert [r.body for r in fake.requests] == expected
    assert b"Now be verbose." in expected[-1] and b"prompt_cache_key" in expected[-1]
    assert len(set(expected)) == turns


# -- responses: the same answer or the same error as httpx -----------------------------------

COMPLETION = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "gpt-5-mini",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hé there"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
).encode()
SSE = (
    b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
    b'"delta":{"role":"assistant","content":"h\xc3\xa9 "}}]}\n\n'
    b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
    b'"delta":{"content":"there"},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)


def chunked(body: bytes, size: int = 40, *, extension: bool = False) -> bytes:
    out = b""
    for i in range(0, len(body), size):
        piece = body[i : i + size]
        out += b"%x%s\r\n%s\r\n" % (len(piece), b";x=1" if extension else b"", piece)
    return out + b"0\r\nx-trailer: yes\r\n\r\n"


def head(status: bytes, *headers: bytes, version: bytes = b"1.1", end: bytes = b"\r\n") -> bytes:
    return end.join([b"HTTP/" + version + b" " + status, *headers, b"", b""])


def whole(body: bytes, kind: bytes = b"application/json") -> list[bytes]:
    return [head(b"200 OK", b"content-type: " + kind, b"content-length: %d" % len(body)) + body]


ZIPPED = gzip.compress(COMPLETION)


def deflated(body: bytes, wbits: int = zlib.MAX_WBITS) -> bytes:
    packer = zlib.compressobj(wbits=wbits)
    return packer.compress(body) + packer.flush()


def encoded(coding: bytes, body: bytes, kind: bytes = b"application/json") -> list[bytes]:
    return [
        head(
            b"200 OK",
            b"content-type: " + kind,
            b"content-encoding: " + coding,
            b"content-length: %d" % len(body),
        )
        + body
    ]


RESPONSES: dict[str, tuple[bool, list[bytes]]] = {
    # name: (stream?, the pieces the server sends, each its own send)
    "length": (False, whole(COMPLETION)),
    "length, split everywhere": (
        False,
        [(whole(COMPLETION)[0][i : i + 7]) for i in range(0, len(whole(COMPLETION)[0]), 7)],
    ),
    "chunked, extensions and a trailer": (
        False,
        [
            head(b"200 OK", b"content-type: application/json", b"transfer-encoding: chunked")
            + chunked(COMPLETION, extension=True)
        ],
    ),
    "bare LF line ends": (
        False,
        [
            head(
                b"200 OK",
                b"content-type: application/json",
                b"content-length: %d" % len(COMPLETION),
                end=b"\n",
            )
            + COMPLETION
        ],
    ),
    "1xx heads first": (
        False,
        [
            b"HTTP/1.1 100 Continue\r\n\r\n",
            b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n",
            *whole(COMPLETION),
        ],
    ),
    "folded and repeated headers": (
        False,
        [
            head(
                b"429 Too Many Requests",
                b"content-type: application/json",
                b"x-folded: one",
                b"  two",
                b"retry-after: 7",
                b"x-dup: a",
                b"x-dup: b",
                b"content-length: 2",
            )
            + b"{}"
        ],
    ),
    "HTTP/1.0": (
        False,
        [
            head(
                b"200 OK",
                b"content-type: application/json",
                b"content-length: %d" % len(COMPLETION),
                version=b"1.0",
            )
            + COMPLETION
        ],
    ),
    "read to close": (
        False,
        [head(b"200 OK", b"content-type: application/json", b"connection: close"), COMPLETION],
    ),
    "gzip": (
        False,
        [
            head(
                b"200 OK",
                b"content-type: application/json",
                b"content-encoding: gzip",
                b"content-length: %d" % len(ZIPPED),
            )
            + ZIPPED
        ],
    ),
    "deflate": (False, encoded(b"deflate", deflated(COMPLETION))),
    "deflate without its zlib wrapper": (
        False,
        encoded(b"deflate", deflated(COMPLETION, -zlib.MAX_WBITS)),
    ),
    "gzip, then deflate": (False, encoded(b"gzip, Deflate", deflated(gzip.compress(COMPLETION)))),
    "identity and a coding not offered": (False, encoded(b"identity, br", COMPLETION)),
    "a corrupt gzip body": (False, encoded(b"gzip", ZIPPED[:10] + b"\xff" * 40)),
    "stream, a corrupt deflate body": (
        True,
        encoded(b"deflate", deflated(SSE)[:-30] + b"\x00\xff" * 20, b"text/event-stream"),
    ),
    "503 with a JSON error": (
        False,
        [
            head(
                b"503 Service Unavailable", b"content-type: application/json", b"content-length: 45"
            )
            + b'{"error": {"message": "overloaded", "x": 1}}\n'
        ],
    ),
    "body cut short": (False, [whole(COMPLETION)[0][:-20]]),
    "chunked body cut short": (
        False,
        [
            head(b"200 OK", b"content-type: application/json", b"transfer-encoding: chunked")
            + chunked(COMPLETION)[:-30]
        ],
    ),
    "no answer at all": (False, []),
    "a garbled status line": (False, [b"HTTP/1.1 OK 200\r\n\r\n"]),
    "a garbled chunk": (
        False,
        [head(b"200 OK", b"transfer-encoding: chunked") + b"zz\r\nhello\r\n0\r\n\r\n"],
    ),
    "a header line that is no field": (
        False,
        [head(b"200 OK", b"bad line: x", b"content-length: %d" % len(COMPLETION)) + COMPLETION],
    ),
    "a bare CR in a value": (
        False,
        [head(b"200 OK", b"x-a: 1\r2", b"content-length: %d" % len(COMPLETION)) + COMPLETION],
    ),
    "spaces around values": (
        False,
        [
            head(
                b"200 OK",
                b"content-type:application/json  ",
                b"content-length:\t%d " % len(COMPLETION),
            )
            + COMPLETION
        ],
    ),
    "two content lengths": (
        False,
        [head(b"200 OK", b"content-length: 2", b"content-length: 3") + b"{}"],
    ),
    "an unknown transfer coding": (
        False,
        [head(b"200 OK", b"transfer-encoding: gzip, chunked") + chunked(ZIPPED)],
    ),
    "stream, chunked": (
        True,
        [
            head(b"200 OK", b"content-type: text/event-stream", b"transfer-encoding: chunked"),
            *[chunked(SSE, 30)[i : i + 50] for i in range(0, len(chunked(SSE, 30)), 50)],
        ],
    ),
    "stream, gzip and chunked": (
        True,
        [
            head(
                b"200 OK",
                b"content-type: text/event-stream",
                b"content-encoding: gzip",
                b"transfer-encoding: chunked",
            )
            + chunked(gzip.compress(SSE), 25)
        ],
    ),
    "stream, read to close": (
        True,
        [head(b"200 OK", b"content-type: text/event-stream"), SSE[:100], SSE[100:]],
    ),
    "stream, latin-1": (
        True,
        [
            head(
                b"200 OK",
                b"content-type: text/event-stream; charset=iso-8859-1",
                b"content-length: %d" % len(SSE),
            )
            + SSE
        ],
    ),
    "stream cut short": (
        True,
        [
            head(b"200 OK", b"content-type: text/event-stream", b"transfer-encoding: chunked")
            + chunked(SSE, 30)[:150]
        ],
    ),
    "stream answered whole": (True, whole(COMPLETION)),
}


@asynccontextmanager
async def raw_server(
    answer: Callable[[trio.SocketStream, bytes], Any],
) -> AsyncIterator[tuple[str, list[int]]]:
    """A loopback server that reads each request and lets ``answer`` write raw bytes;
    yields its base URL and a list counting its connections."""
    connections: list[int] = []

    async def handler(stream: trio.SocketStream) -> None:
        connections.append(1)
        buffer = b""
        async with stream:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buffer += data
                top, _, buffer = buffer.partition(b"\r\n\r\n")
                length = int(top.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                while len(buffer) < length:
                    buffer += await stream.receive_some(65536)
                request, buffer = top + b"\r\n\r\n" + buffer[:length], buffer[length:]
                if not await answer(stream, request):
                    return

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1")
        )
        yield f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}/v1", connections
        nursery.cancel_scope.cancel()


async def outcome(url: str, stream: bool, client: httpx.AsyncClient | None) -> Any:
    llm: Any = load_llm("openai", base_url=url, client=client, timeout_s=5)
    try:
        if stream:
            events: list[Any] = []
            answer = await llm.stream(HISTORY[:2], on_event=events.append)
        else:
            answer = await llm.query(HISTORY[:2])
        return ("answer", answer.content, answer.usage)
    except ProviderError as error:
        return ("error", error.code, error.retryable, error.status, error.retry_after)
    finally:
        await llm.aclose()


@pytest.mark.parametrize("case", list(RESPONSES))
async def test_every_response_gives_what_httpx_gives(case: str) -> None:
    stream, pieces = RESPONSES[case]

    async def answer(out: trio.SocketStream, request: bytes) -> bool:
        for piece in pieces:
            await out.send_all(piece)
            await trio.sleep(0.002)  # each piece its own read
        return False  # then close: ends a read-to-close body, cuts a short one

    results = []
    async with raw_server(answer) as (url, _):
        for client in (None, httpx.AsyncClient()):
            results.append(await outcome(url, stream, client))
            if client is not None:
                await client.aclose()
    wire, oracle = results
    assert wire == oracle
    if case in ("length", "gzip", "deflate", "gzip, then deflate", "stream, chunked"):
        assert wire[0] == "answer" and wire[1] == "hé there"
    if "corrupt" in case:  # a clear provider error, retried as a garbled 200 is
        assert wire[0] == "error" and wire[1].startswith("malformed_") and wire[2] is True


BOMB = 64 * 1024 * 1024
"""Bytes of zeros in the bomb: ~64 KB of gzip."""


def gzip_bomb(size: int) -> bytes:
    packer = zlib.compressobj(9, wbits=zlib.MAX_WBITS | 16)
    zeros = bytes(1 << 20)
    return b"".join(packer.compress(zeros) for _ in range(size >> 20)) + packer.flush()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_compression_bomb_is_refused_before_it_takes_the_memory(
    monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """A provider's 64 KB of gzip that inflates to 64 MiB: the wire path decodes at most
    its bound (here 1 MiB) and refuses the rest, with a clear, final error."""
    from cantrip.llm.providers import _decode

    monkeypatch.setattr(_decode, "MAX_BODY", 1 << 20)
    bomb = gzip_bomb(BOMB)
    kind = b"text/event-stream" if stream else b"application/json"
    pieces = encoded(b"gzip", bomb, kind)

    async def answer(out: trio.SocketStream, request: bytes) -> bool:
        for piece in pieces:
            await out.send_all(piece)
        return True

    async with raw_server(answer) as (url, _):
        tracemalloc.start()
        try:
            result = await outcome(url, stream, None)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert result == ("error", "response_too_large", False, None, None)
    assert peak < 16 << 20, f"{peak:,} bytes allocated while refusing the bomb"


# -- connections ------------------------------------------------------------------------------


async def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    closed = trio.Event()

    async def answer_then_hang_up(out: trio.SocketStream, request: bytes) -> bool:
        await out.send_all(whole(COMPLETION)[0])
        await trio.sleep(0.05)  # keep-alive said, then the server's idle timeout
        await out.aclose()
        closed.set()
        return False

    async with raw_server(answer_then_hang_up) as (url, connections):
        llm = load_llm("openai", base_url=url)
        try:
            assert (await llm.query(HISTORY[:2])).content == "hé there"
            await closed.wait()  # the second query comes after the hang-up, however late
            assert (await llm.query(HISTORY[:2])).content == "hé there"  # no error
        finally:
            await llm.aclose()
    assert len(connections) == 2


async def test_a_connection_idle_past_the_keepalive_expiry_is_not_reused(mock_clock: Any) -> None:
    fake = FakeOpenAI([Answer(text="a"), Answer(text="b"), Answer(text="c")])
    async with serve(fake, "/v1") as url:
        llm = load_llm("openai", base_url=url)
        try:
            await llm.query(HISTORY[:2])
            mock_clock.jump(4.0)
            await llm.query(HISTORY[:2])  # within httpx's 5 s: the same connection
            assert fake.connections == 1
            mock_clock.jump(5.5)
            await llm.query(HISTORY[:2])
        finally:
            await llm.aclose()
    assert fake.connections == 2


async def test_a_request_cancelled_mid_flight_closes_its_connection() -> None:
    hung_up = trio.Event()

    async def never_answer(out: trio.SocketStream, request: bytes) -> bool:
        assert await out.receive_some(100) == b""  # the client closed the connection
        hung_up.set()
        return False

    async with raw_server(never_answer) as (url, connections):
        llm: Any = load_llm("openai", base_url=url)
        try:
            with trio.move_on_after(0.2):
                await llm.query(HISTORY[:2])
            with trio.fail_after(5):
                await hung_up.wait()
            assert llm._pool.busy == 0
        finally:
            await llm.aclose()
    assert len(connections) == 1


def test_a_header_h11_refuses_is_an_invalid_request_as_before() -> None:
    async def main() -> None:
        llm: Any = load_llm("openai", base_url="http://127.0.0.1:9/v1")
        llm._headers = {**llm._headers, "x-bad": "a\nb"}
        with pytest.raises(ProviderError) as info:
            await llm.query(HISTORY[:2])
        assert info.value.code == "invalid_request" and not info.value.retryable

    trio.run(main)


# -- TLS and proxies --------------------------------------------------------------------------


def certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA and a certificate it signed for 127.0.0.1: (ca.pem, cert.pem, key.pem)."""
    now = datetime.datetime.now(datetime.UTC)

    def build(subject: str, key: Any, issuer: str, signer: Any, ca: bool) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            )
        return builder.sign(signer, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = build("test CA", ca_key, "test CA", ca_key, True)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = build("127.0.0.1", key, "test CA", ca_key, False)
    paths = folder / "ca.pem", folder / "cert.pem", folder / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


@asynccontextmanager
async def serve_tls(fake: Any, folder: Path, alpn: list[str]) -> AsyncIterator[str]:
    _, cert, key = certificates(folder)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["http/1.1"])

    async def handler(tcp: trio.SocketStream) -> None:
        tls = trio.SSLStream(tcp, context, server_side=True, https_compatible=True)
        try:
            await tls.do_handshake()
        except trio.BrokenResourceError:
            return  # the client refused our certificate
        alpn.append(tls.selected_alpn_protocol() or "")
        fake.connections += 1
        await _connection(fake, tls)  # type: ignore[arg-type]

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1")
        )
        yield f"https://127.0.0.1:{listeners[0].socket.getsockname()[1]}/v1"
        nursery.cancel_scope.cancel()


async def test_https_verifies_the_server_and_sends_what_httpx_sends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeOpenAI([Answer(text="secure"), Answer(text="oracle")])
    alpn: list[str] = []
    async with serve_tls(fake, tmp_path, alpn) as url:
        # Not trusted (httpx's CA bundle does not hold our test CA): refused, as httpx refuses.
        llm: Any = load_llm("openai", base_url=url)
        with pytest.raises(ProviderError) as info:
            await llm.query(HISTORY[:2])
        assert info.value.code == "connect_error" and "CERTIFICATE_VERIFY_FAILED" in str(info.value)
        await llm.aclose()
        assert fake.served == 0
        # Trusted through the environment, as httpx trusts it (SSL_CERT_FILE, trust_env).
        monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))
        llm = load_llm("openai", base_url=url)
        llm._trust_env = True
        oracle = httpx.AsyncClient(verify=ssl.create_default_context(cafile=tmp_path / "ca.pem"))
        given = load_llm("openai", base_url=url, client=oracle)
        try:
            assert (await llm.query(HISTORY[:2])).content == "secure"
            wire = bytes(fake.received)
            assert (await given.query(HISTORY[:2])).content == "oracle"
        finally:
            await llm.aclose()
            await oracle.aclose()
    assert alpn == ["http/1.1", "http/1.1"]
    assert wire == bytes(fake.received[len(wire) :]) and wire.startswith(b"POST /v1/chat")


async def test_a_proxy_from_the_environment_is_used_as_httpx_uses_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pool keeps httpx where a proxy applies: the request goes to the proxy."""
    seen: list[bytes] = []

    async def proxy(out: trio.SocketStream, request: bytes) -> bool:
        seen.append(request.split(b"\r\n")[0])
        await out.send_all(whole(COMPLETION)[0])
        return True

    async with raw_server(proxy) as (proxy_url, _):
        monkeypatch.setenv("HTTP_PROXY", proxy_url.removesuffix("/v1"))
        llm: Any = load_llm("openai", base_url="http://provider.invalid/v1")
        try:
            assert (await llm.query(HISTORY[:2])).content == "hé there"
            assert not llm._pool.wire
        finally:
            await llm.aclose()
    assert seen == [b"POST http://provider.invalid/v1/chat/completions HTTP/1.1"]


async def test_the_read_timeout_counts_from_each_read_not_from_the_request() -> None:
    """Each read gets the whole read timeout (httpx's meaning): a body trickling in
    pieces 0.25 s apart under a 0.4 s timeout arrives whole after ~1 s, although the
    request took longer than the timeout; a gap of 0.8 s is a retryable timeout."""
    body = chunked(COMPLETION, size=len(COMPLETION) // 4 + 1)
    pieces = [body[i : i + len(body) // 4 + 1] for i in range(0, len(body), len(body) // 4 + 1)]

    def trickling(gap: float) -> Callable[[trio.SocketStream, bytes], Any]:
        async def answer(out: trio.SocketStream, request: bytes) -> bool:
            await out.send_all(
                head(b"200 OK", b"content-type: application/json", b"transfer-encoding: chunked")
            )
            for piece in pieces:
                await trio.sleep(gap)
                await out.send_all(piece)
            return False

        return answer

    for gap, expected in ((0.25, "answer"), (0.8, "error")):
        async with raw_server(trickling(gap)) as (url, _):
            llm: Any = load_llm("openai", base_url=url, timeout_s=0.4)
            started = trio.current_time()
            try:
                answer = await llm.query(HISTORY[:2])
                got: tuple[Any, ...] = ("answer", answer.content)
            except ProviderError as error:
                got = ("error", error.code, error.retryable)
            finally:
                await llm.aclose()
            took = trio.current_time() - started
        if expected == "answer":
            assert got == ("answer", "hé there")
            assert took > 0.4 * 2  # longer than the timeout: each read had its own
        else:
            assert got == ("error", "timeout", True)


async def test_many_stalled_requests_time_out_together_and_on_time() -> None:
    """The pool's one watcher (not a cancel scope per request) times requests out:
    40 requests in flight on 40 connections to a server that never answers all end
    as retryable timeouts, each 0.4-1.0 s after it started (timeout 0.4 s) -- plus what
    a busy machine took from the loop meanwhile (its margin, measured)."""

    async def never(out: trio.SocketStream, request: bytes) -> bool:
        await trio.sleep_forever()
        return False

    ended: list[tuple[Any, float]] = []
    async with raw_server(never) as (url, connections):
        llm: Any = load_llm("openai", base_url=url, timeout_s=0.4)

        async def one() -> None:
            started = trio.current_time()
            try:
                await llm.query(HISTORY[:2])
                ended.append(("answer", trio.current_time() - started))
            except ProviderError as error:
                ended.append(((error.code, error.retryable), trio.current_time() - started))

        with MachineTime() as taken:
            async with trio.open_nursery() as nursery:
                for _ in range(40):
                    nursery.start_soon(one)
            margin = taken()
        await llm.aclose()
        assert len(connections) == 40
    assert {outcome for outcome, _ in ended} == {("timeout", True)}
    late = sorted(took for _, took in ended)
    assert all(0.4 <= took < 1.0 + margin for took in late), (late, margin)


async def test_a_request_the_server_never_reads_times_out_while_sending() -> None:
    """A body larger than the socket buffers, to a server that never reads it: the
    write times out (a retryable timeout) instead of waiting forever."""

    async def deaf(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, deaf, 0, host="127.0.0.1")
        )
        url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}/v1"
        llm: Any = load_llm("openai", base_url=url, timeout_s=0.4)
        huge = [Message("user", "x" * 32_000_000)]
        started = trio.current_time()
        with MachineTime() as taken, pytest.raises(ProviderError) as caught:
            await llm.query(huge)
        took, margin = trio.current_time() - started, taken()
        await llm.aclose()
        nursery.cancel_scope.cancel()
    assert caught.value.code == "timeout" and caught.value.retryable
    assert "WriteTimeout" in str(caught.value)
    assert 0.4 <= took < 2.0 + margin, (took, margin)


async def test_a_stream_that_stops_mid_body_times_out() -> None:
    """Streamed events, then silence: the read after the last event times out (the
    watcher guards reads outside the request's first exchange too)."""
    events = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"h"}}]}\n\n'

    async def stop_after_one(out: trio.SocketStream, request: bytes) -> bool:
        await out.send_all(
            head(b"200 OK", b"content-type: text/event-stream", b"transfer-encoding: chunked")
            + b"%x\r\n%s\r\n" % (len(events), events)
        )
        await trio.sleep_forever()
        return False

    async with raw_server(stop_after_one) as (url, _):
        llm: Any = load_llm("openai", base_url=url, timeout_s=0.4)
        seen: list[Any] = []
        started = trio.current_time()
        with MachineTime() as taken, pytest.raises(ProviderError) as caught:
            await llm.stream(HISTORY[:2], on_event=seen.append)
        took, margin = trio.current_time() - started, taken()
        await llm.aclose()
    assert caught.value.code == "timeout" and caught.value.retryable
    assert seen  # the first event arrived before the silence
    assert 0.4 <= took < 1.5 + margin, (took, margin)


async def test_a_connect_that_never_completes_times_out(tmp_path: Any) -> None:
    """A server whose accept queue is full leaves a connect hanging (its SYN unanswered):
    the provider's ``connect_timeout_s`` ends it as a retryable timeout, on time (kept
    by the pool's watcher, as writes and reads are)."""
    import os
    import socket

    folder = Path(os.environ["CANTRIP_PROVIDERS_DIR"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "openai.toml").write_text("[provider]\nconnect_timeout_s = 0.3\n")
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    port = full.getsockname()[1]
    first = socket.create_connection(("127.0.0.1", port))  # fills the queue: never accepted
    try:
        llm: Any = load_llm("openai", base_url=f"http://127.0.0.1:{port}/v1", timeout_s=30)
        started = trio.current_time()
        with MachineTime() as taken, pytest.raises(ProviderError) as caught:
            await llm.query(HISTORY[:2])
        took, margin = trio.current_time() - started, taken()
        await llm.aclose()
    finally:
        first.close()
        full.close()
    assert caught.value.code == "timeout" and caught.value.retryable
    assert "ConnectTimeout" in str(caught.value)
    assert 0.3 <= took < 2.0 + margin, (took, margin)
