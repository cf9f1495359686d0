"""A 200 that is not a whole answer is a transient provider fault, retried inside the turn.

Three shapes, for every adapter (issue 23 part 2; issue 13 item 6):

* a corrupted chunk in the middle of an SSE stream (a ``data:`` line that is
  not JSON) -- it used to be skipped, and the turn recorded without its text;
* a non-streamed body cut short (half a JSON object) with a clean end;
* a stream that ends cleanly without its terminal event (OpenAI ``[DONE]``,
  Anthropic ``message_stop``, Gemini's chunk with ``finishReason``).

Each is a retryable ``ProviderError``; inside a cast the retry layer asks
again, the turn records the whole answer of the attempt that succeeded, and
``attempts`` says how many it took. Nothing of a broken attempt is recorded.
"""

from __future__ import annotations

from typing import Any

import pytest
from fake_providers import PROVIDERS, Answer, Call, Corrupt, CutBody, isolate, running

import cantrip
from cantrip import ProviderError
from cantrip.llm import Message, RetryPolicy
from cantrip.llm._stream import MessageStart, TextDelta
from gates import done, echo

HELLO = [Message("user", "hello")]
FOX = Answer(text="The quick brown fox jumps over the lazy dog")
FAST = RetryPolicy(max_retries=3, base_delay=0.001, max_delay=0.002, jitter=0.0)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    isolate(monkeypatch, tmp_path)


def options(provider: str) -> dict[str, Any]:
    return {"model": "llama3.1:8b"} if provider == "ollama" else {}


def spell(llm: Any) -> cantrip.Cantrip:
    return cantrip.Cantrip(
        llm=llm,
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done, echo], [cantrip.max_turns(3)]),
        retry=FAST,
    )


async def failure(provider: str, reply: Any, *, stream: bool) -> ProviderError:
    async with running(provider, [reply], **options(provider)) as (_, llm):
        with pytest.raises(ProviderError) as info:
            if stream:
                await llm.stream(HELLO, on_event=lambda e: None)
            else:
                await llm.query(HELLO)
    return info.value


# -- the adapter says: transient ------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_corrupted_chunk_mid_stream_is_a_retryable_fault(provider: str) -> None:
    error = await failure(provider, Corrupt(FOX, at_event=3), stream=True)
    assert error.retryable is True and error.code == "malformed_stream"
    assert "not a JSON object" in error.message and error.message.startswith(provider)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_cut_body_is_a_retryable_fault(provider: str) -> None:
    error = await failure(provider, CutBody(FOX), stream=False)
    assert error.retryable is True and error.code == "malformed_response"


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_stream_without_its_terminal_event_is_a_retryable_fault(provider: str) -> None:
    error = await failure(provider, CutBody(FOX), stream=True)
    assert error.retryable is True and error.code == "stream_incomplete"


async def test_an_openai_stream_that_gave_its_finish_reason_but_no_done_is_incomplete() -> None:
    # The finish chunk arrived; the usage chunk and [DONE] did not.
    error = await failure("openai", CutBody(FOX), stream=True)
    assert "after the finish reason" in error.message


# -- the cast retries inside the turn and records the whole answer ---------------------------


@pytest.mark.parametrize("stream", (False, True), ids=("whole", "streamed"))
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_cut_answer_is_retried_inside_the_turn(provider: str, stream: bool) -> None:
    faults = [Corrupt(FOX, at_event=3), CutBody(FOX)] if stream else [CutBody(FOX)]
    events: list[Any] = []
    async with running(provider, [*faults, FOX], **options(provider)) as (fake, llm):
        outcome = await spell(llm).cast_async("say it", on_event=events.append if stream else None)
    assert outcome.terminated and outcome.result == FOX.text  # never "...overlazy dog"
    (turn,) = outcome.turns
    assert turn.content == FOX.text and not turn.is_error
    assert turn.metadata.attempts == len(faults) + 1 == len(fake.requests)
    if stream:
        # Each attempt is announced, so a reader discards what a broken one streamed.
        starts = [i for i, e in enumerate(events) if isinstance(e, MessageStart)]
        assert [events[i].attempt for i in starts] == [1, 2, 3]
        last = "".join(e.text for e in events[starts[-1] :] if isinstance(e, TextDelta))
        assert last == FOX.text


async def test_a_stream_that_stays_corrupt_is_an_error_observation_not_a_partial_answer() -> None:
    script = [Corrupt(FOX, at_event=3)] * 4 + [Answer(calls=(Call("done", {"answer": "ok"}),))]
    async with running("anthropic", script) as (_, llm):
        outcome = await spell(llm).cast_async("say it", on_event=lambda e: None)
    first, _finished = outcome.turns
    assert first.is_error and first.content is None  # nothing of the broken attempts
    assert "not a JSON object" in first.observation
    assert outcome.result == "ok"
