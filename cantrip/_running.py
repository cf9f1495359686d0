"""The entity whose turn is running, for code that runs inside that turn.

A gate or a medium sometimes needs to know on whose behalf it runs (a
delegation gate spawns a child of it; a code medium's ``loom`` object reads its
thread). The entity sets this variable around each turn's execution. It lives
below the entity so that mediums and gates can read it without importing the
runtime above them; they see the entity only through :class:`RunningEntity`.
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
from typing import Any, Protocol

from cantrip.loom._loom import Loom


class RunningEntity(Protocol):
    """What code inside a turn may read of the entity running it."""

    @property
    def id(self) -> str: ...
    @property
    def loom(self) -> Loom: ...
    @property
    def leaf(self) -> str | None: ...
    def next_turn_id(self) -> str:
        """The id the next turn this entity records will carry (the turn holding the
        gate call now running): reserved on first ask, so what the call writes
        elsewhere -- a memory item's provenance -- can name its turn."""
        ...


MEMORY_EXTRA = "memory"
"""The extras key of a cast's first turn that records what memory added to its context
(``{"text": ..., ...}``), so a context rebuilt from the loom shows the same prompt."""


class CastContext(Protocol):
    """What a cantrip installs to add to a cast's context before its first turn
    (memory: pinned blocks and recalled items, :mod:`cantrip.memory`)."""

    async def open_cast(
        self, entity: RunningEntity, intent: str, tags: Mapping[str, Any]
    ) -> Mapping[str, Any] | None:
        """The record of what to add (``{"text": ...}`` and what it was drawn from),
        or None for nothing. Raising refuses the cast before any turn is taken."""
        ...

    async def reopen_cast(self, entity: RunningEntity, tags: Mapping[str, Any]) -> None:
        """A cast taken up again after its first turn (a worker resuming it): set up
        what its gates need from ``tags``, those its first turn recorded. Nothing is
        added to its context: that turn's record of it is replayed from the loom."""
        ...

    @property
    def follows_up(self) -> bool:
        """Whether :meth:`after_cast` may leave work (the entity then opens a nursery
        for it under ``async with``; without, it opens none)."""
        ...

    def after_cast(
        self, entity: RunningEntity, tags: Mapping[str, Any], result: Any
    ) -> Followup | None:
        """Work to do once the cast that ended with ``result`` has returned it (memory
        consolidation), or None for nothing. Never raises: it is past the cast."""
        ...


class Followup(Protocol):
    """Work a cast leaves behind, done off its path: a background cast of its own
    (memory consolidation, :mod:`cantrip.memory._consolidate`)."""

    async def run(self) -> None:
        """Do the work to its end. Its failures are its own -- recorded, logged --
        and never raised: the cast that left it has already returned."""
        ...

    def cancel(self, reason: str) -> None:
        """Cut the work off, recorded with ``reason`` (``shutdown``), wherever it is."""
        ...


class FollowupRunner(Protocol):
    """Where an entity's followups run: a supervised nursery (the entity's own under
    ``async with``, or its host's), or a queue for workers (``--db``)."""

    async def start(self, followup: Followup) -> None:
        """Begin ``followup`` and return at once (it runs on, supervised)."""
        ...


CURRENT_ENTITY: contextvars.ContextVar[RunningEntity] = contextvars.ContextVar(
    "cantrip_current_entity"
)
"""The entity on whose behalf a gate or a medium's code is running."""


def running_entity() -> RunningEntity | None:
    """The entity whose turn is running here, or None outside any turn."""
    return CURRENT_ENTITY.get(None)
