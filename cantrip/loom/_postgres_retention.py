"""Prune and stats on a PostgreSQL loom (see :mod:`cantrip.loom._retention`).

The append-only triggers refuse every DELETE unless the transaction has set
``cantrip.prune = 'on'`` (``SET LOCAL``: it ends with the transaction), so only this
module's statements can remove history, and only whole trees. A tree with open work
or an unexpired lease is never removed: checked when the plan is made and again in
the deleting transaction, under each entity's fence lock taken as a claim takes it
(:data:`_FENCE`: a loom write or a claim in flight keeps the entity).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from cantrip.loom._activity import (
    Activity,
    Deleted,
    activity_from_rows,
    late_entities,
    recently_active,
)
from cantrip.loom._postgres import PostgresStore
from cantrip.loom._postgres_schema import WORK_OPEN

_TABLES = (
    "cantrip_turns",
    "cantrip_entities",
    "cantrip_journal",
    "cantrip_work",
    "cantrip_leases",
    "cantrip_live_pauses",
    "cantrip_sessions",
    "cantrip_prompts",
    "cantrip_messages",
    "cantrip_blob_refs",
    "cantrip_blobs",
    "cantrip_a2a_tasks",
    "cantrip_prompt_watches",
)
"""The tables a tree lives in (those the session front ends make exist once used)."""
_OPEN_WORK = f"SELECT entity_id FROM cantrip_work WHERE {WORK_OPEN}"
RUNNING = "running (queued or running work, or a live lease)"
"""Why a tree with open work stays (a session's delete answers it ``busy``)."""
_HELD = (
    "SELECT entity_id FROM cantrip_leases WHERE owner IS NOT NULL "
    "AND expires_at > clock_timestamp()"
)

_FENCE = """
WITH batch AS MATERIALIZED (SELECT DISTINCT unnest(%s::text[]) AS entity_id)
SELECT entity_id FROM batch WHERE NOT cantrip_fence_take(entity_id)
"""
"""The deleting transaction takes each entity's fence lock (schema 6) as a claim does:
exclusively, never waiting, held to its commit; the answer is the entities whose lock
is busy. A loom write under an entity's lease holds that lock shared from its fence
check to its commit, and a claim holds it exclusively: either in flight keeps the batch
(the check of open work and live leases that follows cannot see a write that passed its
fence check before the lease ran out or was released; before, prune deleted the entity
under it and the write's turn landed after). A write or a claim that comes later waits
for, or passes over, the entity until the prune committed, then reads its lease gone and
is refused -- a claim of work queued after the check too, which the ``FOR UPDATE`` on
the lease rows this replaces did not hold off (an entity's first lease is a new row).
One lock per entity of the batch (:data:`~cantrip.loom._retention.BATCH` trees)."""
WRITING = "running (a write or a claim under its lease is in flight)"
"""Why a tree whose fence lock is held stays."""
BUSY = frozenset({RUNNING, WRITING})
"""The reasons a tree stays because it is running now (a session's delete: ``busy``)."""


class PostgresRetention:
    def __init__(self, store: PostgresStore) -> None:
        self._store = store

    def _existing(self, conn: Any) -> list[str]:
        rows = conn.execute(
            "SELECT relname FROM pg_class WHERE relkind = 'r' AND relname = ANY(%s)",
            (list(_TABLES),),
        ).fetchall()
        return [str(r[0]) for r in rows]

    def activity(self) -> list[Activity]:
        with self._store.pool.connection() as conn:
            rows = conn.execute(
                "SELECT e.data, COALESCE(t.data::json->'metadata'->>'timestamp', ''), "
                "COALESCE(c.n, 0), f.entity_id FROM cantrip_entities e "
                "LEFT JOIN (SELECT entity_id, MAX(sequence) AS last, COUNT(*) AS n "
                "FROM cantrip_turns GROUP BY entity_id) c ON c.entity_id = e.entity_id "
                "LEFT JOIN cantrip_turns t ON t.entity_id = c.entity_id AND t.sequence = c.last "
                "LEFT JOIN cantrip_turns f ON f.id = e.data::json->>'forked_from' "
                "ORDER BY e.pos"
            ).fetchall()
        return activity_from_rows(rows)

    def busy(self, activity: Sequence[Activity], busy_s: float) -> dict[str, str]:
        """Entities with queued or running work, or a live lease; and, as on SQLite,
        those written to within ``busy_s`` (an in-process ``serve`` on this database
        holds no lease)."""
        with self._store.pool.connection() as conn:
            rows = conn.execute(f"{_OPEN_WORK} UNION {_HELD}").fetchall()
        return {**recently_active(activity, busy_s), **{str(r[0]): RUNNING for r in rows}}

    def delete_entities(
        self,
        entity_ids: Sequence[str],
        *,
        busy_s: float,
        held: Mapping[str, AbstractSet[str]] | None = None,
    ) -> Deleted:
        ids = list(entity_ids)
        with self._store.pool.connection() as conn, conn.transaction():
            tables = set(self._existing(conn))
            conn.execute("SET LOCAL cantrip.prune = 'on'")
            fenced = conn.execute(_FENCE, (ids,)).fetchall()
            running = conn.execute(
                f"SELECT entity_id FROM ({_OPEN_WORK} UNION {_HELD}) b WHERE entity_id = ANY(%s)",
                (ids,),
            ).fetchall()
            turns = conn.execute(
                "SELECT entity_id, id, COALESCE(data::json->'metadata'->>'timestamp', '') "
                "FROM cantrip_turns WHERE entity_id = ANY(%s) ORDER BY pos",
                (ids,),
            ).fetchall()
            late = {
                **late_entities(turns, ids, busy_s, held),
                **{r[0]: RUNNING for r in running},
                **{r[0]: WRITING for r in fenced},
            }
            if late:
                return Deleted(late=late)
            deleted = conn.execute(
                "DELETE FROM cantrip_turns WHERE entity_id = ANY(%s)", (ids,)
            ).rowcount
            if "cantrip_prompt_watches" in tables:  # keyed by work: before the work goes
                conn.execute(
                    "DELETE FROM cantrip_prompt_watches WHERE work_id IN "
                    "(SELECT id FROM cantrip_work WHERE entity_id = ANY(%s))",
                    (ids,),
                )
            for table in (
                "cantrip_entities",
                "cantrip_journal",
                "cantrip_work",
                "cantrip_leases",
                "cantrip_live_pauses",
                "cantrip_prompts",
                "cantrip_messages",
                "cantrip_sessions",
                "cantrip_blob_refs",
                "cantrip_a2a_tasks",
            ):
                if table in tables:
                    conn.execute(f"DELETE FROM {table} WHERE entity_id = ANY(%s)", (ids,))
            if "cantrip_blobs" in tables:
                conn.execute(
                    "DELETE FROM cantrip_blobs b WHERE NOT EXISTS "
                    "(SELECT 1 FROM cantrip_blob_refs r WHERE r.hash = b.hash)"
                )
        return Deleted(turns=int(deleted))

    def collect_journal(self) -> int:
        """Journal rows of casts that have ended (see the SQLite side): one statement."""
        with self._store.pool.connection() as conn:
            return int(
                conn.execute(
                    "DELETE FROM cantrip_journal j USING (SELECT DISTINCT ON (entity_id) "
                    "entity_id, sequence, data FROM cantrip_turns "
                    "ORDER BY entity_id DESC, sequence DESC) t WHERE t.entity_id = j.entity_id "
                    "AND j.sequence <= t.sequence AND ((t.data::json->>'terminated')::boolean "
                    "OR (t.data::json->>'truncated')::boolean)"
                ).rowcount
            )

    def reclaim(self) -> None:
        with self._store.pool.connection() as conn:
            for table in self._existing(conn):
                conn.execute(f"VACUUM (ANALYZE) {table}")

    def table_bytes(self) -> dict[str, int]:
        with self._store.pool.connection() as conn:
            rows = conn.execute(
                "SELECT relname, pg_total_relation_size(oid) FROM pg_class "
                "WHERE relkind = 'r' AND relname = ANY(%s) ORDER BY relname",
                (list(_TABLES),),
            ).fetchall()
        return {str(name): int(size) for name, size in rows}
