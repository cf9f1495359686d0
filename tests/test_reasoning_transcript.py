"""Seed 001 with reasoning artefacts: random histories x provider switches -> 0 invalid transcripts.

Each assistant message of a random history (the strategy of
:mod:`test_transcript`) is given artefacts as if a random provider had
produced it -- a conversation that switched provider, or fell back, between
turns. Rendered for every target an adapter uses, the transcript must be
valid, carry only the target's own artefacts, keep them in their order and
places, and count every one it dropped.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_transcript import histories

from cantrip.llm._contract import Message, ReasoningPart, ToolCall, reasoning_part
from cantrip.llm._transcript import render_transcript
from cantrip.llm._transcript_check import validate_transcript
from cantrip.llm._transcript_incremental import IncrementalRenderer
from cantrip.llm._transcript_model import ProviderFormat

FORMATS = ("anthropic-messages", "gemini-generate-content", "openai-responses", "openai-chat")
TARGETS: tuple[tuple[ProviderFormat, str | None], ...] = (
    ("openai", None),  # chat completions (and every OpenAI-compatible server)
    ("openai", "openai-responses"),
    ("anthropic", "anthropic-messages"),
    ("gemini", "gemini-generate-content"),
    ("mistral", None),
    ("kimi", None),
)


@st.composite
def artefacts(draw: st.DrawFn, message: Message, index: int) -> tuple[ReasoningPart, ...]:
    """What one provider (drawn at random) left on ``message``."""
    fmt = draw(st.sampled_from(FORMATS))
    last = 1 + len(message.tool_calls)
    parts = []
    for k in range(draw(st.integers(0, 3))):
        places = [p for p in range(last) if p or message.content]
        kind = "fields" if places and draw(st.booleans()) else "part"
        position = draw(st.sampled_from(places)) if kind == "fields" else draw(st.integers(0, last))
        parts.append(
            reasoning_part(
                fmt,
                position,
                {"opaque": f"{fmt}:{index}:{k}"},
                kind=kind,
                redacted=draw(st.booleans()),
            )
        )
    return tuple(parts)


@st.composite
def switching_histories(draw: st.DrawFn) -> list[Message]:
    history, _survivors, _ids = draw(histories())
    out = []
    for i, message in enumerate(history):
        if message.role == "assistant":
            message = attrs.evolve(message, reasoning=draw(artefacts(message, i)))
        out.append(message)
    return out


def payloads(messages: Any) -> list[str]:
    return [p.payload for m in messages for p in m.reasoning]


@pytest.mark.parametrize(("family", "fmt"), TARGETS, ids=lambda t: str(t))
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), history=switching_histories())
def test_property_provider_switches_leave_no_invalid_transcript(
    family: ProviderFormat, fmt: str | None, data: st.DataObject, history: list[Message]
) -> None:
    rendered = render_transcript(history, family, reasoning_format=fmt)
    assert validate_transcript(rendered.messages, family, reasoning_format=fmt) == []
    sent = [p for m in rendered.messages for p in m.reasoning]
    assert all(p.format == fmt for p in sent), "another provider's artefact was sent"
    # Nothing of the target's own is invented, duplicated or reordered.
    own = [
        p.payload
        for m in history
        if m.role == "assistant" and (m.content or m.tool_calls)
        for p in m.reasoning
        if p.format == fmt
    ]
    kept = payloads(rendered.messages)
    assert Counter(kept) <= Counter(own)
    assert kept == [p for p in own if p in set(kept)]
    if rendered.diagnostics.merged_messages == 0:
        assert kept == own  # only a merge of two assistant messages may leave some out
    foreign = sum(
        1
        for m in history
        if m.role == "assistant" and (m.content or m.tool_calls)
        for p in m.reasoning
        if p.format != fmt
    )
    assert rendered.diagnostics.reasoning_dropped >= foreign
    # Incremental rendering (what the adapters use turn by turn) agrees at every step.
    renderer = IncrementalRenderer(family, reasoning_format=fmt)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(history)), max_size=4)))
    previous = 0
    for cut in [*cuts, len(history)]:
        view = renderer.extend(history[previous:cut])
        assert view == render_transcript(history[:cut], family, reasoning_format=fmt).messages
        previous = cut


def test_the_validator_names_a_foreign_or_misplaced_artefact() -> None:
    message = Message(
        "assistant",
        None,
        tool_calls=(ToolCall("call_1", "echo"),),
        reasoning=(
            reasoning_part("anthropic-messages", 0, {"type": "thinking"}),
            reasoning_part("openai-responses", 0, {"id": "msg_1"}, kind="fields"),
            reasoning_part("openai-responses", 5, {"type": "reasoning"}),
        ),
    )
    history = [
        Message("user", "go"),
        message,
        Message("tool", "ok", tool_call_id="call_1", name="echo"),
    ]
    problems = validate_transcript(history, "openai", reasoning_format="openai-responses")
    assert any("'anthropic-messages' is sent to openai-responses" in p for p in problems)
    assert any("reasoning fields for part 0" in p for p in problems)
    assert any("reasoning part at position 5" in p for p in problems)
    rendered = render_transcript(history, "openai", reasoning_format="openai-responses")
    assert rendered.diagnostics.reasoning_dropped == 1
    assert rendered.diagnostics.to_dict()["reasoning_dropped"] == 1


def test_artefacts_survive_a_loom_round_trip_unchanged() -> None:
    from cantrip.loom._model import Turn

    parts = (
        reasoning_part(
            "anthropic-messages",
            0,
            {"type": "thinking", "thinking": "é", "signature": "s"},
            text="é",
        ),
        reasoning_part(
            "anthropic-messages", 1, {"type": "redacted_thinking", "data": "x"}, redacted=True
        ),
    )
    turn = Turn(id="t", parent_id=None, entity_id="e", sequence=1, content="hi", reasoning=parts)
    again = Turn.from_dict(json.loads(json.dumps(turn.to_dict())))
    assert again.reasoning == parts
    # Looms written before reasoning artefacts existed read as none.
    old = turn.to_dict()
    old.pop("reasoning")
    assert Turn.from_dict(old).reasoning == ()
    assert "reasoning" not in Turn(id="u", parent_id=None, entity_id="e", sequence=2).to_dict()
