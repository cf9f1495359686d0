"""The error boundaries: what they catch, what they keep, what they let through.

The gate-call boundary and the child boundary turn a gate's or a child's failure
into an observation for the model -- but every catch is logged with its
traceback, the exception's type stays in the observation and in the loom, and a
runtime bug (not gate code, not a provider fault) crashes to the supervisor.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

import cantrip
from cantrip.llm import Message, Response, ToolChoice, ToolDefinition
from gates import call_agent, call_agent_batch, done


def _call(gate: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"gate": gate, "args": args}]}


def _spell(script: list[dict[str, Any]], gates: list[cantrip.Gate], **llms: Any) -> cantrip.Cantrip:
    return cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(script),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done, *gates], [cantrip.max_turns(4), cantrip.max_depth(1)]),
        llms=llms,
    )


@cantrip.gate
def lookup(key: str) -> str:
    """Looks a key up in an empty table: a gate with a bug."""
    table: dict[str, str] = {}
    return table[key]


@cantrip.gate
def refuse(reason: str) -> str:
    """Fails on purpose, in plain words."""
    raise cantrip.GateError(f"refused: {reason}")


async def test_a_gate_exception_keeps_its_type_in_the_observation_loom_and_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    spell = _spell([_call("lookup", key="x"), _call("done", answer="ok")], [lookup])
    with caplog.at_level(logging.WARNING, logger="cantrip._circle"):
        outcome = await spell.cast_async("look x up")
    first = outcome.turns[0]
    record = first.gate_calls[0]
    assert record.is_error and record.status == "error"
    assert first.observation == "KeyError: 'x'"  # not just "'x'"
    assert record.detail["exception"] == "KeyError"
    stored = spell.loom.get(first.id).gate_calls[0].to_dict()
    assert stored["detail"]["exception"] == "KeyError"
    [logged] = [r for r in caplog.records if r.name == "cantrip._circle"]
    assert logged.levelno == logging.WARNING and "'lookup'" in logged.getMessage()
    assert logged.exc_info is not None and logged.exc_info[0] is KeyError
    assert outcome.result == "ok"  # the cast went on


async def test_a_gate_error_reads_as_written_and_is_logged_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    spell = _spell([_call("refuse", reason="closed"), _call("done", answer="ok")], [refuse])
    with caplog.at_level(logging.INFO, logger="cantrip._circle"):
        outcome = await spell.cast_async("ask")
    assert outcome.turns[0].observation == "refused: closed"
    assert outcome.turns[0].gate_calls[0].detail["exception"] == "GateError"
    [logged] = [r for r in caplog.records if r.exc_info]
    assert logged.exc_info is not None and logged.exc_info[0] is cantrip.GateError
    assert logged.levelno == logging.INFO  # a deliberate report, not a fault: no warning noise


@cantrip.gate
def refuse_with_facts(reason: str) -> str:
    """Fails on purpose, naming facts for its record (one that tries to pass for
    another exception type)."""
    raise cantrip.GateError(f"refused: {reason}", detail={"ticket": 7, "exception": "Nope"})


async def test_a_gate_errors_detail_reaches_its_record_and_not_the_model() -> None:
    """``GateError(message, detail=...)``: the facts are merged into the failed call's
    record (kept by the loom), the model reads only the message, and the exception's
    own type stays the record's ``exception``."""
    script = [_call("refuse_with_facts", reason="closed"), _call("done", answer="ok")]
    spell = _spell(script, [refuse_with_facts])
    outcome = await spell.cast_async("ask")
    first = outcome.turns[0]
    assert first.observation == "refused: closed"
    record = spell.loom.get(first.id).gate_calls[0]
    assert record.is_error and dict(record.detail) == {"ticket": 7, "exception": "GateError"}
    assert outcome.result == "ok"


async def test_refused_arguments_are_logged_with_their_type(
    caplog: pytest.LogCaptureFixture,
) -> None:
    spell = _spell([_call("lookup", wrong=1), _call("done", answer="ok")], [lookup])
    with caplog.at_level(logging.INFO, logger="cantrip._circle"):
        outcome = await spell.cast_async("ask")
    record = outcome.turns[0].gate_calls[0]
    assert record.is_error and "key" in str(record.result)
    assert record.detail["exception"] == "GateArgumentError"
    assert any(r.exc_info and "arguments refused" in r.getMessage() for r in caplog.records)


class BrokenLLM:
    """An LLM adapter with a bug: it raises KeyError, which is no provider fault."""

    name = "broken"

    async def query(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Response:
        raise KeyError("choices")


async def test_a_runtime_bug_in_a_child_crashes_the_parent_to_its_supervisor(
    caplog: pytest.LogCaptureFixture,
) -> None:
    spell = _spell(
        [_call("call_agent", intent="sub-task"), _call("done", answer="never")],
        [call_agent],
        child_llm=BrokenLLM(),
    )
    with (
        caplog.at_level(logging.ERROR, logger="cantrip._composition"),
        pytest.raises(cantrip.ChildCrashedError, match="KeyError") as raised,
    ):
        await spell.cast_async("delegate")
    assert isinstance(raised.value.__cause__, KeyError)
    parent_turns = [t for t in spell.loom.turns if t.reason == "crashed"]
    assert len(parent_turns) == 2, "the child and the parent both record the crash"
    assert any(r.exc_info and r.exc_info[0] is KeyError for r in caplog.records)


async def test_a_runtime_bug_in_a_batch_child_crashes_the_parent() -> None:
    spell = _spell(
        [_call("call_agent_batch", requests=[{"intent": "a"}]), _call("done", answer="never")],
        [call_agent_batch],
        child_llm=BrokenLLM(),
    )
    with pytest.raises(BaseException) as raised:  # a group, checked below
        await spell.cast_async("delegate")
    group = raised.value
    assert isinstance(group, BaseExceptionGroup)
    assert group.subgroup(cantrip.ChildCrashedError) is not None


async def test_a_child_whose_llm_gives_up_is_an_observation_with_the_error_type(
    caplog: pytest.LogCaptureFixture,
) -> None:
    spell = _spell(
        [_call("call_agent", intent="sub-task"), _call("done", answer="carried on")],
        [call_agent],
        child_llm=cantrip.ScriptedLLM([]),  # spent at once: ScriptExhaustedError
    )
    with caplog.at_level(logging.WARNING, logger="cantrip._composition"):
        outcome = await spell.cast_async("delegate")
    assert outcome.result == "carried on"
    [record] = [r for t in outcome.turns for r in t.gate_calls if r.gate == "call_agent"]
    assert record.is_error and "failed: ScriptExhaustedError:" in str(record.result)
    assert record.detail["exception"] == "GateError"
    assert any(r.exc_info and r.exc_info[0] is cantrip.ScriptExhaustedError for r in caplog.records)
