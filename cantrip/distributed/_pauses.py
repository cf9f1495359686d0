"""Pauses: work that ended waiting for a human, the answers, and pauses answered in place.

A cast that pauses ends its work ``paused``; its answer (from any process) is new work
that carries it out. A child's pause cannot leave its parent's running cast: its worker
publishes it in ``cantrip_live_pauses`` and the answer is handed to the running tree.
Both kinds are answered here, one way, under the entity's lock.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from cantrip._approval import Decision, Pause, PauseError, check_decision
from cantrip.distributed._work import (
    ANSWER_KEY,
    ENTITY_LOCK,
    PAUSED,
    WORK_CHANNEL,
    Claim,
    enqueue_on,
)
from cantrip.loom._postgres import PostgresStore


@attrs.frozen
class PausedWork:
    """An entity's latest work item when it ended paused and nobody answered it yet."""

    work_id: int
    intent: str
    spell: str
    outcome: dict[str, Any]

    @property
    def pending(self) -> list[dict[str, Any]]:
        return list(self.outcome.get("pending") or [])


def pending_on(conn: Any, entity_id: str) -> PausedWork | None:
    """The entity's paused, unanswered work (its latest work item), or None."""
    row = conn.execute(
        "SELECT id, state, result, intent, spell FROM cantrip_work WHERE entity_id = %s "
        "ORDER BY id DESC LIMIT 1",
        (entity_id,),
    ).fetchone()
    if row is None or row[1] != PAUSED or not row[2]:
        return None
    outcome = json.loads(row[2])
    if outcome.get("answered") is not None:
        return None
    return PausedWork(int(row[0]), row[3], row[4], outcome)


def answer_on(conn: Any, entity_id: str, pause_id: str, decision: dict[str, Any]) -> Answered:
    """:meth:`WorkQueue.answer` inside the caller's transaction: under the entity's
    advisory lock, the paused work's outcome is marked answered (an answer to a pause
    that is not waiting -- answered already, here or at another replica -- or of the
    wrong kind is a :class:`~cantrip.PauseError`) and work that carries the answer out
    is queued with the paused work's spell and intent. A pause the entity's running tree
    waits on in place (a child's, published by its worker) is answered there instead."""
    conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (ENTITY_LOCK, entity_id))
    paused = pending_on(conn, entity_id)
    waiting = [Pause.from_dict(p) for p in (paused.pending if paused else [])]
    found = [p for p in waiting if p.pause_id == pause_id]
    if paused is None or not found:
        live = _answer_live(conn, entity_id, pause_id, decision)
        if live is not None:
            return Answered(live, live=True)
        raise PauseError(
            f"entity {entity_id} has no pending pause {pause_id!r} (already answered?)"
        )
    check_decision(found[0], Decision.parse(decision))
    answer = {"pause_id": pause_id, "decision": decision}
    queued = enqueue_on(conn, {**json.loads(paused.spell), ANSWER_KEY: answer}, paused.intent,
                        entity_id)  # fmt: skip
    answered = {**paused.outcome, "answered": {"pause_id": pause_id, "work_id": queued}}
    conn.execute(
        "UPDATE cantrip_work SET result = %s WHERE id = %s",
        (json.dumps(answered), paused.work_id),
    )
    return Answered(queued, live=False)


@attrs.frozen
class Answered:
    """Where an answer went: ``work_id`` carries it out -- new work queued for a paused
    entity, or (``live``) the running work whose entity tree waits in place for it."""

    work_id: int
    live: bool


# -- pauses a running entity tree waits on in place (a child's) ----------------------------

_LIVE_LOCK = 0x6C697665  # "live": creating the table, once per database
_LIVE_SCHEMA = """
CREATE TABLE IF NOT EXISTS cantrip_live_pauses (
    pause_id TEXT PRIMARY KEY,
    entity_id TEXT NOT NULL,
    work_id BIGINT NOT NULL,
    epoch BIGINT NOT NULL,
    pause TEXT NOT NULL,
    decision TEXT
);
CREATE INDEX IF NOT EXISTS cantrip_live_pauses_by_entity ON cantrip_live_pauses (entity_id);
"""
_LIVE_CURRENT = (
    "FROM cantrip_live_pauses p JOIN cantrip_work w ON w.id = p.work_id "
    "AND w.state = 'running' AND w.epoch = p.epoch WHERE p.entity_id = %s"
)
"""Live pauses of the entity's work as its current owner runs it (a dead owner's are stale)."""


def ensure_live_pauses(conn: Any) -> None:
    """Create ``cantrip_live_pauses`` if it is missing (a worker publishes there the
    pauses its entities' children wait on in place; any process answers them)."""
    exists = conn.execute("SELECT to_regclass('cantrip_live_pauses')").fetchone()
    if exists is None or exists[0] is None:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LIVE_LOCK,))
            conn.execute(_LIVE_SCHEMA)


def live_pending_on(conn: Any, entity_id: str) -> list[dict[str, Any]]:
    """The unanswered pauses ``entity_id``'s running tree waits on in place."""
    ensure_live_pauses(conn)
    rows = conn.execute(
        f"SELECT p.pause {_LIVE_CURRENT} AND p.decision IS NULL ORDER BY p.pause_id",
        (entity_id,),
    ).fetchall()
    return [json.loads(r[0]) for r in rows]


def _answer_live(conn: Any, entity_id: str, pause_id: str, decision: dict[str, Any]) -> int | None:
    """Record the answer to a pause the running tree waits on in place; its work id, or
    None if no such pause waits (unknown, answered, or its worker died)."""
    ensure_live_pauses(conn)
    row = conn.execute(
        f"SELECT p.pause, p.work_id {_LIVE_CURRENT} AND p.pause_id = %s AND p.decision IS NULL "
        "FOR UPDATE OF p",
        (entity_id, pause_id),
    ).fetchone()
    if row is None:
        return None
    check_decision(Pause.from_dict(json.loads(row[0])), Decision.parse(decision))
    conn.execute(
        "UPDATE cantrip_live_pauses SET decision = %s WHERE pause_id = %s",
        (json.dumps(decision), pause_id),
    )
    conn.execute("SELECT pg_notify(%s, %s)", (WORK_CHANNEL, entity_id))
    return int(row[1])


class LivePauses:
    """The worker's side of live pauses: publish them, collect their answers, forget them."""

    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        with store.pool.connection() as conn:
            ensure_live_pauses(conn)

    def publish(self, claim: Claim, pauses: list[dict[str, Any]]) -> None:
        with self.store.pool.connection() as conn, conn.transaction():
            for pause in pauses:
                conn.execute(
                    "INSERT INTO cantrip_live_pauses (pause_id, entity_id, work_id, epoch, pause) "
                    "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    (pause["pause_id"], claim.entity_id, claim.work_id, claim.fence.epoch,
                     json.dumps(pause)),
                )  # fmt: skip
            # wakes the replicas streaming the entity (``event: pause``) at commit
            conn.execute("SELECT pg_notify(%s, %s)", (WORK_CHANNEL, claim.entity_id))

    def answers(self, pause_ids: list[str]) -> list[tuple[str, dict[str, Any]]]:
        with self.store.pool.connection() as conn:
            rows = conn.execute(
                "SELECT pause_id, decision FROM cantrip_live_pauses "
                "WHERE pause_id = ANY(%s) AND decision IS NOT NULL",
                (pause_ids,),
            ).fetchall()
        return [(r[0], json.loads(r[1])) for r in rows]

    def forget(self, pause_ids: list[str]) -> None:
        with self.store.pool.connection() as conn:
            conn.execute("DELETE FROM cantrip_live_pauses WHERE pause_id = ANY(%s)", (pause_ids,))
