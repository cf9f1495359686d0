"""Streaming events: what the loop is doing, as it happens (spec 7.5).

An observation channel, never a control channel: sinks are plain callables
that receive events and return nothing; what they do cannot change a turn.
A streamed cast records exactly the turns an unstreamed one would.

The events an LLM emits while it answers (``MessageStart``, ``TextDelta``,
``ThinkingDelta``, ``ToolCallEvent``) and their base :class:`Event` live with
the LLM layer (:mod:`cantrip.llm._stream`), which emits them with an empty
``entity_id``; the entity fills in its id and adds the loop-level ones here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from cantrip._approval import Pause
from cantrip.llm._contract import Response, Usage
from cantrip.llm._stream import Event
from cantrip.loom._model import GateCallRecord, Turn


@attrs.frozen
class StepStart(Event):
    """A turn begins (the LLM is about to be queried)."""

    sequence: int = 0


@attrs.frozen
class MessageComplete(Event):
    """The LLM's answer is complete and normalized."""

    response: Response = attrs.field(factory=Response)


@attrs.frozen
class UsageEvent(Event):
    usage: Usage = attrs.field(factory=Usage)
    cost_usd: float | None = None
    """What the call cost as the turn will record it
    (:func:`~cantrip.llm._cost.response_cost`); None: its price or usage is unknown."""


@attrs.frozen
class ToolResultEvent(Event):
    """A gate call completed (or was skipped / cancelled)."""

    record: GateCallRecord = attrs.field(factory=lambda: GateCallRecord(gate=""))


@attrs.frozen
class GateProgress(Event):
    """A gate still running reported progress (an MCP tool's progress notification).

    ``progress`` only grows; ``total`` is given when the gate knows it."""

    gate: str = ""
    progress: float = 0.0
    total: float | None = None
    message: str | None = None


@attrs.frozen
class StepComplete(Event):
    """A turn was recorded in the loom."""

    turn: Turn | None = None


@attrs.frozen
class FinalResponse(Event):
    """The cast terminated with this result (the done gate's answer, or final text)."""

    result: Any = None


@attrs.frozen
class PauseEvent(Event):
    """A call waits for a human (an approval or an ``ask_user`` question); answer it
    with ``Entity.answer(pause.pause_id, decision)``."""

    pause: Pause | None = None


EventSink = Callable[[Event], None]
