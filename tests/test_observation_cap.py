"""The observation cap (issue 13, item 2).

Everything the entity observes -- console output, gate results, error
messages, child results -- is cut to ``max_observation_chars`` (default 65536)
with a marker saying how much was cut, in the loom's observation and in the
next LLM request alike. Gate-call records keep the full result up to the record
cap (the data code worked with, and what a replay answers from; test_record_cap.py).
"""

from __future__ import annotations

import re
from typing import Any

import cantrip
import gates
from cantrip import Cantrip, Circle, Identity, ScriptedLLM, Ward, max_turns
from cantrip._values import OBSERVATION_CAP_CHARS
from gates import call_agent
from mediums.python import PythonMedium

BIG = 200_000


@cantrip.gate
def flood(n: int) -> str:
    """``n`` characters."""
    return "y" * n


@cantrip.gate
def fail_loudly(n: int) -> str:
    """Fail with an ``n``-character message."""
    raise cantrip.GateError("e" * n)


def tool(gate: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"gate": gate, "args": args}]}


def last_tool_message(llm: ScriptedLLM) -> str:
    messages = llm.invocations[-1].messages
    return next(m.text() for m in reversed(messages) if m.role == "tool")


async def test_a_huge_gate_result_is_cut_in_the_observation_and_the_next_request() -> None:
    llm = ScriptedLLM([tool("flood", n=BIG), tool("done", answer="ok")])
    spell = Cantrip(
        llm=llm, identity=Identity(), circle=Circle([gates.done, flood], [max_turns(3)])
    )
    result = await spell.cast_async("flood")
    marker = (
        f"[truncated: {BIG - OBSERVATION_CAP_CHARS} of {BIG} characters cut "
        f"(max_observation_chars={OBSERVATION_CAP_CHARS})]"
    )
    observation = result.turns[0].observation
    assert observation.endswith(marker)
    assert len(observation) < OBSERVATION_CAP_CHARS + 200
    sent = last_tool_message(llm)
    assert sent.endswith(marker) and len(sent) < OBSERVATION_CAP_CHARS + 200
    assert result.turns[0].gate_calls[0].result == "y" * BIG  # the record keeps the data


async def test_the_cap_is_a_ward_and_error_messages_are_cut_too() -> None:
    llm = ScriptedLLM([tool("fail_loudly", n=5000), tool("done", answer="ok")])
    circle = Circle([gates.done, fail_loudly], [max_turns(3), Ward("max_observation_chars", 1000)])
    result = await Cantrip(llm=llm, identity=Identity(), circle=circle).cast_async("fail")
    marker = "[truncated: 4000 of 5000 characters cut (max_observation_chars=1000)]"
    assert result.turns[0].observation.endswith(marker)
    assert last_tool_message(llm).endswith(marker)
    assert result.turns[0].gate_calls[0].is_error


async def test_a_child_result_is_cut_in_the_parent_observation() -> None:
    child = ScriptedLLM([tool("done", answer="c" * BIG)])
    parent = ScriptedLLM([tool("call_agent", intent="go"), tool("done", answer="ok")])
    spell = Cantrip(
        llm=parent,
        identity=Identity(),
        circle=Circle([gates.done, call_agent], [max_turns(3), cantrip.max_depth(1)]),
        llms={"child_llm": child},
    )
    result = await spell.cast_async("delegate")
    [observation] = [
        t.observation
        for t in result.turns
        if t.gate_calls[:1] and t.gate_calls[0].gate == "call_agent"
    ]
    assert f"of {BIG} characters cut (max_observation_chars=65536)]" in observation
    assert len(last_tool_message(parent)) < OBSERVATION_CAP_CHARS + 200


async def python_cast(codes: list[str], *wards: Ward) -> cantrip.CastResult:
    circle = Circle([gates.done], [max_turns(len(codes)), *wards], PythonMedium())
    llm = ScriptedLLM([{"code": c} for c in codes])
    return await Cantrip(llm=llm, identity=Identity(), circle=circle).cast_async("run")


async def test_code_console_output_and_errors_are_cut() -> None:
    result = await python_cast(
        ["print('p' * 30_000_000)", "raise ValueError('v' * 300_000)", "done(1)"],
        Ward("max_observation_chars", 50_000),
    )
    printed, raised = (t.observation for t in result.turns[:2])
    assert printed.endswith("[output truncated: 29980001 more characters not shown]")
    assert len(printed) < 21_000  # the console's own limit comes first
    assert raised.startswith("error: ValueError: vvv")
    found = re.search(
        r"\[truncated: (\d+) of (\d+) characters cut \(max_observation_chars=50000\)\]$", raised
    )
    assert found is not None
    assert int(found[2]) - int(found[1]) == 50_000 and int(found[2]) > 300_000
    assert result.turns[1].extras["error"].endswith("(max_observation_chars=50000)]")
