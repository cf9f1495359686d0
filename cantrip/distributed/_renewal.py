"""Renewing, reclaiming and settling leases: the statements, under the entities' fences.

A worker's leases are renewed by its heartbeat (:mod:`~cantrip.distributed._leases`)
a few hundred per statement, and taken back at once by a worker restarted under the
same identity (:meth:`~cantrip.distributed._queue.WorkQueue.reclaim`). Neither takes a row lock to
keep out of a claim's way (a row lock is a WAL record per lease, issue 46.2): both go
by schema 6's fence lock (``cantrip_fence_key``), as claims and loom writes do -- a
renewal holds it shared and never waits for it; a reclaim, like a claim, changes a
lease only holding it exclusively.

Each of those locks is an entry in PostgreSQL's shared lock table, which holds
``max_locks_per_transaction`` x (``max_connections`` + ``max_prepared_transactions``)
of them for the whole server, and a transaction keeps its advisory locks to its end. So
no statement here takes more than :data:`FENCE_CHUNK` of them: a worker's leases are
renewed, and reclaimed, a chunk per statement (each its own transaction on an
autocommit connection), as claims are (``WorkQueue.claim_many``). Before, one beat took
a lock per lease in one transaction, and a worker holding more leases than the table
has room for (about 6,400 with PostgreSQL's defaults, fewer while other transactions
hold locks) failed its beat with "out of shared memory", which stopped the worker.

A claim's end -- its outcome recorded (``finish``) or its work handed back -- settles
the work row and releases the lease in one statement (:func:`settled`), fenced by the
row itself, so that a lease that ran out while nobody has reaped it yet is still settled.
"""

from __future__ import annotations

from typing import Any

from cantrip.loom._fence import Fence

FENCE_CHUNK = 256
"""The most fence locks one statement (one transaction) of a worker takes: a heartbeat
renews, a reclaim expires and a claim takes at most this many entities at once. With
PostgreSQL's defaults (64 x 100 connections) the lock table holds 25 such statements in
flight; a chunk still renews hundreds of leases per round trip."""

HEARTBEAT = """
WITH mine AS (
    SELECT * FROM unnest(%(entities)s::text[], %(epochs)s::bigint[]) AS m(entity_id, epoch)
),
fenced AS MATERIALIZED (
    SELECT mine.entity_id, mine.epoch FROM mine
    WHERE pg_try_advisory_xact_lock_shared(cantrip_fence_key(mine.entity_id))
),
renewed AS (
    UPDATE cantrip_leases l
    SET expires_at = clock_timestamp() + %(lease)s * interval '1 second'
    FROM fenced f
    WHERE l.entity_id = f.entity_id AND l.owner = %(owner)s AND l.epoch = f.epoch
        AND l.expires_at > clock_timestamp()
    RETURNING l.entity_id, l.epoch
)
SELECT m.entity_id, f.entity_id IS NULL, (
    SELECT coalesce(w.cancel_reason, 'cancelled') FROM cantrip_work w
    WHERE w.entity_id = r.entity_id AND w.state = 'running' AND w.owner = %(owner)s
        AND w.epoch = r.epoch AND w.cancel_requested LIMIT 1)
FROM mine m
LEFT JOIN fenced f ON f.entity_id = m.entity_id
LEFT JOIN renewed r ON r.entity_id = m.entity_id
WHERE r.entity_id IS NOT NULL OR f.entity_id IS NULL
"""
"""Renew many leases in one statement without waiting on a lock and without a row lock
(schema 6's fence, issue 46.2: a ``FOR UPDATE`` lock was a WAL record per lease per
beat): a lease is renewed under its entity's fence lock taken shared, never waiting --
so a claim taking the entity at this moment (it holds that lock exclusively) makes the
beat skip it (renewed at the next beat), and a claim that comes after passes the entity
over until the beat committed -- and no lease row another transaction changes is
touched: claims and ``WorkQueue.reclaim`` change a lease only under that lock
exclusively, and this worker's own releases (one short statement each) are the only
other writers of its leases. Loom writes share the lock (``cantrip_fence_holds``)."""


HELD = (
    "SELECT entity_id FROM cantrip_leases "
    "WHERE owner = %(owner)s AND expires_at > clock_timestamp() ORDER BY entity_id"
)
"""The entities whose lease ``owner`` holds now (no lock: ``RECLAIM`` checks each again
under its fence lock)."""

RECLAIM = """
WITH taken AS MATERIALIZED (
    SELECT entity_id FROM unnest(%(entities)s::text[]) AS h(entity_id)
    WHERE cantrip_fence_take(entity_id)
),
expired AS (
    UPDATE cantrip_leases l SET expires_at = clock_timestamp()
    FROM taken t
    WHERE l.entity_id = t.entity_id AND l.owner = %(owner)s
        AND l.expires_at > clock_timestamp()
    RETURNING 1
)
SELECT (SELECT count(*) FROM expired),
    (SELECT array_agg(entity_id) FROM unnest(%(entities)s::text[]) AS h(entity_id)
     WHERE entity_id NOT IN (SELECT entity_id FROM taken))
"""
"""``WorkQueue.reclaim``'s first pass over a chunk of ``owner``'s leases (``entities``,
at most :data:`FENCE_CHUNK`): those whose fence lock is free, expired now under it; the
answer: how many, and the entities whose lock was busy."""

RECLAIM_ONE = (
    "UPDATE cantrip_leases SET expires_at = clock_timestamp() "
    "WHERE entity_id = %(entity)s AND owner = %(owner)s AND expires_at > clock_timestamp()"
)


def heartbeat_on(
    conn: Any, owner: str, fences: list[Fence], lease_s: float
) -> dict[str, str | None]:
    """Extend every lease of ``fences`` (one worker's) that still holds, a statement per
    :data:`FENCE_CHUNK` of them (``conn`` in autocommit mode: each its own transaction,
    so the fence locks one takes are let go before the next): {lease entity: the reason
    of a cancel requested, or "" for none} for those renewed, None for those skipped
    because a claim held their fence lock this moment (neither renewed nor known lost);
    one missing from the answer is lost (expired, or claimed by another worker)."""
    answer: dict[str, str | None] = {}
    for start in range(0, len(fences), FENCE_CHUNK):
        chunk = fences[start : start + FENCE_CHUNK]
        rows = conn.execute(
            HEARTBEAT,
            {
                "entities": [f.lease_entity for f in chunk],
                "epochs": [f.epoch for f in chunk],
                "owner": owner,
                "lease": lease_s,
            },
        ).fetchall()
        answer.update(
            {str(entity): None if skipped else (cancel or "") for entity, skipped, cancel in rows}
        )
    return answer


RELEASE_LEASE = (
    "UPDATE cantrip_leases SET owner = NULL, expires_at = '-infinity' "
    "WHERE entity_id = %(entity)s AND owner = %(owner)s AND epoch = %(epoch)s "
    "AND expires_at > clock_timestamp()"
)
"""A fenced lease, released: only if it is still this claim's (owner and epoch) and
unexpired -- ``WorkQueue.abandon``'s release, which leaves the row to the reaping
(:func:`settled` releases the lease with the row)."""


def settled(change: str) -> str:
    """The statement that settles a claim's work row -- ``change`` it (the ``SET`` list)
    -- and releases its lease, expired or not, if the row is still this claim's (owner
    and epoch, running, its entity's lease at that epoch), else nothing; NOTIFY
    ``cantrip_work`` when it did. Answers (settled, notified).

    The row is the fence: no other claim of the entity can have come since -- a claim
    takes only a reaped row, and this one's open row keeps the entity's later ones from
    being claimed -- and a reaping that came first (the lease ran out: a crash
    accounted) cleared ``owner``, so the update finds nothing (it waits for that
    reaping's row lock and checks the row again after it). So a lease that ran out
    while the worker was finishing or handing back (its heartbeat stops renewing a cast
    it settles; the call may wait behind others) is still settled, where requiring it
    unexpired made the next claim reap the row as a crash -- and a cast held alone (a
    one-slot worker's, a quarantined one) as the culprit: an attempt charged, a cast
    dead-lettered at the attempt limit although it had ended or been handed back on
    purpose. The lease is released only with the row: a released lease beside a row
    still owned reads, to the reaping, as a run given up on a fault (an attempt)."""
    return f"""
WITH settled AS (
    UPDATE cantrip_work SET {change}
    WHERE id = %(work)s AND owner = %(owner)s AND epoch = %(epoch)s AND state = 'running'
        AND EXISTS (SELECT 1 FROM cantrip_leases WHERE entity_id = %(entity)s
            AND owner = %(owner)s AND epoch = %(epoch)s)
    RETURNING 1
),
released AS (
    UPDATE cantrip_leases SET owner = NULL, expires_at = '-infinity'
    WHERE entity_id = %(entity)s AND owner = %(owner)s AND epoch = %(epoch)s
        AND EXISTS (SELECT 1 FROM settled)
)
SELECT EXISTS (SELECT 1 FROM settled),
    (SELECT count(pg_notify(%(channel)s, %(entity)s)) FROM settled)
"""


HAND_BACK = settled("owner = NULL, spare = true")
""":meth:`~cantrip.distributed._queue.WorkQueue.hand_back`: the row left reaped and ``spare``."""
FINISH = settled("state = %(state)s, result = %(result)s, finished_at = clock_timestamp()")
""":meth:`~cantrip.distributed._queue.WorkQueue.finish`: the outcome recorded."""
