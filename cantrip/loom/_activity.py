"""What retention knows of one entity, and when an entity counts as recently active.

Below both the retention policy (:mod:`cantrip.loom._retention`) and the stores'
retention sides (:mod:`cantrip.loom._postgres_retention`), which both read it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from datetime import UTC, datetime
from typing import Any

import attrs
import orjson

from cantrip.loom._model import EntityRecord


@attrs.frozen
class Activity:
    """What prune needs to know of one entity."""

    record: EntityRecord
    last: str
    """The timestamp of its latest turn (its creation time when it has none)."""
    turns: int
    fork_source: str | None = None
    """For a forked entity: the entity its fork point (a turn) belongs to."""


def activity_from_rows(rows: Iterable[Sequence[Any]]) -> list[Activity]:
    """Activity from the one query every store runs, whatever its SQL dialect: rows of
    (entity JSON, latest turn's timestamp or '', turn count, fork source's entity)."""
    out = []
    for data, last, n, source in rows:
        record = EntityRecord.from_dict(orjson.loads(data))
        out.append(Activity(record, str(last or record.created_at or ""), int(n), source))
    return out


@attrs.frozen
class Deleted:
    """What one deleting transaction did: ``turns`` removed, or -- when ``late`` names
    entities found live inside it (written to since the plan, or since they were
    archived), with why -- nothing at all, so the caller plans again."""

    turns: int = 0
    late: dict[str, str] = attrs.field(factory=dict)


def written_recently(busy_s: float) -> str:
    """Why an entity written to within the idle window is left alone (the words every
    store's prune uses)."""
    return f"written in the last {busy_s:g} s; --idle-s sets how long"


def recently_active(activity: Iterable[Activity], busy_s: float) -> dict[str, str]:
    """Entities written to within ``busy_s``, with why they stay."""
    return {
        a.record.entity_id: written_recently(busy_s) for a in activity if is_recent(a.last, busy_s)
    }


def is_recent(last: str, busy_s: float) -> bool:
    if busy_s <= 0 or not last:
        return False
    cut = datetime.fromtimestamp(time.time() - busy_s, UTC).isoformat()
    return not earlier(last, cut)


def late_entities(
    turns: Iterable[tuple[str, str, str]],
    entity_ids: Iterable[str],
    busy_s: float,
    held: Mapping[str, AbstractSet[str]] | None,
) -> dict[str, str]:
    """Inside a deleting transaction: which of ``entity_ids`` are live after all.

    ``turns``: (entity id, turn id, timestamp) of every turn of the batch, in the
    order written. An entity whose latest turn is within ``busy_s`` is live (a session
    prompted since the plan); with an archive (``held``: the turn ids it holds, by
    entity), so is one with a turn the archive does not hold -- it is deleted only
    once it is archived whole."""
    last: dict[str, str] = {}
    late: dict[str, str] = {}
    for entity_id, turn_id, stamp in turns:
        last[entity_id] = stamp or ""
        if held is not None and turn_id not in held.get(entity_id, ()):
            late.setdefault(entity_id, "written to since it was archived")
    for entity_id in entity_ids:
        if entity_id not in late and is_recent(last.get(entity_id, ""), busy_s):
            late[entity_id] = written_recently(busy_s)
    return late


def earlier(when: str, cut: str) -> bool:
    try:
        return parse_time(when) < parse_time(cut)
    except ValueError:
        return False  # an unreadable timestamp is never old enough to delete


def parse_time(text: str) -> datetime:
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=UTC)
