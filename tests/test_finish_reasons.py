"""Why an answer ended, per provider adapter, streamed and not (issue 22).

Each fake provider sends its own documented finish/stop reason on the wire
(OpenAI ``finish_reason``, Anthropic ``stop_reason``, Gemini ``finishReason``);
these tests check what the adapter makes of it: a token-limit cut-off is
``max_tokens`` with its partial text, a call whose arguments the limit cut is
marked ``cut_off``, a refusal is a ``refusal`` error naming the provider's
reason, and a reason nobody documents is an error that is logged -- never
``end_turn``.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from fake_providers import PROVIDERS, Answer, Call, isolate, running

from cantrip import ProviderError
from cantrip.llm import Message, Response
from cantrip.llm._finish import (
    TOKEN_LIMIT,
    answer,
    failure,
    mark_cut_off,
    refusal,
    resolve_finish,
    transient,
)
from cantrip.llm._openai_chat import FINISH_REASONS as OPENAI_REASONS
from cantrip.llm.providers.anthropic import STOP_REASONS as ANTHROPIC_REASONS
from cantrip.llm.providers.gemini import FINISH_REASONS as GEMINI_REASONS

HELLO = [Message("user", "Tell me a long story.")]
CUT_TEXT = "The story is about a"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    isolate(monkeypatch, tmp_path)


def options(provider: str) -> dict[str, Any]:
    return {"model": "llama3.1:8b"} if provider == "ollama" else {}


async def _answer(llm: Any, stream: bool) -> Response:
    if stream:
        return await llm.stream(HELLO, on_event=lambda e: None)  # type: ignore[no-any-return]
    return await llm.query(HELLO)  # type: ignore[no-any-return]


async def ask(provider: str, reply: Answer, *, stream: bool) -> Response:
    async with running(provider, [reply], **options(provider)) as (_, llm):
        return await _answer(llm, stream)


async def refused(provider: str, reply: Answer, *, stream: bool) -> ProviderError:
    async with running(provider, [reply], **options(provider)) as (_, llm):
        with pytest.raises(ProviderError) as info:
            await _answer(llm, stream)
    return info.value


# -- the token limit ----------------------------------------------------------------------


@pytest.mark.parametrize("stream", (False, True), ids=("whole", "streamed"))
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_text_cut_by_the_token_limit_is_max_tokens_with_its_partial_text(
    provider: str, stream: bool
) -> None:
    response = await ask(provider, Answer(text=CUT_TEXT, stop="length"), stream=stream)
    assert response.stop_reason == "max_tokens"
    assert response.content == CUT_TEXT
    assert response.validate() is response


@pytest.mark.parametrize("stream", (False, True), ids=("whole", "streamed"))
@pytest.mark.parametrize("provider", ("openai", "openrouter", "ollama", "anthropic"))
async def test_tool_arguments_cut_by_the_token_limit_mark_the_call(
    provider: str, stream: bool
) -> None:
    cut_args = '{"text": "the beginning of a very long argu'
    reply = Answer(
        calls=(Call("echo", {"text": "complete"}), Call("echo", cut_args)), stop="length"
    )
    response = await ask(provider, reply, stream=stream)
    assert response.stop_reason == "max_tokens"
    first, second = response.tool_calls
    # Only the call the limit ended inside is cut; a complete call before it is not.
    assert (first.cut_off, dict(first.arguments)) == (False, {"text": "complete"})
    assert second.cut_off is True
    if provider != "anthropic" or stream:
        # Text arguments show the cut: they are kept as they arrived.
        assert second.raw_arguments == cut_args


@pytest.mark.parametrize("stream", (False, True), ids=("whole", "streamed"))
async def test_gemini_object_arguments_take_the_last_call_as_cut(stream: bool) -> None:
    # Gemini sends arguments as an object, so a cut cannot be seen in them: the last
    # call of a MAX_TOKENS answer is never run.
    reply = Answer(
        calls=(Call("echo", {"text": "one"}), Call("echo", {"text": "tw"})), stop="length"
    )
    response = await ask("gemini", reply, stream=stream)
    assert response.stop_reason == "max_tokens"
    assert [c.cut_off for c in response.tool_calls] == [False, True]


@pytest.mark.parametrize("stream", (False, True), ids=("whole", "streamed"))
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_complete_answer_is_not_cut(provider: str, stream: bool) -> None:
    reply = Answer(text="Done.", calls=(Call("echo", {"text": "x"}),))
    response = await ask(provider, reply, stream=stream)
    assert response.stop_reason == "tool_use"
    assert [c.cut_off for c in response.tool_calls] == [False]
    plain = await ask(provider, Answer(text="Done."), stream=stream)
    assert plain.stop_reason == "end_turn"


# -- refusals -------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", (False, True), ids=("whole", "streamed"))
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_content_filter_or_refusal_is_an_error_naming_the_provider_reason(
    provider: str, stream: bool
) -> None:
    error = await refused(provider, Answer(text="I can't help", stop="filtered"), stream=stream)
    assert error.code == "refusal" and error.retryable is False
    assert error.message.startswith(f"{provider}: the provider refused to answer")
    reason = {"anthropic": "refusal", "gemini": "SAFETY"}.get(provider, "content_filter")
    assert reason in error.message
    if provider == "gemini":  # the categories that fired, from safetyRatings
        assert "HARM_CATEGORY_DANGEROUS_CONTENT" in error.message
        assert "HARASSMENT" not in error.message  # not blocked, not named
    if provider == "anthropic":  # what the model said when it declined
        assert "I can't help" in error.message


async def test_an_openai_refusal_message_is_an_error_with_its_text() -> None:
    from cantrip.llm import parse_chat_completion

    payload = {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, "refusal": "I won't do that."},
                "finish_reason": "stop",
            }
        ]
    }
    with pytest.raises(ProviderError, match="refused to answer: I won't do that") as info:
        parse_chat_completion(payload)
    assert info.value.code == "refusal"


# -- unknown and other reasons ---------------------------------------------------------------


@pytest.mark.parametrize("stream", (False, True), ids=("whole", "streamed"))
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_an_unknown_finish_reason_is_logged_and_an_error(
    provider: str, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="cantrip.llm.finish")
    error = await refused(provider, Answer(text="Hm.", finish="brand_new_reason"), stream=stream)
    assert error.code == "unknown_finish_reason" and error.retryable is False
    assert "'brand_new_reason'" in error.message
    assert any("brand_new_reason" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("stream", (False, True), ids=("whole", "streamed"))
async def test_a_malformed_gemini_function_call_is_retryable(stream: bool) -> None:
    error = await refused(
        "gemini", Answer(text="", finish="MALFORMED_FUNCTION_CALL"), stream=stream
    )
    assert error.retryable is True and error.code == "finish_malformed_function_call"


async def test_anthropic_context_window_exceeded_is_a_cut_off() -> None:
    reply = Answer(text="Runaway text", finish="model_context_window_exceeded")
    for stream in (False, True):
        assert (await ask("anthropic", reply, stream=stream)).stop_reason == "max_tokens"


async def test_a_missing_finish_reason_is_read_from_the_answer() -> None:
    # Lenient local servers (and scripted payloads) may leave it out: not an unknown reason.
    assert resolve_finish("x", None, {}, has_calls=True) == "tool_use"
    assert resolve_finish("x", None, {}, has_calls=False) == "end_turn"


def test_every_table_entry_resolves_to_a_stop_reason_or_the_error_it_declares() -> None:
    kinds = {"answer", "token_limit", "refusal", "transient", "failure"}
    for table in (OPENAI_REASONS, ANTHROPIC_REASONS, GEMINI_REASONS):
        for reason, finish in table.items():
            assert finish.kind in kinds
            if finish.kind in ("answer", "token_limit"):
                stop = resolve_finish("p", reason, table, has_calls=False)
                assert stop == (finish.stop if finish.kind == "answer" else "max_tokens")
            else:
                with pytest.raises(ProviderError) as info:
                    resolve_finish("p", reason, table, has_calls=False)
                assert info.value.retryable is (finish.kind == "transient")
                assert reason in info.value.message and finish.why in info.value.message


def test_the_documented_reasons_are_all_mapped() -> None:
    # OpenAI: https://platform.openai.com/docs/api-reference/chat/object
    assert {"stop", "length", "tool_calls", "content_filter", "function_call"} <= set(
        OPENAI_REASONS
    )
    # Anthropic: https://docs.anthropic.com/en/api/messages (stop_reason)
    assert set(ANTHROPIC_REASONS) == {
        "end_turn",
        "max_tokens",
        "stop_sequence",
        "tool_use",
        "pause_turn",
        "refusal",
        "model_context_window_exceeded",
    }
    # Gemini: https://ai.google.dev/api/generate-content#FinishReason
    assert {
        "FINISH_REASON_UNSPECIFIED",
        "STOP",
        "MAX_TOKENS",
        "SAFETY",
        "RECITATION",
        "LANGUAGE",
        "OTHER",
        "BLOCKLIST",
        "PROHIBITED_CONTENT",
        "SPII",
        "MALFORMED_FUNCTION_CALL",
        "IMAGE_SAFETY",
        "UNEXPECTED_TOOL_CALL",
        "TOO_MANY_TOOL_CALLS",
    } <= set(GEMINI_REASONS)


def test_a_new_adapter_declares_its_own_table() -> None:
    """How an adapter for another API (e.g. Responses) uses the shared piece."""
    table = {
        "completed": answer("end_turn"),
        "max_output_tokens": TOKEN_LIMIT,
        "content_filter": refusal("filtered"),
        "server_busy": transient("busy"),
        "failed": failure("failed"),
    }
    assert resolve_finish("responses", "max_output_tokens", table, has_calls=False) == (
        "max_tokens"
    )
    with pytest.raises(ProviderError, match="refused"):
        resolve_finish("responses", "content_filter", table, has_calls=False)
    from cantrip.llm import ToolCall

    calls = (ToolCall("a", "echo", {"text": "x"}), ToolCall("b", "echo", raw_arguments='{"te'))
    marked = mark_cut_off(calls, "max_tokens", arguments_as_text=True)
    assert [c.cut_off for c in marked] == [False, True]
    assert mark_cut_off(calls, "end_turn", arguments_as_text=True) == calls
