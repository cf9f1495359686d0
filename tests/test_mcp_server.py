"""``cantrip mcp``: a cantrip served over MCP, driven by the official SDK's client
against a real ``cantrip mcp`` process, over stdio and streamable HTTP."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from mcp import Client, StdioServerParameters
from mcp_support import BIN, call, finish, spell

import cantrip
from cantrip.cli._main import main as cli_main
from cantrip.loom import Loom
from cantrip.mcp import MCPServer

CANTRIP = str(BIN / "cantrip")


def write_spec(folder: Path, responses: list[dict[str, Any]], *, loom: bool = True) -> Path:
    spec = folder / "served.toml"
    lines = [
        "[llm]",
        'provider = "scripted"',
        _toml(responses),
        "[circle]",
        'medium = "conversation"',
        'gates = ["done", "echo"]',
        "wards = [{ max_turns = 4 }]",
    ]
    if loom:
        lines += ["[loom]", 'path = "served.db"']
    spec.write_text("\n".join(lines) + "\n")
    return spec


def _toml(responses: list[dict[str, Any]]) -> str:
    """The script as TOML inline tables."""

    def value(v: Any) -> str:
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(v)

    return "responses = [\n" + ",\n".join("  " + value(r) for r in responses) + "\n]"


SCRIPT = [
    call("echo", text="thinking"),
    finish("first answer"),
]


def stdio(spec: Path) -> Client:
    return Client(StdioServerParameters(command=CANTRIP, args=["mcp", str(spec)]))


async def test_cast_over_stdio_with_progress_and_loom_resources(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, SCRIPT)
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        progress.append((p, total, message))

    async with stdio(spec) as client:
        listed = (await client.list_tools()).tools
        assert [t.name for t in listed] == ["cast"]
        tool = listed[0]
        assert tool.input_schema["required"] == ["intent"]
        assert tool.output_schema is not None
        assert {"result", "terminated", "truncated", "turns", "usage"} <= set(
            tool.output_schema["properties"]
        )
        result = await client.call_tool("cast", {"intent": "hello"}, progress_callback=on_progress)
        assert not result.is_error
        assert result.content[0].text == "first answer"  # type: ignore[union-attr]
        structured = result.structured_content
        assert structured is not None
        assert structured["result"] == "first answer"
        assert (structured["terminated"], structured["truncated"]) == (True, False)
        assert structured["turns"] == 2 and structured["reason"] == "done"
        assert structured["usage"]["total_tokens"] == 0
        assert progress == [
            (1.0, 4.0, 'turn 1: echo({"text": "thinking"})'),
            (2.0, 4.0, 'turn 2: done({"answer": "first answer"})'),
        ]
        # Each call is a fresh entity, which plays the spec's script from its start.
        again = await client.call_tool("cast", {"intent": "again"})
        assert not again.is_error
        assert again.content[0].text == "first answer"  # type: ignore[union-attr]
        # The loom's threads are resources.
        resources = (await client.list_resources()).resources
        entity = structured["entity_id"]
        assert f"cantrip://threads/{entity}" in [str(r.uri) for r in resources]
        read = await client.read_resource(f"cantrip://threads/{entity}")
        thread = json.loads(read.contents[0].text)  # type: ignore[union-attr]
        assert [t["utterance"] for t in thread["turns"]] == [
            'echo({"text": "thinking"})',
            'done({"answer": "first answer"})',
        ]
    loom = Loom.open(tmp_path / "served.db")
    try:
        assert loom.entity_turns(entity)[-1].result == "first answer"
    finally:
        loom.close()


async def test_a_spent_script_is_a_tool_error_not_a_crash(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, [call("echo", text="thinking")], loom=False)
    async with stdio(spec) as client:
        spent = await client.call_tool("cast", {"intent": "hello"})
        assert spent.is_error and "ScriptExhaustedError" in spent.content[0].text  # type: ignore[union-attr]


@asynccontextmanager
async def http_server(spec: Path, *extra: str) -> AsyncIterator[str]:
    """``cantrip mcp --http --port 0``; yields the URL it prints on stderr."""
    process = await trio.lowlevel.open_process(
        [CANTRIP, "mcp", str(spec), "--http", "--port", "0", *extra],
        stderr=-1,  # subprocess.PIPE
    )
    assert process.stderr is not None
    try:
        buffer = b""
        with trio.fail_after(30):
            while b"/mcp" not in buffer:
                chunk = await process.stderr.receive_some(4096)
                assert chunk, f"cantrip mcp exited: {buffer!r}"
                buffer += chunk
        line = next(x for x in buffer.decode().splitlines() if "/mcp" in x)
        yield line.split(" at ", 1)[1].strip()
    finally:
        with trio.CancelScope(shield=True):
            process.terminate()
            with trio.move_on_after(10):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()


async def test_cast_over_streamable_http(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, SCRIPT, loom=False)
    progress: list[float] = []

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        progress.append(p)

    async with http_server(spec) as url:
        assert url.startswith("http://127.0.0.1:")
        async with Client(url) as client:
            result = await client.call_tool("cast", {"intent": "hi"}, progress_callback=on_progress)
            assert result.structured_content is not None
            assert result.structured_content["result"] == "first answer"
            assert progress == [1.0, 2.0]
            assert (await client.list_resources()).resources == []  # no loom file, no threads


async def test_a_client_cancellation_cancels_the_cast_and_the_loom_records_it(
    tmp_path: Path,
) -> None:
    slow = [call("echo", text="step one"), {"delay_ms": 600000, **finish("never")}]
    spec = write_spec(tmp_path, slow)
    first_turn = trio.Event()

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        first_turn.set()

    async with stdio(spec) as client:
        async with trio.open_nursery() as nursery:

            async def cast() -> None:
                await client.call_tool("cast", {"intent": "wait"}, progress_callback=on_progress)

            scope = trio.CancelScope()

            async def cancellable() -> None:
                with scope:
                    await cast()

            nursery.start_soon(cancellable)
            with trio.fail_after(30):
                await first_turn.wait()
            scope.cancel()  # the SDK sends notifications/cancelled for the request
        with trio.fail_after(30):
            while True:
                resources = (await client.list_resources()).resources
                uri = str(resources[0].uri) if resources else ""
                turns = (
                    json.loads((await client.read_resource(uri)).contents[0].text)["turns"]  # type: ignore[union-attr]
                    if uri
                    else []
                )
                if turns and turns[-1]["truncated"]:
                    break
                await trio.sleep(0.05)
    assert turns[-1]["reason"] == "cancelled"
    assert turns[0]["utterance"] == 'echo({"text": "step one"})', "the first turn is kept"


async def test_a_scripted_cast_round_trips_through_the_mcp_server_process(
    tmp_path: Path,
) -> None:
    """A cantrip whose gate is another cantrip, served by ``cantrip mcp``."""
    inner = write_spec(tmp_path, SCRIPT)
    outer = spell(
        [call("helper_cast", intent="ask the helper"), finish("relayed")],
        MCPServer(name="helper", command=CANTRIP, args=["mcp", str(inner)]),
    )
    outcome = await outer.cast_async("relay")
    record = outcome.turns[0].gate_calls[0]
    assert not record.is_error
    assert record.result["result"] == "first answer"
    assert record.result["turns"] == 2 and record.result["terminated"] is True
    assert dict(record.detail)["via"] == "mcp:helper"
    assert outcome.result == "relayed"


async def test_http_token_off_loopback_and_bearer_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(tmp_path, SCRIPT, loom=False)
    os.environ.pop("CANTRIP_MCP_TOKEN", None)
    assert cli_main(["mcp", str(spec), "--http", "--host", "0.0.0.0"]) == 1
    assert "needs a token" in capsys.readouterr().err
    async with http_server(spec, "--token", "s3cret-token") as url:
        async with httpx.AsyncClient() as plain:
            refused = await plain.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert refused.status_code == 401
        with_token = spell(
            [call("web_cast", intent="hi"), finish()],
            MCPServer(name="web", url=url, headers={"Authorization": "Bearer s3cret-token"}),
        )
        outcome = await with_token.cast_async("go")
        assert outcome.turns[0].gate_calls[0].result["result"] == "first answer"
        wrong = spell(
            [finish()],
            MCPServer(name="web", url=url, headers={"Authorization": "Bearer wrong-token"}),
        )
        with pytest.raises(cantrip.ConstructionError) as raised:
            await wrong.cast_async("go")
        assert "wrong-token" not in str(raised.value)


INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "probe", "version": "1"},
    },
}
MCP_HEADERS = {"accept": "application/json, text/event-stream"}


@pytest.mark.parametrize("host", ["127.0.0.2", "127.0.0.1"])
async def test_http_checks_host_and_origin_on_every_loopback_bind(
    tmp_path: Path, host: str
) -> None:
    """Issue 28.3: bound to a loopback address other than 127.0.0.1 the server took any
    Host and Origin, so a DNS-rebinding page could cast. One guard on every bind (the
    one ``cantrip serve`` has): its refusals, as the client sees them."""
    spec = write_spec(tmp_path, SCRIPT, loom=False)
    async with http_server(spec, "--host", host) as url:
        assert url.startswith(f"http://{host}:")
        async with httpx.AsyncClient(timeout=20) as http:
            rebound = await http.post(
                url, json=INIT, headers={**MCP_HEADERS, "host": "evil.example"}
            )
            assert rebound.status_code == 403
            assert rebound.json() == {
                "error": {
                    "code": "bad_host",
                    "message": "the Host header 'evil.example' does not name this server",
                }
            }
            page = await http.post(
                url, json=INIT, headers={**MCP_HEADERS, "origin": "http://evil.example"}
            )
            assert page.status_code == 403
            assert page.json()["error"] == {
                "code": "bad_origin",
                "message": "requests from origin 'http://evil.example' are not allowed",
            }
            assert rebound.headers["referrer-policy"] == "no-referrer"
            fine = await http.post(url, json=INIT, headers=MCP_HEADERS)
            assert fine.status_code == 200, fine.text
        async with Client(url) as client:  # the SDK's own client still casts
            result = await client.call_tool("cast", {"intent": "hi"})
            assert result.structured_content is not None
            assert result.structured_content["result"] == "first answer"


def test_check_loads_the_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write_spec(tmp_path, SCRIPT)
    assert cli_main(["mcp", str(spec), "--check"]) == 0
    assert "tool: cast" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_client_cancellation_over_http_cancels_the_cast_at_either_era(
    tmp_path: Path, mode: str
) -> None:
    """2026-07-28 cancels by closing the request's response stream; 2025-11-25 by
    ``notifications/cancelled``. Either way the cast is cut off and the loom says so."""
    from mcp.client.streamable_http import streamable_http_client

    slow = [call("echo", text="step one"), {"delay_ms": 600000, **finish("never")}]
    spec = write_spec(tmp_path, slow)
    first_turn = trio.Event()

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        first_turn.set()

    async with http_server(spec) as url:
        async with Client(streamable_http_client(url), mode=mode) as client:
            assert client.protocol_version == ("2026-07-28" if mode == "auto" else "2025-11-25")
            async with trio.open_nursery() as nursery:

                async def cast() -> None:
                    await client.call_tool(
                        "cast", {"intent": "wait"}, progress_callback=on_progress
                    )

                nursery.start_soon(cast)
                with trio.fail_after(30):
                    await first_turn.wait()
                nursery.cancel_scope.cancel()
        with trio.fail_after(30):
            while True:
                loom = Loom.open(tmp_path / "served.db")
                try:
                    turns = [t for e in loom.entities for t in loom.entity_turns(e)]
                finally:
                    loom.close()
                if turns and turns[-1].truncated:
                    break
                await trio.sleep(0.1)
    assert turns[-1].reason == "cancelled"


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_progress_reaches_the_client_at_either_era(tmp_path: Path, mode: str) -> None:
    spec = write_spec(tmp_path, SCRIPT, loom=False)
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        progress.append((p, total, message))

    client = Client(StdioServerParameters(command=CANTRIP, args=["mcp", str(spec)]), mode=mode)
    async with client:
        assert client.protocol_version == ("2026-07-28" if mode == "auto" else "2025-11-25")
        result = await client.call_tool("cast", {"intent": "hi"}, progress_callback=on_progress)
    assert not result.is_error
    assert progress == [
        (1.0, 4.0, 'turn 1: echo({"text": "thinking"})'),
        (2.0, 4.0, 'turn 2: done({"answer": "first answer"})'),
    ]


async def test_a_call_the_guard_refuses_queues_nothing(tmp_path: Path) -> None:
    """The headers are checked before anything reaches the session backend: a
    ``tools/call`` on a live MCP session with a wrong token or a foreign Origin is
    refused and no session, prompt or turn is made; the same call rightly sent casts."""
    spec = write_spec(tmp_path, SCRIPT)
    auth = {**MCP_HEADERS, "authorization": "Bearer s3cret-token"}
    call_cast = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "cast", "arguments": {"intent": "hi"}},
    }
    async with (
        http_server(spec, "--token", "s3cret-token") as url,
        httpx.AsyncClient(timeout=20) as http,
    ):
        opened = await http.post(url, json=INIT, headers=auth)
        assert opened.status_code == 200, opened.text
        session = {"mcp-session-id": opened.headers["mcp-session-id"]}
        ready = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        await http.post(url, json=ready, headers={**auth, **session})
        for bad in ({"authorization": "Bearer wrong"}, {"origin": "http://evil.example"}):
            refused = await http.post(url, json=call_cast, headers={**auth, **session, **bad})
            assert refused.status_code in (401, 403), refused.text
        assert _entities(tmp_path) == 0  # nothing was queued
        cast = await http.post(url, json=call_cast, headers={**auth, **session})
        assert cast.status_code == 200 and "first answer" in cast.text
        assert _entities(tmp_path) == 1


def _entities(folder: Path) -> int:
    loom = Loom.open(folder / "served.db")
    try:
        return len(loom.entities)
    finally:
        loom.close()


async def test_a_calls_session_is_let_go_of_when_its_prompt_ends() -> None:
    """Each ``cast`` is a session of the server's backend; once its prompt has ended the
    session is released (its entity and the gate providers it opened close, as they did
    when a call summoned its own entity), so a long-lived server does not hold one per
    call."""
    from test_http import SCRIPT as BOOKING
    from test_http import make_spell

    from cantrip.protocols.mcp_server._calls import drive
    from cantrip.protocols.sessions import ProcessBackend

    backend = ProcessBackend.serving(make_spell(BOOKING))
    async with backend.running():
        info, _ = await backend.create()
        entity = backend.hub.sessions[info.session_id].entity
        submitted = await backend.submit(info.session_id, "book")
        seen: list[str] = []
        driven = await drive(
            backend,
            info.session_id,
            submitted.prompt_id,
            after=0,
            on_turn=lambda turn: seen.append(turn.id),
            ask=None,
        )
        assert driven.cast is not None and driven.cast.result == "Your flight is booked."
        assert len(seen) == 2  # progress: each recorded step
        assert info.session_id not in backend.hub.sessions and entity._closed
