"""A turn as the loom recorded it, told as the loop's events (:func:`recorded_events`),
with its delegations' children told from their own records (:func:`recorded_tree`) --
what the one :class:`~._translate.Translator` takes where a turn was not heard live
(on PostgreSQL, or a run told again).

Apart from :mod:`._translate` because it reads records (and the loom), not AG-UI: it
makes the loop's own events, imports no ``ag_ui``, and the translator never needs to
know whether an event was heard or read back."""

from __future__ import annotations

from collections.abc import Callable, Mapping

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
    """The child entities a delegation call's record names, in the order they were
    asked for: a ``call_agent``'s child (``detail["child"]``, also when the child
    failed) or a ``call_agent_batch``'s (``detail["children"]``, one per request;
    ``None`` where a request spawned none). A record that names none -- a call that
    spawned no child, or one recorded before records named them -- has none to tell."""
    if record.gate not in DELEGATES:
        return []
    detail = record.detail
    named = detail["children"] if "children" in detail else (detail.get("child"),)
    if not isinstance(named, list | tuple):
        return []
    return [child for child in named if isinstance(child, str) and child]


def failures(record: GateCallRecord) -> dict[str, str]:
    """The children of a ``call_agent_batch`` call that failed (``detail["failed"]``),
    each with its entry's error message -- the batch answered, so its record is no
    error, yet those sub-agents ended in one."""
    failed = record.detail.get("failed") if record.gate in DELEGATES else None
    children = record.detail.get("children")
    entries = record.result
    if not isinstance(failed, list | tuple) or not isinstance(children, list | tuple):
        return {}
    if not isinstance(entries, list | tuple) or len(entries) != len(children):
        entries = [None] * len(children)
    out: dict[str, str] = {}
    for child, entry in zip(children, entries, strict=True):
        if isinstance(child, str) and child in failed:
            said = entry.get("error") if isinstance(entry, Mapping) else None
            out[child] = str(said or "failed")
    return out


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
