"""What a ``cast`` call of ``cantrip mcp`` answers: one builder for every way it ends.

The synchronous call and a task's result (:mod:`cantrip.protocols.mcp_server._tasks`) are the same
``CallToolResult``: the cast's answer as text (or the truncation summary) and the
structured content :class:`CastOutput`; a cast that raised a ``CantripError`` is a
tool error with the message. Everything that leaves is redacted.
"""

from __future__ import annotations

from typing import Any

import pydantic

from cantrip._outcome import CastResult, refused
from cantrip._redact import redact, redact_value
from cantrip.llm._contract import plain_json
from cantrip.loom._model import result_text


class CastOutput(pydantic.BaseModel):
    """The structured content of a ``cast`` result."""

    result: Any = None
    terminated: bool
    truncated: bool
    reason: str | None = None
    turns: int
    usage: dict[str, int]
    entity_id: str


def cast_tool_result(outcome: CastResult) -> Any:
    """The ``CallToolResult`` of a finished (or truncated, or paused) cast."""
    from mcp_types import CallToolResult, TextContent

    structured = CastOutput(
        result=redact_value(plain_json(outcome.result)),
        terminated=outcome.terminated,
        truncated=outcome.truncated,
        reason=outcome.reason,
        turns=len(outcome.turns),
        usage=outcome.usage.to_dict(),
        entity_id=outcome.entity_id,
    )
    text = (
        result_text(outcome.result)
        if outcome.terminated
        else outcome.summary or f"truncated: {outcome.reason}"
    )
    return CallToolResult(
        content=[TextContent(type="text", text=redact(text))],
        structured_content=structured.model_dump(mode="json"),
        is_error=refused(outcome),  # a guardrail refused the cast: a tool error
    )


def failed_tool_result(message: str) -> Any:
    """The ``CallToolResult`` of a cast that could not run (``isError``)."""
    from mcp_types import CallToolResult, TextContent

    return CallToolResult(content=[TextContent(type="text", text=redact(message))], is_error=True)


def progress_message(sequence: int, utterance: str) -> str:
    """One turn, as a progress notification's message (or a task's status message)."""
    said = utterance.replace("\n", " ")
    said = said if len(said) <= 120 else said[:117] + "..."
    return redact(f"turn {sequence}: {said}" if said else f"turn {sequence}")
