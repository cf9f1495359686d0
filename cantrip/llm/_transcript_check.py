"""Whether a transcript keeps a provider's tool protocol: every way it breaks it, listed.

Why apart from the renderer: the check is the renderer's specification
written as an independent test of its output -- the property tests, the
renderer's ``debug`` mode and the debug log (a refused request) run it --
so it shares the id rules (:mod:`cantrip.llm._transcript_ids`) and nothing
of the engine.
"""

from __future__ import annotations

from collections.abc import Sequence

from cantrip.llm._contract import Message
from cantrip.llm._transcript_ids import id_problems
from cantrip.llm._transcript_model import (
    ALTERNATING_FORMATS,
    PROVIDER_FORMATS,
    ProviderFormat,
    TranscriptError,
    unknown_format,
)


def _reasoning_problems(message: Message, where: int, accepted: str | None) -> list[str]:
    if message.role != "assistant":
        return [f"message {where}: a {message.role} message carries reasoning artefacts"]
    problems: list[str] = []
    last = len(message.tool_calls)
    for part in message.reasoning:
        if part.format != accepted:
            problems.append(
                f"message {where}: a reasoning artefact of {part.format!r} is sent to "
                f"{accepted or 'a format that takes none'}"
            )
        if part.kind == "part" and not 0 <= part.position <= last + 1:
            problems.append(f"message {where}: reasoning part at position {part.position}")
        elif part.kind == "fields" and not (
            (part.position == 0 and message.content) or 1 <= part.position <= last
        ):
            problems.append(
                f"message {where}: reasoning fields for part {part.position}, which it lacks"
            )
    return problems


def validate_transcript(
    messages: Sequence[Message],
    provider: ProviderFormat,
    *,
    strict: bool = False,
    reasoning_format: str | None = None,
) -> list[str]:
    """Every way ``messages`` break ``provider``'s tool protocol; ``[]`` when valid.

    Checked for every format: each assistant tool call is answered by exactly
    one tool message in the block of tool messages right after it, in call
    order; no tool message stands anywhere else or answers an unknown id
    (``tool result without matching tool call``, LLM-7); call ids are non-empty,
    unique in the transcript and in the format's id syntax (Kimi: the tool name
    and the global call index); an assistant message has content or tool calls.
    ``gemini`` and ``mistral`` also need a tool message to name its call's tool.
    ``anthropic`` and ``gemini`` also need alternating roles: no two user or two
    assistant messages in a row, system messages only before the first other
    message, and a user message first (a tool block followed by a user message
    is fine: one user turn on the wire).

    Reasoning artefacts may only ride on assistant messages, only in
    ``reasoning_format`` (``None``: none at all), and only at a position the
    message has (a ``fields`` artefact needs the part it is set on).

    With ``strict=True`` problems raise a :class:`TranscriptError` instead.
    """
    if provider not in PROVIDER_FORMATS:
        raise unknown_format(provider)
    problems: list[str] = []
    alternating = provider in ALTERNATING_FORMATS
    names_needed = provider in ("gemini", "mistral")
    seen: dict[str, int] = {}
    ordinal = 0
    started = False
    previous: str | None = None
    count = len(messages)
    i = 0
    while i < count:
        message = messages[i]
        role = message.role
        if message.reasoning:
            problems.extend(_reasoning_problems(message, i, reasoning_format))
        if role == "system":
            if alternating and started:
                problems.append(
                    f"message {i}: system message after the conversation started "
                    f"({provider} takes system instructions only up front)"
                )
            i += 1
            continue
        if role == "tool":
            problems.append(
                f"message {i}: tool result without matching tool call: "
                f"{message.tool_call_id!r} does not follow the assistant message "
                "that made the call (LLM-7)"
            )
            started = True
            previous = "tool"
            i += 1
            continue
        if role not in ("user", "assistant"):
            problems.append(f"message {i}: unknown role {role!r}")
        if alternating:
            if not started and role != "user":
                problems.append(
                    f"message {i}: {provider} needs a user message before the first {role} message"
                )
            if previous == role:
                problems.append(
                    f"message {i}: two {role} messages in a row "
                    f"({provider} needs alternating roles)"
                )
        started = True
        previous = role
        if role != "assistant":
            i += 1
            continue
        calls = message.tool_calls
        if not message.content and not calls:
            problems.append(f"message {i}: assistant message with neither content nor tool calls")
        order: dict[str, int] = {}
        for position, call in enumerate(calls):
            problems.extend(id_problems(call, provider, ordinal, i))
            ordinal += 1
            if call.id in seen:
                problems.append(
                    f"message {i}: tool call id {call.id!r} is already used by message "
                    f"{seen[call.id]} (ids must be unique)"
                )
            else:
                seen[call.id] = i
            order.setdefault(call.id, position)
        j = i + 1
        answered: set[str] = set()
        highest = -1
        while j < count and messages[j].role == "tool":
            result = messages[j]
            tid = result.tool_call_id
            if tid is None or tid not in order:
                problems.append(
                    f"message {j}: tool result without matching tool call: {tid!r} answers "
                    f"no call of the preceding assistant message {i} (LLM-7)"
                )
            elif tid in answered:
                problems.append(
                    f"message {j}: a second tool result for call {tid!r} "
                    "(at most one completion per call)"
                )
            else:
                answered.add(tid)
                position = order[tid]
                if position < highest:
                    problems.append(f"message {j}: tool result for {tid!r} is out of call order")
                highest = max(highest, position)
                if names_needed and result.name != calls[position].name:
                    problems.append(
                        f"message {j}: tool result for {tid!r} names {result.name!r}, "
                        f"the call is to {calls[position].name!r}"
                    )
            j += 1
        for call in calls:
            if call.id not in answered:
                problems.append(
                    f"message {i}: tool call {call.id!r} ({call.name}) has no tool result "
                    "right after the assistant message"
                )
        if j > i + 1:
            previous = "tool"
        i = j
    if strict and problems:
        raise TranscriptError(problems)
    return problems
