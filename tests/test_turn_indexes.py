"""The PostgreSQL loom's turn indexes (issue 46.2, schema 7): one index on (entity,
sequence) serves both the uniqueness of an entity's turns and every read of them in
order; the index on (entity, loom position) is gone (~95 B of WAL a turn).

An entity's turns are appended in sequence order (one writer at a time, under the
entity's fence), so its sequence order is its position order; a loom position an
entity's reading goes on from (a work item's ``base_pos``, a session's tail) is turned
into a sequence through the same index. Here: those reads give what the position
order gave, on entities whose positions interleave; each still reads an index on a
table of 8,000 turns (EXPLAIN: no sequential scan); a turn writes four index entries,
not five. A real PostgreSQL (tests/conftest.py)."""

from __future__ import annotations

import psycopg
import pytest
import trio
from test_work_row_wal import CLAIM_PARAMS, _plan

from cantrip.distributed._queue import _CLAIM_AND_LEASE
from cantrip.loom import EntityRecord, Loom, Turn
from cantrip.loom._postgres import PostgresStore
from cantrip.protocols.sessions._rows import _LAST_POS, _TURNS_AFTER, POS_OF
from cantrip.protocols.sessions._summaries import _SUMMARIES

ENTITIES, TURNS = 200, 40


@pytest.fixture
def store(pg_url: str) -> PostgresStore:
    """A loom of ENTITIES x TURNS turns written round-robin (an entity's positions are
    far apart), analyzed."""
    store = PostgresStore(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO cantrip_turns (id, parent_id, entity_id, sequence, data) "
            "SELECT 'turn-' || e || '-' || s, CASE WHEN s > 1 THEN 'turn-' || e || '-' || "
            '(s - 1) END, \'entity-\' || e, s, \'{"form":2,"cantrip_id":"c"}\' '
            "FROM generate_series(1, %s) s, generate_series(1, %s) e ORDER BY s, e",
            (TURNS, ENTITIES),
        )
        conn.execute("ANALYZE cantrip_turns")
    yield store  # type: ignore[misc]
    store.close()


def _by_position(url: str, entity: str) -> list[tuple[int, str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT pos, id FROM cantrip_turns WHERE entity_id = %s ORDER BY pos", (entity,)
        ).fetchall()
    return [(int(pos), str(turn_id)) for pos, turn_id in rows]


def test_an_entitys_reads_give_its_turns_in_position_order(
    pg_url: str, store: PostgresStore
) -> None:
    entity = "entity-7"
    ordered = _by_position(pg_url, entity)
    ids = [turn_id for _, turn_id in ordered]
    assert [t.id for t in store.entity_turns(entity)] == ids
    assert [t.id for t in store.entity_turns_from(entity, ids[30])] == ids[30:]
    last = store.last_turn(entity)
    assert last is not None and last.id == ids[-1]
    with psycopg.connect(pg_url) as conn:
        assert conn.execute(_LAST_POS, (entity,)).fetchone() == (ordered[-1][0],)
        assert conn.execute(_LAST_POS, ("entity-none",)).fetchone() == (0,)
        for n in (0, 1, 17, TURNS - 1):
            assert conn.execute(POS_OF, (entity, n)).fetchone() == (ordered[n][0],)
        # after any loom position -- one of the entity's, one between two of them, 0, past
        # the last -- the turns after it, in order (a session's tail, a cast's base_pos)
        positions = [0, ordered[0][0] - 1, ordered[0][0], ordered[5][0] + 3, ordered[-1][0]]
        for pos in [*positions, ordered[-1][0] + 10_000]:
            rows = conn.execute(_TURNS_AFTER, {"e": entity, "p": pos}).fetchall()
            assert [(int(r[0]), str(r[2])) for r in rows] == [
                (p, t) for p, t in ordered if p > pos
            ], pos


def test_every_read_of_an_entitys_turns_uses_the_sequence_index(
    pg_url: str, store: PostgresStore
) -> None:
    sql = PostgresStore._sql
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SET plan_cache_mode = force_custom_plan")
        plans = {
            "entity_turns": _plan(conn, sql.entity_turns, ("entity-3",)),
            "entity_turns_from": _plan(conn, sql.entity_turns_from, ("entity-3", "turn-3-20")),
            "last_turn": _plan(conn, sql.last_turn, ("entity-3",)),
            "turns_after": _plan(conn, _TURNS_AFTER, {"e": "entity-3", "p": 4000}),
            "last_pos": _plan(conn, _LAST_POS, ("entity-3",)),
            "pos_of": _plan(conn, POS_OF, ("entity-3", 5)),
            "session_summaries": _plan(conn, _SUMMARIES, None),
            "claim": _plan(conn, _CLAIM_AND_LEASE, CLAIM_PARAMS),
        }
    for name, plan in plans.items():
        assert "Seq Scan on cantrip_turns" not in plan, (name, plan)
        assert "cantrip_turns_entity_id_sequence_key" in plan, (name, plan)


def test_a_turn_writes_four_index_entries(pg_url: str) -> None:
    """The turn's position (primary key), id, (entity, sequence) and parent: not a fifth
    for (entity, position) -- on main, five."""
    from test_work_row_wal import _wal

    loom = Loom(PostgresStore(pg_url))
    try:
        loom.register_entity(EntityRecord(entity_id="entity-w", cantrip_id="c"))
        trio.run(loom.sync)
        turn = Turn(id="turn-w1", parent_id=None, entity_id="entity-w", sequence=1)

        def write() -> None:
            loom.append(turn)
            trio.run(loom.sync)

        records = _wal(pg_url, ("cantrip_turns",), write)
    finally:
        loom.close()
    indexes = sorted(relation for kind, relation in records if kind == "Btree INSERT_LEAF")
    assert indexes == [
        "cantrip_turns_by_parent",
        "cantrip_turns_entity_id_sequence_key",
        "cantrip_turns_id_key",
        "cantrip_turns_pkey",
    ]
