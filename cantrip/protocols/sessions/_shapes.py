"""The JSON shapes of a session's turns and events, as every stream and route sends
them (the HTTP API, AG-UI's translation, the viewer; the same in every mode)."""

from __future__ import annotations

from typing import Any

from cantrip._events import (
    FinalResponse,
    GateProgress,
    MessageComplete,
    PauseEvent,
    StepComplete,
    StepStart,
    ToolResultEvent,
    UsageEvent,
)
from cantrip._redact import redact_value
from cantrip.llm._contract import plain_json
from cantrip.llm._stream import Event, MessageStart, TextDelta, ThinkingDelta, ToolCallEvent
from cantrip.loom._model import Turn
from cantrip.protocols.sessions._backend import SessionEvent


def turn_dict(turn: Turn) -> dict[str, Any]:
    return redact_value(turn.to_dict())  # type: ignore[no-any-return]


def event_dict(event: Event) -> dict[str, Any]:
    """A streaming event as JSON: ``{"type": ..., "entity_id": ..., ...}``."""
    data: dict[str, Any] = {"type": EVENT_TYPES.get(type(event), type(event).__name__)}
    data["entity_id"] = event.entity_id
    if isinstance(event, StepStart):
        data["sequence"] = event.sequence
    elif isinstance(event, MessageStart):
        data["attempt"] = event.attempt
    elif isinstance(event, TextDelta | ThinkingDelta):
        data["text"] = event.text
    elif isinstance(event, ToolCallEvent):
        data.update(
            call_id=event.call_id,
            name=event.name,
            arguments=plain_json(event.arguments),
            final=event.final,
        )
    elif isinstance(event, MessageComplete):
        response = event.response
        data.update(
            content=response.content,
            tool_calls=[
                {"id": c.id, "name": c.name, "arguments": plain_json(c.arguments)}
                for c in response.tool_calls
            ],
        )
    elif isinstance(event, UsageEvent):
        data["usage"] = event.usage.to_dict()
    elif isinstance(event, ToolResultEvent):
        data["record"] = event.record.to_dict()
    elif isinstance(event, StepComplete):
        if event.turn is not None:
            turn = event.turn
            data.update(
                turn_id=turn.id,
                sequence=turn.sequence,
                terminated=turn.terminated,
                truncated=turn.truncated,
                reason=turn.reason,
                observation=turn.observation,
            )
    elif isinstance(event, FinalResponse):
        data["result"] = plain_json(event.result)
    elif isinstance(event, PauseEvent) and event.pause is not None:
        data["pause"] = event.pause.to_dict()
    elif isinstance(event, GateProgress):
        data.update(
            gate=event.gate, progress=event.progress, total=event.total, message=event.message
        )
    return redact_value(data)  # type: ignore[no-any-return]


EVENT_TYPES: dict[type[Event], str] = {
    StepStart: "step_start",
    MessageStart: "message_start",
    TextDelta: "text_delta",
    ThinkingDelta: "thinking_delta",
    ToolCallEvent: "tool_call",
    MessageComplete: "message_complete",
    UsageEvent: "usage",
    ToolResultEvent: "tool_result",
    StepComplete: "step_complete",
    FinalResponse: "final_response",
    PauseEvent: "pause",
    GateProgress: "gate_progress",
}


def steered() -> dict[str, Any]:
    """The answer to a message the running prompt took (both modes' 202)."""
    return {"accepted": True, "joins": "next_turn"}


def recorded_events(turn: Turn, position: int | None) -> list[SessionEvent]:
    """What a recorded turn tells a follower, in either backend: ``step_complete`` (at
    its position, None where not counted), and ``final_response`` if it ended its cast."""
    step = event_dict(StepComplete(turn, entity_id=turn.entity_id))
    told = [SessionEvent(step["type"], step, position, turn)]
    if turn.terminated:
        final = event_dict(FinalResponse(turn.result, entity_id=turn.entity_id))
        told.append(SessionEvent(final["type"], final))
    return told
