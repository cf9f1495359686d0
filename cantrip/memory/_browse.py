"""Memory as people look at it: list, search, show and forget, as plain JSON.

``cantrip memory`` (:mod:`cantrip.cli._memory`) and the HTTP memory routes
(:mod:`cantrip.protocols.http._memory`) both answer from here, so a listing, an item
with its revisions and its source turn, and a forget (with its dry run) are one
behaviour wherever they are asked. Everything is checked by the store's own rules
(:class:`~cantrip.memory.MemoryStoreError`, one line naming the bound); a forget
refuses an empty namespace (it will not forget everything).
"""

from __future__ import annotations

import json
from typing import Any, get_args

from cantrip._redact import redact
from cantrip.loom._loom import Loom
from cantrip.memory._model import (
    MAX_LIMIT,
    MemoryStoreError,
    Namespace,
    check_key,
    check_namespace,
)
from cantrip.memory._provenance import describe, forget_namespace, source_turn
from cantrip.memory._store import MemoryBackend
from cantrip.memory._vectors import SearchMode

MAX_NAMESPACE_TEXT = 1200
"""The longest namespace a command line or a URL may spell (more is refused unread)."""
MAX_QUERY_STRING = 32768
"""Bytes of URL query a memory route reads (HTTP's and the viewer's): a namespace and a
query fit well inside; more is refused unread."""
MAX_REVISIONS = 100
"""Revisions ``show`` lists at most, newest first (an item put very often keeps them all)."""
PREVIEW_CHARS = 400
"""How much of a source turn's text ``show`` includes."""
MODES: tuple[str, ...] = get_args(SearchMode)


def parse_namespace(text: str, *, prefix: bool = True) -> Namespace:
    """A namespace as typed: parts joined by ``/`` (``user/alice``), or a JSON list of
    strings for parts that hold a ``/`` (``["user", "a/b"]``); ``""`` is every
    namespace when ``prefix``. Checked by the store's rules."""
    if len(text) > MAX_NAMESPACE_TEXT:
        raise MemoryStoreError(
            f"a namespace is at most {MAX_NAMESPACE_TEXT} characters as typed; "
            f"this one has {len(text)}"
        )
    parts: Any
    if text.startswith("["):
        try:
            parts = json.loads(text)
        except ValueError:
            raise MemoryStoreError(
                'a namespace in brackets is a JSON list of strings, such as ["user", "alice"]'
            ) from None
        if not isinstance(parts, list) or not all(isinstance(p, str) for p in parts):
            raise MemoryStoreError(
                'a namespace in brackets is a JSON list of strings, such as ["user", "alice"]'
            )
    else:
        parts = text.split("/") if text else []
    namespace = tuple(parts)
    check_namespace(namespace, prefix=prefix)
    return namespace


def check_mode(mode: str | None) -> SearchMode | None:
    if mode is not None and mode not in MODES:
        raise MemoryStoreError(f"a search mode is one of {', '.join(MODES)}; got {mode!r}")
    return mode  # type: ignore[return-value]


def check_limit(limit: int) -> int:
    if isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise MemoryStoreError(f"a limit is from 1 to {MAX_LIMIT} (MAX_LIMIT); got {limit}")
    return limit


def namespaces(store: MemoryBackend, prefix: Namespace = (), *, limit: int = 100) -> list[str]:
    """The namespaces holding items under ``prefix``, each as ``a/b`` text."""
    found = store.list_namespaces(prefix, limit=check_limit(limit))
    return ["/".join(ns) for ns in found]


def items(
    store: MemoryBackend,
    prefix: Namespace = (),
    *,
    query: str | None = None,
    mode: str | None = None,
    limit: int = 20,
    offset: int = 0,
) -> list[dict[str, Any]]:
    """Items under ``prefix``: with a ``query`` best match first (``mode`` text,
    semantic or hybrid; the store's default without), newest first without one."""
    if offset < 0:
        raise MemoryStoreError(f"an offset is 0 or more; got {offset}")
    chosen = check_mode(mode)
    options: dict[str, Any] = {} if chosen is None else {"mode": chosen}
    hits = store.search(prefix, query=query, limit=check_limit(limit), offset=offset, **options)
    return [{**describe(hit.item), "score": hit.score} for hit in hits]


def show(store: MemoryBackend, loom: Loom | None, namespace: Namespace, key: str) -> dict[str, Any]:
    """One item: its latest revision, the earlier ones (newest first, at most
    :data:`MAX_REVISIONS`), and the turn that wrote each (None: written by code, or
    the loom no longer holds it). ``KeyError`` when there is no such item."""
    check_namespace(namespace)
    check_key(key)
    latest = store.get(namespace, key)
    if latest is None:
        raise KeyError(f"no memory {key!r} in {'/'.join(namespace)}")
    revisions = []
    first = max(1, latest.revision - MAX_REVISIONS + 1)
    for number in range(latest.revision, first - 1, -1):
        item = latest if number == latest.revision else store.get(namespace, key, number)
        if item is None:
            continue
        revisions.append({**describe(item), "created_at": item.created_at.isoformat()})
    shown = {**describe(latest), "created_at": latest.created_at.isoformat()}
    shown["metadata"] = latest.metadata
    shown["source_turn"] = _turn(loom, latest) if loom is not None else None
    shown["revisions"] = revisions
    return shown


def forget(
    store: MemoryBackend, namespace: Namespace, key: str | None = None, *, dry_run: bool
) -> list[dict[str, str]]:
    """Forget one item (``key``) or every item under ``namespace`` (never an empty
    one: that would be everything), each with every revision; ``dry_run`` only says
    which. Returns ``{"namespace": "a/b", "key": ...}`` for each."""
    if not namespace:
        raise MemoryStoreError("forget needs a namespace: it will not forget everything")
    if key is not None:
        check_namespace(namespace)
        check_key(key)
        if store.get(namespace, key) is None:
            return []
        if not dry_run:
            store.delete(namespace, key)
        return [{"namespace": "/".join(namespace), "key": key}]
    gone = forget_namespace(store, namespace, dry_run=dry_run)
    return [{"namespace": "/".join(ns), "key": k} for ns, k in gone]


def _turn(loom: Loom, item: Any) -> dict[str, Any] | None:
    turn = source_turn(loom, item)
    return None if turn is None else turn_summary(loom, turn.id)


def turn_summary(loom: Loom, turn_id: str) -> dict[str, Any] | None:
    """The turn ``turn_id`` as ``show`` names an item's source: its id, entity,
    sequence, and its intent and text shortened and redacted (None: not in the loom)."""
    if not loom.has_turn(turn_id):
        return None
    turn = loom.get(turn_id)
    return {
        "turn_id": turn.id,
        "entity_id": turn.entity_id,
        "sequence": turn.sequence,
        "intent": _short(turn.intent),
        "utterance": _short(turn.utterance),
    }


def _short(text: str | None) -> str | None:
    if text is None:
        return None
    text = redact(text)
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + " [...]"
