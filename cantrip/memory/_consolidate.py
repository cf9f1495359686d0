"""Consolidation: after a cast ends, a cantrip of its own extracts and merges facts (42.5).

A memory with :class:`~cantrip.memory.Consolidate` leaves, after each cast that
returns a result (done, cut off by a ward or a cancel; a paused cast once the answer
ends it -- not a cast that raises: a crash, an LLM failure, a cancellation from outside,
whose outcome is no transcript to learn from), a :class:`ConsolidationRun`: a followup
(:mod:`cantrip._core._followups`) that casts the consolidator on the finished cast's
transcript. It is an ordinary entity of the loom: its record's cantrip is
:data:`CONSOLIDATOR_ID`, its first turn records what it consolidates (the
:data:`CONSOLIDATES_TAG` extra: the source entity and the turns), its wards and
budget are its own cantrip's. Every item it writes names the turn that wrote it and
the turns it was drawn from (``metadata["source"]["drawn_from"]``).

It never touches the cast it follows: that cast has returned its result and its
turns are in the loom. A consolidator that fails -- its LLM, a ward, a crash -- has
its failure recorded in its own thread by the core (an ``llm_error`` turn, a cut
turn ``crashed``), is logged here with both entity ids, and goes no further. Under
``--db`` the run is not cast here but queued for the workers
(cantrip.distributed._followups), with the same intent and tags.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from cantrip._redact import get_logger
from cantrip.loom._model import Turn

log = get_logger("cantrip.memory.consolidate")

CONSOLIDATOR_ID = "cantrip.memory.consolidate"
"""The cantrip id of every consolidation entity in the loom (its record and turns)."""
CONSOLIDATES_TAG = "consolidates"
"""The tag (recorded in the consolidation's first turn) naming what it consolidates:
``{"entity_id": <the source entity>, "turn_ids": [<the source cast's turns>]}``."""
DEFAULT_PROMPT = (
    "You keep a user's long-term memory. You are shown the transcript of a conversation "
    "that has ended. Recall what is already remembered, then remember each durable fact "
    "about the user (preferences, circumstances, plans) as one sentence under a short "
    "key, revising an existing key rather than adding a near-duplicate, and forget what "
    "the conversation shows is no longer true. Remember nothing secret. Then call done."
)
"""A consolidator's system prompt when the spec gives none."""
MAX_TRANSCRIPT_CHARS = 40_000
"""Characters of a cast's transcript the consolidator is told at most (the end kept)."""
MAX_VALUE_CHARS = 2_000
"""Characters of one gate call's arguments or result in the transcript."""

Consolidator = Callable[[], Awaitable[Any]]
"""Builds (once) the consolidator cantrip for a source cantrip's memory."""


def drawn_from(tags: Mapping[str, Any]) -> dict[str, Any] | None:
    """What a cast consolidates, from its tags (None: an ordinary cast)."""
    found = tags.get(CONSOLIDATES_TAG)
    if not isinstance(found, Mapping):
        return None
    entity_id, turn_ids = found.get("entity_id"), found.get("turn_ids")
    if not isinstance(entity_id, str) or not isinstance(turn_ids, list | tuple):
        return None
    return {"entity_id": entity_id, "turn_ids": [str(t) for t in turn_ids]}


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS] + " [...]"


def transcript(turns: Sequence[Turn]) -> str:
    """The intent a consolidator is cast with: what was asked, said and done in the
    cast made of ``turns`` (its end kept, at most :data:`MAX_TRANSCRIPT_CHARS`)."""
    lines = [
        "Here is the transcript of a conversation that just ended. Extract the durable "
        "facts worth remembering across sessions and merge them into memory: recall "
        "what is already remembered, revise it, forget what is now false. Then call done.",
        "",
    ]
    for turn in turns:
        if turn.intent is not None:
            lines.append(f"User: {turn.intent}")
        said = turn.content or turn.utterance
        if said:
            lines.append(f"Assistant: {said}")
        for call in turn.gate_calls:
            if call.gate == "done":
                continue
            status = "error" if call.is_error else "result"
            lines.append(
                f"Assistant called {call.gate}({_shown(dict(call.args))}) -> "
                f"{status}: {_shown(call.result)}"
            )
        if turn.terminated and turn.result is not None:
            lines.append(f"Answer: {_shown(turn.result)}")
    text = "\n".join(lines)
    if len(text) > MAX_TRANSCRIPT_CHARS:
        text = "[... the start is left out]\n" + text[-MAX_TRANSCRIPT_CHARS:]
    return text


class ConsolidationRun:
    """One consolidation: a :class:`~cantrip._running.Followup` of the cast it follows."""

    def __init__(
        self,
        consolidator: Consolidator,
        source_entity: str,
        turns: Sequence[Turn],
        user: str | None,
    ) -> None:
        self.consolidator = consolidator
        self.source_entity = source_entity
        self.intent = transcript(turns)
        self.tags: dict[str, Any] = {
            CONSOLIDATES_TAG: {"entity_id": source_entity, "turn_ids": [t.id for t in turns]}
        }
        if user is not None:
            self.tags["user"] = user
        self.entity: Any = None
        """The consolidation's entity, once summoned."""
        self.result: Any = None
        """Its cast's result, once it ended (None: it raised, or has not ended)."""
        self._cancelled: str | None = None

    async def run(self) -> None:
        spell = await self.consolidator()
        entity = self.entity = spell.summon()
        if self._cancelled is not None:  # cut off before it began: recorded as it starts
            entity.cancel(self._cancelled, next_cast=True)
        async with entity:
            try:
                self.result = await entity.send(self.intent, tags=self.tags)
            except Exception:
                # its failure is in its own thread (a crashed or llm_error turn); the
                # cast it follows has its result already
                log.exception("consolidation %s of entity %s failed", entity.id, self.source_entity)
                return
        result = self.result
        if not result.terminated:
            log.warning(
                "consolidation %s of entity %s ended without done (%s)",
                entity.id,
                self.source_entity,
                result.reason,
            )

    def cancel(self, reason: str) -> None:
        self._cancelled = reason
        if self.entity is not None:
            self.entity.cancel(reason, next_cast=True)
