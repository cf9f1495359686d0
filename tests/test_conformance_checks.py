"""Every conformance expectation can fail: a vector that must FAIL for each.

A green conformance run only means something if each expectation checks what
its name says. Each case below is a small, otherwise valid vector whose one
expectation is wrong on purpose; the runner must report it as failed, with a
message naming that expectation. Where two expectations differ only in how
they compare (``gate_calls_executed`` vs ``gate_call_order``, ``usage`` vs
``cumulative_usage``), a pair of cases shows the difference.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import yaml

from cantrip.conformance import Runner
from cantrip.conformance._actions import act
from cantrip.conformance._checks import check_thread_steps, rendered_steps
from cantrip.conformance._expectations import Expectations
from cantrip.conformance._matchers import Mismatch
from cantrip.conformance._world import build_world
from cantrip.llm import Usage
from cantrip.loom._model import Turn

_ECHO_THEN_DONE = """
llm:
  responses:
    - tool_calls: [{ gate: echo, args: { text: "north wall" } }]
    - tool_calls: [{ gate: done, args: { answer: "measured" } }]
  usage: { prompt_tokens: 10, completion_tokens: 2 }
circle:
  gates: [done, echo]
  wards: [{ max_turns: 5 }]
"""


def _case(expect: str, setup: str = _ECHO_THEN_DONE, action: Any = None) -> dict[str, Any]:
    return {
        "rule": "TEST-1",
        "name": "a negative vector",
        "setup": yaml.safe_load(setup),
        "action": action if action is not None else {"cast": {"intent": "Measure the walls"}},
        "expect": yaml.safe_load(expect),
    }


def _run(case: dict[str, Any]) -> tuple[bool, str]:
    result = Runner().run_case(case)
    return result.passed, result.message


# (id, expect, setup or None, action or None, a fragment the failure message must hold)
_MUST_FAIL: list[tuple[str, str, str | None, Any, str]] = [
    (
        "thread-content-wrong",
        """thread:
          - { role: entity }
          - { role: circle, content: "TOTALLY WRONG" }
          - { role: entity }
          - { role: circle }""",
        None,
        None,
        "thread[1].content",
    ),
    (
        "thread-too-few-steps",
        "thread: [{ role: entity }, { role: circle }]",
        None,
        None,
        "expected 2 steps",
    ),
    (
        "thread-unknown-step-key",
        "thread: [{ role: entity, colour: red }, { role: circle }, { role: entity }, "
        "{ role: circle }]",
        None,
        None,
        "unknown key",
    ),
    (
        "thread-gate-calls-wrong",
        "thread: [{ role: entity, gate_calls: [done] }, { role: circle }, { role: entity }, "
        "{ role: circle }]",
        None,
        None,
        "thread[0].gate_calls",
    ),
    (
        "tool-choice-never-queried",
        "llm_received_tool_choice: auto",
        _ECHO_THEN_DONE.replace("circle:", "circle:\n  medium: conversation"),
        {"construct_cantrip": True},
        "never queried",
    ),
    (
        "tool-choice-wrong",
        "llm_received_tool_choice: required",
        None,
        None,
        "llm_received_tool_choice[0]",
    ),
    (
        "invocations-more-than-made",
        "llm_invocations: [{}, {}, {}]",
        None,
        None,
        "at least 3 queries, got 2",
    ),
    (
        "invocations-count-exact",
        "llm_invocations: 3",
        None,
        None,
        "llm_invocations (count)",
    ),
    (
        "usage-wrong",
        "usage: { prompt_tokens: 11 }",
        None,
        None,
        "usage.prompt_tokens",
    ),
    (
        "cumulative-usage-wrong",
        "cumulative_usage: { total_tokens: 25 }",
        None,
        None,
        "cumulative_usage.total_tokens",
    ),
    (
        "usage-unknown-field",
        "usage: { dollars: 1 }",
        None,
        None,
        "unknown usage field",
    ),
    (
        "gate-calls-executed-missing-one",
        "gate_calls_executed: [done]",
        None,
        None,
        "gate_calls_executed",
    ),
    (
        "gate-calls-executed-too-often",
        "gate_calls_executed: [echo, echo, done]",
        None,
        None,
        "gate_calls_executed",
    ),
    (
        "gate-call-order-swapped",
        "gate_call_order: [done, echo]",
        None,
        None,
        "gate_call_order",
    ),
    (
        "message-count-includes-count",
        "llm_invocations: [{}, { message_count_includes: { text: north wall, count: 3 } }]",
        None,
        None,
        "message_count_includes",
    ),
    (
        "message-count-excludes-present",
        "llm_invocations: [{}, { message_count_excludes: north wall }]",
        None,
        None,
        "message_count_excludes",
    ),
    (
        "message-count-includes-absent",
        "llm_invocations: [{}, { message_count_includes: south wall }]",
        None,
        None,
        "message_count_includes",
    ),
    (
        "entity-ids-unique-one-cast",
        "entity_ids_unique: true",
        None,
        None,
        "at least two casts",
    ),
    (
        "error-wrong-kind",
        "error: { kind: ConstructionError, message: intent is required }",
        None,
        {"cast": {"intent": None}},
        "expected kind 'ConstructionError'",
    ),
    (
        "error-not-whole-words",
        'error: "tent is req"',
        None,
        {"cast": {"intent": None}},
        "expected a message containing",
    ),
    (
        "error-none-raised",
        "error: { kind: IntentError }",
        None,
        None,
        "none was raised",
    ),
    (
        "loom-turns-more-than-recorded",
        "loom: { turns: [{}, {}, {}] }",
        None,
        None,
        "at least 3 turns, got 2",
    ),
    (
        "extracted-thread-turns-exact",
        "thread: { turns: [{ sequence: 1 }] }",
        None,
        [{"cast": {"intent": "Measure the walls"}}, {"extract_thread": 0}],
        "expected 1 turns, got 2",
    ),
    (
        "record-inputs-false-rejected",
        "turns: 2",
        _ECHO_THEN_DONE.replace("circle:", "  record_inputs: false\ncircle:"),
        None,
        "record_inputs",
    ),
    (
        "stateless-single-query",
        "llm_invocations: 1",
        """
llm:
  stateless: true
  responses:
    - tool_calls: [{ gate: done, args: { answer: "at once" } }]
circle:
  gates: [done]
  wards: [{ max_turns: 2 }]
""",
        None,
        "no resent context",
    ),
    (
        "gate-executions-summed-over-cantrips",
        "gate_executions: { tally: 1 }",
        """
a_llm:
  responses:
    - tool_calls: [{ gate: tally, args: {} }, { gate: done, args: { answer: "a" } }]
b_llm:
  responses:
    - tool_calls: [{ gate: tally, args: {} }, { gate: done, args: { answer: "b" } }]
circle:
  gates: [done, { name: tally, stateful: true }]
  wards: [{ max_turns: 2 }]
""",
        [
            {"cast": {"intent": "count", "llm": "a_llm"}},
            {"cast": {"intent": "count", "llm": "b_llm"}},
        ],
        "expected 1",
    ),
]


@pytest.mark.parametrize(
    ("expect", "setup", "action", "fragment"),
    [pytest.param(e, s, a, f, id=i) for i, e, s, a, f in _MUST_FAIL],
)
def test_a_wrong_expectation_fails(
    expect: str, setup: str | None, action: Any, fragment: str
) -> None:
    passed, message = _run(_case(expect, setup or _ECHO_THEN_DONE, action))
    assert not passed, "the vector passed, so its expectation cannot fail"
    assert fragment in message, message


# The same vectors with the expectation corrected pass: the failures above are
# the expectation's doing, not a broken setup.
_MUST_PASS: list[tuple[str, str, str | None, Any]] = [
    (
        "thread-every-key",
        """thread:
          - { role: entity, gate_calls: [echo] }
          - { role: circle, content: "north wall", is_error: false }
          - { role: entity, gate_calls: [done] }
          - { role: circle, content_contains: "" }""",
        None,
        None,
    ),
    ("gate-calls-executed-any-order", "gate_calls_executed: [done, echo]", None, None),
    ("gate-call-order", "gate_call_order: [echo, done]", None, None),
    ("usage", "usage: { prompt_tokens: 20, completion_tokens: 4, total_tokens: 24 }", None, None),
    ("cumulative-usage", "cumulative_usage: { total_tokens: 24 }", None, None),
    (
        "message-count",
        "llm_invocations: [{ message_count_excludes: north wall }, "
        "{ message_count_includes: { text: north wall, count: 2 } }]",
        None,
        None,
    ),
    ("invocations-prefix", "llm_invocations: [{ message_count: 1 }]", None, None),
    (
        "error-kind-and-phrase",
        "error: { kind: IntentError, message: INTENT is required }",
        None,
        {"cast": {"intent": None}},
    ),
    (
        "gate-executions-summed",
        "gate_executions: { tally: 2 }",
        _MUST_FAIL[-1][2],
        _MUST_FAIL[-1][3],
    ),
]


@pytest.mark.parametrize(
    ("expect", "setup", "action"), [pytest.param(e, s, a, id=i) for i, e, s, a in _MUST_PASS]
)
def test_the_corrected_expectation_passes(expect: str, setup: str | None, action: Any) -> None:
    passed, message = _run(_case(expect, setup or _ECHO_THEN_DONE, action))
    assert passed, message


def test_two_steps_of_one_role_in_a_row_fail() -> None:
    """A turn the circle never answered (no observation, not ended) followed by
    another turn renders as two entity steps in a row."""
    unanswered = Turn(id="t1", parent_id=None, entity_id="e", sequence=1, utterance="echo()")
    closing = Turn(
        id="t2",
        parent_id="t1",
        entity_id="e",
        sequence=2,
        utterance="done()",
        terminated=True,
        observation="ok",
    )
    steps = rendered_steps([unanswered, closing])
    assert [s["role"] for s in steps] == ["entity", "entity", "circle"]
    with pytest.raises(Mismatch, match="two entity steps in a row"):
        check_thread_steps(steps, [{"role": "entity"}] * 3, "thread")


def test_usage_reads_the_cast_and_cumulative_usage_reads_the_loom(tmp_path: Path) -> None:
    """``usage`` is the cast's own report, ``cumulative_usage`` the loom's sum: change
    one source and only its expectation moves."""
    world = build_world(yaml.safe_load(_ECHO_THEN_DONE), tmp_path)

    async def cast() -> None:
        await act(world, {"cast": {"intent": "Measure the walls"}})

    trio.run(cast)
    world.casts[-1] = attrs.evolve(world.casts[-1], usage=Usage(99, 1))
    Expectations(world).check({"usage": {"prompt_tokens": 99}})
    Expectations(world).check({"cumulative_usage": {"prompt_tokens": 20}})
    with pytest.raises(Mismatch, match=r"cumulative_usage\.prompt_tokens"):
        Expectations(world).check({"cumulative_usage": {"prompt_tokens": 99}})
