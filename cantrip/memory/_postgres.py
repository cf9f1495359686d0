"""Memory in a PostgreSQL loom's database: its own tables beside the loom's, searched
with PostgreSQL's text search (``to_tsvector`` / ``plainto_tsquery``, English).

The tables are made the way the loom makes its own (:mod:`cantrip.loom._postgres_schema`):
one idempotent script with one version history, run on first use in one transaction
under an advisory lock (so that workers starting together do not race), the version
recorded in ``cantrip_memory_schema``. A database written by a newer cantrip is
refused instead of being written in a shape it does not expect. The memory's version
is its own: the loom's tables and their version are not touched.

psycopg is blocking; the store is synchronous, with a ``limiter`` of the pool's size
for :class:`~cantrip.memory._store.AsyncMemory`. Beside a loom it shares the loom's
pool (:meth:`PostgresMemory.beside`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
from cantrip.memory._postgres_vectors import SCHEMA as VECTOR_SCHEMA
from cantrip.memory._postgres_vectors import PostgresVectors
from cantrip.memory._sql_reads import COLUMNS, SqlReads, row_item, schema_is_current
from cantrip.memory._store import now
from cantrip.memory._vectors import Plan

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

    from cantrip.loom._postgres import PostgresStore

SCHEMA_VERSION = 2
"""1: items with their text-search vector, and their revisions. 2: items' embeddings
(:mod:`cantrip.memory._postgres_vectors`)."""
SCHEMA_LOCK = 0x6D656D6F  # "memo": the advisory lock schema creation runs under

SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS cantrip_memory_schema (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS cantrip_memory_items (
    namespace TEXT COLLATE "C" NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    metadata TEXT NOT NULL,
    revision INTEGER NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL,
    text TEXT NOT NULL,
    tsv TSVECTOR GENERATED ALWAYS AS (to_tsvector('english', text)) STORED,
    PRIMARY KEY (namespace, key)
);
CREATE INDEX IF NOT EXISTS cantrip_memory_items_tsv ON cantrip_memory_items USING GIN (tsv);
CREATE TABLE IF NOT EXISTS cantrip_memory_revisions (
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    revision INTEGER NOT NULL,
    value TEXT NOT NULL,
    metadata TEXT NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (namespace, key, revision)
);
"""
    + VECTOR_SCHEMA
)


def migrate(conn: Any, where: str) -> None:
    """Bring the memory tables behind ``conn`` up to :data:`SCHEMA_VERSION`, in one
    transaction under :data:`SCHEMA_LOCK` (``where`` names the database in a refusal)."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
        exists = conn.execute("SELECT to_regclass('cantrip_memory_schema')").fetchone()
        if exists is not None and exists[0] is not None:
            row = conn.execute("SELECT max(version) FROM cantrip_memory_schema").fetchone()
            if schema_is_current(row, SCHEMA_VERSION, f"at {where}"):
                return
        conn.execute(SCHEMA)
        conn.execute("INSERT INTO cantrip_memory_schema (version) VALUES (%s)", (SCHEMA_VERSION,))


class PostgresMemory(SqlReads):
    """A memory store on PostgreSQL, on a psycopg pool (autocommit connections)."""

    MARK = "%s"
    ITEMS = "cantrip_memory_items"
    REVISIONS = "cantrip_memory_revisions"
    vectors: PostgresVectors

    def __init__(
        self,
        pool: ConnectionPool,
        *,
        where: str,
        owns_pool: bool = False,
        embedder: Embedder | None = None,
        reindex: bool = False,
    ) -> None:
        self.pool = pool
        self.where = where
        self._owns_pool = owns_pool
        self.limiter = trio.CapacityLimiter(pool.max_size)
        with pool.connection() as conn:
            migrate(conn, where)
        self.vectors = PostgresVectors(pool, embedder)
        self.vectors.open(reindex)

    @classmethod
    def beside(
        cls, store: PostgresStore, *, embedder: Embedder | None = None, reindex: bool = False
    ) -> PostgresMemory:
        """The memory in a PostgreSQL loom's database, on the loom's own pool."""
        return cls(store.pool, where=str(store), embedder=embedder, reindex=reindex)

    @classmethod
    def open(
        cls,
        url: str,
        *,
        max_connections: int = 4,
        embedder: Embedder | None = None,
        reindex: bool = False,
    ) -> PostgresMemory:
        """The memory in the database at ``url``, on a pool of its own."""
        from cantrip.loom._postgres_connection import open_pool, safe_url

        pool = open_pool(url, max_connections)
        try:
            return cls(
                pool, where=safe_url(url), owns_pool=True, embedder=embedder, reindex=reindex
            )
        except BaseException:
            pool.close()
            raise

    def _put(self, p: PreparedPut, plan: Plan) -> Item:
        stamp = now()
        with self.pool.connection() as conn, conn.transaction():
            row = conn.execute(
                "INSERT INTO cantrip_memory_items AS i (namespace, key, value, metadata, "
                "revision, created_at, updated_at, text) VALUES (%s, %s, %s, %s, 1, %s, %s, %s) "
                "ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, "
                "metadata = excluded.metadata, revision = i.revision + 1, "
                "updated_at = excluded.updated_at, text = excluded.text "
                f"RETURNING {COLUMNS}",
                (p.namespace, p.key, p.value, p.metadata, stamp, stamp, p.text),
            ).fetchone()
            assert row is not None  # an upsert with RETURNING returns its row
            conn.execute(
                "INSERT INTO cantrip_memory_revisions (namespace, key, revision, value, "
                "metadata, updated_at) VALUES (%s, %s, %s, %s, %s, %s)",
                (p.namespace, p.key, row[4], p.value, p.metadata, stamp),
            )
            self.vectors.write(conn, (p.namespace, p.key), plan)
        return _item(row)

    def delete(self, namespace: Namespace, key: str) -> bool:
        ns, key = check_namespace(namespace), check_key(key)
        with self.pool.connection() as conn, conn.transaction():
            gone = conn.execute(
                "DELETE FROM cantrip_memory_items WHERE namespace = %s AND key = %s RETURNING 1",
                (ns, key),
            ).fetchone()
            conn.execute(
                "DELETE FROM cantrip_memory_revisions WHERE namespace = %s AND key = %s", (ns, key)
            )
        return gone is not None

    def _fetch(self, sql: str, params: list[Any]) -> list[Any]:
        with self.pool.connection() as conn:
            return conn.execute(sql, params).fetchall()

    def _item(self, row: Any) -> Item:
        return _item(row)

    def _search_item(self, row: Any) -> SearchItem:
        return SearchItem(_item(row[:7]), _score(row[7]))

    def _text_sql(self, words: list[str], where: str) -> tuple[str, list[Any]]:
        sql = (
            f"SELECT {COLUMNS}, ts_rank(i.tsv, q) FROM cantrip_memory_items i, "
            "plainto_tsquery('english', %s) q "
            f"WHERE i.tsv @@ q AND {where} "
            "ORDER BY ts_rank(i.tsv, q) DESC, i.updated_at DESC, i.namespace, i.key "
            "LIMIT %s OFFSET %s"
        )
        return sql, [" ".join(words)]

    def close(self) -> None:
        """Close the pool if this store opened it (a loom's pool is the loom's to close)."""
        if self._owns_pool:
            self.pool.close()


def _score(rank: Any) -> float | None:
    """``ts_rank``'s answer (a ``real``) as a float; None for a search without a query."""
    return None if rank is None else float(rank)


def _item(row: Any) -> Item:
    """A row of :data:`COLUMNS` as an item (psycopg reads TIMESTAMPTZ as datetimes)."""
    return row_item(row, _as_is)


def _as_is(stamp: Any) -> Any:
    return stamp
