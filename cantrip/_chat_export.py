"""Chat-format export: a loom's threads as chat-format training data.

It stands above the loom, not in it: a conversation is the context its leaf
entity would have read, so it is rendered through the entity's prompt context
(:class:`cantrip._context.Context`) and the mediums' way of showing a result,
while the loom only keeps the record (and its turn JSONL export,
:mod:`cantrip.loom._export`). Redacted by default, as every export is
(:func:`cantrip.loom._export.redact_export`, PROD-8).

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
from collections.abc import Iterable, Sequence
from typing import Any

from cantrip._context import Context
from cantrip.llm._contract import Message, ToolDefinition
from cantrip.loom._export import Redaction, redact_export
from cantrip.loom._loom import Loom
from cantrip.loom._model import Turn
from cantrip.loom._view import render_code_observation
from cantrip.medium import visible_result


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
    redacted: dict[str, Any] = redact_export(conversation, redaction)
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
