"""The work queue on PostgreSQL: casts waiting for a worker, and who owns which entity.

The standard Postgres queue pattern and nothing of our own beyond it:

* **enqueue** inserts a row in ``cantrip_work`` and ``NOTIFY cantrip_work``;
* **claim** picks the oldest runnable rows -- up to as many as the worker has
  free slots, one per entity -- with ``SELECT ... FOR UPDATE SKIP LOCKED``
  (runnable: queued, or running under a lease that expired -- its worker
  died), takes each entity's lease in ``cantrip_leases`` -- which bumps the
  **fencing epoch** -- and marks the rows running, all in one statement (a statement
  per :data:`~cantrip.distributed._renewal.FENCE_CHUNK` items for a worker with more
  free slots: each takes that many fence locks, held to its commit).
  Work for one entity runs in enqueue order, one at a time;
* **heartbeat** extends the lease, but only while it is still this worker's at
  this epoch and unexpired (a worker paused past its lease cannot revive it); a
  worker renews its leases a few hundred per statement
  (:func:`~cantrip.distributed._renewal.heartbeat_on`);
* **attempts** count claims, except one a killed worker's bystander gets: a run that
  stopped without an outcome is *reaped* before the next claim -- its lease released
  (the runtime caught a fault and gave it up) or run out (its worker died). A worker
  that died holding several casts cannot say which one killed it: each is ``spare`` (its
  next claim is free) and counts a crash; from its second crash a cast is ``suspect``
  and runs in *quarantine* -- claimed only by an idle worker, alone, until it records a
  turn (the first time; to its end after that) -- so a worker that dies then held only
  the culprit, which alone is charged. An
  item whose next claim would pass ``max_attempts`` is not claimed again but
  *dead-lettered* -- state ``dead``, the reason in its result;
* **finish** records the outcome and releases the lease, fenced by the work row: only
  while it is still this claim's -- after its lease ran out too, until a claim reaped it;
* **hand back** releases the lease of a run stopped on purpose, unrecorded (its worker
  is shutting down), and leaves the row reaped and ``spare``: its next claim costs no
  attempt and counts no crash (fenced as finish is);
* **cancel** marks queued work cancelled and running work ``cancel_requested`` (with
  its ``cancel_reason``), and ``NOTIFY cantrip_cancel`` with the entity id (and the
  reason, when it is not plain ``cancelled``, and the work item, when one is named: a
  worker cuts off only the item it runs) so its worker stops it at once (workers
  also poll the flag with every heartbeat, the fallback);
* **steer** adds a message for an entity's open work to ``cantrip_messages`` and
  ``NOTIFY cantrip_steer`` with the entity id: the worker running it hands the message
  to the cast (``serve --db``'s ``/messages``).

Every method is blocking (psycopg); the worker calls them via ``trio.to_thread``.

This module holds the claim and reap statements and :class:`WorkQueue` (the renewal
and reclaim statements are in :mod:`~cantrip.distributed._renewal`);
the names every side shares and the statements a front end runs in its own
transaction (enqueue, cancel, steer) are in :mod:`~cantrip.distributed._work`, the
pauses and their answers in :mod:`~cantrip.distributed._pauses`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import Any

import orjson

from cantrip._redact import redact_value
from cantrip.distributed._pauses import Answered, answer_on, live_pending_on, pending_on
from cantrip.distributed._renewal import (
    FENCE_CHUNK,
    FINISH,
    HAND_BACK,
    HELD,
    RECLAIM,
    RECLAIM_ONE,
    RELEASE_LEASE,
    heartbeat_on,
)
from cantrip.distributed._work import (
    ANSWER_KEY,
    DEAD,
    ENDED,
    MAX_ATTEMPTS,
    OPEN,
    PAUSED,
    QUARANTINE_AFTER,
    WORK_CHANNEL,
    Claim,
    cancel_on,
    enqueue_many_on,
    enqueue_on,
    messages_on,
)
from cantrip.loom._fence import Fence
from cantrip.loom._postgres import PostgresStore
from cantrip.loom._postgres_schema import LAST_POS

_CLAIM = """
SELECT w.id, w.entity_id, w.intent, w.spell, w.state, w.attempts, w.spare, w.suspect,
    w.paroled
FROM cantrip_work w
WHERE w.live
  AND w.owner IS NULL
  AND w.suspect = %(suspect)s
  AND (w.spare OR w.attempts < %(max_attempts)s)
  AND NOT (w.entity_id = ANY(%(busy)s::text[]))
  AND NOT EXISTS (
      SELECT 1 FROM cantrip_leases l
      WHERE l.entity_id = w.entity_id AND l.owner IS NOT NULL
        AND l.expires_at > clock_timestamp())
  AND NOT EXISTS (
      SELECT 1 FROM cantrip_work e
      WHERE e.entity_id = w.entity_id AND e.id < w.id AND e.live)
ORDER BY w.id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""
"""The runnable rows of one kind (``suspect`` or not), oldest first: queued, or running
without a live lease *and reaped* (``owner`` cleared by :data:`_REAP`: the loss of its
last claim is accounted), within the attempt limit unless its next claim is free
(``spare``)."""

_CLAIM_AND_LEASE = f"""
WITH quarantine AS ({_CLAIM.replace("%(suspect)s", "true").replace("%(limit)s", "1")}),
normal AS ({_CLAIM.replace("%(suspect)s", "false")}),
candidates AS (
    SELECT * FROM quarantine WHERE %(idle)s
    UNION ALL
    SELECT * FROM normal WHERE NOT EXISTS (SELECT 1 FROM quarantine)
),
pick AS MATERIALIZED (SELECT * FROM candidates WHERE cantrip_fence_take(entity_id)),
lease AS (
    INSERT INTO cantrip_leases (entity_id, owner, epoch, expires_at)
    SELECT entity_id, %(owner)s, 1, clock_timestamp() + %(lease)s * interval '1 second'
    FROM pick
    ON CONFLICT (entity_id) DO UPDATE
        SET owner = excluded.owner, epoch = cantrip_leases.epoch + 1,
            expires_at = excluded.expires_at
        WHERE cantrip_leases.owner IS NULL OR cantrip_leases.expires_at <= clock_timestamp()
    RETURNING entity_id, epoch
),
claimed AS (
    UPDATE cantrip_work w
    SET state = 'running', owner = %(owner)s, epoch = lease.epoch,
        attempts = w.attempts + (NOT w.spare)::int, spare = false,
        alone = w.suspect OR %(one_slot)s, claimed_at = clock_timestamp(),
        base_pos = CASE WHEN w.state = 'queued' THEN {LAST_POS.format(entity="lease.entity_id")}
            ELSE w.base_pos END,
        result = CASE WHEN w.state = 'queued' THEN json_build_object('base_turn', (
            SELECT t.id FROM cantrip_turns t WHERE t.entity_id = lease.entity_id
            ORDER BY t.sequence DESC LIMIT 1))::text ELSE w.result END
    FROM pick JOIN lease ON lease.entity_id = pick.entity_id
    WHERE w.id = pick.id
    RETURNING w.id, w.entity_id, w.intent, w.spell, w.attempts, lease.epoch, w.result,
        extract(epoch FROM w.claimed_at - w.enqueued_at), pick.state = 'running', w.suspect,
        w.paroled
),
beside AS (
    UPDATE cantrip_work w SET alone = false
    WHERE w.id = ANY(%(alone)s::bigint[]) AND w.alone AND NOT %(one_slot)s
        AND EXISTS (SELECT 1 FROM claimed)
)
SELECT * FROM claimed
"""
"""The claim, one statement (one round trip): the oldest runnable rows, at most
``limit`` (``SKIP LOCKED``), each entity's lease taken -- bumping its fencing epoch --
and the rows marked running. The picked rows are of distinct entities: a row is
runnable only if no older row of its entity is open. A lease another worker took a
moment ago drops that row from the answer (fewer rows than picked). ``busy``: the
entities the claiming worker still runs (an old run stopping after its lease ran out):
never handed back to it until that run has ended. The base turn (the
entity's latest before its first claim) is read only on the first claim: no other
worker can be writing the entity then (its earlier work is finished, its lease
released, and a zombie's fence is stale); so is its loom position (``base_pos``): the
cast's turns are the entity's turns after it, whatever was queued before it.

An entity is taken only if no write under its old fence is in flight
(``cantrip_fence_take``: the write's advisory lock, taken exclusively without waiting;
held to this claim's commit, so a write that begins meanwhile reads the new lease and is
refused): otherwise it is left for the next claim.

Quarantine: a runnable *suspect* row is claimed only by an ``idle`` worker (it runs
nothing), alone -- the answer is that one row, marked ``alone`` -- and while one waits
a busy worker claims nothing (it drains, so that some worker becomes idle to take it).
A claim costs an attempt unless the row is ``spare``; a one-slot worker's claims are
all ``alone`` (it never holds another cast beside one). ``alone``: the claiming worker's
casts the queue holds as alone -- each is not any more once this claim takes a cast
beside it (in the same statement: a crash from then on is not blamed on it alone)."""

_REAP = """
WITH orphan AS (
    SELECT w.id, w.owner IS NOT NULL AS fresh,
        w.owner IS NOT NULL AND l.owner IS NOT NULL AND NOT w.alone AS spared,
        w.owner IS NOT NULL AND l.owner IS NOT NULL AND w.alone AS culprit
    FROM cantrip_work w JOIN cantrip_leases l ON l.entity_id = w.entity_id
    WHERE w.state = 'running'
      AND (l.owner IS NULL OR l.expires_at <= clock_timestamp())
      AND ((w.owner IS NOT NULL AND w.epoch = l.epoch)
           OR (NOT w.spare AND w.attempts >= %(max_attempts)s))
    FOR UPDATE OF w, l SKIP LOCKED
),
reaped AS (
    UPDATE cantrip_work w
    SET owner = NULL,
        crashes = w.crashes + (o.spared OR o.culprit)::int,
        spare = CASE WHEN o.fresh THEN o.spared ELSE w.spare END,
        suspect = w.suspect OR (o.spared AND w.crashes + 1 >= %(quarantine_after)s),
        state = CASE WHEN NOT o.spared AND w.attempts >= %(max_attempts)s
            THEN 'dead' ELSE w.state END,
        finished_at = CASE WHEN NOT o.spared AND w.attempts >= %(max_attempts)s
            THEN clock_timestamp() END,
        result = CASE WHEN o.spared OR w.attempts < %(max_attempts)s THEN w.result
            ELSE json_build_object(
                'error', 'work ' || w.id || ' (entity ' || w.entity_id
                    || ') dead-lettered after ' || w.attempts
                    || ' attempts: ' || CASE WHEN o.culprit OR (NOT o.fresh AND w.alone)
                    THEN 'the worker running it alone (in quarantine, holding no other '
                        || 'cast) died -- killed or crashed -- so this cast is what kills '
                        || 'its workers (' || (w.crashes + o.culprit::int) || ' worker '
                        || 'crashes while it ran)'
                    ELSE 'each worker that claimed it stopped without recording an '
                        || 'outcome (killed, crashed, or lost its lease)' END,
                'attempts', w.attempts, 'crashes', w.crashes + o.culprit::int,
                'quarantined', w.suspect,
                'entity_id', w.entity_id,
                'base_turn', (w.result::json)->>'base_turn')::text END
    FROM orphan o WHERE w.id = o.id
    RETURNING w.entity_id, w.state
)
SELECT count(pg_notify(%(channel)s, entity_id)) FROM reaped WHERE state = 'dead'
"""
"""Account for the running rows whose last claim ended without an outcome, once each
(then ``owner`` is cleared: only a reaped row is claimed again). How the claim ended
is read off its lease: released (``owner`` NULL: the run stopped on a fault the runtime
caught -- a lost connection, a bug -- and gave the lease up) or run out (the worker
died, was killed, or stalled past it). A worker that died holding other casts too says
nothing about which of them killed it: each is ``spare`` (its next claim costs no
attempt) and counts a crash; one in its ``quarantine_after``-th crash (or a later one)
becomes ``suspect`` and is run alone until it records a turn (:meth:`WorkQueue.cleared`;
to its end once it has been cleared before, ``paroled``). A row whose worker died while it was held
``alone`` is the culprit: its next claim costs an attempt, like a released one's. A row
whose next claim would cost an attempt past ``max_attempts`` is dead-lettered instead
(state ``dead``, the reason in its result, its waiters told by NOTIFY). Run before each
claim, in the same round trip budget as the dead-lettering it replaces."""


class WorkQueue:
    """Enqueue, claim, heartbeat, finish and cancel work in a loom's PostgreSQL database."""

    def __init__(self, store: PostgresStore) -> None:
        self.store = store

    def enqueue(self, spell: dict[str, Any], intent: str, entity_id: str) -> int:
        """Queue ``intent`` for ``entity_id`` (new or existing); the work id."""
        with self.store.pool.connection() as conn:  # one statement: its own transaction
            return enqueue_on(conn, spell, intent, entity_id)

    def enqueue_many(
        self, spell: dict[str, Any], work: Sequence[tuple[str, str]]
    ) -> dict[str, int]:
        """Queue ``(entity id, intent)`` pairs in one statement and one commit; the work
        id by entity."""
        with self.store.pool.connection() as conn:
            return enqueue_many_on(conn, spell, work)

    def work_of(self, entities: Sequence[str]) -> dict[str, int]:
        """The latest work of each of ``entities`` that has any, in whatever state (new
        entities' work may have run to its end by the time a retry looks)."""
        with self.store.pool.connection() as conn:
            rows = conn.execute(
                "SELECT entity_id, max(id) FROM cantrip_work WHERE entity_id = ANY(%s) "
                "GROUP BY entity_id",
                (list(entities),),
            ).fetchall()
        return {str(entity): int(work_id) for entity, work_id in rows}

    def reclaim(self, owner: str) -> int:
        """Expire every lease ``owner`` still holds, now: a worker restarted under the
        identity of one that died takes its casts back at once (issue 46.3) instead of
        waiting out the leases. The next claim (any worker's) reaps them and takes each
        at a new fencing epoch, so a process still running under that identity can write
        nothing more to them. The number of leases expired.

        Each lease is changed under its entity's fence lock held exclusively, as a claim
        changes one (a heartbeat renews without a row lock: ``_renewal.HEARTBEAT``): first
        all those whose lock is free, a statement per :data:`FENCE_CHUNK` of them (each
        its own transaction: a bounded number of locks at a time); then each of the
        others -- a write or a beat of the old process in flight -- in a transaction of
        its own that waits for that one lock only (holding no other, it deadlocks with
        no one)."""
        with self.store.pool.connection() as conn:
            held = [str(e) for (e,) in conn.execute(HELD, {"owner": owner}).fetchall()]
            expired, busy = 0, list[str]()
            for start in range(0, len(held), FENCE_CHUNK):
                chunk = held[start : start + FENCE_CHUNK]
                row = conn.execute(RECLAIM, {"owner": owner, "entities": chunk}).fetchone()
                assert row is not None
                expired += int(row[0])
                busy.extend(row[1] or ())
            for entity in busy:
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(cantrip_fence_key(%s))", (entity,))
                    expired += conn.execute(
                        RECLAIM_ONE, {"owner": owner, "entity": entity}
                    ).rowcount
        return expired

    def claim(self, owner: str, lease_s: float) -> Claim | None:
        """The oldest runnable work item, now this worker's; None if there is none."""
        claims = self.claim_many(owner, lease_s, 1)
        return claims[0] if claims else None

    def claim_many(
        self,
        owner: str,
        lease_s: float,
        limit: int,
        *,
        busy: list[str] | None = None,
        max_attempts: int = MAX_ATTEMPTS,
        idle: bool = True,
        one_slot: bool = False,
        alone: list[int] | None = None,
        quarantine_after: int = QUARANTINE_AFTER,
    ) -> list[Claim]:
        """Up to ``limit`` of the oldest runnable work items, each of another entity, now
        this worker's (oldest first; empty if none is runnable). One statement: a worker
        asks for as many as it has free slots, never more, so what it cannot run at once
        stays for the other workers. ``busy``: entities this worker still runs (never
        claimed again until that run ended). ``idle``: the worker runs nothing now -- only
        then may it take a suspect cast, and then only that one (its claim is
        ``quarantined``); ``one_slot``: it never runs two casts at once; ``alone``: the
        ids of its casts the queue holds as alone (not any more once this claim takes
        one beside them). The runs that
        ended without an outcome are accounted first (:data:`_REAP`: one more statement,
        which also dead-letters those past ``max_attempts``).

        A claim takes a fence lock per entity, held to its commit (an entry each in
        PostgreSQL's shared lock table): a ``limit`` over :data:`FENCE_CHUNK` is claimed
        a chunk per statement, each its own transaction, until one comes back short (the
        queue has no more runnable now) or the limit is reached."""
        if limit < 1:
            raise ValueError(f"claim at least one work item, not {limit}")
        rows: list[Any] = []
        with self.store.pool.connection() as conn:
            conn.execute(
                _REAP,
                {
                    "max_attempts": max_attempts,
                    "quarantine_after": quarantine_after,
                    "channel": WORK_CHANNEL,
                },
            )
            while len(rows) < limit:
                chunk = min(limit - len(rows), FENCE_CHUNK)
                got = conn.execute(
                    _CLAIM_AND_LEASE,
                    {
                        "owner": owner,
                        "lease": lease_s,
                        "limit": chunk,
                        "busy": list(busy or ()),
                        "max_attempts": max_attempts,
                        # once this claim took a cast, the worker is not idle any more
                        "idle": idle and not rows,
                        "one_slot": one_slot,
                        "alone": list(alone or ()),
                    },
                ).fetchall()
                rows.extend(got)
                if len(got) < chunk or any(row[9] for row in got):  # (quarantined: alone)
                    break
        claims = []
        for row in rows:
            work_id, entity_id, intent, spell, attempts, epoch, result, waited = row[:8]
            resumed, quarantined, paroled = row[8:]
            claims.append(
                Claim(
                    work_id=int(work_id),
                    entity_id=entity_id,
                    intent=intent,
                    spell=json.loads(spell),
                    fence=Fence(entity_id, owner, int(epoch)),
                    attempt=int(attempts),
                    base_turn=json.loads(result).get("base_turn") if result else None,
                    claim_latency_s=float(waited),
                    resumed=bool(resumed),
                    quarantined=bool(quarantined),
                    paroled=bool(paroled),
                )
            )
        return sorted(claims, key=lambda c: c.work_id)

    def cleared(self, claim: Claim) -> bool:
        """The quarantined ``claim`` ran a turn: it is innocent again -- no longer
        ``suspect``, so its worker may take other work beside it (it stays ``alone``
        until the worker does: a crash before then is still its own) -- and ``paroled``:
        if it is in a crash again, its next quarantine lasts to its end. False if the
        claim is not this worker's any more."""
        fence = claim.fence
        with self.store.pool.connection() as conn:
            changed = conn.execute(
                "UPDATE cantrip_work SET suspect = false, paroled = true "
                "WHERE id = %s AND owner = %s AND epoch = %s AND state = 'running'",
                (claim.work_id, fence.owner, fence.epoch),
            ).rowcount
        return bool(changed)

    def heartbeat(self, fence: Fence, lease_s: float) -> tuple[bool, bool]:
        """Extend the lease if it still holds: (held, cancel requested). One statement."""
        with self.store.pool.connection() as conn:
            while True:
                renewed = heartbeat_on(conn, fence.owner, [fence], lease_s)
                if renewed.get(fence.lease_entity, False) is not None:
                    break  # renewed or lost (not skipped for a write holding the row)
        cancel = renewed.get(fence.lease_entity)
        return fence.lease_entity in renewed, bool(cancel)

    def abandon(self, claim: Claim) -> bool:
        """Give the lease up without an outcome (the run stopped on a fault that is not the
        work's own: a lost database connection): another claim -- any worker's -- resumes
        it at once instead of after the lease. False if the lease was not held any more."""
        fence = claim.fence
        with self.store.pool.connection() as conn:
            released = conn.execute(
                RELEASE_LEASE,
                {"entity": fence.lease_entity, "owner": fence.owner, "epoch": fence.epoch},
            ).rowcount
        return bool(released)

    def hand_back(self, claim: Claim) -> bool:
        """Give the work back unrecorded, on purpose (the worker is shutting down: its run
        stopped at a turn boundary, or was cut off with nothing more recorded): the lease
        is released and the row is left already reaped (``owner`` cleared) and ``spare``,
        so its next claim -- any worker's, at once (``NOTIFY cantrip_work``) -- costs no
        attempt and counts no crash. One statement (``_renewal.HAND_BACK``); False if the
        work was not this claim's any more (another claim, or the reaping of a lease that
        ran out, came first: then the queue has accounted for it). Unlike a release it
        does not need the lease unexpired (see ``_renewal.settled``)."""
        fence = claim.fence
        with self.store.pool.connection() as conn:
            row = conn.execute(
                HAND_BACK,
                {
                    "entity": fence.lease_entity,
                    "owner": fence.owner,
                    "epoch": fence.epoch,
                    "work": claim.work_id,
                    "channel": WORK_CHANNEL,
                },
            ).fetchone()
        assert row is not None
        return bool(row[0])

    def dead_letters(self) -> list[dict[str, Any]]:
        """Work items dead-lettered after the attempt limit, oldest first."""
        with self.store.pool.connection() as conn:
            rows = conn.execute(
                "SELECT id, entity_id, intent, attempts, crashes, result, enqueued_at, "
                "finished_at "
                "FROM cantrip_work WHERE state = %s ORDER BY id",
                (DEAD,),
            ).fetchall()
        return [
            {
                "work_id": int(work_id),
                "entity_id": entity_id,
                "intent": intent,
                "attempts": int(attempts),
                "crashes": int(crashes),
                "error": (json.loads(result) if result else {}).get("error"),
                "enqueued_at": enqueued.isoformat(),
                "finished_at": finished.isoformat() if finished else None,
            }
            for work_id, entity_id, intent, attempts, crashes, result, enqueued, finished in rows
        ]

    def finish(self, claim: Claim, state: str, outcome: dict[str, Any]) -> bool:
        """Record how the work ended and release the lease; False if the work was not this
        claim's any more (another claim, or the reaping of its lease, came first).

        One statement (``_renewal.FINISH``, fenced by the work row like :meth:`hand_back`:
        a lease that ran out while no claim has reaped the row is still this claim's);
        ``NOTIFY cantrip_work`` at its commit."""
        return self.finish_many([(claim, state, outcome)])[0]

    def finish_many(self, ended: Sequence[tuple[Claim, str, dict[str, Any]]]) -> list[bool]:
        """:meth:`finish` for several casts (claim, state, outcome), in one transaction:
        a worker's casts that end together share one commit and one thread hop (issue
        46.4). Each True, or False if the work was not its claim's any more (its outcome
        is not recorded; the others' are)."""
        results = [  # redacted at rest: no secret goes into a table (issue 28.6)
            orjson.dumps(redact_value(outcome), default=str).decode() for _, _, outcome in ended
        ]
        done: list[bool] = []
        with (
            self.store.pool.connection() as conn,
            conn.transaction() if len(ended) > 1 else contextlib.nullcontext(),
        ):
            for (claim, state, _), result in zip(ended, results, strict=True):
                fence = claim.fence
                row = conn.execute(
                    FINISH,
                    {
                        "entity": fence.lease_entity,
                        "owner": fence.owner,
                        "epoch": fence.epoch,
                        "state": state,
                        "result": result,
                        "work": claim.work_id,
                        "channel": WORK_CHANNEL,
                    },
                ).fetchone()
                assert row is not None
                done.append(bool(row[0]))
        return done

    def cancel(self, entity_id: str) -> int:
        """Cancel ``entity_id``'s open work (queued: at once; running: by its worker).

        Returns how many work items were open."""
        with self.store.pool.connection() as conn, conn.transaction():
            return cancel_on(conn, entity_id)

    def status(self, work_id: int) -> tuple[str, dict[str, Any] | None]:
        """(state, outcome) of a work item; outcome once it has ended."""
        with self.store.pool.connection() as conn:
            row = conn.execute(
                "SELECT state, result FROM cantrip_work WHERE id = %s", (work_id,)
            ).fetchone()
        if row is None:
            raise LookupError(f"no work item {work_id}")
        state, result = row
        ended = state in ENDED
        return state, (json.loads(result) if ended and result else None)

    def answer(self, entity_id: str, pause_id: str, decision: dict[str, Any]) -> Answered:
        """Record a human's answer to a paused entity and queue its carrying-out."""
        with self.store.pool.connection() as conn, conn.transaction():
            return answer_on(conn, entity_id, pause_id, decision)

    def pending(self, entity_id: str) -> list[dict[str, Any]]:
        """The calls ``entity_id`` waits on a human for: its paused, unanswered work's,
        and those its running tree waits on in place."""
        with self.store.pool.connection() as conn:
            paused = pending_on(conn, entity_id)
            live = live_pending_on(conn, entity_id)
        return (paused.pending if paused is not None else []) + live

    def open_work(self, entity_id: str, intent: str) -> int | None:
        """The entity's latest open (queued or running) work with ``intent``, if any."""
        with self.store.pool.connection() as conn:
            row = conn.execute(
                "SELECT id FROM cantrip_work WHERE entity_id = %s AND intent = %s "
                f"AND {OPEN} ORDER BY id DESC LIMIT 1",
                (entity_id, intent),
            ).fetchone()
        return None if row is None else int(row[0])

    def answered_by(self, entity_id: str, pause_id: str, decision: dict[str, Any]) -> int | None:
        """The work carrying out ``decision`` on ``pause_id`` if that very answer is recorded
        (a retry of an answer whose reply was lost finds its own), else None."""
        with self.store.pool.connection() as conn:
            row = conn.execute(
                "SELECT w.result, q.spell FROM cantrip_work w LEFT JOIN cantrip_work q "
                "ON q.id = ((w.result::json)->'answered'->>'work_id')::bigint "
                "WHERE w.entity_id = %s AND w.state = %s ORDER BY w.id DESC LIMIT 1",
                (entity_id, PAUSED),
            ).fetchone()
        if row is None or row[0] is None or row[1] is None:
            return None
        answered = json.loads(row[0]).get("answered") or {}
        carried = json.loads(row[1]).get(ANSWER_KEY) or {}
        if answered.get("pause_id") != pause_id or carried.get("decision") != decision:
            return None
        return int(answered["work_id"])

    def messages(self, work_id: int, after: int = 0) -> list[tuple[int, str]]:
        """:func:`messages_on`: what was sent to ``work_id``'s cast after message ``after``."""
        with self.store.pool.connection() as conn:
            return messages_on(conn, work_id, after)

    def newest_messages(self, work_ids: Sequence[int]) -> dict[int, int]:
        """The id of the newest message sent to each of ``work_ids`` that has any, in one
        statement (the mailbox's poll for a missed NOTIFY, for all of a worker's casts)."""
        with self.store.pool.connection() as conn:
            rows = conn.execute(
                "SELECT work_id, max(id) FROM cantrip_messages WHERE work_id = ANY(%s) "
                "GROUP BY work_id",
                (list(work_ids),),
            ).fetchall()
        return {int(work_id): int(newest) for work_id, newest in rows}

    def cancel_requested(self, work_id: int) -> bool:
        with self.store.pool.connection() as conn:
            row = conn.execute(
                "SELECT cancel_requested FROM cantrip_work WHERE id = %s", (work_id,)
            ).fetchone()
        return bool(row and row[0])
