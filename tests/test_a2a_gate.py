"""A circle delegates to a remote A2A agent (``[[circle.a2a]]``), issue 33.2.

The remote agent is built with the official a2a-sdk's server (its request handler,
task store and Starlette routes under uvicorn) and runs as a real process on
loopback (tests/a2a_servers/remote_agent.py); it logs what it was asked and what
was cancelled, so the tests see the protocol's effects from the other side."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

import cantrip
from cantrip._errors import ConstructionError
from cantrip.spec import build_cantrip, parse_spec

pytest.importorskip("a2a.client", reason="the a2a extra is part of dev")

pytestmark = pytest.mark.loop_watch  # nothing here may block the trio loop (issue 28)

AGENT = Path(__file__).parent / "a2a_servers" / "remote_agent.py"
TOKEN = "tok-remote-4242"


@asynccontextmanager
async def remote_agent(tmp_path: Path, **env: str) -> AsyncIterator[tuple[str, Path]]:
    """The SDK-built agent as a process on loopback; its URL and its log."""
    log = tmp_path / "remote.log"
    log.touch()
    proc = await trio.lowlevel.open_process(
        [sys.executable, str(AGENT)],
        stdout=subprocess.PIPE,
        env={**os.environ, "A2A_LOG": str(log), "A2A_TOKEN": TOKEN, **env},
    )
    assert proc.stdout is not None
    try:
        with trio.fail_after(30):
            seen = b""
            while b"\n" not in seen:
                chunk = await proc.stdout.receive_some()
                assert chunk, "the remote agent exited before it served"
                seen += chunk
            url = f"http://127.0.0.1:{int(seen.split()[0])}"
            async with httpx.AsyncClient() as http:
                while True:
                    try:
                        await http.get(url + "/.well-known/agent-card.json")
                        break
                    except httpx.TransportError:
                        await trio.sleep(0.05)
        yield url, log
    finally:
        proc.terminate()
        with trio.move_on_after(10):
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def marks(log: Path) -> list[str]:
    return log.read_text().splitlines()


async def wait_for(log: Path, prefix: str) -> str:
    with trio.fail_after(20):
        while True:
            for line in marks(log):
                if line.startswith(prefix):
                    return line
            await trio.sleep(0.05)


def call(gate: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"gate": gate, "args": args}]}


def spell(url: str, script: list[dict[str, Any]], **table: Any) -> cantrip.Cantrip:
    agent = {"name": "travel", "url": url, "headers": {"Authorization": f"Bearer {TOKEN}"}}
    doc: dict[str, Any] = {
        "llm": {"provider": "scripted", "responses": script},
        "circle": {
            "medium": "conversation",
            "gates": ["done"],
            "wards": [{"max_turns": 6}],
            "a2a": [{**agent, **table}],
        },
    }
    return build_cantrip(parse_spec(doc))


def records(outcome: cantrip.CastResult, gate: str = "travel") -> list[Any]:
    return [r for t in outcome.turns for r in t.gate_calls if r.gate == gate]


async def test_a_circle_delegates_and_the_loom_records_the_remote_task(tmp_path: Path) -> None:
    async with remote_agent(tmp_path) as (url, log):
        s = spell(url, [call("travel", message="hello"), call("done", answer="sent")])
        outcome = await s.cast_async("say hello to the travel agent")
        assert outcome.result == "sent"
        (record,) = records(outcome)
        assert record.result == "echo: hello" and not record.is_error
        assert record.detail["via"] == "a2a:travel" and record.detail["state"] == "completed"
        asked = await wait_for(log, "asked")
        assert asked.split()[1:3] == [record.detail["task_id"], record.detail["context_id"]]
        # The record is in the loom like a child's call; the credential is nowhere in it.
        stored = s.loom.get(outcome.turns[0].id)
        assert dict(stored.gate_calls[0].detail) == dict(record.detail)
        assert TOKEN not in json.dumps([t.to_dict() for t in outcome.turns], default=str)
        tools = [g for g in s.circle.gates if g.name == "travel"]
        assert tools == [], "the gate comes from the provider, per entity"


async def test_the_card_describes_the_gate(tmp_path: Path) -> None:
    async with remote_agent(tmp_path) as (url, _):
        s = spell(url, [call("done", answer="ok")])
        async with s.summon() as entity:
            await entity.send("look")
            gate = next(g for g in entity.circle.gates if g.name == "travel")
        assert "Books trips for other agents." in gate.description
        assert "book: Book a trip" in gate.description
        assert gate.parameters["required"] == ["message"]


async def test_calls_continue_one_remote_conversation_and_answer_its_questions(
    tmp_path: Path,
) -> None:
    script = [
        call("travel", message="ask"),
        call("travel", message="Paris"),
        call("travel", message="thanks"),
        call("done", answer="booked"),
    ]
    async with remote_agent(tmp_path) as (url, log):
        outcome = await spell(url, script).cast_async("book a trip")
        asked, answered, thanked = records(outcome)
        assert "which city?" in asked.result and asked.detail["state"] == "input-required"
        assert answered.result == "booked for Paris" and answered.detail["state"] == "completed"
        assert answered.detail["task_id"] == asked.detail["task_id"], "the answer went to it"
        assert thanked.detail["task_id"] != asked.detail["task_id"]
        contexts = {r.detail["context_id"] for r in (asked, answered, thanked)}
        assert len(contexts) == 1, "one remote conversation for the entity"
        assert len([m for m in marks(log) if m.startswith("asked")]) == 3


async def test_a_failed_remote_task_is_an_error_record_and_the_loop_goes_on(
    tmp_path: Path,
) -> None:
    script = [call("travel", message="fail"), call("done", answer="gave up")]
    async with remote_agent(tmp_path) as (url, _):
        outcome = await spell(url, script).cast_async("try")
        (record,) = records(outcome)
        assert record.is_error and record.result == "the remote task ended failed: no seats left"
        assert outcome.result == "gave up"


async def test_cancelling_the_cast_cancels_the_remote_task(tmp_path: Path) -> None:
    script = [call("travel", message="slow"), call("done", answer="never")]
    async with remote_agent(tmp_path) as (url, log):
        s = spell(url, script)
        async with s.summon() as entity:
            outcome: list[cantrip.CastResult] = []

            async def run() -> None:
                outcome.append(await entity.send("wait"))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(run)
                asked = await wait_for(log, "asked")
                assert entity.cancel()
            cut = outcome[0]
            assert cut.truncated and cut.reason == "cancelled"
            (record,) = records(cut)
            assert record.status == "cancelled"
            task_id = asked.split()[1]
            assert await wait_for(log, "cancel") == f"cancel {task_id}"


@pytest.mark.parametrize("streaming", ["1", "0"])
async def test_a_timeout_cancels_the_remote_task(tmp_path: Path, streaming: str) -> None:
    script = [call("travel", message="slow"), call("done", answer="late")]
    async with remote_agent(tmp_path, A2A_STREAMING=streaming) as (url, log):
        outcome = await spell(url, script, timeout_s=1).cast_async("wait")
        (record,) = records(outcome)
        assert record.is_error and "did not finish within 1s" in record.result
        task_id = record.detail["task_id"]
        assert task_id and await wait_for(log, "cancel") == f"cancel {task_id}"
        assert outcome.result == "late"


async def test_a_non_streaming_agent_is_polled(tmp_path: Path) -> None:
    script = [call("travel", message="hi"), call("done", answer="ok")]
    async with remote_agent(tmp_path, A2A_STREAMING="0") as (url, _):
        outcome = await spell(url, script).cast_async("hi")
        (record,) = records(outcome)
        assert record.result == "echo: hi" and record.detail["state"] == "completed"


async def test_an_agent_that_cannot_be_reached_fails_before_the_first_turn(
    tmp_path: Path,
) -> None:
    async with remote_agent(tmp_path) as (url, log):
        wrong = spell(
            url, [call("done", answer="x")], headers={"Authorization": "Bearer nope-nope"}
        )
        with pytest.raises(cantrip.ProviderStartError, match="travel") as refused:
            await wrong.cast_async("hi")
        assert "401" in str(refused.value) and "nope-nope" not in str(refused.value)
        assert marks(log) == [], "nothing was asked"
    gone = spell(url, [call("done", answer="x")], startup_timeout_s=5)
    with pytest.raises(cantrip.ProviderStartError, match="did not start"):
        await gone.cast_async("hi")


def test_bad_tables_are_reported_together() -> None:
    doc: dict[str, Any] = {
        "llm": {"provider": "scripted", "responses": []},
        "circle": {
            "gates": ["done"],
            "a2a": [
                {"name": "1bad", "url": "ftp://x"},
                {"name": "ok", "url": "http://127.0.0.1:1", "timeout_s": 0},
                {"name": "ok", "url": "http://127.0.0.1:1", "extra": 1},
            ],
        },
    }
    with pytest.raises(ConstructionError) as caught:
        build_cantrip(parse_spec(doc))
    text = str(caught.value)
    assert "'1bad' must start with a letter" in text
    assert "url must be http:// or https://" in text
    assert "timeout_s and startup_timeout_s must be positive" in text
    assert "circle.a2a[2].extra" in text
