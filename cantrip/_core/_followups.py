"""Followups: the work a cast leaves behind, run in a supervised nursery, never detached.

A cast with memory consolidation leaves a :class:`~cantrip._running.Followup` (a
background cast of its own). The cast has returned by then; the followup runs on in
a nursery owned by someone who outlives it and waits for it or cancels it:

* the entity itself, under ``async with entity`` (:meth:`Followups.enter`): leaving
  the block waits for its followups -- ``Cantrip.cast_async`` returns once its
  consolidation has ended;
* a host that lends one (``serve``: the session hub's, :meth:`Followups.lent`),
  which cancels what still runs at shutdown (:meth:`cancel_all`), recorded as such;
* a queue for workers under ``--db`` (cantrip.distributed), not this class.

With none of these -- ``entity.send`` outside ``async with`` and no host -- the cast's
caller runs it before ``send`` returns (:func:`run_followup`): still supervised, only
not in the background. A followup's failures are its own (it records and logs
them); one that raises anyway is logged here, at the nursery's boundary, so it can
never take the nursery -- or the casts of a host beside it -- down.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio

from cantrip._redact import get_logger
from cantrip._running import Followup, FollowupRunner

log = get_logger("cantrip.followups")


@attrs.define(eq=False)
class Followups:
    """A nursery for followups, the ones running kept so that they can be cancelled."""

    nursery: trio.Nursery
    _manager: Any = None
    """The nursery's context manager when this owns the nursery."""
    running: set[Followup] = attrs.field(factory=set)

    @classmethod
    async def enter(cls) -> Followups:
        """Followups in a nursery of their own (left by :meth:`aclose`): entered by
        hand, like the entity's provider scope, so that the entity's ``async with``
        body passes its exceptions through unchanged."""
        manager = trio.open_nursery()
        nursery = await manager.__aenter__()
        return cls(nursery, manager)

    @classmethod
    def lent(cls, nursery: trio.Nursery) -> Followups:
        return cls(nursery)

    async def start(self, followup: Followup) -> None:
        self.running.add(followup)
        self.nursery.start_soon(self._run, followup)

    async def _run(self, followup: Followup) -> None:
        try:
            await run_followup(followup)
        finally:
            self.running.discard(followup)

    def cancel_all(self, reason: str) -> int:
        """Cut off every followup still running (recorded with ``reason``); how many."""
        running = list(self.running)
        for followup in running:
            followup.cancel(reason)
        return len(running)

    async def aclose(self) -> None:
        """Wait for the followups to end, then leave the nursery if this owns it (a
        cancellation from outside cancels them, and each records that)."""
        manager, self._manager = self._manager, None
        if manager is not None:
            await manager.__aexit__(None, None, None)


async def run_followup(followup: Followup) -> None:
    """Run ``followup`` to its end; an exception it lets out is logged, never raised."""
    try:
        await followup.run()
    except Exception:
        log.exception("a followup of a cast failed")


async def leave(runner: FollowupRunner | None, followup: Followup) -> None:
    """Hand ``followup`` to ``runner``, or run it here when there is none. A runner that
    cannot take it (its nursery closed) loses the followup, logged -- never the result
    of the cast that left it, which its caller is about to receive."""
    if runner is None:
        await run_followup(followup)
        return
    try:
        await runner.start(followup)
    except Exception:
        log.exception("a followup of a cast could not be started")
