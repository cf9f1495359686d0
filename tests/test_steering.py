"""Steering a running entity: a message joins the next turn and is recorded there."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio
import trio.testing

import cantrip
from cantrip import Cantrip, Circle, Identity, Loom, ScriptedLLM, max_turns
from cantrip._chat_export import export_chat
from cantrip.protocols.http._serve import serve_http
from cantrip.protocols.middleware._lifecycle import ServeOptions
from gates import done, echo


def holding_gate(started: trio.Event, release: trio.Event) -> cantrip.Gate:
    @cantrip.gate(name="work")
    async def work(task: str) -> str:
        started.set()
        await release.wait()
        return f"did {task}"

    return work


def spell(loom: Loom, gate: cantrip.Gate, script: list[dict[str, object]]) -> Cantrip:
    return Cantrip(
        llm=ScriptedLLM(script),
        identity=Identity(system_prompt="Worker."),
        circle=Circle([done, echo, gate], [max_turns(6)]),
        loom=loom,
    )


SCRIPT: list[dict[str, object]] = [
    {"tool_calls": [{"gate": "work", "args": {"task": "a"}}]},
    {"tool_calls": [{"gate": "done", "args": {"answer": "finished"}}]},
]


async def test_a_message_joins_the_next_turn_and_is_recorded_there() -> None:
    started, release = trio.Event(), trio.Event()
    loom = Loom()
    s = spell(loom, holding_gate(started, release), SCRIPT)
    llm = s.llm
    entity = s.summon()
    async with entity, trio.open_nursery() as nursery:
        results: list[cantrip.CastResult] = []

        async def run() -> None:
            results.append(await entity.send("Do the work."))

        nursery.start_soon(run)
        await started.wait()
        assert entity.steer("Also mention the weather.")
        release.set()
    result = results[0]
    assert result.terminated and result.undelivered == ()
    second = llm.invocations[1].messages  # type: ignore[attr-defined]
    assert second[-1].role == "user" and second[-1].content == "Also mention the weather."
    turns = loom.entity_turns(entity.id)
    assert "steering" not in turns[0].extras
    assert turns[1].extras["steering"] == ["Also mention the weather."]
    # a context rebuilt from the loom shows it in the same place (resume, exports)
    resumed = s.resume(entity.id)
    rebuilt = list(resumed._context.snapshot())
    live = list(second) + [m for m in rebuilt[len(second) :]]
    assert [m.content for m in rebuilt[: len(second)]] == [m.content for m in live[: len(second)]]
    chat = export_chat(loom)
    assert "Also mention the weather." in str(chat)


async def test_steering_with_no_cast_running_is_refused_and_late_messages_are_reported() -> None:
    started, release = trio.Event(), trio.Event()
    script: list[dict[str, object]] = [
        {
            "tool_calls": [
                {"gate": "work", "args": {"task": "a"}},
                {"gate": "done", "args": {"answer": "x"}},
            ]
        },
    ]
    s = spell(Loom(), holding_gate(started, release), script)
    entity = s.summon()
    assert entity.steer("anyone there?") is False
    with pytest.raises(cantrip.IntentError, match="needs some text"):
        entity.steer("   ")
    async with entity, trio.open_nursery() as nursery:
        results: list[cantrip.CastResult] = []

        async def run() -> None:
            results.append(await entity.send("Do it and finish."))

        nursery.start_soon(run)
        await started.wait()
        assert entity.steer("too late")
        release.set()
    assert results[0].undelivered == ("too late",)
    assert entity.steer("after") is False


async def test_rewind_continues_from_an_earlier_turn_and_keeps_the_branch() -> None:
    loom = Loom()
    s = Cantrip(
        llm=ScriptedLLM(
            [
                {"tool_calls": [{"gate": "done", "args": {"answer": "one"}}]},
                {"tool_calls": [{"gate": "done", "args": {"answer": "two"}}]},
                {"tool_calls": [{"gate": "done", "args": {"answer": "three"}}]},
            ]
        ),
        identity=Identity(system_prompt="x"),
        circle=Circle([done], [max_turns(3)]),
        loom=loom,
    )
    entity = s.summon()
    async with entity:
        await entity.send("first")
        keep = entity.leaf
        await entity.send("second (rolled back)")
        await entity.rewind(keep)
        await entity.send("third")
    thread = loom.thread(entity.leaf)  # type: ignore[arg-type]
    assert [t.intent for t in thread if t.intent] == ["first", "third"]
    assert len(loom.entity_turns(entity.id)) == 3  # the branch stays in the loom
    messages = s.llm.invocations[2].messages  # type: ignore[attr-defined]
    assert "second (rolled back)" not in [m.content for m in messages]


# -- over HTTP: /messages and double-texting -------------------------------------------


@asynccontextmanager
async def served(
    script: list[dict[str, object]], on_busy: str = "reject"
) -> AsyncIterator[tuple[httpx.AsyncClient, trio.Event, trio.Event, Any]]:
    started, release = trio.Event(), trio.Event()
    s = spell(Loom(), holding_gate(started, release), script)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve_http(
                s, "127.0.0.1", 0, options=ServeOptions(on_busy=on_busy), task_status=task_status
            )
        )
        async with httpx.AsyncClient(base_url=binds[0], timeout=30) as client:
            yield client, started, release, s.llm
        nursery.cancel_scope.cancel()


async def prompt_in_background(
    nursery: trio.Nursery, http: httpx.AsyncClient, sid: str, text: str, query: str = ""
) -> list[httpx.Response]:
    out: list[httpx.Response] = []

    async def run() -> None:
        out.append(await http.post(f"/sessions/{sid}/prompt{query}", json={"prompt": text}))

    nursery.start_soon(run)
    return out


async def test_http_messages_join_the_running_prompt() -> None:
    async with served(SCRIPT) as (http, started, release, llm):
        sid = (await http.post("/sessions")).json()["session_id"]
        idle = await http.post(f"/sessions/{sid}/messages", json={"text": "hello?"})
        assert idle.status_code == 409 and idle.json()["error"]["code"] == "not_running"
        async with trio.open_nursery() as nursery:
            first = await prompt_in_background(nursery, http, sid, "Do the work.")
            await started.wait()
            sent = await http.post(f"/sessions/{sid}/messages", json={"text": "Use metric."})
            assert sent.status_code == 202 and sent.json() == {
                "accepted": True,
                "joins": "next_turn",
            }
            release.set()
        assert first[0].status_code == 200 and first[0].json()["terminated"]
        turns = (await http.get(f"/sessions/{sid}/thread")).json()["turns"]
        assert turns[1]["extras"]["steering"] == ["Use metric."]
        assert llm.invocations[1].messages[-1].content == "Use metric."
        bad = await http.post(f"/sessions/{sid}/messages", json={"text": "  "})
        assert bad.status_code == 400


TWO_CASTS: list[dict[str, object]] = [
    {"tool_calls": [{"gate": "work", "args": {"task": "a"}}]},
    {"tool_calls": [{"gate": "done", "args": {"answer": "second"}}]},
    {"tool_calls": [{"gate": "done", "args": {"answer": "third"}}]},
]


@pytest.mark.parametrize("policy", ["enqueue", "interrupt", "rollback"])
async def test_double_texting_policies(policy: str) -> None:
    async with served(TWO_CASTS) as (http, started, release, llm):
        sid = (await http.post("/sessions")).json()["session_id"]
        async with trio.open_nursery() as nursery:
            first = await prompt_in_background(nursery, http, sid, "First task.")
            await started.wait()
            refused = await http.post(f"/sessions/{sid}/prompt", json={"prompt": "No."})
            assert refused.status_code == 409  # the server's default: reject
            second = await prompt_in_background(
                nursery, http, sid, "Second task.", f"?on_busy={policy}"
            )
            # the second prompt has done all it can while the first is held (all in this
            # trio run: no thread works meanwhile)
            await trio.testing.wait_all_tasks_blocked(0.01)
            if policy == "enqueue":
                assert not first and not second  # queued behind the first
            else:
                assert first  # it cut the first one off before that could end
            release.set()
        a, b = first[0].json(), second[0].json()
        assert second[0].status_code == 200 and b["terminated"]
        asked = [m.content for m in llm.invocations[-1].messages]
        thread = (await http.get(f"/sessions/{sid}/thread")).json()["turns"]
        intents = [t["intent"] for t in thread if t["intent"]]
        if policy == "enqueue":
            assert a["terminated"] and a["result"] == "second" and b["result"] == "third"
            assert intents == ["First task.", "Second task."]
        else:
            assert a["truncated"] and a["reason"] == "interrupted"
            if policy == "interrupt":
                assert "First task." in asked and intents == ["First task.", "Second task."]
            else:  # rollback: the first cast left the thread, not the loom
                assert "First task." not in asked and intents == ["Second task."]


async def test_a_bad_policy_is_a_clear_400() -> None:
    async with served(TWO_CASTS) as (http, _started, _release, _llm):
        sid = (await http.post("/sessions")).json()["session_id"]
        out = await http.post(f"/sessions/{sid}/prompt?on_busy=maybe", json={"prompt": "x"})
        assert out.status_code == 400
        assert "on_busy must be one of reject, enqueue, interrupt, rollback" in out.text


# -- invoke: a line typed while a cast runs --------------------------------------------


def test_invoke_sends_a_line_typed_during_a_cast_to_it(tmp_path: Any) -> None:
    from test_cli import Terminal

    loom_path = tmp_path / "invoke.db"
    spec = tmp_path / "spec.toml"
    spec.write_text(
        '[llm]\nprovider = "scripted"\nlatency_ms = 1500\nresponses = [\n'
        '  { tool_calls = [{ gate = "echo", args = { text = "one" } }] },\n'
        '  { tool_calls = [{ gate = "echo", args = { text = "two" } }] },\n'
        '  { tool_calls = [{ gate = "done", args = { answer = "finished" } }] },\n]\n'
        '[circle]\nmedium = "conversation"\ngates = ["done", "echo"]\n'
        "wards = [{ max_turns = 5 }]\n"
        f'[loom]\npath = "{loom_path.name}"\n',
        encoding="utf-8",
    )
    terminal = Terminal("invoke", str(spec), cwd=tmp_path)
    try:
        terminal.expect("cantrip> ")
        terminal.type("Do the thing.\r")
        terminal.expect("turn 1")  # the cast is running (its progress line)
        terminal.type("Use metric units.\r")
        terminal.expect("joins the next turn")
        terminal.expect(r"finished.*cantrip> ", timeout=60)
        terminal.type("\x04")
        assert terminal.wait() == 0
    finally:
        terminal.close()
    loom = Loom.open(loom_path)
    steered = [t.extras.get("steering") for t in loom.turns if t.extras.get("steering")]
    intents = [t.intent for t in loom.turns if t.intent]
    loom.close()
    assert steered == [["Use metric units."]]
    assert intents == ["Do the thing."]  # it joined the cast; no second cast was made


# -- ACP: _meta.cantrip.onBusy ---------------------------------------------------------


@pytest.mark.parametrize("policy", ["steer", "enqueue", "interrupt", "rollback", "reject"])
async def test_acp_prompts_while_one_runs_follow_on_busy(policy: str) -> None:
    from cantrip.protocols.acp._server import AcpServer

    started, release = trio.Event(), trio.Event()
    s = spell(Loom(), holding_gate(started, release), TWO_CASTS)
    server = AcpServer(s, notify=lambda message: trio.lowlevel.checkpoint())
    async with server.running():

        def prompt(msg_id: int, text: str, **meta: Any) -> dict[str, Any]:
            params: dict[str, Any] = {"sessionId": sid, "prompt": [{"type": "text", "text": text}]}
            if meta:
                params["_meta"] = {"cantrip": meta}
            return {"jsonrpc": "2.0", "id": msg_id, "method": "session/prompt", "params": params}

        await server.handle(
            {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}
        )
        created = await server.handle(
            {
                "jsonrpc": "2.0",
                "id": 9,
                "method": "session/new",
                "params": {"cwd": "/", "mcpServers": []},
            }
        )
        assert created is not None
        sid = created["result"]["sessionId"]
        answers: dict[int, dict[str, Any]] = {}

        async def send(msg_id: int, message: dict[str, Any]) -> None:
            reply = await server.handle(message)
            assert reply is not None
            answers[msg_id] = reply

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, 1, prompt(1, "First task."))
            await started.wait()
            nursery.start_soon(send, 2, prompt(2, "Second task.", onBusy=policy))
            await trio.testing.wait_all_tasks_blocked(0.01)  # it did all it can while one runs
            if policy in ("reject", "steer"):
                assert sorted(answers) == [2]  # answered at once, the first still running
            elif policy == "enqueue":
                assert not answers  # queued behind the first
            else:
                assert 1 in answers  # it cut the first one off before that could end
            release.set()
        first, second = answers[1], answers[2]
        entity = s.loom.entities
        turns = [t for e in entity for t in s.loom.entity_turns(e)]
        if policy == "reject":
            assert "running a prompt" in second["error"]["message"]  # the backend's busy
        elif policy == "steer":
            assert second["result"]["_meta"]["cantrip"]["steered"] is True
            assert [t.extras.get("steering") for t in turns if t.extras.get("steering")] == [
                ["Second task."]
            ]
        elif policy == "enqueue":
            assert first["result"]["stopReason"] == "end_turn"
            assert second["result"]["_meta"]["cantrip"]["result"] == "third"
        else:
            assert first["result"]["_meta"]["cantrip"]["reason"] == "interrupted"
            asked = [m.content for m in s.llm.invocations[-1].messages]  # type: ignore[attr-defined]
            assert ("First task." in asked) is (policy == "interrupt")


# -- issue 39.13: what one cast takes is bounded ------------------------------------------


BIG = "x" * 100_000
"""A 100 KB message (the issue's were 400 of these, all taken into one request)."""


async def overfill_steering(clients: list[httpx.AsyncClient], sid: str) -> list[str]:
    """Steer one running cast past both bounds (both servers): 100 KB messages until the
    bytes run out, then small ones sent at once from every client until the count does.
    Each refusal is a 429 with ``Retry-After``; what was accepted is returned."""
    from cantrip.protocols.sessions._steering import MAX_BYTES, MAX_MESSAGES

    path = f"/sessions/{sid}/messages"
    accepted: list[str] = []

    def refused(answer: httpx.Response, why: str) -> None:
        assert answer.status_code == 429, answer.text
        assert int(answer.headers["retry-after"]) >= 1
        error = answer.json()["error"]
        assert error["code"] == "steering_full" and why in error["message"], error

    fits = MAX_BYTES // (len(BIG) + 2)
    for i in range(fits + 2):
        text = f"{i} {BIG}"
        answer = await clients[0].post(path, json={"text": text})
        if i < fits:
            assert answer.status_code == 202, answer.text
            accepted.append(text)
        else:
            refused(answer, "bytes")
    answers: dict[str, httpx.Response] = {}

    async def send(client: httpx.AsyncClient, text: str) -> None:
        answers[text] = await client.post(path, json={"text": text})

    async with trio.open_nursery() as nursery:  # more than fit, from every client at once
        for n in range(MAX_MESSAGES + 8):
            nursery.start_soon(send, clients[n % len(clients)], f"small {n}")
    taken = [text for text, answer in answers.items() if answer.status_code == 202]
    assert len(taken) == MAX_MESSAGES - fits, {a.status_code for a in answers.values()}
    for text, answer in answers.items():
        if text not in taken:
            refused(answer, f"({MAX_MESSAGES})")
    return accepted + taken


async def test_one_cast_takes_a_bounded_number_and_size_of_messages() -> None:
    async with served(SCRIPT) as (http, started, release, llm):
        sid = (await http.post("/sessions")).json()["session_id"]
        async with trio.open_nursery() as nursery:
            first = await prompt_in_background(nursery, http, sid, "Do the work.")
            await started.wait()
            accepted = await overfill_steering([http], sid)
            release.set()
        assert first[0].status_code == 200 and first[0].json()["terminated"]
    joined = [m.content for m in llm.invocations[1].messages if m.role == "user"]
    assert joined[0] == "Do the work."
    assert sorted(joined[1:]) == sorted(accepted), "exactly what was accepted joined the turn"
