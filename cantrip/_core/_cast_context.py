"""What a cantrip adds to a cast's context before its first turn (memory), recorded.

The cantrip installs a :class:`~cantrip._running.CastContext` (memory's, from
:mod:`cantrip.memory`); the core knows it only by that shape. What it returns is put
in the cast's tags, which the cast's first turn records in its extras
(``extras["memory"]``), and shown in the working context right after the intent. A
context rebuilt from the loom -- a resumed or forked entity, a replay -- renders it
from that record (:meth:`cantrip._context.Context.add_turn`) and never asks the store
again, so it sees the prompt the model saw.

Once a cast has ended, the context may leave work to do after it (memory
consolidation, :meth:`~cantrip._running.CastContext.after_cast`): a followup handed
to the entity's followup runner (:mod:`._followups`), never run on the cast's path
unless nobody owns a nursery for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from cantrip._core._cast import Cast
from cantrip._core._followups import leave
from cantrip._core._state import EntityState
from cantrip._running import MEMORY_EXTRA
from cantrip.loom._model import Turn


async def open_cast_context(entity: EntityState, cast: Cast) -> None:
    """Ask the cantrip's cast context what to add to ``cast`` (before any turn: a
    refusal -- a namespace that needs a user the cast does not name -- records nothing)."""
    source = entity.cantrip.cast_context
    if source is None:
        return
    added = await source.open_cast(entity, cast.intent, cast.tags)
    if added:
        cast.tags = {**cast.tags, MEMORY_EXTRA: dict(added)}


async def reopen_cast_context(entity: EntityState, recorded: Sequence[Turn]) -> None:
    """A cast continued from ``recorded`` (its turns in the loom, a worker having died):
    the cantrip's cast context is set up again from what the first of them recorded."""
    source = entity.cantrip.cast_context
    if source is None or not recorded or recorded[0].intent is None:
        return
    await source.reopen_cast(entity, recorded[0].extras)


def show_cast_context(entity: EntityState, cast: Cast) -> None:
    """Show what :func:`open_cast_context` added, after the intent just shown."""
    if entity.cantrip.cast_context is None:
        return
    added = cast.tags.get(MEMORY_EXTRA)
    if added:
        entity._context.add_memory(str(added["text"]))


async def close_cast_context(
    entity: EntityState, tags: Any, result: Any, *, continued: bool = False
) -> None:
    """Hand on what the cantrip's cast context leaves after a cast that ended with
    ``result`` (a paused cast has not ended: nothing yet). ``continued``: the result
    of an answer that carried a paused cast on, which holds only the turns after the
    pause -- the context is given the whole cast, read back from the loom."""
    source = entity.cantrip.cast_context
    if source is None or not source.follows_up or getattr(result, "paused", False):
        return
    if continued and result.turns:
        result = attrs.evolve(result, turns=whole_cast(entity, result.turns[-1]))
    followup = source.after_cast(entity, tags, result)
    if followup is not None:
        await leave(entity.followups, followup)


def whole_cast(entity: EntityState, last: Turn) -> tuple[Turn, ...]:
    """The turns of the cast ``last`` ends: this entity's turns of its thread from the
    latest one that carries an intent (the cast's first) to ``last``."""
    thread = [t for t in entity.loom.lineage(last.id) if t.entity_id == entity.id]
    starts = [i for i, t in enumerate(thread) if t.intent is not None]
    return tuple(thread[starts[-1] :] if starts else thread)
