"""Memory in the viewer: the items of the loom's memory store, by namespace and by search,
and one item with its revisions -- each linked to the turn that wrote it, and a
consolidated item to the turns it was drawn from (issue 42.6).

Routes (``GET``; errors are the viewer's ``{"error": {"code", "message"}}``):

* ``/api/memory/namespaces?prefix=&limit=`` -- the namespaces holding items under a
  prefix, and whether the store can search by meaning (``semantic``);
* ``/api/memory/items?namespace=&q=&mode=&offset=&limit=`` -- items under a namespace,
  best match first with ``q``, newest first without; each value shortened to a preview;
* ``/api/memory/item?namespace=&key=`` -- one item: its value, metadata, revisions
  (newest first), the turn that wrote it and the turns it was drawn from, each turn
  summarised from the loom (None: written by code, or the loom no longer holds it); a
  consolidated item's turns are those its ``metadata["source"]["drawn_from"]`` names.

The answers are :mod:`cantrip.memory._browse`'s (the CLI's and HTTP's), checked by the
store's rules: a bad namespace, key, mode or an oversized query is a 400 naming the
bound; a query string over :data:`~cantrip.memory._browse.MAX_QUERY_STRING` is a 414,
refused unread. A loom without memory is a 404 ``no_memory``.

Which store: under ``cantrip serve`` the one the HTTP memory routes opened (the spec's
embedder included); over a loom file or database (``cantrip loom X view``) the store
beside it, opened on first need -- and only if the loom's database already holds
memory tables (:func:`~cantrip.memory._open.has_memory`): the viewer never adds tables
to a loom it only shows. Store calls run in worker threads behind the store's
limiter; the turns are read where the viewer reads its loom.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import trio

from cantrip.loom._loom import Loom
from cantrip.memory import _browse as browse
from cantrip.memory._model import MemoryStoreError
from cantrip.memory._open import has_memory, memory_for
from cantrip.memory._provenance import drawn_turns
from cantrip.memory._store import MemoryBackend
from cantrip.protocols.viewer._errors import ViewerError

T = TypeVar("T")
MemoryOpener = Callable[[], Awaitable[MemoryBackend | None]]
"""The store the viewer shows (None: this loom has no memory)."""
LoomRead = Callable[[Callable[[Loom], Any]], Awaitable[Any]]
"""Runs a read of the viewer's loom where the viewer reads it."""

ROUTES = ("namespaces", "items", "item")
PREVIEW_CHARS = 240
"""Characters of a value a listing row (or an earlier revision) shows."""
MAX_DRAWN = 200
"""Turns of a consolidated item summarised (the rest are counted, ``drawn_from_total``)."""


class LoomMemory:
    """The memory beside a loom the viewer only reads: opened on the first request that
    finds memory tables in the loom's database, then kept (see the module doc)."""

    def __init__(self, loom: Callable[[], Loom]) -> None:
        self._loom = loom
        self._store: MemoryBackend | None = None
        self._opening = trio.Lock()

    async def __call__(self) -> MemoryBackend | None:
        async with self._opening:
            if self._store is None:
                loom_store = self._loom().store
                self._store = await trio.to_thread.run_sync(_open_existing, loom_store)
            return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


def _open_existing(loom_store: Any) -> MemoryBackend | None:
    return memory_for(loom_store) if has_memory(loom_store) else None


async def memory_route(
    route: str,
    query: Mapping[str, Sequence[str]],
    raw_query: bytes,
    opener: MemoryOpener | None,
    read_loom: LoomRead,
    page: tuple[int, int],
) -> dict[str, Any]:
    """The answer of ``/api/memory/{route}`` (``page``: the request's offset and limit)."""
    if route not in ROUTES:
        raise ViewerError(404, "not_found", f"no route '/api/memory/{route[:100]}'")
    if len(raw_query) > browse.MAX_QUERY_STRING:
        raise ViewerError(
            414,
            "bad_request",
            f"a memory request reads at most {browse.MAX_QUERY_STRING} bytes of query "
            f"(MAX_QUERY_STRING); this one has {len(raw_query)}",
        )
    store = await opener() if opener is not None else None
    if store is None:
        raise ViewerError(
            404,
            "no_memory",
            "this loom holds no memory (a cantrip remembers with a [memory] table in its spec)",
        )
    try:
        if route == "namespaces":
            return await _namespaces(store, query, page[1])
        if route == "items":
            return await _items(store, query, *page)
        return await _item(store, query, read_loom)
    except MemoryStoreError as exc:
        raise ViewerError(400, "bad_request", str(exc)) from None


def _one(query: Mapping[str, Sequence[str]], name: str) -> str:
    values = query.get(name)
    return values[-1] if values else ""


async def _in_thread(store: MemoryBackend, call: Callable[..., T], *args: Any, **kw: Any) -> T:
    return await trio.to_thread.run_sync(
        functools.partial(call, *args, **kw), limiter=store.limiter
    )


async def _namespaces(
    store: MemoryBackend, query: Mapping[str, Sequence[str]], limit: int
) -> dict[str, Any]:
    prefix = browse.parse_namespace(_one(query, "prefix"))
    found = await _in_thread(store, browse.namespaces, store, prefix, limit=limit)
    return {
        "prefix": "/".join(prefix),
        "namespaces": found,
        "semantic": getattr(store, "embedder", None) is not None,
    }


async def _items(
    store: MemoryBackend, query: Mapping[str, Sequence[str]], offset: int, limit: int
) -> dict[str, Any]:
    prefix = browse.parse_namespace(_one(query, "namespace"))
    text = _one(query, "q").strip() or None
    mode = _one(query, "mode") or None
    found = await _in_thread(
        store, browse.items, store, prefix, query=text, mode=mode, limit=limit, offset=offset
    )
    rows = [
        {**row, "value": preview(row["value"]), "drawn_from": drawn_turns(row["source"])}
        for row in found
    ]
    return {
        "namespace": "/".join(prefix),
        "q": text,
        "offset": offset,
        "limit": limit,
        "more": len(rows) == limit,
        "items": rows,
    }


async def _item(
    store: MemoryBackend, query: Mapping[str, Sequence[str]], read_loom: LoomRead
) -> dict[str, Any]:
    namespace = browse.parse_namespace(_one(query, "namespace"), prefix=False)
    key = _one(query, "key")
    try:
        shown = await _in_thread(store, browse.show, store, None, namespace, key)
    except KeyError as exc:
        raise ViewerError(404, "unknown_item", str(exc.args[0])) from None
    drawn = drawn_turns(shown.get("source"))
    revisions: list[dict[str, Any]] = shown["revisions"]
    wanted = {_turn_id(shown.get("source"))}
    wanted.update(_turn_id(r.get("source")) for r in revisions)
    wanted.update(entry["turn_id"] for entry in drawn[:MAX_DRAWN])
    wanted.discard(None)
    turns = await read_loom(functools.partial(_summaries, ids=sorted(t for t in wanted if t)))
    shown["source_turn"] = turns.get(_turn_id(shown.get("source")))
    for revision in revisions:
        revision["value"] = preview(revision["value"])
        revision["source_turn"] = turns.get(_turn_id(revision.get("source")))
    shown["drawn_from"] = [{**e, "turn": turns.get(e["turn_id"])} for e in drawn[:MAX_DRAWN]]
    shown["drawn_from_total"] = len(drawn)
    return shown


def _turn_id(source: Any) -> str | None:
    turn_id = source.get("turn_id") if isinstance(source, dict) else None
    return turn_id if isinstance(turn_id, str) else None


def _summaries(loom: Loom, ids: list[str]) -> dict[str, dict[str, Any] | None]:
    """Each turn of ``ids`` as the CLI's ``show`` names an item's source (None: gone)."""
    return {turn_id: browse.turn_summary(loom, turn_id) for turn_id in ids}


def preview(value: Any) -> str:
    """A value as a line of text (JSON unless it is text), cut to :data:`PREVIEW_CHARS`."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"
