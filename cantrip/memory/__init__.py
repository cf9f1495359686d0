"""Memory across sessions: a namespaced store of items beside the loom (issue 42).

Items ``(namespace, key) -> value`` (JSON) with metadata, created and updated times and
every revision kept, searched by text (SQLite FTS5, PostgreSQL text search). The store
lives in the loom's own database (:func:`memory_for`), in tables of its own. The
stores are synchronous, like the loom's; :class:`AsyncMemory` runs their calls in
worker threads for code on the trio loop.
"""

from cantrip.memory._cast import MemoryContext, MemoryScope, current_scope
from cantrip.memory._consolidate import CONSOLIDATES_TAG, CONSOLIDATOR_ID, ConsolidationRun
from cantrip.memory._model import (
    MAX_DEPTH,
    MAX_KEY_CHARS,
    MAX_LIMIT,
    MAX_PART_CHARS,
    MAX_QUERY_CHARS,
    MAX_VALUE_BYTES,
    Item,
    MemoryStoreError,
    Namespace,
    SearchItem,
)
from cantrip.memory._open import memory_for
from cantrip.memory._postgres import PostgresMemory
from cantrip.memory._provenance import (
    derived_from,
    describe,
    forget_derived,
    forget_namespace,
    get_as_of,
    item_as_of,
    source_turn,
    turn_time,
)
from cantrip.memory._settings import Consolidate, MemoryBlock, MemorySettings
from cantrip.memory._sqlite import SQLiteMemory
from cantrip.memory._store import AsyncMemory, MemoryBackend

__all__ = [
    "CONSOLIDATES_TAG",
    "CONSOLIDATOR_ID",
    "MAX_DEPTH",
    "MAX_KEY_CHARS",
    "MAX_LIMIT",
    "MAX_PART_CHARS",
    "MAX_QUERY_CHARS",
    "MAX_VALUE_BYTES",
    "AsyncMemory",
    "Consolidate",
    "ConsolidationRun",
    "Item",
    "MemoryBackend",
    "MemoryBlock",
    "MemoryContext",
    "MemoryScope",
    "MemorySettings",
    "MemoryStoreError",
    "Namespace",
    "PostgresMemory",
    "SQLiteMemory",
    "SearchItem",
    "current_scope",
    "derived_from",
    "describe",
    "forget_derived",
    "forget_namespace",
    "get_as_of",
    "item_as_of",
    "memory_for",
    "source_turn",
    "turn_time",
]
