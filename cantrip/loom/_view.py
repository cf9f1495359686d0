"""Read-only views of a thread: logical turns, and the loom as a sandbox sees it.

A delegating utterance is recorded in pieces (a checkpoint before the child
starts, a continuation after; SPEC.md "Resolutions of ambiguous test vectors"). The
entity perceived it as one turn, so everything that re-reads a thread as the
entity lived it -- the working context, sandbox replay, the ``loom`` object in
code mediums, chat export -- merges the pieces first (:func:`logical_turns`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from cantrip._redact import redact_value
from cantrip.llm._contract import Message, ReasoningPart, plain_json
from cantrip.loom._model import Turn

CHECKPOINT_PHASES = frozenset({"checkpoint", "continuation+checkpoint"})


def merge_pieces(opened: Turn, closing: Turn) -> Turn:
    """A delegating utterance's checkpoint (``opened``, with any further checkpoint
    pieces already merged in) and its closing continuation, as the one turn the
    context shows: utterance, id and sequence of the first piece, every gate
    call in order, the outcome and extras of the last."""
    return attrs.evolve(
        opened,
        gate_calls=opened.gate_calls + closing.gate_calls,
        observation=closing.observation,
        terminated=closing.terminated,
        truncated=closing.truncated,
        reason=closing.reason,
        result=closing.result,
        extras={k: v for k, v in closing.extras.items() if k != "phase"},
    )


def logical_turns(turns: Iterable[Turn]) -> list[Turn]:
    """``turns`` with each delegation's pieces merged; an utterance still open at
    the end (a checkpoint whose continuation is not recorded yet) is left out."""
    out: list[Turn] = []
    opened: Turn | None = None
    for turn in turns:
        phase = turn.extras.get("phase")
        if phase == "checkpoint":
            opened = turn
        elif phase == "continuation+checkpoint" and opened is not None:
            opened = attrs.evolve(opened, gate_calls=opened.gate_calls + turn.gate_calls)
        elif phase == "continuation" and opened is not None:
            out.append(merge_pieces(opened, turn))
            opened = None
        else:
            out.append(turn)
    return out


def turn_view(turn: Turn, reward: float | None = None) -> dict[str, Any]:
    """One turn as plain JSON data for code to read (secrets redacted, PROD-8)."""
    view = {
        "id": turn.id,
        "parent_id": turn.parent_id,
        "entity_id": turn.entity_id,
        "sequence": turn.sequence,
        "intent": turn.intent,
        "utterance": turn.utterance,
        "content": turn.content,
        "observation": turn.observation,
        "gate_calls": [
            {
                "gate": r.gate,
                "args": plain_json(r.args),
                "result": plain_json(r.result),
                "is_error": r.is_error,
                "status": r.status,
            }
            for r in turn.gate_calls
        ],
        "terminated": turn.terminated,
        "truncated": turn.truncated,
        "reason": turn.reason,
        "result": plain_json(turn.result),
        "reward": reward,
        "tokens": {
            "prompt": turn.metadata.tokens_prompt,
            "completion": turn.metadata.tokens_completion,
            "cached": turn.metadata.tokens_cached,
        },
    }
    redacted: dict[str, Any] = redact_value(view)
    return redacted


def history_view(
    turns: Iterable[Turn], reward: Callable[[str], float | None] | None = None
) -> list[dict[str, Any]]:
    """The logical turns of ``turns`` as :func:`turn_view` data, oldest first."""
    return [
        turn_view(t, reward(t.id) if reward is not None else None) for t in logical_turns(turns)
    ]


def reasoning_summary(parts: Sequence[ReasoningPart]) -> str:
    """What a person may see of a turn's reasoning artefacts: counts and kinds, never payloads.

    The readable part of the reasoning is the turn's ``thinking``; an
    artefact itself is the provider's opaque data (signatures, encrypted or
    redacted reasoning) and stays unshown.
    """
    formats = sorted({p.format for p in parts})
    redacted = sum(1 for p in parts if p.redacted)
    readable = len(parts) - redacted
    pieces = [f"{len(parts)} opaque artefact(s) for {', '.join(formats)}"]
    if readable:
        pieces.append(f"{readable} with readable thinking (shown above)")
    if redacted:
        pieces.append(f"{redacted} redacted or encrypted by the provider (not shown)")
    return "; ".join(pieces)


def render_code_observation(turn: Turn) -> list[Message]:
    """One tool message per code call, carrying the turn's observation.

    How every code medium renders a recorded turn back into the context; here,
    beside the other views of recorded turns, so the loom's exporter can render
    a thread without importing a medium."""
    texts = turn.extras.get("observations")
    messages = []
    for index, call in enumerate(turn.tool_calls):
        if isinstance(texts, list | tuple) and index < len(texts):
            text = str(texts[index])
        else:
            text = turn.observation
        messages.append(Message(role="tool", content=text, tool_call_id=call.id, name=call.name))
    return messages
