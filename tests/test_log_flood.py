"""Untrusted clients cannot flood a server's log: a malformed request is the client's fault.

Each of cantrip's HTTP servers -- A2A (the a2a-sdk's dispatcher), AG-UI and the plain
HTTP API behind the guard, MCP over streamable HTTP (the MCP SDK) -- is sent 200
malformed requests, each carrying the server's bearer token (in the header, and in
the body where a library might quote it). Every request gets the protocol's own
error; the log at WARNING and above stays empty, and no record at any level holds
the token. A fault of cantrip's own (an exception in its A2A handler) is still
logged at ERROR with its traceback.
"""

from __future__ import annotations

import json
import logging
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from test_a2a_server import _fuzzed, rpc, serving, spell
from test_mcp_server import INIT, MCP_HEADERS, SCRIPT, write_spec

pytestmark = pytest.mark.loop_watch  # nothing here may block the trio loop (issue 28)

TOKEN = "tok-flood-0123456789abcdefXYZ"
AUTH = {"authorization": f"Bearer {TOKEN}"}
REQUESTS = 200


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def records(caplog: pytest.LogCaptureFixture) -> Iterator[list[logging.LogRecord]]:
    """Every record any logger makes while the test runs (DEBUG and up)."""
    quiet = ("httpx", "httpcore", "a2a.utils.telemetry", "hpack")  # the test's own client
    levels = {name: logging.getLogger(name).level for name in quiet}
    for name in quiet:
        logging.getLogger(name).setLevel(logging.WARNING)
    caplog.set_level(logging.DEBUG)  # (restored by caplog)
    kept = _Kept()
    logging.getLogger().addHandler(kept)
    try:
        yield kept.records
    finally:
        logging.getLogger().removeHandler(kept)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def _text(record: logging.LogRecord) -> str:
    text = record.getMessage()
    if record.exc_info:
        text += logging.Formatter().formatException(record.exc_info)
    return text + (record.exc_text or "") + (record.stack_info or "")


def assert_quiet(records: list[logging.LogRecord]) -> None:
    loud = [f"{r.name} {r.levelname}: {r.getMessage()[:200]}" for r in records]
    loud = [line for line, r in zip(loud, records, strict=True) if r.levelno >= logging.WARNING]
    assert loud == [], f"{len(loud)} records at WARNING+ for bad requests: {loud[:5]}"
    assert not [r.name for r in records if TOKEN in _text(r)], "the token reached the log"


def _a2a_malformed(rng: random.Random, index: int) -> tuple[bytes, dict[str, str]]:
    """One malformed A2A request (its body and headers), of one of five kinds."""
    kind = index % 5
    body: Any
    version = "1.0"
    if kind == 0:  # a served method with a field replaced (the A2A fuzz)
        body = _fuzzed(rng, index)
        version = rng.choice(["1.0", "0.3", "9"])
    elif kind == 1:
        return b'{"jsonrpc": "2.0", "token": "' + TOKEN.encode() + b'", ', {}
    elif kind == 2:
        message = {"messageId": "m", "role": "ROLE_USER", "parts": 3, "metadata": TOKEN}
        body = {"jsonrpc": "2.0", "id": index, "method": "SendMessage", "params": message}
    elif kind == 3:
        body = {"jsonrpc": "1.0", "id": index, "method": "GetTask", "params": {"id": TOKEN}}
    else:  # an A2A 0.3 method whose message is no message
        params = {"message": {"kind": TOKEN, "parts": {"x": TOKEN}}}
        body = {"jsonrpc": "2.0", "id": index, "method": "message/send", "params": params}
        version = "0.3"
    return json.dumps(body).encode(), {"a2a-version": version}


async def test_malformed_a2a_requests_get_json_rpc_errors_and_log_nothing_loud(
    records: list[logging.LogRecord],
) -> None:
    rng = random.Random(7)
    codes: Counter[int] = Counter()
    async with (
        serving(spell([]), token=TOKEN) as url,
        httpx.AsyncClient(base_url=url, timeout=20, headers=AUTH) as http,
    ):
        for index in range(REQUESTS):
            body, headers = _a2a_malformed(rng, index)
            response = await http.post(
                "/a2a", content=body, headers={"content-type": "application/json", **headers}
            )
            assert response.status_code == 200, response.text
            if response.headers["content-type"].startswith("text/event-stream"):
                continue  # a fuzzed stream that started (its task is unknown: it ends)
            answer = response.json()
            assert answer["jsonrpc"] == "2.0" and ("error" in answer) != ("result" in answer)
            if "error" in answer:  # (a fuzzed request may still be a valid one)
                codes[answer["error"]["code"]] += 1
        assert (await http.get("/health")).json()["ok"]
    assert {-32700, -32600, -32602} <= set(codes), codes
    assert sum(codes.values()) > REQUESTS * 3 // 4
    assert_quiet(records)
    # still there for whoever turns DEBUG on: one line per refusal, no traceback
    refused = [r for r in records if "a client's request refused" in r.getMessage()]
    assert len(refused) >= REQUESTS // 2 and not any(r.exc_info for r in refused)


async def test_a_fault_in_cantrips_a2a_handler_is_still_logged_at_error(
    records: list[logging.LogRecord], monkeypatch: pytest.MonkeyPatch
) -> None:
    from cantrip.protocols.a2a._handler import A2AHandler

    async def broken(self: Any, params: Any, context: Any) -> Any:
        raise RuntimeError("a bug in cantrip")

    monkeypatch.setattr(A2AHandler, "on_get_task", broken)
    async with (
        serving(spell([])) as url,
        httpx.AsyncClient(base_url=url, timeout=20) as http,
    ):
        answer = await rpc(http, {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {}})
    assert answer["error"]["code"] == -32603
    faults = [r for r in records if r.levelno >= logging.ERROR and r.exc_info]
    assert faults and isinstance(faults[0].exc_info[1], RuntimeError)  # type: ignore[index]


async def _raw(url: str, data: bytes) -> bytes:
    """What a server answers to bytes that are not HTTP (its status line)."""
    host, port = url.removeprefix("http://").rstrip("/").rsplit(":", 1)
    async with await trio.open_tcp_stream(host, int(port)) as stream:
        await stream.send_all(data)
        answer = b""
        with trio.move_on_after(5):
            while b"\r\n" not in answer and (chunk := await stream.receive_some(4096)):
                answer += chunk
    return answer.split(b"\r\n", 1)[0]


async def test_malformed_api_agui_and_refused_requests_log_nothing_loud(
    records: list[logging.LogRecord],
) -> None:
    """The plain HTTP API, AG-UI, the guard's refusals and bytes that are not HTTP."""
    token_line = b"Authorization: " + AUTH["authorization"].encode() + b"\r\n"
    garbage = [  # what h11 refuses, with what hypercorn answers
        (b"GARBAGE \x00 HTTP/9\r\n" + token_line + b"\r\n", b"HTTP/1.1 400 "),
        (b"POST /sessions HTTP/1.1\r\nTransfer-Encoding: zz\r\n" + token_line + b"\r\n",
         b"HTTP/1.1 501 "),
    ]  # fmt: skip
    kinds: list[tuple[str, str, dict[str, Any], int]] = [
        ("POST", "/sessions", {"content": b"{bad " + TOKEN.encode()}, 400),
        ("POST", "/sessions/nope/prompt", {"json": {"prompt": TOKEN}}, 404),
        ("POST", "/agui", {"json": {"threadId": [], "messages": 5, "x": TOKEN}}, 400),
        ("POST", "/agui", {"content": b"\xff\xfe" + TOKEN.encode()}, 400),
        ("GET", "/sessions", {"headers": {"authorization": f"Bearer x{TOKEN}"}}, 401),
        ("GET", "/sessions", {"headers": {"host": "evil.example"}}, 403),
        ("POST", "/sessions", {"json": {"intent": 5, "x": "\u0000" + TOKEN}}, 400),
        ("DELETE", "/sessions/%00", {}, 400),
    ]
    async with (
        serving(spell([]), token=TOKEN) as url,
        httpx.AsyncClient(base_url=url, timeout=20, headers=AUTH) as http,
    ):
        for index in range(REQUESTS):
            if index % 10 == 9:
                data, status_line = garbage[index // 10 % 2]
                assert await _raw(url, data) == status_line
                continue
            method, path, options, status = kinds[index % len(kinds)]
            response = await http.request(method, path, **options)
            assert response.status_code == status, (method, path, response.text)
            assert response.content
        assert (await http.get("/sessions")).json()["sessions"] == [], "nothing half-made"
    assert_quiet(records)


async def test_malformed_mcp_requests_over_http_log_nothing_loud(
    records: list[logging.LogRecord], tmp_path: Path
) -> None:
    from cantrip.cli._spec_file import load_cantrip
    from cantrip.protocols.mcp_server._server import serve_http

    served = load_cantrip(write_spec(tmp_path, SCRIPT, loom=False))
    headers = {**AUTH, **MCP_HEADERS}
    statuses: Counter[int] = Counter()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve_http(
                served, "127.0.0.1", 0, token=TOKEN, task_status=task_status
            )
        )
        url = binds[0] + "/mcp"
        async with httpx.AsyncClient(timeout=20, headers=headers) as http:
            session = {
                "mcp-session-id": (await http.post(url, json=INIT)).headers["mcp-session-id"]
            }
            bodies: list[tuple[Any, dict[str, str]]] = [
                (b"{bad " + TOKEN.encode(), {}),
                ({"jsonrpc": "1.0", "id": [1], "method": 5, "params": TOKEN}, session),
                ({"jsonrpc": "2.0", "id": 2, "method": "nope", "params": TOKEN}, session),
                (
                    {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": 5}},
                    session,
                ),
                ({"jsonrpc": "2.0", "id": 4, "method": "ping"}, {"mcp-session-id": "gone"}),
                ([1, 2, TOKEN], session),
                ({"jsonrpc": "2.0", "id": 99, "result": {"x": TOKEN}}, session),
                ({"jsonrpc": "2.0", "method": "notifications/initialized", "params": 5}, session),
            ]
            for index in range(REQUESTS):
                body, extra = bodies[index % len(bodies)]
                sent = {"content": body} if isinstance(body, bytes) else {"json": body}
                response = await http.post(url, headers=extra, **sent)
                statuses[response.status_code] += 1
                if response.status_code >= 400:
                    assert response.json()["error"]["code"] < 0, response.text
            # the session still serves
            ping = await http.post(url, json={"jsonrpc": "2.0", "id": 7, "method": "ping"},
                                   headers=session)  # fmt: skip
            assert ping.status_code == 200
        nursery.cancel_scope.cancel()
    assert statuses[400] + statuses[404] >= REQUESTS // 2, statuses
    assert_quiet(records)
    # a session id the server does not hold ("gone"), sent again and again, is not
    # written out each time at INFO by the SDK: one DEBUG line without it
    told = [r for r in records if r.levelno >= logging.INFO and "gone" in r.getMessage()]
    assert told == [], [r.getMessage() for r in told[:3]]
