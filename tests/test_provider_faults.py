"""Fault injection against the fake providers: what a real outage looks like on the wire.

429 with Retry-After, bursts of 5xx, timeouts, a connection dropped
mid-stream, malformed JSON, garbage SSE lines, error events mid-stream (seed
000's precedence), empty answers (LLM-3) and duplicate tool ids (LLM-4).
"""

from __future__ import annotations

import email.utils
import logging
import time
from typing import Any

import pytest
import trio
from fake_providers import (
    Answer,
    Blank,
    Call,
    Drop,
    Fault,
    Garbage,
    Malformed,
    Raw,
    Stall,
    StreamError,
    isolate,
    running,
)

import cantrip
from cantrip import InvalidResponseError, ProviderError
from cantrip.llm import Message, RetryingLLM, RetryPolicy, load_llm
from cantrip.llm._stream import MessageStart, TextDelta
from gates import done, echo

HELLO = [Message("user", "hello")]
FAST = RetryPolicy(max_retries=3, base_delay=0.01, max_delay=0.05, jitter=0.0)
ANSWER = Answer(text="Hello back, with a longer answer to stream.")


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    isolate(monkeypatch, tmp_path)


async def fails(coro: Any) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        await coro
    return info.value


# -- HTTP status errors ---------------------------------------------------------------------


@pytest.mark.parametrize("provider", ("openai", "anthropic", "gemini", "openrouter"))
async def test_429_with_retry_after_is_retryable_and_carries_the_wait(provider: str) -> None:
    fault = Fault(429, "slow down", headers={"retry-after": "7"})
    async with running(provider, [fault]) as (_, llm):
        error = await fails(llm.query(HELLO))
    assert error.status == 429 and error.retryable is True and error.retry_after == 7.0
    assert "slow down" in error.message and error.message.startswith(provider)
    expected = {
        "openai": "rate_limit_exceeded",
        "openrouter": "rate_limit_exceeded",
        "anthropic": "rate_limit_error",
        "gemini": "RESOURCE_EXHAUSTED",
    }[provider]
    assert error.code == expected


async def test_retry_after_forms() -> None:
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    script = [
        Fault(429, headers={"retry-after-ms": "1500"}),
        Fault(503, headers={"retry-after": when}),
    ]
    async with running("openai", script) as (_, llm):
        first = await fails(llm.query(HELLO))
        second = await fails(llm.query(HELLO))
    assert first.retry_after == 1.5
    assert second.retry_after is not None and 25 < second.retry_after <= 30
    google = Raw(
        429,
        b'{"error": {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED", '
        b'"details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", '
        b'"retryDelay": "23s"}]}}',
        {"content-type": "application/json"},
    )
    async with running("gemini", [google]) as (_, llm):
        error = await fails(llm.query(HELLO))
    assert error.retry_after == 23.0 and error.code == "RESOURCE_EXHAUSTED"


@pytest.mark.parametrize("status", (500, 502, 503, 504, 529))
async def test_server_errors_are_retryable(status: int) -> None:
    async with running("anthropic", [Fault(status, "overloaded")]) as (_, llm):
        error = await fails(llm.query(HELLO))
    assert error.status == status and error.retryable is True


@pytest.mark.parametrize("status", (400, 401, 403, 404, 422))
async def test_other_client_errors_are_final(status: int) -> None:
    async with running("openai", [Fault(status, "no")]) as (_, llm):
        error = await fails(llm.query(HELLO))
    assert error.status == status and error.retryable is False


async def test_a_wrong_key_is_a_401_that_is_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "not-the-key")
    async with running("openai", [ANSWER]) as (fake, llm):
        error = await fails(RetryingLLM(llm, FAST).query(HELLO))
    assert error.status == 401 and len(fake.requests) == 1


async def test_a_burst_of_5xx_is_retried_inside_one_call() -> None:
    script = [Fault(503), Fault(502), Fault(500), ANSWER]
    async with running("gemini", script) as (fake, llm):
        response = await RetryingLLM(llm, FAST).query(HELLO)
    assert response.content == ANSWER.text
    assert response.metadata["attempts"] == 4 and len(fake.requests) == 4


async def test_context_length_errors_are_named_and_final() -> None:
    message = "prompt is too long: 210000 tokens > 200000 maximum"
    async with running("anthropic", [Fault(400, message, code="invalid_request_error")]) as (
        _,
        llm,
    ):
        error = await fails(llm.query(HELLO))
    assert error.code == "context_length_exceeded" and error.retryable is False
    assert "210000" in str(error)


# -- the network ------------------------------------------------------------------------------


async def test_a_stalled_provider_times_out_retryably() -> None:
    async with running("openai", [Stall(5.0)], timeout_s=0.3) as (_, llm):
        with trio.fail_after(4):
            error = await fails(llm.query(HELLO))
    assert error.code == "timeout" and error.retryable is True


async def test_a_stalled_stream_times_out_retryably() -> None:
    async with running("anthropic", [Stall(5.0)], timeout_s=0.3) as (_, llm):
        with trio.fail_after(4):
            error = await fails(llm.stream(HELLO, on_event=lambda e: None))
    assert error.code == "timeout" and error.retryable is True


async def test_nobody_listening_is_a_retryable_connect_error() -> None:
    with trio.socket.socket() as sock:  # a free loopback port, then closed: nobody listens
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    llm = load_llm("openai", base_url=f"http://127.0.0.1:{port}/v1")
    error = await fails(llm.query(HELLO))
    assert error.code == "connect_error" and error.retryable is True
    await llm.aclose()


@pytest.mark.parametrize("provider", ("openai", "anthropic", "gemini", "openrouter"))
async def test_a_connection_dropped_mid_stream_is_retryable(provider: str) -> None:
    events: list[Any] = []
    async with running(provider, [Drop(ANSWER, after_events=3)]) as (_, llm):
        error = await fails(llm.stream(HELLO, on_event=events.append))
    assert error.retryable is True
    assert error.code in ("stream_interrupted", "connection_error")


async def test_a_dropped_stream_is_retried_as_a_new_message() -> None:
    events: list[Any] = []
    async with running("openai", [Drop(ANSWER, after_events=4), ANSWER]) as (_, llm):
        response = await RetryingLLM(llm, FAST).stream(HELLO, on_event=events.append)
    assert response.content == ANSWER.text
    starts = [e.attempt for e in events if isinstance(e, MessageStart)]
    assert starts == [1, 2]  # consumers discard what the first attempt streamed
    after = events[[i for i, e in enumerate(events) if isinstance(e, MessageStart)][1] :]
    assert "".join(e.text for e in after if isinstance(e, TextDelta)) == ANSWER.text


async def test_a_stream_that_ends_early_without_dropping_is_incomplete() -> None:
    cut = Raw(
        200,
        b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,'
        b'"delta":{"content":"Hel"},"finish_reason":null}]}\n\n',
        {"content-type": "text/event-stream"},
    )
    async with running("openai", [cut]) as (_, llm):
        error = await fails(llm.stream(HELLO, on_event=lambda e: None))
    assert error.code == "stream_incomplete" and error.retryable is True


# -- malformed answers --------------------------------------------------------------------------


@pytest.mark.parametrize("provider", ("openai", "anthropic", "gemini"))
async def test_malformed_json_is_a_retryable_provider_error(provider: str) -> None:
    async with running(provider, [Malformed(b"<html>502 Bad Gateway</html>")]) as (_, llm):
        error = await fails(llm.query(HELLO))
    assert error.code == "malformed_response" and error.retryable is True
    assert "not a JSON object" in error.message


async def test_an_error_page_instead_of_json_keeps_its_status() -> None:
    page = Raw(502, b"<html>Bad Gateway</html>", {"content-type": "text/html"})
    async with running("openai", [page]) as (_, llm):
        error = await fails(llm.query(HELLO))
    assert error.status == 502 and error.retryable is True and "Bad Gateway" in error.message


@pytest.mark.parametrize("provider", ("openai", "anthropic", "gemini", "openrouter"))
async def test_garbage_sse_lines_are_skipped(provider: str) -> None:
    answer = Answer(text="Clean text survives the noise.", calls=(Call("echo", {"text": "x"}),))
    async with running(provider, [answer]) as (_, llm):
        clean = await llm.stream(HELLO, on_event=lambda e: None)
    async with running(provider, [Garbage(answer)]) as (_, llm):
        noisy = await llm.stream(HELLO, on_event=lambda e: None)
    assert noisy == clean


@pytest.mark.parametrize("provider", ("openai", "anthropic", "gemini", "openrouter"))
async def test_an_event_with_empty_data_is_not_dispatched(provider: str) -> None:
    """``data:`` with nothing after it leaves the event's data buffer empty: by the SSE
    standard the event is not dispatched, so it is skipped like a comment -- not
    treated as a corrupt payload that costs a whole retried request (issue 29)."""
    answer = Answer(text="Blank events are not events.", calls=(Call("echo", {"text": "x"}),))
    async with running(provider, [answer]) as (_, llm):
        clean = await llm.stream(HELLO, on_event=lambda e: None)
    async with running(provider, [Blank(answer), answer]) as (fake, llm):
        blanked = await llm.stream(HELLO, on_event=lambda e: None)
    assert blanked == clean
    assert len(fake.requests) == 1  # no retry: nothing was corrupt


async def test_an_event_with_empty_data_is_not_a_skipped_payload_in_the_responses_adapter(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from fake_reasoning import running_reasoning

    caplog.set_level(logging.WARNING)
    answer = Answer(text="Blank events are not events.", calls=(Call("echo", {"text": "x"}),))
    async with running_reasoning("openai_responses", [answer]) as (_, llm):
        clean = await llm.stream(HELLO, on_event=lambda e: None)
    async with running_reasoning("openai_responses", [Blank(answer), answer]) as (fake, llm):
        blanked = await llm.stream(HELLO, on_event=lambda e: None)
    assert (blanked.content, blanked.tool_calls) == (clean.content, clean.tool_calls)
    assert len(fake.requests) == 1
    assert "not JSON" not in caplog.text  # never seen as a payload at all


async def test_a_server_that_answers_whole_when_asked_to_stream_still_streams_events() -> None:
    whole = Raw(
        200,
        b'{"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,'
        b'"message":{"role":"assistant","content":"all at once"},"finish_reason":"stop"}]}',
        {"content-type": "application/json"},
    )
    events: list[Any] = []
    async with running("openai", [whole]) as (_, llm):
        response = await llm.stream(HELLO, on_event=events.append)
    assert response.content == "all at once"
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["all at once"]


# -- errors inside a stream (seed 000) ------------------------------------------------------------


@pytest.mark.parametrize("provider", ("openai", "anthropic", "gemini", "openrouter"))
async def test_an_error_event_mid_stream_is_a_structured_provider_error(provider: str) -> None:
    fault = StreamError(ANSWER, after_events=2, message="overloaded", code="overloaded_error")
    async with running(provider, [fault]) as (_, llm):
        error = await fails(llm.stream(HELLO, on_event=lambda e: None))
    assert error.code == "overloaded_error" and "overloaded" in error.message
    assert error.retryable is True


async def test_the_explicit_error_event_wins_over_the_done_level_error() -> None:
    both = StreamError(ANSWER, after_events=2, code="rate_limit_exceeded", finish_error=True)
    async with running("openrouter", [both]) as (_, llm):
        error = await fails(llm.stream(HELLO, on_event=lambda e: None))
    assert error.code == "rate_limit_exceeded"


async def test_a_done_level_error_is_used_when_there_is_no_error_event() -> None:
    done_only = StreamError(ANSWER, after_events=2, explicit=False, finish_error=True)
    async with running("openrouter", [done_only]) as (_, llm):
        error = await fails(llm.stream(HELLO, on_event=lambda e: None))
    assert error.code == "done_error" and error.message == "done-level error"


async def test_a_bare_error_finish_reason_gets_a_synthesized_error() -> None:
    bare = Raw(
        200,
        b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,'
        b'"delta":{},"finish_reason":"error"}]}\n\ndata: [DONE]\n\n',
        {"content-type": "text/event-stream"},
    )
    async with running("openai", [bare]) as (_, llm):
        error = await fails(llm.stream(HELLO, on_event=lambda e: None))
    assert error.code == "error" and "ended the response with an error" in error.message


# -- the contract: LLM-3 and LLM-4 through a whole cast -----------------------------------------


def spell(llm: Any) -> cantrip.Cantrip:
    return cantrip.Cantrip(
        llm=llm,
        identity=cantrip.Identity(system_prompt="test"),
        circle=cantrip.Circle([done, echo], [cantrip.max_turns(4)]),
        retry=FAST,
    )


@pytest.mark.parametrize("provider", ("openai", "anthropic", "gemini"))
async def test_an_empty_answer_ends_the_cast_as_invalid(provider: str) -> None:
    async with running(provider, [Answer(text=None)]) as (_, llm):
        with pytest.raises(InvalidResponseError, match="neither content nor tool_calls"):
            await spell(llm).cast_async("say something")


@pytest.mark.parametrize("provider", ("openai", "anthropic"))
async def test_duplicate_tool_ids_end_the_cast_as_invalid(provider: str) -> None:
    twins = Answer(
        calls=(Call("echo", {"text": "a"}, id="dup"), Call("echo", {"text": "b"}, id="dup"))
    )
    for stream in (False, True):
        async with running(provider, [twins]) as (_, llm):
            sink = (lambda e: None) if stream else None
            with pytest.raises(InvalidResponseError, match="duplicate tool call ID"):
                await spell(llm).cast_async("call twice", on_event=sink)


async def test_transient_failures_after_retries_stay_in_the_loop() -> None:
    script = [Fault(503)] * 4 + [Answer(calls=(Call("done", {"answer": "made it"}),))]
    async with running("openai", script) as (_, llm):
        outcome = await spell(llm).cast_async("persist")
    assert outcome.result == "made it"
    assert outcome.turns[0].is_error and "503" in outcome.turns[0].observation
