"""Prune and stats on an SQLite loom (see :mod:`cantrip.loom._retention`).

The store's own connection does the work. Deleting lifts the append-only triggers
for the length of one ``BEGIN IMMEDIATE`` transaction (DDL is transactional in
SQLite: another connection never sees them gone). That transaction holds the write
lock, so what it decides is live -- a session prompted since the plan was made, a
turn written since the tree was archived -- cannot change before it commits: it
decides again there, as the PostgreSQL side does under its locks.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet

from cantrip.loom._activity import (
    Activity,
    Deleted,
    activity_from_rows,
    late_entities,
    recently_active,
)

_TRIGGERS = {
    "turns_append_only_delete": "CREATE TRIGGER IF NOT EXISTS turns_append_only_delete "
    "BEFORE DELETE ON turns BEGIN SELECT RAISE(ABORT, 'loom is append-only'); END",
    "entities_append_only_delete": "CREATE TRIGGER IF NOT EXISTS entities_append_only_delete "
    "BEFORE DELETE ON entities BEGIN SELECT RAISE(ABORT, 'loom is append-only'); END",
}


class SQLiteRetention:
    """Prune and stats on an SQLite loom (the store's own connection)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def activity(self) -> list[Activity]:
        rows = self._db.execute(
            "SELECT e.data, COALESCE(json_extract(t.data, '$.metadata.timestamp'), ''), "
            "COALESCE(c.n, 0), f.entity_id FROM entities e "
            "LEFT JOIN (SELECT entity_id, MAX(pos) AS last, COUNT(*) AS n FROM turns "
            "GROUP BY entity_id) c ON c.entity_id = e.entity_id "
            "LEFT JOIN turns t ON t.pos = c.last "
            "LEFT JOIN turns f ON f.id = json_extract(e.data, '$.forked_from') ORDER BY e.pos"
        ).fetchall()
        return activity_from_rows(rows)

    def busy(self, activity: Sequence[Activity], busy_s: float) -> dict[str, str]:
        """Entities written to within ``busy_s``: another process may be casting on them."""
        return recently_active(activity, busy_s)

    def delete_entities(
        self,
        entity_ids: Sequence[str],
        *,
        busy_s: float,
        held: Mapping[str, AbstractSet[str]] | None = None,
    ) -> Deleted:
        """One transaction: decide again, under the write lock, that nothing of the
        batch is live (``late_entities``); then delete it all, or nothing."""
        db = self._db
        marks = ",".join("?" * len(entity_ids))
        ids = tuple(entity_ids)
        db.execute("BEGIN IMMEDIATE")
        try:
            turns = db.execute(
                "SELECT entity_id, id, COALESCE(json_extract(data, '$.metadata.timestamp'), '') "
                f"FROM turns WHERE entity_id IN ({marks}) ORDER BY pos",
                ids,
            ).fetchall()
            late = late_entities(turns, ids, busy_s, held)
            if late:
                db.execute("ROLLBACK")
                return Deleted(late=late)
            for name in _TRIGGERS:
                db.execute(f"DROP TRIGGER IF EXISTS {name}")
            deleted = db.execute(f"DELETE FROM turns WHERE entity_id IN ({marks})", ids).rowcount
            db.execute(f"DELETE FROM entities WHERE entity_id IN ({marks})", ids)
            if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'journal'").fetchone():
                db.execute(f"DELETE FROM journal WHERE entity_id IN ({marks})", ids)
            db.execute(f"DELETE FROM blob_refs WHERE entity_id IN ({marks})", ids)
            db.execute("DELETE FROM blobs WHERE hash NOT IN (SELECT hash FROM blob_refs)")
            for create in _TRIGGERS.values():
                db.execute(create)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        return Deleted(turns=int(deleted))

    def collect_journal(self) -> int:
        """Journal rows of casts that have ended (their entity's latest turn terminated
        or truncated, up to that turn): an effect recorded in a turn needs no journal."""
        if not self._db.execute("SELECT 1 FROM sqlite_master WHERE name = 'journal'").fetchone():
            return 0
        return int(
            self._db.execute(
                "DELETE FROM journal WHERE EXISTS (SELECT 1 FROM turns t "
                "JOIN (SELECT entity_id, MAX(pos) AS p FROM turns GROUP BY entity_id) m "
                "ON t.pos = m.p WHERE t.entity_id = journal.entity_id "
                "AND journal.sequence <= t.sequence "
                "AND (json_extract(t.data, '$.terminated') OR json_extract(t.data, '$.truncated')))"
            ).rowcount
        )

    def reclaim(self) -> None:
        self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self._db.execute("VACUUM")
        self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def table_bytes(self) -> dict[str, int]:
        """Bytes of each of the loom's own tables, its indexes counted with it (SQLite's
        own parts -- the schema, automatic index names -- are not the loom's)."""
        try:
            rows = self._db.execute(
                "SELECT m.tbl_name, SUM(d.pgsize) FROM dbstat d "
                "JOIN sqlite_master m ON m.name = d.name "
                "WHERE m.tbl_name NOT LIKE 'sqlite\\_%' ESCAPE '\\' "
                "GROUP BY m.tbl_name ORDER BY m.tbl_name"
            ).fetchall()
        except sqlite3.OperationalError:  # built without dbstat: the file as a whole
            size = self._db.execute(
                "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()"
            ).fetchone()
            return {"(file)": int(size[0])}
        return {str(name): int(size) for name, size in rows}
