"""Guardrails (issue 43, item 1): checks on input, output, calls and results.

Every trip is exact: the model is scripted, and where a check runs beside the model
call, the test holds the model's answer (or the check) on an event, so which of the
two finishes first is decided by the test, never by timing.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import trio
import trio.testing

import cantrip
from cantrip import (
    ApprovalPolicy,
    Cantrip,
    Circle,
    GuardrailError,
    Identity,
    Loom,
    Rewrite,
    ScriptedLLM,
    Trip,
    gate,
    guardrail,
    max_turns,
)
from cantrip.guardrails import classifier, denylist, json_schema, length, regex, secrets
from cantrip.llm import Message, Response, ToolDefinition, Usage
from cantrip.testing import expect
from gates import done

KEY = "sk-proj-abcdefghijklmnopqrstuvwx"


def call(name: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"gate": name, "args": args}]}


def finish(answer: Any = "finished") -> dict[str, Any]:
    return call("done", answer=answer)


class Held:
    """A scripted model the test can watch (``asked``, ``answered``) and hold back
    (``hold``: each answer waits for ``release``); it notes a cancelled call."""

    name = "held"

    def __init__(self, responses: Sequence[Mapping[str, Any]], *, hold: bool = False) -> None:
        self.inner = ScriptedLLM(list(responses), usage=Usage(10, 5))
        self.hold = hold
        self.release = trio.Event()
        self.asked = trio.Event()
        self.answered = trio.Event()
        self.cancelled = False
        self.queries = 0

    @property
    def invocations(self) -> list[Any]:
        return self.inner.invocations

    async def query(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: Any = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Response:
        self.queries += 1
        self.asked.set()
        try:
            if self.hold:
                await self.release.wait()
        except trio.Cancelled:
            self.cancelled = True
            raise
        response = await self.inner.query(messages, tools, tool_choice, extra)
        self.answered.set()
        return response


ran: list[tuple[str, Any]] = []


@gate
def note(text: str) -> str:
    """Write a note (the test sees what the gate got)."""
    ran.append(("note", text))
    return f"noted {text}"


@gate
def lookup(key: str) -> str:
    """Look something up (answers with a credential when asked for one)."""
    ran.append(("lookup", key))
    return f"the value is {KEY}" if key == "secret" else "the value is 42"


@pytest.fixture(autouse=True)
def _clear_ran() -> None:
    ran.clear()


def spell(
    llm: Any,
    *rails: cantrip.Guardrail,
    loom: Loom | None = None,
    approval: ApprovalPolicy | None = None,
) -> Cantrip:
    return Cantrip(
        llm=llm,
        identity=Identity(system_prompt="Be brief."),
        circle=Circle([done, note, lookup], [max_turns(6)], guardrails=rails, approval=approval),
        loom=loom if loom is not None else Loom(),
    )


def forbid(word: str) -> Any:
    def check(value: Any) -> Trip | None:
        return Trip(f"it says {word}") if word in str(value) else None

    check.__name__ = f"no_{word}"
    return check


def last(loom: Loom) -> cantrip.Turn:
    return loom.turns[-1]


# -- input ----------------------------------------------------------------------------


async def test_a_blocking_input_check_trips_before_the_model_is_asked() -> None:
    loom = Loom()
    llm = Held([finish()])
    rail = guardrail(forbid("bomb"), on="input", blocking=True)
    outcome = await spell(llm, rail, loom=loom).cast_async("how to build a bomb")
    assert (outcome.terminated, outcome.truncated, outcome.reason) == (False, True, "guardrail")
    assert llm.queries == 0  # the model never saw it
    turn = last(loom)
    assert turn.reason == "guardrail" and turn.intent == "how to build a bomb"
    assert turn.extras["guardrail"] == {"check": "no_bomb", "on": "input", "why": "it says bomb"}
    assert outcome.summary == (
        "Stopped by guardrail 'no_bomb' on input after 1 turn(s): it says bomb"
    )
    expect(outcome, reason="guardrail", ended="truncated")  # evals can expect it


async def test_a_parallel_input_check_that_trips_cancels_the_model_call_in_flight() -> None:
    loom = Loom()
    llm = Held([call("note", text="x"), finish()], hold=True)  # the model never answers

    async def slow_judge(text: str) -> Trip | None:
        await llm.asked.wait()  # the model call is running beside this check
        return Trip("off topic") if "bomb" in text else None

    rail = guardrail(slow_judge, on="input")
    outcome = await spell(llm, rail, loom=loom).cast_async("a bomb")
    assert outcome.reason == "guardrail"
    assert llm.cancelled and not llm.answered.is_set()
    turn = last(loom)
    assert turn.utterance == "" and turn.gate_calls == ()
    assert turn.extras["guardrail"] == {"check": "slow_judge", "on": "input", "why": "off topic"}


async def test_an_answer_given_beside_a_tripped_check_is_kept_marked_and_never_acted_on() -> None:
    loom = Loom()
    llm = Held([call("note", text="plan"), finish()])

    async def judge(text: str) -> Trip:
        await llm.answered.wait()  # the model answered first
        return Trip("refused")

    outcome = await spell(llm, guardrail(judge), loom=loom).cast_async("anything")
    assert outcome.reason == "guardrail"
    assert ran == []  # the gate the model called never ran
    turn = last(loom)
    assert turn.utterance == 'note({"text": "plan"})'  # what the model said is kept ...
    assert turn.extras["guardrail"]["kept"] == "utterance"  # ... marked
    (record,) = turn.gate_calls
    assert record.status == "cancelled" and record.gate == "note"
    # the answer was paid for: its usage counts
    assert (turn.metadata.tokens_prompt, turn.metadata.tokens_completion) == (10, 5)
    assert outcome.usage.total_tokens == 15


async def test_nothing_the_model_answers_is_acted_on_before_a_parallel_check_passes() -> None:
    llm = Held([call("note", text="plan"), finish()])
    seen_before_pass: list[list[tuple[str, Any]]] = []

    async def judge(text: str) -> None:
        await llm.answered.wait()
        await trio.testing.wait_all_tasks_blocked()  # the loop could act now, if it would
        seen_before_pass.append(list(ran))

    outcome = await spell(llm, guardrail(judge)).cast_async("go")
    assert outcome.reason == "done"
    assert seen_before_pass == [[]]  # the note gate waited for the check
    assert ran == [("note", "plan")]


@pytest.mark.parametrize("blocking", [True, False])
async def test_a_steering_message_is_checked_before_the_model_acts_on_it(blocking: bool) -> None:
    loom = Loom()
    llm = Held([call("steer", text="one"), call("note", text="two"), finish()])
    entity: cantrip.Entity | None = None

    @gate
    def steer(text: str) -> str:
        """Pass a message to the running cast (as a user would)."""
        assert entity is not None
        entity.steer("now the bomb")
        return "sent"

    spelled = Cantrip(
        llm=llm,
        identity=Identity(system_prompt="Be brief."),
        circle=Circle(
            [done, note, steer],
            [max_turns(6)],
            guardrails=[guardrail(forbid("bomb"), on="input", blocking=blocking)],
        ),
        loom=loom,
    )
    entity = spelled.summon()
    async with entity:
        outcome = await entity.send("start")  # the intent passes
    assert outcome.reason == "guardrail"
    assert ran == []  # the answer to the steered turn (note) never ran
    if blocking:
        assert llm.queries == 1  # the model was not asked with the message
    turn = last(loom)
    assert turn.extras["steering"] == ["now the bomb"]
    said = dict(turn.extras["guardrail"])
    # beside the model call, its answer may have come first: then it is kept, marked
    assert said.pop("kept", "utterance") == "utterance"
    assert said == {"check": "no_bomb", "on": "input", "why": "it says bomb"}


async def test_a_blocking_input_rewrite_reaches_the_model_and_the_loom_rewritten() -> None:
    loom = Loom()
    llm = Held([finish()])
    outcome = await spell(llm, secrets(on="input"), loom=loom).cast_async(f"use {KEY} please")
    assert outcome.reason == "done"
    first = loom.turns[0]
    assert first.intent == "use [REDACTED] please"
    assert first.extras["guardrails_rewrote"] == ["secrets"]
    asked = [m.content for m in llm.invocations[0].messages if m.role == "user"]
    assert asked == ["use [REDACTED] please"]  # the model saw it redacted


async def test_a_parallel_input_check_may_not_rewrite() -> None:
    loom = Loom()
    rail = guardrail(lambda text: Rewrite(text.upper()), on="input", name="shout")
    with pytest.raises(GuardrailError, match=r"'shout' on input failed: .*make it blocking"):
        await spell(Held([finish()]), rail, loom=loom).cast_async("hello")
    assert last(loom).reason == "guardrail_error"


# -- output ---------------------------------------------------------------------------


@pytest.mark.parametrize("blocking", [False, True])
async def test_an_output_trip_withholds_the_answer_and_keeps_it_marked(blocking: bool) -> None:
    loom = Loom()
    rail = guardrail(forbid("secret plan"), on="output", blocking=blocking)
    outcome = await spell(Held([finish("the secret plan")]), rail, loom=loom).cast_async("go")
    assert (outcome.terminated, outcome.reason, outcome.result) == (False, "guardrail", None)
    turn = last(loom)
    assert (turn.terminated, turn.truncated, turn.result) == (False, True, None)
    assert turn.extras["guardrail"] == {
        "check": "no_secret plan",
        "on": "output",
        "why": "it says secret plan",
        "withheld": "the secret plan",  # what the model produced, kept and marked
    }


async def test_an_output_rewrite_is_the_result_and_what_the_loom_records() -> None:
    loom = Loom()
    outcome = await spell(Held([finish(f"key {KEY}")]), secrets(on="output"), loom=loom).cast_async(
        "go"
    )
    assert outcome.result == "key [REDACTED]"
    assert last(loom).result == "key [REDACTED]"
    assert last(loom).extras["guardrails_rewrote"] == ["secrets"]


async def test_a_text_answer_is_checked_as_output() -> None:
    rail = length(5, on="output")
    outcome = await spell(Held([{"content": "far too long an answer"}]), rail).cast_async("go")
    assert outcome.reason == "guardrail"
    assert "22 characters, more than 5" in (outcome.summary or "")


# -- calls ----------------------------------------------------------------------------


async def test_a_call_trip_stops_the_call_before_a_human_is_asked() -> None:
    loom = Loom()
    asked: list[Any] = []

    async def human(pause: Any) -> cantrip.Decision:
        asked.append(pause)
        return cantrip.Decision.approve()

    spelled = spell(
        Held([call("note", text="rm -rf /"), finish()]),
        denylist(patterns=[r"rm\s+-rf"]),
        loom=loom,
        approval=ApprovalPolicy(["note"]),
    )
    entity = spelled.summon(on_pause=human)
    async with entity:
        outcome = await entity.send("clean up")
    assert outcome.reason == "guardrail"
    assert asked == [] and ran == []  # nobody was asked, nothing ran
    (record,) = last(loom).gate_calls
    assert record.status == "cancelled" and record.is_error
    assert record.detail["guardrail"]["check"] == "denylist"
    assert last(loom).extras["guardrail"] == {
        "check": "denylist",
        "on": "call",
        "why": "an argument of 'note' matches the denylisted 'rm\\\\s+-rf'",
        "gate": "note",
    }


@pytest.mark.parametrize("blocking", [False, True])
async def test_a_function_call_check_trips_before_approval_in_either_mode(blocking: bool) -> None:
    asked: list[Any] = []

    async def human(pause: Any) -> cantrip.Decision:
        asked.append(pause)
        return cantrip.Decision.approve()

    rail = guardrail(forbid("drop table"), on="call", blocking=blocking)
    spelled = spell(
        Held([call("note", text="drop table users"), finish()]),
        rail,
        approval=ApprovalPolicy(["note"]),
    )
    entity = spelled.summon(on_pause=human)
    async with entity:
        outcome = await entity.send("tidy")
    assert outcome.reason == "guardrail" and asked == [] and ran == []
    assert outcome.turns[-1].extras["guardrail"]["on"] == "call"


async def test_a_denylisted_gate_and_the_calls_after_it_in_the_utterance_do_not_run() -> None:
    loom = Loom()
    two = {
        "tool_calls": [
            {"gate": "lookup", "args": {"key": "a"}},
            {"gate": "note", "args": {"text": "after"}},
        ]
    }
    outcome = await spell(Held([two, finish()]), denylist(gates=["look*"]), loom=loom).cast_async(
        "go"
    )
    assert outcome.reason == "guardrail" and ran == []
    first, second = last(loom).gate_calls
    assert (
        first.result
        == "blocked by guardrail 'denylist': gate 'lookup' is on the denylist ('look*')"
    )
    assert second.status == "cancelled" and "tripped earlier" in str(second.result)


async def test_a_call_rewrite_is_what_the_gate_gets_and_the_record_keeps() -> None:
    loom = Loom()
    outcome = await spell(
        Held([call("note", text=f"token {KEY}"), finish()]), secrets(on="call"), loom=loom
    ).cast_async("go")
    assert outcome.reason == "done"
    assert ran == [("note", "token [REDACTED]")]
    record = loom.turns[0].gate_calls[0]
    assert dict(record.args) == {"text": "token [REDACTED]"}
    assert record.detail["rewritten_by"] == ["secrets"]


# -- results --------------------------------------------------------------------------


@pytest.mark.parametrize("blocking", [False, True])
async def test_a_result_trip_withholds_the_result_from_the_model(blocking: bool) -> None:
    loom = Loom()
    llm = Held([call("lookup", key="secret"), finish()])
    rail = secrets(on="result", action="trip", blocking=blocking)
    outcome = await spell(llm, rail, loom=loom).cast_async("go")
    assert outcome.reason == "guardrail"
    assert llm.queries == 1  # the model was not asked again: it never saw the result
    (record,) = last(loom).gate_calls
    assert record.is_error and record.result.startswith("withheld by guardrail 'secrets'")
    assert record.detail["guardrail"]["withheld"] == f"the value is {KEY}"  # kept, marked
    assert last(loom).extras["guardrail"]["on"] == "result"


async def test_a_result_rewrite_is_what_the_model_sees() -> None:
    llm = Held([call("lookup", key="secret"), finish()])
    outcome = await spell(llm, secrets(on="result")).cast_async("go")
    assert outcome.reason == "done"
    seen = " ".join(str(m.content) for m in llm.invocations[1].messages)
    assert "the value is [REDACTED]" in seen and KEY not in seen


# -- the built-ins --------------------------------------------------------------------


async def test_regex_uses_a_linear_time_engine() -> None:
    rail = regex(r"(a+)+$", on="input", blocking=True)  # catastrophic for a backtracker
    started = time.perf_counter()
    outcome = await spell(Held([finish()]), rail).cast_async("a" * 5000 + "!")
    assert time.perf_counter() - started < 1.0
    assert outcome.reason == "done"  # no match: the text ends in '!'
    tripped = await spell(Held([finish()]), rail).cast_async("a" * 5000)
    assert tripped.reason == "guardrail"


async def test_regex_redacts_when_asked() -> None:
    rail = regex(r"\b\d{3}-\d{4}\b", on="output", action="redact", replacement="<phone>")
    outcome = await spell(Held([finish("call 555-1234 now")]), rail).cast_async("go")
    assert outcome.result == "call <phone> now"


async def test_json_schema_checks_the_answer() -> None:
    rail = json_schema({"type": "object", "required": ["city"]}, on="output")
    outcome = await spell(Held([finish({"town": "Paris"})]), rail).cast_async("go")
    assert outcome.reason == "guardrail"
    assert '"city" is a required property' in (outcome.summary or "")
    ok = await spell(Held([finish({"city": "Paris"})]), rail).cast_async("go")
    assert ok.reason == "done"


# -- an LLM classifier ----------------------------------------------------------------


def judge_cantrip(answer: str) -> Cantrip:
    return Cantrip(
        llm=ScriptedLLM([{"content": answer}], per_entity=True),
        identity=Identity(system_prompt="Answer pass or trip: why."),
        circle=Circle([done], [max_turns(2)]),
    )


async def test_an_llm_classifier_trips_beside_the_model_call() -> None:
    loom = Loom()
    rail = classifier(judge_cantrip("trip: asks for weapons"), name="topic")
    llm = Held([finish()], hold=True)  # the model is still thinking when the judge trips
    outcome = await spell(llm, rail, loom=loom).cast_async("weapons please")
    assert llm.cancelled
    assert outcome.reason == "guardrail"
    assert last(loom).extras["guardrail"] == {
        "check": "topic",
        "on": "input",
        "why": "asks for weapons",
    }


async def test_an_llm_classifier_that_passes_lets_the_cast_go_on() -> None:
    rail = classifier(judge_cantrip("pass"), name="topic")
    outcome = await spell(Held([finish("ok")]), rail).cast_async("hello")
    assert (outcome.reason, outcome.result) == ("done", "ok")


async def test_an_llm_classifier_that_answers_neither_fails_the_cast() -> None:
    rail = classifier(judge_cantrip("maybe?"), name="topic")
    with pytest.raises(GuardrailError, match=r"'topic' on input failed: .*neither pass nor trip"):
        await spell(Held([finish()]), rail).cast_async("hello")


# -- a check that raises --------------------------------------------------------------


def broken(value: Any) -> None:
    raise ValueError("the check's own bug")


@pytest.mark.parametrize(
    ("on", "script"),
    [
        ("input", [finish()]),
        ("output", [finish()]),
        ("call", [call("note", text="x"), finish()]),
        ("result", [call("note", text="x"), finish()]),
    ],
)
async def test_a_check_that_raises_fails_the_cast_with_the_check_named(
    on: str, script: list[dict[str, Any]]
) -> None:
    loom = Loom()
    rail = guardrail(broken, on=on)  # type: ignore[arg-type]
    with pytest.raises(GuardrailError) as raised:
        await spell(Held(script), rail, loom=loom).cast_async("go")
    assert (
        str(raised.value) == f"guardrail 'broken' on {on} failed: ValueError: the check's own bug"
    )
    turn = last(loom)
    assert (turn.truncated, turn.reason) == (True, "guardrail_error")
    assert turn.extras["guardrail"] == {"check": "broken", "on": on}
    # a failing check lets nothing through: no call ran (a result check fails after
    # its gate ran, and the model never sees the result)
    assert ran == ([("note", "x")] if on == "result" else [])


def test_a_check_answering_something_else_is_an_error() -> None:
    rail = guardrail(lambda value: "yes", on="input", blocking=True, name="vague")
    with pytest.raises(GuardrailError, match="'vague' on input failed: a check answers"):
        spell(Held([finish()]), rail).cast("go")


def test_guardrail_construction_is_checked() -> None:
    with pytest.raises(cantrip.ConstructionError, match="applies on one or more of"):
        guardrail(forbid("x"), on="everywhere")  # type: ignore[arg-type]
    with pytest.raises(cantrip.ConstructionError, match="two are named 'no_x'"):
        Circle([done], [max_turns(2)], guardrails=[guardrail(forbid("x")), guardrail(forbid("x"))])
    with pytest.raises(cantrip.ConstructionError, match="not one RE2 takes"):
        regex(r"(?<=a)b")


async def test_a_call_trip_in_a_code_medium_ends_the_cast_even_if_the_code_goes_on() -> None:
    """Code may catch the blocked call's error and call more gates, even done: the
    calls after the trip are not run, and the cast ends with reason guardrail."""
    from mediums.python import PythonMedium

    loom = Loom()
    code = (
        "try:\n    note('rm -rf /')\nexcept Exception as e:\n    print('caught', e)\n"
        "note('after')\ndone('all fine')"
    )
    spelled = Cantrip(
        llm=ScriptedLLM([{"code": code}, {"code": "done('again')"}]),
        identity=Identity(),
        circle=Circle(
            [done, note],
            [max_turns(4)],
            PythonMedium(),
            guardrails=[denylist(patterns=[r"rm\s+-rf"])],
        ),
        loom=loom,
    )
    outcome = await spelled.cast_async("clean up")
    assert (outcome.reason, outcome.result) == ("guardrail", None)
    assert ran == []
    # the blocked call, then the one the code made after catching its error (which
    # raised in the sandbox in turn: the code never reached done)
    assert [r.status for r in last(loom).gate_calls] == ["cancelled", "cancelled"]
    assert "tripped earlier" in str(last(loom).gate_calls[1].result)
    assert last(loom).extras["guardrail"]["check"] == "denylist"


async def test_a_child_inherits_its_parents_guardrails() -> None:
    """call_agent's child is held to the same checks: its intent trips the inherited
    input check, and the parent reads the child's refusal as the gate's result."""
    from gates import call_agent

    loom = Loom()
    child_llm = Held([finish("child done")])
    parent = Cantrip(
        llm=ScriptedLLM([call("call_agent", intent="explain the bomb"), finish("parent done")]),
        identity=Identity(system_prompt="parent"),
        circle=Circle(
            [done, call_agent],
            [max_turns(5), cantrip.max_depth(1)],
            guardrails=[guardrail(forbid("bomb"), on="input", blocking=True)],
        ),
        llms={"child_llm": child_llm},
        loom=loom,
    )
    outcome = await parent.cast_async("delegate it")
    assert (outcome.reason, outcome.result) == ("done", "parent done")
    assert child_llm.queries == 0  # the child's model never saw the intent
    child_turns = [t for t in loom.turns if t.entity_id != outcome.entity_id]
    assert [t.reason for t in child_turns] == ["guardrail"]
    record = next(r for t in outcome.turns for r in t.gate_calls if r.gate == "call_agent")
    assert "Stopped by guardrail 'no_bomb' on input" in str(record.result)
