"""The mailbox: what reaches a running cast from outside while it runs.

Two kinds of mail, each a loop beside the cast that NOTIFY wakes (and a poll in case a
notification was missed -- for messages, one statement for all the worker's casts,
:func:`mail_poll`, not one per cast: at 1,000 casts a poll each every ``poll_s`` was more
statements than their turns, issue 46.4): messages sent to the prompt (``serve --db``'s
``/messages``), handed to the cast in order, each joining exactly one turn; and pauses
the entity tree waits on in place (a child's), published so that any process can
answer them, their answers handed back to the entity.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping

import trio

from cantrip._approval import PauseError
from cantrip._redact import get_logger
from cantrip.distributed._outage import database_away
from cantrip.distributed._owned import Owned
from cantrip.distributed._pauses import LivePauses
from cantrip.distributed._queue import WorkQueue

log = get_logger("cantrip.worker")

LIVE_TICK_S = 0.25
"""How often a worker looks for pauses its entities' children wait on in place (in
memory; while one is published, the database is asked for its answer when NOTIFY
says so, and every ``poll_s`` in case a notification was missed)."""


async def deliver(owned: Owned, queue: WorkQueue, limiter: trio.CapacityLimiter) -> None:
    """Hand the messages sent to this work's cast to it, in the order they were sent,
    from the moment it begins until it ends (this task is cancelled then). Woken by
    NOTIFY cantrip_steer, and by the worker's :func:`mail_poll` in case one was missed.
    One the cast no longer takes (it ended) is left: the prompt's result reports it
    ``undelivered``, read from the loom."""
    await owned.casting.wait()
    entity = owned.entity
    assert entity is not None
    skip, after, waiting = owned.delivered, 0, []
    while True:
        read, owned.first_mail = owned.first_mail, None
        with database_away() as away:
            if read is None:
                owned.mail = trio.Event()  # a NOTIFY from now on wakes us
                read = await trio.to_thread.run_sync(
                    queue.messages, owned.claim.work_id, after, limiter=limiter
                )
            # else: read with the refresh, after the claim made ``mail`` (what came
            # since has set it: we read again at once)
            fresh = read
        if away.exc is None:
            for message_id, text in fresh:
                after = message_id
                if skip:
                    skip -= 1  # an earlier attempt's turn recorded it
                else:
                    waiting.append(text)
            owned.mail_after = after
        while waiting and entity.steer(waiting[0]):
            waiting.pop(0)
        # a message the cast did not take yet: it is starting (or over: then we stop);
        # a read lost with the connection is tried again at the next tick
        again = LIVE_TICK_S if waiting or away.exc is not None else math.inf
        with trio.move_on_after(again):
            await owned.mail.wait()


async def mail_poll(
    runs: Mapping[str, Owned], queue: WorkQueue, limiter: trio.CapacityLimiter, poll_s: float
) -> None:
    """Every ``poll_s``, one statement asks for the newest message of every cast this
    worker runs; a cast with one newer than it has read is woken (its NOTIFY was
    missed). A lost connection is tried again at the next tick."""
    while True:
        await trio.sleep(poll_s)
        casting = [o for o in runs.values() if o.casting.is_set()]
        if not casting:
            continue
        newest: dict[int, int] = {}
        with database_away():
            newest = await trio.to_thread.run_sync(
                queue.newest_messages, [o.claim.work_id for o in casting], limiter=limiter
            )
        for owned in casting:
            if newest.get(owned.claim.work_id, 0) > owned.mail_after:
                owned.mail.set()


async def live_pauses(
    owned: Owned, board: LivePauses, limiter: trio.CapacityLimiter, poll_s: float
) -> None:
    """Pauses the entity tree waits on in place -- a child's (children cannot leave
    their parent's cast) -- published so that any process can answer them
    (``Dispatcher.answer``, ``serve --db``); their answers handed to the entity.
    A lost connection is tried again at the next tick."""
    published: set[str] = set()
    asked_at = [-math.inf]
    try:
        while True:
            with database_away():  # a lost connection: tried again at the next tick
                await _live_tick(owned, board, limiter, poll_s, published, asked_at)
            with trio.move_on_after(LIVE_TICK_S):
                await owned.poke.wait()
    finally:
        if published:
            with trio.CancelScope(shield=True), contextlib.suppress(Exception):
                await trio.to_thread.run_sync(board.forget, sorted(published), limiter=limiter)


async def _live_tick(
    owned: Owned,
    board: LivePauses,
    limiter: trio.CapacityLimiter,
    poll_s: float,
    published: set[str],
    asked_at: list[float],
) -> None:
    woken, owned.poke = owned.poke, trio.Event()  # a NOTIFY from now on wakes us
    entity = owned.entity
    live = {p.pause_id: p for p in (entity.live_pending if entity else ())}
    fresh = [p.to_dict() for i, p in live.items() if i not in published]
    if fresh:
        await trio.to_thread.run_sync(board.publish, owned.claim, fresh, limiter=limiter)
        published.update(p["pause_id"] for p in fresh)
    gone = {i for i in published if i not in live}  # answered by a timeout
    due = woken.is_set() or trio.current_time() - asked_at[0] >= poll_s
    if entity is not None and published - gone and due:
        asked_at[0] = trio.current_time()
        answers = await trio.to_thread.run_sync(
            board.answers, sorted(published - gone), limiter=limiter
        )
        for pause_id, decision in answers:
            gone.add(pause_id)
            try:
                await entity.answer(pause_id, decision)
            except PauseError as exc:  # timed out meanwhile: it was denied
                log.info("%s: %s", owned.claim.entity_id, exc)
    if gone:
        await trio.to_thread.run_sync(board.forget, sorted(gone), limiter=limiter)
        published.difference_update(gone)
