"""Provider adapters against loopback servers speaking each provider's real wire format.

What is asserted is both sides: the request our adapter sends (URL, auth
header, body shape, tool pairing) and how the provider's answer -- whole or
streamed -- is normalized.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fake_providers import (
    PROVIDERS,
    Answer,
    Call,
    isolate,
    running,
)

from cantrip.llm import Message, Response, ToolCall, ToolDefinition
from cantrip.llm._stream import TextDelta, ThinkingDelta, ToolCallEvent

ECHO = ToolDefinition(
    "echo",
    "Return the text.",
    {
        "type": "object",
        "properties": {"text": {"type": "string"}, "times": {"type": ["integer", "null"]}},
        "required": ["text"],
        "additionalProperties": False,
    },
)
DONE = ToolDefinition(
    "done",
    "Finish.",
    {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
)
EXTRA = {"temperature": 0.25, "top_p": 0.9, "max_tokens": 321, "stop": ["STOP"], "seed": 7}
RICH = Answer(
    text="Let me echo that for you.",
    thinking="The user wants an echo; call the tool.",
    calls=(Call("echo", {"text": "hi", "nested": {"a": [1, 2]}}),),
    prompt_tokens=120,
    completion_tokens=30,
    cached_tokens=40,
    reasoning_tokens=12,
)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    isolate(monkeypatch, tmp_path)


def history() -> list[Message]:
    """A canonical history with one completed tool interaction (OpenAI-style ids)."""
    return [
        Message("system", "You are terse."),
        Message("user", "Echo hi, then finish."),
        Message(
            "assistant",
            "Echoing.",
            tool_calls=(ToolCall("call_A1", "echo", {"text": "hi"}),),
            thinking="I should echo.",
        ),
        Message("tool", "hi", tool_call_id="call_A1", name="echo"),
    ]


async def both(
    provider: str, answer: Answer, **options: Any
) -> tuple[Response, Response, list[Any]]:
    """The same answer fetched whole and streamed, each from a fresh server."""
    async with running(provider, [answer], **options) as (_, llm):
        whole = await llm.query(history(), [ECHO, DONE], "auto", EXTRA)
    events: list[Any] = []
    async with running(provider, [answer], **options) as (_, llm):
        streamed = await llm.stream(history(), [ECHO, DONE], "auto", EXTRA, on_event=events.append)
    return whole, streamed, events


# -- requests -------------------------------------------------------------------------------


async def test_openai_request_shape() -> None:
    async with running("openai", [RICH]) as (fake, llm):
        await llm.query(history(), [ECHO, DONE], "required", EXTRA)
    request = fake.requests[0]
    assert request.method == "POST" and request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer test-key"
    assert request.headers["content-type"] == "application/json"
    body = request.json()
    assert body["model"] == "gpt-5-mini"  # the shipped default
    assert body["tool_choice"] == "required"
    assert body["temperature"] == 0.25 and body["top_p"] == 0.9 and body["seed"] == 7
    assert body["stop"] == ["STOP"]
    assert body["max_completion_tokens"] == 321 and "max_tokens" not in body
    assert "stream" not in body
    assert [m["role"] for m in body["messages"]] == ["developer", "user", "assistant", "tool"]
    assistant, tool = body["messages"][2], body["messages"][3]
    call = assistant["tool_calls"][0]
    assert call == {
        "id": "call_A1",
        "type": "function",
        "function": {"name": "echo", "arguments": '{"text": "hi"}'},
    }
    assert json.loads(call["function"]["arguments"]) == {"text": "hi"}  # encoded once
    assert "reasoning_content" not in assistant  # earlier reasoning is not replayed
    assert tool == {"role": "tool", "tool_call_id": "call_A1", "content": "hi"}
    assert body["tools"][0]["function"]["parameters"] == dict(ECHO.parameters)


async def test_openai_streaming_request_asks_for_usage() -> None:
    async with running("openai", [RICH]) as (fake, llm):
        await llm.stream(history(), [ECHO], "auto", {}, on_event=lambda e: None)
    body = fake.requests[0].json()
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert fake.requests[0].headers["accept"] == "text/event-stream"


async def test_reasoning_models_get_the_developer_role() -> None:
    async with running("openai", [RICH], model="o3-mini") as (fake, llm):
        await llm.query(history(), [ECHO])
    assert fake.requests[0].json()["messages"][0] == {
        "role": "developer",
        "content": "You are terse.",
    }


async def test_anthropic_request_shape() -> None:
    # The plain shape; cache breakpoints (on in the shipped config) are test_prompt_caching's.
    async with running("anthropic", [RICH], compat={"prompt_cache": False}) as (fake, llm):
        await llm.query(history(), [ECHO, DONE], "required", EXTRA)
    request = fake.requests[0]
    assert request.path == "/v1/messages"
    assert request.headers["x-api-key"] == "test-key"
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in request.headers
    body = request.json()
    assert body["system"] == "You are terse."
    assert body["max_tokens"] == 321
    assert body["tool_choice"] == {"type": "any"}
    assert body["stop_sequences"] == ["STOP"]
    assert "seed" not in body and "stop" not in body
    assert body["tools"][0] == {
        "name": "echo",
        "description": "Return the text.",
        "input_schema": dict(ECHO.parameters),
    }
    user, assistant, results = body["messages"]
    assert user == {"role": "user", "content": [{"type": "text", "text": "Echo hi, then finish."}]}
    assert assistant["role"] == "assistant"
    tool_use = assistant["content"][1]
    assert tool_use["type"] == "tool_use" and tool_use["input"] == {"text": "hi"}  # an object
    assert tool_use["id"].startswith("toolu_")  # projected by the transcript renderer
    assert results == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": tool_use["id"], "content": "hi"}],
    }


async def test_anthropic_default_max_tokens_and_error_results() -> None:
    messages = [
        *history()[:3],
        Message("tool", "boom", tool_call_id="call_A1", name="echo", is_error=True),
    ]
    async with running("anthropic", [RICH]) as (fake, llm):
        await llm.query(messages, [ECHO])
    body = fake.requests[0].json()
    assert body["max_tokens"] == 4096 and "tool_choice" not in body
    assert body["messages"][-1]["content"][0]["is_error"] is True


async def test_gemini_request_shape() -> None:
    async with running("gemini", [RICH]) as (fake, llm):
        await llm.query(history(), [ECHO, DONE], "required", EXTRA)
    request = fake.requests[0]
    assert request.path == "/v1beta/models/gemini-3.5-flash:generateContent"
    assert request.headers["x-goog-api-key"] == "test-key"
    assert "key=" not in request.path  # the key never travels in the URL
    body = request.json()
    assert body["systemInstruction"] == {"parts": [{"text": "You are terse."}]}
    assert body["toolConfig"] == {"functionCallingConfig": {"mode": "ANY"}}
    assert body["generationConfig"] == {
        "temperature": 0.25,
        "topP": 0.9,
        "maxOutputTokens": 321,
        "stopSequences": ["STOP"],
        "seed": 7,
    }
    echo = body["tools"][0]["functionDeclarations"][0]
    assert echo["parameters"] == {
        "type": "object",
        "properties": {"text": {"type": "string"}, "times": {"type": "integer", "nullable": True}},
        "required": ["text"],
    }
    assert [c["role"] for c in body["contents"]] == ["user", "model", "user"]
    assert body["contents"][1]["parts"] == [
        {"text": "Echoing."},
        # A call Gemini 3 did not sign gets Google's documented stand-in signature.
        {
            "functionCall": {"name": "echo", "args": {"text": "hi"}},
            "thoughtSignature": "skip_thought_signature_validator",
        },
    ]
    assert body["contents"][2]["parts"] == [
        {"functionResponse": {"name": "echo", "response": {"result": "hi"}}}
    ]


async def test_gemini_streams_from_stream_generate_content_with_sse() -> None:
    async with running("gemini", [RICH]) as (fake, llm):
        await llm.stream(history(), [ECHO], on_event=lambda e: None)
    assert fake.requests[0].path == "/v1beta/models/gemini-3.5-flash:streamGenerateContent?alt=sse"


async def test_openrouter_request_shape() -> None:
    async with running("openrouter", [RICH]) as (fake, llm):
        response = await llm.query(history(), [ECHO], "auto", EXTRA)
    request = fake.requests[0]
    assert request.path == "/api/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer test-key"
    assert request.headers["x-title"] == "cantrip"
    body = request.json()
    assert body["model"] == "openai/gpt-4o-mini"
    assert body["max_tokens"] == 321 and body["usage"] == {"include": True}
    assert response.metadata["cost"] == pytest.approx(0.000123)
    assert response.thinking == RICH.thinking  # OpenRouter's "reasoning" field


async def test_ollama_request_shape_without_key_or_tool_choice() -> None:
    async with running("ollama", [RICH], model="llama3.1:8b") as (fake, llm):
        await llm.query(history(), [ECHO], "auto", EXTRA)
    request = fake.requests[0]
    assert "authorization" not in request.headers
    body = request.json()
    assert body["model"] == "llama3.1:8b"
    assert "tool_choice" not in body and body["max_tokens"] == 321


async def test_local_servers_send_a_key_only_when_one_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OLLAMA_API_KEY", "local-secret")
    async with running("ollama", [RICH], model="qwen3") as (fake, llm):
        await llm.query(history(), [ECHO])
    assert fake.requests[0].headers["authorization"] == "Bearer local-secret"


async def test_tool_choice_none_and_unset() -> None:
    async with running("openai", [RICH, RICH]) as (fake, llm):
        await llm.query(history(), [ECHO], "none")
        await llm.query(history(), [ECHO])
    assert fake.requests[0].json()["tool_choice"] == "none"
    assert "tool_choice" not in fake.requests[1].json()
    async with running("ollama", [RICH], model="m") as (fake, llm):
        await llm.query(history(), [ECHO], "none")
    assert "tools" not in fake.requests[0].json()  # cannot say "none": offers no tools


async def test_extra_fields_pass_through_but_cannot_override_the_adapter() -> None:
    extra = {"reasoning_effort": "low", "model": "evil", "messages": []}
    async with running("openai", [RICH]) as (fake, llm):
        await llm.query(history(), [ECHO], None, extra)
    body = fake.requests[0].json()
    assert body["reasoning_effort"] == "low"
    assert body["model"] == "gpt-5-mini" and len(body["messages"]) == 4


# -- responses --------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_streamed_answer_equals_the_whole_one(provider: str) -> None:
    options = {"model": "m"} if provider == "ollama" else {}
    whole, streamed, events = await both(provider, RICH, **options)
    assert streamed == whole
    assert whole.content == RICH.text and whole.thinking == RICH.thinking
    assert whole.stop_reason == "tool_use"
    (call,) = whole.tool_calls
    assert call.name == "echo" and dict(call.arguments) == {"text": "hi", "nested": {"a": [1, 2]}}
    assert call.raw_arguments is None
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    thinking = "".join(e.text for e in events if isinstance(e, ThinkingDelta))
    assert text == RICH.text and thinking == RICH.thinking
    calls = [e for e in events if isinstance(e, ToolCallEvent)]
    assert [c.final for c in calls] == [False, True]
    assert calls[0].call_id == calls[1].call_id == call.id
    assert calls[1].arguments == call.arguments  # the finalized arguments are authoritative
    assert len([e for e in events if isinstance(e, TextDelta)]) > 1  # really streamed


async def test_usage_is_normalized_per_provider() -> None:
    for provider in ("openai", "anthropic", "gemini"):
        whole, streamed, _ = await both(provider, RICH)
        assert whole.usage == streamed.usage
        assert whole.usage.prompt_tokens == 120, provider  # cached tokens included
        assert whole.usage.completion_tokens == 30, provider
        assert whole.usage.cached_tokens == 40, provider
    openai, _, _ = await both("openai", RICH)
    assert openai.usage.reasoning_tokens == 12
    gemini, _, _ = await both("gemini", RICH)
    assert gemini.usage.reasoning_tokens == 12
    anthropic, _, _ = await both(
        "anthropic", Answer(text="x", cached_tokens=40, cache_write_tokens=20)
    )
    assert anthropic.usage.cache_write_tokens == 20 and anthropic.usage.prompt_tokens == 11


@pytest.mark.parametrize("provider", ("openai", "anthropic", "gemini"))
async def test_stop_reasons(provider: str) -> None:
    plain, _, _ = await both(provider, Answer(text="done"))
    cut, cut_streamed, _ = await both(provider, Answer(text="trunc", stop="length"))
    assert plain.stop_reason == "end_turn"
    assert cut.stop_reason == cut_streamed.stop_reason == "max_tokens"


async def test_provider_and_model_are_recorded() -> None:
    for provider in ("openai", "anthropic", "gemini", "openrouter"):
        whole, _, _ = await both(provider, Answer(text="hi"))
        assert whole.provider == provider
        assert whole.model and whole.metadata["requested_model"]


@pytest.mark.parametrize("provider", ("openai", "anthropic", "openrouter"))
async def test_unparsable_arguments_are_kept_raw_never_reencoded(provider: str) -> None:
    broken = Answer(calls=(Call("echo", '{"text": "unterminated'),))
    whole, streamed, events = await both(provider, broken)
    (call,) = streamed.tool_calls
    assert call.arguments == {} and call.raw_arguments == '{"text": "unterminated'
    assert events[-1].final and events[-1].arguments == '{"text": "unterminated'
    if provider != "anthropic":  # Anthropic's non-streamed input is always an object
        assert whole.tool_calls == streamed.tool_calls


async def test_a_dict_stays_a_dict_and_a_string_is_parsed_once() -> None:
    nested = {"text": '{"not": "decoded again"}'}
    whole, streamed, _ = await both("openai", Answer(calls=(Call("echo", nested),)))
    assert dict(whole.tool_calls[0].arguments) == nested == dict(streamed.tool_calls[0].arguments)
    gemini, _, _ = await both("gemini", Answer(calls=(Call("echo", nested),)))
    assert dict(gemini.tool_calls[0].arguments) == nested


async def test_gemini_call_ids_are_stable_and_distinct() -> None:
    two = Answer(calls=(Call("echo", {"text": "a"}), Call("echo", {"text": "b"})))
    whole, streamed, _ = await both("gemini", two)
    ids = [c.id for c in whole.tool_calls]
    assert ids == [c.id for c in streamed.tool_calls]
    assert len(set(ids)) == 2 and all(i.startswith("call_") for i in ids)
    async with running("gemini", [two, two]) as (_, llm):
        first = await llm.query(history(), [ECHO])
        second = await llm.query(history(), [ECHO])
    assert not {c.id for c in first.tool_calls} & {c.id for c in second.tool_calls}


async def test_think_tags_of_local_servers_become_thinking() -> None:
    tagged = Answer(text="<think>Let me consider.\nCarefully.</think>\n\nThe answer is 4.")
    whole, streamed, events = await both(
        "ollama", tagged, model="deepseek-r1", compat={"thinking_format": "think_tags"}
    )
    assert whole == streamed
    assert whole.content == "The answer is 4."
    assert whole.thinking == "Let me consider.\nCarefully."
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "The answer is 4."
    thinking = "".join(e.text for e in events if isinstance(e, ThinkingDelta))
    assert thinking == "Let me consider.\nCarefully."


async def test_mistral_id_constraints_project_ids_in_requests() -> None:
    async with running("ollama", [RICH], model="mistral", compat={"tool_ids": "mistral"}) as (
        fake,
        llm,
    ):
        await llm.query(history(), [ECHO])
    messages = fake.requests[0].json()["messages"]
    wire_id = messages[2]["tool_calls"][0]["id"]
    assert len(wire_id) == 9 and wire_id.isalnum()
    assert messages[3]["tool_call_id"] == wire_id


async def test_switching_provider_mid_history_keeps_tool_pairing_valid() -> None:
    """A history made with one provider's ids is valid for every other provider."""
    anthropic_history = [
        Message("user", "go"),
        Message("assistant", None, tool_calls=(ToolCall("toolu_01XYZ", "echo", {"text": "a"}),)),
        Message("tool", "a", tool_call_id="toolu_01XYZ", name="echo"),
        Message("user", "and again"),
    ]
    for provider in ("openai", "anthropic", "gemini", "openrouter"):
        async with running(provider, [Answer(text="ok")]) as (fake, llm):
            response = await llm.query(anthropic_history, [ECHO])
        assert response.content == "ok", provider  # the fake validates pairing like the real API
        assert fake.requests[0].json()


def test_incremental_rendering_equals_a_full_render() -> None:
    """The adapters' render memo never changes what is sent (a turn renders O(new messages))."""
    from cantrip.llm._transcript import render_transcript
    from cantrip.llm.providers._render_memo import RenderCache

    for family in ("openai", "anthropic", "gemini", "mistral", "kimi"):
        cache = RenderCache(family, keep_thinking=False, size=2)  # type: ignore[arg-type]
        grown: list[Message] = [Message("system", "s"), Message("user", "u")]
        for i in range(6):
            call = ToolCall(f"call_{i}", "echo", {"text": str(i)})
            grown += [Message("assistant", f"t{i}", tool_calls=(call,), thinking="x")]
            if i != 3:  # one call left without a result: a synthetic completion
                grown.append(Message("tool", str(i), tool_call_id=call.id, name="echo"))
            if i == 4:
                grown.append(Message("user", "more"))
            snapshot = list(grown)
            full = render_transcript(snapshot, family, keep_thinking=False)
            cached = cache.render(snapshot)
            assert list(cached.messages) == list(full.messages), (family, i)
            assert dict(cached.id_map) == dict(full.id_map)
        folded = [grown[0], grown[1], Message("user", "summary"), *grown[-3:]]
        assert list(cache.render(folded).messages) == list(
            render_transcript(folded, family, keep_thinking=False).messages
        )
        other = [Message("user", "another entity")]
        assert list(cache.render(other).messages) == [other[0]]
        assert len(cache._memos) == 2


def test_the_render_memo_serves_hundreds_of_interleaved_conversations_incrementally() -> None:
    """One adapter serves every session of a server: 300 conversations, each growing
    by a turn in turn, are each rendered afresh once and then only extended."""
    from cantrip.llm._transcript import render_transcript
    from cantrip.llm.providers._render_memo import RenderCache

    cache = RenderCache("openai", keep_thinking=False)
    system = Message("system", "shared by all")  # one object in every conversation
    talks: list[list[Message]] = [[system, Message("user", f"task {n}")] for n in range(300)]
    renderers: dict[int, Any] = {}
    for turn in range(4):
        for n, talk in enumerate(talks):
            if turn:
                call = ToolCall(f"call_{n}_{turn}", "echo", {"text": str(turn)})
                talk += [
                    Message("assistant", None, tool_calls=(call,)),
                    Message("tool", str(turn), tool_call_id=call.id, name="echo"),
                ]
            rendered = cache.render(list(talk))
            if n % 50 == 0:
                full = render_transcript(list(talk), "openai", keep_thinking=False)
                assert list(rendered.messages) == list(full.messages), (n, turn)
            memo = cache._memos[id(talk[-1])]
            assert renderers.setdefault(n, memo.renderer) is memo.renderer, (n, turn)
    assert len(cache._memos) == 300


def test_the_render_memo_drops_the_least_recently_used_conversation() -> None:
    from cantrip.llm.providers._render_memo import RenderCache

    cache = RenderCache("openai", keep_thinking=False, size=3)
    talks = [[Message("user", f"u{n}")] for n in range(4)]
    for talk in talks[:3]:
        cache.render(talk)
    cache.render(talks[0])  # used again: now the most recent
    cache.render(talks[3])  # a fourth: the least recently used (talks[1]) goes
    assert set(cache._memos) == {id(talks[0][0]), id(talks[2][0]), id(talks[3][0])}


def test_request_bodies_are_the_standard_librarys_bytes_and_keep_what_orjson_refuses() -> None:
    """The body encoder (orjson) writes what ``json.dumps`` wrote, and the values
    orjson refuses still go out exactly (lone surrogates as escapes, big integers)."""
    from cantrip.llm.providers._base import dumps

    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": 'é \u2028 \x1f " \\ / 日本 🎉'},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "n": 1.5e16}]},
        ],
        "temperature": 0.1,
        "seed": 2**63 - 1,
        "stream": True,
    }
    standard = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    assert dumps(body) == standard
    odd = {"content": "bad \ud800 text", "big": 2**80, "nested": {"1": [1.0]}}
    sent = dumps(odd)
    assert json.loads(sent) == odd and b"\\ud800" in sent and str(2**80).encode() in sent
    assert json.loads(dumps({1: "int key"})) == {"1": "int key"}  # as json.dumps did
