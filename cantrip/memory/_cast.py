"""Memory in a cast: the namespace it works in, its pinned blocks, automatic recall,
and what the memory gates do (``gates/memory.py``).

A cantrip with memory installs a :class:`MemoryContext` (:attr:`Cantrip.cast_context`).
When a cast is sent, :meth:`MemoryContext.open_cast` fills the namespace template from
the cast (its ``user`` tag, the entity, the cantrip's name), reads the pinned blocks,
recalls the items that best match the intent, and returns the text the cast's
context shows after the intent, with what it was drawn from. The core records that
in the cast's first turn (``extras["memory"]``), so a replay, a fork or an eval
rebuilds the same prompt from the loom and never asks the store again.

The same call leaves a :class:`MemoryScope` for the entity, which the memory gates
find through the running entity: they work in the cast's namespace, and every item
they write names the turn that wrote it (``metadata["source"]``). Every store call
runs in a worker thread behind the store's limiter (:class:`AsyncMemory`).
"""

from __future__ import annotations

import functools
import json
import re
import weakref
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import attrs
import trio

from cantrip._redact import get_logger
from cantrip._running import RunningEntity, running_entity
from cantrip.loom._loom import Loom
from cantrip.memory._consolidate import CONSOLIDATOR_ID, ConsolidationRun, drawn_from
from cantrip.memory._model import MAX_LIMIT, Item, MemoryStoreError, Namespace, SearchItem
from cantrip.memory._open import memory_for
from cantrip.memory._provenance import SOURCE, fork_time, item_as_of, provenance
from cantrip.memory._settings import (
    BLOCKS_PART,
    USER_TAG,
    MemoryBlock,
    MemorySettings,
    user_of,
)
from cantrip.memory._store import AsyncMemory, MemoryBackend

log = get_logger("cantrip.memory.consolidate")
_WORD = re.compile(r"\w{2,}")
MAX_RECALL_WORDS = 8
"""Words of a query searched one by one when the whole query finds too little."""
MAX_SHOWN_CHARS = 2000
"""Characters of one recalled value shown in a prompt (the item keeps all of it)."""

_SCOPES: weakref.WeakKeyDictionary[Any, MemoryScope] = weakref.WeakKeyDictionary()
"""The scope of each entity's latest cast, for the memory gates it runs."""


@attrs.frozen
class MemoryScope:
    """Memory as one cast of one entity sees it."""

    settings: MemorySettings
    memory: AsyncMemory
    namespace: Namespace
    as_of: datetime | None = None
    """A fork reads what was known at its fork point (None: the latest)."""
    drawn_from: Mapping[str, Any] | None = None
    """A consolidation's: the cast it consolidates (its entity and turn ids), which
    every item it writes names beside the turn that wrote it."""

    @property
    def blocks_namespace(self) -> Namespace:
        return (*self.namespace, BLOCKS_PART)

    def _source(self, entity: RunningEntity) -> dict[str, Any]:
        return {SOURCE: provenance(entity.id, entity.next_turn_id(), self.drawn_from)}

    async def remember(self, entity: RunningEntity, key: str, value: Any) -> Item:
        """Store ``value`` under ``key``, naming the turn that writes it."""
        return await self.memory.put(self.namespace, key, value, self._source(entity))

    async def forget(self, key: str) -> bool:
        return await self.memory.delete(self.namespace, key)

    async def recall(self, query: str | None, limit: int) -> list[Item]:
        """The items that best match ``query`` (newest first without one), as of
        :attr:`as_of`; the pinned blocks are not among them."""
        store = self.memory.store
        return await trio.to_thread.run_sync(
            lambda: find(store, self.namespace, query, limit, self.as_of), limiter=store.limiter
        )

    async def blocks(self) -> list[tuple[MemoryBlock, str, int]]:
        """Each pinned block: (its declaration, its text now, its revision; 0 while it
        still holds its initial text)."""
        store = self.memory.store
        return await trio.to_thread.run_sync(
            lambda: read_blocks(store, self.settings.blocks, self.blocks_namespace, self.as_of),
            limiter=store.limiter,
        )

    async def edit_block(
        self, entity: RunningEntity, label: str, new_text: str, old_text: str | None
    ) -> tuple[str, int]:
        """Replace ``old_text`` in block ``label`` by ``new_text`` (append it when
        ``old_text`` is None); refused, with the bound named, past the block's limit.
        Returns the block's new text and revision."""
        block = self.settings.block(label)
        if block is None:
            known = ", ".join(repr(b.label) for b in self.settings.blocks) or "none"
            raise MemoryStoreError(f"there is no pinned block {label!r} (blocks: {known})")
        current = await self.memory.get(self.blocks_namespace, label)
        text = block.text if current is None else str(current.value)
        if old_text is None:
            edited = f"{text}\n{new_text}" if text else new_text
        elif not old_text:
            raise MemoryStoreError("old_text is empty: give the text to replace, or leave it out")
        elif old_text not in text:
            raise MemoryStoreError(f"block {label!r} does not contain old_text {old_text[:100]!r}")
        else:
            edited = text.replace(old_text, new_text, 1)
        if len(edited) > block.limit:
            raise MemoryStoreError(
                f"block {label!r} is limited to {block.limit} characters (its limit); "
                f"the edit would make it {len(edited)}"
            )
        item = await self.memory.put(self.blocks_namespace, label, edited, self._source(entity))
        return edited, item.revision


def find(
    store: MemoryBackend,
    namespace: Namespace,
    query: str | None,
    limit: int,
    as_of: datetime | None = None,
) -> list[Item]:
    """Up to ``limit`` items under ``namespace`` for ``query``, the pinned blocks left out.

    The store's text search asks for every word of a query; an intent ("what colour
    do I like?") rarely holds only words an item holds. When the whole query finds
    fewer than ``limit``, each of its first :data:`MAX_RECALL_WORDS` words is searched
    too, and those found by more words rank first (then by the best rank any word
    gave). With ``as_of``, an item is shown at the revision it had then, and one
    created later is left out (see :func:`item_as_of`)."""
    depth = len(namespace)
    window = min(limit + 8, MAX_LIMIT)

    def hits(text: str | None) -> list[SearchItem]:
        found = store.search(namespace, query=text, limit=window)
        # blocks are shown as blocks, never recalled: this namespace's or a nested one's
        return [h for h in found if BLOCKS_PART not in h.item.namespace[depth:]]

    ranked: dict[tuple[Namespace, str], tuple[int, int, Item]] = {}
    for rank, hit in enumerate(hits(query)):
        ranked[(hit.item.namespace, hit.item.key)] = (1000, rank, hit.item)
    if query is not None and len(ranked) < limit:
        words = list(dict.fromkeys(w.lower() for w in _WORD.findall(query)))
        for word in words[:MAX_RECALL_WORDS]:
            for rank, hit in enumerate(hits(word)):
                place = (hit.item.namespace, hit.item.key)
                count, best, item = ranked.get(place, (0, rank, hit.item))
                ranked[place] = (count + 1, min(best, rank), item)
    ordered = sorted(ranked.values(), key=lambda entry: (-entry[0], entry[1]))
    items = [entry[2] for entry in ordered]
    if as_of is not None:
        items = [old for item in items if (old := item_as_of(store, item, as_of)) is not None]
    return items[:limit]


def read_blocks(
    store: MemoryBackend,
    blocks: Sequence[MemoryBlock],
    namespace: Namespace,
    as_of: datetime | None,
) -> list[tuple[MemoryBlock, str, int]]:
    out = []
    for block in blocks:
        item = store.get(namespace, block.label)
        if item is not None and as_of is not None:
            item = item_as_of(store, item, as_of)
        if item is None:
            out.append((block, block.text, 0))
        else:
            out.append((block, str(item.value), item.revision))
    return out


class MemoryContext:
    """The cast context a cantrip with memory installs (:class:`cantrip._running.CastContext`)."""

    def __init__(self, settings: MemorySettings, loom: Loom, cantrip_id: str) -> None:
        self.settings = settings
        self.loom = loom
        self.cantrip_id = cantrip_id
        self._consolidator: Any = None

    async def store(self) -> AsyncMemory:
        """The store: the settings' own, or the one beside the loom (opened once, in a
        worker thread: opening migrates its tables)."""
        settings = self.settings
        if settings.store is not None:
            return AsyncMemory(settings.store)
        loom_store = self.loom.store
        entry = settings._opened.get(id(loom_store))
        if entry is None:
            mine = await trio.to_thread.run_sync(
                functools.partial(memory_for, loom_store, embedder=settings.embedder)
            )
            entry = settings._opened.setdefault(id(loom_store), (loom_store, mine))
            if entry[1] is not mine:  # another cast opened it meanwhile: keep one
                await trio.to_thread.run_sync(mine.close)
        return AsyncMemory(entry[1])

    async def scope(self, entity: RunningEntity, tags: Mapping[str, Any]) -> MemoryScope:
        source = drawn_from(tags)  # a consolidation works for the entity it consolidates
        namespace = self.settings.fill(
            user=user_of(tags),
            entity=source["entity_id"] if source is not None else entity.id,
            cantrip=self.cantrip_id,
        )
        return MemoryScope(
            self.settings,
            await self.store(),
            namespace,
            fork_time(self.loom, entity.id),
            source,
        )

    async def reopen_cast(self, entity: RunningEntity, tags: Mapping[str, Any]) -> None:
        _SCOPES[entity] = await self.scope(entity, tags)

    @property
    def follows_up(self) -> bool:
        return self.settings.consolidate is not None

    def after_cast(
        self, entity: RunningEntity, tags: Mapping[str, Any], result: Any
    ) -> ConsolidationRun | None:
        """The consolidation of the cast that ended with ``result``, if this memory
        consolidates and the cast recorded a turn. Its user is the one the cast's
        first turn recorded (a cast resumed by a worker is not sent its tags again)."""
        if self.settings.consolidate is None or not result.turns:
            return None
        recorded = result.turns[0].extras.get(USER_TAG)
        user = recorded if isinstance(recorded, str) else tags.get(USER_TAG)
        user = user if isinstance(user, str) and user else None
        template = self.settings.consolidation_namespace
        if user is None and any("{user}" in part for part in template):
            log.warning(
                "entity %s: not consolidated: the consolidation namespace %s needs a user "
                "and the cast named none",
                entity.id,
                list(template),
            )
            return None
        return ConsolidationRun(self.consolidator, entity.id, result.turns, user)

    async def consolidator(self) -> Any:
        """The consolidation cantrip for this memory (built once): the spec's choice,
        recording into this loom, working on this store in the consolidation
        namespace, with ``{cantrip}`` filled as this memory fills it."""
        if self._consolidator is None:
            consolidate = self.settings.consolidate
            assert consolidate is not None
            memory = MemorySettings(
                namespace=self.settings.consolidation_namespace,
                name=self.settings.name or self.cantrip_id,
                store=(await self.store()).store,
            )
            built = consolidate.cantrip.with_(loom=self.loom, memory=memory, id=CONSOLIDATOR_ID)
            self._consolidator = self._consolidator or built
        return self._consolidator

    async def open_cast(
        self, entity: RunningEntity, intent: str, tags: Mapping[str, Any]
    ) -> Mapping[str, Any] | None:
        scope = await self.scope(entity, tags)
        _SCOPES[entity] = scope
        blocks = await scope.blocks() if self.settings.blocks else []
        recalled = (
            await scope.recall(intent, self.settings.recall_k) if self.settings.recall else []
        )
        if not blocks and not recalled:
            return None
        return {
            "text": render(scope.namespace, blocks, recalled),
            "namespace": list(scope.namespace),
            "blocks": [{"label": b.label, "revision": rev} for b, _, rev in blocks],
            "recalled": [
                {"namespace": list(i.namespace), "key": i.key, "revision": i.revision}
                for i in recalled
            ],
            "as_of": None if scope.as_of is None else scope.as_of.isoformat(),
        }


def render(
    namespace: Namespace, blocks: Sequence[tuple[MemoryBlock, str, int]], recalled: Sequence[Item]
) -> str:
    """The message memory adds after a cast's intent."""
    lines = [f"[memory: {'/'.join(namespace)}]"]
    for block, text, _ in blocks:
        lines.append(f'<block label="{block.label}" limit="{block.limit}">')
        lines.append(text)
        lines.append("</block>")
    if recalled:
        lines.append("Recalled (may help with this request):")
        for item in recalled:
            value = item.value if isinstance(item.value, str) else json.dumps(item.value)
            if len(value) > MAX_SHOWN_CHARS:
                value = value[:MAX_SHOWN_CHARS] + " [...]"
            lines.append(f"- {item.key}: {value}")
    return "\n".join(lines)


def current_scope() -> tuple[RunningEntity, MemoryScope]:
    """The entity whose turn is running and its cast's memory scope (the memory gates')."""
    entity = running_entity()
    scope = _SCOPES.get(entity) if entity is not None else None
    if entity is None or scope is None:
        raise MemoryStoreError("this entity has no memory: its cantrip was made without one")
    return entity, scope
