"""A cast whose answer the output-token limit cut off (issue 22), end to end.

What a user, a parent entity and a program reading ``--json`` see: never a
finished answer. The cast ends truncated with reason ``max_tokens`` and the
partial text (or, with the ``max_continuations`` ward, the model is asked to
go on and the pieces are joined); a call whose arguments the limit cut is an
``is_error`` observation that says so, and the loop goes on.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import trio
from fake_providers import PREFIXES, PROVIDERS, Answer, Call, FakeOpenAI, isolate, running, serve

import cantrip
from cantrip import Cantrip, Circle, Identity, ScriptedLLM, Ward, max_turns
from cantrip._core._conclude import CONTINUE_CUT_OFF
from cantrip._outcome import result_dict, stop_reason
from gates import call_agent, done, echo

CUT_TEXT = "The story is about a"
CANTRIP = str(Path(sys.executable).with_name("cantrip"))


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    isolate(monkeypatch, tmp_path)


def spell(llm: Any, *wards: Ward, gates: tuple[Any, ...] = (done, echo)) -> Cantrip:
    return Cantrip(
        llm=llm,
        identity=Identity(system_prompt="Be brief.", max_tokens=5),
        circle=Circle(list(gates), [max_turns(5), *wards]),
    )


def options(provider: str) -> dict[str, Any]:
    return {"model": "llama3.1:8b"} if provider == "ollama" else {}


def sink(stream: bool) -> Any:
    return (lambda event: None) if stream else None


# -- a cut-off text answer -------------------------------------------------------------------


@pytest.mark.parametrize("stream", (False, True), ids=("whole", "streamed"))
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_cut_off_answer_ends_the_cast_truncated_with_its_partial_text(
    provider: str, stream: bool
) -> None:
    async with running(provider, [Answer(text=CUT_TEXT, stop="length")], **options(provider)) as (
        fake,
        llm,
    ):
        outcome = await spell(llm).cast_async("Tell me a long story.", on_event=sink(stream))
    assert (outcome.terminated, outcome.truncated, outcome.reason) == (False, True, "max_tokens")
    assert outcome.result is None and outcome.partial == CUT_TEXT
    assert outcome.summary is not None and "output token limit" in outcome.summary
    assert CUT_TEXT in outcome.summary
    (turn,) = outcome.turns
    assert turn.content == CUT_TEXT  # the partial text is kept in the loom
    assert (turn.truncated, turn.terminated, turn.reason) == (True, False, "max_tokens")
    assert len(fake.requests) == 1  # not continued by default


async def test_an_empty_cut_off_answer_is_not_continued() -> None:
    # Every token went to reasoning: asking again would be cut the same way.
    llm = ScriptedLLM([{"thinking": "long thoughts", "stop_reason": "max_tokens"}])
    outcome = await spell(llm, Ward("max_continuations", 3)).cast_async("go")
    assert outcome.reason == "max_tokens" and outcome.partial is None
    assert "Nothing was written before the cut" in (outcome.summary or "")
    assert llm.remaining == 0 and len(llm.invocations) == 1


# -- continuations ----------------------------------------------------------------------------

PIECES = [
    {"content": "The quick", "stop_reason": "max_tokens"},
    {"content": " brown fox", "stop_reason": "max_tokens"},
    {"content": " jumps."},
]


async def test_continuations_join_the_pieces_into_one_answer() -> None:
    llm = ScriptedLLM(PIECES)
    outcome = await spell(llm, Ward("max_continuations", 2)).cast_async("story")
    assert outcome.terminated and outcome.reason == "text"
    assert outcome.result == "The quick brown fox jumps."
    assert [t.content for t in outcome.turns] == ["The quick", " brown fox", " jumps."]
    assert outcome.turns[-1].result == "The quick brown fox jumps."
    # The model saw its own partial text, then the request to go on.
    second = llm.invocations[1].messages
    assert (second[-2].role, second[-2].content) == ("assistant", "The quick")
    assert (second[-1].role, second[-1].content) == ("user", CONTINUE_CUT_OFF)


async def test_continuations_are_bounded_by_the_ward() -> None:
    llm = ScriptedLLM(PIECES)
    outcome = await spell(llm, Ward("max_continuations", 1)).cast_async("story")
    assert (outcome.truncated, outcome.reason) == (True, "max_tokens")
    assert outcome.partial == "The quick brown fox"
    assert len(outcome.turns) == 2 and llm.remaining == 1


async def test_a_child_cannot_continue_more_than_its_parent_allows() -> None:
    child = Circle([done], [max_turns(5), Ward("max_continuations", 5)])
    parent = Circle([done], [max_turns(5), Ward("max_continuations", 1)])
    assert child.resolved.compose(parent.resolved).get("max_continuations") == 1


async def test_a_continuation_over_a_real_wire_format_is_a_valid_request() -> None:
    script = [Answer(text="The quick", stop="length"), Answer(text=" brown fox.")]
    async with running("anthropic", script) as (fake, llm):
        outcome = await spell(llm, Ward("max_continuations", 1)).cast_async(
            "story", on_event=lambda e: None
        )
    assert outcome.result == "The quick brown fox."
    # The fake enforces the Messages API's alternation rules; the request passed them.
    sent = fake.requests[1].json()["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[-1]["content"][0]["text"] == CONTINUE_CUT_OFF


# -- a tool call cut off by the limit ---------------------------------------------------------


@pytest.mark.parametrize("stream", (False, True), ids=("whole", "streamed"))
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_cut_off_tool_call_is_an_error_observation_and_the_loop_goes_on(
    provider: str, stream: bool
) -> None:
    cut: Any = {"text": "half"} if provider == "gemini" else '{"text": "the start of a lo'
    script = [
        Answer(calls=(Call("echo", cut),), stop="length"),
        Answer(calls=(Call("done", {"answer": "made it"}),)),
    ]
    async with running(provider, script, **options(provider)) as (fake, llm):
        outcome = await spell(llm).cast_async("echo something long", on_event=sink(stream))
    assert outcome.result == "made it"
    first = outcome.turns[0]
    (record,) = first.gate_calls
    assert record.is_error and record.status == "error"  # echo would have returned its text
    assert "cut off by the output token limit (max_tokens)" in record.text
    assert first.tool_calls[0].cut_off
    # The model was told, in its provider's tool-result shape.
    assert "cut off by the output token limit" in fake.requests[1].body.decode()


async def test_a_cut_off_code_call_is_not_run(tmp_path: Path) -> None:
    from mediums.js import JsMedium

    llm = ScriptedLLM(
        [
            {"code": "done('from the cut-off code')", "stop_reason": "max_tokens"},
            {"code": "done('from the complete code')"},
        ]
    )
    js = Cantrip(llm=llm, identity=Identity(), circle=Circle([done], [max_turns(4)], JsMedium()))
    outcome = await js.cast_async("run")
    assert outcome.result == "from the complete code"
    first = outcome.turns[0]
    assert first.is_error and "cut off by the output token limit" in first.observation
    assert first.gate_calls[0].status == "error"


async def test_a_fork_does_not_replay_a_cut_off_code_call() -> None:
    from mediums.js import JsMedium

    llm = ScriptedLLM(
        [{"code": "var x = 1;", "stop_reason": "max_tokens"}, {"code": "done(typeof x)"}]
    )
    js = Cantrip(llm=llm, identity=Identity(), circle=Circle([done], [max_turns(4)], JsMedium()))
    original = await js.cast_async("run")
    assert original.result == "undefined"  # the cut-off code never ran
    other = ScriptedLLM([{"code": "done(typeof x)"}])
    forked = await js.fork_async(original.turns[0], "again", llm=other)
    assert forked.result == "undefined"  # and replay does not run it either


async def test_a_cut_off_call_survives_the_loom_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "loom.jsonl"
    llm = ScriptedLLM(
        [
            {"tool_calls": [{"gate": "echo", "args": '{"text": "x'}], "stop_reason": "max_tokens"},
            {"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]},
        ]
    )
    loom = cantrip.Loom.open(path)
    circle = Circle([done, echo], [max_turns(3)])
    outcome = await Cantrip(llm=llm, identity=Identity(), circle=circle, loom=loom).cast_async("go")
    loom.close()
    reopened = cantrip.Loom.open(path)
    first = reopened.get(outcome.turns[0].id)
    assert first.tool_calls[0].cut_off and first == outcome.turns[0]
    reopened.close()


# -- what every front end reports ---------------------------------------------------------------


async def test_json_results_say_max_tokens_and_keep_the_partial_apart() -> None:
    llm = ScriptedLLM([{"content": CUT_TEXT, "stop_reason": "max_tokens"}])
    outcome = await spell(llm).cast_async("story")
    data = result_dict(outcome)  # the CLI's --json and the HTTP API
    assert data["stop_reason"] == "max_tokens" == stop_reason(outcome)  # ACP's stopReason
    assert (data["terminated"], data["truncated"], data["reason"]) == (False, True, "max_tokens")
    assert data["result"] is None and data["partial"] == CUT_TEXT


async def test_a_parent_reads_a_cut_off_child_as_truncated_with_the_partial_text() -> None:
    llm = ScriptedLLM(
        [
            {"tool_calls": [{"gate": "call_agent", "args": {"intent": "write a story"}}]},
            {"content": CUT_TEXT, "stop_reason": "max_tokens"},  # the child
            {"tool_calls": [{"gate": "done", "args": {"answer": "child was cut"}}]},
        ]
    )
    outcome = await spell(llm, gates=(done, call_agent)).cast_async("delegate")
    assert outcome.result == "child was cut"
    record = next(r for t in outcome.turns for r in t.gate_calls if r.gate == "call_agent")
    assert not record.is_error  # a truncated child is not a failed one
    assert record.detail["truncated"] is True and record.detail["reason"] == "max_tokens"
    assert "output token limit" in record.text and CUT_TEXT in record.text


async def test_the_cli_reports_a_cut_off_cast_as_truncated(tmp_path: Path) -> None:
    """The issue's own reproduction, against a loopback OpenAI-compatible server."""
    fake = FakeOpenAI([Answer(text=CUT_TEXT, stop="length")] * 2)
    async with serve(fake, PREFIXES["openai"]) as url:
        spec = tmp_path / "short.toml"
        spec.write_text(
            textwrap.dedent(
                f"""
                [llm]
                provider = "openai"
                model = "gpt-test"
                base_url = "{url}"
                [identity]
                max_tokens = 5
                [circle]
                medium = "conversation"
                gates = ["done"]
                wards = [{{ max_turns = 3 }}]
                """
            )
        )
        env = {**os.environ, "OPENAI_API_KEY": "test-key"}
        as_json = await trio.run_process(
            [CANTRIP, "cast", "--json", str(spec), "Tell me a long story."],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=env,
        )
        plain = await trio.run_process(
            [CANTRIP, "cast", str(spec), "Tell me a long story."],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=env,
        )
    assert as_json.returncode == 2, as_json.stderr
    data = json.loads(as_json.stdout)
    assert (data["terminated"], data["truncated"], data["reason"]) == (False, True, "max_tokens")
    assert data["stop_reason"] == "max_tokens" and data["result"] is None
    assert data["partial"] == CUT_TEXT
    assert fake.requests[0].json()["max_completion_tokens"] == 5
    # Without --json nothing reaches stdout (it is for finished answers only); stderr
    # says what happened and shows the partial text as partial.
    assert plain.returncode == 2 and plain.stdout == b""
    err = plain.stderr.decode()
    assert "Cut off by the output token limit (max_tokens)" in err and CUT_TEXT in err
