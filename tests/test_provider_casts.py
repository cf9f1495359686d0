"""Whole casts against each fake provider: streamed and not, the loom records the same turns."""

from __future__ import annotations

from typing import Any

import pytest
from fake_providers import PROVIDERS, Answer, Call, isolate, running

import cantrip
from cantrip._events import FinalResponse, MessageComplete, StepComplete
from cantrip.llm._stream import Event, TextDelta, ToolCallEvent
from gates import done, echo

SCRIPT = [
    Answer(
        text="Let me echo first.",
        thinking="Echo, then finish.",
        calls=(Call("echo", {"text": "hi there"}),),
        prompt_tokens=50,
        completion_tokens=12,
    ),
    Answer(calls=(Call("done", {"answer": "finished"}),), prompt_tokens=80, completion_tokens=9),
]


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    isolate(monkeypatch, tmp_path)


def spell(llm: Any, **identity: Any) -> cantrip.Cantrip:
    return cantrip.Cantrip(
        llm=llm,
        identity=cantrip.Identity(system_prompt="You are a test entity.", **identity),
        circle=cantrip.Circle([done, echo], [cantrip.max_turns(5)]),
    )


def shape(turn: cantrip.Turn) -> dict[str, Any]:
    data = turn.to_dict()
    for key in ("id", "parent_id", "entity_id", "cantrip_id"):
        data.pop(key)
    data["metadata"] = {
        k: v for k, v in data["metadata"].items() if k not in ("duration_ms", "timestamp")
    }
    for record in data.get("gate_calls", ()):
        record.pop("duration_ms", None)
        record.pop("started_at", None)
        record.pop("completed_at", None)
    return data


def options(provider: str) -> dict[str, Any]:
    return {"model": "llama3.1:8b"} if provider == "ollama" else {}


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_full_cast_streamed_and_not_records_identical_turns(provider: str) -> None:
    async with running(provider, SCRIPT, **options(provider)) as (quiet_fake, llm):
        quiet = await spell(llm).cast_async("Echo hi there, then finish.")
    events: list[Event] = []
    async with running(provider, SCRIPT, **options(provider)) as (loud_fake, llm):
        loud = await spell(llm).cast_async("Echo hi there, then finish.", on_event=events.append)
    assert quiet.result == loud.result == "finished"
    assert [shape(t) for t in quiet.turns] == [shape(t) for t in loud.turns]
    first = quiet.turns[0]
    assert first.content == "Let me echo first." and first.thinking == "Echo, then finish."
    assert [r.result for r in first.gate_calls] == ["hi there"]
    assert first.metadata.provider == provider and first.metadata.tokens_prompt == 50
    assert quiet.usage.prompt_tokens == 130
    # The second request carried the tool result, paired with the call, in the wire format.
    for fake in (quiet_fake, loud_fake):
        assert len(fake.requests) == 2
        assert "hi there" in fake.requests[1].body.decode()
    # Events: deltas, then each call announced and finalized, then the final answer.
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == "Let me echo first."
    calls = [e for e in events if isinstance(e, ToolCallEvent)]
    assert [(c.name, c.final) for c in calls] == [
        ("echo", False),
        ("echo", True),
        ("done", False),
        ("done", True),
    ]
    assert calls[1].arguments == {"text": "hi there"}
    completed = [e.response for e in events if isinstance(e, MessageComplete)]
    assert [r.tool_calls[0].id for r in completed] == [t.tool_calls[0].id for t in loud.turns]
    assert sum(isinstance(e, StepComplete) for e in events) == 2
    assert isinstance(events[-1], FinalResponse) and events[-1].result == "finished"


@pytest.mark.parametrize("provider", ("openai", "anthropic", "gemini"))
async def test_identity_hyperparameters_reach_the_wire(provider: str) -> None:
    async with running(provider, SCRIPT) as (fake, llm):
        await spell(llm, temperature=0.3, max_tokens=99, stop=("END",), seed=3).cast_async("go")
    body = fake.requests[0].json()
    if provider == "openai":
        assert (body["temperature"], body["max_completion_tokens"], body["stop"]) == (
            0.3,
            99,
            ["END"],
        )
        assert body["seed"] == 3 and body["tool_choice"] == "auto"
    elif provider == "anthropic":
        assert (body["temperature"], body["max_tokens"], body["stop_sequences"]) == (
            0.3,
            99,
            ["END"],
        )
        assert body["tool_choice"] == {"type": "auto"}
    else:
        assert body["generationConfig"] == {
            "temperature": 0.3,
            "maxOutputTokens": 99,
            "stopSequences": ["END"],
            "seed": 3,
        }


async def test_required_tool_choice_is_simulated_by_one_reprompt() -> None:
    """Ollama ignores tool_choice: a text-only answer gets one explicit re-prompt (LLM-5)."""
    script = [Answer(text="I think the answer is 4."), SCRIPT[1]]
    async with running("ollama", script, model="llama3.1:8b") as (fake, llm):
        response = await llm.query(
            [cantrip.Message("user", "what is 2+2?")],
            [done.definition()],
            "required",
        )
    assert response.tool_calls[0].name == "done"
    assert response.metadata["tool_choice_reprompted"] is True
    assert response.usage.prompt_tokens == 11 + 80  # both exchanges are paid for
    first, second = (r.json() for r in fake.requests)
    assert "tool_choice" not in first and "tool_choice" not in second
    assert second["messages"][-2] == {"role": "assistant", "content": "I think the answer is 4."}
    assert "must answer by calling one of the available tools" in second["messages"][-1]["content"]


async def test_required_is_sent_natively_where_it_exists() -> None:
    async with running("openai", [SCRIPT[1]]) as (fake, llm):
        await llm.query([cantrip.Message("user", "x")], [done.definition()], "required")
    assert fake.requests[0].json()["tool_choice"] == "required" and len(fake.requests) == 1


async def test_a_reprompt_that_still_has_no_call_is_returned_as_is() -> None:
    script = [Answer(text="no"), Answer(text="still no")]
    async with running("ollama", script, model="m") as (fake, llm):
        response = await llm.query([cantrip.Message("user", "x")], [done.definition()], "required")
    assert response.content == "still no" and len(fake.requests) == 2


async def test_a_code_medium_cast_over_a_real_wire_format() -> None:
    """The code medium's single tool, required by default, through Anthropic's format."""
    code = Call("js", {"code": 'done("from js")'})
    async with running("anthropic", [Answer(calls=(code,))]) as (fake, llm):
        spell_js = cantrip.Cantrip(
            llm=llm,
            identity=cantrip.Identity(),
            circle=cantrip.Circle([done], [cantrip.max_turns(2)], medium=_js()),
        )
        outcome = await spell_js.cast_async("run code")
    assert outcome.result == "from js"
    body = fake.requests[0].json()
    assert body["tool_choice"] == {"type": "any"}
    assert [t["name"] for t in body["tools"]] == ["js"]


def _js() -> Any:
    from mediums.js import js

    return js
