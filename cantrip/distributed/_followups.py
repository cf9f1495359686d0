"""On the workers, the work a cast leaves behind is queued, not run beside it (42.5).

A cast a worker runs whose memory consolidates leaves a
:class:`~cantrip.memory.ConsolidationRun`. Here it becomes a work item of its own --
the same spell, marked with :data:`CONSOLIDATES_KEY` (the cast it consolidates) and the
source's user -- for whichever worker claims it next: it is leased, heartbeated,
resumed after a crash, cancelled and dead-lettered like any queued cast, and the
source cast's work ends without waiting for it. The worker that claims it casts the
source cantrip's consolidator (:func:`consolidation_spell`) on the run's transcript.

Queueing is past the source cast (its result is recorded), and it is idempotent: the
consolidation's entity id is derived from the source cast's last turn, and a cast that
already has its consolidation queued is not queued again. So a worker that died after
the cast's last turn but before queueing (or before its work was marked ended) leaves
it to the worker that takes the work over, which finds the cast ended and queues what
is missing (:meth:`cantrip.distributed._execution.Execution`). A failure to queue is
logged and the consolidation is lost, never the cast's outcome.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import trio

from cantrip._cantrip import Cantrip
from cantrip._client_gates import CLIENT_TOOLS_KEY
from cantrip._errors import CantripError
from cantrip._redact import get_logger
from cantrip._running import Followup
from cantrip.distributed._queue import WorkQueue
from cantrip.distributed._work import (
    ANSWER_KEY,
    BUDGETS_KEY,
    CONSOLIDATES_KEY,
    CWD_KEY,
    REWIND_KEY,
    USER_KEY,
)
from cantrip.memory._cast import MemoryContext
from cantrip.memory._consolidate import CONSOLIDATES_TAG, ConsolidationRun
from cantrip.memory._settings import USER_TAG

log = get_logger("cantrip.worker")

_NOT_CARRIED = (ANSWER_KEY, REWIND_KEY, CLIENT_TOOLS_KEY, BUDGETS_KEY, USER_KEY, CWD_KEY)
"""What the source's work carries that a consolidation does not: its answer, rewind
point, front end's tools and session budget are the source cast's own."""


class QueuedFollowups:
    """A :class:`~cantrip._running.FollowupRunner` that queues consolidations for the
    workers, built from the spell of the work whose cast left them."""

    def __init__(self, queue: WorkQueue, spell: Mapping[str, Any]) -> None:
        self.queue = queue
        self.spell = {k: v for k, v in spell.items() if k not in _NOT_CARRIED}
        self.queued: list[tuple[int, str]] = []
        """(work id, entity id) of each consolidation queued."""

    async def start(self, followup: Followup) -> None:
        if not isinstance(followup, ConsolidationRun):  # the only followup there is
            raise CantripError(f"a worker cannot queue a {type(followup).__name__}")
        consolidates = followup.tags[CONSOLIDATES_TAG]
        spell = {**self.spell, CONSOLIDATES_KEY: consolidates}
        user = followup.tags.get(USER_TAG)
        if isinstance(user, str):
            spell[USER_KEY] = user
        entity_id = consolidation_entity_id(consolidates["turn_ids"][-1])
        store = self.queue.store

        def enqueue_once() -> int | None:
            if self.queue.work_of([entity_id]):
                return None  # queued by an earlier attempt at the source's work
            return self.queue.enqueue(spell, followup.intent, entity_id)

        try:
            work_id = await trio.to_thread.run_sync(enqueue_once, limiter=store.limiter)
        except Exception:
            log.exception("the consolidation of entity %s was not queued", followup.source_entity)
            return
        if work_id is None:
            log.info("consolidation of entity %s was queued before", followup.source_entity)
            return
        self.queued.append((work_id, entity_id))
        log.info(
            "consolidation of entity %s queued as work %d (entity %s)",
            followup.source_entity,
            work_id,
            entity_id,
        )


def consolidation_entity_id(last_turn_id: str) -> str:
    """The entity of the consolidation of the cast that ended with ``last_turn_id``: one
    id per cast, whichever worker (or attempt) queues it."""
    digest = hashlib.sha256(f"consolidates:{last_turn_id}".encode()).hexdigest()
    return "entity-" + digest[:20]


async def consolidation_spell(source: Cantrip) -> Cantrip:
    """The consolidator of ``source`` (a work item marked :data:`CONSOLIDATES_KEY`)."""
    context = source.cast_context
    if not isinstance(context, MemoryContext) or context.settings.consolidate is None:
        raise CantripError("this work consolidates, but its cantrip's memory does not")
    consolidator: Cantrip = await context.consolidator()
    return consolidator
