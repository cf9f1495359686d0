"""The JSON shapes of a session's turns and events, as every stream and route sends
them (the HTTP API, AG-UI's translation, the viewer; the same in every mode)."""

from __future__ import annotations

from typing import Any

import attrs

from cantrip._approval import Pause
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
from cantrip.protocols.sessions._backend import EventId, SessionEvent


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
            thinking=response.thinking,  # what a model that does not stream thought
            tool_calls=[
                {"id": c.id, "name": c.name, "arguments": plain_json(c.arguments)}
                for c in response.tool_calls
            ],
        )
    elif isinstance(event, UsageEvent):
        data["usage"] = event.usage.to_dict()
        data["cost_usd"] = event.cost_usd  # None: unknown, never $0
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
    its position, None where not counted), ``pause`` if it is a pause's checkpoint,
    and ``final_response`` if it ended its cast
    -- with their ids (``<position>.0``, ``<position>.1``) where the position is known:
    read again from the loom, they are the same everywhere (:mod:`._positions`)."""
    step = event_dict(StepComplete(turn, entity_id=turn.entity_id))
    told = [SessionEvent(step["type"], step, position, turn)]
    pending = turn.extras.get("pending")
    if isinstance(pending, dict):  # a checkpoint: the call it waits on a human for
        pause = Pause.from_dict({**pending, "checkpoint_id": turn.id})
        asked = event_dict(PauseEvent(pause=pause, entity_id=turn.entity_id))
        told.append(SessionEvent(asked["type"], asked))
    if turn.terminated:
        final = event_dict(FinalResponse(turn.result, entity_id=turn.entity_id))
        told.append(SessionEvent(final["type"], final))
    if position is None:
        return told
    return [attrs.evolve(e, id=EventId(position, i)) for i, e in enumerate(told)]
