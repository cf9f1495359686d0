"""Steering a running entity: a message joins the next turn and is recorded there."""

from __future__ import annotations

import pytest
import trio

import cantrip
from cantrip import Cantrip, Circle, Identity, Loom, ScriptedLLM, max_turns
from cantrip.loom import export_chat
from gates import done, echo


def holding_gate(started: trio.Event, release: trio.Event) -> cantrip.Gate:
    @cantrip.gate(name="work")
    async def work(task: str) -> str:
        started.set()
        await release.wait()
        return f"did {task}"

    return work


def spell(loom: Loom, gate: cantrip.Gate, script: list[dict[str, object]]) -> Cantrip:
    return Cantrip(
        llm=ScriptedLLM(script),
        identity=Identity(system_prompt="Worker."),
        circle=Circle([done, echo, gate], [max_turns(6)]),
        loom=loom,
    )


SCRIPT: list[dict[str, object]] = [
    {"tool_calls": [{"gate": "work", "args": {"task": "a"}}]},
    {"tool_calls": [{"gate": "done", "args": {"answer": "finished"}}]},
]


async def test_a_message_joins_the_next_turn_and_is_recorded_there() -> None:
    started, release = trio.Event(), trio.Event()
    loom = Loom()
    s = spell(loom, holding_gate(started, release), SCRIPT)
    llm = s.llm
    entity = s.summon()
    async with entity, trio.open_nursery() as nursery:
        results: list[cantrip.CastResult] = []

        async def run() -> None:
            results.append(await entity.send("Do the work."))

        nursery.start_soon(run)
        await started.wait()
        assert entity.steer("Also mention the weather.")
        release.set()
    result = results[0]
    assert result.terminated and result.undelivered == ()
    second = llm.invocations[1].messages  # type: ignore[attr-defined]
    assert second[-1].role == "user" and second[-1].content == "Also mention the weather."
    turns = loom.entity_turns(entity.id)
    assert "steering" not in turns[0].extras
    assert turns[1].extras["steering"] == ["Also mention the weather."]
    # a context rebuilt from the loom shows it in the same place (resume, exports)
    resumed = s.resume(entity.id)
    rebuilt = list(resumed._context.snapshot())
    live = list(second) + [m for m in rebuilt[len(second) :]]
    assert [m.content for m in rebuilt[: len(second)]] == [m.content for m in live[: len(second)]]
    chat = export_chat(loom)
    assert "Also mention the weather." in str(chat)


async def test_steering_with_no_cast_running_is_refused_and_late_messages_are_reported() -> None:
    started, release = trio.Event(), trio.Event()
    script: list[dict[str, object]] = [
        {
            "tool_calls": [
                {"gate": "work", "args": {"task": "a"}},
                {"gate": "done", "args": {"answer": "x"}},
            ]
        },
    ]
    s = spell(Loom(), holding_gate(started, release), script)
    entity = s.summon()
    assert entity.steer("anyone there?") is False
    with pytest.raises(cantrip.IntentError, match="needs some text"):
        entity.steer("   ")
    async with entity, trio.open_nursery() as nursery:
        results: list[cantrip.CastResult] = []

        async def run() -> None:
            results.append(await entity.send("Do it and finish."))

        nursery.start_soon(run)
        await started.wait()
        assert entity.steer("too late")
        release.set()
    assert results[0].undelivered == ("too late",)
    assert entity.steer("after") is False


async def test_rewind_continues_from_an_earlier_turn_and_keeps_the_branch() -> None:
    loom = Loom()
    s = Cantrip(
        llm=ScriptedLLM(
            [
                {"tool_calls": [{"gate": "done", "args": {"answer": "one"}}]},
                {"tool_calls": [{"gate": "done", "args": {"answer": "two"}}]},
                {"tool_calls": [{"gate": "done", "args": {"answer": "three"}}]},
            ]
        ),
        identity=Identity(system_prompt="x"),
        circle=Circle([done], [max_turns(3)]),
        loom=loom,
    )
    entity = s.summon()
    async with entity:
        await entity.send("first")
        keep = entity.leaf
        await entity.send("second (rolled back)")
        await entity.rewind(keep)
        await entity.send("third")
    thread = loom.thread(entity.leaf)  # type: ignore[arg-type]
    assert [t.intent for t in thread if t.intent] == ["first", "third"]
    assert len(loom.entity_turns(entity.id)) == 3  # the branch stays in the loom
    messages = s.llm.invocations[2].messages  # type: ignore[attr-defined]
    assert "second (rolled back)" not in [m.content for m in messages]
