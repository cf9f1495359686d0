"""Items' vectors in an SQLite loom's file, searched exactly by cosine distance.

The vectors sit beside the items (``memory_vectors``: one float32 BLOB per item, the
format of the sqlite-vec extension) and the model that made them in
``memory_vector_index`` (its ``model_id`` and dimensions). A search computes the
distance of every vector under the namespace prefix and keeps the nearest: exact, and
the namespace filter is an ordinary ``WHERE`` (an approximate index would filter after
the fact and lose items). The distance is sqlite-vec's ``vec_distance_cosine``, in C,
where the extension loads; where it does not -- a Python whose ``sqlite3`` was built
without ``enable_load_extension``, as pyenv's builds are by default -- it is
:func:`cosine_distance` registered as an SQL function: the same SQL, the same answers
(``tests/test_memory_search.py`` checks one against the other where both exist), slower.

A trigger drops an item's vector with the item, so ``delete`` needs no code here.
"""

from __future__ import annotations

import array
import operator
import sqlite3
import sys
import threading

from cantrip._redact import get_logger
from cantrip.llm._embed_contract import Embedder
from cantrip.memory._model import MemoryStoreError
from cantrip.memory._vectors import (
    Plan,
    Stale,
    check_dimensions,
    embed_many,
    embed_one,
    embed_query,
    model_changed,
    pack,
    text_hash,
)

log = get_logger("cantrip.memory")

SCHEMA = """
CREATE TABLE IF NOT EXISTS memory_vector_index (
    model TEXT NOT NULL,
    dimensions INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS memory_vectors (
    item_id INTEGER PRIMARY KEY,
    text_sha TEXT NOT NULL,
    vector BLOB NOT NULL
);
CREATE TRIGGER IF NOT EXISTS memory_vectors_forget AFTER DELETE ON memory_items
BEGIN
    DELETE FROM memory_vectors WHERE item_id = old.id;
END;
"""
REINDEX_BATCH = 64
"""Items embedded per request while re-indexing."""


def cosine_distance(a: bytes, b: bytes) -> float:
    """``1 - cos(a, b)`` of two unit float32 vectors: sqlite-vec's ``vec_distance_cosine``
    where the extension cannot be loaded. ``array`` reads the BLOB a third faster than
    ``struct`` (this runs once per stored vector per search)."""
    return 1.0 - float(sum(map(operator.mul, _floats(a), _floats(b))))


def _floats(blob: bytes) -> array.array[float]:
    values = array.array("f")
    values.frombytes(blob)
    if sys.byteorder == "big":  # stored little-endian, sqlite-vec's format
        values.byteswap()
    return values


def load_sqlite_vec(db: sqlite3.Connection) -> bool:
    """Whether sqlite-vec's functions are now available on ``db``."""
    if not hasattr(db, "enable_load_extension"):
        return False
    try:
        import sqlite_vec
    except ImportError:  # pragma: no cover - a declared dependency
        return False
    try:
        db.enable_load_extension(True)
        sqlite_vec.load(db)
    except sqlite3.Error as exc:
        log.warning("sqlite-vec did not load (%s): exact search in Python instead", exc)
        return False
    finally:
        db.enable_load_extension(False)
    return True


class SQLiteVectors:
    """The vector side of one :class:`~cantrip.memory.SQLiteMemory`."""

    def __init__(
        self, db: sqlite3.Connection, lock: threading.Lock, embedder: Embedder | None
    ) -> None:
        self.db = db
        self.lock = lock
        self.embedder = embedder
        self.native = load_sqlite_vec(db)
        """Whether sqlite-vec computes the distances (else :func:`cosine_distance`)."""
        db.create_function("memory_cosine_distance", 2, cosine_distance, deterministic=True)
        self.distance = "vec_distance_cosine" if self.native else "memory_cosine_distance"

    def open(self, reindex: bool) -> None:
        """Check the vectors held were made by this embedder (or, with ``reindex``,
        drop them and embed every item with it)."""
        if self.embedder is None:
            return
        model_id = self.embedder.model_id
        with self.lock:
            row = self.db.execute("SELECT model FROM memory_vector_index").fetchone()
            if row is not None and row[0] != model_id:
                if not reindex:
                    raise model_changed(row[0], model_id)
                self.db.execute("BEGIN IMMEDIATE")
                self.db.execute("DELETE FROM memory_vectors")
                self.db.execute("DELETE FROM memory_vector_index")
                self.db.execute("COMMIT")
        if reindex:
            self.reindex()

    def plan(self, item_key: tuple[str, str], text: str, force: bool = False) -> Plan:
        if self.embedder is None or not text.strip():
            return Plan("", None)  # no vector: the write drops any the item had
        sha = text_hash(text)
        if not force:
            with self.lock:
                row = self.db.execute(
                    "SELECT v.text_sha FROM memory_vectors v JOIN memory_items i "
                    "ON i.id = v.item_id WHERE i.namespace = ? AND i.key = ?",
                    item_key,
                ).fetchone()
            if row is not None and row[0] == sha:
                return Plan(sha, None, keep=True)
        return Plan(sha, embed_one(self.embedder, text, "document"))

    def write(self, item_id: int, plan: Plan) -> None:
        """Inside the put's transaction: the item's vector as planned."""
        db = self.db
        if plan.keep:
            row = db.execute(
                "SELECT text_sha FROM memory_vectors WHERE item_id = ?", (item_id,)
            ).fetchone()
            if row is None or row[0] != plan.sha:
                raise Stale
            return
        if plan.vector is None:
            db.execute("DELETE FROM memory_vectors WHERE item_id = ?", (item_id,))
            return
        self._claim(len(plan.vector))
        db.execute(
            "INSERT INTO memory_vectors (item_id, text_sha, vector) VALUES (?, ?, ?) "
            "ON CONFLICT (item_id) DO UPDATE SET text_sha = excluded.text_sha, "
            "vector = excluded.vector",
            (item_id, plan.sha, pack(plan.vector)),
        )

    def _claim(self, dimensions: int) -> None:
        """Record this embedder as the vectors' maker, or check it is the recorded one."""
        assert self.embedder is not None  # a vector was made
        model_id = self.embedder.model_id
        row = self.db.execute("SELECT model, dimensions FROM memory_vector_index").fetchone()
        if row is None:
            self.db.execute(
                "INSERT INTO memory_vector_index (model, dimensions) VALUES (?, ?)",
                (model_id, dimensions),
            )
            return
        if row[0] != model_id:
            raise model_changed(row[0], model_id)
        check_dimensions(model_id, dimensions, row[1])

    def query_vector(self, query: str) -> bytes | None:
        """The query's vector (None: a query with nothing to embed)."""
        assert self.embedder is not None  # resolve_mode refused a search without one
        vector = embed_query(self.embedder, query)
        return None if vector is None else pack(vector)

    def reindex(self) -> int:
        """Embed every item that has no vector (written without an embedder, or before a
        model change); how many were embedded. Batches of :data:`REINDEX_BATCH`, each
        written in one transaction; an item whose text changed meanwhile is left to
        its own put."""
        if self.embedder is None:
            raise MemoryStoreError("reindex needs an embedder: open the store with embedder=")
        done = 0
        skip: set[int] = set()
        while True:
            with self.lock:
                rows = self.db.execute(
                    "SELECT i.id, f.text FROM memory_items i JOIN memory_fts f ON f.rowid = i.id "
                    "LEFT JOIN memory_vectors v ON v.item_id = i.id "
                    "WHERE v.item_id IS NULL AND trim(f.text) != '' ORDER BY i.id",
                ).fetchall()
            rows = [row for row in rows if row[0] not in skip][:REINDEX_BATCH]
            if not rows:
                return done
            vectors = embed_many(self.embedder, [row[1] for row in rows])
            with self.lock:
                self.db.execute("BEGIN IMMEDIATE")
                try:
                    for (item_id, text), vector in zip(rows, vectors, strict=True):
                        now = self.db.execute(
                            "SELECT text FROM memory_fts WHERE rowid = ?", (item_id,)
                        ).fetchone()
                        skip.add(item_id)
                        if now is None or now[0] != text or vector is None:
                            continue
                        self.write(item_id, Plan(text_hash(text), vector))
                        done += 1
                except BaseException:
                    self.db.execute("ROLLBACK")
                    raise
                self.db.execute("COMMIT")

    def nearest_sql(self, columns: str, where: str) -> str:
        """The SQL of a semantic search (parameters: the query's vector, ``where``'s,
        limit, offset): the items under the prefix by cosine similarity, best first.
        The page is chosen on the narrow columns and only its rows are read whole: the
        sorter then carries an id and a few keys per item, not every value."""
        return (
            f"SELECT {columns}, top.similarity FROM ("
            f"SELECT v.item_id, 1.0 - {self.distance}(v.vector, ?) AS similarity, "
            "i.updated_at AS u, i.namespace AS n, i.key AS k "
            "FROM memory_vectors v JOIN memory_items i ON i.id = v.item_id "
            f"WHERE {where} ORDER BY similarity DESC, u DESC, n, k LIMIT ? OFFSET ?"
            ") AS top JOIN memory_items i ON i.id = top.item_id "
            "ORDER BY top.similarity DESC, top.u DESC, top.n, top.k"
        )
