"""Resilience inside one turn: fallback chains, shared rate limits, telemetry."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
import trio
from fake_providers import Answer, Fault, isolate, running

import cantrip
from cantrip import InvalidResponseError, ProviderError, ScriptedLLM
from cantrip.llm import (
    FallbackLLM,
    Message,
    Pricing,
    RateLimitedLLM,
    RetryPolicy,
    TelemetryLLM,
    TokenBucket,
    Usage,
)
from cantrip.llm._ratelimit import clear_buckets, shared_bucket
from cantrip.llm._stream import MessageStart, TextDelta
from gates import done, echo

HELLO = [Message("user", "hello")]
FAST = RetryPolicy(max_retries=2, base_delay=0.01, max_delay=0.02, jitter=0.0)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    isolate(monkeypatch, tmp_path)


def failing(status: int, message: str = "down") -> ScriptedLLM:
    return ScriptedLLM([{"error": {"status": status, "message": message}}] * 5, name=f"bad{status}")


# -- fallback ------------------------------------------------------------------------------


async def test_fallback_answers_from_the_next_provider_and_says_who() -> None:
    async with (
        running("openai", [Fault(500, "primary down")]) as (primary_fake, primary),
        running("anthropic", [Answer(text="from claude")]) as (_, backup),
    ):
        response = await FallbackLLM([primary, backup]).query(HELLO)
    assert response.content == "from claude"
    assert response.provider == "anthropic" and response.model == "claude-sonnet-5-5"
    assert response.metadata["answered_by"] == "anthropic:claude-sonnet-5-5"
    assert response.metadata["fallback_index"] == 1
    assert "primary down" in response.metadata["fallback_errors"][0]
    assert len(primary_fake.requests) == 1


async def test_with_member_retries_a_member_fails_for_good_before_the_next_is_tried() -> None:
    async with (
        running("gemini", [Fault(503), Fault(503), Answer(text="third time")]) as (fake, gemini),
        running("openai", [Answer(text="unused")]) as (backup_fake, backup),
    ):
        response = await FallbackLLM([gemini, backup], retry=FAST).query(HELLO)
    assert response.content == "third time" and response.metadata["fallback_index"] == 0
    assert response.metadata["attempts"] == 3
    assert len(fake.requests) == 3 and not backup_fake.requests


async def test_a_final_error_moves_on_at_once() -> None:
    async with running("openai", [Answer(text="backup")]) as (_, backup):
        chain = FallbackLLM([failing(401), backup], retry=FAST)
        response = await chain.query(HELLO)
    assert response.content == "backup" and chain.chain[0].remaining == 4  # type: ignore[attr-defined]


async def test_an_invalid_answer_moves_on() -> None:
    empty = ScriptedLLM([{"content": ""}], name="empty")
    good = ScriptedLLM([{"content": "fine"}], name="good")
    response = await FallbackLLM([empty, good]).query(HELLO)
    assert response.content == "fine"
    assert "neither content nor tool_calls" in response.metadata["fallback_errors"][0]


async def test_an_exhausted_chain_names_every_failure() -> None:
    with pytest.raises(ProviderError) as info:
        await FallbackLLM([failing(503, "busy"), failing(400, "bad")]).query(HELLO)
    error = info.value
    assert "all 2 LLMs" in error.message and "busy" in error.message and "bad" in error.message
    assert error.status == 503 and error.retryable is True  # the outage may pass
    with pytest.raises(ProviderError) as final:
        await FallbackLLM([failing(401), failing(400)]).query(HELLO)
    assert final.value.retryable is False


async def test_fallback_streams_and_restarts_the_message() -> None:
    events: list[Any] = []
    async with (
        running("openai", [Fault(502)]) as (_, primary),
        running("anthropic", [Answer(text="streamed from the backup")]) as (_, backup),
    ):
        response = await FallbackLLM([primary, backup]).stream(HELLO, on_event=events.append)
    assert response.content == "streamed from the backup"
    assert [e.attempt for e in events if isinstance(e, MessageStart)] == [2]
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == response.content


def test_chain_length_is_bounded() -> None:
    with pytest.raises(cantrip.ConstructionError):
        FallbackLLM([])
    with pytest.raises(cantrip.ConstructionError):
        FallbackLLM([ScriptedLLM([])] * 11)


async def test_a_cast_over_a_fallback_chain_records_one_turn_per_answer() -> None:
    async with running("openai", [Answer(text="done by backup")]) as (_, backup):
        spell = cantrip.Cantrip(
            llm=FallbackLLM([failing(500), backup]),
            identity=cantrip.Identity(),
            circle=cantrip.Circle([done, echo], [cantrip.max_turns(3)]),
            retry=FAST,
        )
        outcome = await spell.cast_async("go")
    assert outcome.result == "done by backup" and len(outcome.turns) == 1
    assert outcome.turns[0].metadata.provider == "openai"


async def test_fallback_rejects_invalid_answers_before_the_loop() -> None:
    with pytest.raises(ProviderError) as info:
        await FallbackLLM([ScriptedLLM([{"content": None}])]).query(HELLO)
    assert isinstance(info.value.__cause__, InvalidResponseError)


# -- rate limiting -------------------------------------------------------------------------


def test_token_bucket_math() -> None:
    now = [0.0]
    bucket = TokenBucket(rate=2.0, burst=3, clock=lambda: now[0])
    assert [bucket.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.reserve() == pytest.approx(0.5)
    assert bucket.reserve() == pytest.approx(1.0)  # callers queue in arrival order
    now[0] = 10.0
    assert bucket.available == 3.0  # never more than the burst
    bucket.refund()
    assert bucket.available == 3.0
    with pytest.raises(cantrip.ConstructionError):
        TokenBucket(0, 1)


def test_buckets_are_shared_per_key_and_tighten() -> None:
    clear_buckets()
    first = shared_bucket("openai:OPENAI_API_KEY", 600)
    second = shared_bucket("openai:OPENAI_API_KEY", 60, burst=2)
    assert first is second and first.rate == 1.0 and first.burst == 2.0
    assert shared_bucket("anthropic:ANTHROPIC_API_KEY", 600) is not first


async def test_rate_limited_llms_share_one_bucket_and_log_waits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    answers = [Answer(text=str(i)) for i in range(4)]
    async with running("openai", answers) as (fake, llm):
        # one request per 0.5 s: wide enough that a loaded machine's scheduling
        # delays cannot let a token refill before a waiting request asks for it
        a = RateLimitedLLM(llm, requests_per_minute=120, burst=1)
        b = RateLimitedLLM(llm, requests_per_minute=120, burst=1)
        assert a.bucket is b.bucket and a.key == "openai:OPENAI_API_KEY"
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="cantrip.llm.ratelimit"):
            async with trio.open_nursery() as nursery:
                for limited in (a, b, a, b):
                    nursery.start_soon(limited.query, HELLO)
        elapsed = time.monotonic() - started
    assert len(fake.requests) == 4
    assert elapsed >= 1.4  # three waits of 0.5 s behind the first request
    waits = [r for r in caplog.records if "waiting" in r.getMessage()]
    assert len(waits) == 3 and "openai:OPENAI_API_KEY" in waits[0].getMessage()


async def test_a_cancelled_wait_gives_its_token_back() -> None:
    limited = RateLimitedLLM(ScriptedLLM([{"content": "x"}]), 60, burst=1, key="refund-test")
    limited.bucket.reserve()  # empty now; the next request waits ~1 s
    with trio.move_on_after(0.05):
        await limited.query(HELLO)
    assert limited.bucket.available > -0.5  # the cancelled reservation was refunded


# -- telemetry ------------------------------------------------------------------------------


def test_pricing_counts_cache_reads_and_writes() -> None:
    price = Pricing(input=3.0, output=15.0, cache_read=0.3, cache_write=3.75)
    usage = Usage(prompt_tokens=1_000_000, completion_tokens=100_000, cached_tokens=400_000)
    assert price.cost(usage) == pytest.approx(0.6 * 3 + 0.4 * 0.3 + 0.1 * 15)
    written = Usage(prompt_tokens=1_000_000, cache_write_tokens=1_000_000)
    assert price.cost(written) == pytest.approx(3.75)


async def test_telemetry_logs_audit_metadata_and_cost_not_content(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-proj-supersecretvalue123")
    secret_answer = Answer(
        text="the launch code is 0000", prompt_tokens=1000, completion_tokens=500
    )
    async with running("openai", [secret_answer], key="sk-proj-supersecretvalue123") as (_, llm):
        with caplog.at_level(logging.DEBUG, logger="cantrip.llm.telemetry"):
            await TelemetryLLM(llm).query([Message("user", "what is the launch code?")])
    (record,) = caplog.records
    data = record.telemetry  # type: ignore[attr-defined]
    assert data["provider"] == "openai" and data["model"] == "gpt-5-mini"
    assert data["prompt_tokens"] == 1000 and data["completion_tokens"] == 500
    assert data["cost_usd"] == pytest.approx((1000 * 0.25 + 500 * 2.00) / 1e6)  # gpt-5-mini
    assert data["status"] == "ok" and data["stop_reason"] == "end_turn"
    assert data["message_count"] == 1 and data["content_length"] == len(secret_answer.text or "")
    assert data["duration_ms"] > 0
    logged = caplog.text
    assert "launch code" not in logged and "supersecretvalue" not in logged


async def test_telemetry_content_is_double_opt_in(caplog: pytest.LogCaptureFixture) -> None:
    llm = ScriptedLLM([{"content": "visible answer"}] * 2)
    with caplog.at_level(logging.INFO, logger="cantrip.llm.telemetry"):
        await TelemetryLLM(llm, include_content=True).query(HELLO)
    assert "visible answer" not in caplog.text  # DEBUG is off
    with caplog.at_level(logging.DEBUG, logger="cantrip.llm.telemetry"):
        await TelemetryLLM(llm, include_content=True).query(HELLO)
    assert "visible answer" in caplog.text


async def test_telemetry_prefers_a_reported_cost_and_logs_failures(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with running("openrouter", [Answer(text="x"), Fault(429)]) as (_, llm):
        with caplog.at_level(logging.INFO, logger="cantrip.llm.telemetry"):
            watched = TelemetryLLM(llm)
            await watched.query(HELLO)
            with pytest.raises(ProviderError):
                await watched.query(HELLO)
    ok, failed = (r.telemetry for r in caplog.records)  # type: ignore[attr-defined]
    assert ok["cost_usd"] == pytest.approx(0.000123)
    assert failed["status"] == "error" and failed["error_status"] == 429
    assert failed["error_type"] == "ProviderError"


async def test_unknown_prices_give_no_cost(caplog: pytest.LogCaptureFixture) -> None:
    async with running("ollama", [Answer(text="x")], model="llama3.1:8b") as (_, llm):
        with caplog.at_level(logging.INFO, logger="cantrip.llm.telemetry"):
            await TelemetryLLM(llm).query(HELLO)
    assert caplog.records[0].telemetry["cost_usd"] is None  # type: ignore[attr-defined]


async def test_telemetry_sits_above_the_retries_of_a_turn(
    caplog: pytest.LogCaptureFixture, autojump_clock: Any
) -> None:
    """The stack is telemetry -> retry -> ... : one record per turn, retries inside it."""
    import cantrip
    from gates import done

    llm = ScriptedLLM(
        [
            {"error": {"status": 503, "message": "overloaded"}},
            {"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]},
        ]
    )
    spell = cantrip.Cantrip(
        llm=TelemetryLLM(llm),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done], [cantrip.max_turns(3)]),
    )
    with caplog.at_level(logging.INFO, logger="cantrip.llm.telemetry"):
        outcome = await spell.cast_async("go")
    records = [r for r in caplog.records if r.name == "cantrip.llm.telemetry"]
    assert len(records) == 1 and records[0].telemetry["status"] == "ok"  # type: ignore[attr-defined]
    assert outcome.result == "ok" and outcome.turns[0].metadata.attempts == 2
