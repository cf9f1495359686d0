"""The entity loop, through the public API only."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
from loop_watch import MachineTime

import cantrip
import gates
from cantrip import (
    Cantrip,
    Circle,
    ConstructionError,
    Identity,
    IntentError,
    InvalidResponseError,
    Loom,
    Message,
    ProviderError,
    ScriptedLLM,
    ScriptExhaustedError,
    Usage,
    max_turns,
    require_done_tool,
)

SYSTEM = "You are a test entity."


def call(gate_name: str, call_id: str | None = None, **args: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"gate": gate_name, "args": args}
    if call_id is not None:
        entry["id"] = call_id
    return entry


def calls(*tool_calls: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"tool_calls": list(tool_calls), **extra}


def done(answer: Any, **extra: Any) -> dict[str, Any]:
    return calls(call("done", answer=answer), **extra)


def echo(text: str, **extra: Any) -> dict[str, Any]:
    return calls(call("echo", text=text), **extra)


def make(
    script: Sequence[dict[str, Any]],
    *,
    wards: Sequence[cantrip.Ward] = (),
    extra_gates: Sequence[cantrip.Gate] = (),
    loom: Loom | None = None,
    system_prompt: str | None = SYSTEM,
) -> tuple[Cantrip, ScriptedLLM]:
    llm = ScriptedLLM(script)
    circle = Circle([gates.done, gates.echo, *extra_gates], [max_turns(5), *wards])
    kwargs: dict[str, Any] = {}
    if loom is not None:
        kwargs["loom"] = loom
    c = Cantrip(llm=llm, identity=Identity(system_prompt=system_prompt), circle=circle, **kwargs)
    return c, llm


def roles(messages: Sequence[Message]) -> list[str]:
    return [m.role for m in messages]


def counting_gate() -> tuple[cantrip.Gate, list[str]]:
    seen: list[str] = []

    @cantrip.gate
    def tally(label: str) -> str:
        """Count a call."""
        seen.append(label)
        return f"counted {label}"

    return tally, seen


# -- termination -----------------------------------------------------------------


async def test_done_terminates_with_its_result() -> None:
    c, llm = make([echo("warming up"), done("42")])
    result = await c.cast_async("answer the question")
    assert result.terminated is True
    assert result.truncated is False
    assert result.reason == "done"
    assert result.result == "42"
    assert result.text == "42"
    assert len(result.turns) == 2
    assert result.turns[-1].terminated
    assert result.turns[-1].result == "42"
    assert result.turns[0].result is None
    assert llm.remaining == 0
    assert len(llm.invocations) == 2


async def test_first_query_carries_identity_intent_and_tools() -> None:
    c, llm = make([done("ok")])
    await c.cast_async("the intent")
    (query,) = llm.invocations
    assert [(m.role, m.content) for m in query.messages] == [
        ("system", SYSTEM),
        ("user", "the intent"),
    ]
    assert [t.name for t in query.tools] == ["done", "echo"]
    assert query.tool_choice == "auto"


async def test_identity_shapes_every_query() -> None:
    llm = ScriptedLLM([echo("x"), done("ok")])
    identity = Identity(
        system_prompt="sys", temperature=0.3, seed=11, tool_choice="required", extra={"k": "v"}
    )
    c = Cantrip(llm=llm, identity=identity, circle=_circle())
    await c.cast_async("go")
    for query in llm.invocations:
        assert query.messages[0] == Message(role="system", content="sys")
        assert query.tool_choice == "required"
        assert dict(query.extra) == {"temperature": 0.3, "seed": 11, "k": "v"}


async def test_no_system_message_without_a_system_prompt() -> None:
    c, llm = make([done("ok")], system_prompt=None)
    await c.cast_async("go")
    assert roles(llm.invocations[0].messages) == ["user"]


async def test_observation_reaches_the_next_query() -> None:
    c, llm = make([calls(call("echo", "c1", text="ping")), done("ok")])
    await c.cast_async("go")
    second = llm.invocations[1].messages
    assert roles(second) == ["system", "user", "assistant", "tool"]
    assert second[2].tool_calls[0].name == "echo"
    assert second[3].content == "ping"
    assert second[3].tool_call_id == "c1"
    assert second[3].is_error is False


async def test_calls_after_done_are_skipped_and_not_executed() -> None:
    tally, seen = counting_gate()
    c, _ = make(
        [
            calls(
                call("tally", label="before"),
                call("done", answer="finished"),
                call("tally", label="after"),
                call("echo", text="after too"),
            )
        ],
        extra_gates=[tally],
    )
    result = await c.cast_async("count")
    assert result.terminated
    assert result.result == "finished"
    assert seen == ["before"]
    records = result.turns[0].gate_calls
    assert [(r.gate, r.status) for r in records] == [
        ("tally", "ok"),
        ("done", "ok"),
        ("tally", "skipped"),
        ("echo", "skipped"),
    ]
    assert not records[2].executed
    assert not records[2].is_error
    assert "skipped" in str(records[2].result)
    # every call still has exactly one completion, tied to its call id
    assert [r.tool_call_id for r in records] == [tc.id for tc in result.turns[0].tool_calls]


async def test_text_only_response_terminates_when_done_not_required() -> None:
    c, llm = make([{"content": "the answer is 4"}, done("unused")])
    result = await c.cast_async("what is 2+2?")
    assert result.terminated
    assert result.reason == "text"
    assert result.result == "the answer is 4"
    assert len(result.turns) == 1
    assert llm.remaining == 1


async def test_text_only_response_does_not_terminate_when_done_required() -> None:
    c, llm = make(
        [{"content": "thinking aloud"}, {"content": "still talking"}, done("finally")],
        wards=[require_done_tool()],
    )
    result = await c.cast_async("finish properly")
    assert result.terminated
    assert result.reason == "done"
    assert result.result == "finally"
    assert [t.terminated for t in result.turns] == [False, False, True]
    assert result.turns[0].reason is None

    second = llm.invocations[1].messages
    assert roles(second) == ["system", "user", "assistant", "user"]
    assert second[2].content == "thinking aloud"
    nudge = second[3].content
    assert nudge is not None
    assert nudge != "finish properly"
    assert "done" in nudge

    third = llm.invocations[2].messages
    assert roles(third) == ["system", "user", "assistant", "user", "assistant", "user"]
    conversation = roles(third)[1:]
    assert all(a != b for a, b in itertools.pairwise(conversation))


# -- wards -----------------------------------------------------------------------


async def test_max_turns_truncates() -> None:
    c, llm = make([echo(f"step {i}") for i in range(10)], wards=[max_turns(3)])
    result = await c.cast_async("loop forever")
    assert result.terminated is False
    assert result.truncated is True
    assert result.reason == "max_turns"
    assert result.result is None
    assert len(result.turns) == 3
    assert [t.truncated for t in result.turns] == [False, False, True]
    assert result.turns[-1].reason == "max_turns"
    assert result.summary is not None
    assert "max_turns" in result.summary
    assert "3 turn" in result.summary
    assert len(llm.invocations) == 3
    assert len(c.loom) == 3


async def test_done_on_the_last_allowed_turn_terminates_rather_than_truncates() -> None:
    c, _ = make([echo("one"), done("made it")], wards=[max_turns(2)])
    result = await c.cast_async("just in time")
    assert result.terminated
    assert not result.truncated
    assert result.summary is None
    assert result.result == "made it"


async def test_timeout_ward_ends_a_cast_that_would_run_forever(autojump_clock: Any) -> None:
    # timeout alone satisfies the circle's termination check (CIRCLE-2), so the
    # loop must enforce it: an entity that never calls done is cut off.
    llm = ScriptedLLM([echo(f"step {i}", delay_ms=1000) for i in range(100)])
    circle = Circle([gates.done, gates.echo], [cantrip.timeout(5)])
    c = Cantrip(llm=llm, identity=Identity(), circle=circle)
    before = trio.current_time()
    result = await c.cast_async("never finish")
    assert result.truncated
    assert not result.terminated
    assert result.turns[-1].truncated
    assert llm.remaining > 0
    assert trio.current_time() - before < 10


async def test_max_tokens_total_ward_ends_the_cast() -> None:
    usage = {"prompt_tokens": 50, "completion_tokens": 10}
    llm = ScriptedLLM([echo(f"step {i}", usage=usage) for i in range(10)])
    circle = Circle([gates.done, gates.echo], [cantrip.Ward("max_tokens_total", 100)])
    c = Cantrip(llm=llm, identity=Identity(), circle=circle)
    result = await c.cast_async("spend tokens")
    assert result.truncated
    assert not result.terminated
    assert len(result.turns) <= 2
    assert llm.remaining >= 8


# -- errors inside the loop are observations -------------------------------------


async def test_gate_that_raises_becomes_an_error_record_and_the_loop_continues() -> None:
    @cantrip.gate
    def explode(reason: str) -> str:
        """Always fails."""
        raise RuntimeError(f"kaboom: {reason}")

    c, llm = make(
        [calls(call("explode", "x1", reason="test")), done("recovered")], extra_gates=[explode]
    )
    result = await c.cast_async("try something risky")
    assert result.terminated
    assert result.result == "recovered"
    first = result.turns[0]
    (record,) = first.gate_calls
    assert record.is_error
    assert record.status == "error"
    assert "kaboom: test" in str(record.result)
    assert first.is_error
    assert not first.terminated
    tool_message = llm.invocations[1].messages[-1]
    assert tool_message.role == "tool"
    assert tool_message.is_error
    assert tool_message.tool_call_id == "x1"
    assert "kaboom: test" in (tool_message.content or "")


async def test_unknown_gate_is_an_error_observation() -> None:
    c, _ = make([calls(call("teleport", where="moon")), done("ok")])
    result = await c.cast_async("go")
    (record,) = result.turns[0].gate_calls
    assert record.is_error
    assert "unknown gate 'teleport'" in str(record.result)
    assert result.terminated


async def test_arguments_that_are_not_json_are_an_error_and_not_executed() -> None:
    tally, seen = counting_gate()
    c, _ = make([calls({"gate": "tally", "args": "{label: oops"}), done("ok")], extra_gates=[tally])
    result = await c.cast_async("go")
    (record,) = result.turns[0].gate_calls
    assert record.is_error
    assert "not valid JSON" in str(record.result)
    assert "{label: oops" in str(record.result)
    assert seen == []
    assert result.terminated


async def test_malformed_done_is_an_error_and_does_not_terminate() -> None:
    c, llm = make([calls({"gate": "done", "args": {}}), done("proper")])
    result = await c.cast_async("finish")
    first = result.turns[0]
    assert not first.terminated
    assert first.reason is None
    (record,) = first.gate_calls
    assert record.is_error
    assert "missing required" in str(record.result)
    assert "missing required" in first.observation
    tool_message = llm.invocations[1].messages[-1]
    assert tool_message.is_error
    assert "missing required" in (tool_message.content or "")
    assert result.terminated
    assert result.result == "proper"
    assert len(result.turns) == 2


async def test_malformed_done_still_obeys_max_turns() -> None:
    c, _ = make([calls({"gate": "done", "args": {}})] * 3, wards=[max_turns(2)])
    result = await c.cast_async("finish")
    assert result.truncated
    assert not result.terminated
    assert len(result.turns) == 2


# -- LLM failures ----------------------------------------------------------------


@pytest.mark.parametrize("entry", [{}, {"content": ""}, {"content": None, "tool_calls": []}])
async def test_empty_response_raises_and_records_llm_error_turn(entry: dict[str, Any]) -> None:
    c, _ = make([echo("fine"), entry])
    with pytest.raises(InvalidResponseError, match="neither content nor tool_calls"):
        await c.cast_async("go")
    turns = c.loom.turns
    assert len(turns) == 2
    last = turns[-1]
    assert last.reason == "llm_error"
    assert last.truncated
    assert not last.terminated
    assert last.parent_id == turns[0].id
    assert last.sequence == 2
    assert "neither content nor tool_calls" in last.extras["error"]
    assert last.extras["error_type"] == "InvalidResponseError"


async def test_llm_error_on_first_turn_records_the_intent() -> None:
    c, _ = make([{}])
    with pytest.raises(InvalidResponseError):
        await c.cast_async("the intent")
    (turn,) = c.loom.turns
    assert turn.reason == "llm_error"
    assert turn.intent == "the intent"
    assert turn.parent_id is None


async def test_duplicate_tool_call_ids_raise() -> None:
    tally, seen = counting_gate()
    c, _ = make(
        [calls(call("tally", "same", label="a"), call("tally", "same", label="b"))],
        extra_gates=[tally],
    )
    with pytest.raises(InvalidResponseError, match="duplicate tool call ID"):
        await c.cast_async("go")
    assert seen == []  # nothing of an invalid response is executed
    (turn,) = c.loom.turns
    assert turn.reason == "llm_error"


async def test_retryable_provider_error_is_retried_inside_one_turn(autojump_clock: Any) -> None:
    c, llm = make([{"error": {"status": 503, "message": "overloaded"}}, done("after retry")])
    wall = time.perf_counter()
    before = trio.current_time()
    with MachineTime() as taken:  # what a busy machine adds to the wall time
        result = await c.cast_async("go")
    waited = trio.current_time() - before
    assert result.terminated
    assert result.result == "after retry"
    assert len(result.turns) == 1
    assert len(c.loom) == 1
    assert result.turns[0].metadata.attempts == 2
    assert len(llm.invocations) == 2
    # backoff starts at 1 s (plus at most 25 % jitter), on the virtual clock
    assert 1.0 <= waited <= 1.25 + 1e-6
    assert time.perf_counter() - wall - taken() < 1.0
    # the failed attempt never reached the entity's context
    assert roles(llm.invocations[1].messages) == ["system", "user"]


async def test_transient_failure_after_retries_stays_in_the_loop(autojump_clock: Any) -> None:
    c, llm = make([{"error": {"status": 429, "message": "slow down"}}] * 4 + [done("recovered")])
    outcome = await c.cast_async("go")
    assert len(llm.invocations) == 5  # one attempt + 3 retries, then the next turn
    failed, finished = c.loom.turns
    assert failed.is_error and "slow down" in failed.observation
    assert not failed.truncated and failed.reason is None  # the loop went on (D-011)
    assert finished.terminated and outcome.result == "recovered"


async def test_transient_failures_are_bounded_by_max_turns(autojump_clock: Any) -> None:
    c, _ = make([{"error": {"status": 503, "message": "down"}}] * 40)
    outcome = await c.cast_async("go")
    assert outcome.truncated and outcome.reason == "max_turns"
    assert all(t.is_error for t in c.loom.turns)
    assert len(c.loom.turns) == c.circle.resolved.max_turns


async def test_client_error_is_not_retried() -> None:
    c, llm = make([{"error": {"status": 400, "message": "bad request"}}, done("never")])
    with pytest.raises(ProviderError, match="bad request") as info:
        await c.cast_async("go")
    assert info.value.status == 400
    assert "400" in str(info.value)
    assert len(llm.invocations) == 1
    assert llm.remaining == 1
    (turn,) = c.loom.turns
    assert turn.reason == "llm_error"
    assert turn.extras["error_type"] == "ProviderError"


async def test_scripted_llm_raises_when_exhausted() -> None:
    llm = ScriptedLLM([{"content": "only one"}])
    first = await llm.query([Message(role="user", content="hi")])
    assert first.content == "only one"
    with pytest.raises(ScriptExhaustedError, match="no response left"):
        await llm.query([Message(role="user", content="again")])
    assert len(llm.invocations) == 2


async def test_exhausted_script_ends_the_cast() -> None:
    c, _ = make([echo("one")])
    with pytest.raises(ScriptExhaustedError):
        await c.cast_async("go")
    assert [t.reason for t in c.loom.turns] == [None, "llm_error"]


# -- summoned entities -----------------------------------------------------------


async def test_summoned_entity_accumulates_state_across_casts() -> None:
    c, llm = make([echo("first"), done("one"), echo("second"), done("two")])
    entity = c.summon()
    async with entity:
        first = await entity.send("intent one")
        second = await entity.send("intent two")
    assert (first.result, second.result) == ("one", "two")
    assert first.entity_id == second.entity_id == entity.id

    first_cast_last_query = list(llm.invocations[1].messages)
    second_cast_first_query = list(llm.invocations[2].messages)
    # everything the first cast saw, plus its final turn, then the new intent
    assert second_cast_first_query[: len(first_cast_last_query)] == first_cast_last_query
    assert second_cast_first_query[-1] == Message(role="user", content="intent two")
    contents = [m.content for m in second_cast_first_query]
    assert "intent one" in contents
    assert "first" in contents

    turns = entity.turns
    assert [t.sequence for t in turns] == [1, 2, 3, 4]
    assert [t.intent for t in turns] == ["intent one", None, "intent two", None]
    # one thread: each turn's parent is the one before
    assert [t.parent_id for t in turns] == [None, turns[0].id, turns[1].id, turns[2].id]
    assert c.loom.thread(turns[-1].id) == list(turns)
    assert [t.sequence for t in second.turns] == [3, 4]


async def test_summoned_entity_context_after_an_llm_error_is_well_formed() -> None:
    # A failed query produced no utterance; the next cast must not show the LLM
    # an assistant message that never happened (one with neither content nor
    # tool calls, which LLM-3 calls invalid).
    c, llm = make([{"error": {"status": 400, "message": "bad request"}}, done("recovered")])
    entity = c.summon()
    async with entity:
        with pytest.raises(ProviderError):
            await entity.send("first try")
        result = await entity.send("second try")
    assert result.result == "recovered"
    messages = llm.invocations[-1].messages
    assert messages[-1] == Message(role="user", content="second try")
    for message in messages:
        if message.role == "assistant":
            assert message.content or message.tool_calls, messages


async def test_closed_entity_refuses_new_intents() -> None:
    c, _ = make([done("one")])
    entity = c.summon()
    async with entity:
        await entity.send("one")
    with pytest.raises(IntentError, match="closed"):
        await entity.send("two")


async def test_casts_are_independent_entities() -> None:
    c, llm = make([done("a"), done("b")])
    first = await c.cast_async("one")
    second = await c.cast_async("two")
    assert first.entity_id != second.entity_id
    assert roles(llm.invocations[1].messages) == ["system", "user"]
    assert len(c.loom.threads()) == 2


async def test_usage_per_turn_and_cumulative() -> None:
    c, _ = make(
        [
            echo("a", usage={"prompt_tokens": 10, "completion_tokens": 2}),
            done("x", usage={"prompt_tokens": 20, "completion_tokens": 3, "cached_tokens": 5}),
            done("y", usage={"prompt_tokens": 40, "completion_tokens": 4}),
        ]
    )
    entity = c.summon()
    async with entity:
        first = await entity.send("one")
        second = await entity.send("two")
    assert [
        (t.metadata.tokens_prompt, t.metadata.tokens_completion, t.metadata.tokens_cached)
        for t in entity.turns
    ] == [(10, 2, 0), (20, 3, 5), (40, 4, 0)]
    assert first.usage == Usage(prompt_tokens=30, completion_tokens=5, cached_tokens=5)
    assert second.usage == Usage(prompt_tokens=40, completion_tokens=4)
    assert entity.usage == first.usage + second.usage
    assert entity.usage.total_tokens == 79
    assert sum((t.metadata.usage for t in entity.turns), Usage()) == entity.usage


# -- construction and intent -----------------------------------------------------


def _circle() -> Circle:
    return Circle([gates.done, gates.echo], [max_turns(5)])


def test_cantrip_requires_an_llm() -> None:
    with pytest.raises(ConstructionError, match="cantrip requires an llm"):
        Cantrip(llm=None, identity=Identity(), circle=_circle())  # type: ignore[arg-type]


def test_cantrip_reports_every_problem_at_once() -> None:
    with pytest.raises(ConstructionError) as info:
        Cantrip(llm=None, identity=None, circle=None)  # type: ignore[arg-type]
    assert len(info.value.problems) == 3
    assert "requires an identity" in str(info.value)
    assert "requires a circle" in str(info.value)


def test_circle_requires_a_done_gate() -> None:
    with pytest.raises(ConstructionError, match="circle must have a done gate"):
        Circle([gates.echo], [max_turns(5)])


def test_circle_requires_a_truncation_ward() -> None:
    with pytest.raises(ConstructionError, match="at least one truncation ward"):
        Circle([gates.done], [])
    with pytest.raises(ConstructionError, match="at least one truncation ward"):
        Circle([gates.done], [require_done_tool(), cantrip.max_depth(2)])


def test_circle_refuses_duplicate_gate_names() -> None:
    with pytest.raises(ConstructionError, match="repeated: echo"):
        Circle([gates.done, gates.echo, gates.echo], [max_turns(5)])


@pytest.mark.parametrize("intent", [None, "", "   \n"])
async def test_cast_requires_an_intent(intent: str | None) -> None:
    c, llm = make([done("never")])
    with pytest.raises(IntentError, match="intent is required"):
        await c.cast_async(intent)
    assert llm.invocations == []
    assert len(c.loom) == 0


def test_sync_cast_requires_an_intent() -> None:
    c, _ = make([done("never")])
    with pytest.raises(IntentError, match="intent is required"):
        c.cast(None)


def test_sync_cast_runs_the_loop() -> None:
    c, _ = make([echo("x"), done("sync ok")])
    result = c.cast("run without a trio loop")
    assert result.result == "sync ok"
    assert len(result.turns) == 2


# -- a durable loom --------------------------------------------------------------


async def test_sqlite_loom_records_every_turn(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    loom = Loom.open(path)
    try:
        c, _ = make([echo("one"), echo("two"), done("three")], loom=loom)
        result = await c.cast_async("persist me")
        assert len(loom) == 3
        other = Loom.open(path)
        try:
            assert [t.id for t in other.turns] == [t.id for t in result.turns]
            assert list(other.turns) == list(result.turns)
            assert other.entity(result.entity_id).identity == {"system_prompt": SYSTEM}
            assert other.entity(result.entity_id).cantrip_id == c.id
            last = other.turns[-1]
            assert last.terminated
            assert last.result == "three"
            assert [t.sequence for t in other.turns] == [1, 2, 3]
        finally:
            other.close()
    finally:
        loom.close()


def test_retry_policy_judges_statuses_by_its_own_list() -> None:
    policy = cantrip.RetryPolicy(retryable_status_codes=frozenset({429}))
    assert policy.is_retryable(ProviderError("slow down", status=429, retryable=True))
    # an adapter may call a 503 retryable, but this policy's list says no
    assert not policy.is_retryable(ProviderError("overloaded", status=503, retryable=True))
    # without a status (a dropped connection) the adapter's judgement stands
    assert policy.is_retryable(ProviderError("connection reset", retryable=True))
    assert not policy.is_retryable(ProviderError("bad certificate", retryable=False))


# -- what entities share ------------------------------------------------------------


async def test_entities_of_one_cantrip_share_their_setup_per_llm() -> None:
    """Summoning computes the provider stack, tools and identity record once per LLM."""
    c, llm = make([done("a"), done("b"), done("c")])
    other = ScriptedLLM([done("d")])
    first, second = c.summon(), c.summon()
    third = c.summon(llm=other)
    assert first._setup is second._setup
    assert third._setup is not first._setup
    assert third._setup.llm_name == other.name
    # the shared parts reach the LLM unchanged, entity after entity
    await first.send("one")
    await second.send("two")
    assert llm.invocations[0].tools == llm.invocations[1].tools
    assert [m.role for m in llm.invocations[1].messages] == ["system", "user"]
    # a changed cantrip does not inherit the old one's cache
    changed = c.with_(identity=Identity(system_prompt="changed"))
    assert changed.summon()._setup.system == Message(role="system", content="changed")


def test_turn_timestamps_are_iso_8601_utc_with_microseconds() -> None:
    from datetime import UTC, datetime, timedelta

    from cantrip._core._recording import now as _now

    before = datetime.now(UTC)
    stamps = [_now() for _ in range(3)]
    after = datetime.now(UTC)
    for stamp in stamps:
        parsed = datetime.fromisoformat(stamp)
        assert parsed.isoformat(timespec="microseconds") == stamp
        assert before - timedelta(milliseconds=1) <= parsed <= after + timedelta(milliseconds=1)
    assert stamps == sorted(stamps)
