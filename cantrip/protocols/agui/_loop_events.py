"""A session's event, as the seam carries it (JSON,
:func:`~cantrip.protocols.sessions.event_dict`'s shape), back into the loop's event
that :mod:`._translate`'s one ``Translator`` takes.

Apart from :mod:`._run` because it is a translation, not a run's lifecycle: a pure
function of one event, with no AG-UI in it (it imports no ``ag_ui``), that the run
only calls for each event it hears."""

from __future__ import annotations

from cantrip._events import (
    FinalResponse,
    GateProgress,
    MessageComplete,
    StepStart,
    ToolResultEvent,
)
from cantrip.llm._contract import Response, ToolCall
from cantrip.llm._stream import Event, MessageStart, TextDelta, ThinkingDelta, ToolCallEvent
from cantrip.loom._model import GateCallRecord
from cantrip.protocols.sessions import SessionEvent


def loop_event(told: SessionEvent) -> Event | None:
    """A session's event (the seam's JSON shape, :func:`event_dict`'s) as the loop's
    event the :class:`Translator` takes; None for what it does not tell (usage, a
    pause, a kind it does not know). A recorded turn is told apart (it carries it)."""
    data, entity_id = told.data, str(told.data.get("entity_id") or "")
    kind = told.type
    if kind == "step_start":
        return StepStart(sequence=int(data.get("sequence") or 0), entity_id=entity_id)
    if kind == "message_start":
        return MessageStart(attempt=int(data.get("attempt") or 1), entity_id=entity_id)
    if kind == "text_delta":
        return TextDelta(text=str(data.get("text") or ""), entity_id=entity_id)
    if kind == "thinking_delta":
        return ThinkingDelta(text=str(data.get("text") or ""), entity_id=entity_id)
    if kind == "tool_call":
        return ToolCallEvent(
            call_id=str(data.get("call_id") or ""),
            name=str(data.get("name") or ""),
            arguments=data.get("arguments") or {},
            final=bool(data.get("final")),
            entity_id=entity_id,
        )
    if kind == "message_complete":
        calls = [
            ToolCall(id=c["id"], name=c["name"], arguments=c.get("arguments") or {})
            for c in data.get("tool_calls") or ()
        ]
        response = Response(content=data.get("content"), tool_calls=calls)
        return MessageComplete(response=response, entity_id=entity_id)
    if kind == "tool_result" and isinstance(data.get("record"), dict):
        return ToolResultEvent(record=GateCallRecord.from_dict(data["record"]), entity_id=entity_id)
    if kind == "gate_progress":
        return GateProgress(
            gate=str(data.get("gate") or ""),
            progress=float(data.get("progress") or 0.0),
            total=data.get("total"),
            message=data.get("message"),
            entity_id=entity_id,
        )
    if kind == "final_response":
        return FinalResponse(result=data.get("result"), entity_id=entity_id)
    return None
