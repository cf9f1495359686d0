"""``cantrip mcp --http`` under a fuzz: every bad message gets MCP's own answer.

Hypothesis draws bodies (bytes that are not JSON, JSON that is not a request, and
requests of every served method with wrong values in their fields, at both protocol
eras' envelopes and headers) and posts them to a real ``cantrip mcp --http``
process. Each is answered with a JSON-RPC message -- an error with an integer code,
or a result -- never a 5xx and never cantrip's HTTP API error shape; the server
keeps serving and its loom stays readable.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp_support import BIN

from cantrip.loom import Loom

pytestmark = pytest.mark.xdist_group("mcp_fuzz")  # one server, the checks after the fuzz

FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
METHODS = [
    "tools/call",
    "tools/list",
    "resources/list",
    "resources/read",
    "resources/templates/list",
    "prompts/list",
    "server/discover",
    "initialize",
    "notifications/initialized",
    "subscriptions/listen",
    "completion/complete",
    "tasks/get",
    "tasks/update",
    "tasks/cancel",
    "no/such/method",
]
VERSIONS = ["2026-07-28", "2025-11-25", "2024-11-05", "1999-01-01", ""]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def requests(draw: st.DrawFn) -> tuple[dict[str, str], bytes]:
    """Headers and a body: a request of a served method with some fields gone wrong."""
    method = draw(st.sampled_from(METHODS))
    version = draw(st.sampled_from(VERSIONS))
    params: dict[str, Any] = {
        "name": "cast",
        "arguments": {"intent": "fuzz"},
        "uri": "cantrip://threads/entity-nope",
        "protocolVersion": version,
        "capabilities": {},
        "clientInfo": {"name": "fuzz", "version": "0"},
        "taskId": "task-nope",
        "inputResponses": {"pause-x": {"action": "accept", "content": {"answer": "x"}}},
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": version,
            "io.modelcontextprotocol/clientCapabilities": {
                "elicitation": {},
                "extensions": {"io.modelcontextprotocol/tasks": {}},
            },
        },
    }
    for field in draw(st.lists(st.sampled_from(sorted(params)), unique=True, max_size=3)):
        params[field] = draw(json_values)
    request: dict[str, Any] = {
        "jsonrpc": "2.0",
        "id": draw(st.integers(0, 10**6)),
        "method": method,
    }
    if draw(st.booleans()):
        request["params"] = params
    for field in draw(st.lists(st.sampled_from(["jsonrpc", "id", "method"]), max_size=1)):
        request[field] = draw(json_values)
    headers = {"mcp-method": draw(st.sampled_from([method, "tools/list", "x"]))}
    if draw(st.booleans()):
        headers["mcp-protocol-version"] = version
    if draw(st.booleans()):
        headers["mcp-name"] = draw(st.sampled_from(["cast", "other"]))
    return headers, json.dumps(request).encode()


garbage = st.one_of(
    st.binary(min_size=1, max_size=200).filter(lambda b: not _is_json(b)),
    json_values.filter(lambda v: not isinstance(v, dict)).map(lambda v: json.dumps(v).encode()),
    st.just(b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"' + b"," * 3),
    st.just(b"[" * 5000 + b"]" * 5000),
)


def _is_json(body: bytes) -> bool:
    try:
        json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False
    return True


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A real ``cantrip mcp --http`` process for the module; its URL and loom."""
    folder = tmp_path_factory.mktemp("mcpfuzz")
    spec = folder / "spec.toml"
    spec.write_text(
        "\n".join(
            [
                "[llm]",
                'provider = "scripted"',
                'responses = [{ tool_calls = [{ gate = "done", args = { answer = "ok" } }] }]',
                "[circle]",
                'medium = "conversation"',
                'gates = ["done"]',
                "wards = [{ max_turns = 2 }]",
                "[loom]",
                'path = "fuzz.db"',
            ]
        )
        + "\n"
    )
    process = subprocess.Popen(
        [str(BIN / "cantrip"), "mcp", str(spec), "--http", "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
        cwd=folder,
    )
    assert process.stderr is not None
    try:
        line = process.stderr.readline()
        assert "/mcp" in line, line
        yield line.split(" at ", 1)[1].strip(), folder / "fuzz.db"
    finally:
        process.terminate()
        process.wait(timeout=20)


def check_answer(response: httpx.Response, sent: bytes) -> None:
    """A JSON-RPC answer (or 202 for a notification), never a 5xx or another shape."""
    assert response.status_code < 500, (sent[:300], response.status_code, response.text[:300])
    if response.status_code == 202 and not response.content:
        return
    text = response.text
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
        data = [d for d in data if d]
        assert data, (sent[:300], text[:300])
        text = data[-1]
    answer = json.loads(text)
    assert answer.get("jsonrpc") == "2.0", (sent[:300], text[:300])
    assert ("error" in answer) != ("result" in answer), (sent[:300], text[:300])
    if "error" in answer:
        assert isinstance(answer["error"]["code"], int), (sent[:300], text[:300])


ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


@FUZZ
@given(drawn=requests())
def test_fuzzed_requests_get_json_rpc_answers(
    server: tuple[str, Path], drawn: tuple[dict[str, str], bytes]
) -> None:
    url, _ = server
    headers, body = drawn
    response = httpx.post(url, content=body, headers={**ACCEPT, **headers}, timeout=30)
    check_answer(response, body)


@FUZZ
@given(body=garbage)
def test_bodies_that_are_not_requests_get_parse_or_invalid_request_errors(
    server: tuple[str, Path], body: bytes
) -> None:
    url, _ = server
    response = httpx.post(
        url, content=body, headers={**ACCEPT, "mcp-protocol-version": "2026-07-28"}, timeout=30
    )
    check_answer(response, body)
    answer = json.loads(response.text)
    assert answer["error"]["code"] in (-32700, -32600, -32602), (body[:200], answer)


def test_after_the_fuzz_the_server_casts_and_its_loom_is_whole(server: tuple[str, Path]) -> None:
    url, loom_path = server
    version = "2026-07-28"
    request = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {
            "name": "cast",
            "arguments": {"intent": "after the fuzz"},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": version,
                "io.modelcontextprotocol/clientCapabilities": {},
            },
        },
    }
    headers = {**ACCEPT, "mcp-protocol-version": version, "mcp-method": "tools/call"}
    response = httpx.post(url, json=request, headers={**headers, "mcp-name": "cast"}, timeout=30)
    check_answer(response, b"")
    text = response.text
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        text = [line[5:] for line in text.splitlines() if line.startswith("data:")][-1]
    result = json.loads(text)["result"]
    assert result["structuredContent"]["result"] == "ok"
    loom = Loom.open(loom_path)
    try:
        for entity_id in loom.entities:
            last = loom.last_turn(entity_id)
            if last is not None:
                loom.thread(last.id)  # every thread reads whole
    finally:
        loom.close()


def test_a_body_that_is_not_json_is_a_json_rpc_parse_error(server: tuple[str, Path]) -> None:
    """The guard reads the body first; its refusal is told in JSON-RPC on /mcp."""
    url, _ = server
    response = httpx.post(url, content=b"{not json", headers=ACCEPT, timeout=30)
    assert response.status_code == 400
    assert response.json() == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32700, "message": response.json()["error"]["message"]},
    }
    assert response.json()["error"]["message"].startswith("Parse error: the body is not JSON")
    too_big = httpx.post(url, content=b'{"pad": "' + b"x" * (2 << 20) + b'"}', headers=ACCEPT)
    assert too_big.status_code == 413 and too_big.json()["error"]["code"] == -32600
