"""A scripted LLM shared by concurrent queries and entities: one slot per query, in arrival order.

Issue 24 (1): a query used to read its answer *after* its latency wait, by which
time other queries had moved the script's cursor -- five simultaneous queries on
a script A..E all got E.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

import cantrip
from cantrip.llm import Message, ScriptedLLM
from gates import done, echo


@pytest.mark.parametrize("provider", [None, "openai"])
async def test_simultaneous_queries_each_get_their_own_slot_in_arrival_order(
    provider: str | None, autojump_clock: Any
) -> None:
    # The first entry waits longest, so the queries finish in the reverse order.
    script = [{"content": c, "delay_ms": 50 - 10 * i} for i, c in enumerate("ABCDE")]
    llm = ScriptedLLM(script, latency_s=0.05, provider=provider)
    answers: dict[int, str | None] = {}
    finished: list[int] = []

    async def ask(n: int) -> None:
        response = await llm.query([Message("user", f"question {n}")])
        answers[n] = response.content
        finished.append(n)

    async with trio.open_nursery() as nursery:
        for n in range(5):
            nursery.start_soon(ask, n)
            await trio.testing.wait_all_tasks_blocked()  # arrival order is 0..4
    assert answers == {0: "A", 1: "B", 2: "C", 3: "D", 4: "E"}
    assert finished == [4, 3, 2, 1, 0]
    assert [q.messages[0].content for q in llm.invocations] == [f"question {n}" for n in range(5)]
    assert llm.remaining == 0


async def test_concurrent_entities_sharing_a_scripted_llm_each_get_distinct_turns(
    autojump_clock: Any,
) -> None:
    n = 5
    script: list[dict[str, Any]] = [
        {"tool_calls": [{"gate": "echo", "args": {"text": f"step {i}"}}]} for i in range(n)
    ] + [{"tool_calls": [{"gate": "done", "args": {"answer": f"answer {i}"}}]} for i in range(n)]
    llm = ScriptedLLM(script, latency_s=0.05)
    spell = cantrip.Cantrip(
        llm=llm,
        identity=cantrip.Identity(system_prompt="shared"),
        circle=cantrip.Circle([done, echo], [cantrip.max_turns(4)]),
    )
    outcomes: list[cantrip.CastResult] = []

    async def cast(i: int) -> None:
        outcomes.append(await spell.cast_async(f"task {i}"))

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(cast, i)
    # Every entity ran two turns (echo, then done), and every script entry was
    # used exactly once: nobody got another query's answer.
    assert sorted(len(o.turns) for o in outcomes) == [2] * n
    assert sorted(o.result for o in outcomes) == [f"answer {i}" for i in range(n)]
    echoed = sorted(o.turns[0].gate_calls[0].result for o in outcomes)
    assert echoed == [f"step {i}" for i in range(n)]
    assert llm.remaining == 0


async def test_a_spent_script_still_fails_loudly_under_concurrency(autojump_clock: Any) -> None:
    llm = ScriptedLLM([{"content": "only"}], latency_s=0.01)
    results: list[str] = []
    errors: list[Exception] = []

    async def ask() -> None:
        try:
            results.append(str((await llm.query([Message("user", "q")])).content))
        except cantrip.ScriptExhaustedError as exc:
            errors.append(exc)

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(ask)
    assert results == ["only"] and len(errors) == 2
    assert "no response left for query" in str(errors[0])
