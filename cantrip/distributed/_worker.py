"""Workers: processes on any number of machines that run the entities others enqueue.

``cantrip worker --db URL`` runs :class:`Worker`: it claims work from the queue
(:mod:`cantrip.distributed._queue`), holds each entity under a lease it heartbeats, and
runs the cast -- resuming it from the loom when an earlier worker died holding
it. Every loom write carries the lease's fence, so a worker that lost its lease
(paused, partitioned) can never append again: its writes are refused, it drops
the entity, and the worker that claimed it next continues from what the loom
and the gate journal hold.

Children an entity spawns run in the same worker, in the entity's nursery,
under its lease: cancelling the entity (``WorkQueue.cancel``, delivered by
``NOTIFY cantrip_cancel`` with a heartbeat poll as the fallback) cancels its
whole tree, and every cut-off turn is recorded.

A cast the queue hands out *quarantined* (a suspect: it was in two crashes of workers
that held it beside other casts) runs here alone: the worker claims nothing else until
it records a turn (then it is innocent again, and the queue says so before anything is
claimed beside it) or ends -- to its end if it was cleared once already -- so if
this worker dies meanwhile, the queue knows which cast killed it
(:mod:`cantrip.distributed._queue`, reaping).

A worker told to stop (``cantrip worker`` on SIGTERM or SIGINT: :meth:`Worker.drain`)
claims nothing more and lets each running cast reach its next turn boundary
(``Entity.suspend``), then hands its lease back unrecorded (``WorkQueue.hand_back``):
another worker resumes it at no attempt and no crash. What still runs when the grace
period (``drain_s``) ends, or at a second signal (:meth:`Worker.hand_back`), is cut off
at once -- its lease given up here first, so its cut-off turn is never recorded -- and
handed back the same way.

Messages sent to a running prompt (``serve --db``'s ``/messages``: rows of
``cantrip_messages``, announced by ``NOTIFY cantrip_steer``) are handed to the cast in
order (``Entity.steer``); a cast taken over from a dead worker skips those its turns
already recorded, so each joins exactly one turn or comes back ``undelivered``. A
prompt queued by ``rollback`` carries a rewind point: the entity is rewound there
(``Entity.rewind``) before its cast begins.

:class:`~cantrip.distributed._dispatcher.Dispatcher` is the enqueueing side (``cantrip
cast --db``, the Python API).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import socket
from collections.abc import Mapping
from typing import Any

import attrs
import trio

from cantrip._approval import Decision, PauseError
from cantrip._cantrip import Cantrip
from cantrip._client_gates import CLIENT_TOOLS_KEY, client_gates
from cantrip._entity import Entity
from cantrip._errors import CantripError, LLMError
from cantrip._gate import Gate
from cantrip._outcome import CastResult, recorded_cast
from cantrip._redact import get_logger
from cantrip.distributed._outage import Outage, database_away, describe, is_connection_error
from cantrip.distributed._outcome import (
    failure_outcome,
    lease_lost,
    outcome_of,
    state_of,
    suspended,
)
from cantrip.distributed._queue import (
    ANSWER_KEY,
    CANCEL_CHANNEL,
    MAX_ATTEMPTS,
    QUARANTINE_AFTER,
    REWIND_KEY,
    STEER_CHANNEL,
    WORK_CHANNEL,
    Claim,
    LivePauses,
    WorkQueue,
    heartbeat_on,
    parse_cancel,
)
from cantrip.distributed._spells import build_spell, spell_key
from cantrip.loom._loom import Loom
from cantrip.loom._model import Turn
from cantrip.loom._postgres import PostgresStore, lease_lost_message

log = get_logger("cantrip.worker")

QUARANTINE_TICK_S = 0.05
"""How often a worker running a suspect alone looks whether it recorded a turn (its
entity's leaf, in memory): the worker claims nothing else until then."""
LIVE_TICK_S = 0.25
"""How often a worker looks for pauses its entities' children wait on in place (in
memory; while one is published, the database is asked for its answer when NOTIFY
says so, and every ``poll_s`` in case a notification was missed)."""


DRAIN_S = 30.0
"""How long a stopping worker's running casts get to reach their next turn boundary
before the rest are cut off and handed back (``cantrip worker --drain-s``)."""
HANDED_BACK = "handed back at shutdown"
"""Why the loom refuses a cut-off run's writes: its lease is being handed back."""


@attrs.define
class _Owned:
    """An entity this worker runs now."""

    claim: Claim
    run: trio.CancelScope
    """The run's scope; its deadline is the lease's local deadline (moved by each
    renewal): a lease that runs out stops the run here, whatever the heartbeat is doing."""
    entity: Entity | None = None
    cancelled: bool = False
    releasing: bool = False
    """Set just before ``finish`` releases the lease: from then on a heartbeat that finds
    the lease gone is not a loss (finish itself reports a lease lost before it)."""
    lost: str | None = None
    """Why the lease is gone (said once, by whoever found out first)."""
    poke: trio.Event = attrs.Factory(trio.Event)
    """Set when NOTIFY says something about this entity (an answer to a live pause)."""
    cancel_reason: str = "cancelled"
    mail: trio.Event = attrs.Factory(trio.Event)
    """Set when NOTIFY says a message for this entity's cast arrived."""
    casting: trio.Event = attrs.Factory(trio.Event)
    """Set as the cast is about to begin (``delivered`` is known then)."""
    delivered: int = 0
    """Messages to this work that the loom already shows joined a turn (an earlier
    attempt's): the first ``delivered`` are not handed to the cast again."""
    began: str | None = None
    """The entity's latest turn as the cast began (a turn after it: the cast got on)."""
    quarantine: trio.Event | None = None
    """Set (by :meth:`Worker._innocent`) once this suspect cast, run alone, recorded
    a turn or ended: the worker claims other work again."""
    handing_back: bool = False
    """The worker is stopping: the cast stops at its next turn boundary (or sooner, if
    ``cut``) and the lease is handed back, unless the cast ends first."""
    cut: bool = False
    """Cut off now (a second signal, or the grace period's end): the lease is given up
    here first, so nothing more of the run is recorded."""

    def cancel(self, reason: str = "cancelled") -> None:
        self.cancelled, self.cancel_reason = True, reason
        if self.entity is not None:
            self.entity.cancel(reason)


class Worker:
    """Claims and runs queued casts (``cantrip worker``) until :meth:`drain` -- which
    hands the running casts back at their next turn boundary -- or until cancelled
    (which cuts them off where they are: an embedding application stops it with
    :meth:`drain`)."""

    def __init__(
        self,
        url: str,
        *,
        concurrency: int = 16,
        lease_s: float = 10.0,
        poll_s: float = 2.0,
        worker_id: str | None = None,
        max_attempts: int = MAX_ATTEMPTS,
        quarantine_after: int = QUARANTINE_AFTER,
        drain_s: float = DRAIN_S,
    ) -> None:
        if drain_s < 0:
            raise CantripError(f"the grace period is at least 0 seconds, not {drain_s:g}")
        self.url = url
        self.drain_s = drain_s
        self.concurrency = concurrency
        self.lease_s = lease_s
        self.poll_s = poll_s
        self.max_attempts = max_attempts
        self.quarantine_after = quarantine_after
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"
        self._owned: dict[str, _Owned] = {}
        """Entities whose run has not ended here (each is never claimed again until it has)."""
        self._wake = trio.Event()
        self._spells: dict[str, Cantrip] = {}
        self._quarantine: trio.Event | None = None
        """Set while a suspect cast runs here alone: nothing else is claimed until it
        records a turn or ends (then the event is set)."""
        self.completed = 0
        self.handed_back = 0
        """Casts whose leases this worker handed back unrecorded as it stopped."""
        self.draining = False
        self._claiming = trio.CancelScope()
        """The claim loop's scope: :meth:`drain` cancels it (the runs go on)."""

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        store = await trio.to_thread.run_sync(
            lambda: PostgresStore(self.url, max_connections=max(4, self.concurrency // 2))
        )
        self.loom = Loom(store)
        self.queue = WorkQueue(store)
        self._live = await trio.to_thread.run_sync(LivePauses, store)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self._listen)
                nursery.start_soon(self._heartbeats)
                task_status.started(self.worker_id)
                async with trio.open_nursery() as runs:
                    with self._claiming:
                        await self._claim(runs, store)
                    # drained: the runs end at their turn boundaries, or at the grace's end
                    nursery.start_soon(self._grace)
                nursery.cancel_scope.cancel()  # every run has ended: no lease is left
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self.loom.close)

    async def _claim(self, runs: trio.Nursery, store: PostgresStore) -> None:
        """Claim work for the free slots until :meth:`drain` (each claim is made and
        taken into ``_owned`` shielded: a claim the database made is never dropped)."""
        outage = Outage("worker claims", log)
        free = trio.Semaphore(self.concurrency)
        while True:
            if self._quarantine is not None:  # a suspect runs here alone
                await self._quarantine.wait()
            slots = await _take_free(free)
            with database_away() as away, trio.CancelScope(shield=True):
                claimed = await self._claim_some(runs, store, free, slots)
            if away.exc is not None:
                for _ in range(slots):
                    free.release()
                await self._wait_out(outage, away.exc)
                continue
            outage.ok()
            if claimed < slots:  # the queue is drained (for now)
                with trio.move_on_after(self.poll_s):  # NOTIFY wakes us sooner
                    await self._wake.wait()
                self._wake = trio.Event()

    async def _claim_some(
        self,
        runs: trio.Nursery,
        store: PostgresStore,
        free: trio.Semaphore,
        slots: int,
    ) -> int:
        """One claim for ``slots`` free slots; the runs of what it got started; how
        many it got. The slots it got nothing for are freed again. No claim is sent
        once :meth:`drain` was called; one sent before is taken in whole."""
        sent = trio.current_time()
        claim = functools.partial(
            self.queue.claim_many,
            self.worker_id,
            self.lease_s,
            slots,
            busy=list(self._owned),  # runs not ended here are never claimed
            max_attempts=self.max_attempts,
            idle=not self._owned,
            one_slot=self.concurrency == 1,
            alone=[o.claim.work_id for o in self._owned.values() if o.claim.quarantined],
            quarantine_after=self.quarantine_after,
        )

        def unless_draining() -> list[Claim]:  # (drain() may come while the limiter waits)
            return [] if self.draining else claim()

        claims = await trio.to_thread.run_sync(unless_draining, limiter=store.limiter)
        for _ in range(slots - len(claims)):
            free.release()
        for claimed in claims:
            until = sent + self.lease_s  # never after the database's expiry
            owned = _Owned(claimed, trio.CancelScope(deadline=until))
            if claimed.quarantined:  # (then it is the only claim)
                owned.quarantine = self._quarantine = trio.Event()
                log.warning(
                    "%s: in crashes of workers that held other casts too; "
                    "run here alone until it %s",
                    claimed.entity_id,
                    "ends (cleared once already)" if claimed.paroled else "records a turn",
                )
            if self.draining:  # (a claim sent just before the drain began)
                owned.handing_back = True
            self._owned[claimed.entity_id] = owned
            self.loom.hold(claimed.entity_id, claimed.fence, until=until)
            runs.start_soon(self._own, owned, free)
        return len(claims)

    # -- stopping ------------------------------------------------------------------

    def drain(self) -> None:
        """Stop: claim nothing more; each running cast stops at its next turn boundary
        (every turn before it recorded) and its lease is handed back, unrecorded, so
        another worker resumes it at no attempt and no crash. :meth:`run` returns once
        every run has ended; what still runs after ``drain_s`` is handed back at once
        (:meth:`hand_back`). A cast that ends first records its outcome as usual."""
        if self.draining:
            return
        self.draining = True
        self._claiming.cancel()
        for owned in self._owned.values():
            owned.handing_back = True
            if owned.entity is not None:
                owned.entity.suspend()

    def hand_back(self) -> None:
        """Stop now (a second signal; the grace period's end): every run is cut off --
        its lease given up here first, so nothing more of it is recorded: the turn in
        flight is taken again by the next worker, from the gate journal -- and its lease
        handed back."""
        self.drain()
        for owned in self._owned.values():
            if owned.releasing or owned.cut:
                continue  # its outcome is being recorded, or it is being handed back
            owned.handing_back = owned.cut = True
            self.loom.lose(owned.claim.fence, HANDED_BACK)
            owned.run.cancel()

    async def _grace(self) -> None:
        await trio.sleep(self.drain_s)
        running = [o for o in self._owned.values() if not o.cut]
        if running:
            log.warning(
                "the grace period (%g s) is over: handing %d running casts back at once",
                self.drain_s,
                len(running),
            )
        self.hand_back()

    async def _wait_out(self, outage: Outage, exc: BaseException) -> None:
        """A database call failed on a lost connection: refresh the pool's idle
        connections (a restarted server broke them all) and wait the backoff."""
        delay = outage.failed(exc)
        store: PostgresStore = self.loom.store  # type: ignore[assignment]
        with contextlib.suppress(Exception):  # the database may still be away
            await trio.to_thread.run_sync(store.pool.check, limiter=store.limiter)
        await trio.sleep(delay)

    # -- wake-ups and cancels ------------------------------------------------------

    async def _listen(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """LISTEN for new work and cancel requests on a connection of its own; a lost
        connection is made again (with backoff), and the claim loop is woken then --
        what was notified meanwhile was missed."""
        outage = Outage("worker LISTEN", log)
        limiter = trio.CapacityLimiter(1)
        while True:
            with database_away() as away:
                await self._listen_once(limiter, outage, task_status)
            if away.exc is not None:
                delay = outage.failed(away.exc)
                task_status = trio.TASK_STATUS_IGNORED
                await trio.sleep(delay)

    async def _listen_once(
        self, limiter: trio.CapacityLimiter, outage: Outage, task_status: trio.TaskStatus[None]
    ) -> None:
        import psycopg

        conn = await trio.to_thread.run_sync(
            lambda: psycopg.connect(self.url, autocommit=True, connect_timeout=5),
            limiter=limiter,
        )
        try:
            await trio.to_thread.run_sync(
                lambda: conn.execute(
                    f"LISTEN {WORK_CHANNEL}; LISTEN {CANCEL_CHANNEL}; LISTEN {STEER_CHANNEL}"
                ),
                limiter=limiter,
            )
            if outage.down:
                self._wake.set()  # look for work notified while the connection was lost
                for owned in self._owned.values():
                    owned.mail.set()  # and for messages
            outage.ok()
            task_status.started()
            while True:
                notes = await trio.to_thread.run_sync(
                    lambda: [
                        (n.channel, n.payload) for n in conn.notifies(timeout=0.25, stop_after=1)
                    ],
                    limiter=limiter,
                )
                for channel, payload in notes:
                    if channel == WORK_CHANNEL:
                        self._wake.set()
                        if payload in self._owned:
                            self._owned[payload].poke.set()
                    elif channel == CANCEL_CHANNEL:
                        entity_id, reason = parse_cancel(payload)
                        if entity_id in self._owned:
                            self._owned[entity_id].cancel(reason)
                    elif channel == STEER_CHANNEL and payload in self._owned:
                        self._owned[payload].mail.set()
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(conn.close)

    # -- leases ----------------------------------------------------------------------

    async def _heartbeats(self) -> None:
        """Renew every lease this worker holds, every third of the lease, in one statement
        on a connection of its own -- never queued behind the loom's writes. A renewal
        moves each run's local deadline to when it was *sent* plus the lease; a lease
        the database no longer holds stops its run at once; one that cannot be renewed
        (the database is away) stops its run at its deadline."""
        import psycopg

        limiter = trio.CapacityLimiter(1)
        outage = Outage("worker heartbeat", log)
        conn: psycopg.Connection[Any] | None = None
        try:
            while True:
                await trio.sleep(self.lease_s / 3)
                owned = [o for o in self._owned.values() if not o.releasing and o.lost is None]
                if not owned:
                    continue
                sent = trio.current_time()
                with database_away() as away:
                    if conn is None:
                        conn = await trio.to_thread.run_sync(
                            lambda: psycopg.connect(self.url, autocommit=True, connect_timeout=5),
                            limiter=limiter,
                        )
                    renewed = await trio.to_thread.run_sync(
                        heartbeat_on,
                        conn,
                        self.worker_id,
                        [o.claim.fence for o in owned],
                        self.lease_s,
                        limiter=limiter,
                    )
                if away.exc is not None:
                    outage.failed(away.exc)  # the next tick tries again; deadlines stop the runs
                    if conn is not None:
                        bad, conn = conn, None
                        await trio.to_thread.run_sync(bad.close, limiter=limiter)
                    continue
                outage.ok()
                for o in owned:
                    if self._owned.get(o.claim.entity_id) is not o or o.run.cancel_called:
                        continue  # ended, or being stopped, while the beat was out
                    if o.claim.entity_id in renewed:
                        cancel = renewed[o.claim.entity_id]
                        if cancel is None:  # a write held the row: renewed next beat
                            continue
                        until = sent + self.lease_s
                        o.run.deadline = max(o.run.deadline, until)
                        self.loom.renew(o.claim.fence.lease_entity, until)
                        if cancel and not o.cancelled:
                            o.cancel(cancel)  # the poll fallback of NOTIFY cantrip_cancel
                    elif not o.releasing:  # given up on purpose by finish is not lost
                        self._lose(o, lease_lost_message(o.claim.fence))
        finally:
            if conn is not None:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(conn.close)

    def _lose(self, owned: _Owned, why: str) -> None:
        """The lease is gone: refuse the run's writes here and stop it (said once)."""
        if owned.lost is None:
            owned.lost = why
            log.warning("%s: lease lost; stopping it here", owned.claim.entity_id)
        self.loom.lose(owned.claim.fence, why)
        owned.run.cancel()

    # -- one entity --------------------------------------------------------------

    async def _own(self, owned: _Owned, free: trio.Semaphore) -> None:
        """Run one claimed item, then record its outcome; whatever stops it -- a lease
        that ran out, a lost connection, an error of its own -- stops it alone."""
        claim = owned.claim
        try:
            ended: tuple[str, dict[str, Any]] | None = None
            try:
                async with trio.open_nursery() as nursery:
                    if self._asks_humans(claim):
                        nursery.start_soon(self._live_pauses, owned)
                    nursery.start_soon(self._deliver, owned)
                    if owned.quarantine is not None and not claim.paroled:
                        nursery.start_soon(self._watch_quarantine, owned)
                    try:
                        with owned.run:
                            ended = await self._execute(owned)
                    finally:
                        nursery.cancel_scope.cancel()
                if ended is not None:
                    await self._finish(owned, *ended)
                elif owned.cut:  # the run's scope stopped it: cut off to be handed back
                    await self._hand_back(owned)
                else:  # the run's scope stopped it: the lease ran out here
                    self._lose(owned, "the lease ran out here before it was renewed")
            except Exception as exc:  # noqa: BLE001 -- one cast's boundary: the worker goes on
                if owned.handing_back and (
                    suspended(exc) or (owned.cut and lease_lost(exc) and owned.lost is None)
                ):
                    await self._hand_back(owned)
                else:
                    await self._stopped(owned, exc)
        finally:
            self._owned.pop(claim.entity_id, None)
            self.loom.release(claim.entity_id)
            self._innocent(owned)  # (ended: if it still ran alone, the worker goes on)
            free.release()

    async def _watch_quarantine(self, owned: _Owned) -> None:
        """A suspect cast runs here alone: once it records a turn -- it got past where
        the worker that held it died, without killing this one -- it is innocent again
        (recorded in the queue first, so a crash from now on is not blamed on it alone),
        and the worker takes other work beside it."""
        await owned.casting.wait()
        entity = owned.entity
        assert entity is not None
        while entity.leaf in (owned.began, None):
            await trio.sleep(QUARANTINE_TICK_S)
        limiter = self.loom.store.limiter  # type: ignore[attr-defined]
        clear = functools.partial(self.queue.cleared, owned.claim)
        while True:
            with database_away() as away:
                cleared = await trio.to_thread.run_sync(clear, limiter=limiter)
            if away.exc is None:
                break
            await trio.sleep(self.poll_s)  # still alone meanwhile: try again
        if cleared:  # (else the lease is lost: the run is stopping)
            log.info("%s: recorded a turn in quarantine; innocent again", owned.claim.entity_id)
            self._innocent(owned)

    def _innocent(self, owned: _Owned) -> None:
        """The quarantine of ``owned`` (if it was in one) is over: claim again."""
        if owned.quarantine is None or owned.quarantine.is_set():
            return
        owned.quarantine.set()
        if self._quarantine is owned.quarantine:
            self._quarantine = None
        self._wake.set()

    async def _stopped(self, owned: _Owned, exc: Exception) -> None:
        """A run stopped without an outcome: its lease was lost (another claim continues
        it), its database connection was lost, or an error in cantrip stopped it outside
        the cast (logged with its traceback). The last two give the lease up, so the next
        claim -- counted against the attempt limit -- resumes it at once."""
        claim = owned.claim
        if lease_lost(exc):
            self._lose(owned, describe(exc))
            log.info("%s: %s", claim.entity_id, describe(exc))
            return
        if is_connection_error(exc):
            log.warning(
                "%s: the database connection was lost (%s); left for the next claim",
                claim.entity_id,
                describe(exc),
            )
        else:
            log.error(
                "%s: an error in cantrip stopped the cast here; left for the next claim",
                claim.entity_id,
                exc_info=exc,
            )
        limiter = self.loom.store.limiter  # type: ignore[attr-defined]
        with contextlib.suppress(Exception):  # the database may be away: the lease runs out
            await trio.to_thread.run_sync(self.queue.abandon, claim, limiter=limiter)

    async def _hand_back(self, owned: _Owned) -> None:
        """The worker is stopping and the run stopped unrecorded -- at a turn boundary, or
        cut off with its lease given up here first: hand the lease back (fenced), so
        the next claim, any worker's, resumes it at no attempt and no crash. On a lost
        connection the lease runs out instead (a crash, as if the worker had died)."""
        claim = owned.claim
        owned.releasing = True
        limiter = self.loom.store.limiter  # type: ignore[attr-defined]
        with database_away() as away:
            returned = await trio.to_thread.run_sync(self.queue.hand_back, claim, limiter=limiter)
        if away.exc is not None:
            log.warning(
                "%s: the database connection was lost (%s); its lease runs out instead",
                claim.entity_id,
                describe(away.exc),
            )
            return
        if returned:
            self.handed_back += 1
            log.info("%s: handed back to the queue unrecorded", claim.entity_id)
        else:
            log.warning("%s: lease lost before it was handed back", claim.entity_id)

    async def _finish(self, owned: _Owned, state: str, outcome: dict[str, Any]) -> None:
        """Record the outcome and release the lease (fenced: refused if it was lost). A
        lost connection here leaves the cast to the next claim, which finds its end in
        the loom and records it then."""
        claim = owned.claim
        owned.releasing = True
        limiter = self.loom.store.limiter  # type: ignore[attr-defined]
        finished = await trio.to_thread.run_sync(
            self.queue.finish, claim, state, outcome, limiter=limiter
        )
        if finished:
            self.completed += 1
        else:
            log.warning("%s: lease lost before the outcome was recorded", claim.entity_id)

    def _asks_humans(self, claim: Claim) -> bool:
        """Whether the claimed spell's circle can pause (only then are live pauses watched)."""
        spell = self._spells.get(spell_key(claim.spell))
        return CLIENT_TOOLS_KEY in claim.spell or spell is None or spell.circle.needs_humans

    async def _deliver(self, owned: _Owned) -> None:
        """Hand the messages sent to this work's cast to it, in the order they were sent,
        from the moment it begins until it ends (this task is cancelled then). Woken by
        NOTIFY cantrip_steer, and looking every ``poll_s`` in case one was missed. One the
        cast no longer takes (it ended) is left: the prompt's result reports it
        ``undelivered``, read from the loom."""
        limiter = self.loom.store.limiter  # type: ignore[attr-defined]
        await owned.casting.wait()
        entity = owned.entity
        assert entity is not None
        skip, after, waiting = owned.delivered, 0, []
        while True:
            owned.mail = trio.Event()  # a NOTIFY from now on wakes us
            fresh: list[tuple[int, str]] = []  # on a lost connection: looked for at the next tick
            with database_away():
                fresh = await trio.to_thread.run_sync(
                    self.queue.messages, owned.claim.work_id, after, limiter=limiter
                )
            for message_id, text in fresh:
                after = message_id
                if skip:
                    skip -= 1  # an earlier attempt's turn recorded it
                else:
                    waiting.append(text)
            while waiting and entity.steer(waiting[0]):
                waiting.pop(0)
            # a message the cast did not take yet: it is starting (or over: then we stop)
            with trio.move_on_after(LIVE_TICK_S if waiting else self.poll_s):
                await owned.mail.wait()

    async def _live_pauses(self, owned: _Owned) -> None:
        """Pauses the entity tree waits on in place -- a child's (children cannot leave
        their parent's cast) -- published so that any process can answer them
        (``Dispatcher.answer``, ``serve --db``); their answers handed to the entity.
        A lost connection is tried again at the next tick."""
        limiter = self.loom.store.limiter  # type: ignore[attr-defined]
        published: set[str] = set()
        asked_at = [-math.inf]
        try:
            while True:
                with database_away():  # a lost connection: tried again at the next tick
                    await self._live_tick(owned, published, asked_at)
                with trio.move_on_after(LIVE_TICK_S):
                    await owned.poke.wait()
        finally:
            if published:
                with trio.CancelScope(shield=True), contextlib.suppress(Exception):
                    await trio.to_thread.run_sync(
                        self._live.forget, sorted(published), limiter=limiter
                    )

    async def _live_tick(self, owned: _Owned, published: set[str], asked_at: list[float]) -> None:
        limiter = self.loom.store.limiter  # type: ignore[attr-defined]
        woken, owned.poke = owned.poke, trio.Event()  # a NOTIFY from now on wakes us
        entity = owned.entity
        live = {p.pause_id: p for p in (entity.live_pending if entity else ())}
        fresh = [p.to_dict() for i, p in live.items() if i not in published]
        if fresh:
            await trio.to_thread.run_sync(self._live.publish, owned.claim, fresh, limiter=limiter)
            published.update(p["pause_id"] for p in fresh)
        gone = {i for i in published if i not in live}  # answered by a timeout
        due = woken.is_set() or trio.current_time() - asked_at[0] >= self.poll_s
        if entity is not None and published - gone and due:
            asked_at[0] = trio.current_time()
            answers = await trio.to_thread.run_sync(
                self._live.answers, sorted(published - gone), limiter=limiter
            )
            for pause_id, decision in answers:
                gone.add(pause_id)
                try:
                    await entity.answer(pause_id, decision)
                except PauseError as exc:  # timed out meanwhile: it was denied
                    log.info("%s: %s", owned.claim.entity_id, exc)
        if gone:
            await trio.to_thread.run_sync(self._live.forget, sorted(gone), limiter=limiter)
            published.difference_update(gone)

    async def _execute(self, owned: _Owned) -> tuple[str, dict[str, Any]]:
        """The work's end state and outcome. A cast that cannot run -- its spell does not
        build here, its LLM failed for good, an error of its own -- fails alone with the
        error recorded (redacted): the worker and its other casts go on. A lost lease or
        connection is not the cast's failure, nor is a cast suspended between turns (the
        worker is stopping): it propagates, and another claim resumes."""
        claim = owned.claim
        try:
            return await self._attempt(owned)
        except Exception as exc:
            if is_connection_error(exc) or lease_lost(exc) or suspended(exc):
                raise
            if isinstance(exc, CantripError):
                log.warning("%s: the cast failed: %s", claim.entity_id, describe(exc))
            else:  # a bug: its traceback is for the log, the cast fails alone
                log.exception("%s: the cast failed on an error in cantrip", claim.entity_id)
            return "failed", failure_outcome(claim.entity_id, exc)

    async def _attempt(self, owned: _Owned) -> tuple[str, dict[str, Any]]:
        claim = owned.claim
        answer = claim.spell.get(ANSWER_KEY)  # work that carries out a human's answer
        rewind = claim.spell.get(REWIND_KEY)  # a rollback: continue from this turn
        offered = client_gates(claim.spell.get(CLIENT_TOOLS_KEY) or ())  # a front end's tools
        key = spell_key(claim.spell)
        spell = self._spells.get(key)
        if spell is None:
            spell = self._spells[key] = build_spell(json.loads(key), self.loom)
        record, last = await trio.to_thread.run_sync(
            self.loom.refresh,
            claim.entity_id,
            limiter=self.loom.store.limiter,  # type: ignore[attr-defined]
        )
        entity: Entity
        try:
            if answer is not None:
                if record is None:
                    raise CantripError(f"no entity {claim.entity_id} in the loom to answer")
                entity = owned.entity = _offering(
                    spell.resume(claim.entity_id, pause="leave"), offered
                )
                recorded = self._recorded(claim, last)
                ended = self._ended(claim, recorded)
                if ended is not None:
                    return ended
                self._casting(owned, recorded)
                result = await self._cast(owned, self._answered(entity, claim, answer, last))
                return state_of(result), outcome_of(result)
            if record is None:
                entity = owned.entity = _offering(
                    spell.summon(entity_id=claim.entity_id, pause="leave"), offered
                )
                if owned.cancelled:
                    entity.cancel(owned.cancel_reason)
                self._casting(owned, [])
                result = await self._cast(owned, entity.send(claim.intent))
            else:
                entity = owned.entity = _offering(
                    spell.resume(claim.entity_id, pause="leave"), offered
                )
                recorded = self._recorded(claim, last, rewind)
                ended = self._ended(claim, recorded)
                if ended is not None:
                    return ended
                if rewind is not None and not recorded:  # (again, if a worker died since)
                    await entity.rewind(rewind.get("to"))
                self._casting(owned, recorded)
                if recorded or claim.resumed:
                    # an earlier attempt may have journaled the turn it was taking
                    result = await self._cast(owned, entity.resume_cast(claim.intent, recorded))
                else:
                    result = await self._cast(owned, entity.send(claim.intent))
        except (LLMError, PauseError) as exc:
            return "failed", failure_outcome(claim.entity_id, exc)
        return state_of(result), outcome_of(result)

    @staticmethod
    def _casting(owned: _Owned, recorded: list[Turn]) -> None:
        """The cast is about to begin: messages may be handed to it from now on, but not
        those its recorded turns (an earlier attempt's) already took."""
        owned.delivered = sum(len(t.extras.get("steering") or ()) for t in recorded)
        owned.began = owned.entity.leaf if owned.entity is not None else None
        owned.casting.set()

    def _ended(self, claim: Claim, recorded: list[Turn]) -> tuple[str, dict[str, Any]] | None:
        """How the work ended if an earlier attempt's worker died after the loom said so:
        the cast's last turn ended it, or it is a pause (it waits for an answer)."""
        if not recorded:
            return None
        end = recorded[-1]
        if not (end.terminated or end.truncated or isinstance(end.extras.get("pending"), Mapping)):
            return None
        result = recorded_cast(recorded, 0, self.loom)
        return state_of(result), outcome_of(result)

    def _answered(
        self, entity: Entity, claim: Claim, answer: Mapping[str, Any], last: Turn | None
    ) -> Any:
        """The cast that carries out a human's answer, from wherever the loom says it is:
        not begun (answer it), recorded but not carried out to the end of its turn (carry
        out the recorded answer through the journal), or further (resume the cast)."""
        pause_id = str(answer["pause_id"])
        decision = Decision.parse(answer["decision"])
        recorded = self._recorded(claim, last)
        if not recorded:
            return entity.answer(pause_id, decision)
        found = entity.recorded_answer()
        if found is not None and found[0].pause_id == pause_id:
            return entity.carry_out_recorded_answer()
        return entity.resume_cast(claim.intent, recorded)

    async def _cast(self, owned: _Owned, running: Any) -> CastResult:
        entity = owned.entity
        assert entity is not None
        if owned.handing_back:  # the worker is stopping: no turn of it begins
            entity.suspend()
        try:
            if owned.cancelled:
                # cancelled before it started: the cast records that and ends at once
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_cancel_soon, entity, owned.cancel_reason)
                    result: CastResult = await running
                return result
            result = await running
            return result
        finally:
            with trio.CancelScope(shield=True):
                await entity.aclose()

    def _recorded(
        self, claim: Claim, last: Turn | None, rewind: Mapping[str, Any] | None = None
    ) -> list[Turn]:
        """The turns of this work's cast already in the loom (an earlier attempt's). A
        rollback's cast continues from its rewind point, not from the base turn (the end
        of the cast it cut off, on the branch it left)."""
        if last is None or last.id == claim.base_turn:
            return []
        turns = [t for t in self.loom.lineage(last.id) if t.entity_id == claim.entity_id]
        start = claim.base_turn if rewind is None else rewind.get("to")
        if start is not None:
            ids = [t.id for t in turns]
            if start in ids:
                turns = turns[ids.index(start) + 1 :]
        return turns


def _offering(entity: Entity, gates: tuple[Gate, ...]) -> Entity:
    """The entity, offered the gates its work's front end runs itself (if any)."""
    if gates:
        entity.offer(gates)
    return entity


async def _take_free(free: trio.Semaphore) -> int:
    """Wait for a free slot, then take every other slot free now too: how many a
    claim may ask for (each claimed item keeps its slot until its entity's task ends)."""
    await free.acquire()
    taken = 1
    while free.value:
        free.acquire_nowait()
        taken += 1
    return taken


async def _cancel_soon(entity: Entity, reason: str) -> None:
    while not entity.cancel(reason):
        await trio.sleep(0)
