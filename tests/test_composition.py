"""Composition through the public API: batches, limits, the unified loom, cancellation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import trio

import cantrip
from cantrip.llm import Message, Response, ToolChoice, ToolDefinition
from gates import call_agent, call_agent_batch, done, echo


def batch_call(n: int) -> dict[str, Any]:
    requests = [{"intent": f"part {i}"} for i in range(n)]
    return {"tool_calls": [{"gate": "call_agent_batch", "args": {"requests": requests}}]}


def finish(answer: str = "ok") -> dict[str, Any]:
    return {"tool_calls": [{"gate": "done", "args": {"answer": answer}}]}


class CountingLLM:
    """Answers done(<intent>) after a delay, counting queries in flight."""

    name = "counting"

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.in_flight = 0
        self.peak = 0

    async def query(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Response:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await trio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        intent = next(m.content for m in messages if m.role == "user")
        return Response(tool_calls=(cantrip.ToolCall(f"c-{intent}", "done", {"answer": intent}),))


def parent_spell(script: list[dict[str, Any]], child: Any, *wards: cantrip.Ward) -> cantrip.Cantrip:
    return cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(script),
        identity=cantrip.Identity(system_prompt="parent"),
        circle=cantrip.Circle(
            [done, echo, call_agent, call_agent_batch],
            [cantrip.max_turns(5), cantrip.max_depth(1), *wards],
        ),
        llms={"child_llm": child},
    )


async def test_batch_children_run_concurrently(autojump_clock: Any) -> None:
    child = CountingLLM(delay_s=0.2)
    spell = parent_spell([batch_call(8), finish()], child)
    start = trio.current_time()
    outcome = await spell.cast_async("split the work")
    elapsed = trio.current_time() - start
    assert outcome.terminated
    assert elapsed < 0.5, f"8 children of 200 ms took {elapsed:.2f}s: not concurrent"
    assert child.peak == 8


async def test_batch_respects_the_concurrency_ward(autojump_clock: Any) -> None:
    child = CountingLLM(delay_s=0.2)
    spell = parent_spell([batch_call(20), finish()], child, cantrip.Ward("max_concurrency", 4))
    start = trio.current_time()
    await spell.cast_async("split the work")
    elapsed = trio.current_time() - start
    assert child.peak == 4
    assert 0.99 <= elapsed < 1.1  # ceil(20 / 4) waves of 200 ms


async def test_batch_results_keep_request_order_and_failures_stay_per_child() -> None:
    child = cantrip.ScriptedLLM(
        [finish("A"), {"error": {"status": 400, "message": "bad request"}}, finish("C")]
    )
    spell = parent_spell([batch_call(3), finish()], child)
    outcome = await spell.cast_async("three parts")
    batch_record = outcome.turns[1].gate_calls[0]  # the continuation of the delegating turn
    assert batch_record.gate == "call_agent_batch" and not batch_record.is_error
    first, second, third = batch_record.result
    assert (first, third) == ("A", "C")
    assert "failed" in second["error"] and "bad request" in second["error"]


async def test_batch_larger_than_the_limit_is_an_error_observation() -> None:
    spell = parent_spell([batch_call(60), finish()], CountingLLM(0))
    outcome = await spell.cast_async("too many")
    record = outcome.turns[0].gate_calls[0]
    assert record.is_error and "at most 50" in record.result


async def test_children_are_recorded_in_one_loom_under_the_checkpoint() -> None:
    child = cantrip.ScriptedLLM([finish("one"), finish("two")])
    spell = parent_spell([batch_call(2), finish()], child)
    outcome = await spell.cast_async("two parts")
    loom = spell.loom
    checkpoint, continuation = outcome.turns[0], outcome.turns[1]
    assert checkpoint.reason == "delegating" and checkpoint.tool_calls
    assert continuation.parent_id == checkpoint.id and not continuation.tool_calls
    children = [t for t in loom.turns if t.entity_id != outcome.entity_id]
    assert len(children) == 2
    assert all(t.parent_id == checkpoint.id for t in children)
    records = {e.entity_id: e for e in loom.entities.values()}
    assert all(records[t.entity_id].parent_entity_id == outcome.entity_id for t in children)
    assert all(records[t.entity_id].identity["system_prompt"] != "parent" for t in children)


async def test_depth_zero_child_cannot_delegate() -> None:
    child = cantrip.ScriptedLLM(
        [{"tool_calls": [{"gate": "call_agent", "args": {"intent": "deeper"}}]}, finish("leaf")]
    )
    spell = parent_spell(
        [{"tool_calls": [{"gate": "call_agent", "args": {"intent": "go"}}]}, finish()], child
    )
    await spell.cast_async("delegate once")
    child_turns = [t for t in spell.loom.turns if t.entity_id != spell.loom.turns[0].entity_id]
    failed = child_turns[0].gate_calls[0]
    assert failed.is_error and "warded off" in failed.result
    assert child.invocations[0].tools and all(
        t.name not in ("call_agent", "call_agent_batch") for t in child.invocations[0].tools
    )


class SleepyLLM:
    """Delegates once per level, then sleeps 'forever' at the bottom."""

    name = "sleepy"

    async def query(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Response:
        if any(t.name == "call_agent" for t in tools):
            return Response(
                tool_calls=(cantrip.ToolCall("d1", "call_agent", {"intent": "go deeper"}),)
            )
        await trio.sleep(1000)
        raise AssertionError("never reached")


async def test_cancelling_a_three_level_tree_records_every_entity(autojump_clock: Any) -> None:
    spell = cantrip.Cantrip(
        llm=SleepyLLM(),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done, call_agent], [cantrip.max_turns(5), cantrip.max_depth(2)]),
    )
    with trio.move_on_after(5) as scope:
        await spell.cast_async("deep work")
    assert scope.cancelled_caught
    loom = spell.loom
    entities = list(loom.entities.values())
    assert len(entities) == 3
    last = {e.entity_id: loom.last_turn(e.entity_id) for e in entities}
    root = next(e for e in entities if e.parent_entity_id is None)
    assert last[root.entity_id].reason == "cancelled"
    for e in entities:
        final = last[e.entity_id]
        assert final is not None and final.truncated
        if e.parent_entity_id is not None:
            assert final.reason == "parent_terminated"
    # the grandchild's interrupted turn has no utterance; the others completed their
    # delegation call as cancelled
    middle = next(e for e in entities if e.parent_entity_id == root.entity_id)
    statuses = [r.status for r in last[middle.entity_id].gate_calls]
    assert statuses == ["cancelled"]


@pytest.mark.parametrize("medium", ["conversation"])
async def test_child_llm_by_level_and_by_name(medium: str) -> None:
    level1 = cantrip.ScriptedLLM([finish("from level one")], name="l1")
    named = cantrip.ScriptedLLM([finish("from named")], name="named")
    spell = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(
            [
                {"tool_calls": [{"gate": "call_agent", "args": {"intent": "a"}}]},
                {"tool_calls": [{"gate": "call_agent", "args": {"intent": "b", "llm": "named"}}]},
                finish(),
            ]
        ),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done, call_agent], [cantrip.max_turns(5)]),
        llms={"child_llm_l1": level1, "named": named},
    )
    outcome = await spell.cast_async("two children")
    results = [r.result for t in outcome.turns for r in t.gate_calls if r.gate == "call_agent"]
    assert results == ["from level one", "from named"]


class FanOutLLM:
    """Fans out by batch where it can; leaves wait on their LLM 'forever'."""

    name = "fan-out"

    async def query(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Response:
        if any(t.name == "call_agent_batch" for t in tools):
            requests = [{"intent": f"leaf {i}"} for i in range(3)]
            return Response(
                tool_calls=(cantrip.ToolCall("b", "call_agent_batch", {"requests": requests}),)
            )
        await trio.sleep(1000)
        raise AssertionError("never reached")


async def test_cancelling_batches_records_every_entity(autojump_clock: Any) -> None:
    spell = cantrip.Cantrip(
        llm=FanOutLLM(),
        identity=cantrip.Identity(),
        circle=cantrip.Circle(
            [done, call_agent_batch], [cantrip.max_turns(5), cantrip.max_depth(2)]
        ),
    )
    with trio.move_on_after(5):
        await spell.cast_async("fan out twice")
    loom = spell.loom
    assert len(loom.entities) == 1 + 3 + 9
    for entity_id, record in loom.entities.items():
        final = loom.last_turn(entity_id)
        assert final is not None and final.truncated, entity_id
        expected = "cancelled" if record.parent_entity_id is None else "parent_terminated"
        assert final.reason == expected


async def test_entity_cancel_api_ends_the_cast_and_keeps_the_entity(autojump_clock: Any) -> None:
    llm = cantrip.ScriptedLLM(
        [
            {"tool_calls": [{"gate": "call_agent", "args": {"intent": "slow child"}}]},
            {"tool_calls": [{"gate": "done", "args": {"answer": "second cast"}}]},
        ]
    )
    spell = cantrip.Cantrip(
        llm=llm,
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done, call_agent], [cantrip.max_turns(5)]),
        llms={"child_llm": SleepyLLM()},
    )
    async with spell.summon() as entity:
        async with trio.open_nursery() as nursery:
            results: list[cantrip.CastResult] = []

            async def run() -> None:
                results.append(await entity.send("first"))

            nursery.start_soon(run)
            await trio.sleep(1)
            assert entity.cancel()
        first = results[0]
        assert first.truncated and first.reason == "cancelled"
        second = await entity.send("again")
        assert second.result == "second cast"
    child = next(e for e in spell.loom.entities.values() if e.parent_entity_id)
    assert spell.loom.last_turn(child.entity_id).reason == "parent_terminated"
    assert not entity.cancel()


async def test_a_child_cannot_escape_the_sandbox_into_bash() -> None:
    from mediums.js import JsMedium

    spell = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(
            [
                {
                    "code": "var r; try { r = call_agent({intent: 'x', medium: 'bash'}); }"
                    " catch (e) { r = 'refused: ' + e.message; } done(r);"
                }
            ]
        ),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done, call_agent], [cantrip.max_turns(3)], JsMedium()),
        llms={"child_llm": cantrip.ScriptedLLM([{"code": "submit_answer $(id -un)"}])},
    )
    outcome = await spell.cast_async("try to get a shell")
    assert outcome.result.startswith("refused:") and "not a sandbox" in outcome.result
    assert len(spell.loom.entities) == 1  # no child was ever created


async def test_delegating_turn_counts_its_usage_once() -> None:
    usage = {"prompt_tokens": 100, "completion_tokens": 10}
    spell = parent_spell(
        [
            {"tool_calls": [{"gate": "call_agent", "args": {"intent": "x"}}], "usage": usage},
            {"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}], "usage": usage},
        ],
        cantrip.ScriptedLLM([finish("child")]),
    )
    outcome = await spell.cast_async("count once")
    assert outcome.usage.prompt_tokens == 200 and outcome.usage.completion_tokens == 20
    per_turn = [t.metadata.tokens_prompt for t in outcome.turns]
    assert per_turn == [100, 0, 100]  # checkpoint, continuation, final turn


async def test_a_truncated_child_is_marked_on_the_parents_record() -> None:
    child = cantrip.ScriptedLLM(
        [{"tool_calls": [{"gate": "echo", "args": {"text": str(i)}}]} for i in range(5)]
    )
    spell = parent_spell(
        [
            {
                "tool_calls": [
                    {"gate": "call_agent", "args": {"intent": "long", "wards": [{"max_turns": 2}]}}
                ]
            },
            finish(),
        ],
        child,
    )
    outcome = await spell.cast_async("delegate")
    record = outcome.turns[1].gate_calls[0]
    assert record.gate == "call_agent" and not record.is_error
    assert record.detail["truncated"] is True
    assert "Truncated by max_turns" in record.result
