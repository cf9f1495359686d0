"""Items' vectors in a PostgreSQL loom's database, searched exactly by cosine similarity.

The vectors sit beside the items (``cantrip_memory_vectors``: a ``real[]`` per item,
dropped with its item by a foreign key's ``ON DELETE CASCADE``, and when its text
changes by a trigger -- so a put that embeds nothing sends no statement for vectors,
which a round trip per put would cost) and the model that made them in
``cantrip_memory_vector_index``. Vectors are stored at length 1, so cosine
similarity is a dot product:

* with the pgvector extension in the database (found, or created when the server has
  it and the role may), ``1 - (embedding::vector <=> query)``: pgvector's C;
* without it, the dot product in SQL over ``unnest`` of the two arrays -- the same
  ranking, exact, slower (``tests/test_memory_search.py`` runs it; this machine's
  server has no pgvector).

Either way the search is exact over the items under the namespace prefix: an
approximate index filtered afterwards would lose items.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
    text_hash,
)

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

log = get_logger("cantrip.memory")

SCHEMA = """
CREATE TABLE IF NOT EXISTS cantrip_memory_vector_index (
    model TEXT NOT NULL,
    dimensions INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS cantrip_memory_vectors (
    namespace TEXT COLLATE "C" NOT NULL,
    key TEXT NOT NULL,
    text_sha TEXT NOT NULL,
    embedding REAL[] NOT NULL,
    PRIMARY KEY (namespace, key),
    FOREIGN KEY (namespace, key) REFERENCES cantrip_memory_items (namespace, key)
        ON DELETE CASCADE
);
CREATE OR REPLACE FUNCTION cantrip_memory_vector_outdated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM cantrip_memory_vectors WHERE namespace = OLD.namespace AND key = OLD.key;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS cantrip_memory_vector_outdated ON cantrip_memory_items;
CREATE TRIGGER cantrip_memory_vector_outdated
AFTER UPDATE OF text ON cantrip_memory_items
FOR EACH ROW WHEN (OLD.text IS DISTINCT FROM NEW.text)
EXECUTE FUNCTION cantrip_memory_vector_outdated();
"""
REINDEX_BATCH = 64
_EXACT = "(SELECT sum(a::float8 * b::float8) FROM unnest(v.embedding, %s::real[]) AS t(a, b))"
_PGVECTOR = "(1 - (v.embedding::vector <=> %s::real[]::vector))"


def has_pgvector(conn: Any) -> bool:
    """Whether pgvector is in the database, creating it when the server has it and the
    role may (a refusal leaves the exact search in SQL, and says so in the log)."""
    found = conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone()
    if found is not None:
        return True
    available = conn.execute(
        "SELECT 1 FROM pg_available_extensions WHERE name = 'vector'"
    ).fetchone()
    if available is None:
        return False
    import psycopg

    try:
        with conn.transaction():
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except psycopg.Error as exc:
        log.warning("pgvector is on the server but not created here (%s): exact SQL", exc)
        return False
    return True


class PostgresVectors:
    """The vector side of one :class:`~cantrip.memory.PostgresMemory`."""

    def __init__(self, pool: ConnectionPool, embedder: Embedder | None) -> None:
        self.pool = pool
        self.embedder = embedder
        with pool.connection() as conn:
            self.pgvector = has_pgvector(conn)
        """Whether pgvector computes the distances (else the dot product in SQL)."""

    def open(self, reindex: bool) -> None:
        if self.embedder is None:
            return
        model_id = self.embedder.model_id
        with self.pool.connection() as conn, conn.transaction():
            row = conn.execute("SELECT model FROM cantrip_memory_vector_index").fetchone()
            if row is not None and row[0] != model_id:
                if not reindex:
                    raise model_changed(row[0], model_id)
                conn.execute("DELETE FROM cantrip_memory_vectors")
                conn.execute("DELETE FROM cantrip_memory_vector_index")
        if reindex:
            self.reindex()

    def plan(self, item_key: tuple[str, str], text: str, force: bool = False) -> Plan:
        if self.embedder is None or not text.strip():
            return Plan("", None)  # no vector: the write drops any the item had
        sha = text_hash(text)
        if not force:
            with self.pool.connection() as conn:
                row = conn.execute(
                    "SELECT text_sha FROM cantrip_memory_vectors WHERE namespace = %s AND key = %s",
                    item_key,
                ).fetchone()
            if row is not None and row[0] == sha:
                return Plan(sha, None, keep=True)
        return Plan(sha, embed_one(self.embedder, text, "document"))

    def write(self, conn: Any, item_key: tuple[str, str], plan: Plan) -> None:
        """Inside the put's transaction: the item's vector as planned."""
        if plan.keep:
            row = conn.execute(
                "SELECT text_sha FROM cantrip_memory_vectors "
                "WHERE namespace = %s AND key = %s FOR UPDATE",
                item_key,
            ).fetchone()
            if row is None or row[0] != plan.sha:
                raise Stale
            return
        if plan.vector is None:
            return  # a vector of other text went with the change (the trigger)
        self._claim(conn, len(plan.vector))
        conn.execute(
            "INSERT INTO cantrip_memory_vectors (namespace, key, text_sha, embedding) "
            "VALUES (%s, %s, %s, %s) ON CONFLICT (namespace, key) DO UPDATE SET "
            "text_sha = excluded.text_sha, embedding = excluded.embedding",
            (*item_key, plan.sha, plan.vector),
        )

    def _claim(self, conn: Any, dimensions: int) -> None:
        assert self.embedder is not None  # a vector was made
        model_id = self.embedder.model_id
        query = "SELECT model, dimensions FROM cantrip_memory_vector_index"
        row = conn.execute(query).fetchone()
        if row is None:
            # the first vector: one writer records the model (the lock conflicts with
            # itself), the others then read its row; later puts take no lock at all
            conn.execute("LOCK TABLE cantrip_memory_vector_index IN SHARE ROW EXCLUSIVE MODE")
            row = conn.execute(query).fetchone()
        if row is None:
            conn.execute(
                "INSERT INTO cantrip_memory_vector_index (model, dimensions) VALUES (%s, %s)",
                (model_id, dimensions),
            )
            return
        if row[0] != model_id:
            raise model_changed(row[0], model_id)
        check_dimensions(model_id, dimensions, row[1])

    def query_vector(self, query: str) -> list[float] | None:
        assert self.embedder is not None  # resolve_mode refused a search without one
        return embed_query(self.embedder, query)

    def reindex(self) -> int:
        """Embed every item that has no vector; how many (see the SQLite store's)."""
        if self.embedder is None:
            raise MemoryStoreError("reindex needs an embedder: open the store with embedder=")
        done = 0
        skip: set[tuple[str, str]] = set()
        while True:
            with self.pool.connection() as conn:
                rows = conn.execute(
                    "SELECT i.namespace, i.key, i.text FROM cantrip_memory_items i "
                    "LEFT JOIN cantrip_memory_vectors v "
                    "ON v.namespace = i.namespace AND v.key = i.key "
                    "WHERE v.key IS NULL AND btrim(i.text) <> '' ORDER BY i.namespace, i.key"
                ).fetchall()
            rows = [row for row in rows if (row[0], row[1]) not in skip][:REINDEX_BATCH]
            if not rows:
                return done
            vectors = embed_many(self.embedder, [row[2] for row in rows])
            with self.pool.connection() as conn, conn.transaction():
                for (ns, key, text), vector in zip(rows, vectors, strict=True):
                    skip.add((ns, key))
                    now = conn.execute(
                        "SELECT text FROM cantrip_memory_items "
                        "WHERE namespace = %s AND key = %s FOR UPDATE",
                        (ns, key),
                    ).fetchone()
                    if now is None or now[0] != text or vector is None:
                        continue
                    self.write(conn, (ns, key), Plan(text_hash(text), vector))
                    done += 1

    def nearest_sql(self, columns: str, where: str) -> str:
        """The SQL of a semantic search (parameters: the query's vector, ``where``'s,
        limit, offset): the items under the prefix by cosine similarity, best first.
        The page is chosen on the narrow columns and only its rows are read whole."""
        similarity = _PGVECTOR if self.pgvector else _EXACT
        return (
            f"SELECT {columns}, top.similarity FROM ("
            f"SELECT v.namespace, v.key, {similarity} AS similarity, i.updated_at AS u "
            "FROM cantrip_memory_vectors v "
            "JOIN cantrip_memory_items i ON i.namespace = v.namespace AND i.key = v.key "
            f"WHERE {where} "
            "ORDER BY similarity DESC, u DESC, v.namespace, v.key LIMIT %s OFFSET %s"
            ") AS top JOIN cantrip_memory_items i "
            "ON i.namespace = top.namespace AND i.key = top.key "
            "ORDER BY top.similarity DESC, top.u DESC, top.namespace, top.key"
        )
