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


def test_the_terminal_shows_the_servers_form_and_refuses_a_wrong_answer(tmp_path: Path) -> None:
    """``cantrip cast`` on a terminal asks the person: who asks, during which call,
    the form's fields; an answer that does not fill the form is explained and asked again."""
    import os

    import pexpect

    log = tmp_path / "marks"
    spec = tmp_path / "asking.toml"
    spec.write_text(_spec_toml([call("asking_book", city="Oslo"), finish("booked")], log))
    child = pexpect.spawn(
        str(BIN / "cantrip"),
        ["cast", str(spec), "book"],
        cwd=str(tmp_path),
        env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "160"},
        encoding="utf-8",
        timeout=60,
        dimensions=(40, 160),
    )
    child.expect_exact("mcp:asking (during asking_book) asks:")
    child.expect_exact("How many seats in Oslo?")
    child.expect_exact("seats (integer)")
    child.expect_exact("answer>")
    child.sendline("lots")
    child.expect("seats.*integer")
    child.expect_exact("answer>")
    child.sendline("4")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    assert marks(log) == ["version 2026-07-28", "accept 4"]


async def test_answered_over_http_while_the_prompt_runs(tmp_path: Path) -> None:
    """``cantrip serve``: the server's question is listed in the session's pending
    pauses while the prompt runs; an answer that does not fill the form is a 409
    naming the field, the right one lets the prompt finish."""
    import httpx

    from cantrip.protocols.http._serve import serve_http

    log = tmp_path / "marks"
    s = spell([call("asking_book", city="Rome"), finish("done")], asking(log))
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve_http(s, "127.0.0.1", 0, task_status=task_status)
        )
        async with httpx.AsyncClient(base_url=binds[0], timeout=30) as http:
            sid = (await http.post("/sessions")).json()["session_id"]
            answers: list[httpx.Response] = []

            async def prompt() -> None:
                answers.append(await http.post(f"/sessions/{sid}/prompt", json={"prompt": "go"}))

            nursery.start_soon(prompt)
            with trio.fail_after(30):
                while not (listed := (await http.get(f"/sessions/{sid}/pending")).json())[
                    "pending"
                ]:
                    await trio.sleep(0.05)
            (pause,) = listed["pending"]
            assert pause["schema"]["required"] == ["seats"]
            assert (
                pause["origin"] == "mcp:asking" and pause["question"] == "How many seats in Rome?"
            )
            url = f"/sessions/{sid}/pending/{pause['pause_id']}"
            wrong = await http.post(url, json={"decision": "answer", "text": "some"})
            assert wrong.status_code == 409 and "seats" in wrong.text
            right = await http.post(url, json={"decision": "answer", "text": "5"})
            assert right.status_code == 202, right.text  # a live waiter took it
            with trio.fail_after(30):
                while not answers:
                    await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    assert answers[0].status_code == 200 and answers[0].json()["result"] == "done"
    assert marks(log) == ["version 2026-07-28", "accept 5"]


@pytest.mark.parametrize(("option", "said"), [("allow_once", "True"), ("reject_once", "False")])
async def test_an_acp_editor_answers_a_yes_no_question(
    tmp_path: Path, option: str, said: str
) -> None:
    """``cantrip acp``: ACP can only allow or reject, so a server's yes/no form is
    asked as ``session/request_permission`` (allow: yes, reject: no)."""
    import asyncio
    from typing import cast

    from acp import Client
    from acp.stdio import spawn_agent_process
    from acp_support import text_block
    from test_acp_permission import Editor

    log = tmp_path / "marks"
    spec = tmp_path / "asking.toml"
    spec.write_text(_spec_toml([call("asking_confirm", what="deploy"), finish("ok")], log))
    editor = Editor(option)

    async def drive() -> Any:
        async with spawn_agent_process(
            cast(Client, editor), str(BIN / "cantrip"), "acp", str(spec), cwd=tmp_path
        ) as (conn, _process):
            await conn.initialize(protocol_version=1)
            session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            return await conn.prompt(session_id=session.session_id, prompt=[text_block("go")])

    answer = await trio.to_thread.run_sync(asyncio.run, drive())
    assert answer.stop_reason == "end_turn"
    ((tool_call, options),) = editor.asked
    assert "mcp:asking asks: Really deploy?" in tool_call.title
    assert options == ["allow_once", "reject_once"]
    assert marks(log) == [f"confirm {said}"]


async def test_a_form_too_large_to_be_one_is_declined_unasked(tmp_path: Path) -> None:
    """The server's schema is compiled and checked on the event loop: one over 64,000
    characters is declined without asking anyone (and nothing is recorded as pending)."""
    log = tmp_path / "marks"
    s = spell([call("asking_survey"), finish()], asking(log))
    asked: list[cantrip.Pause] = []

    async def human(pause: cantrip.Pause) -> cantrip.Decision:
        asked.append(pause)
        return cantrip.Decision.answer("{}")

    entity = s.summon(on_pause=human)
    async with entity:
        outcome = await entity.send("survey")
    assert asked == []
    assert the_call(outcome, "asking_survey").result == {"result": "decline"}
    assert marks(log) == ["survey decline"]


async def test_an_acp_editor_with_elicitation_fills_the_servers_own_form(tmp_path: Path) -> None:
    """``cantrip acp`` with an editor that advertises elicitation forms: the server's
    question is ``elicitation/create`` with the server's own schema (no yes/no
    fallback), and the editor's content is the server's answer."""
    import asyncio
    from typing import cast

    from acp import Client, schema
    from acp.stdio import spawn_agent_process
    from acp_support import text_block

    log = tmp_path / "marks"
    spec = tmp_path / "asking.toml"
    spec.write_text(_spec_toml([call("asking_book", city="Rome"), finish("ok")], log))
    asked: list[dict[str, Any]] = []

    class FormEditor:
        async def session_update(self, *args: Any, **kwargs: Any) -> None:
            return None

        async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

        async def create_elicitation(self, message: str, mode: Any, **kwargs: Any) -> Any:
            asked.append({"message": message, "mode": mode})
            return schema.AcceptElicitationResponse(action="accept", content={"seats": 3})

    async def drive() -> Any:
        async with spawn_agent_process(
            cast(Client, FormEditor()),
            str(BIN / "cantrip"),
            "acp",
            str(spec),
            cwd=tmp_path,
            use_unstable_protocol=True,  # the library's table predates elicitation's v1.7
        ) as (conn, _process):
            caps = schema.ClientCapabilities(
                elicitation=schema.ElicitationCapabilities(
                    form=schema.ElicitationFormCapabilities()
                )
            )
            await conn.initialize(protocol_version=1, client_capabilities=caps)
            session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            return await conn.prompt(session_id=session.session_id, prompt=[text_block("go")])

    answer = await trio.to_thread.run_sync(asyncio.run, drive())
    assert answer.stop_reason == "end_turn"
    (question,) = asked
    assert question["message"] == "mcp:asking asks: How many seats in Rome?"
    assert "seats" in question["mode"].requested_schema.properties
    assert marks(log) == ["version 2026-07-28", "accept 3"]
