"""Stream events: what a streaming LLM says while it answers (spec 7.5).

They live with the LLM layer because the LLM layer emits them: a streaming
adapter, the scripted LLM and the retry and fallback wrappers hand them to the
``on_event`` callable of :meth:`~cantrip.llm.StreamingLLM.stream`, with an
empty ``entity_id``; the entity fills in its id and adds the loop-level events
of :mod:`cantrip._events`, which all derive from :class:`Event` here.

Tool calls are announced when they appear, possibly with partial arguments;
the finalized arguments (``final=True``) are authoritative (seed 000).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs


@attrs.frozen
class Event:
    """Every streaming event: the LLM's and the entity's loop's (``cantrip._events``)."""

    entity_id: str = attrs.field(default="", kw_only=True)


@attrs.frozen
class MessageStart(Event):
    """The LLM began answering (sent again if a retry starts over)."""

    attempt: int = 1


@attrs.frozen
class TextDelta(Event):
    """A chunk of the answer's text (TextEvent)."""

    text: str = ""


@attrs.frozen
class ThinkingDelta(Event):
    """A chunk of the reasoning trace (ThinkingEvent)."""

    text: str = ""


@attrs.frozen
class ToolCallEvent(Event):
    """A tool call announced (``final=False``, arguments may be partial) or finalized."""

    call_id: str = ""
    name: str = ""
    arguments: Mapping[str, Any] | str = attrs.field(factory=dict)
    final: bool = False
