"""Reasoning artefacts survive a tool loop: each reasoning fake gets them back, or refuses.

The fakes in :mod:`fake_reasoning` sign what they think and refuse a request
whose artefacts were dropped, altered or moved -- the rules the real APIs
enforce. A 3-turn tool-calling cast passes against each, streamed and not.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
from fake_providers import Answer, Call, isolate
from fake_reasoning import REASONING_FAKES, running_reasoning

import cantrip
from cantrip import ProviderError
from cantrip.llm import Message, ToolDefinition
from cantrip.llm._stream import Event, ThinkingDelta
from gates import done, echo

PROVIDERS = tuple(REASONING_FAKES)
SCRIPT = [
    Answer(thinking="I should echo first.", calls=(Call("echo", {"text": "one"}),)),
    Answer(
        thinking="Now echo again, and say so.",
        text="Second echo.",
        calls=(Call("echo", {"text": "two"}),),
    ),
    Answer(thinking="Both done; finish.", calls=(Call("done", {"answer": "finished"}),)),
]
EFFORT = {"reasoning_effort": "low"}
ECHO = ToolDefinition(
    "echo", "Return the text.", {"type": "object", "properties": {"text": {"type": "string"}}}
)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    isolate(monkeypatch, tmp_path)


def spell(llm: Any) -> cantrip.Cantrip:
    return cantrip.Cantrip(
        llm=llm,
        identity=cantrip.Identity(system_prompt="You are a test entity.", extra=EFFORT),
        circle=cantrip.Circle([done, echo], [cantrip.max_turns(5)]),
    )


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_three_turn_tool_cast_with_reasoning(provider: str, stream: bool) -> None:
    events: list[Event] = []
    async with running_reasoning(provider, SCRIPT) as (fake, llm):
        result = await spell(llm).cast_async(
            "Echo one, then two, then finish.", on_event=events.append if stream else None
        )
    assert result.result == "finished"
    assert len(fake.requests) == 3  # every follow-up was accepted by the fake's checks
    turns = result.turns
    assert [t.thinking for t in turns] == [a.thinking for a in SCRIPT]
    for turn in turns:
        assert turn.reasoning, "each utterance keeps its artefacts in the loom"
        assert all(part.format == llm.reasoning_format for part in turn.reasoning)
    if stream:
        streamed = "".join(e.text for e in events if isinstance(e, ThinkingDelta))
        assert all(a.thinking and a.thinking in streamed for a in SCRIPT)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_the_artefacts_are_replayed_byte_for_byte_in_place(provider: str) -> None:
    events: list[Any] = []
    async with running_reasoning(provider, [SCRIPT[0], SCRIPT[2]]) as (fake, llm):
        history = [Message("system", "sys"), Message("user", "go")]
        first = await llm.stream(history, [ECHO], extra=EFFORT, on_event=events.append)
        history += [
            Message(
                "assistant", first.content, tool_calls=first.tool_calls, reasoning=first.reasoning
            ),
            Message("tool", "one", tool_call_id=first.tool_calls[0].id, name="echo"),
        ]
        await llm.query(history, [ECHO], extra=EFFORT)
    sent = fake.requests[1].body.decode()
    for part in first.reasoning:
        value = json.loads(part.payload)
        if part.kind == "part":
            # The very bytes the provider produced (as compact JSON) are in the request.
            assert json.dumps(value) in json.dumps(json.loads(sent))
        for token in _strings(value):
            assert token in sent


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _without(history: list[Message], keep: Any) -> list[Message]:
    out = []
    for m in history:
        if m.reasoning:
            m = attrs.evolve(m, reasoning=tuple(p for p in m.reasoning if keep(p)))
        out.append(m)
    return out


def _altered(history: list[Message]) -> list[Message]:
    out = []
    for m in history:
        if m.reasoning:
            parts = []
            for p in m.reasoning:
                value = json.loads(p.payload)
                for field in ("signature", "encrypted_content", "thoughtSignature"):
                    if field in value:
                        value[field] = value[field][:-4] + "AAA="
                parts.append(attrs.evolve(p, payload=json.dumps(value)))
            m = attrs.evolve(m, reasoning=tuple(parts))
        out.append(m)
    return out


REFUSALS = {
    "anthropic": "Expected `thinking` or `redacted_thinking`",
    "gemini": "missing a thought_signature",
    "openai_responses": "without its required 'reasoning' item",
}


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_the_fakes_refuse_a_follow_up_that_dropped_or_altered_them(
    provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One fake answers, then judges doctored follow-ups the way the real API does."""
    if provider == "gemini":
        # Without the stand-in signature cantrip puts on calls that carry none.
        from cantrip.llm.providers.gemini import GeminiAdapter

        monkeypatch.setattr(GeminiAdapter, "strict_signatures", None)
    async with running_reasoning(provider, [SCRIPT[0], SCRIPT[2]]) as (fake, llm):
        base = [Message("system", "sys"), Message("user", "go")]
        first = await llm.query(base, [ECHO], extra=EFFORT)
        assert first.reasoning
        honest = [
            *base,
            Message(
                "assistant", first.content, tool_calls=first.tool_calls, reasoning=first.reasoning
            ),
            Message("tool", "one", tool_call_id=first.tool_calls[0].id, name="echo"),
        ]
        # Dropped: the thinking blocks, the signature, the reasoning item.
        dropped = _without(honest, lambda p: p.kind == "fields" and provider != "gemini")
        with pytest.raises(ProviderError) as info:
            await llm.query(dropped, [ECHO], extra=EFFORT)
        assert info.value.status == 400 and REFUSALS[provider] in str(info.value)
        # Altered: a signature or encrypted content that no longer verifies.
        with pytest.raises(ProviderError) as info:
            await llm.query(_altered(honest), [ECHO], extra=EFFORT)
        assert info.value.status == 400
        # The honest history still goes through.
        answer = await llm.query(honest, [ECHO], extra=EFFORT)
    assert answer.tool_calls[0].name == "done"
    assert len(fake.requests) == 4


@pytest.mark.parametrize(
    ("model", "thinking"),
    [
        ("claude-sonnet-5-5", {"type": "adaptive"}),
        ("claude-sonnet-4-5", {"type": "enabled", "budget_tokens": 1024}),
    ],
)
async def test_reasoning_effort_picks_the_model_s_thinking_mode(
    model: str, thinking: dict[str, Any]
) -> None:
    extra = {**EFFORT, "temperature": 0.2}
    async with running_reasoning("anthropic", [SCRIPT[0]], model=model) as (fake, llm):
        await llm.query([Message("user", "go")], [ECHO], "required", extra=extra)
    body = fake.requests[0].json()
    assert body["thinking"] == thinking
    assert body.get("output_config") == ({"effort": "low"} if model.endswith("5-5") else None)
    # With thinking on, the API refuses a forced tool call and a changed temperature:
    # the call is asked for as auto, the temperature left out (the fake checks both).
    assert body["tool_choice"] == {"type": "auto"} and "temperature" not in body


async def test_a_thinking_budget_for_an_adaptive_only_model_is_refused_clearly() -> None:
    extra = {"thinking": {"type": "enabled", "budget_tokens": 2048}}
    async with running_reasoning("anthropic", [SCRIPT[0]]) as (_fake, llm):
        with pytest.raises(ProviderError) as info:
            await llm.query([Message("user", "go")], [ECHO], extra=extra)
    assert info.value.status == 400 and not info.value.retryable
    assert "'enabled' is not supported" in str(info.value)


async def test_gemini_3_gets_the_documented_stand_in_for_calls_it_did_not_sign() -> None:
    """A hand-built (or another provider's) tool call has no signature: Gemini 3 would
    refuse it, so the first call of each step gets Google's documented stand-in."""
    from cantrip.llm import ToolCall

    history = [
        Message("user", "go"),
        Message("assistant", None, tool_calls=(ToolCall("call_x", "echo", {"text": "a"}),)),
        Message("tool", "a", tool_call_id="call_x", name="echo"),
    ]
    async with running_reasoning("gemini", [SCRIPT[2]]) as (fake, llm):
        answer = await llm.query(history, [ECHO], extra=EFFORT)
    assert answer.tool_calls[0].name == "done"
    part = fake.requests[0].json()["contents"][1]["parts"][0]
    assert part["thoughtSignature"] == "skip_thought_signature_validator"
    async with running_reasoning("gemini", [SCRIPT[2]], model="gemini-2.5-flash") as (fake, llm):
        await llm.query(history, [ECHO])
    assert "thoughtSignature" not in fake.requests[0].json()["contents"][1]["parts"][0]
