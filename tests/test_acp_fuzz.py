"""ACP under a JSON-RPC fuzz (issue 20): random and truncated frames, and wrong types in
every params field of every method. Each request is answered -- a result or a JSON-RPC
error with the request's id -- nothing escapes the server, and it keeps serving.

Hypothesis draws the inputs (bounded ``max_examples``, derandomized so a run is
repeatable); each example drives a fresh server in its own ``trio.run``.
"""

from __future__ import annotations

import json
from typing import Any

import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cantrip
from cantrip.protocols.acp._server import AcpServer
from cantrip.protocols.acp._stdio import serve_stdio
from cantrip.spec import build_cantrip, parse_spec

METHODS = ["initialize", "session/new", "session/load", "session/prompt", "session/cancel"]
FIELDS = ["sessionId", "prompt", "content", "cwd", "mcpServers", "protocolVersion", "_meta"]
"""Every params field the methods read (and ones clients send that they ignore)."""

FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def make_spell() -> cantrip.Cantrip:
    answers = [{"content": f"answer {i}"} for i in range(400)]
    doc: dict[str, Any] = {
        "llm": {"provider": "scripted", "responses": answers},
        "circle": {"medium": "conversation", "gates": ["done"], "wards": [{"max_turns": 2}]},
    }
    return build_cantrip(parse_spec(doc))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
ids = st.one_of(st.integers(-5, 10**12), st.text(min_size=1, max_size=12))


@st.composite
def wrong_params(draw: st.DrawFn) -> dict[str, Any]:
    """A request whose params have arbitrary values (mostly of the wrong type) in known fields."""
    method = draw(st.sampled_from(METHODS))
    fields = draw(st.lists(st.sampled_from(FIELDS), unique=True, max_size=4))
    params = {field: draw(json_values) for field in fields}
    return {"jsonrpc": "2.0", "id": draw(ids), "method": method, "params": params}


def is_answer_to(message: Any, msg_id: Any) -> bool:
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        return False
    if message.get("id") != msg_id or ("result" in message) == ("error" in message):
        return False
    if "error" in message:
        error = message["error"]
        return isinstance(error.get("code"), int) and isinstance(error.get("message"), str)
    return True


@FUZZ
@given(requests=st.lists(wrong_params(), min_size=1, max_size=6))
def test_wrong_types_in_every_params_field_get_answers(requests: list[dict[str, Any]]) -> None:
    async def main() -> None:
        server = AcpServer(make_spell())
        try:
            await server.handle({"jsonrpc": "2.0", "id": 0, "method": "session/new"})
            for request in requests:
                with trio.fail_after(10):
                    answer = await server.handle(request)
                assert is_answer_to(answer, request["id"]), (request, answer)
                json.dumps(answer)  # every answer can be sent
            alive = await server.handle({"jsonrpc": "2.0", "id": "x", "method": "initialize"})
            assert alive is not None and "result" in alive
        finally:
            await server.aclose()

    trio.run(main)


def frame(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode()


valid_frames = st.builds(
    lambda i, m, p: frame({"jsonrpc": "2.0", "id": i, "method": m, "params": {"prompt": p}}),
    ids,
    st.sampled_from(METHODS),
    st.text(max_size=20),
)
truncated = st.tuples(valid_frames, st.integers(1, 60)).map(lambda t: t[0][: -t[1]])
noise = st.binary(min_size=1, max_size=80).map(lambda b: b.replace(b"\n", b" "))
deep = st.integers(1, 100_000).map(lambda n: b"[" * n)
surrogate = st.just(b'{"jsonrpc": "2.0", "id": 7, "method": "session/prompt", "params": '
                    b'{"prompt": "bad \\ud800 text"}}')  # fmt: skip
lines = st.one_of(truncated, noise, deep, valid_frames, surrogate)


@FUZZ
@given(garbage=st.lists(lines, min_size=1, max_size=8))
def test_random_and_truncated_frames_on_stdio_leave_the_server_serving(
    garbage: list[bytes],
) -> None:
    async def main() -> list[dict[str, Any]]:
        to_server_send, to_server_receive = trio.testing.memory_stream_one_way_pair()
        from_server_send, from_server_receive = trio.testing.memory_stream_one_way_pair()
        received: list[dict[str, Any]] = []
        probe = [
            frame({"jsonrpc": "2.0", "id": "probe-new", "method": "session/new"}),
            frame({"jsonrpc": "2.0", "id": "probe-init", "method": "initialize"}),
        ]

        async def read_all() -> None:
            buffer = b""
            while True:
                chunk = await from_server_receive.receive_some()
                if not chunk:
                    return
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    received.append(json.loads(line))  # every byte out is a JSON message

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_all)

            async def serve() -> None:
                async with from_server_send:
                    await serve_stdio(
                        make_spell(), stdin=to_server_receive, stdout=from_server_send
                    )

            nursery.start_soon(serve)
            await to_server_send.send_all(b"\n".join([*garbage, *probe]) + b"\n")
            await to_server_send.aclose()
        return received

    received = trio.run(main)
    by_id = {m.get("id"): m for m in received if isinstance(m, dict)}
    assert "result" in by_id["probe-init"], "the server kept serving to the end"
    assert "result" in by_id["probe-new"] or "error" in by_id["probe-new"]
    for message in received:
        if "method" in message:
            assert message["method"] == "session/update"
        else:
            assert ("result" in message) != ("error" in message), message
    unparsable = 0
    for line in garbage:
        if not line.strip():
            continue  # blank lines are skipped, as between messages
        try:
            json.loads(line)
        except (ValueError, RecursionError):
            unparsable += 1
    parse_errors = [m for m in received if m.get("id") is None and "error" in m]
    assert len(parse_errors) >= unparsable, "every broken frame got its own error"


def test_an_endless_line_is_refused_without_holding_memory(monkeypatch: Any) -> None:
    from cantrip.protocols.acp import _stdio as _acp

    monkeypatch.setattr(_acp, "MAX_LINE", 1000)

    async def main() -> list[dict[str, Any]]:
        to_server_send, to_server_receive = trio.testing.memory_stream_one_way_pair()
        from_server_send, from_server_receive = trio.testing.memory_stream_one_way_pair()
        received: list[dict[str, Any]] = []

        async def read_all() -> None:
            buffer = b""
            while chunk := await from_server_receive.receive_some():
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    received.append(json.loads(line))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_all)

            async def serve() -> None:
                async with from_server_send:
                    await serve_stdio(
                        make_spell(), stdin=to_server_receive, stdout=from_server_send
                    )

            nursery.start_soon(serve)
            for _ in range(50):  # 50 kB of one line, in pieces
                await to_server_send.send_all(b'{"jsonrpc": "2.0", "x": "' + b"y" * 1000)
            await to_server_send.send_all(
                b'"}\n' + frame({"jsonrpc": "2.0", "id": 1, "method": "initialize"}) + b"\n"
            )
            await to_server_send.aclose()
        return received

    received = trio.run(main)
    assert (
        received[0]["error"]["code"] == -32600
        and "over 1000 bytes" in received[0]["error"]["message"]
    )
    assert len(received) == 2 and received[1]["id"] == 1 and "result" in received[1]
