"""An MCP server that asks the user during a call (elicitation) pauses the cast
like ``ask_user``: recorded in the loom, answered by whoever answers the entity's
pauses, and the answer (or a refusal, or the call's end) reaches the server as
MCP's accept / decline / cancel.

The server is a real process written with the official SDK (``mcp_servers/asking.py``),
spoken to at both protocol eras: 2026-07-28 (the call answers ``InputRequiredResult``
and cantrip retries it with the answer) and 2025-11-25 (the server sends
``elicitation/create`` in the middle of the call).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp_support import BIN, PYTHON, SERVERS, call, finish, marks, spell

import cantrip
from cantrip.mcp import MCPServer

ASKING = SERVERS / "asking.py"
ERAS = {"2026-07-28": [], "2025-11-25": ["--legacy"]}


def asking(log: Path, era: str = "2026-07-28", **options: Any) -> MCPServer:
    options.setdefault("name", "asking")
    options.setdefault("elicitation", True)
    return MCPServer(
        command=PYTHON, args=[str(ASKING), *ERAS[era]], env={"ASKING_MARKS": str(log)}, **options
    )


def the_call(outcome: cantrip.CastResult, gate: str = "asking_book") -> Any:
    """The record of the cast's call of ``gate`` (a pause splits its turn into pieces)."""
    (record,) = [r for t in outcome.turns for r in t.gate_calls if r.gate == gate]
    return record


def pending_marks(spell_: cantrip.Cantrip, entity_id: str) -> list[dict[str, Any]]:
    loom = spell_.loom
    last = loom.last_turn(entity_id)
    assert last is not None
    thread = loom.thread(last.id)
    return [t.extras["pending"] for t in thread if isinstance(t.extras.get("pending"), dict)]


def answered_marks(spell_: cantrip.Cantrip, entity_id: str) -> list[dict[str, Any]]:
    loom = spell_.loom
    last = loom.last_turn(entity_id)
    assert last is not None
    return [
        t.extras["answered"]
        for t in loom.thread(last.id)
        if isinstance(t.extras.get("answered"), dict)
    ]


@pytest.mark.parametrize("era", sorted(ERAS))
async def test_a_servers_question_pauses_the_cast_and_the_answer_reaches_it(
    tmp_path: Path, era: str
) -> None:
    log = tmp_path / "marks"
    s = spell([call("asking_book", city="Oslo"), finish()], asking(log, era))
    asked: list[cantrip.Pause] = []

    async def human(pause: cantrip.Pause) -> cantrip.Decision:
        asked.append(pause)
        return cantrip.Decision.answer("3")

    entity = s.summon(on_pause=human)
    async with entity:
        outcome = await entity.send("book")
    assert outcome.terminated
    record = the_call(outcome)
    assert record.result == {"result": "booked 3 seats in Oslo"}
    assert marks(log) == [f"version {era}", "accept 3"]
    (pause,) = asked
    assert (pause.kind, pause.gate, pause.origin) == ("question", "asking_book", "mcp:asking")
    assert pause.question == "How many seats in Oslo?"
    assert pause.schema is not None and pause.schema["properties"]["seats"]["type"] == "integer"
    # the loom holds the question and its answer, like ask_user's
    (pending,) = pending_marks(s, outcome.entity_id)
    assert pending["pause_id"] == pause.pause_id and pending["origin"] == "mcp:asking"
    (answered,) = answered_marks(s, outcome.entity_id)
    assert answered == {"pause_id": pause.pause_id, "decision": "answer", "text": "3"}


@pytest.mark.parametrize("era", sorted(ERAS))
async def test_a_refusal_is_a_decline(tmp_path: Path, era: str) -> None:
    log = tmp_path / "marks"
    s = spell([call("asking_book", city="Oslo"), finish()], asking(log, era))

    async def human(pause: cantrip.Pause) -> cantrip.Decision:
        return cantrip.Decision.deny("not now")

    entity = s.summon(on_pause=human)
    async with entity:
        outcome = await entity.send("book")
    assert the_call(outcome).result == {"result": "no booking in Oslo (decline)"}
    assert marks(log)[-1] == "decline"


async def test_answered_from_elsewhere_and_a_wrong_answer_is_refused(tmp_path: Path) -> None:
    """No handler: the pause waits in place (the call is running) and any front end
    answers it through ``Entity.answer``; an answer that does not fill the form is
    refused with what the form wants, and the pause stays open."""
    log = tmp_path / "marks"
    s = spell([call("asking_book", city="Bergen"), finish()], asking(log))
    entity = s.summon()  # pause="return": but a call that asks cannot return
    results: list[cantrip.CastResult] = []
    async with entity, trio.open_nursery() as nursery:

        async def run() -> None:
            results.append(await entity.send("book"))

        nursery.start_soon(run)
        with trio.fail_after(30):
            while not entity.pending:
                await trio.sleep(0.02)
        (pause,) = entity.pending
        assert pause.origin == "mcp:asking"
        with pytest.raises(cantrip.PauseError, match="seats"):
            await entity.answer(pause.pause_id, {"decision": "answer", "text": "many"})
        with pytest.raises(cantrip.PauseError, match="asks a question"):
            await entity.answer(pause.pause_id, {"decision": "approve"})
        assert entity.pending == (pause,)
        answer = {"decision": "answer", "text": '{"seats": 2}'}
        assert await entity.answer(pause.pause_id, answer) is None
    (outcome,) = results
    assert outcome.terminated
    assert the_call(outcome).result == {"result": "booked 2 seats in Bergen"}
    assert entity.pending == ()


@pytest.mark.parametrize("era", sorted(ERAS))
async def test_cancelling_the_cast_while_the_server_asks(tmp_path: Path, era: str) -> None:
    """The cast is cancelled while the question waits: the turn is recorded as cut
    off, the question is no longer pending, and the server's call is cancelled."""
    log = tmp_path / "marks"
    s = spell([call("asking_book", city="Oslo"), finish()], asking(log, era))
    entity = s.summon(pause="wait")
    results: list[cantrip.CastResult] = []
    async with entity:
        async with trio.open_nursery() as nursery:

            async def run() -> None:
                results.append(await entity.send("book"))

            nursery.start_soon(run)
            with trio.fail_after(30):
                while not entity.pending:
                    await trio.sleep(0.02)
            assert entity.cancel()
        assert entity.pending == ()
    (outcome,) = results
    assert outcome.truncated and outcome.reason == "cancelled"
    last = s.loom.last_turn(outcome.entity_id)
    assert last is not None and last.reason == "cancelled"
    assert "accept 3" not in marks(log)


async def test_without_elicitation_the_server_is_told_it_cannot_ask(tmp_path: Path) -> None:
    log = tmp_path / "marks"
    s = spell([call("asking_book", city="Oslo"), finish()], asking(log, elicitation=False))
    assert not s.circle.needs_humans
    outcome = await s.cast_async("book")
    record = the_call(outcome)
    assert record.is_error
    assert "elicitation" in str(record.result).lower()
    assert marks(log) == []


def test_a_circle_with_an_asking_server_needs_a_human(tmp_path: Path) -> None:
    """``cantrip cast`` without a terminal refuses, as for ask_user; with
    ``--deny-all`` the server's question is declined and the cast goes on."""
    log = tmp_path / "marks"
    spec = tmp_path / "asking.toml"
    script = [call("asking_book", city="Oslo"), finish("no seats")]
    spec.write_text(_spec_toml(script, log))
    refused = subprocess.run(
        [str(BIN / "cantrip"), "cast", str(spec), "book"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )
    assert refused.returncode != 0
    assert "asks a human" in refused.stderr
    assert marks(log) == []
    declined = subprocess.run(
        [str(BIN / "cantrip"), "cast", str(spec), "book", "--deny-all"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )
    assert declined.returncode == 0, declined.stderr
    assert "no seats" in declined.stdout
    assert marks(log) == ["version 2026-07-28", "decline"]


def _spec_toml(script: list[dict[str, Any]], log: Path) -> str:
    def value(v: Any) -> str:
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(v)

    return (
        "\n".join(
            [
                "[llm]",
                'provider = "scripted"',
                f"responses = {value(script)}",
                "[circle]",
                'medium = "conversation"',
                'gates = ["done"]',
                "wards = [{ max_turns = 4 }]",
                "[[circle.mcp]]",
                'name = "asking"',
                f"command = {json.dumps(sys.executable)}",
                f"args = [{json.dumps(str(ASKING))}]",
                f"env = {{ ASKING_MARKS = {json.dumps(str(log))} }}",
                "elicitation = true",
            ]
        )
        + "\n"
    )
