"""A turn as the loom recorded it, told as the loop's events (:func:`recorded_events`),
with its delegations' children told from their own records (:func:`recorded_tree`) --
what the one :class:`~._translate.Translator` takes where a turn was not heard live
(on PostgreSQL, or a run told again).

Apart from :mod:`._translate` because it reads records (and the loom), not AG-UI: it
makes the loop's own events, imports no ``ag_ui``, and the translator never needs to
know whether an event was heard or read back."""

from __future__ import annotations

from collections.abc import Callable

from cantrip._events import (
    FinalResponse,
    MessageComplete,
    StepComplete,
    StepStart,
    ToolResultEvent,
)
from cantrip.llm._contract import Response
from cantrip.llm._stream import Event, ThinkingDelta
from cantrip.loom._loom import Loom
from cantrip.loom._model import GateCallRecord, Turn

DELEGATES = frozenset({"call_agent", "call_agent_batch"})
"""The gates whose calls run child entities: their events are a sub-agent's."""


CONTINUATIONS = ("continuation", "continuation+checkpoint")
"""The ``phase`` of a turn's piece recorded after its first (its gate calls only)."""


def ends_its_step(turn: Turn) -> bool:
    """Whether a recorded piece of a turn ends its step: a checkpoint piece -- recorded
    at a pause or before a delegation's child runs -- leaves it open (its turn goes on,
    its gate calls' results still to come)."""
    return turn.extras.get("phase") not in ("checkpoint", "continuation+checkpoint")


def recorded_events(turn: Turn) -> list[Event]:
    """A turn as the loom recorded it, told as the loop's events -- what a live
    cast would have sent, minus token deltas (:class:`Translator` takes both).

    A turn is recorded in pieces around a pause or a delegation: the first piece
    holds the utterance (the step starts there), a continuation only the gate calls
    made after it, and a checkpoint piece leaves the step open (its turn goes on)."""
    phase = turn.extras.get("phase")
    events: list[Event] = []
    if phase not in CONTINUATIONS:
        events.append(StepStart(sequence=turn.sequence, entity_id=turn.entity_id))
        if turn.thinking:
            events.append(ThinkingDelta(text=turn.thinking, entity_id=turn.entity_id))
        response = Response(content=turn.content, tool_calls=turn.tool_calls)
        events.append(MessageComplete(response=response, entity_id=turn.entity_id))
    events.extend(ToolResultEvent(record=r, entity_id=turn.entity_id) for r in turn.gate_calls)
    if ends_its_step(turn):
        events.append(StepComplete(turn=turn, entity_id=turn.entity_id))
        if turn.terminated:
            events.append(FinalResponse(result=turn.result, entity_id=turn.entity_id))
    return events


def delegated(record: GateCallRecord) -> list[str]:
    """The child entities a delegation call's record names: the child of a
    ``call_agent`` that answered or was cut off (its record's ``detail["child"]``).
    A record that names none -- ``call_agent_batch``'s, a failed call's -- has none
    to tell."""
    child = record.detail.get("child") if record.gate in DELEGATES else None
    return [child] if isinstance(child, str) and child else []


def recorded_tree(turn: Turn, loom: Loom, tells: Callable[[str], bool]) -> list[Event]:
    """:func:`recorded_events` of ``turn`` with each delegation call's children told
    from their own recorded turns (and theirs, at any depth) before the call's result
    -- where a live cast's child speaks -- so the one :class:`Translator` makes them
    sub-agents as it does live (a replica hears only its session entity's turns).
    ``tells``: whether the run already tells a child (heard live): not told twice.
    Reads the loom: a worker thread's job on a store that is queried."""
    events: list[Event] = []
    for event in recorded_events(turn):
        if isinstance(event, ToolResultEvent):
            for child in delegated(event.record):
                if not tells(child) and loom.has_entity(child):
                    for child_turn in loom.entity_turns(child):
                        events.extend(recorded_tree(child_turn, loom, tells))
        events.append(event)
    return events
