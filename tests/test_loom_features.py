"""The loom at work: folding, forks by replay, the loom inside a sandbox (issue 7).

Forks of code-medium entities rebuild the sandbox by replaying the recorded
code with every host call answered from the loom; the stateful fixture gate
``counter`` proves no gate runs during replay (LOOM-13).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import pytest
import trio

import gates
from cantrip import (
    Cantrip,
    Circle,
    Identity,
    LoomError,
    Message,
    Query,
    Response,
    ScriptedLLM,
    ToolDefinition,
    Ward,
    max_turns,
)
from cantrip._folding import FoldingPolicy, LLMFolder, effective_policy
from cantrip._gate import Gate
from cantrip._replay import ReplayHost, ReplayReport
from cantrip.llm import ToolChoice
from cantrip.loom import GateCallRecord
from cantrip.spec import build_cantrip, parse_spec
from gates.fixtures import call_count, fixture_gate
from mediums.base import Medium
from mediums.conversation import conversation
from mediums.js import JsMedium
from mediums.python import PythonMedium

CODE_MEDIUMS = [pytest.param(JsMedium(), id="js"), pytest.param(PythonMedium(), id="python")]

# -- helpers -------------------------------------------------------------------


def echo_call(text: str) -> dict[str, Any]:
    return {"tool_calls": [{"gate": "echo", "args": {"text": text}}]}


def done_call(answer: Any) -> dict[str, Any]:
    return {"tool_calls": [{"gate": "done", "args": {"answer": answer}}]}


def code(source: str) -> dict[str, Any]:
    return {"code": source}


def spell_for(
    medium: Medium,
    script: Sequence[Mapping[str, Any]],
    *extra: Gate,
    folding: FoldingPolicy | None = None,
    wards: Sequence[Ward] = (),
    system_prompt: str | None = None,
) -> Cantrip:
    return Cantrip(
        llm=ScriptedLLM(script),
        identity=Identity(system_prompt=system_prompt),
        circle=Circle([gates.done, gates.echo, *extra], [max_turns(12), *wards], medium),
        folding=folding,
    )


def js_or_py(medium: Medium, js: str, py: str) -> str:
    return js if medium.name == "js" else py


def assert_pairing(messages: Sequence[Message]) -> None:
    """Every tool message answers a call of the assistant message before it (seed 001)."""
    open_ids: set[str] = set()
    for message in messages:
        if message.role == "assistant":
            open_ids = {c.id for c in message.tool_calls}
        elif message.role == "tool":
            assert message.tool_call_id in open_ids, f"orphan tool message {message!r}"
            open_ids.discard(message.tool_call_id)
        else:
            assert not open_ids, f"calls {open_ids} left without results before {message!r}"


def queries(llm: Any) -> list[Query]:
    assert isinstance(llm, ScriptedLLM)
    return llm.invocations


def text_of(query: Query) -> str:
    return "\n".join(m.text() for m in query.messages)


# -- folding --------------------------------------------------------------------


async def test_token_threshold_folding_with_a_small_context_window() -> None:
    long = "the river rose two metres after the storm and flooded the lower meadow " * 2
    script = [echo_call(f"{i}: {long}") for i in range(1, 6)] + [done_call("logged")]
    spell = spell_for(
        conversation,
        script,
        folding=FoldingPolicy(context_window=120),
        system_prompt="You log floods.",
    )
    outcome = await spell.cast_async("Log the season")
    assert outcome.result == "logged"
    assert len(spell.loom) == 6, "the loom keeps every turn (LOOM-5)"
    sent = queries(spell.llm)
    folded = [q for q in sent if "[Folded: turns 1-" in text_of(q)]
    assert folded, "the token trigger never fired"
    for query in sent:
        assert query.messages[0] == Message(role="system", content="You log floods.")
        assert query.messages[1] == Message(role="user", content="Log the season")
        assert {t.name for t in query.tools} == {"done", "echo"}, "gate definitions stay (LOOM-6)"
        assert_pairing(query.messages)
    assert len(sent[-1].messages) < 2 + 2 * 5, "the last query is shorter than unfolded"


async def test_nothing_folds_below_the_window() -> None:
    spell = spell_for(
        conversation,
        [echo_call("a"), echo_call("b"), done_call("ok")],
        folding=FoldingPolicy(context_window=100_000),
    )
    await spell.cast_async("Stay small")
    assert not any("[Folded" in text_of(q) for q in queries(spell.llm))


class WindowedLLM(ScriptedLLM):
    """A scripted LLM that advertises a context window, as provider metadata will."""

    context_window = 100


async def test_the_llms_advertised_window_triggers_folding_without_a_policy() -> None:
    long = "x" * 300
    llm = WindowedLLM([echo_call(long), echo_call(long), done_call("ok")])
    spell = Cantrip(
        llm=llm,
        identity=Identity(),
        circle=Circle([gates.done, gates.echo], [max_turns(5)]),
    )
    await spell.cast_async("Fill the window")
    assert "[Folded: turns 1-1]" in text_of(llm.invocations[2])
    assert effective_policy(None, llm) == FoldingPolicy(context_window=100)
    explicit = FoldingPolicy(context_window=5000)
    assert effective_policy(explicit, llm) is explicit, "an explicit window wins"
    assert effective_policy(None, ScriptedLLM([])) is None


async def test_reported_prompt_tokens_drive_the_estimate() -> None:
    """Provider-measured prompt size (system prompt and tools included) counts."""
    script = [
        {**echo_call("tiny"), "usage": {"prompt_tokens": 900, "completion_tokens": 10}},
        {**echo_call("tiny"), "usage": {"prompt_tokens": 950, "completion_tokens": 10}},
        done_call("ok"),
    ]
    spell = spell_for(conversation, script, folding=FoldingPolicy(context_window=1000))
    await spell.cast_async("Measure")
    sent = queries(spell.llm)
    assert "[Folded" not in text_of(sent[1])
    assert "[Folded: turns 1-1]" in text_of(sent[2]), "950 + 10 tokens > 80 % of 1000"


class SummaryLLM:
    """Answers every query with a fixed summary (or fails), recording what it was asked."""

    name = "summariser"

    def __init__(self, answers: Sequence[str | Exception]) -> None:
        self.answers = list(answers)
        self.seen: list[list[Message]] = []

    async def query(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Response:
        self.seen.append(list(messages))
        await trio.sleep(0)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return Response(content=answer)


async def test_llm_folder_writes_the_summary_at_the_start_of_the_next_turn() -> None:
    summariser = SummaryLLM(["SUMMARY-ONE", "SUMMARY-TWO"])
    script = [echo_call(f"clue {i}") for i in range(1, 6)] + [done_call("solved")]
    spell = spell_for(
        conversation,
        script,
        folding=FoldingPolicy(trigger_after_turns=2, folder=LLMFolder(summariser)),
    )
    outcome = await spell.cast_async("Solve it")
    assert outcome.result == "solved"
    sent = queries(spell.llm)
    assert len(sent) == 6, "the summary query is not a turn"
    assert "[Folded" not in text_of(sent[2])
    assert "[Folded: turns 1-2]\nSUMMARY-ONE" in text_of(sent[3])
    assert "clue 1" not in text_of(sent[3]) and "clue 3" in text_of(sent[3])
    assert "[Folded: turns 1-4]\nSUMMARY-TWO" in text_of(sent[5])
    first, second = summariser.seen
    assert first[0].role == "system" and "clue 1" in (first[1].content or "")
    assert "SUMMARY-ONE" in (second[1].content or ""), "the previous summary is extended"
    assert "clue 3" in (second[1].content or "") and "clue 1" not in (second[1].content or "")
    for query in sent:
        assert_pairing(query.messages)
    assert len(spell.loom) == 6


async def test_llm_folder_failure_falls_back_to_the_template() -> None:
    summariser = SummaryLLM([RuntimeError("provider down")])
    script = [echo_call("one"), echo_call("two"), echo_call("three"), done_call("ok")]
    spell = spell_for(
        conversation,
        script,
        folding=FoldingPolicy(trigger_after_turns=2, folder=LLMFolder(summariser)),
    )
    await spell.cast_async("Go")
    folded = text_of(queries(spell.llm)[3])
    assert "[Folded: turns 1-2]" in folded
    assert 'echo({"text": "one"}) -> one' in folded, "the template summary stands in"


async def test_delegation_pieces_fold_together() -> None:
    child = ScriptedLLM([done_call("child answer")])
    script = [
        echo_call("before"),
        {
            "tool_calls": [
                {"gate": "echo", "args": {"text": "first"}, "id": "e1"},
                {"gate": "call_agent", "args": {"intent": "help"}, "id": "d1"},
                {"gate": "echo", "args": {"text": "after"}, "id": "e2"},
            ]
        },
        echo_call("later"),
        echo_call("later still"),
        done_call("ok"),
    ]
    spell = Cantrip(
        llm=ScriptedLLM(script),
        identity=Identity(),
        circle=Circle(
            [gates.done, gates.echo, gates.call_agent], [max_turns(8), Ward("max_depth", 1)]
        ),
        llms={"child_llm": child},
        folding=FoldingPolicy(trigger_after_turns=1),
    )
    outcome = await spell.cast_async("Delegate")
    assert outcome.result == "ok"
    phases = [t.extras.get("phase") for t in spell.loom.entity_turns(outcome.entity_id)]
    assert "checkpoint" in phases and "continuation" in phases
    for query in queries(spell.llm):
        assert_pairing(query.messages)
    assert "[Folded: turns 1-2]" in text_of(queries(spell.llm)[3])


@pytest.mark.parametrize("medium", CODE_MEDIUMS)
async def test_sandbox_state_survives_folding(medium: Medium) -> None:
    script = [
        code(js_or_py(medium, "var notes = ['a'];", "notes = ['a']")),
        code(js_or_py(medium, "notes.push('b');", "notes.append('b')")),
        code(js_or_py(medium, "notes.push('c');", "notes.append('c')")),
        code(js_or_py(medium, "done(notes.join(''));", "done(''.join(notes))")),
    ]
    spell = spell_for(medium, script, folding=FoldingPolicy(trigger_after_turns=1))
    outcome = await spell.cast_async("Keep notes")
    assert outcome.result == "abc", "the variables live in the sandbox, not the prompt"
    last = queries(spell.llm)[-1]
    assert "[Folded: turns 1-2]" in text_of(last)
    assert sum(1 for m in last.messages if m.role == "assistant") == 1, "one turn kept verbatim"


# -- forks by replay -------------------------------------------------------------


def counter_spell(medium: Medium, script: Sequence[Mapping[str, Any]]) -> tuple[Cantrip, Gate]:
    counter = fixture_gate("counter", stateful=True)
    return spell_for(medium, script, counter), counter


def counting_script(medium: Medium) -> list[dict[str, Any]]:
    return [
        code(js_or_py(medium, "var seen = [counter()]; seen", "seen = [counter()]\nseen")),
        code(js_or_py(medium, "seen.push(counter()); seen", "seen.append(counter())\nseen")),
        code(js_or_py(medium, "done(seen);", "done(seen)")),
    ]


@pytest.mark.parametrize("medium", CODE_MEDIUMS)
async def test_fork_of_a_code_entity_replays_without_calling_gates(medium: Medium) -> None:
    spell, counter = counter_spell(medium, counting_script(medium))
    original = await spell.cast_async("Count")
    assert original.result == [1, 2]
    assert call_count(counter) == 2
    before = [t.to_dict() for t in spell.loom.turns]

    more = js_or_py(
        medium, "seen.push(counter()); done(seen);", "seen.append(counter())\ndone(seen)"
    )
    entity = spell.fork(original.turns[1], llm=ScriptedLLM([code(more)]))
    assert spell.loom.entity(entity.id).fork_strategy == "replay"
    assert call_count(counter) == 2, "forking itself calls nothing"
    async with entity:
        forked = await entity.send("Count once more")
    assert forked.result == [1, 2, 3], "variables restored; replay answered from the loom"
    assert call_count(counter) == 3, "only the fork's own call ran (LOOM-13)"
    report = entity.restore_report
    assert report is not None
    assert (report.turns, report.code_calls, report.hydrated) == (2, 2, 2)
    assert not report.divergences
    # The original thread is untouched; the two threads share the prefix.
    assert [t.to_dict() for t in spell.loom.turns[: len(before)]] == before
    threads = spell.loom.threads()
    assert len(threads) == 2
    assert [t.id for t in threads[1][:2]] == [t.id for t in original.turns[:2]]
    assert threads[1][2].parent_id == original.turns[1].id
    assert threads[1][2].sequence == 3


@pytest.mark.parametrize("medium", CODE_MEDIUMS)
async def test_fork_by_sequence_with_another_llm(medium: Medium) -> None:
    spell, counter = counter_spell(medium, counting_script(medium))
    original = await spell.cast_async("Count")
    other = ScriptedLLM([code(js_or_py(medium, "done(seen.length);", "done(len(seen))"))])
    result = await spell.fork_async(1, "How many?", thread=original.entity_id, llm=other)
    assert result.result == 1, "forked after turn 1: one count so far"
    assert call_count(counter) == 2
    query = other.invocations[0]
    assert query.messages[-1] == Message(role="user", content="How many?")
    assert "Count" in text_of(query) and "done(seen)" not in text_of(query)
    with pytest.raises(LoomError):
        spell.fork(2)  # a sequence needs a thread


@pytest.mark.parametrize("medium", CODE_MEDIUMS)
async def test_fork_after_folding(medium: Medium) -> None:
    counter = fixture_gate("counter", stateful=True)
    script = [
        code(js_or_py(medium, "var total = counter();", "total = counter()")),
        code(js_or_py(medium, "total += counter();", "total += counter()")),
        code(js_or_py(medium, "total += counter();", "total += counter()")),
        code(js_or_py(medium, "done(total);", "done(total)")),
    ]
    spell = spell_for(medium, script, counter, folding=FoldingPolicy(trigger_after_turns=1))
    original = await spell.cast_async("Add up")
    assert original.result == 6
    other = ScriptedLLM([code(js_or_py(medium, "done(total * 10);", "done(total * 10)"))])
    forked = await spell.fork_async(original.turns[2], "Scale it", llm=other)
    assert forked.result == 60, "1 + 2 + 3 restored by replay, though folded out of view"
    assert call_count(counter) == 3
    assert "[Folded: turns 1-2]" in text_of(other.invocations[0])


async def test_replay_hydrates_errors_and_ephemeral_results() -> None:
    boom = fixture_gate("boom", behavior="throw", error="no luck")
    secret = fixture_gate("blob", result={"rows": list(range(50))}).with_options(ephemeral=True)
    counter = fixture_gate("counter", stateful=True)
    script = [
        code(
            "var caught = null; try { boom(); } catch (e) { caught = e.message; }\n"
            "var rows = blob().rows.length; var n = counter();"
        ),
        code("done([caught, rows, n]);"),
    ]
    spell = spell_for(JsMedium(), script, boom, secret, counter)
    original = await spell.cast_async("Try")
    assert original.result == ["no luck", 50, 1]
    other = ScriptedLLM([code("done([caught, rows, n, counter()]);")])
    forked = await spell.fork_async(original.turns[0], "Again", llm=other)
    assert forked.result == ["no luck", 50, 1, 2]
    assert call_count(counter) == 2


async def test_fork_from_a_delegation_checkpoint_is_refused() -> None:
    child = ScriptedLLM([done_call("child answer")])
    script = [
        {"tool_calls": [{"gate": "call_agent", "args": {"intent": "help"}}]},
        done_call("ok"),
    ]
    spell = Cantrip(
        llm=ScriptedLLM(script),
        identity=Identity(),
        circle=Circle([gates.done, gates.call_agent], [max_turns(4), Ward("max_depth", 1)]),
        llms={"child_llm": child},
    )
    outcome = await spell.cast_async("Delegate")
    checkpoint = next(t for t in outcome.turns if t.extras.get("phase") == "checkpoint")
    with pytest.raises(LoomError, match="checkpoint"):
        spell.fork(checkpoint)
    # The continuation completes the utterance: forking there works.
    continuation = next(t for t in outcome.turns if t.extras.get("phase") == "continuation")
    again = ScriptedLLM([done_call("again")])
    assert (await spell.fork_async(continuation, "More", llm=again)).result == "again"


@pytest.mark.parametrize("medium", CODE_MEDIUMS)
async def test_resume_restores_the_sandbox_by_replay(medium: Medium) -> None:
    counter = fixture_gate("counter", stateful=True)
    script = [
        code(js_or_py(medium, "var kept = counter() + 41;", "kept = counter() + 41")),
        code("done(kept);" if medium.name == "js" else "done(kept)"),
    ]
    spell = spell_for(medium, script, counter)
    entity = spell.summon()
    async with entity:
        first = await entity.send("Remember")
    assert first.result == 42
    again_code = "done(kept + counter());" if medium.name == "js" else "done(kept + counter())"
    resumed = spell.with_(llm=ScriptedLLM([code(again_code)])).resume(entity.id)
    async with resumed:
        again = await resumed.send("Recall")
    assert again.result == 44, "kept restored (42) and the live counter ran once more (2)"
    assert call_count(counter) == 2
    assert [t.sequence for t in spell.loom.entity_turns(entity.id)] == [1, 2, 3]


def test_mediums_declare_their_fork_strategy() -> None:
    from cantrip._replay import fork_strategy
    from mediums.bash import BashMedium

    assert fork_strategy(JsMedium()) == fork_strategy(PythonMedium()) == "replay"
    assert fork_strategy(conversation) == "replay", "its only state is the context"
    assert fork_strategy(BashMedium()) == "context-only", "a shell is not replayed"


async def test_replay_resets_where_the_sandbox_was_lost() -> None:
    script = [
        code("var a = 1;"),
        code("while (true) {}"),
        code("var b = 2;"),
        code("done([typeof a, b]);"),
    ]
    # A runaway costs the whole eval limit: replaying it would take >= 1 s, a
    # reset a worker start (tens of ms idle, a few hundred on a loaded machine).
    spell = spell_for(JsMedium(max_eval_ms=1000), script)
    original = await spell.cast_async("Loop")
    assert original.result == ["undefined", 2], "the time limit cost the sandbox its state"
    assert original.turns[1].extras["sandbox_resets"] == [0]
    other = ScriptedLLM([code("done([typeof a, b]);")])
    entity = spell.fork(original.turns[2], llm=other)
    async with entity:
        forked = await entity.send("Again")
    assert forked.result == ["undefined", 2]
    report = entity.restore_report
    assert report is not None and report.resets == 1
    assert report.duration_ms < 1000, "the runaway code was run again"


async def test_a_cut_turn_is_replayed_as_it_happened_in_python() -> None:
    slow = fixture_gate("slow", behavior="delay", delay_ms=5_000, result="late")
    counter = fixture_gate("counter", stateful=True)
    script = [
        code("a = counter()\nb = slow()\nc = 3"),
    ]
    spell = spell_for(PythonMedium(), script, slow, counter, wards=[Ward("timeout_s", 0.5)])
    cut = await spell.cast_async("Wait")
    assert cut.truncated and cut.reason == "timeout"
    probe = "try:\n    b\n    has_b = True\nexcept NameError:\n    has_b = False\n"
    other = ScriptedLLM([code(probe + "done([a, has_b, counter()])")])
    forked = await spell.fork_async(cut.turns[-1], "Carry on", llm=other)
    assert forked.result == [1, False, 2], "a kept, the cut assignment never happened"
    assert call_count(counter) == 2


async def test_replay_host_answers_from_the_record_and_reports_divergence() -> None:
    counter = fixture_gate("counter", stateful=True)
    circle = Circle([gates.done, counter], [max_turns(2)])
    record = GateCallRecord(gate="counter", result=7)
    report = ReplayReport()
    host = ReplayHost(circle, [record], report)
    assert await host.call("counter", {}) is record
    odd = await host.call("done", {"answer": 1})
    assert odd.is_error and "replay" in str(odd.result)
    assert report.hydrated == 1 and len(report.divergences) == 1
    assert call_count(counter) == 0


async def test_conversation_fork_records_its_strategy() -> None:
    spell = spell_for(conversation, [echo_call("one"), done_call("ok")])
    outcome = await spell.cast_async("Go")
    entity = spell.fork(outcome.turns[0].id)
    assert spell.loom.entity(entity.id).forked_from == outcome.turns[0].id
    assert spell.loom.entity(entity.id).fork_strategy == "replay"
    await entity.aclose()


# -- the loom inside the sandbox (LOOM-11) ------------------------------------------


@pytest.mark.parametrize("medium", CODE_MEDIUMS)
async def test_the_loom_is_readable_from_code(medium: Medium) -> None:
    script = [
        code(
            js_or_py(
                medium,
                "echo('marker sk-ant-api03-FAKEsecret000000000');",
                "echo('marker sk-ant-api03-FAKEsecret000000000')",
            )
        ),
        code(
            js_or_py(
                medium,
                "var ts = loom.turns; ts[0].utterance = 'changed';\n"
                "done([ts.length, loom.thread()[0].utterance.indexOf('marker') >= 0,\n"
                "  loom.turn(1).gate_calls[0].gate, loom.turn(1).gate_calls[0].result,\n"
                "  loom.turn(7)]);",
                "ts = loom.turns\nts[0]['utterance'] = 'changed'\n"
                "first = loom.turn(1)['gate_calls'][0]\n"
                "done([len(ts), 'marker' in loom.thread()[0]['utterance'],\n"
                "  first['gate'], first['result'], loom.turn(7)])",
            )
        ),
    ]
    spell = spell_for(medium, script)
    outcome = await spell.cast_async("Look back")
    assert outcome.result == [1, True, "echo", "marker [REDACTED]", None]
    assert "FAKEsecret" in spell.loom.turns[0].observation, "the loom itself is unchanged"
    assert "loom.turns" in spell.circle.tools()[0].description


@pytest.mark.parametrize(
    ("medium", "probe", "expected"),
    [
        pytest.param(JsMedium(expose_loom=False), "done(typeof loom);", "undefined", id="js"),
        pytest.param(
            PythonMedium(expose_loom=False),
            "try:\n    loom\n    done('defined')\nexcept NameError:\n    done('undefined')",
            "undefined",
            id="python",
        ),
    ],
)
async def test_the_loom_can_be_kept_out_of_the_sandbox(
    medium: Medium, probe: str, expected: str
) -> None:
    spell = spell_for(medium, [code(probe)])
    assert (await spell.cast_async("Probe")).result == expected
    assert "loom.turns" not in spell.circle.tools()[0].description


def test_spec_files_switch_the_loom_on_and_off() -> None:
    def build(circle: dict[str, Any]) -> Cantrip:
        doc = parse_spec({"llm": {"responses": []}, "circle": circle})
        return build_cantrip(doc)

    off = build(
        {"medium": "js", "gates": ["done"], "wards": [{"max_turns": 2}], "expose_loom": False}
    )
    assert attrs.asdict(off.circle.medium)["expose_loom"] is False  # type: ignore[arg-type]
    on = build({"medium": "python", "gates": ["done"], "wards": [{"max_turns": 2}]})
    assert attrs.asdict(on.circle.medium)["expose_loom"] is True  # type: ignore[arg-type]
    with pytest.raises(Exception, match="cannot expose the loom"):
        build(
            {
                "medium": "conversation",
                "gates": ["done"],
                "wards": [{"max_turns": 2}],
                "expose_loom": True,
            }
        )


async def test_a_child_reads_only_its_own_history() -> None:
    child = ScriptedLLM(
        [
            code("echo('child step');"),
            code("done(loom.turns.map(function (t) { return t.entity_id; }));"),
        ]
    )
    script = [
        {"tool_calls": [{"gate": "call_agent", "args": {"intent": "look", "medium": "js"}}]},
        done_call("ok"),
    ]
    spell = Cantrip(
        llm=ScriptedLLM(script),
        identity=Identity(),
        circle=Circle(
            [gates.done, gates.echo, gates.call_agent], [max_turns(4), Ward("max_depth", 1)]
        ),
        llms={"child_llm": child},
    )
    await spell.cast_async("Delegate")
    child_id = next(e for e in spell.loom.entities.values() if e.parent_entity_id).entity_id
    last = spell.loom.last_turn(child_id)
    assert last is not None and last.result == [child_id]


async def test_a_spec_file_can_have_an_llm_write_the_fold_summary() -> None:
    from cantrip.spec import build_cantrip, parse_spec

    echo_turn = {"tool_calls": [{"gate": "echo", "args": {"text": "step"}}]}
    doc = parse_spec(
        {
            "llm": {"responses": [echo_turn] * 4 + [{"content": "finished"}]},
            "llms": {"summarizer": {"responses": [{"content": "SUMMARY BY THE LLM"}] * 5}},
            "circle": {
                "medium": "conversation",
                "gates": ["done", "echo"],
                "wards": [{"max_turns": 8}],
            },
            "folding": {"trigger_after_turns": 2, "folder": "llm", "folder_llm": "summarizer"},
        }
    )
    spell = build_cantrip(doc)
    outcome = await spell.cast_async("work in steps")
    assert outcome.result == "finished"
    queries = spell.llm.invocations  # type: ignore[attr-defined]
    folded = [q for q in queries if any("[Folded:" in (m.content or "") for m in q.messages)]
    assert folded and any("SUMMARY BY THE LLM" in (m.content or "") for m in folded[-1].messages)
    assert len(spell.loom) == 5  # the loom keeps every turn


def test_folder_llm_must_name_a_known_llm() -> None:
    from cantrip import ConstructionError
    from cantrip.spec import build_cantrip, parse_spec

    doc = parse_spec(
        {
            "llm": {"responses": [{"content": "x"}]},
            "circle": {"medium": "conversation", "gates": ["done"], "wards": [{"max_turns": 2}]},
            "folding": {"trigger_after_turns": 2, "folder": "llm", "folder_llm": "ghost"},
        }
    )
    with pytest.raises(ConstructionError, match="folder_llm 'ghost' is not a named llm"):
        build_cantrip(doc)
