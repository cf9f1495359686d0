"""Humans in the loop: approvals and questions as durable pauses in the loom."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import trio

import cantrip
from cantrip import Decision, Pause, PauseError
from cantrip._events import PauseEvent
from cantrip.llm._stream import Event
from gates import ask_user, call_agent_batch, done, echo

ROOT = Path(__file__).resolve().parents[1]


def counter_gate(path: Path, *, requires_approval: bool = False) -> cantrip.Gate:
    @cantrip.gate(requires_approval=requires_approval)
    def bump(by: int = 1) -> int:
        """Add to a counter file (a side effect to count)."""
        value = int(path.read_text()) if path.exists() else 0
        path.write_text(str(value + by))
        return value + by

    return bump


def call(gate: str, args: Mapping[str, Any] | None = None, id: str | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"gate": gate, "args": dict(args or {})}
    if id:
        entry["id"] = id
    return entry


def reply(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"tool_calls": list(calls)}


def spell(
    script: list[dict[str, Any]],
    *gates: cantrip.Gate,
    approval: cantrip.ApprovalPolicy | None = None,
    loom: cantrip.Loom | None = None,
    medium: Any = None,
) -> cantrip.Cantrip:
    circle_args: dict[str, Any] = {"approval": approval}
    if medium is not None:
        circle_args["medium"] = medium
    return cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(script),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done, *gates], [cantrip.max_turns(8)], **circle_args),
        loom=cantrip.Loom() if loom is None else loom,
    )


async def test_a_call_that_needs_approval_pauses_and_the_loom_holds_it(tmp_path: Path) -> None:
    counter = tmp_path / "n"
    s = spell(
        [
            reply(
                call("echo", {"text": "before"}),
                call("bump", {"by": 2}),
                call("echo", {"text": "after"}),
            ),
            reply(call("done", {"answer": "ok"})),
        ],
        echo,
        counter_gate(counter, requires_approval=True),
    )
    entity = s.summon()
    outcome = await entity.send("count")
    assert outcome.paused and outcome.reason == "paused"
    assert not outcome.terminated and not outcome.truncated
    (pause,) = outcome.pending
    assert pause.kind == "approval" and pause.gate == "bump" and dict(pause.args) == {"by": 2}
    assert not counter.exists()  # nothing ran without the human
    # the loom: the turn up to the call, the earlier call with its result, the pause pending
    checkpoint = s.loom.get(pause.checkpoint_id)
    assert checkpoint.extras["pending"]["pause_id"] == pause.pause_id
    assert [r.gate for r in checkpoint.gate_calls] == ["echo"]
    assert checkpoint.gate_calls[0].result == "before"
    assert entity.pending == (pause,)
    # approve: the gate runs exactly once, the rest of the utterance runs, the cast goes on
    result = await entity.answer(pause.pause_id, Decision.approve())
    assert result is not None and result.terminated and result.result == "ok"
    assert counter.read_text() == "2"
    assert entity.pending == ()
    calls = [r for t in s.loom.entity_turns(entity.id) for r in t.gate_calls]
    assert [(r.gate, r.result) for r in calls] == [
        ("echo", "before"),
        ("bump", 2),
        ("echo", "after"),
        ("done", "ok"),
    ]
    approved = calls[1]
    assert approved.detail["approval"]["decision"] == "approve"
    with pytest.raises(PauseError, match="no pending pause"):
        await entity.answer(pause.pause_id, Decision.approve())


async def test_deny_is_an_error_observation_and_the_loop_goes_on(tmp_path: Path) -> None:
    counter = tmp_path / "n"
    s = spell(
        [reply(call("bump")), reply(call("done", {"answer": "gave up"}))],
        counter_gate(counter, requires_approval=True),
    )
    entity = s.summon()
    (pause,) = (await entity.send("count")).pending
    result = await entity.answer(pause.pause_id, Decision.deny("not today"))
    assert result is not None and result.result == "gave up"
    assert not counter.exists()
    denied = next(r for t in result.turns for r in t.gate_calls if r.gate == "bump")
    assert denied.is_error and denied.result == "denied by the user: not today"
    # the model saw the denial in its next query
    second_query = s.llm.invocations[1]  # type: ignore[attr-defined]
    assert any("denied by the user: not today" in m.text() for m in second_query.messages)


async def test_edit_runs_the_gate_with_the_humans_arguments(tmp_path: Path) -> None:
    counter = tmp_path / "n"
    s = spell(
        [reply(call("bump", {"by": 100})), reply(call("done", {"answer": "ok"}))],
        counter_gate(counter, requires_approval=True),
    )
    entity = s.summon()
    (pause,) = (await entity.send("count")).pending
    result = await entity.answer(pause.pause_id, {"decision": "edit", "args": {"by": 1}})
    assert result is not None and counter.read_text() == "1"
    edited = next(r for t in result.turns for r in t.gate_calls if r.gate == "bump")
    assert dict(edited.args) == {"by": 1}
    assert edited.detail["approval"]["original_args"] == {"by": 100}


def bump_policy(gate: str, args: Mapping[str, Any]) -> cantrip.Verdict:
    """Deny bump(by > 10), ask about any other bump, allow the rest."""
    if gate != "bump":
        return "allow"
    return "deny" if int(args.get("by", 1)) > 10 else "ask"


async def test_an_edit_the_policy_denies_is_denied_with_the_reason(tmp_path: Path) -> None:
    """An edit cannot smuggle arguments the policy denies (issue 28, item 7): the
    edited arguments are judged like the model's own call."""
    counter = tmp_path / "n"
    s = spell(
        [reply(call("bump", {"by": 1})), reply(call("done", {"answer": "ok"}))],
        counter_gate(counter),
        approval=cantrip.ApprovalPolicy(function=bump_policy),
    )
    entity = s.summon()
    (pause,) = (await entity.send("count")).pending
    result = await entity.answer(pause.pause_id, Decision.edit({"by": 999}))
    assert result is not None and result.result == "ok"
    assert not counter.exists()  # bump(999) never ran
    refused = next(r for t in result.turns for r in t.gate_calls if r.gate == "bump")
    assert refused.is_error and dict(refused.args) == {"by": 999}
    assert refused.result == (
        "denied by the approval policy: bump may not be called with the edited arguments"
    )
    assert refused.detail["approval"]["original_args"] == {"by": 1}


async def test_an_edit_the_policy_asks_about_is_a_new_pause(tmp_path: Path) -> None:
    counter = tmp_path / "n"
    s = spell(
        [reply(call("bump", {"by": 1})), reply(call("done", {"answer": "ok"}))],
        counter_gate(counter),
        approval=cantrip.ApprovalPolicy(function=bump_policy),
    )
    entity = s.summon()
    (pause,) = (await entity.send("count")).pending
    again = await entity.answer(pause.pause_id, Decision.edit({"by": 5}))
    assert again is not None and again.paused and not counter.exists()
    (second,) = again.pending
    assert second.pause_id != pause.pause_id
    assert second.gate == "bump" and dict(second.args) == {"by": 5}
    assert entity.pending == (second,)
    result = await entity.answer(second.pause_id, Decision.approve())
    assert result is not None and result.result == "ok" and counter.read_text() == "5"
    ran = [r for t in s.loom.entity_turns(entity.id) for r in t.gate_calls if r.gate == "bump"]
    assert [(dict(r.args), r.result) for r in ran] == [({"by": 5}, 5)]


async def test_an_edit_with_invalid_arguments_is_refused_not_run(tmp_path: Path) -> None:
    counter = tmp_path / "n"
    s = spell(
        [reply(call("bump", {"by": 1})), reply(call("done", {"answer": "ok"}))],
        counter_gate(counter, requires_approval=True),
    )
    entity = s.summon()
    (pause,) = (await entity.send("count")).pending
    result = await entity.answer(pause.pause_id, Decision.edit({"by": "lots", "and": 1}))
    assert result is not None and not counter.exists()
    refused = next(r for t in result.turns for r in t.gate_calls if r.gate == "bump")
    assert refused.is_error
    assert str(refused.result).startswith(
        "the edited arguments were refused: invalid arguments for gate 'bump': argument 'by': "
    )
    assert "unexpected argument 'and'" in str(refused.result)


async def test_an_edit_answered_in_place_is_judged_too(tmp_path: Path) -> None:
    """The live path (a handler answering in place) goes through the same check."""
    counter = tmp_path / "n"
    s = spell(
        [reply(call("bump", {"by": 1})), reply(call("done", {"answer": "ok"}))],
        counter_gate(counter),
        approval=cantrip.ApprovalPolicy(function=bump_policy),
    )
    entity = s.summon()
    answers = iter([Decision.edit({"by": 7}), Decision.edit({"by": 70})])
    asked: list[dict[str, Any]] = []

    async def human(pause: Pause) -> Decision:
        asked.append(dict(pause.args))
        return next(answers)

    entity.answer_pauses_with(human)
    result = await entity.send("count")
    assert result.result == "ok" and not counter.exists()
    assert asked == [{"by": 1}, {"by": 7}]  # the first edit was asked about again
    refused = next(r for t in result.turns for r in t.gate_calls if r.gate == "bump")
    assert refused.result == (
        "denied by the approval policy: bump may not be called with the edited arguments"
    )


async def test_ask_user_returns_the_humans_answer_as_the_observation() -> None:
    s = spell(
        [
            reply(call("ask_user", {"question": "Which colour?"})),
            reply(call("done", {"answer": "blue it is"})),
        ],
        ask_user,
    )
    entity = s.summon()
    (pause,) = (await entity.send("pick a colour")).pending
    assert pause.kind == "question" and pause.question == "Which colour?"
    with pytest.raises(PauseError, match="answer it with text"):
        await entity.answer(pause.pause_id, Decision.approve())
    result = await entity.answer(pause.pause_id, Decision.answer("blue"))
    assert result is not None and result.result == "blue it is"
    asked = next(r for t in result.turns for r in t.gate_calls if r.gate == "ask_user")
    assert asked.result == "blue" and not asked.is_error


async def test_glob_policy_and_policy_function() -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    def policy(gate: str, args: Mapping[str, Any]) -> cantrip.Verdict:
        seen.append((gate, dict(args)))
        if args.get("text") == "rm -rf /":
            return "deny"
        return "ask" if gate == "echo" and args.get("text") == "risky" else "allow"

    s = spell(
        [
            reply(call("echo", {"text": "fine"}), call("echo", {"text": "rm -rf /"})),
            reply(call("done", {"answer": "ok"})),
        ],
        echo,
        approval=cantrip.ApprovalPolicy(function=policy),
    )
    outcome = await s.cast_async("go")
    assert outcome.terminated
    first, second = outcome.turns[0].gate_calls
    assert first.result == "fine"
    assert second.is_error and "denied by the approval policy" in str(second.result)
    assert ("echo", {"text": "fine"}) in seen

    globbed = spell(
        [reply(call("echo", {"text": "x"}))], echo, approval=cantrip.ApprovalPolicy(["ec*"])
    )
    assert (await globbed.cast_async("go")).paused


async def test_nothing_needs_approval_by_default() -> None:
    s = spell([reply(call("echo", {"text": "x"})), reply(call("done", {"answer": 1}))], echo)
    assert not s.circle.needs_humans
    assert (await s.cast_async("go")).terminated


async def test_wait_mode_with_a_handler_continues_in_place(tmp_path: Path) -> None:
    counter = tmp_path / "n"
    asked: list[Pause] = []

    async def human(pause: Pause) -> Decision:
        asked.append(pause)
        return Decision.approve(always=True)

    s = spell(
        [reply(call("bump")), reply(call("bump")), reply(call("done", {"answer": "ok"}))],
        counter_gate(counter, requires_approval=True),
    )
    entity = s.summon(on_pause=human)
    outcome = await entity.send("count twice")
    assert outcome.terminated and counter.read_text() == "2"
    assert len(asked) == 1  # "always" approved the second call without asking


async def test_an_approval_timeout_denies_with_timed_out(autojump_clock: Any) -> None:
    s = spell(
        [reply(call("echo", {"text": "x"})), reply(call("done", {"answer": "ok"}))],
        echo,
        approval=cantrip.ApprovalPolicy(["echo"], timeout_s=30),
    )
    entity = s.summon(pause="wait")
    outcome = await entity.send("go")
    record = next(r for t in outcome.turns for r in t.gate_calls if r.gate == "echo")
    assert record.is_error and record.result == "denied by the user: timed out"


async def test_concurrent_answers_one_wins(autojump_clock: Any) -> None:
    s = spell(
        [reply(call("echo", {"text": "x"})), reply(call("done", {"answer": "ok"}))],
        echo,
        approval=cantrip.ApprovalPolicy(["echo"]),
    )
    events: list[Event] = []
    entity = s.summon(pause="wait", on_event=events.append)
    outcomes: list[Any] = []
    errors: list[Exception] = []

    async def answer(decision: Decision) -> None:
        try:
            outcomes.append(await entity.answer(pause_id, decision))
        except PauseError as exc:
            errors.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(entity.send, "go")
        await trio.sleep(1)
        (pause,) = entity.pending
        pause_id = pause.pause_id
        assert any(isinstance(e, PauseEvent) and e.pause == pause for e in events)
        nursery.start_soon(answer, Decision.approve())
        nursery.start_soon(answer, Decision.deny("no"))
    assert len(outcomes) == 1 and len(errors) == 1
    assert "already answered" in str(errors[0])


async def test_two_children_of_a_batch_pause_at_once_and_both_are_answerable(
    autojump_clock: Any,
) -> None:
    child = cantrip.ScriptedLLM(
        [reply(call("echo", {"text": "child"}))] * 2 + [reply(call("done", {"answer": "c"}))] * 2
    )
    parent = cantrip.ScriptedLLM(
        [
            reply(
                call(
                    "call_agent_batch",
                    {"requests": [{"intent": "one"}, {"intent": "two"}]},
                )
            ),
            reply(call("done", {"answer": "parent"})),
        ]
    )
    s = cantrip.Cantrip(
        llm=parent,
        identity=cantrip.Identity(),
        circle=cantrip.Circle(
            [done, echo, call_agent_batch],
            [cantrip.max_turns(6), cantrip.max_depth(1)],
            approval=cantrip.ApprovalPolicy(["echo"]),
        ),
        llms={"child_llm": child},
    )
    entity = s.summon()
    result: list[cantrip.CastResult] = []

    async def run() -> None:
        result.append(await entity.send("split"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await trio.sleep(1)
        pending = entity.pending
        assert len(pending) == 2
        assert {p.entity_id for p in pending} != {entity.id}
        for pause in pending:
            assert await entity.answer(pause.pause_id, Decision.approve()) is None
    assert result[0].terminated and result[0].result == "parent"


async def test_a_code_medium_waits_in_place_for_the_answer() -> None:
    from mediums.js import js

    s = spell(
        [{"code": "var r = echo('hi'); done(r + '!')"}],
        echo,
        approval=cantrip.ApprovalPolicy(["echo"]),
        medium=js,
    )
    entity = s.summon()  # "return" mode, but code cannot leave mid-block: it waits
    result: list[cantrip.CastResult] = []

    async def run() -> None:
        result.append(await entity.send("go"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        with trio.fail_after(20):  # the sandbox is a real process: real time
            while not entity.pending:
                await trio.sleep(0.01)
        (pause,) = entity.pending
        assert pause.gate == "echo"
        await entity.answer(pause.pause_id, Decision.approve())
    assert result[0].result == "hi!"


def test_a_pause_survives_kill_9_and_the_effect_happens_exactly_once(tmp_path: Path) -> None:
    """kill -9 while waiting for approval; restart; approve -> one side effect."""
    counter = tmp_path / "count"
    loom = tmp_path / "loom.db"
    common = textwrap.dedent(
        f"""
        import sys, trio, cantrip
        from pathlib import Path
        from gates import done
        counter = Path({str(counter)!r})

        @cantrip.gate(requires_approval=True)
        def bump() -> int:
            '''Count.'''
            value = int(counter.read_text()) if counter.exists() else 0
            counter.write_text(str(value + 1))
            return value + 1

        spell = cantrip.Cantrip(
            llm=cantrip.ScriptedLLM(SCRIPT),
            identity=cantrip.Identity(),
            circle=cantrip.Circle([done, bump], [cantrip.max_turns(5)]),
            loom=cantrip.Loom.open({str(loom)!r}),
        )
        """
    )
    bump = '[{"tool_calls": [{"gate": "bump", "args": {}}]}]'
    finish = '[{"tool_calls": [{"gate": "done", "args": {"answer": "counted"}}]}]'
    waiting = (
        f"SCRIPT = {bump}\n"
        + common
        + textwrap.dedent(
            """
        async def main():
            entity = spell.summon(entity_id="entity-approve-me", pause="wait")
            def show(event):
                if type(event).__name__ == "PauseEvent":
                    print("PAUSED", event.pause.pause_id, flush=True)
            entity.on_event = show
            await entity.send("count once")
        trio.run(main)
        """
        )
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", waiting], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("PAUSED"), line
    pause_id = line.split()[1]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not counter.exists()
    # the restarted process's LLM answers what comes after the approval
    answering = (
        f"SCRIPT = {finish}\n"
        + common
        + textwrap.dedent(
            f"""
        async def main():
            entity = spell.resume("entity-approve-me")
            (pause,) = entity.pending
            assert pause.pause_id == {pause_id!r}, pause
            result = await entity.answer(pause.pause_id, cantrip.Decision.approve())
            print(result.result, result.terminated)
        trio.run(main)
        """
        )
    )
    out = subprocess.run(
        [sys.executable, "-c", answering], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.split() == ["counted", "True"]
    assert counter.read_text() == "1"


APPROVING_SPEC = """
[llm]
provider = "scripted"
responses = [
  {tool_calls = [{gate = "echo", args = {text = "risky"}}]},
  {tool_calls = [{gate = "done", args = {answer = "finished"}}]},
]

[circle]
medium = "conversation"
gates = ["done", "echo"]
wards = [{max_turns = 4}]
approve = ["ech*"]

[loom]
path = "loom.db"
"""


def run_cli(
    tmp_path: Path, command: str, *flags: str, intent: str | None = None, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    spec = tmp_path / "approve.toml"
    spec.write_text(APPROVING_SPEC)
    tail = [] if intent is None else [intent]
    return subprocess.run(
        [sys.executable, "-m", "cantrip", command, *flags, str(spec), *tail],
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )


def test_cast_without_a_terminal_fails_fast_unless_told_what_to_do(tmp_path: Path) -> None:
    out = run_cli(tmp_path, "cast", intent="go")
    assert out.returncode == 1
    assert "pass --approve-all or --deny-all" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "loom.db").exists() or not cantrip.Loom.open(tmp_path / "loom.db").turns


def test_cast_approve_all_and_deny_all(tmp_path: Path) -> None:
    approved = run_cli(tmp_path, "cast", "--json", "--approve-all", intent="go")
    assert approved.returncode == 0, approved.stderr
    loom = cantrip.Loom.open(tmp_path / "loom.db")
    echoed = [r for t in loom.turns for r in t.gate_calls if r.gate == "echo"]
    assert echoed[-1].result == "risky" and echoed[-1].detail["approval"]["decision"] == "approve"
    loom.close()
    denied = run_cli(tmp_path, "cast", "--deny-all", intent="go")
    assert denied.returncode == 0, denied.stderr
    loom = cantrip.Loom.open(tmp_path / "loom.db")
    echoed = [r for t in loom.turns for r in t.gate_calls if r.gate == "echo"]
    assert echoed[-1].is_error and echoed[-1].result == "denied by the user: denied by --deny-all"
    loom.close()


def test_invoke_reads_intents_and_applies_the_standing_rule(tmp_path: Path) -> None:
    out = run_cli(tmp_path, "invoke", "--approve-all", stdin="go\n")
    assert out.returncode == 0, out.stderr
    assert "finished" in out.stdout


async def test_the_terminal_human_reads_yes_no_always_edit() -> None:
    from rich.console import Console

    from cantrip.protocols.terminal._human import TerminalHuman

    def human(*lines: str | None) -> TerminalHuman:
        feed = list(lines)

        async def read_line() -> str | None:
            return feed.pop(0)

        return TerminalHuman(Console(file=io.StringIO()), read_line)

    approval = Pause("p1", "e1", "approval", "bump", {"by": 1})
    question = Pause("p2", "e1", "question", "ask_user", {"question": "why?"}, question="why?")
    assert await human("y")(approval) == Decision.approve()
    assert await human("a")(approval) == Decision.approve(always=True)
    assert await human("n", "too risky")(approval) == Decision.deny("too risky")
    assert await human("n", "")(approval) == Decision.deny(None)
    assert await human("what", "e", "{not json", "e", '{"by": 2}')(approval) == Decision.edit(
        {"by": 2}
    )
    assert await human(None)(approval) == Decision.deny("no answer (end of input)")
    assert await human("because")(question) == Decision.answer("because")
