"""The ACP adapter in process: streamed updates, cancel, load, and protocol mistakes."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

import cantrip
from cantrip.llm import Message, Response, ToolChoice, ToolDefinition
from cantrip.protocols.acp._server import AcpServer
from cantrip.protocols.acp._stdio import serve_stdio
from cantrip.protocols.sessions._backend import Capabilities
from cantrip.protocols.sessions._process import ProcessBackend
from cantrip.spec import build_cantrip, parse_spec
from gates import call_agent, done, echo


def make_spell(
    script: list[dict[str, Any]], loom: Path | None = None, gates: Sequence[str] = ("done", "echo")
) -> cantrip.Cantrip:
    doc: dict[str, Any] = {
        # one script for the whole session, in query order (casts take turns through it)
        "llm": {"provider": "scripted", "responses": script, "script": "shared"},
        "circle": {"medium": "conversation", "gates": list(gates), "wards": [{"max_turns": 4}]},
    }
    if loom is not None:
        doc["loom"] = {"path": str(loom)}
    return build_cantrip(parse_spec(doc))


def rpc(msg_id: Any, method: str, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}


def updates(notes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [n["params"]["update"] for n in notes if n.get("method") == "session/update"]


def validate(notes: list[dict[str, Any]]) -> None:
    """Every notification has ACP's shape, as the reference client's models read it."""
    schema = pytest.importorskip("acp.schema")
    for note in notes:
        schema.SessionNotification.model_validate(note["params"])


class Client:
    """An AcpServer with a notification log, serving in the test's nursery."""

    def __init__(self, spell: cantrip.Cantrip) -> None:
        self.notes: list[dict[str, Any]] = []
        self.server = AcpServer(spell, notify=self._notify)
        self.scope = trio.CancelScope()
        self.stopped = trio.Event()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            with self.scope:
                async with self.server.running():
                    task_status.started()
                    await trio.sleep_forever()
        finally:
            self.stopped.set()

    async def stop(self) -> None:
        self.scope.cancel()
        await self.stopped.wait()

    async def _notify(self, message: dict[str, Any]) -> None:
        self.notes.append(message)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        response = await self.server.handle(rpc(1, method, **params))
        assert response is not None
        return response

    async def session(self) -> str:
        return str((await self.call("session/new"))["result"]["sessionId"])


async def started(nursery: trio.Nursery, spell: cantrip.Cantrip) -> Client:
    client = Client(spell)
    await nursery.start(client.serve)
    return client


SCRIPT: list[dict[str, Any]] = [
    {
        "thinking": "Echo first.",
        "content": "On it.",
        "tool_calls": [
            {"gate": "echo", "args": {"text": "hello"}},
            {"gate": "teleport", "args": {"to": "moon"}},
        ],
    },
    {"tool_calls": [{"gate": "done", "args": {"answer": "all done"}}]},
]


async def test_updates_stream_thoughts_text_and_tool_calls_in_acp_shape(
    nursery: trio.Nursery,
) -> None:
    client = await started(nursery, make_spell(SCRIPT))
    sid = await client.session()
    response = await client.call("session/prompt", sessionId=sid, prompt="go")
    assert response["result"]["stopReason"] == "end_turn"
    assert response["result"]["_meta"]["cantrip"]["result"] == "all done"
    validate(client.notes)
    seen = updates(client.notes)
    kinds = [u["sessionUpdate"] for u in seen]
    assert kinds[0] == "agent_thought_chunk"
    thought = "".join(u["content"]["text"] for u in seen if u["sessionUpdate"] == kinds[0])
    said = "".join(
        u["content"]["text"] for u in seen if u["sessionUpdate"] == "agent_message_chunk"
    )
    assert thought == "Echo first." and said == "On it.\n\nall done"
    by_call: dict[str, list[str]] = {}
    titles: dict[str, str | None] = {}
    for u in seen:
        if u["sessionUpdate"] in ("tool_call", "tool_call_update"):
            by_call.setdefault(u["toolCallId"], []).append(u["status"])
            titles.setdefault(u["toolCallId"], u.get("title"))
    statuses = {titles[k]: v for k, v in by_call.items()}
    assert statuses == {
        "echo": ["pending", "in_progress", "completed"],
        "teleport": ["pending", "in_progress", "failed"],
        "done": ["pending", "in_progress", "completed"],
    }
    assert len(by_call) == 3  # ids unique within the session


async def test_updates_arrive_while_the_prompt_is_still_running(nursery: trio.Nursery) -> None:
    script: list[dict[str, Any]] = [
        {"tool_calls": [{"gate": "echo", "args": {"text": "early"}}]},
        {"tool_calls": [{"gate": "done", "args": {"answer": "late"}}], "delay_ms": 500},
    ]
    client = await started(nursery, make_spell(script))
    sid = await client.session()
    finished = trio.Event()

    async def prompt() -> None:
        await client.call("session/prompt", sessionId=sid, prompt="go")
        finished.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(prompt)
        with trio.fail_after(5):
            while not any(u.get("status") == "completed" for u in updates(client.notes)):
                await trio.sleep(0.01)
        assert not finished.is_set(), "the echo result was reported before the cast ended"


async def test_an_llm_that_does_not_stream_gets_the_same_updates(nursery: trio.Nursery) -> None:
    class Plain:
        name = "plain"

        async def query(
            self,
            messages: Sequence[Message],
            tools: Sequence[ToolDefinition] = (),
            tool_choice: ToolChoice | None = None,
            extra: Mapping[str, Any] | None = None,
        ) -> Response:
            return Response(
                content="Plain words.",
                thinking="plain thoughts",
                tool_calls=(cantrip.ToolCall("c1", "done", {"answer": "plain"}),),
            )

    spell = cantrip.Cantrip(
        llm=Plain(),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done, echo], [cantrip.max_turns(2)]),
    )
    client = await started(nursery, spell)
    sid = await client.session()
    await client.call("session/prompt", sessionId=sid, prompt="go")
    validate(client.notes)
    kinds = [u["sessionUpdate"] for u in updates(client.notes)]
    assert kinds == [
        "agent_thought_chunk",
        "agent_message_chunk",
        "tool_call",
        "tool_call_update",
        "agent_message_chunk",
    ]


async def test_cancel_ends_the_prompt_as_cancelled_and_the_session_survives(
    nursery: trio.Nursery,
) -> None:
    script: list[dict[str, Any]] = [
        {"content": "pondering", "delay_ms": 30_000},
        {"tool_calls": [{"gate": "done", "args": {"answer": "back"}}]},
    ]
    spell = make_spell(script)
    client = await started(nursery, spell)
    sid = await client.session()
    results: list[dict[str, Any]] = []

    async def prompt() -> None:
        results.append(await client.call("session/prompt", sessionId=sid, prompt="slow"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(prompt)
        await trio.testing.wait_all_tasks_blocked()
        # a notification: no id, no response
        assert (
            await client.server.handle(
                {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}}
            )
            is None
        )
    result = results[0]["result"]
    assert result["stopReason"] == "cancelled"
    assert result["_meta"]["cantrip"]["reason"] == "cancelled"
    again = await client.call("session/prompt", sessionId=sid, prompt="and now?")
    assert again["result"]["_meta"]["cantrip"]["result"] == "back"
    turns = spell.loom.turns
    assert [t.reason for t in turns] == ["cancelled", "done"]
    assert turns[1].parent_id == turns[0].id  # same entity, same thread


async def test_load_resumes_a_session_from_the_loom_file(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    loom = tmp_path / "acp.db"
    first = make_spell(SCRIPT, loom)
    client = await started(nursery, first)
    init = await client.call("initialize", protocolVersion=1)
    assert init["result"]["agentCapabilities"]["loadSession"] is True
    sid = await client.session()
    await client.call("session/prompt", sessionId=sid, prompt="go")
    await client.stop()
    first.loom.close()

    second = make_spell([{"content": "I remember."}], loom)
    client = await started(nursery, second)
    loaded = await client.call("session/load", sessionId=sid, cwd="/tmp", mcpServers=[])
    assert loaded["result"]["_meta"]["cantrip"]["entityId"] == "entity-" + sid.split("-", 1)[1]
    validate(client.notes)
    replay = updates(client.notes)
    assert replay[0] == {
        "sessionUpdate": "user_message_chunk",
        "content": {"type": "text", "text": "go"},
    }
    assert [u["title"] for u in replay if u["sessionUpdate"] == "tool_call"] == [
        "echo",
        "teleport",
        "done",
    ]
    assert replay[-1]["content"]["text"] == "all done"
    answer = await client.call("session/prompt", sessionId=sid, prompt="remember?")
    assert answer["result"]["_meta"]["cantrip"]["result"] == "I remember."
    llm = second.llm
    assert isinstance(llm, cantrip.ScriptedLLM)
    assert "hello" in " ".join(m.text() for m in llm.invocations[0].messages)
    unknown = await client.call("session/load", sessionId="session-0000", cwd="/")
    assert unknown["error"]["code"] == -32002
    missing = await client.call("session/load", cwd="/")
    assert missing["error"]["code"] == -32602
    await client.stop()
    second.loom.close()


async def test_load_session_is_not_advertised_without_a_loom_file(nursery: trio.Nursery) -> None:
    client = await started(nursery, make_spell(SCRIPT))
    init = await client.call("initialize", protocolVersion=1)
    assert init["result"]["agentCapabilities"]["loadSession"] is False
    assert init["result"]["agentInfo"]["name"] == "cantrip"


async def test_protocol_mistakes_get_errors_and_the_stdio_server_keeps_serving() -> None:
    to_server_send, to_server_receive = trio.testing.memory_stream_one_way_pair()
    from_server_send, from_server_receive = trio.testing.memory_stream_one_way_pair()
    spell = make_spell([{"content": "still here"}])
    lines = [
        b"this is not json",
        b"[1, 2]",
        b"42",
        json.dumps({"jsonrpc": "2.0", "id": "a"}).encode(),
        json.dumps(rpc("b", "session/levitate")).encode(),
        json.dumps({"jsonrpc": "2.0", "id": "c", "method": "initialize", "params": [1]}).encode(),
        json.dumps(rpc("d", "session/prompt", prompt="hi")).encode(),
        json.dumps(rpc("e", "session/prompt", sessionId="session-none", prompt="hi")).encode(),
        json.dumps({"jsonrpc": "2.0", "id": "r", "result": {}}).encode(),  # a stray response
        json.dumps(rpc("f", "session/new")).encode(),
        json.dumps(rpc("g", "session/prompt", prompt=[{"type": "image", "data": ""}])).encode(),
        json.dumps(rpc("h", "session/prompt", prompt="Are you there?")).encode(),
        # an id no UTF-8 can carry is a client's mistake, like any bad id (issue 39.10)
        json.dumps(rpc("i", "session/prompt", sessionId="session-\ud800", prompt="x")).encode(),
    ]
    received: list[dict[str, Any]] = []

    async def read_until(count: int) -> None:
        buffer = b""
        while len([m for m in received if "id" in m]) < count:
            chunk = await from_server_receive.receive_some()
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                received.append(json.loads(line))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            lambda: serve_stdio(spell, stdin=to_server_receive, stdout=from_server_send)
        )
        await to_server_send.send_all(b"\n".join(lines) + b"\n\n")
        with trio.fail_after(10):
            await read_until(12)
        await to_server_send.aclose()  # stdin closes: the server ends
    by_id = {m.get("id"): m for m in received if "id" in m}
    errors = [m["error"]["code"] for m in received if "error" in m and m["id"] is None]
    assert errors == [-32700, -32600, -32600]
    assert by_id["a"]["error"]["code"] == -32600
    assert by_id["b"]["error"]["code"] == -32601
    assert by_id["c"]["error"]["code"] == -32602
    assert by_id["d"]["error"]["code"] == -32602  # no sessionId and no session yet
    assert by_id["e"]["error"]["code"] == -32002
    assert "r" not in by_id
    assert by_id["g"]["error"]["code"] == -32602  # no text in the prompt
    assert by_id["h"]["result"]["_meta"]["cantrip"]["result"] == "still here"
    assert by_id["i"]["error"]["code"] == -32602
    assert "surrogate" in by_id["i"]["error"]["message"]


def priced_spell(script: list[dict[str, Any]], pricing: cantrip.Pricing | None) -> cantrip.Cantrip:
    return cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(script, pricing=pricing),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done, echo], [cantrip.max_turns(10)]),
        loom=cantrip.Loom(),
        folding=cantrip.FoldingPolicy(context_window=8000),
    )


def spend(gate: str, prompt: int, completion: int) -> dict[str, Any]:
    args = {"answer": "ok"} if gate == "done" else {"text": "x"}
    return {
        "tool_calls": [{"gate": gate, "args": args}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion},
    }


async def test_usage_updates_carry_the_sessions_cost_so_far(nursery: trio.Nursery) -> None:
    """``usage_update.cost`` is the session's cumulative cost in USD (ACP v1.7): each
    call's as the turn records it, on top of what the session's earlier prompts cost
    (read from the loom), so a second prompt goes on from the first's total."""
    script = [spend("echo", 1000, 500), spend("done", 2000, 0)] * 2  # $0.002 a call
    client = await started(nursery, priced_spell(script, cantrip.Pricing(1.0, 2.0)))
    sid = await client.session()
    first = await client.call("session/prompt", sessionId=sid, prompt="go")
    second = await client.call("session/prompt", sessionId=sid, prompt="again")
    validate(client.notes)
    usage = [u for u in updates(client.notes) if u["sessionUpdate"] == "usage_update"]
    assert [(u["used"], u["size"]) for u in usage] == [(1500, 8000), (2000, 8000)] * 2
    assert [u["cost"]["currency"] for u in usage] == ["USD"] * 4
    assert [u["cost"]["amount"] for u in usage] == pytest.approx([0.002, 0.004, 0.006, 0.008])
    assert first["result"]["_meta"]["cantrip"]["costUsd"] == pytest.approx(0.004)
    assert second["result"]["_meta"]["cantrip"]["costUsd"] == pytest.approx(0.004)


async def test_usage_updates_say_no_cost_when_a_price_is_unknown(nursery: trio.Nursery) -> None:
    """A model nobody priced: ``usage_update`` keeps its tokens and has no ``cost``
    (never a made-up $0)."""
    client = await started(nursery, priced_spell([spend("done", 300, 20)], None))
    sid = await client.session()
    await client.call("session/prompt", sessionId=sid, prompt="go")
    (usage,) = [u for u in updates(client.notes) if u["sessionUpdate"] == "usage_update"]
    assert usage == {"sessionUpdate": "usage_update", "used": 320, "size": 8000}


async def test_a_childs_calls_count_in_the_sessions_cost(nursery: trio.Nursery) -> None:
    """A ``call_agent`` child's calls cost the session too: the parent's next
    ``usage_update`` counts them (its cost read from the loom's tree as of each turn)."""
    delegate = {
        "tool_calls": [{"gate": "call_agent", "args": {"intent": "work"}}],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 0},
    }
    script = [delegate, spend("done", 3000, 0), spend("done", 1000, 0)]  # parent, child, parent
    spell = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(script, pricing=cantrip.Pricing(1.0, 2.0)),
        identity=cantrip.Identity(),
        circle=cantrip.Circle(
            [done, echo, call_agent], [cantrip.max_turns(10), cantrip.max_depth(1)]
        ),
        loom=cantrip.Loom(),
        folding=cantrip.FoldingPolicy(context_window=8000),
    )
    client = await started(nursery, spell)
    sid = await client.session()
    answer = await client.call("session/prompt", sessionId=sid, prompt="delegate")
    usage = [u for u in updates(client.notes) if u["sessionUpdate"] == "usage_update"]
    assert [u["cost"]["amount"] for u in usage] == pytest.approx([0.001, 0.005])
    assert answer["result"]["_meta"]["cantrip"]["costUsd"] == pytest.approx(0.005)


class RecordedOnly(ProcessBackend):
    """The in-process backend declaring what PostgreSQL's declares: no token events
    (``capabilities.token_events``), so ACP shows recorded turns only, as over --db."""

    @property
    def capabilities(self) -> Capabilities:
        return attrs.evolve(super().capabilities, token_events=False)


async def test_over_a_backend_of_recorded_turns_a_childs_cost_joins_at_the_next_turn() -> None:
    """Where only recorded turns are told (``acp --db``), each turn's usage carries the
    session's cost as of that turn: its own call's, and a delegation's children's read
    from the loom once the parent's next turn is told; a token event is never counted."""
    delegate = {
        "tool_calls": [{"gate": "call_agent", "args": {"intent": "work"}}],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 0},
    }
    script = [delegate, spend("done", 3000, 0), spend("done", 1000, 0)]  # parent, child, parent
    spell = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(script, pricing=cantrip.Pricing(1.0, 2.0)),
        identity=cantrip.Identity(),
        circle=cantrip.Circle(
            [done, echo, call_agent], [cantrip.max_turns(10), cantrip.max_depth(1)]
        ),
        loom=cantrip.Loom(),
        folding=cantrip.FoldingPolicy(context_window=8000),
    )
    notes: list[dict[str, Any]] = []

    async def notify(message: dict[str, Any]) -> None:
        notes.append(message)

    backend = RecordedOnly.serving(spell)
    async with backend.running():
        server = AcpServer(spell, notify=notify, backend=backend)
        async with server.running():
            new = await server.handle(rpc(1, "session/new", cwd="/tmp"))
            assert new is not None
            sid = new["result"]["sessionId"]
            answer = await server.handle(rpc(2, "session/prompt", sessionId=sid, prompt="go"))
    assert answer is not None and answer["result"]["stopReason"] == "end_turn"
    validate(notes)
    shown = updates(notes)
    usage = [u for u in shown if u["sessionUpdate"] == "usage_update"]
    # the checkpoint's call, then the parent's last call with the child's in between
    assert [u["cost"]["amount"] for u in usage] == pytest.approx([0.001, 0.005])
    assert answer["result"]["_meta"]["cantrip"]["costUsd"] == pytest.approx(0.005)
    assert not any(u["sessionUpdate"] == "user_message_chunk" for u in shown)  # the intent
    assert "ok" in "".join(
        u["content"]["text"] for u in shown if u["sessionUpdate"] == "agent_message_chunk"
    )
