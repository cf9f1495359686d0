"""Exporting a loom: turns as JSONL, threads as chat-format training data.

Both formats are redacted by default (PROD-8): every string passes through
:func:`cantrip._redact.redact`. ``redaction="none"`` is the explicit opt-in to
raw output.

**Turn JSONL** (``export_jsonl``, ``export_thread_jsonl``; read back with
``load_jsonl``). One JSON object per line, in recording order (a thread: root
first). Schema ``cantrip.turn/1``, the fields of :meth:`Turn.to_dict` plus
``reward``:

- ``id``, ``parent_id`` (null for a root), ``entity_id``, ``cantrip_id``,
  ``role`` (``"turn"``), ``sequence`` (1-based per entity, continuing across
  casts and from a fork point), ``intent`` (on a cast's first turn, else null);
- ``utterance`` (the reply as text), ``content``, ``thinking``, ``tool_calls``
  (``[{id, name, arguments, raw_arguments}]``);
- ``reasoning`` (only when the utterance has any: ``[{format, position, kind,
  payload, text?, redacted?}]``, opaque provider artefacts replayed byte for
  byte; a redacted export leaves out an artefact redaction would alter);
- ``observation`` (text), ``gate_calls`` (``[{gate, args, result, is_error,
  tool_call_id, status, duration_ms, detail?}]``; ``status`` is ``ok``,
  ``error``, ``skipped``, ``cancelled`` or ``crashed``);
- ``metadata`` (``{tokens_prompt, tokens_completion, tokens_cached,
  duration_ms, timestamp, attempts, model, provider}``);
- ``terminated``, ``truncated``, ``reason``, ``result``, ``extras``;
- ``reward`` (number or null).

Unknown fields are ignored when reading, so the schema may grow by adding
fields; a field's meaning never changes within ``/1``.

**Chat JSONL** (``export_chat``). One conversation per thread, each the
context its leaf entity would have read without folding -- the system
prompt, the intents, and every turn, delegation pieces merged, ephemeral
results as their placeholder -- in OpenAI's fine-tuning shape::

    {"messages": [
        {"role": "system", "content": "..."},
        {"role": "user", "content": "the intent"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "echo", "arguments": "{\\"text\\": \\"hi\\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "hi"},
        ...],
     "tools": [...],                      # only when given
     "metadata": {"thread": leaf id, "entity_id", "cantrip_id", "turns",
                  "terminated", "truncated", "reason", "result", "reward",
                  "turn_rewards": [{"turn_id", "sequence", "reward"}, ...]}}

``metadata=False`` leaves the ``metadata`` key out for consumers that refuse
unknown keys. A child entity's thread is its own conversation (its parent's
turns are not part of it); a fork's includes the prefix it was forked from.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs

from cantrip._context import Context
from cantrip._redact import redact_value
from cantrip.llm._contract import Message, ToolDefinition
from cantrip.loom._loom import Loom
from cantrip.loom._model import Turn
from cantrip.loom._view import render_code_observation
from cantrip.medium import visible_result

Redaction = Literal["default", "none"]
SCHEMA = "cantrip.turn/1"


def _redacted(record: Any, redaction: Redaction) -> Any:
    if redaction == "default":
        reasoning = record.get("reasoning") if isinstance(record, dict) else None
        if not reasoning:
            return redact_value(record)
        # An artefact is replayed byte for byte or not at all: redaction may not edit
        # one (a signature would no longer verify), so one it would change is left out.
        kept = [part for part in reasoning if redact_value(part) == part]
        out = redact_value({k: v for k, v in record.items() if k != "reasoning"})
        if kept:
            out["reasoning"] = kept
        return out
    if redaction != "none":
        raise ValueError(f"unknown redaction {redaction!r} (default or none)")
    return record


def export_jsonl(
    loom: Loom, turns: Iterable[Turn] | None = None, *, redaction: Redaction = "default"
) -> str:
    """The given turns (default: the whole loom) as JSONL text."""
    lines = []
    for turn in loom.turns if turns is None else turns:
        record = _redacted({**turn.to_dict(), "reward": loom.reward(turn.id)}, redaction)
        lines.append(json.dumps(record, ensure_ascii=False, default=str))
    return "\n".join(lines) + ("\n" if lines else "")


def export_thread_jsonl(loom: Loom, leaf_id: str, *, redaction: Redaction = "default") -> str:
    """One thread (root to ``leaf_id``, LOOM-10) as turn JSONL."""
    return export_jsonl(loom, loom.thread(leaf_id), redaction=redaction)


@attrs.frozen
class ExportedTurn:
    """One line of a turn export, read back."""

    turn: Turn
    reward: float | None = None


def load_jsonl(source: str | os.PathLike[str]) -> list[ExportedTurn]:
    """Read a turn export: JSONL text, or the path of a file holding it.

    The inverse of :func:`export_jsonl`: exporting, loading and exporting again
    gives the same text. Raises ``ValueError`` naming the line of a record
    that is not a turn.
    """
    text = source if isinstance(source, str) else Path(source).read_text(encoding="utf-8")
    out: list[ExportedTurn] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            reward = data.get("reward")
            out.append(
                ExportedTurn(Turn.from_dict(data), None if reward is None else float(reward))
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"line {number}: not a turn record ({exc})") from exc
    return out


# -- chat format ----------------------------------------------------------------


class _RecordedRenderer:
    """Renders observations from the record alone (no medium instance needed):
    code mediums kept one observation per code call in ``extras``; conversation
    answers each call with its own result."""

    def render_observation(self, turn: Turn) -> list[Message]:
        if isinstance(turn.extras.get("observations"), list | tuple):
            return render_code_observation(turn)
        return [
            Message(
                role="tool",
                content=visible_result(record),
                tool_call_id=record.tool_call_id,
                name=record.gate,
                is_error=record.is_error,
            )
            for record in turn.gate_calls
        ]


def openai_message(message: Message) -> dict[str, Any]:
    """A context message in OpenAI's chat (and fine-tuning) shape."""
    if message.role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": message.content}
        if message.tool_calls:
            out["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments_json},
                }
                for call in message.tool_calls
            ]
        return out
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    return {"role": message.role, "content": message.content}


def openai_tool(tool: ToolDefinition) -> dict[str, Any]:
    return {"type": "function", "function": tool.to_dict()}


def chat_conversation(
    loom: Loom,
    leaf_id: str,
    *,
    redaction: Redaction = "default",
    tools: Sequence[ToolDefinition] | None = None,
    metadata: bool = True,
) -> dict[str, Any]:
    """The thread ending at ``leaf_id`` as one chat-format training example."""
    lineage = loom.lineage(leaf_id)
    leaf = lineage[-1]
    record = loom.entity(leaf.entity_id)
    system_prompt = record.identity.get("system_prompt")
    context = Context(
        system_prompt if isinstance(system_prompt, str) else None, _RecordedRenderer()
    )
    context.replay(lineage)
    conversation: dict[str, Any] = {"messages": [openai_message(m) for m in context.snapshot()]}
    if tools is not None:
        conversation["tools"] = [openai_tool(t) for t in tools]
    if metadata:
        rewards = [
            {"turn_id": t.id, "sequence": t.sequence, "reward": loom.reward(t.id)}
            for t in lineage
            if loom.reward(t.id) is not None
        ]
        conversation["metadata"] = {
            "thread": leaf.id,
            "entity_id": leaf.entity_id,
            "cantrip_id": leaf.cantrip_id,
            "turns": len(lineage),
            "terminated": leaf.terminated,
            "truncated": leaf.truncated,
            "reason": leaf.reason,
            "result": leaf.result,
            "reward": loom.reward(leaf.id),
            "turn_rewards": rewards,
        }
    redacted: dict[str, Any] = _redacted(conversation, redaction)
    return redacted


def export_chat(
    loom: Loom,
    leaves: Iterable[str] | None = None,
    *,
    redaction: Redaction = "default",
    tools: Sequence[ToolDefinition] | None = None,
    metadata: bool = True,
) -> str:
    """Chat-format JSONL: one conversation per thread (default: every thread of the loom)."""
    ids = [t.id for t in loom.leaves()] if leaves is None else list(leaves)
    lines = [
        json.dumps(
            chat_conversation(loom, leaf, redaction=redaction, tools=tools, metadata=metadata),
            ensure_ascii=False,
            default=str,
        )
        for leaf in ids
    ]
    return "\n".join(lines) + ("\n" if lines else "")
