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

This module is the worker's claim loop, its LISTEN, and how it stops; the rest is in
rooms of its own below it: :mod:`~cantrip.distributed._leases` (heartbeats, a lost
lease), :mod:`~cantrip.distributed._execution` (one cast begun, resumed or carried on;
quarantine), :mod:`~cantrip.distributed._mailbox` (steering and live pauses),
:mod:`~cantrip.distributed._spells` and :mod:`~cantrip.distributed._outcome`, all
sharing :class:`~cantrip.distributed._owned.Owned`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
from typing import Any

import attrs
import trio

from cantrip._errors import CantripError
from cantrip._redact import get_logger
from cantrip.distributed._execution import Execution, watch_quarantine
from cantrip.distributed._leases import heartbeats, lose
from cantrip.distributed._mailbox import deliver, live_pauses, mail_poll
from cantrip.distributed._outage import Outage, database_away, describe, is_connection_error
from cantrip.distributed._outcome import (
    lease_lost,
    suspended,
)
from cantrip.distributed._owned import Owned
from cantrip.distributed._pauses import LivePauses
from cantrip.distributed._queue import WorkQueue
from cantrip.distributed._work import (
    CANCEL_CHANNEL,
    MAX_ATTEMPTS,
    QUARANTINE_AFTER,
    STEER_CHANNEL,
    WORK_CHANNEL,
    Claim,
    parse_cancel,
)
from cantrip.loom._group_commit import GroupCommit
from cantrip.loom._loom import Loom
from cantrip.loom._postgres import PostgresStore

log = get_logger("cantrip.worker")


DRAIN_S = 30.0
"""How long a stopping worker's running casts get to reach their next turn boundary
before the rest are cut off and handed back (``cantrip worker --drain-s``)."""
DB_CONNECTIONS = 16
"""The most connections (and database threads) a worker's loom pool opens, whatever its
concurrency: half the concurrency up to this. Its casts' database calls are short (the
loom's writes go a batch at a time, on one connection), so more connections only queue
in the server instead of in trio; at ``--concurrency 1000`` the old half (500) had the
worker open ~50-100 connections and ~400 threads a run, each costing both processes CPU
(and could exhaust a server's ``max_connections``; issue 46.4)."""
LOOKS_PER_HOP = 32
"""Casts claimed together whose first reads share one thread hop (``Worker._look``): a
claim of 1,000 looks in 32 hops, side by side, not 1,000 (nor one hop, one after another)."""
HANDED_BACK = "handed back at shutdown"
"""Why the loom refuses a cut-off run's writes: its lease is being handed back."""


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
        self.named = worker_id is not None
        """Started under an identity of its own choosing (``--worker-id``): the casts a
        worker of that identity held are taken back at start (:meth:`WorkQueue.reclaim`)."""
        self.reclaimed = 0
        self._owned: dict[str, Owned] = {}
        """Entities whose run has not ended here (each is never claimed again until it has)."""
        self._wake = trio.Event()
        self._quarantine: trio.Event | None = None
        """Set while a suspect cast runs here alone: nothing else is claimed until it
        records a turn or ends (then the event is set)."""
        self.completed = 0
        self.handed_back = 0
        """Casts whose leases this worker handed back unrecorded as it stopped."""
        self.draining = False
        self._claiming = trio.CancelScope()
        """The claim loop's scope: :meth:`drain` cancels it (the runs go on)."""
        self._endings: GroupCommit[_Ending] = GroupCommit(self._record_endings)
        """Casts' outcomes, recorded a batch at a time: casts that end together share
        one thread hop and one commit (:meth:`_finish`; issue 46.4)."""

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        store = await trio.to_thread.run_sync(
            lambda: PostgresStore(self.url, max_connections=pool_size(self.concurrency))
        )
        self.loom = Loom(store)
        self.queue = WorkQueue(store)
        self._live = await trio.to_thread.run_sync(LivePauses, store)
        self._execution = Execution(self.loom, self.queue, self.queue.messages)
        if self.named:
            self.reclaimed = await trio.to_thread.run_sync(self.queue.reclaim, self.worker_id)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self._listen)
                nursery.start_soon(
                    functools.partial(
                        heartbeats,
                        self._owned,
                        url=self.url,
                        worker_id=self.worker_id,
                        lease_s=self.lease_s,
                        loom=self.loom,
                    )
                )
                nursery.start_soon(mail_poll, self._owned, self.queue, store.limiter, self.poll_s)
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
        taken: list[Owned] = []
        for claimed in claims:
            until = sent + self.lease_s  # never after the database's expiry
            owned = Owned(claimed, trio.CancelScope(deadline=until))
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
            taken.append(owned)
        for start in range(0, len(taken), LOOKS_PER_HOP):  # (once each is in _owned: a
            chunk = taken[start : start + LOOKS_PER_HOP]  # message NOTIFY'd since wakes it)
            looking = trio.Event()
            for owned in chunk:
                owned.looking = looking
            runs.start_soon(self._look, chunk, looking)
        for owned in taken:
            runs.start_soon(self._own, owned, free)
        return len(claims)

    async def _look(self, chunk: list[Owned], looking: trio.Event) -> None:
        """Look up what the casts of ``chunk`` need before they begin, in one thread hop
        (:meth:`Execution.look_many`); each cast waits for it, or looks itself if it
        got nothing."""
        limiter = self.loom.store.limiter  # type: ignore[attr-defined]
        try:
            looks = await trio.to_thread.run_sync(
                self._execution.look_many, [o.claim for o in chunk], limiter=limiter
            )
            for owned, looked in zip(chunk, looks, strict=True):
                owned.looked = looked
        finally:
            looking.set()

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
                # what arrived is read at once, without waiting (first: what came with
                # the LISTEN's answer), then the socket is waited on here, in trio: no
                # thread hop per notification, nor one every 0.25 s when idle (issue
                # 46.4); a lost connection is readable too, and its read raises
                notes = [(n.channel, n.payload) for n in conn.notifies(timeout=0)]
                for channel, payload in notes:
                    if channel == WORK_CHANNEL:
                        self._wake.set()
                        if payload in self._owned:
                            self._owned[payload].poke.set()
                    elif channel == CANCEL_CHANNEL:
                        entity_id, reason, work_id = parse_cancel(payload)
                        running = self._owned.get(entity_id)
                        if running is not None and work_id in (None, running.claim.work_id):
                            running.cancel(reason)  # named another item: not this cast
                    elif channel == STEER_CHANNEL and payload in self._owned:
                        self._owned[payload].mail.set()
                await trio.lowlevel.wait_readable(conn.fileno())
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(conn.close)

    # -- leases ----------------------------------------------------------------------

    # -- one entity --------------------------------------------------------------

    async def _own(self, owned: Owned, free: trio.Semaphore) -> None:
        """Run one claimed item, then record its outcome; whatever stops it -- a lease
        that ran out, a lost connection, an error of its own -- stops it alone."""
        claim = owned.claim
        limiter = self.loom.store.limiter  # type: ignore[attr-defined]
        try:
            ended: tuple[str, dict[str, Any]] | None = None
            try:
                async with trio.open_nursery() as nursery:
                    if self._execution.asks_humans(owned):
                        nursery.start_soon(live_pauses, owned, self._live, limiter, self.poll_s)
                    nursery.start_soon(deliver, owned, self.queue, limiter)
                    if owned.quarantine is not None and not claim.paroled:
                        nursery.start_soon(self._watch_quarantine, owned)
                    try:
                        with owned.run:
                            ended = await self._execution.execute(owned)
                    finally:
                        nursery.cancel_scope.cancel()
                if ended is not None:
                    await self._finish(owned, *ended)
                elif owned.cut:  # the run's scope stopped it: cut off to be handed back
                    await self._hand_back(owned)
                else:  # the run's scope stopped it: the lease ran out here
                    lose(owned, self.loom, "the lease ran out here before it was renewed")
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

    async def _watch_quarantine(self, owned: Owned) -> None:
        """A suspect cast runs here alone until it records a turn (see
        :func:`~cantrip.distributed._execution.watch_quarantine`): then it is innocent
        again and the worker claims other work beside it."""
        limiter = self.loom.store.limiter  # type: ignore[attr-defined]
        if await watch_quarantine(owned, self.queue, limiter, self.poll_s):
            self._innocent(owned)

    def _innocent(self, owned: Owned) -> None:
        """The quarantine of ``owned`` (if it was in one) is over: claim again."""
        if owned.quarantine is None or owned.quarantine.is_set():
            return
        owned.quarantine.set()
        if self._quarantine is owned.quarantine:
            self._quarantine = None
        self._wake.set()

    async def _stopped(self, owned: Owned, exc: Exception) -> None:
        """A run stopped without an outcome: its lease was lost (another claim continues
        it), its database connection was lost, or an error in cantrip stopped it outside
        the cast (logged with its traceback). The last two give the lease up, so the next
        claim -- counted against the attempt limit -- resumes it at once."""
        claim = owned.claim
        if lease_lost(exc):
            lose(owned, self.loom, describe(exc))
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

    async def _hand_back(self, owned: Owned) -> None:
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

    async def _finish(self, owned: Owned, state: str, outcome: dict[str, Any]) -> None:
        """Record the outcome and release the lease (fenced: refused if it was lost). A
        lost connection here leaves the cast to the next claim, which finds its end in
        the loom and records it then.

        Recorded with the other casts that end meanwhile (a group commit: one thread hop
        and one transaction for the batch); a batch that failed leaves each of its casts
        to record its own end alone, as if there had been no batch -- so what a failure
        means for a cast is what it always meant."""
        claim = owned.claim
        owned.releasing = True
        ending = _Ending(claim, state, outcome)
        ticket = self._endings.queue(ending)
        try:
            await self._endings.wait(ticket)
        except BaseException:
            self._endings.withdraw(ticket)  # (cancelled while queued: never recorded here)
            raise
        finished = ending.finished
        if finished is None:  # its batch failed: alone, where its own error is raised
            limiter = self.loom.store.limiter  # type: ignore[attr-defined]
            finished = await trio.to_thread.run_sync(
                self.queue.finish, claim, state, outcome, limiter=limiter
            )
        if finished:
            self.completed += 1
        else:
            log.warning("%s: lease lost before the outcome was recorded", claim.entity_id)

    async def _record_endings(self, batch: list[_Ending]) -> None:
        """Write a batch of :meth:`_finish` (the group commit's writer). Shielded: the
        batch holds other casts' outcomes, which their tasks wait for. A batch that
        failed is not this writer's failure alone: each of its casts, seeing no answer,
        records its own end (:meth:`_finish`)."""
        limiter = self.loom.store.limiter  # type: ignore[attr-defined]
        ended = [(e.claim, e.state, e.outcome) for e in batch]
        with trio.CancelScope(shield=True):
            try:
                finished = await trio.to_thread.run_sync(
                    self.queue.finish_many, ended, limiter=limiter
                )
            except Exception as exc:  # noqa: BLE001 -- each cast tries alone (_finish)
                log.info("%d outcomes recorded one by one: %s", len(batch), describe(exc))
                return
        for ending, done in zip(batch, finished, strict=True):
            ending.finished = done


@attrs.define(slots=True)
class _Ending:
    """A cast's end waiting for the batch that records it (:meth:`Worker._finish`)."""

    claim: Claim
    state: str
    outcome: dict[str, Any]
    finished: bool | None = None
    """True once recorded, False if its lease was lost; None: its batch failed."""


def pool_size(concurrency: int) -> int:
    """The loom pool's size (and its thread limiter's) for a worker of ``concurrency``."""
    return min(DB_CONNECTIONS, max(4, concurrency // 2))


async def _take_free(free: trio.Semaphore) -> int:
    """Wait for a free slot, then take every other slot free now too: how many a
    claim may ask for (each claimed item keeps its slot until its entity's task ends)."""
    await free.acquire()
    taken = 1
    while free.value:
        free.acquire_nowait()
        taken += 1
    return taken
