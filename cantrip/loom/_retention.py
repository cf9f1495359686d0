"""Retention: keeping a loom bounded by removing whole entities, and measuring it.

A loom only grows; ``cantrip loom FILE prune`` removes what is no longer wanted and
``stats`` says what there is. What prune may remove is decided here, once, for every
store:

* **Whole trees, never parts of a thread.** A root entity is removed with every
  entity it spawned (children, grandchildren), their turns, their gate-journal rows
  and, on PostgreSQL, their finished work items, leases, pauses and sessions. What
  stays is a valid loom: every remaining thread is whole.
* **Nothing another entity stands on.** A fork's thread runs through the turns of the
  entity it was forked from; a tree that a surviving entity was forked from stays
  (reported as kept, with why).
* **Nothing running.** On PostgreSQL a tree with open work (queued or running) or an
  unexpired lease stays. On SQLite a tree whose last turn is younger than
  ``busy_s`` stays (another process may be casting on it; its turns are not old
  enough to be worth the race).
* **Archive first.** With an archive, every tree is written there (a JSONL loom,
  readable by ``cantrip loom``) before anything is deleted.

Selection: ``--before DATE`` (trees whose last activity is older), ``--keep-last N``
(all but the N most recently active trees), ``--entity ID`` (one root's tree).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import attrs
import trio

from cantrip._errors import CantripError
from cantrip.loom._activity import Activity, earlier, parse_time, recently_active
from cantrip.loom._loom import Loom
from cantrip.loom._model import EntityRecord

BATCH = 200
"""Trees deleted per transaction: short transactions, so casts on other entities wait
for at most one batch."""


@attrs.frozen
class Plan:
    """The trees a prune removes, and those it keeps although selected (with why)."""

    roots: tuple[str, ...]
    entities: tuple[str, ...]
    turns: int
    kept: tuple[tuple[str, str], ...] = ()


@attrs.frozen
class Pruned:
    plan: Plan
    bytes_before: int
    bytes_after: int
    seconds: float
    archive: str | None = None
    journal_rows: int = 0
    """Gate-journal rows of ended casts collected on the way."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "roots": len(self.plan.roots),
            "entities": len(self.plan.entities),
            "turns": self.plan.turns,
            "kept": [{"entity": e, "why": why} for e, why in self.plan.kept],
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "seconds": round(self.seconds, 3),
            "archive": self.archive,
            "journal_rows_collected": self.journal_rows,
        }


class RetentionStore(Protocol):
    """What a store offers prune and stats (SQLite and PostgreSQL)."""

    def activity(self) -> list[Activity]: ...
    def busy(self, activity: Sequence[Activity], busy_s: float) -> set[str]: ...
    def delete_entities(self, entity_ids: Sequence[str]) -> int: ...
    def collect_journal(self) -> int: ...
    def reclaim(self) -> None: ...
    def table_bytes(self) -> dict[str, int]: ...


def retention_of(loom: Loom) -> RetentionStore:
    """The store's retention side (a clear error for a loom that has none)."""
    store = loom.store
    from cantrip.loom._stores import SQLiteStore

    if isinstance(store, SQLiteStore):
        return SQLiteRetention(store._db)
    from cantrip.loom._postgres import PostgresStore

    if isinstance(store, PostgresStore):
        from cantrip.loom._postgres_retention import PostgresRetention

        return PostgresRetention(store)
    raise CantripError(
        "prune and stats work on SQLite and PostgreSQL looms; copy a JSONL loom into one "
        "first (cantrip loom FILE export --format jsonl keeps it whole)"
    )


def plan(
    activity: Iterable[Activity],
    *,
    before: datetime | None = None,
    keep_last: int | None = None,
    entity: str | None = None,
    busy: set[str] | frozenset[str] = frozenset(),
) -> Plan:
    """Which trees to remove: selected by exactly one rule, closed over children, and
    never a tree another entity stands on or that is running."""
    rules = sum(x is not None for x in (before, keep_last, entity))
    if rules != 1:
        raise CantripError("prune takes exactly one of --before DATE, --keep-last N, --entity ID")
    by_id = {a.record.entity_id: a for a in activity}
    children: dict[str, list[str]] = {}
    for a in by_id.values():
        parent = a.record.parent_entity_id
        if parent is not None:
            children.setdefault(parent, []).append(a.record.entity_id)

    def tree(root: str) -> list[str]:
        out, stack = [], [root]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(children.get(node, ()))
        return out

    roots = [a for a in by_id.values() if a.record.parent_entity_id not in by_id]
    last = {r.record.entity_id: max(by_id[e].last for e in tree(r.record.entity_id)) for r in roots}
    if entity is not None:
        if entity not in by_id:
            raise CantripError(f"no entity {entity!r} in this loom")
        parent = by_id[entity].record.parent_entity_id
        if parent is not None and parent in by_id:
            raise CantripError(
                f"entity {entity} was spawned by {parent}: prune its root, which removes it too"
            )
        chosen = [entity]
    elif before is not None:
        cut = before.astimezone(UTC).isoformat() if before.tzinfo else before.isoformat()
        chosen = [root for root, when in last.items() if when and earlier(when, cut)]
    else:
        assert keep_last is not None
        if keep_last < 0:
            raise CantripError("--keep-last takes a number of entities, 0 or more")
        newest_first = sorted(last, key=lambda r: last[r], reverse=True)
        chosen = newest_first[keep_last:]

    members = {root: tree(root) for root in chosen}
    kept: dict[str, str] = {}
    for root, entities in members.items():
        running = [e for e in entities if e in busy]
        if running:
            kept[root] = f"running ({running[0]})"
    # a tree stays while a surviving entity was forked from one of its entities
    turn_owner = {a.record.entity_id: a.fork_source for a in by_id.values() if a.fork_source}
    changed = True
    while changed:
        changed = False
        removed = {e for root, es in members.items() if root not in kept for e in es}
        for a in by_id.values():
            source = turn_owner.get(a.record.entity_id)
            if source is None or a.record.entity_id in removed or source not in removed:
                continue
            root = next(r for r, es in members.items() if source in es)
            kept[root] = f"entity {a.record.entity_id} was forked from it"
            changed = True
    final = [root for root in chosen if root not in kept]
    entities = [e for root in final for e in members[root]]
    return Plan(
        roots=tuple(final),
        entities=tuple(entities),
        turns=sum(by_id[e].turns for e in entities),
        kept=tuple(sorted(kept.items())),
    )


def prune(
    loom: Loom,
    *,
    before: datetime | None = None,
    keep_last: int | None = None,
    entity: str | None = None,
    archive: str | None = None,
    busy_s: float = 60.0,
    dry_run: bool = False,
) -> Pruned:
    """Remove the trees :func:`plan` selects (archived first when asked); reclaim space."""
    store = retention_of(loom)
    started = time.perf_counter()
    activity = store.activity()
    chosen = plan(
        activity,
        before=before,
        keep_last=keep_last,
        entity=entity,
        busy=store.busy(activity, busy_s),
    )
    bytes_before = sum(store.table_bytes().values())
    if dry_run:
        return Pruned(chosen, bytes_before, bytes_before, time.perf_counter() - started, None)
    collected = store.collect_journal()
    if not chosen.entities:
        if collected:
            store.reclaim()
        after = sum(store.table_bytes().values())
        return Pruned(chosen, bytes_before, after, time.perf_counter() - started, None, collected)
    if archive is not None:
        write_archive(loom, chosen.entities, archive)
    by_root: dict[str, list[str]] = {}
    parents = {a.record.entity_id: a.record.parent_entity_id for a in activity}
    for entity_id in chosen.entities:
        root = entity_id
        while parents.get(root) in parents and parents.get(root) is not None:
            root = parents[root]  # type: ignore[assignment]
        by_root.setdefault(root, []).append(entity_id)
    batch: list[str] = []
    for index, root in enumerate(chosen.roots):
        batch.extend(by_root.get(root, [root]))
        if (index + 1) % BATCH == 0:
            store.delete_entities(batch)
            batch = []
    if batch:
        store.delete_entities(batch)
    store.reclaim()
    bytes_after = sum(store.table_bytes().values())
    return Pruned(
        chosen, bytes_before, bytes_after, time.perf_counter() - started, archive, collected
    )


RETENTION_INTERVAL_S = 3600.0


def loom_location(loom: Loom) -> str | None:
    """Where ``loom`` lives, for another connection to it (None: in memory or JSONL)."""
    from cantrip.loom._stores import SQLiteStore

    store = loom.store
    if isinstance(store, SQLiteStore):
        return str(store.path)
    url = getattr(store, "url", None)
    return str(url) if isinstance(url, str) else None


async def keep_retained(
    location: str, days: float, *, interval_s: float = RETENTION_INTERVAL_S
) -> None:
    """``serve --retain-days``: prune trees idle for ``days`` at start and every
    ``interval_s``, on a connection of its own in a worker thread. A tree active within
    ``days`` counts as busy, so a session still in use is never touched. Each pass that
    removed something says so in one log line."""
    import functools

    from cantrip._redact import get_logger

    log = get_logger("cantrip.retention")
    while True:
        cut = datetime.now(UTC) - timedelta(days=days)
        loom = await trio.to_thread.run_sync(Loom.open, location)
        try:
            done = await trio.to_thread.run_sync(
                functools.partial(prune, loom, before=cut, busy_s=days * 86400.0)
            )
        finally:
            loom.close()
        if done.plan.roots or done.journal_rows:
            log.warning(
                "retention: removed %d entities (%d turns) idle for %g days, collected %d "
                "journal rows, in %.2f s",
                len(done.plan.entities),
                done.plan.turns,
                days,
                done.journal_rows,
                done.seconds,
            )
        await trio.sleep(interval_s)


def write_archive(loom: Loom, entity_ids: Sequence[str], path: str) -> None:
    """Every listed entity and its turns, as a JSONL loom (appended to when it exists)."""
    target = Loom.open(path)
    try:
        for entity_id in entity_ids:
            if target.has_entity(entity_id):
                continue
            target.register_entity(loom.entity(entity_id))
            for turn in loom.entity_turns(entity_id):
                target.append(turn)
    finally:
        target.close()


def stats(loom: Loom) -> dict[str, Any]:
    """Entities, turns, bytes per table, the oldest and newest activity."""
    store = retention_of(loom)
    activity = store.activity()
    stamps = sorted(a.last for a in activity if a.last)
    roots = sum(
        1 for a in activity if a.record.parent_entity_id is None or a.record.parent_entity_id == ""
    )
    tables = store.table_bytes()
    return {
        "entities": len(activity),
        "roots": roots,
        "turns": sum(a.turns for a in activity),
        "bytes": sum(tables.values()),
        "tables": tables,
        "oldest": stamps[0] if stamps else None,
        "newest": stamps[-1] if stamps else None,
    }


# -- SQLite ------------------------------------------------------------------------

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
        import orjson

        rows = self._db.execute(
            "SELECT e.data, COALESCE(json_extract(t.data, '$.metadata.timestamp'), ''), "
            "COALESCE(c.n, 0), f.entity_id FROM entities e "
            "LEFT JOIN (SELECT entity_id, MAX(pos) AS last, COUNT(*) AS n FROM turns "
            "GROUP BY entity_id) c ON c.entity_id = e.entity_id "
            "LEFT JOIN turns t ON t.pos = c.last "
            "LEFT JOIN turns f ON f.id = json_extract(e.data, '$.forked_from') ORDER BY e.pos"
        ).fetchall()
        out = []
        for data, last, n, source in rows:
            record = EntityRecord.from_dict(orjson.loads(data))
            out.append(Activity(record, str(last or record.created_at or ""), int(n), source))
        return out

    def busy(self, activity: Sequence[Activity], busy_s: float) -> set[str]:
        """Entities written to within ``busy_s``: another process may be casting on them."""
        return recently_active(activity, busy_s)

    def delete_entities(self, entity_ids: Sequence[str]) -> int:
        """One transaction: the append-only triggers are lifted for its length only (DDL
        is transactional in SQLite: another connection never sees them gone)."""
        db = self._db
        marks = ",".join("?" * len(entity_ids))
        db.execute("BEGIN IMMEDIATE")
        try:
            for name in _TRIGGERS:
                db.execute(f"DROP TRIGGER IF EXISTS {name}")
            deleted = db.execute(
                f"DELETE FROM turns WHERE entity_id IN ({marks})", tuple(entity_ids)
            ).rowcount
            db.execute(f"DELETE FROM entities WHERE entity_id IN ({marks})", tuple(entity_ids))
            if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'journal'").fetchone():
                db.execute(f"DELETE FROM journal WHERE entity_id IN ({marks})", tuple(entity_ids))
            db.execute(f"DELETE FROM blob_refs WHERE entity_id IN ({marks})", tuple(entity_ids))
            db.execute("DELETE FROM blobs WHERE hash NOT IN (SELECT hash FROM blob_refs)")
            for create in _TRIGGERS.values():
                db.execute(create)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return int(deleted)

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
        try:
            rows = self._db.execute(
                "SELECT name, SUM(pgsize) FROM dbstat GROUP BY name ORDER BY name"
            ).fetchall()
        except sqlite3.OperationalError:  # built without dbstat: the file as a whole
            size = self._db.execute(
                "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()"
            ).fetchone()
            return {"(file)": int(size[0])}
        return {str(name): int(size) for name, size in rows}


def parse_date(text: str) -> datetime:
    """``--before``: an ISO date or time (UTC unless it says otherwise), or ``Nd`` days ago."""
    text = text.strip()
    if text.endswith("d") and text[:-1].isdigit():
        return datetime.now(UTC).replace(microsecond=0) - timedelta(days=int(text[:-1]))
    try:
        return parse_time(text)
    except ValueError:
        raise CantripError(
            f"--before {text!r}: give a date (2026-01-31), a time (2026-01-31T12:00:00Z) "
            "or days ago (30d)"
        ) from None


__all__ = [
    "Activity",
    "Plan",
    "Pruned",
    "parse_date",
    "plan",
    "prune",
    "retention_of",
    "stats",
    "write_archive",
]
