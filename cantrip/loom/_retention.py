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
  unexpired lease stays. Anywhere a tree whose last turn is younger than ``busy_s``
  stays (another process may be casting on it). Each deleting transaction decides
  this again (a session prompted during the prune), and a batch found live is left
  whole and the plan made again.
* **Archive first, turn by turn.** With an archive, every tree is written there (a
  JSONL loom, readable by ``cantrip loom``) before anything is deleted; a turn it
  already holds is skipped, so a re-run completes an archive cut short, and only
  what the archive holds is deleted. The archive is never the loom itself.

Selection: ``--before DATE`` (trees whose last activity is older), ``--keep-last N``
(all but the N most recently active trees), ``--entity ID`` (one root's tree).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import attrs
import trio

from cantrip._errors import CantripError
from cantrip.loom._activity import Activity, Deleted, earlier, parse_time
from cantrip.loom._loom import Loom

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
    def busy(self, activity: Sequence[Activity], busy_s: float) -> dict[str, str]: ...
    def delete_entities(
        self,
        entity_ids: Sequence[str],
        *,
        busy_s: float,
        held: Mapping[str, AbstractSet[str]] | None = None,
    ) -> Deleted: ...
    def collect_journal(self) -> int: ...
    def reclaim(self) -> None: ...
    def table_bytes(self) -> dict[str, int]: ...


def retention_of(loom: Loom) -> RetentionStore:
    """The store's retention side (a clear error for a loom that has none)."""
    store = loom.store
    from cantrip.loom._stores import SQLiteStore

    if isinstance(store, SQLiteStore):
        from cantrip.loom._sqlite_retention import SQLiteRetention

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
    busy: Mapping[str, str] | None = None,
) -> Plan:
    """Which trees to remove: selected by exactly one rule, closed over children, and
    never a tree another entity stands on or that is running (``busy``: entity -> why
    it counts as running)."""
    busy = busy or {}
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
            first = running[0]
            kept[root] = busy[first] if first == root else f"{first} {busy[first]}"
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
    reclaim: bool = True,
) -> Pruned:
    """Remove the trees :func:`plan` selects (archived first when asked); reclaim space
    (``reclaim=False``: leave it to the next prune or the database's own vacuum -- a
    session's delete, which must not rewrite the whole store for one tree).

    Each deleting transaction decides again what is live (a session prompted since
    the plan, a turn the archive does not hold); when something is, that batch is left
    whole, the plan is made again with it kept, and what is still chosen goes on."""
    store = retention_of(loom)
    if archive is not None:
        refuse_archive(loom, archive)
    started = time.perf_counter()
    activity = store.activity()
    rule = {"before": before, "keep_last": keep_last, "entity": entity}
    chosen = plan(activity, **rule, busy=store.busy(activity, busy_s))  # type: ignore[arg-type]
    bytes_before = sum(store.table_bytes().values())
    if dry_run:
        return Pruned(chosen, bytes_before, bytes_before, time.perf_counter() - started, None)
    collected = store.collect_journal()
    trees = _trees(chosen, activity)  # root -> its entities, root first
    removed: list[str] = []
    turns = 0
    late: dict[str, str] = {}
    pending = list(chosen.roots)
    while pending:
        entities = [e for root in pending for e in trees[root]]
        held = write_archive(loom, entities, archive) if archive is not None else None
        deleted, new_late = _delete(store, pending, trees, busy_s, held)
        removed.extend(deleted)
        turns += sum(n for n in deleted.values())
        if not new_late:
            break
        late.update(new_late)
        activity = store.activity()
        again = plan(activity, **rule, busy={**store.busy(activity, busy_s), **late})  # type: ignore[arg-type]
        pending = [root for root in again.roots if root in pending and root not in removed]
    kept = dict(chosen.kept)
    for root in chosen.roots:
        if root not in removed:
            why = next((late[e] for e in trees[root] if e in late), None)
            kept[root] = why or "an entity it stands on became live during the prune"
    done = Plan(
        roots=tuple(removed),
        entities=tuple(e for root in removed for e in trees[root]),
        turns=turns,
        kept=tuple(sorted(kept.items())),
    )
    if reclaim and (removed or collected):
        store.reclaim()
    bytes_after = sum(store.table_bytes().values())
    return Pruned(
        done,
        bytes_before,
        bytes_after,
        time.perf_counter() - started,
        archive if removed else None,
        collected,
    )


def _delete(
    store: RetentionStore,
    roots: Sequence[str],
    trees: Mapping[str, Sequence[str]],
    busy_s: float,
    held: Mapping[str, AbstractSet[str]] | None,
) -> tuple[dict[str, int], dict[str, str]]:
    """Delete the trees of ``roots`` in batches; stop at the first batch found live.
    What was deleted (root -> turns, the batch's count on its first root), and the
    entities found live."""
    deleted: dict[str, int] = {}
    for start in range(0, len(roots), BATCH):
        batch = roots[start : start + BATCH]
        entities = [e for root in batch for e in trees[root]]
        result = store.delete_entities(entities, busy_s=busy_s, held=held)
        if result.late:
            return deleted, result.late
        deleted.update(dict.fromkeys(batch, 0))
        deleted[batch[0]] = result.turns
    return deleted, {}


def _trees(chosen: Plan, activity: Sequence[Activity]) -> dict[str, list[str]]:
    """The entities of ``chosen`` by the root of their tree, each root first."""
    parents = {a.record.entity_id: a.record.parent_entity_id for a in activity}
    trees: dict[str, list[str]] = {root: [] for root in chosen.roots}
    for entity_id in chosen.entities:
        top = entity_id
        while (parent := parents.get(top)) is not None and parent in parents:
            top = parent
        trees.setdefault(top, []).append(entity_id)
    return trees


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


def write_archive(loom: Loom, entity_ids: Sequence[str], path: str) -> dict[str, frozenset[str]]:
    """Every listed entity and its turns, as a JSONL loom (appended to when it exists);
    the turn ids the archive then holds, by entity.

    Turn by turn: a turn the archive already holds (an earlier run cut short by a
    crash, a kill, a full disk) is skipped, every other is written, so a re-run
    completes what the first began. Prune deletes only what this returns."""
    target = Loom.open(path)
    held: dict[str, frozenset[str]] = {}
    try:
        for entity_id in entity_ids:
            if not target.has_entity(entity_id):
                target.register_entity(loom.entity(entity_id))
            ids = set()
            for turn in loom.entity_turns(entity_id):
                if not target.has_turn(turn.id):
                    target.append(turn)
                ids.add(turn.id)
            held[entity_id] = frozenset(ids)
    finally:
        target.close()
    return held


def refuse_archive(loom: Loom, archive: str) -> None:
    """``--archive`` must not be the loom itself (by any path: prune would archive into
    what it deletes), and a name that would be opened as SQLite must be an existing
    loom (a new archive is a JSONL file: a typo must not create a database)."""
    here = loom_location(loom)
    if archive.startswith(("postgresql://", "postgres://")):
        if here == archive:
            raise CantripError(f"--archive {archive} is this loom: name another loom to archive to")
        return
    target = Path(archive)
    on_disk = here is not None and not here.startswith(("postgresql://", "postgres://"))
    if on_disk and target.exists() and os.path.samefile(target, str(here)):
        raise CantripError(
            f"--archive {archive} is this loom ({here}): archive to another file, such as "
            "archive.jsonl"
        )
    if target.suffix != ".jsonl":
        from cantrip.loom._repair import LOOM_TABLES, _tables, ensure_loom

        if not target.is_file() or target.stat().st_size == 0:
            raise CantripError(
                f"--archive {archive}: a new archive is a JSONL loom (name it .jsonl); a "
                "name opened as SQLite must be an existing loom other than this one"
            )
        ensure_loom(target)  # not a database at all, or another program's: refused
        if not _tables(target) >= LOOM_TABLES:
            raise CantripError(
                f"--archive {archive} is an SQLite database without a loom: archive to a "
                ".jsonl file, or to an existing loom"
            )


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
