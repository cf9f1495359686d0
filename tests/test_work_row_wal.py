"""The work queue's rows at the cost of the database (issue 46.2, schema 7).

* **A claim rewrites its work row in place.** The partial indexes on ``cantrip_work``
  name the generated ``live`` column, not ``state``: a claim (queued to running) changes
  no column an index names, and the table leaves room on its pages, so PostgreSQL
  writes the new row version beside the old one with no index entry (a heap-only
  tuple; the claim's ``FOR UPDATE`` lock record stays). Before: a new version on
  another page, a second lock record, and an entry in each of the table's three
  indexes, per claim.
* **The queries the old indexes served still use an index** (EXPLAIN on a table of
  20,000 finished rows): the claim, the quarantine's, the open work of all entities.
* **A version 6 database is brought to version 7 in place** (the turn index on entity
  and position dropped too: tests/test_turn_indexes.py).

A real PostgreSQL (tests/conftest.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from cantrip.distributed._queue import _CLAIM_AND_LEASE, WorkQueue
from cantrip.loom._postgres import PostgresStore
from cantrip.loom._postgres_retention import _OPEN_WORK

SPELL = {"factory": "x:y"}


@pytest.fixture
def store(pg_url: str) -> PostgresStore:
    store = PostgresStore(pg_url)
    yield store  # type: ignore[misc]
    store.close()


def _wal(url: str, tables: tuple[str, ...], write: Callable[[], Any]) -> list[tuple[str, str]]:
    """(resource manager and record type, relation) of every WAL record ``write()``
    made on ``tables`` and their indexes."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        start = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
        write()
        # the test cluster does not flush the WAL at commits; a switch to a new file does
        end = conn.execute("SELECT pg_switch_wal()").fetchone()
        assert start is not None and end is not None
        nodes = dict(
            conn.execute(
                "SELECT pg_relation_filenode(c.oid)::text, c.relname FROM pg_class c "
                "LEFT JOIN pg_index i ON i.indexrelid = c.oid "
                "WHERE c.relname = ANY(%(t)s) OR i.indrelid::regclass::text = ANY(%(t)s)",
                {"t": list(tables)},
            ).fetchall()
        )
        rows = conn.execute(
            "SELECT resource_manager || ' ' || split_part(record_type, ' ', 1), "
            "substring(block_ref from 'rel [0-9]+/[0-9]+/([0-9]+)') "
            "FROM pg_get_wal_records_info(%s, %s)",
            (start[0], end[0]),
        ).fetchall()
    return [(str(kind), nodes[node]) for kind, node in rows if node in nodes]


def test_a_claim_rewrites_its_work_rows_in_place(pg_url: str, store: PostgresStore) -> None:
    queue = WorkQueue(store)
    queue.enqueue_many(SPELL, [(f"entity-{i}", f"job {i}") for i in range(40)])
    claimed: list[Any] = []
    records = _wal(
        pg_url, ("cantrip_work",), lambda: claimed.extend(queue.claim_many("w1", 30, 40))
    )
    assert len(claimed) == 40
    work = Counter(kind for kind, relation in records if relation == "cantrip_work")
    # the row lock of FOR UPDATE SKIP LOCKED, then the new version on the same page;
    # before: an UPDATE to another page and an entry in each index (and in v6 a second
    # lock record, taken while it looked for that page)
    assert work == {"Heap LOCK": 40, "Heap HOT_UPDATE": 40}, records
    assert [r for r in records if r[1] != "cantrip_work"] == []  # no index entry


def test_the_claim_and_its_finish_release_the_lease_in_place(
    pg_url: str, store: PostgresStore
) -> None:
    """The lease table leaves room too: a lease released at the cast's end (and each
    renewal) is rewritten on its page, with no entry in the lease index."""
    queue = WorkQueue(store)
    queue.enqueue_many(SPELL, [(f"entity-{i}", f"job {i}") for i in range(150)])
    claims = queue.claim_many("w1", 30, 150)
    assert len(claims) == 150

    def finish() -> None:
        for claim in claims:
            assert queue.finish(claim, "done", {"answer": "ok"})

    records = _wal(pg_url, ("cantrip_leases",), finish)
    leases = Counter(kind for kind, relation in records if relation == "cantrip_leases")
    leases.pop("Heap2 PRUNE", None)  # (the old versions, cleared from a page on its way)
    assert leases == {"Heap HOT_UPDATE": 150}, records  # before: some on other pages
    assert [r for r in records if r[1] != "cantrip_leases"] == []  # no index entry


CLAIM_PARAMS = {
    "owner": "w",
    "lease": 30,
    "limit": 10,
    "busy": [],
    "max_attempts": 3,
    "idle": True,
    "one_slot": False,
    "alone": [],
}
"""A claim's parameters, for EXPLAIN of :data:`_CLAIM_AND_LEASE`."""


def _plan(conn: psycopg.Connection[Any], sql: str, params: Any = None) -> str:
    rows = conn.execute("EXPLAIN " + sql, params).fetchall()
    return "\n".join(str(row[0]) for row in rows)


def test_the_queries_of_open_work_use_an_index(pg_url: str, store: PostgresStore) -> None:
    """On a queue of 20,000 finished casts and a few open ones, analyzed: the claim (its
    runnable rows and the quarantine's), the open work of all entities (retention) and
    of one entity read an index, never the whole table."""
    queue = WorkQueue(store)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO cantrip_work (entity_id, intent, spell, state, result) "
            "SELECT 'old-' || i, 'done', '{}', 'done', '{}' FROM generate_series(1, 20000) i"
        )
    queue.enqueue_many(SPELL, [(f"entity-{i}", "job") for i in range(5)])
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("ANALYZE cantrip_work")
        conn.execute("SET plan_cache_mode = force_custom_plan")
        claim = _plan(conn, _CLAIM_AND_LEASE, CLAIM_PARAMS)
        everyone = _plan(conn, _OPEN_WORK)
        one = _plan(
            conn,
            "SELECT id FROM cantrip_work WHERE entity_id = %s AND live ORDER BY id LIMIT 1",
            ("entity-1",),
        )
    assert "Seq Scan on cantrip_work" not in claim, claim
    assert "using cantrip_work_live on cantrip_work w" in claim, claim  # the runnable rows
    assert "using cantrip_work_suspect on cantrip_work w" in claim, claim  # the quarantine's
    assert "Seq Scan" not in everyone and "cantrip_work_live" in everyone, everyone
    assert "Seq Scan" not in one and "cantrip_work_by_entity" in one, one
    assert queue.claim_many("w", 30, 10) != []  # and the claim still claims


def test_a_version_6_database_is_brought_to_version_7_in_place(pg_url: str) -> None:
    """A database made before schema 7 (partial indexes on ``state``, full pages, an index
    on the turns' entity and position) gains ``live``, its indexes and room on its pages
    when a store opens it, and loses that turn index (tests/test_turn_indexes.py); its
    open and finished work stay as they were and are told apart by ``live``."""
    from cantrip.loom._postgres_schema import SCHEMA_VERSION

    store = PostgresStore(pg_url)
    queue = WorkQueue(store)
    queue.enqueue_many(SPELL, [("done-one", "job"), ("queued-one", "job")])
    (done,) = queue.claim_many("w1", 30, 1)
    assert queue.finish(done, "done", {"answer": "ok"})
    store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:  # back to what v6 made
        conn.execute(
            "ALTER TABLE cantrip_work DROP COLUMN live, RESET (fillfactor); "
            "ALTER TABLE cantrip_leases RESET (fillfactor); "
            "CREATE INDEX cantrip_work_open ON cantrip_work (id) "
            "WHERE state IN ('queued', 'running'); "
            "CREATE INDEX cantrip_work_suspects ON cantrip_work (id) "
            "WHERE suspect AND state = 'running'; "
            "CREATE INDEX cantrip_turns_by_entity ON cantrip_turns (entity_id, pos); "
            "DELETE FROM cantrip_schema; INSERT INTO cantrip_schema (version) VALUES (6)"
        )
        assert conn.execute("SELECT to_regclass('cantrip_work_live')").fetchone() == (None,)
    store = PostgresStore(pg_url)
    try:
        (claim,) = WorkQueue(store).claim_many("w2", 30, 5)
        assert claim.entity_id == "queued-one"
    finally:
        store.close()
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT max(version) FROM cantrip_schema").fetchone() == (
            SCHEMA_VERSION,
        )
        rows = conn.execute("SELECT entity_id, live FROM cantrip_work ORDER BY id").fetchall()
        assert rows == [("done-one", False), ("queued-one", True)]
        indexes = conn.execute(
            "SELECT indexrelid::regclass::text FROM pg_index "
            "WHERE indrelid = 'cantrip_work'::regclass ORDER BY 1"
        ).fetchall()
        assert [name for (name,) in indexes] == [
            "cantrip_work_by_entity",
            "cantrip_work_live",
            "cantrip_work_pkey",
            "cantrip_work_suspect",
        ]
        assert conn.execute("SELECT to_regclass('cantrip_turns_by_entity')").fetchone() == (None,)
        options = conn.execute(
            "SELECT relname, reloptions FROM pg_class "
            "WHERE relname IN ('cantrip_work', 'cantrip_leases') ORDER BY 1"
        ).fetchall()
        assert options == [
            ("cantrip_leases", ["fillfactor=40"]),
            ("cantrip_work", ["fillfactor=40"]),
        ]
