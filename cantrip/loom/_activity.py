"""What retention knows of one entity, and when an entity counts as recently active.

Below both the retention policy (:mod:`cantrip.loom._retention`) and the stores'
retention sides (:mod:`cantrip.loom._postgres_retention`), which both read it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import UTC, datetime

import attrs

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


def recently_active(activity: Iterable[Activity], busy_s: float) -> set[str]:
    if busy_s <= 0:
        return set()
    cut = datetime.fromtimestamp(time.time() - busy_s, UTC).isoformat()
    return {a.record.entity_id for a in activity if a.last and not earlier(a.last, cut)}


def earlier(when: str, cut: str) -> bool:
    try:
        return parse_time(when) < parse_time(cut)
    except ValueError:
        return False  # an unreadable timestamp is never old enough to delete


def parse_time(text: str) -> datetime:
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=UTC)
