"""Memory in an SQLite loom's file: its own tables beside the loom's, FTS5 for search.

The tables are made the way the SQLite loom makes its own (:mod:`cantrip.loom._stores`):
an idempotent script run on open, so a loom written before memory existed gains them
once and its turns are not touched. ``memory_schema`` records the version; a file
written by a newer cantrip is refused instead of being written in a shape it does not
expect.

One connection of its own (WAL lets it sit beside the loom's), used by one thread at a
time: a lock around each operation for callers in several threads, and a limiter of
one for :class:`~cantrip.memory._store.AsyncMemory`.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

import trio

from cantrip.llm._embed_contract import Embedder
from cantrip.memory._model import (
    Item,
    Namespace,
    PreparedPut,
    SearchItem,
    check_key,
    check_namespace,
)
from cantrip.memory._sql_reads import COLUMNS, SqlReads, row_item, schema_is_current
from cantrip.memory._sqlite_vectors import SCHEMA as VECTOR_SCHEMA
from cantrip.memory._sqlite_vectors import SQLiteVectors
from cantrip.memory._store import now
from cantrip.memory._vectors import Plan

SCHEMA_VERSION = 2
"""1: items, their revisions, and the full-text index. 2: items' vectors
(:mod:`cantrip.memory._sqlite_vectors`)."""

_SCHEMA = (
    """
PRAGMA journal_mode=WAL;
CREATE TABLE IF NOT EXISTS memory_schema (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS memory_items (
    id INTEGER PRIMARY KEY,
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    metadata TEXT NOT NULL,
    revision INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    UNIQUE (namespace, key)
);
CREATE TABLE IF NOT EXISTS memory_revisions (
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    revision INTEGER NOT NULL,
    value TEXT NOT NULL,
    metadata TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (namespace, key, revision)
) WITHOUT ROWID;
CREATE VIRTUAL TABLE IF NOT EXISTS memory_fts USING fts5(text, tokenize='porter unicode61');
"""
    + VECTOR_SCHEMA
)

_TIME = "%Y-%m-%dT%H:%M:%S.%f%z"
"""Times as text of one width, so that text order is time order."""


class SQLiteMemory(SqlReads):
    """A memory store in the SQLite file at ``path`` (a loom's, or a file of its own).

    With an ``embedder``, every put embeds the item's text and searches can be
    semantic or hybrid; vectors made by another embedder are refused at open unless
    ``reindex`` (then every item is embedded again, here, before the store returns)."""

    MARK = "?"
    ITEMS = "memory_items"
    REVISIONS = "memory_revisions"
    vectors: SQLiteVectors

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        embedder: Embedder | None = None,
        reindex: bool = False,
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._lock = threading.Lock()
        self.limiter = trio.CapacityLimiter(1)
        try:
            self._migrate()
            self.vectors = SQLiteVectors(self._db, self._lock, embedder)
            self.vectors.open(reindex)
            # the loom's default durability (SQLiteStore: "normal"): a commit survives
            # the process crashing, without an fsync per put
            self._db.execute("PRAGMA synchronous=NORMAL")
        except BaseException:
            self._db.close()
            raise

    def _migrate(self) -> None:
        db = self._db
        found = db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'memory_schema'"
        ).fetchone()
        if found is not None:
            row = db.execute("SELECT max(version) FROM memory_schema").fetchone()
            if schema_is_current(row, SCHEMA_VERSION, f"in {self.path}"):
                return
        db.executescript(_SCHEMA)
        db.execute("INSERT INTO memory_schema (version) VALUES (?)", (SCHEMA_VERSION,))

    def _put(self, prepared: PreparedPut, plan: Plan) -> Item:
        stamp = now().strftime(_TIME)
        ns, key = prepared.namespace, prepared.key
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute(
                    "SELECT id, revision, created_at FROM memory_items "
                    "WHERE namespace = ? AND key = ?",
                    (ns, key),
                ).fetchone()
                if row is None:
                    revision, created = 1, stamp
                    item_id = db.execute(
                        "INSERT INTO memory_items (namespace, key, value, metadata, revision, "
                        "created_at, updated_at) VALUES (?, ?, ?, ?, 1, ?, ?)",
                        (ns, key, prepared.value, prepared.metadata, stamp, stamp),
                    ).lastrowid
                else:
                    item_id, revision, created = row[0], row[1] + 1, row[2]
                    db.execute(
                        "UPDATE memory_items SET value = ?, metadata = ?, revision = ?, "
                        "updated_at = ? WHERE id = ?",
                        (prepared.value, prepared.metadata, revision, stamp, item_id),
                    )
                    db.execute("DELETE FROM memory_fts WHERE rowid = ?", (item_id,))
                db.execute(
                    "INSERT INTO memory_fts (rowid, text) VALUES (?, ?)", (item_id, prepared.text)
                )
                assert item_id is not None  # an INSERT's rowid, or the row found
                self.vectors.write(item_id, plan)
                db.execute(
                    "INSERT INTO memory_revisions (namespace, key, revision, value, metadata, "
                    "updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                    (ns, key, revision, prepared.value, prepared.metadata, stamp),
                )
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        return _item((ns, key, prepared.value, prepared.metadata, revision, created, stamp))

    def delete(self, namespace: Namespace, key: str) -> bool:
        ns, key = check_namespace(namespace), check_key(key)
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute(
                    "DELETE FROM memory_items WHERE namespace = ? AND key = ? RETURNING id",
                    (ns, key),
                ).fetchone()
                if row is not None:
                    db.execute("DELETE FROM memory_fts WHERE rowid = ?", (row[0],))
                    db.execute(
                        "DELETE FROM memory_revisions WHERE namespace = ? AND key = ?", (ns, key)
                    )
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        return row is not None

    def _fetch(self, sql: str, params: list[Any]) -> list[Any]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def _item(self, row: Any) -> Item:
        return _item(row)

    def _search_item(self, row: Any) -> SearchItem:
        return SearchItem(_item(row[:7]), row[7])

    def _text_sql(self, words: list[str], where: str) -> tuple[str, list[Any]]:
        sql = (
            f"SELECT {COLUMNS}, -bm25(memory_fts) FROM memory_fts "
            f"JOIN memory_items i ON i.id = memory_fts.rowid "
            f"WHERE memory_fts MATCH ? AND {where} "
            "ORDER BY bm25(memory_fts), i.updated_at DESC, i.namespace, i.key "
            "LIMIT ? OFFSET ?"
        )
        return sql, [" ".join(f'"{word}"' for word in words)]

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _item(row: Any) -> Item:
    """A row of :data:`COLUMNS` as an item (times stored as :data:`_TIME` text)."""
    return row_item(row, _time)


def _time(stamp: str) -> datetime:
    return datetime.strptime(stamp, _TIME)
