"""The transcript renderer: canonical history to a provider-valid transcript (seed 001)."""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cantrip._context import render_turn
from cantrip._errors import InvalidResponseError
from cantrip.llm._contract import Message, ToolCall
from cantrip.llm._transcript import render_transcript
from cantrip.llm._transcript_check import validate_transcript
from cantrip.llm._transcript_ids import project_id
from cantrip.llm._transcript_incremental import IncrementalRenderer
from cantrip.llm._transcript_model import (
    DEFAULT_POLICY,
    CompletionPolicy,
    ProviderFormat,
    RenderedTranscript,
    TranscriptError,
)
from cantrip.loom._model import GateCallRecord, Turn
from mediums.conversation import SKIPPED_AFTER_DONE, conversation

PROVIDERS: tuple[ProviderFormat, ...] = ("openai", "anthropic", "gemini", "mistral", "kimi")
ID_FORMATS = {
    "openai": re.compile(r"call_[A-Za-z0-9_-]{1,35}"),
    "anthropic": re.compile(r"toolu_[A-Za-z0-9_-]{1,58}"),
    "gemini": re.compile(r"[A-Za-z0-9_-]{1,64}"),
    "mistral": re.compile(r"[A-Za-z0-9]{9}"),
    "kimi": re.compile(r"functions\.[A-Za-z0-9_-]+:\d+"),
}
MISSING = DEFAULT_POLICY.missing
INTERRUPTED = DEFAULT_POLICY.interrupted


def user(text: str) -> Message:
    return Message(role="user", content=text)


def system(text: str = "You are a test entity.") -> Message:
    return Message(role="system", content=text)


def call(call_id: str, name: str = "echo", **args: Any) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=args)


def asst(*calls: ToolCall, content: str | None = None, thinking: str | None = None) -> Message:
    return Message(role="assistant", content=content, tool_calls=calls, thinking=thinking)


def res(
    call_id: str | None, content: str, *, name: str = "echo", is_error: bool = False
) -> Message:
    return Message(role="tool", content=content, tool_call_id=call_id, name=name, is_error=is_error)


def tool_messages(rendered: RenderedTranscript) -> list[Message]:
    return [m for m in rendered.messages if m.role == "tool"]


def answer(rendered: RenderedTranscript, canonical_key: str) -> Message:
    """The tool message answering the call with that canonical key."""
    projected = rendered.id_map[canonical_key]
    (message,) = [m for m in rendered.messages if m.role == "tool" and m.tool_call_id == projected]
    return message


def render(messages: Sequence[Message], provider: ProviderFormat = "openai", **kw: Any) -> Any:
    rendered = render_transcript(messages, provider, debug=True, **kw)
    assert validate_transcript(rendered.messages, provider) == []
    return rendered


# --- seed 001, section 7: the requested sequence ---------------------------------------------


def seed_sequence() -> list[Message]:
    return [
        system(),
        user("chat"),
        asst(call("hist_tool_1", "read"), thinking="first thought"),
        res("hist_tool_1", "one", name="read"),
        asst(*(call(f"hist_tool_{i}", "read", n=i) for i in range(2, 7)), thinking="again"),
        res("hist_tool_3", "three", name="read"),
        asst(content="streamed text", thinking="last thought"),
    ]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_seed_sequence_renders_valid_for_every_provider(provider: ProviderFormat) -> None:
    rendered = render(seed_sequence(), provider)
    roles = [m.role for m in rendered.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"] + ["tool"] * 5 + [
        "assistant"
    ]
    assert answer(rendered, "hist_tool_1").content == "one"
    assert answer(rendered, "hist_tool_3").content == "three"
    for key in ("hist_tool_2", "hist_tool_4", "hist_tool_5", "hist_tool_6"):
        synthetic = answer(rendered, key)
        assert synthetic.content == MISSING
        assert synthetic.is_error
        assert synthetic.name == "read"
    diagnostics = rendered.diagnostics
    assert [s.call_id for s in diagnostics.synthetic_completions] == [
        "hist_tool_2",
        "hist_tool_4",
        "hist_tool_5",
        "hist_tool_6",
    ]
    assert {s.reason for s in diagnostics.synthetic_completions} == {"missing"}
    assert diagnostics.canonical_call_ids == tuple(f"hist_tool_{i}" for i in range(1, 7))
    assert diagnostics.emitted_call_ids == diagnostics.emitted_result_ids
    assert diagnostics.provider_format == provider
    # Thinking stays beside the tool calls.
    assert rendered.messages[2].thinking == "first thought"
    assert rendered.messages[2].tool_calls[0].name == "read"
    assert all(ID_FORMATS[provider].fullmatch(i) for i in diagnostics.emitted_call_ids)


# --- pairing and synthetic completions --------------------------------------------------------


def test_calls_cut_off_at_the_end_are_interrupted() -> None:
    rendered = render([user("go"), asst(call("a"), call("b")), res("a", "ok")])
    assert answer(rendered, "b").content == INTERRUPTED
    (synthetic,) = rendered.diagnostics.synthetic_completions
    assert (synthetic.call_id, synthetic.reason, synthetic.name) == ("b", "interrupted", "echo")
    assert synthetic.projected_id == rendered.id_map["b"]


def test_calls_the_conversation_moved_past_are_missing() -> None:
    rendered = render([user("go"), asst(call("a")), user("next")])
    assert answer(rendered, "a").content == MISSING
    assert rendered.diagnostics.synthetic_completions[0].reason == "missing"
    assert [m.role for m in rendered.messages] == ["user", "assistant", "tool", "user"]


def test_a_custom_completion_policy() -> None:
    policy = CompletionPolicy(missing="[no result]", interrupted="[stopped]", is_error=False)
    rendered = render([user("go"), asst(call("a")), user("next"), asst(call("b"))], policy=policy)
    assert (answer(rendered, "a").content, answer(rendered, "a").is_error) == ("[no result]", False)
    assert answer(rendered, "b").content == "[stopped]"


def test_recorded_completions_of_every_status_are_real_results() -> None:
    records = (
        GateCallRecord("echo", {"text": "x"}, "x", tool_call_id="c1", status="ok"),
        GateCallRecord("echo", {}, "boom", is_error=True, tool_call_id="c2", status="error"),
        GateCallRecord("done", {"answer": 1}, 1, tool_call_id="c3", status="ok"),
        GateCallRecord("echo", {}, SKIPPED_AFTER_DONE, tool_call_id="c4", status="skipped"),
        GateCallRecord(
            "call_agent", {}, "cancelled", is_error=True, tool_call_id="c5", status="cancelled"
        ),
        GateCallRecord("echo", {}, "crashed", is_error=True, tool_call_id="c6", status="crashed"),
    )
    turn = Turn(
        id="t1",
        parent_id=None,
        entity_id="e",
        sequence=1,
        thinking="plan",
        tool_calls=tuple(ToolCall(r.tool_call_id or "", r.gate, r.args) for r in records),
        gate_calls=records,
    )
    history = [system(), user("intent"), *render_turn(turn, conversation)]
    for provider in PROVIDERS:
        rendered = render(history, provider)
        assert [(m.content, m.is_error) for m in tool_messages(rendered)] == [
            ("x", False),
            ("boom", True),
            ("1", False),
            (SKIPPED_AFTER_DONE, False),
            ("cancelled", True),
            ("crashed", True),
        ]
        assert rendered.diagnostics.synthetic_completions == ()


# --- placement --------------------------------------------------------------------------------


def test_late_results_are_moved_back_next_to_their_call() -> None:
    history = [
        user("go"),
        asst(call("a"), call("b")),
        res("a", "A"),
        user("meanwhile"),
        asst(content="thinking out loud"),
        res("b", "B"),
    ]
    rendered = render(history)
    assert [(m.role, m.content) for m in rendered.messages] == [
        ("user", "go"),
        ("assistant", None),
        ("tool", "A"),
        ("tool", "B"),
        ("user", "meanwhile"),
        ("assistant", "thinking out loud"),
    ]
    assert rendered.diagnostics.moved_results == ("b",)


def test_results_are_put_in_call_order() -> None:
    rendered = render(
        [user("go"), asst(call("a"), call("b"), call("c")), *(res(i, i.upper()) for i in "cab")]
    )
    assert [m.content for m in tool_messages(rendered)] == ["A", "B", "C"]
    assert set(rendered.diagnostics.moved_results) == {"a", "b"}


# --- dedupe -----------------------------------------------------------------------------------


def test_identical_duplicates_are_emitted_once() -> None:
    rendered = render([user("go"), asst(call("a")), res("a", "A"), res("a", "A")])
    assert [m.content for m in tool_messages(rendered)] == ["A"]
    (decision,) = rendered.diagnostics.dedupe_decisions
    assert (decision.call_id, decision.kept, decision.dropped, decision.reason) == (
        "a",
        2,
        3,
        "duplicate_identical",
    )


def test_the_first_real_result_wins_over_a_conflicting_one() -> None:
    rendered = render([user("go"), asst(call("a")), res("a", "first"), user("x"), res("a", "2nd")])
    assert answer(rendered, "a").content == "first"
    assert rendered.diagnostics.dedupe_decisions[0].reason == "duplicate_conflicting"


def test_a_real_result_replaces_a_recorded_synthetic_one() -> None:
    history = [user("go"), asst(call("a")), res("a", MISSING, is_error=True), res("a", "real")]
    rendered = render(history)
    assert answer(rendered, "a").content == "real"
    (decision,) = rendered.diagnostics.dedupe_decisions
    assert (decision.kept, decision.dropped, decision.reason) == (3, 2, "real_over_synthetic")
    # ... and a synthetic one recorded after a real one is ignored.
    rendered = render(
        [user("go"), asst(call("a")), res("a", "real"), res("a", MISSING, is_error=True)]
    )
    assert answer(rendered, "a").content == "real"
    assert rendered.diagnostics.dedupe_decisions[0].reason == "synthetic_duplicate"


def test_rendering_a_rendered_transcript_changes_nothing() -> None:
    for provider in PROVIDERS:
        once = render(seed_sequence(), provider)
        twice = render(once.messages, provider)
        assert twice.messages == once.messages
        assert twice.diagnostics.synthetic_completions == ()


# --- orphans (LLM-7) --------------------------------------------------------------------------


def test_orphan_results_are_dropped_and_reported() -> None:
    history = [
        user("go"),
        res("early", "before its call"),
        asst(call("early"), call("a")),
        res("a", "A"),
        res("nobody", "stray", name="ghost"),
        res(None, "no id"),
    ]
    rendered = render(history)
    contents = [m.content for m in rendered.messages]
    assert "stray" not in contents
    assert "no id" not in contents
    assert "before its call" not in contents
    assert answer(rendered, "early").content == INTERRUPTED
    orphans = rendered.diagnostics.dropped_orphan_results
    assert [(o.tool_call_id, o.position, o.name) for o in orphans] == [
        ("early", 1, "echo"),
        ("nobody", 4, "ghost"),
        (None, 5, "echo"),
    ]


def test_validator_names_an_orphan_result() -> None:
    history = [user("go"), asst(call("call_a")), res("call_a", "A"), res("call_zz", "stray")]
    problems = validate_transcript(history, "openai")
    assert len(problems) == 1
    assert "tool result without matching tool call" in problems[0]
    assert "LLM-7" in problems[0]
    with pytest.raises(TranscriptError, match="tool result without matching tool call") as info:
        validate_transcript(history, "openai", strict=True)
    assert isinstance(info.value, InvalidResponseError)
    assert info.value.problems == problems


def test_validator_refuses_a_result_that_is_not_right_after_its_call() -> None:
    history = [user("go"), asst(call("call_a")), user("later"), res("call_a", "A")]
    problems = validate_transcript(history, "openai")
    assert any("tool result without matching tool call" in p for p in problems)
    assert any("has no tool result right after" in p for p in problems)
    # The renderer moves it back instead.
    rendered = render(history)
    assert [m.role for m in rendered.messages] == ["user", "assistant", "tool", "user"]


def test_validator_catches_duplicates_order_and_ids() -> None:
    history = [
        user("go"),
        asst(call("call_a"), call("call_b")),
        res("call_b", "B"),
        res("call_a", "A"),
        res("call_a", "A"),
        asst(call("call_a")),
        res("call_a", "again"),
    ]
    problems = "\n".join(validate_transcript(history, "openai"))
    assert "out of call order" in problems
    assert "a second tool result" in problems
    assert "already used" in problems
    assert validate_transcript([asst(call("x"))], "mistral")[0].endswith(
        "is not exactly 9 letters or digits"
    )
    assert validate_transcript([user("u"), asst()], "openai") == [
        "message 1: assistant message with neither content nor tool calls"
    ]


def test_validator_knows_alternation_rules() -> None:
    history = [user("a"), user("b"), asst(content="x"), asst(content="y"), system("late")]
    assert validate_transcript(history, "openai") == []
    problems = validate_transcript(history, "anthropic")
    assert len(problems) == 3
    assert "needs a user message" in validate_transcript([asst(content="x")], "gemini")[0]


# --- id projection ----------------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
def test_projected_ids_match_the_provider_format(provider: ProviderFormat) -> None:
    weird = ["", "", "hist_tool_1", "call_abc", "toolu_01X", "a" * 100, "x:y/z", "123456789"]
    history = [user("go"), asst(*(call(i, name="my.tool") for i in weird))]
    history += [res(i, f"r{n}", name="my.tool") for n, i in enumerate(weird)]
    rendered = render(history, provider)
    ids = rendered.diagnostics.emitted_call_ids
    assert len(set(ids)) == len(ids) == len(weird)
    assert all(ID_FORMATS[provider].fullmatch(i) for i in ids), ids
    # The two empty ids got different ids and each kept its own result.
    assert [m.content for m in tool_messages(rendered)] == [f"r{n}" for n in range(len(weird))]
    assert set(rendered.id_map) == {
        "",
        "#2",
        "hist_tool_1",
        "call_abc",
        "toolu_01X",
        "a" * 100,
        "x:y/z",
        "123456789",
    }


def test_native_ids_are_kept_and_others_hashed() -> None:
    assert project_id("call_abc", "openai", index=0, name="f", taken=set()) == "call_abc"
    assert project_id("toolu_01X", "anthropic", index=0, name="f", taken=set()) == "toolu_01X"
    assert project_id("abcDEF123", "mistral", index=0, name="f", taken=set()) == "abcDEF123"
    assert project_id("hist_tool_1", "gemini", index=0, name="f", taken=set()) == "hist_tool_1"
    # Stable across versions and processes: a fixed hash, not Python's hash().
    assert project_id("hist_tool_1", "openai", index=0, name="f", taken=set()) == (
        "call_4b036c465e1abdb12168dc62"
    )
    assert project_id("hist_tool_1", "anthropic", index=7, name="g", taken=set()) == (
        "toolu_4b036c465e1abdb12168dc62"
    )
    assert project_id("call_" + "x" * 40, "openai", index=0, name="f", taken=set()) != (
        "call_" + "x" * 40
    )


def test_kimi_ids_carry_the_name_and_a_global_index() -> None:
    history = [
        user("go"),
        asst(call("a", "read"), call("b", "web.search")),
        res("a", "A", name="read"),
        res("b", "B", name="web.search"),
        asst(call("c", "")),
        res("c", "C", name=""),
    ]
    rendered = render(history, "kimi")
    assert rendered.diagnostics.emitted_call_ids == (
        "functions.read:0",
        "functions.web_search:1",
        "functions.tool:2",
    )
    assert project_id("x", "kimi", index=3, name="f", taken={"functions.f:3"}) == "functions.f:4"


def test_collisions_are_resolved_deterministically() -> None:
    for provider in ("openai", "anthropic", "gemini", "mistral"):
        first = project_id("hist_tool_9", provider, index=0, name="f", taken=set())
        taken = {first}
        second = project_id("hist_tool_9", provider, index=0, name="f", taken=taken)
        assert second != first
        assert taken == {first, second}
        assert second == project_id("hist_tool_9", provider, index=0, name="f", taken={first})
        assert ID_FORMATS[provider].fullmatch(second)


def test_empty_ids_depend_on_position_and_name_only() -> None:
    a = project_id("", "openai", index=0, name="f", taken=set())
    assert a == project_id("", "openai", index=0, name="f", taken=set())
    assert a != project_id("", "openai", index=1, name="f", taken=set())
    assert a != project_id("", "openai", index=0, name="g", taken=set())


def test_a_reused_canonical_id_gets_a_fresh_id_per_call() -> None:
    # Some models number calls afresh each turn: call_0 in every utterance.
    history = [user("go")]
    for turn in range(3):
        history += [
            asst(call("call_0"), call("call_1")),
            res("call_0", f"{turn}.0"),
            res("call_1", f"{turn}.1"),
        ]
    for provider in PROVIDERS:
        rendered = render(history, provider)
        assert [m.content for m in tool_messages(rendered)] == [
            f"{t}.{c}" for t in range(3) for c in range(2)
        ]
        assert len(set(rendered.id_map.values())) == 6
        assert list(rendered.id_map) == [
            "call_0",
            "call_1",
            "call_0#2",
            "call_1#2",
            "call_0#3",
            "call_1#3",
        ]
    assert render(history).id_map["call_0"] == "call_0"


def test_rendering_is_deterministic() -> None:
    history = [*seed_sequence(), res("zz", "orphan"), asst(call(""), call("")), res("", "e")]
    for provider in PROVIDERS:
        renders = [render_transcript(history, provider) for _ in range(3)]
        assert renders[0] == renders[1] == renders[2]


# --- thinking ---------------------------------------------------------------------------------


def test_thinking_can_be_dropped_without_touching_pairing() -> None:
    history = [*seed_sequence(), asst(thinking="only thinking")]
    for provider in PROVIDERS:
        kept = render(history, provider)
        dropped = render(history, provider, keep_thinking=False)
        assert all(m.thinking is None for m in dropped.messages)
        assert [m.tool_call_id for m in tool_messages(kept)] == [
            m.tool_call_id for m in tool_messages(dropped)
        ]
        assert dropped.diagnostics.thinking_dropped == 4
        # A message with only thinking has nothing a provider can take.
        assert kept.diagnostics.dropped_empty_messages == 1
        assert kept.messages[-1].content == "streamed text"


# --- alternation ------------------------------------------------------------------------------


def test_anthropic_and_gemini_merge_same_role_neighbours() -> None:
    history = [
        system(),
        user("intent"),
        user("[Folded: turns 1-3]"),
        asst(content="let me look", thinking="t1"),
        asst(call("a"), thinking="t2"),
        res("a", "A"),
        user("note"),
        system("a late instruction"),
    ]
    for provider in ("anthropic", "gemini"):
        rendered = render(history, provider)
        assert [(m.role, m.content) for m in rendered.messages] == [
            ("system", "You are a test entity."),
            ("user", "intent\n\n[Folded: turns 1-3]"),
            ("assistant", "let me look"),
            ("tool", "A"),
            ("user", "note\n\na late instruction"),
        ]
        assert rendered.messages[2].thinking == "t1\n\nt2"
        assert rendered.diagnostics.merged_messages == 3
    plain: tuple[ProviderFormat, ...] = ("openai", "mistral", "kimi")
    for other in plain:
        rendered = render(history, other)
        assert [m.role for m in rendered.messages] == [m.role for m in history]


def test_an_assistant_first_history_is_opened_by_a_user_message() -> None:
    history = [system(), asst(call("a")), res("a", "A")]
    rendered = render(history, "gemini")
    assert [(m.role, m.content) for m in rendered.messages][:2] == [
        ("system", "You are a test entity."),
        ("user", DEFAULT_POLICY.opening),
    ]
    assert render(history, "openai").messages[1].role == "assistant"


# --- diagnostics ------------------------------------------------------------------------------


def test_diagnostics_serialize_to_json() -> None:
    history = [*seed_sequence(), res("hist_tool_1", "dup"), res("ghost", "x")]
    data = render(history, "anthropic").diagnostics.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["provider_format"] == "anthropic"
    assert data["dropped_orphan_results"] == [
        {"tool_call_id": "ghost", "position": 8, "name": "echo"}
    ]
    assert data["dedupe_decisions"][0]["reason"] == "duplicate_conflicting"
    assert len(data["synthetic_completions"]) == 4


def test_the_renderer_is_exported() -> None:
    import cantrip.llm

    assert cantrip.llm.render_transcript is render_transcript
    assert cantrip.llm.validate_transcript is validate_transcript
    assert cantrip.llm.IncrementalRenderer is IncrementalRenderer


def test_unknown_provider_format_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown provider format"):
        render_transcript([], "cohere")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown provider format"):
        validate_transcript([], "cohere")  # type: ignore[arg-type]


# --- incremental rendering --------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
def test_incremental_matches_full_render_turn_by_turn(provider: ProviderFormat) -> None:
    renderer = IncrementalRenderer(provider)
    history: list[Message] = []
    views = []
    steps: list[list[Message]] = [[system(), user("intent")]]
    for turn in range(20):
        a, b = f"t{turn}a", f"t{turn}b"
        if turn % 4 == 1:
            # A checkpointed turn: the utterance first, its observation later.
            steps += [[asst(call(a), call(b), thinking="t")], [res(a, "A"), res(b, "B")]]
        elif turn % 4 == 2:
            steps += [[asst(content="text")], [user("more")], [user("and more")]]
        else:
            steps.append([asst(call(a), call(b)), res(a, "A"), res(b, "B")])
    for step in steps:
        history += step
        view = renderer.extend(step)
        views.append((view, render_transcript(history, provider).messages))
        assert view == render_transcript(history, provider).messages
    assert renderer.full_renders == 0
    # Views handed out earlier never change.
    for view, expected in views:
        assert view == expected
        assert tuple(view) == expected
    assert renderer.diagnostics() == render_transcript(history, provider).diagnostics
    assert dict(renderer.id_map) == dict(render_transcript(history, provider).id_map)


def test_incremental_falls_back_for_a_late_result_of_an_older_call() -> None:
    renderer = IncrementalRenderer("openai")
    history = [user("go"), asst(call("a")), user("moving on"), asst(call("b")), res("b", "B")]
    before = renderer.extend(history)
    assert before[2].content == MISSING
    after = renderer.extend([res("a", "late A")])
    assert renderer.full_renders == 1
    assert after == render_transcript([*history, res("a", "late A")], "openai").messages
    assert after[2].content == "late A"
    assert before[2].content == MISSING
    # Back to incremental.
    renderer.extend([user("next"), asst(call("c")), res("c", "C")])
    assert renderer.full_renders == 1


def test_incremental_view_is_a_sequence() -> None:
    renderer = IncrementalRenderer("anthropic")
    view = renderer.extend([user("a"), user("b"), asst(call("x"))])
    assert len(view) == 3
    assert view[-1].role == "tool"
    assert view[0].content == "a\n\nb"
    assert [m.role for m in view[1:]] == ["assistant", "tool"]
    with pytest.raises(IndexError):
        view[3]
    assert renderer.messages is view
    assert view != "not a transcript"


# --- property tests ---------------------------------------------------------------------------

OUTCOMES = (
    "ok",
    "ok",
    "missing",
    "error",
    "skipped",
    "cancelled",
    "duplicate",
    "conflicting",
    "synthetic_then_real",
    "real_then_synthetic",
    "synthetic_only",
    "late",
    "late_duplicate",
)
SINGLE = ("ok", "missing", "error", "skipped", "cancelled")
POOL_IDS = ("", "call_0", "dup", "123456789", "toolu_x")
"""Ids that may be used by several calls: results for them come right after the call."""


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[Message], Counter[tuple[str, bool]], dict[str, str]]:
    """A random canonical history, the real completions that must survive, and for
    calls with a unique id, the content that must answer them."""
    counter = itertools.count()
    messages: list[Message] = []
    late: list[Message] = []
    survivors: Counter[tuple[str, bool]] = Counter()
    by_unique_id: dict[str, str] = {}

    def fresh(prefix: str = "r") -> str:
        return f"{prefix}{next(counter)}"

    def flush_some_late() -> None:
        while late:
            if not draw(st.booleans()):
                return
            messages.append(late.pop(draw(st.integers(0, len(late) - 1))))

    if draw(st.booleans()):
        messages.append(system())
    if draw(st.integers(0, 9)):
        messages.append(user("intent"))
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(
            st.sampled_from(["user", "text", "tools", "tools", "tools", "orphan", "system"])
        )
        if kind == "user":
            messages.append(user(fresh("u")))
        elif kind == "system":
            messages.append(system(fresh("s")))
        elif kind == "orphan":
            messages.append(res(fresh("orphan_"), fresh("orphan-content-"), name="ghost"))
        elif kind == "text":
            content = draw(st.sampled_from([None, "", "text"]))
            thinking = draw(st.sampled_from([None, "why"]))
            messages.append(asst(content=content, thinking=thinking))
        else:
            n_calls = draw(st.integers(1, 4))
            ids = []
            for _ in range(n_calls):
                if draw(st.integers(0, 3)) == 0:
                    ids.append(draw(st.sampled_from(POOL_IDS)))
                else:
                    ids.append(fresh("hist_tool_"))
            names = [
                draw(st.sampled_from(["echo", "done", "call_agent", "web.search"])) for _ in ids
            ]
            calls = [call(i, n) for i, n in zip(ids, names, strict=True)]
            messages.append(
                asst(
                    *calls,
                    content=draw(st.sampled_from([None, "calling"])),
                    thinking=draw(st.sampled_from([None, "plan"])),
                )
            )
            block: list[Message] = []
            for c in calls:
                pooled = not c.id.startswith("hist_tool_")
                outcome = draw(st.sampled_from(SINGLE if pooled else OUTCOMES))
                cid: str | None = c.id
                if c.id == "" and draw(st.booleans()):
                    cid = None
                real = fresh()
                first_real: tuple[str, bool] | None = None
                if outcome in ("ok", "duplicate", "conflicting", "late_duplicate"):
                    block.append(res(cid, real, name=c.name))
                    first_real = (real, False)
                    if outcome == "duplicate":
                        block.append(res(cid, real, name=c.name))
                    elif outcome == "conflicting":
                        block.append(res(cid, real + "-conflicting", name=c.name))
                    elif outcome == "late_duplicate":
                        late.append(res(cid, real + "-late-duplicate", name=c.name))
                elif outcome == "error":
                    block.append(res(cid, real, name=c.name, is_error=True))
                    first_real = (real, True)
                elif outcome == "skipped":
                    block.append(res(cid, SKIPPED_AFTER_DONE, name=c.name))
                    first_real = (SKIPPED_AFTER_DONE, False)
                elif outcome == "cancelled":
                    block.append(res(cid, "cancelled", name=c.name, is_error=True))
                    first_real = ("cancelled", True)
                elif outcome == "synthetic_then_real":
                    block.append(res(cid, MISSING, name=c.name, is_error=True))
                    block.append(res(cid, real, name=c.name))
                    first_real = (real, False)
                elif outcome == "real_then_synthetic":
                    block.append(res(cid, real, name=c.name))
                    block.append(res(cid, INTERRUPTED, name=c.name, is_error=True))
                    first_real = (real, False)
                elif outcome == "synthetic_only":
                    block.append(res(cid, MISSING, name=c.name, is_error=True))
                elif outcome == "late":
                    late.append(res(cid, real, name=c.name))
                    first_real = (real, False)
                if first_real is not None:
                    survivors[first_real] += 1
                    if not pooled:
                        by_unique_id[c.id] = first_real[0]
            if len(set(ids)) == len(ids):
                # Results of one utterance may come in any order; with all ids distinct
                # only a conflicting duplicate's position decides which one is first.
                shuffled = draw(st.permutations(block))
                block = _keep_first_real_first(block, shuffled)
            messages += block
        flush_some_late()
    messages += late
    return messages, survivors, by_unique_id


def _keep_first_real_first(block: list[Message], shuffled: Sequence[Message]) -> list[Message]:
    """A permutation of ``block`` in which every call's intended first real result
    still comes before its other real results (``-conflicting``)."""
    result = list(shuffled)
    for message in block:
        if message.content and message.content.endswith("-conflicting"):
            original = message.content.removesuffix("-conflicting")
            i = next(n for n, m in enumerate(result) if m.content == original)
            j = result.index(message)
            if j < i:
                result[i], result[j] = result[j], result[i]
    return result


SYNTHETIC_TEXTS = {MISSING, INTERRUPTED}


def check_render(
    history: list[Message],
    survivors: Counter[tuple[str, bool]],
    by_unique_id: dict[str, str],
    provider: ProviderFormat,
) -> RenderedTranscript:
    rendered = render_transcript(history, provider)
    assert validate_transcript(rendered.messages, provider) == []
    # Every real completion survives, with its content and error flag, exactly once.
    emitted = Counter(
        (m.content or "", m.is_error)
        for m in rendered.messages
        if m.role == "tool" and m.content not in SYNTHETIC_TEXTS
    )
    assert emitted == survivors
    for canonical_id, content in by_unique_id.items():
        assert answer(rendered, canonical_id).content == content
    # Orphans never reach the transcript.
    assert not any(m.content and m.content.startswith("orphan") for m in rendered.messages)
    # Calls are answered one to one under an injective projection.
    diagnostics = rendered.diagnostics
    assert diagnostics.emitted_call_ids == diagnostics.emitted_result_ids
    assert len(set(diagnostics.emitted_call_ids)) == len(diagnostics.emitted_call_ids)
    assert len(diagnostics.canonical_call_ids) == sum(
        len(m.tool_calls) for m in history if m.role == "assistant"
    )
    return rendered


@pytest.mark.parametrize("provider", PROVIDERS)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), case=histories())
def test_property_render_is_valid_and_keeps_real_results(
    provider: ProviderFormat,
    data: st.DataObject,
    case: tuple[list[Message], Counter[tuple[str, bool]], dict[str, str]],
) -> None:
    history, survivors, by_unique_id = case
    rendered = check_render(history, survivors, by_unique_id, provider)
    assert render_transcript(history, provider) == rendered
    # Rendering again is a fixed point.
    assert render_transcript(rendered.messages, provider).messages == rendered.messages
    # Without thinking: still valid, same pairing.
    bare = render_transcript(history, provider, keep_thinking=False)
    assert validate_transcript(bare.messages, provider) == []
    assert all(m.thinking is None for m in bare.messages)
    assert bare.diagnostics.emitted_result_ids == rendered.diagnostics.emitted_result_ids
    # Incremental rendering in random chunks equals the full render at every step.
    renderer = IncrementalRenderer(provider)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(history)), max_size=6)))
    previous = 0
    for cut in [*cuts, len(history)]:
        view = renderer.extend(history[previous:cut])
        assert view == render_transcript(history[:cut], provider).messages
        previous = cut
    assert tuple(renderer.messages) == rendered.messages


@settings(max_examples=150, deadline=None)
@pytest.mark.parametrize("provider", PROVIDERS)
@given(data=st.data(), case=histories())
def test_property_incremental_knows_whether_any_id_was_remapped(
    provider: ProviderFormat,
    data: st.DataObject,
    case: tuple[list[Message], Counter[tuple[str, bool]], dict[str, str]],
) -> None:
    """``remapped`` (the adapter skips mapping ids back when it is false) is exactly
    whether the id map, grown message by message, maps some id to another."""
    history = case[0]
    renderer = IncrementalRenderer(provider)
    start = 0
    while start < len(history):
        step = data.draw(st.integers(1, len(history) - start))
        renderer.extend(history[start : start + step])
        start += step
        id_map = renderer.id_map
        assert renderer.remapped == any(key != wire for key, wire in id_map.items())
