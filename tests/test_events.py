"""Streaming events: an observation channel that never changes what is recorded."""

from __future__ import annotations

from typing import Any

import cantrip
from cantrip._events import (
    FinalResponse,
    MessageComplete,
    StepComplete,
    StepStart,
    ToolResultEvent,
    UsageEvent,
)
from cantrip.llm._stream import Event, MessageStart, TextDelta, ToolCallEvent
from gates import call_agent, done, echo

SCRIPT: list[dict[str, Any]] = [
    {"content": "Let me echo first.", "tool_calls": [{"gate": "echo", "args": {"text": "hi"}}]},
    {"tool_calls": [{"gate": "done", "args": {"answer": "finished"}}]},
]


def make(script: list[dict[str, Any]]) -> cantrip.Cantrip:
    return cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(script),
        identity=cantrip.Identity(system_prompt="stream me"),
        circle=cantrip.Circle([done, echo, call_agent], [cantrip.max_turns(5)]),
    )


def shape(turn: cantrip.Turn) -> tuple[Any, ...]:
    return (turn.utterance, turn.observation, [r.to_dict()["result"] for r in turn.gate_calls])


async def test_events_follow_the_loop_in_order() -> None:
    events: list[Event] = []
    outcome = await make(SCRIPT).cast_async("go", on_event=events.append)
    kinds = [type(e).__name__ for e in events]
    first_turn = kinds[: kinds.index("StepComplete") + 1]
    assert first_turn[:2] == ["StepStart", "MessageStart"]
    assert first_turn[-4:] == ["MessageComplete", "UsageEvent", "ToolResultEvent", "StepComplete"]
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == "Let me echo first."
    calls = [e for e in events if isinstance(e, ToolCallEvent)]
    assert [c.final for c in calls[:2]] == [False, True]
    assert calls[1].arguments == {"text": "hi"}  # the finalized arguments are authoritative
    assert isinstance(events[-1], FinalResponse) and events[-1].result == "finished"
    assert all(e.entity_id == outcome.entity_id for e in events)
    steps = [e for e in events if isinstance(e, StepStart)]
    assert [s.sequence for s in steps] == [1, 2]
    completes = [e.turn for e in events if isinstance(e, StepComplete)]
    assert [t.id for t in completes if t] == [t.id for t in outcome.turns]
    assert any(isinstance(e, MessageStart) for e in events)
    assert sum(isinstance(e, (MessageComplete, UsageEvent)) for e in events) == 4


async def test_streamed_and_unstreamed_casts_record_the_same_turns() -> None:
    quiet = await make(SCRIPT).cast_async("go")
    loud = await make(SCRIPT).cast_async("go", on_event=lambda e: None)
    assert [shape(t) for t in quiet.turns] == [shape(t) for t in loud.turns]
    assert quiet.result == loud.result


async def test_child_events_reach_the_parent_sink_with_the_child_id() -> None:
    spell = make(
        [
            {"tool_calls": [{"gate": "call_agent", "args": {"intent": "help", "llm": "kid"}}]},
            {"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]},
        ]
    )
    spell = spell.with_(llms={"kid": cantrip.ScriptedLLM([{"content": "child answer"}])})
    events: list[Event] = []
    outcome = await spell.cast_async("delegate", on_event=events.append)
    ids = {e.entity_id for e in events}
    assert outcome.entity_id in ids and len(ids) == 2
    child_results = [
        e for e in events if isinstance(e, FinalResponse) and e.entity_id != outcome.entity_id
    ]
    assert [e.result for e in child_results] == ["child answer"]
    tool_results = [e.record.gate for e in events if isinstance(e, ToolResultEvent)]
    assert tool_results == ["call_agent", "done"]
