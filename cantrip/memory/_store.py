"""The one interface both memory stores implement, and the async face over either.

The stores are synchronous, like the loom's (:mod:`cantrip.loom._stores`): SQLite's
calls are short and psycopg is blocking. Code on the trio loop goes through
:class:`AsyncMemory`, which runs each call in ``trio.to_thread`` behind the store's
``limiter`` -- the way the loom calls its PostgreSQL store -- so the loop never waits
on the database.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

import trio

from cantrip.memory._model import Item, Namespace, SearchItem
from cantrip.memory._vectors import SearchMode

T = TypeVar("T")


class MemoryBackend(Protocol):
    """A store of items ``(namespace, key) -> value`` with metadata and revisions."""

    limiter: trio.CapacityLimiter
    """Worker threads that may call the store at once (:class:`AsyncMemory`)."""

    def put(
        self, namespace: Namespace, key: str, value: Any, metadata: dict[str, Any] | None = None
    ) -> Item:
        """Store ``value`` under ``(namespace, key)``: a new item at revision 1, or the
        next revision of an existing one (its earlier revisions are kept). Returns the
        item as stored (secret values redacted)."""
        ...

    def get(self, namespace: Namespace, key: str, revision: int | None = None) -> Item | None:
        """The item's latest revision, or the one asked for; None if there is none."""
        ...

    def delete(self, namespace: Namespace, key: str) -> bool:
        """Forget the item and every revision of it; whether there was one."""
        ...

    def list_namespaces(
        self,
        prefix: Namespace = (),
        *,
        max_depth: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Namespace]:
        """The namespaces holding items, under ``prefix``, cut to ``max_depth`` parts."""
        ...

    def search(
        self,
        prefix: Namespace = (),
        *,
        query: str | None = None,
        limit: int = 10,
        offset: int = 0,
        mode: SearchMode | None = None,
    ) -> list[SearchItem]:
        """Items under ``prefix``: with a ``query``, best match first -- ``mode="text"``
        those holding all its words, ``"semantic"`` the nearest in meaning (an
        embedder's), ``"hybrid"`` both rankings fused (the default with an embedder;
        text without); without a query, newest first."""
        ...

    def reindex(self) -> int:
        """Embed every item that has no vector yet; how many were embedded."""
        ...

    def close(self) -> None: ...


class AsyncMemory:
    """A :class:`MemoryBackend` for code on the trio loop: the same operations,
    awaited, each run in a worker thread behind the store's limiter."""

    def __init__(self, store: MemoryBackend) -> None:
        self.store = store

    async def _run(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await trio.to_thread.run_sync(
            lambda: call(*args, **kwargs), limiter=self.store.limiter
        )

    async def put(
        self, namespace: Namespace, key: str, value: Any, metadata: dict[str, Any] | None = None
    ) -> Item:
        return await self._run(self.store.put, namespace, key, value, metadata)

    async def get(self, namespace: Namespace, key: str, revision: int | None = None) -> Item | None:
        return await self._run(self.store.get, namespace, key, revision)

    async def delete(self, namespace: Namespace, key: str) -> bool:
        return await self._run(self.store.delete, namespace, key)

    async def list_namespaces(
        self,
        prefix: Namespace = (),
        *,
        max_depth: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Namespace]:
        return await self._run(
            self.store.list_namespaces, prefix, max_depth=max_depth, limit=limit, offset=offset
        )

    async def search(
        self,
        prefix: Namespace = (),
        *,
        query: str | None = None,
        limit: int = 10,
        offset: int = 0,
        mode: SearchMode | None = None,
    ) -> list[SearchItem]:
        # ``mode`` only when asked: a backend written before search modes still works
        chosen = {} if mode is None else {"mode": mode}
        return await self._run(
            self.store.search, prefix, query=query, limit=limit, offset=offset, **chosen
        )

    async def reindex(self) -> int:
        return await self._run(self.store.reindex)


def now() -> datetime:
    """The time a put is stamped with (both stores: one clock, the process's)."""
    return datetime.now(UTC)
