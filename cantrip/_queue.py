"""The work queue on PostgreSQL: casts waiting for a worker, and who owns which entity.

The standard Postgres queue pattern and nothing of our own beyond it:

* **enqueue** inserts a row in ``cantrip_work`` and ``NOTIFY cantrip_work``;
* **claim** picks the oldest runnable row with ``SELECT ... FOR UPDATE SKIP
  LOCKED`` (runnable: queued, or running under a lease that expired -- its
  worker died), takes the entity's lease in ``cantrip_leases`` -- which bumps
  the **fencing epoch** -- and marks the row running, all in one transaction.
  Work for one entity runs in enqueue order, one at a time;
* **heartbeat** extends the lease, but only while it is still this worker's at
  this epoch and unexpired (a worker paused past its lease cannot revive it);
* **finish** records the outcome and releases the lease, fenced the same way;
* **cancel** marks queued work cancelled and running work ``cancel_requested``,
  and ``NOTIFY cantrip_cancel`` with the entity id so its worker stops it at once
  (workers also poll the flag with every heartbeat, the fallback).

Every method is blocking (psycopg); the worker calls them via ``trio.to_thread``.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import orjson

from cantrip.loom._fence import Fence
from cantrip.loom._postgres import PostgresStore

WORK_CHANNEL = "cantrip_work"
CANCEL_CHANNEL = "cantrip_cancel"

_CLAIM = """
SELECT w.id, w.entity_id, w.intent, w.spell, w.state, w.attempts
FROM cantrip_work w
WHERE w.state IN ('queued', 'running')
  AND NOT EXISTS (
      SELECT 1 FROM cantrip_leases l
      WHERE l.entity_id = w.entity_id AND l.owner IS NOT NULL
        AND l.expires_at > clock_timestamp())
  AND NOT EXISTS (
      SELECT 1 FROM cantrip_work e
      WHERE e.entity_id = w.entity_id AND e.id < w.id AND e.state IN ('queued', 'running'))
ORDER BY w.id
LIMIT 1
FOR UPDATE SKIP LOCKED
"""

_CLAIM_AND_LEASE = f"""
WITH pick AS ({_CLAIM}),
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
        attempts = w.attempts + 1, claimed_at = clock_timestamp(),
        result = CASE WHEN w.attempts = 0 THEN json_build_object('base_turn', (
            SELECT t.id FROM cantrip_turns t WHERE t.entity_id = lease.entity_id
            ORDER BY t.pos DESC LIMIT 1))::text ELSE w.result END
    FROM pick, lease
    WHERE w.id = pick.id
    RETURNING w.id, w.entity_id, w.intent, w.spell, w.attempts, lease.epoch, w.result,
        extract(epoch FROM w.claimed_at - w.enqueued_at)
)
SELECT * FROM claimed
"""
"""The claim, one statement (one round trip): the oldest runnable row (``SKIP LOCKED``),
the entity's lease taken -- bumping the fencing epoch -- and the row marked running.
A lease another worker took a moment ago makes it answer no row. The base turn (the
entity's latest before its first claim) is read only on the first claim: no other
worker can be writing the entity then (its earlier work is finished, its lease
released, and a zombie's fence is stale)."""


@attrs.frozen
class Claim:
    """A work item this worker now owns, under ``fence``."""

    work_id: int
    entity_id: str
    intent: str
    spell: dict[str, Any]
    fence: Fence
    attempt: int
    """1 on the first claim; more when an earlier worker died holding it."""
    base_turn: str | None
    """The entity's latest turn before this cast began (None: none, or not yet known)."""
    claim_latency_s: float
    """From enqueue to this claim (the queue's own clock)."""


class WorkQueue:
    """Enqueue, claim, heartbeat, finish and cancel work in a loom's PostgreSQL database."""

    def __init__(self, store: PostgresStore) -> None:
        self.store = store

    def enqueue(self, spell: dict[str, Any], intent: str, entity_id: str) -> int:
        """Queue ``intent`` for ``entity_id`` (new or existing); the work id."""
        with self.store.pool.connection() as conn:  # one statement: its own transaction
            row = conn.execute(
                "WITH queued AS (INSERT INTO cantrip_work (entity_id, intent, spell) "
                "VALUES (%(entity)s, %(intent)s, %(spell)s) RETURNING id) "
                "SELECT id, pg_notify(%(channel)s, %(entity)s) FROM queued",
                {
                    "entity": entity_id,
                    "intent": intent,
                    "spell": json.dumps(spell),
                    "channel": WORK_CHANNEL,
                },
            ).fetchone()
            assert row is not None
        return int(row[0])

    def claim(self, owner: str, lease_s: float) -> Claim | None:
        """The oldest runnable work item, now this worker's; None if there is none."""
        with self.store.pool.connection() as conn:
            row = conn.execute(_CLAIM_AND_LEASE, {"owner": owner, "lease": lease_s}).fetchone()
        if row is None:  # nothing runnable, or its lease was taken a moment ago
            return None
        work_id, entity_id, intent, spell, attempts, epoch, result, waited = row
        base = json.loads(result).get("base_turn") if result else None
        return Claim(
            work_id=int(work_id),
            entity_id=entity_id,
            intent=intent,
            spell=json.loads(spell),
            fence=Fence(entity_id, owner, int(epoch)),
            attempt=int(attempts),
            base_turn=base,
            claim_latency_s=float(waited),
        )

    def heartbeat(self, fence: Fence, lease_s: float) -> tuple[bool, bool]:
        """Extend the lease if it still holds: (held, cancel requested). One statement."""
        with self.store.pool.connection() as conn:
            row = conn.execute(
                "WITH renewed AS (UPDATE cantrip_leases SET expires_at = clock_timestamp() + "
                "%(lease)s * interval '1 second' WHERE entity_id = %(entity)s "
                "AND owner = %(owner)s AND epoch = %(epoch)s "
                "AND expires_at > clock_timestamp() RETURNING 1) "
                "SELECT EXISTS (SELECT 1 FROM renewed), EXISTS (SELECT 1 FROM cantrip_work "
                "WHERE entity_id = %(entity)s AND state = 'running' AND owner = %(owner)s "
                "AND epoch = %(epoch)s AND cancel_requested)",
                {
                    "lease": lease_s,
                    "entity": fence.lease_entity,
                    "owner": fence.owner,
                    "epoch": fence.epoch,
                },
            ).fetchone()
        assert row is not None
        held, cancel = bool(row[0]), bool(row[1])
        return held, held and cancel

    def finish(self, claim: Claim, state: str, outcome: dict[str, Any]) -> bool:
        """Record how the work ended and release the lease; False if the lease was lost.

        One statement: the lease is released only if it is still this worker's at this
        epoch and unexpired (the release locks it), and only then is the outcome
        recorded and ``NOTIFY cantrip_work`` sent (at commit)."""
        fence = claim.fence
        with self.store.pool.connection() as conn:
            row = conn.execute(
                "WITH released AS (UPDATE cantrip_leases SET owner = NULL, "
                "expires_at = '-infinity' WHERE entity_id = %(entity)s AND owner = %(owner)s "
                "AND epoch = %(epoch)s AND expires_at > clock_timestamp() RETURNING 1), "
                "ended AS (UPDATE cantrip_work SET state = %(state)s, result = %(result)s, "
                "finished_at = clock_timestamp() WHERE id = %(work)s "
                "AND EXISTS (SELECT 1 FROM released) RETURNING 1) "
                "SELECT EXISTS (SELECT 1 FROM released), "
                "(SELECT count(pg_notify(%(channel)s, %(entity)s)) FROM ended)",
                {
                    "entity": fence.lease_entity,
                    "owner": fence.owner,
                    "epoch": fence.epoch,
                    "state": state,
                    "result": orjson.dumps(outcome, default=str).decode(),
                    "work": claim.work_id,
                    "channel": WORK_CHANNEL,
                },
            ).fetchone()
        assert row is not None
        return bool(row[0])

    def cancel(self, entity_id: str) -> int:
        """Cancel ``entity_id``'s open work (queued: at once; running: by its worker).

        Returns how many work items were open."""
        with self.store.pool.connection() as conn, conn.transaction():
            queued = conn.execute(
                "UPDATE cantrip_work SET state = 'cancelled', finished_at = clock_timestamp(), "
                'result = \'{"reason": "cancelled"}\' '
                "WHERE entity_id = %s AND state = 'queued' AND attempts = 0",
                (entity_id,),
            ).rowcount
            running = conn.execute(
                "UPDATE cantrip_work SET cancel_requested = true "
                "WHERE entity_id = %s AND state IN ('queued', 'running')",
                (entity_id,),
            ).rowcount
            conn.execute("SELECT pg_notify(%s, %s)", (CANCEL_CHANNEL, entity_id))
        return int(queued) + int(running)

    def status(self, work_id: int) -> tuple[str, dict[str, Any] | None]:
        """(state, outcome) of a work item; outcome once it has ended."""
        with self.store.pool.connection() as conn:
            row = conn.execute(
                "SELECT state, result FROM cantrip_work WHERE id = %s", (work_id,)
            ).fetchone()
        if row is None:
            raise LookupError(f"no work item {work_id}")
        state, result = row
        ended = state in ("done", "failed", "cancelled")
        return state, (json.loads(result) if ended and result else None)

    def cancel_requested(self, work_id: int) -> bool:
        with self.store.pool.connection() as conn:
            row = conn.execute(
                "SELECT cancel_requested FROM cantrip_work WHERE id = %s", (work_id,)
            ).fetchone()
        return bool(row and row[0])
