"""Where a memory came from, and what was known when (issue 42.4).

Every item an entity writes through the memory gates names the turn that wrote it:
``metadata["source"] = {"entity_id": ..., "turn_id": ...}`` -- the turn that holds
the gate call (its id is reserved while the call runs, see
:meth:`cantrip._running.RunningEntity.next_turn_id`). :func:`source_turn` follows
it back into the loom. An item a consolidation wrote (:mod:`._consolidate`) also
names the cast it was drawn from: ``"drawn_from": {"entity_id": ..., "turn_ids":
[...]}``, so pruning that session takes it too (:func:`derived_from`).

The store keeps every revision of an item, so a read can be made "as of" a time
(:func:`item_as_of`) or a turn (:func:`turn_time`): a fork of an old turn recalls
what was known at its fork point (:func:`fork_time`), not what was learnt after.
A deleted item is gone with all its revisions: "as of" cannot bring back what was
forgotten, which is what forgetting is for.

:func:`forget_namespace` forgets everything under a namespace (a user's), and
:func:`forget_derived` what some sessions wrote (``cantrip loom prune --memories``),
each with a dry run that lists what would go.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from cantrip._errors import LoomError
from cantrip.loom._loom import Loom
from cantrip.loom._model import Turn
from cantrip.memory._model import MAX_LIMIT, Item, MemoryStoreError, Namespace
from cantrip.memory._store import MemoryBackend

SOURCE = "source"
"""The metadata key naming the turn that wrote an item."""


DRAWN_FROM = "drawn_from"
"""The key of a consolidated item's source naming the cast it was drawn from."""


def provenance(
    entity_id: str, turn_id: str, drawn_from: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """An item's ``metadata["source"]``: the turn that wrote it, and for a consolidated
    item the turns it was drawn from (``{"entity_id": ..., "turn_ids": [...]}``)."""
    source: dict[str, Any] = {"entity_id": entity_id, "turn_id": turn_id}
    if drawn_from is not None:
        source[DRAWN_FROM] = dict(drawn_from)
    return source


def source_turn(loom: Loom, item: Item) -> Turn | None:
    """The turn that wrote ``item``, if an entity wrote it and the loom still holds it."""
    source = item.metadata.get(SOURCE)
    turn_id = source.get("turn_id") if isinstance(source, dict) else None
    if not isinstance(turn_id, str) or not loom.has_turn(turn_id):
        return None
    return loom.get(turn_id)


def turn_time(turn: Turn) -> datetime:
    """When ``turn`` ended: what was known "as of" it (its start plus its duration)."""
    try:
        started = datetime.fromisoformat(turn.metadata.timestamp)
    except ValueError:
        raise MemoryStoreError(f"turn {turn.id} has no timestamp to read memory as of") from None
    return started + timedelta(milliseconds=turn.metadata.duration_ms)


def fork_time(loom: Loom, entity_id: str) -> datetime | None:
    """The end of the turn entity ``entity_id`` was forked from (None: not a fork)."""
    try:
        forked_from = loom.entity(entity_id).forked_from
    except LoomError:
        return None
    if forked_from is None or not loom.has_turn(forked_from):
        return None
    return turn_time(loom.get(forked_from))


def item_as_of(store: MemoryBackend, item: Item, when: datetime) -> Item | None:
    """``item`` as it was at ``when``: the latest revision written by then, or None
    if it was created after. (Blocking: call it in a worker thread.)"""
    if item.created_at > when:
        return None
    found: Item | None = item
    while found is not None and found.updated_at > when and found.revision > 1:
        found = store.get(item.namespace, item.key, found.revision - 1)
    return found


def get_as_of(store: MemoryBackend, namespace: Namespace, key: str, when: datetime) -> Item | None:
    """The item at ``(namespace, key)`` as it was at ``when`` (see :func:`item_as_of`)."""
    item = store.get(namespace, key)
    return None if item is None else item_as_of(store, item, when)


def forget_namespace(
    store: MemoryBackend, prefix: Namespace, *, dry_run: bool = True
) -> list[tuple[Namespace, str]]:
    """Forget every item under ``prefix`` (a user's namespace), every revision of
    each; or, with ``dry_run`` (the default), only say which. Returns the
    ``(namespace, key)`` of each item forgotten (or that would be)."""
    if not prefix:
        raise MemoryStoreError("forget_namespace needs a namespace: it will not forget everything")
    found: list[tuple[Namespace, str]] = []
    while True:
        page = store.search(prefix, limit=MAX_LIMIT, offset=0 if not dry_run else len(found))
        found.extend((hit.item.namespace, hit.item.key) for hit in page)
        if not dry_run:
            for hit in page:
                store.delete(hit.item.namespace, hit.item.key)
        if len(page) < MAX_LIMIT:
            return found


def drawn_turns(source: Any) -> list[dict[str, str]]:
    """The turns a consolidated item was drawn from, each ``{"entity_id", "turn_id"}``,
    from its source's :data:`DRAWN_FROM` (what :func:`provenance` wrote); metadata is
    anyone's to write, so what names no turn is left out."""
    drawn = source.get(DRAWN_FROM) if isinstance(source, dict) else None
    if not isinstance(drawn, dict) or not isinstance(drawn.get("turn_ids"), list):
        return []
    entity_id = drawn.get("entity_id")
    entity = entity_id if isinstance(entity_id, str) else ""
    return [
        {"entity_id": entity, "turn_id": turn_id}
        for turn_id in drawn["turn_ids"]
        if isinstance(turn_id, str) and turn_id
    ]


def derived_from(item: Item) -> set[str]:
    """The entities ``item``'s latest revision comes from: the one that wrote it, and
    for a consolidated item the one whose cast it was drawn from."""
    source = item.metadata.get(SOURCE)
    if not isinstance(source, dict):
        return set()
    found = {source.get("entity_id")}
    drawn = source.get(DRAWN_FROM)
    if isinstance(drawn, dict):
        found.add(drawn.get("entity_id"))
    return {entity for entity in found if isinstance(entity, str)}


def forget_derived(
    store: MemoryBackend,
    entity_ids: Iterable[str],
    *,
    prefix: Namespace = (),
    dry_run: bool = True,
) -> list[tuple[Namespace, str]]:
    """Forget the items under ``prefix`` whose latest revision was written by one of
    ``entity_ids``, or consolidated from one of their casts (``metadata["source"]``,
    :func:`derived_from`) -- the memories derived from sessions a prune removes;
    with ``dry_run`` (the default), only say which. An item revised since by a
    session that stays is kept: it is that session's memory now."""
    wanted = set(entity_ids)
    found: list[tuple[Namespace, str]] = []
    offset = 0
    while True:
        page = store.search(prefix, limit=MAX_LIMIT, offset=offset)
        offset += len(page)
        for hit in page:
            if derived_from(hit.item) & wanted:
                found.append((hit.item.namespace, hit.item.key))
        if len(page) < MAX_LIMIT:
            break
    if not dry_run:
        for namespace, key in found:
            store.delete(namespace, key)
    return found


def describe(item: Item) -> dict[str, Any]:
    """An item as plain JSON: what ``recall`` returns and a listing shows."""
    return {
        "namespace": list(item.namespace),
        "key": item.key,
        "value": item.value,
        "revision": item.revision,
        "updated_at": item.updated_at.isoformat(),
        "source": item.metadata.get(SOURCE),
    }
