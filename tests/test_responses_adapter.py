"""The OpenAI Responses adapter against its loopback fake: shape, stream, stops, errors, usage."""

from __future__ import annotations

import json
import logging
from typing import Any

import attrs
import pytest
from fake_providers import Answer, Call, Drop, Fault, StreamError, isolate
from fake_reasoning import running_reasoning

from cantrip import ProviderError
from cantrip.llm import Message, ToolDefinition
from cantrip.llm._stream import TextDelta, ThinkingDelta, ToolCallEvent
from cantrip.llm._telemetry import config_pricing

ECHO = ToolDefinition(
    "echo", "Return the text.", {"type": "object", "properties": {"text": {"type": "string"}}}
)
HISTORY = [Message("system", "You are terse."), Message("user", "Echo hi.")]
RICH = Answer(
    text="Echoing.",
    thinking="The user wants an echo.",
    calls=(Call("echo", {"text": "hi"}),),
    prompt_tokens=120,
    completion_tokens=40,
    reasoning_tokens=25,
)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    isolate(monkeypatch, tmp_path)


def comparable(response: Any) -> Any:
    """A response without what differs between two fakes (their signing keys)."""
    parts = []
    for part in response.reasoning:
        value = json.loads(part.payload)
        value.pop("encrypted_content", None)
        parts.append(attrs.evolve(part, payload=json.dumps(value)))
    return attrs.evolve(response, metadata={}, reasoning=tuple(parts))


async def test_request_shape_is_stateless_with_encrypted_reasoning() -> None:
    extra = {"reasoning_effort": "high", "max_tokens": 300, "temperature": 0.2}
    async with running_reasoning("openai_responses", [RICH]) as (fake, llm):
        await llm.query(HISTORY, [ECHO], "required", extra)
    request = fake.requests[0]
    assert request.path == "/v1/responses"
    assert request.headers["authorization"] == "Bearer test-key"
    body = request.json()
    assert body["store"] is False and body["include"] == ["reasoning.encrypted_content"]
    assert body["instructions"] == "You are terse."
    assert body["input"] == [{"role": "user", "content": "Echo hi."}]
    assert body["tools"] == [
        {
            "type": "function",
            "name": "echo",
            "description": "Return the text.",
            "parameters": dict(ECHO.parameters),
            "strict": False,
        }
    ]
    assert body["tool_choice"] == "required"
    assert body["max_output_tokens"] == 300 and body["temperature"] == 0.2
    assert body["reasoning"] == {"effort": "high", "summary": "auto"}
    assert body["prompt_cache_key"].startswith("cantrip-")


async def test_streamed_and_whole_answers_are_equal_and_stream_live() -> None:
    async with running_reasoning("openai_responses", [RICH]) as (_fake, llm):
        whole = await llm.query(HISTORY, [ECHO])
    events: list[Any] = []
    async with running_reasoning("openai_responses", [RICH]) as (_fake, llm):
        streamed = await llm.stream(HISTORY, [ECHO], on_event=events.append)
    assert comparable(whole) == comparable(streamed)
    assert whole.content == "Echoing." and whole.thinking == "The user wants an echo."
    assert whole.tool_calls[0].id == "call_1_0" and whole.tool_calls[0].arguments == {"text": "hi"}
    assert whole.stop_reason == "tool_use"
    assert whole.usage.reasoning_tokens == 25 and whole.usage.prompt_tokens == 120
    kinds = [type(e) for e in events]
    assert kinds.index(ThinkingDelta) < kinds.index(TextDelta) < kinds.index(ToolCallEvent)
    assert "".join(e.text for e in events if isinstance(e, ThinkingDelta)) == RICH.thinking
    assert [p.kind for p in whole.reasoning] == ["part", "fields", "fields"]


@pytest.mark.parametrize("stream", [False, True])
async def test_incomplete_for_max_output_tokens_is_a_max_tokens_stop(stream: bool) -> None:
    cut = Answer(text="Partial", stop="length")
    async with running_reasoning("openai_responses", [cut]) as (_fake, llm):
        if stream:
            response = await llm.stream(HISTORY, [], on_event=lambda e: None)
        else:
            response = await llm.query(HISTORY, [])
    assert response.stop_reason == "max_tokens"
    assert response.metadata["incomplete_reason"] == "max_output_tokens"
    assert response.content == "Partial"


async def test_an_error_event_mid_stream_raises_with_its_code() -> None:
    fault = StreamError(RICH, after_events=3, code="server_error", message="overloaded")
    async with running_reasoning("openai_responses", [fault]) as (_fake, llm):
        with pytest.raises(ProviderError) as info:
            await llm.stream(HISTORY, [ECHO], on_event=lambda e: None)
    assert info.value.code == "server_error" and info.value.retryable
    assert "overloaded" in str(info.value)


async def test_a_stream_cut_before_completion_is_retryable() -> None:
    async with running_reasoning("openai_responses", [Drop(RICH, after_events=4)]) as (_f, llm):
        with pytest.raises(ProviderError) as info:
            await llm.stream(HISTORY, [ECHO], on_event=lambda e: None)
    assert info.value.retryable


async def test_http_errors_keep_their_meaning() -> None:
    script = [Fault(400, "bad input", "invalid_request_error"), Fault(429, "slow down")]
    async with running_reasoning("openai_responses", script) as (_fake, llm):
        with pytest.raises(ProviderError) as bad:
            await llm.query(HISTORY, [ECHO])
        with pytest.raises(ProviderError) as limited:
            await llm.query(HISTORY, [ECHO])
    assert bad.value.status == 400 and not bad.value.retryable
    assert limited.value.status == 429 and limited.value.retryable


async def test_cached_and_reasoning_tokens_reach_usage_and_cost() -> None:
    answer = Answer(text="ok", prompt_tokens=2000, completion_tokens=100, reasoning_tokens=60)
    async with running_reasoning("openai_responses", [answer, answer]) as (fake, llm):
        await llm.query(HISTORY, [ECHO])
        more = [*HISTORY, Message("assistant", "ok"), Message("user", "more")]
        second = await llm.query(more, [ECHO])
    body = fake.requests[1].json()
    assert body["prompt_cache_key"] == fake.requests[0].json()["prompt_cache_key"]
    usage = second.usage
    assert usage.cached_tokens > 0 and usage.reasoning_tokens == 60
    pricing = config_pricing("openai_responses", "gpt-5-mini")
    assert pricing is not None
    fresh = usage.prompt_tokens - usage.cached_tokens
    expected = (fresh * 0.25 + usage.cached_tokens * 0.025 + 100 * 2.00) / 1e6
    assert pricing.cost(usage) == pytest.approx(expected)


async def test_an_unknown_effort_is_left_out_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    async with running_reasoning("openai_responses", [RICH]) as (fake, llm):
        await llm.query(HISTORY, [ECHO], extra={"reasoning_effort": "ludicrous"})
    assert "reasoning" not in fake.requests[0].json()
    assert "unknown reasoning_effort 'ludicrous'" in caplog.text


async def test_an_unknown_model_works_with_a_warning_and_no_cost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    async with running_reasoning("openai_responses", [RICH], model="gpt-7-preview") as (_f, llm):
        response = await llm.query(HISTORY, [ECHO])
    assert response.content == "Echoing."
    assert "'gpt-7-preview' is not in its catalogue" in caplog.text
    assert config_pricing("openai_responses", "gpt-7-preview") is None
    assert llm.context_window is None
