"""The memory that belongs with a loom: in the same SQLite file or PostgreSQL database."""

from __future__ import annotations

import sqlite3

from cantrip.llm._embed_contract import Embedder
from cantrip.loom._postgres import PostgresStore
from cantrip.loom._stores import LoomStore, SQLiteStore
from cantrip.memory._model import MemoryStoreError
from cantrip.memory._postgres import PostgresMemory
from cantrip.memory._sqlite import SQLiteMemory
from cantrip.memory._store import MemoryBackend


def memory_for(
    store: LoomStore, *, embedder: Embedder | None = None, reindex: bool = False
) -> MemoryBackend:
    """The memory store beside a loom's ``store``: its tables are added to the loom's
    file or database (once; the loom's own tables and turns are left as they are).
    A loom kept in memory or in a JSONL file has no database to hold memory.

    With an ``embedder`` every put is embedded too, and searches can be semantic or
    hybrid (``reindex``: see :class:`~cantrip.memory.SQLiteMemory`)."""
    if isinstance(store, SQLiteStore):
        return SQLiteMemory(store.path, embedder=embedder, reindex=reindex)
    if isinstance(store, PostgresStore):
        return PostgresMemory.beside(store, embedder=embedder, reindex=reindex)
    raise MemoryStoreError(
        f"memory lives in a loom's database: an SQLite or PostgreSQL loom, not a "
        f"{type(store).__name__}"
    )


def has_memory(store: LoomStore) -> bool:
    """Whether the loom's database holds memory tables -- asked without making them,
    so a reader (the viewer of a loom) never adds tables to a loom it only shows.
    A loom kept in memory or in a JSONL file has none. (Blocking: one query.)"""
    if isinstance(store, SQLiteStore):
        uri = f"{store.path.resolve().as_uri()}?mode=ro"
        db = sqlite3.connect(uri, uri=True)
        try:
            found = db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'memory_schema'"
            ).fetchone()
        finally:
            db.close()
        return found is not None
    if isinstance(store, PostgresStore):
        with store.pool.connection() as conn:
            row = conn.execute("SELECT to_regclass('cantrip_memory_schema')").fetchone()
        return row is not None and row[0] is not None
    return False
