"""The HTTP session API, served by hypercorn's trio worker, driven by httpx."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

import cantrip
from cantrip.protocols.acp._server import AcpServer
from cantrip.protocols.http._serve import serve_http
from cantrip.spec import build_cantrip, parse_spec

pytestmark = pytest.mark.loop_watch  # nothing here may block the trio loop (issue 28)

pytest.importorskip("hypercorn")

CANTRIP = str(Path(sys.executable).with_name("cantrip"))

SCRIPT: list[dict[str, Any]] = [
    {
        "content": "Booking it.",
        "tool_calls": [{"gate": "echo", "args": {"text": "flight LX318 booked"}}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 5},
    },
    {"tool_calls": [{"gate": "done", "args": {"answer": "Your flight is booked."}}]},
    {"content": "It was LX318."},
]


def make_spell(script: list[dict[str, Any]], loom: Path | None = None) -> cantrip.Cantrip:
    doc: dict[str, Any] = {
        # one script for the whole session, in query order (casts take turns through it)
        "llm": {"provider": "scripted", "responses": script, "script": "shared"},
        "circle": {
            "medium": "conversation",
            "gates": ["done", "echo"],
            "wards": [{"max_turns": 4}],
        },
    }
    if loom is not None:
        doc["loom"] = {"path": str(loom)}
    return build_cantrip(parse_spec(doc))


@asynccontextmanager
async def serving(spell: cantrip.Cantrip) -> AsyncIterator[httpx.AsyncClient]:
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(serve_http, spell, "127.0.0.1", 0)
        async with httpx.AsyncClient(base_url=binds[0], timeout=20) as client:
            yield client
        nursery.cancel_scope.cancel()


def sse_events(lines: list[str]) -> list[tuple[str, dict[str, Any]]]:
    events, name = [], "message"
    for line in lines:
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            events.append((name, json.loads(line.removeprefix("data: "))))
    return events


async def test_sessions_keep_their_conversation() -> None:
    spell = make_spell(SCRIPT)
    async with serving(spell) as http:
        health = (await http.get("/health")).json()
        assert health["ok"] and health["gates"] == ["done", "echo"]
        created = await http.post("/sessions")
        assert created.status_code == 201
        sid = created.json()["session_id"]
        first = await http.post(f"/sessions/{sid}/prompt", json={"prompt": "Book a flight"})
        assert first.status_code == 200
        body = first.json()
        assert body["result"] == "Your flight is booked."
        assert body["stop_reason"] == "end_turn" and body["turns"] == 2
        assert body["usage"]["total_tokens"] == 55
        second = await http.post(
            f"/sessions/{sid}/prompt",
            json={"prompt": [{"type": "text", "text": "Which flight was it?"}]},
        )
        assert second.json()["result"] == "It was LX318."
        thread = (await http.get(f"/sessions/{sid}/thread")).json()
        assert [t["intent"] for t in thread["turns"] if t["intent"]] == [
            "Book a flight",
            "Which flight was it?",
        ]
        listed = (await http.get("/sessions")).json()["sessions"]
        assert [s["session_id"] for s in listed] == [sid]
    # the follow-up was queried with the first exchange in view (PROD-7)
    llm = spell.llm
    assert isinstance(llm, cantrip.ScriptedLLM)
    last_query = " ".join(m.text() for m in llm.invocations[-1].messages)
    assert "flight LX318 booked" in last_query and "Book a flight" in last_query


async def test_a_prompt_streams_its_events_as_server_sent_events() -> None:
    async with serving(make_spell(SCRIPT)) as http:
        sid = (await http.post("/sessions")).json()["session_id"]
        async with http.stream(
            "POST",
            f"/sessions/{sid}/prompt",
            json={"intent": "Book a flight"},
            headers={"accept": "text/event-stream"},
        ) as response:
            assert response.headers["content-type"] == "text/event-stream"
            prompt_id = response.headers["prompt-id"]
            lines = [line async for line in response.aiter_lines()]
    events = sse_events(lines)
    names = [name for name, _ in events]
    # the prompt's id comes first (a cancel can name it), then the cast's events
    assert events[0] == (
        "prompt",
        {"type": "prompt", "prompt_id": prompt_id, "session_id": sid, "idempotency_key": None},
    )
    assert names[1] == "step_start" and names[-1] == "result"
    assert events[-1][1]["prompt_id"] == prompt_id
    text = "".join(data["text"] for name, data in events if name == "text_delta")
    assert text == "Booking it."
    results = [data["record"] for name, data in events if name == "tool_result"]
    assert [(r["gate"], r["result"]) for r in results] == [
        ("echo", "flight LX318 booked"),
        ("done", "Your flight is booked."),
    ]
    assert events[-1][1]["result"] == "Your flight is booked."
    assert names.index("tool_result") < names.index("final_response") < names.index("result")


async def test_an_events_subscription_sees_prompts_made_elsewhere() -> None:
    async with serving(make_spell(SCRIPT)) as http:
        sid = (await http.post("/sessions")).json()["session_id"]
        seen: list[tuple[str, dict[str, Any]]] = []
        subscribed = trio.Event()

        async def listen() -> None:
            async with http.stream("GET", f"/sessions/{sid}/events") as response:
                lines: list[str] = []
                async for line in response.aiter_lines():
                    if line.startswith(": subscribed"):
                        subscribed.set()
                    lines.append(line)
                    if line.startswith("data: ") and '"final_response"' in line:
                        break
                seen.extend(sse_events(lines))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(listen)
            await subscribed.wait()
            answer = await http.post(f"/sessions/{sid}/prompt", json={"prompt": "Book it"})
            assert answer.json()["terminated"] is True
    names = [name for name, _ in seen]
    assert "tool_call" in names and names[-1] == "final_response"


async def test_cancel_cuts_off_the_running_prompt_and_the_session_goes_on() -> None:
    script: list[dict[str, Any]] = [
        {"content": "thinking...", "delay_ms": 30_000},
        {"tool_calls": [{"gate": "done", "args": {"answer": "after the cancel"}}]},
    ]
    spell = make_spell(script)
    async with serving(spell) as http:
        sid = (await http.post("/sessions")).json()["session_id"]
        answers: list[httpx.Response] = []

        async def slow() -> None:
            answers.append(await http.post(f"/sessions/{sid}/prompt", json={"prompt": "slow"}))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(slow)
            with trio.fail_after(30):
                while not (await http.get(f"/sessions/{sid}")).json()["running"]:
                    await trio.sleep(0.01)
            busy = await http.post(f"/sessions/{sid}/prompt", json={"prompt": "too"})
            assert busy.status_code == 409 and busy.json()["error"]["code"] == "busy"
            cancelled = await http.post(f"/sessions/{sid}/cancel")
            assert cancelled.json() == {
                "cancelled": True,
                "target": "running",
                "prompt_id": cancelled.json()["prompt_id"],
                "intent": "slow",
                "idempotency_key": None,
            }
        body = answers[0].json()
        assert body["prompt_id"] == cancelled.json()["prompt_id"]
        assert answers[0].headers["prompt-id"] == body["prompt_id"]
        assert (body["stop_reason"], body["reason"], body["truncated"]) == (
            "cancelled",
            "cancelled",
            True,
        )
        again = await http.post(f"/sessions/{sid}/prompt", json={"prompt": "go on"})
        assert again.json()["result"] == "after the cancel"
        idle = await http.post(f"/sessions/{sid}/cancel")
        assert idle.json() == {"cancelled": False, "target": "none"}  # nothing runs
    reasons = [t.reason for t in spell.loom.turns]
    assert reasons == ["cancelled", "done"]


async def test_mistakes_are_json_errors_and_the_server_keeps_serving() -> None:
    async with serving(make_spell(SCRIPT)) as http:
        sid = (await http.post("/sessions")).json()["session_id"]
        cases: list[tuple[Callable[[], Any], int, str]] = [
            (lambda: http.get("/nowhere"), 404, "not_found"),
            (lambda: http.get("/sessions/session-nope/thread"), 404, "unknown_session"),
            (lambda: http.delete("/sessions"), 405, "method_not_allowed"),
            (lambda: http.get(f"/sessions/{sid}/prompt"), 405, "method_not_allowed"),
            (
                lambda: http.post(
                    f"/sessions/{sid}/prompt",
                    content=b"{not json",
                    headers={"content-type": "application/json"},
                ),
                400,
                "bad_json",
            ),
            (
                lambda: http.post(f"/sessions/{sid}/prompt", content=b'{"prompt": "hi"}'),
                400,
                "bad_content_type",
            ),
            (
                lambda: http.post(f"/sessions/{sid}/prompt", json={"prompt": "  "}),
                400,
                "bad_request",
            ),
            (lambda: http.post(f"/sessions/{sid}/prompt", json=[1, 2]), 400, "bad_request"),
            # a blank yes/no or policy is not "no" (schemathesis' ST201: it was taken)
            (
                lambda: http.post(f"/sessions/{sid}/prompt?stream=", json={"prompt": "hi"}),
                400,
                "bad_request",
            ),
            (
                lambda: http.post(f"/sessions/{sid}/prompt?on_busy=", json={"prompt": "hi"}),
                400,
                "bad_request",
            ),
        ]
        for request, status, code in cases:
            response = await request()
            assert response.status_code == status, response.text
            assert response.json()["error"]["code"] == code
        ok = await http.post(f"/sessions/{sid}/prompt", json={"prompt": "Book a flight"})
        assert ok.json()["result"] == "Your flight is booked."


async def test_a_session_resumes_from_the_loom_file_after_a_restart(tmp_path: Path) -> None:
    loom = tmp_path / "http-loom.db"
    first = make_spell(SCRIPT[:2], loom)
    async with serving(first) as http:
        assert (await http.get("/health")).json()["persistent"] is True
        sid = (await http.post("/sessions")).json()["session_id"]
        await http.post(f"/sessions/{sid}/prompt", json={"prompt": "Book a flight"})
    first.loom.close()

    second = make_spell(SCRIPT[2:], loom)  # a new process: same loom file
    async with serving(second) as http:
        thread = (await http.get(f"/sessions/{sid}/thread")).json()
        assert len(thread["turns"]) == 2
        answer = await http.post(f"/sessions/{sid}/prompt", json={"prompt": "Which flight?"})
        assert answer.json()["result"] == "It was LX318."
    llm = second.llm
    assert isinstance(llm, cantrip.ScriptedLLM)
    assert "flight LX318 booked" in " ".join(m.text() for m in llm.invocations[0].messages)
    second.loom.close()


def turn_shapes(turns: Any) -> list[tuple[Any, ...]]:
    return [
        (t.intent, t.utterance, t.observation, t.reason, [r.result for r in t.gate_calls])
        for t in turns
    ]


async def test_library_acp_http_and_cli_produce_the_same_turns() -> None:
    """PROD-1: the adapter never changes what the entity does."""
    library = make_spell(SCRIPT)
    outcome = await library.cast_async("Book a flight")

    over_acp = make_spell(SCRIPT)
    server = AcpServer(over_acp)
    async with server.running():
        await server.handle({"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {}})
        await server.handle(
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "session/prompt",
                "params": {"prompt": "Book a flight"},
            }
        )

    over_http = make_spell(SCRIPT)
    async with serving(over_http) as http:
        sid = (await http.post("/sessions")).json()["session_id"]
        await http.post(f"/sessions/{sid}/prompt", json={"prompt": "Book a flight"})

    expected = turn_shapes(outcome.turns)
    assert turn_shapes(over_acp.loom.turns) == expected
    assert turn_shapes(over_http.loom.turns) == expected

    # ... and the command line, from a spec file with the same script.
    folder = Path(tempfile.mkdtemp())
    (folder / "same.toml").write_text(SAME_SCRIPT_TOML)
    done = await trio.run_process(
        [CANTRIP, "cast", "same.toml", "Book a flight", "--loom", "cli.jsonl"],
        cwd=folder,
        capture_stdout=True,
    )
    assert done.stdout.decode().strip() == "Your flight is booked."
    over_cli = cantrip.Loom.open(folder / "cli.jsonl")
    assert turn_shapes(over_cli.turns) == expected
    over_cli.close()


SAME_SCRIPT_TOML = """
[llm]
provider = "scripted"
responses = [
  { content = "Booking it.", tool_calls = [{ gate = "echo", args = { text = "flight LX318 booked" } }], usage = { prompt_tokens = 50, completion_tokens = 5 } },
  { tool_calls = [{ gate = "done", args = { answer = "Your flight is booked." } }] },
]
[circle]
medium = "conversation"
gates = ["done", "echo"]
wards = [{ max_turns = 4 }]
"""  # noqa: E501


def test_cantrip_serve_runs_until_interrupted(tmp_path: Path) -> None:
    spec = tmp_path / "serve.toml"
    spec.write_text(
        "[llm]\nprovider = 'scripted'\n"
        "responses = [{ tool_calls = [{ gate = 'done', args = { answer = 'served' } }] }]\n"
        "[circle]\nmedium = 'conversation'\ngates = ['done']\nwards = [{ max_turns = 2 }]\n"
    )
    process = subprocess.Popen(
        [CANTRIP, "serve", str(spec), "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        assert "serving" in line, line
        base = line.strip().rsplit(" ", 1)[-1]
        with httpx.Client(base_url=base, timeout=10) as http:
            sid = http.post("/sessions").json()["session_id"]
            answer = http.post(f"/sessions/{sid}/prompt", json={"prompt": "serve me"}).json()
            assert answer["result"] == "served"
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


async def refuses_ids_that_are_not_text(http: httpx.AsyncClient) -> None:
    """A cancel naming a prompt by an id or key no UTF-8 can carry is a 400 at parsing,
    like every id a client sends (issue 39.10; both servers)."""
    sid = (await http.post("/sessions")).json()["session_id"]
    for field in ("prompt_id", "idempotency_key"):
        raw = json.dumps({field: "p\ud800"})  # the lone surrogate travels as an escape
        answer = await http.post(
            f"/sessions/{sid}/cancel", content=raw, headers={"content-type": "application/json"}
        )
        assert answer.status_code == 400, (field, answer.status_code, answer.text)
        assert "surrogate" in answer.json()["error"]["message"], answer.text


async def test_a_cancel_naming_an_id_that_is_not_text_is_a_400() -> None:
    async with serving(make_spell([])) as http:
        await refuses_ids_that_are_not_text(http)
