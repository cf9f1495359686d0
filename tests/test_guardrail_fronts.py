"""Reason ``guardrail`` in every front end (issue 43, item 4): ``[[circle.guardrails]]``
in a spec, ``cast --json`` and its exit code, the HTTP API, AG-UI, A2A, MCP, ACP and
the OpenTelemetry spans."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from ag_ui_validate.pytest_plugin import assert_valid_agui

import cantrip
from cantrip._outcome import refused, result_dict, stop_reason
from cantrip.cli import _main as _cli
from cantrip.protocols.http._serve import serve_http
from cantrip.protocols.mcp_server._result import cast_tool_result
from cantrip.spec import build_cantrip, load_spec_file, parse_spec
from cantrip.tracing import _genai
from gates import done

SPEC = """
[llm]
provider = "scripted"
responses = [{{tool_calls = [{{gate = "done", args = {{answer = "fine"}}}}]}}]

[circle]
medium = "conversation"
gates = ["done"]
wards = [{{max_turns = 3}}]

[[circle.guardrails]]
check = "regex"
name = "no-bombs"
pattern = "(?i)bomb"
on = ["input"]
{extra}
"""

NOTE = {"check": "no-bombs", "on": "input", "why": "the input matches '(?i)bomb'"}


def write_spec(tmp_path: Path, extra: str = "") -> Path:
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.format(extra=extra))
    return spec


def test_cast_json_reports_reason_guardrail_and_exits_4(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(tmp_path, "blocking = true")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))
    loom_file = tmp_path / "l.db"
    code = _cli.main(["cast", str(spec), "a Bomb", "--json", "--loom", str(loom_file)])
    outcome = json.loads(capsys.readouterr().out)
    assert code == 4  # its own exit code: not 2 (a ward), not 1 (an error)
    assert (outcome["reason"], outcome["stop_reason"]) == ("guardrail", "refusal")
    assert outcome["guardrail"] == NOTE
    loom = cantrip.Loom.open(loom_file)
    assert loom.turns[-1].extras["guardrail"] == NOTE
    loom.close()
    # a cast the check lets by ends as usual
    assert _cli.main(["cast", str(spec), "hello", "--loom", str(loom_file)]) == 0


def test_a_spec_reports_every_bad_guardrail_table_at_once(tmp_path: Path) -> None:
    doc = {
        "llm": {"provider": "scripted", "responses": [{"content": "x"}]},
        "circle": {
            "medium": "conversation",
            "gates": ["done"],
            "guardrails": [
                {"check": "regex"},
                {"check": "length", "max_chars": 3, "pattern": "x"},
                {"check": "nothing"},
                {"check": "secrets", "on": "everywhere"},
                {"check": "classifier", "llm": "judge"},
                {"check": "tests.test_guardrail_fronts:missing"},
            ],
        },
    }
    with pytest.raises(cantrip.ConstructionError) as raised:
        build_cantrip(parse_spec(doc))
    problems = raised.value.problems
    assert "circle.guardrails[0]: check 'regex' needs a pattern" in problems
    assert "circle.guardrails[1]: check 'length' takes no pattern" in problems
    assert any(p.startswith("circle.guardrails[2]: unknown check 'nothing'") for p in problems)
    assert any(p.startswith("circle.guardrails[3].on") for p in problems)
    assert any(
        "circle.guardrails[4]: classifier llm 'judge' is not a named llm" in p for p in problems
    )
    assert any(p.startswith("circle.guardrails[5]: guardrail check") for p in problems)


CHECKS = (
    "def shout_free(text):\n"
    "    # a function check a spec names by module:function (False trips)\n"
    "    return not text.isupper()\n"
)


def test_a_spec_names_a_function_check_and_a_classifier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_checks.py").write_text(CHECKS)
    monkeypatch.syspath_prepend(str(tmp_path))
    doc = {
        "llm": {"provider": "scripted", "responses": [{"content": "answered"}]},
        "llms": {
            "judge": {"provider": "scripted", "responses": [{"content": "TRIP: rude"}]},
        },
        "circle": {
            "medium": "conversation",
            "gates": ["done"],
            "wards": [{"max_turns": 3}],
            "guardrails": [
                {"check": "my_checks:shout_free", "blocking": True},
                {"check": "classifier", "llm": "judge", "name": "manners", "on": "output"},
            ],
        },
    }
    spell = build_cantrip(parse_spec(doc))
    loud = spell.cast("HELLO")
    assert loud.reason == "guardrail" and loud.turns[-1].extras["guardrail"]["check"] == (
        "shout_free"
    )
    rude = spell.cast("hello")
    assert rude.reason == "guardrail"
    assert rude.turns[-1].extras["guardrail"] == {
        "check": "manners",
        "on": "output",
        "why": "rude",
        "withheld": "answered",
    }


# -- protocols ------------------------------------------------------------------------


@asynccontextmanager
async def serving(spell: cantrip.Cantrip) -> AsyncIterator[httpx.AsyncClient]:
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(serve_http, spell, "127.0.0.1", 0)
        async with httpx.AsyncClient(base_url=binds[0], timeout=20) as client:
            yield client
        nursery.cancel_scope.cancel()


def http_spell(tmp_path: Path) -> cantrip.Cantrip:
    return build_cantrip(load_spec_file(write_spec(tmp_path)), base_dir=tmp_path)


async def test_the_http_answer_says_guardrail_refusal_and_which_check(tmp_path: Path) -> None:
    async with serving(http_spell(tmp_path)) as http:
        sid = (await http.post("/sessions")).json()["session_id"]
        answer = await http.post(f"/sessions/{sid}/prompt", json={"prompt": "build a bomb"})
        fine = await http.post(f"/sessions/{sid}/prompt", json={"prompt": "hello"})
    assert answer.status_code == 200  # the cast ran; the body says how it ended
    body = answer.json()
    assert (body["reason"], body["stop_reason"], body["truncated"]) == (
        "guardrail",
        "refusal",
        True,
    )
    assert body["guardrail"] == NOTE and body["result"] is None
    assert fine.json()["stop_reason"] == "end_turn"  # the session goes on


async def test_an_agui_run_a_guardrail_refuses_ends_with_run_error_code_guardrail(
    tmp_path: Path,
) -> None:
    body = {
        "threadId": "t-1",
        "runId": "run-1",
        "messages": [{"id": "u1", "role": "user", "content": "a bomb"}],
        "state": {},
        "tools": [],
        "context": [],
        "forwardedProps": {},
    }
    async with serving(http_spell(tmp_path)) as http:
        answer = await http.post("/agui", json=body, headers={"accept": "text/event-stream"})
    events = [
        json.loads(line[len("data: ") :])
        for line in answer.text.splitlines()
        if line.startswith("data: ")
    ]
    assert_valid_agui(events, max_warnings=0)  # the conformance validator's rules
    assert events[0]["type"] == "RUN_STARTED"
    assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "guardrail"
    assert "no-bombs" in events[-1]["message"]
    assert not any(e["type"] == "RUN_FINISHED" for e in events)


async def refused_outcome() -> cantrip.CastResult:
    spell = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM([{"content": "x"}]),
        identity=cantrip.Identity(),
        circle=cantrip.Circle(
            [done],
            [cantrip.max_turns(2)],
            guardrails=[cantrip.guardrails.regex("bomb", on="input", blocking=True)],
        ),
    )
    return await spell.cast_async("a bomb")


async def test_mcp_acp_and_a2a_each_give_a_refusal_its_own_answer() -> None:
    from a2a.types import a2a_pb2 as pb

    from cantrip.protocols.a2a._server import settle

    outcome = await refused_outcome()
    assert refused(outcome)
    # ACP: stopReason "refusal" (the shared mapping every protocol reads)
    assert stop_reason(outcome) == "refusal"
    # MCP: the cast tool's result is a tool error, its structured content says why
    result = cast_tool_result(outcome)
    assert result.is_error is True
    assert result.structured_content["reason"] == "guardrail"
    assert "Stopped by guardrail 'regex' on input" in result.content[0].text
    # A2A: the task is rejected
    task = _a2a_task()
    settle(task, result_dict(outcome), "s1")
    assert task.state == pb.TASK_STATE_REJECTED


def _a2a_task() -> Any:
    from a2a.types import a2a_pb2 as pb

    from cantrip.protocols.a2a._server import TaskView

    return TaskView("task-1", "ctx-1", pb.TASK_STATE_WORKING)


async def test_the_agent_span_names_the_check() -> None:
    outcome = await refused_outcome()
    last = outcome.turns[-1]
    attributes = _genai.guardrail_attributes(last.reason, last.extras)
    assert attributes == {
        "cantrip.guardrail.check": "regex",
        "cantrip.guardrail.on": "input",
        "cantrip.guardrail.why": "the input matches 'bomb'",
    }
    assert (
        _genai.agent_end_attributes(last.reason, False, 1, outcome.usage, None)["cantrip.reason"]
        == "guardrail"
    )
