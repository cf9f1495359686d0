"""The rows of ``cantrip_work`` and what is said about them: states, channels, claims.

The lowest room of the queue: the names every side shares -- the states a work item
goes through, the NOTIFY channels, the spell keys, a :class:`Claim` -- and the
statements a front end runs inside its own transaction (enqueue, cancel, steer, read
messages). The claim loop's statements (:mod:`~cantrip.distributed._queue`) and the
pauses (:mod:`~cantrip.distributed._pauses`) stand on it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from cantrip.distributed._spell_secrets import check_queued_spell
from cantrip.loom._fence import Fence
from cantrip.loom._postgres_schema import WORK_OPEN

WORK_CHANNEL = "cantrip_work"
CANCEL_CHANNEL = "cantrip_cancel"
STEER_CHANNEL = "cantrip_steer"
"""Notified (payload: the entity id) when a message for an entity's running cast arrives."""

DEAD = "dead"
"""The end state of work no worker could finish within the attempt limit (a
dead letter: :meth:`WorkQueue.dead_letters` lists them)."""
MAX_ATTEMPTS = 5
"""Attempts of one work item before it is dead-lettered (``cantrip worker --max-attempts``):
every claim costs one, except a claim of a cast whose worker died holding other casts
too (a bystander's recovery is free; see :data:`_REAP`)."""
QUARANTINE_AFTER = 2
"""The crash (a worker dying while holding the cast beside others) from which a cast is
run in quarantine -- alone on its worker -- until it records a turn. The first crash
does not quarantine: a one-off kill (a deploy, the OOM killer, a lost machine) is
recovered at full speed; a cast in a second crash is likely near what kills workers."""

PAUSED = "paused"
"""The end state of work whose cast paused for a human: its outcome lists the
``pending`` calls; the lease is released and no worker holds the entity."""
ENDED = frozenset({"done", "failed", "cancelled", PAUSED, DEAD})
"""States a work item does not leave (a paused item's answer is new work)."""
ANSWER_KEY = "answer"
"""The spell key of work that carries out a human's answer to a pause."""
USER_KEY = "user"
"""The spell key of the user a session's prompt is for (``serve --db``): the worker
casts with it as the cast's ``user`` tag (a memory namespace's ``{user}``)."""
CWD_KEY = "cwd"
"""The spell key of the working directory a session was created in (``acp --db``): the
worker casts with it as the cast's ``cwd`` tag, so the loom records where it ran."""
CWD_TAG = "cwd"
"""A cast's tag naming its session's working directory (an editor's, over ACP)."""
REWIND_KEY = "rewind"
"""The spell key of a prompt that continues from an earlier turn (double-texting's
``rollback``): ``{"to": <turn id, or None for the beginning>}``."""
CONSOLIDATES_KEY = "consolidates"
"""The spell key of work that consolidates an ended cast into memory (42.5):
``{"entity_id": ..., "turn_ids": [...]}``; the worker casts the spell's consolidator
(cantrip.distributed._followups)."""
BUDGETS_KEY = "session_budgets"
"""In a queued spell, ``serve --db --session-budget``'s budgets ({ward: N}): the worker
charges the session's history to an account above the cast (cantrip._core._budget)."""
INTERRUPTED = "interrupted"
"""The cancel reason of a prompt a newer one displaced (``interrupt``, ``rollback``)."""
OPEN = WORK_OPEN
"""An open (queued or running) work row, as a query says it (the open-work index's
predicate: :data:`~cantrip.loom._postgres_schema.WORK_OPEN`)."""
ENTITY_LOCK = 0x70726F6D
"""The advisory-lock class of one entity's prompts and answers (``serve --db``)."""


def enqueue_on(conn: Any, spell: dict[str, Any], intent: str, entity_id: str) -> int:
    """Queue work on ``conn`` (a psycopg connection) in one statement (insert and NOTIFY),
    inside the caller's transaction if one is open: ``cantrip serve --db`` records a
    prompt's idempotency key in the same commit. A spell that holds a literal credential
    (an MCP server's ``env``/``headers``, an A2A agent's ``headers``) is refused before
    anything is written (:func:`cantrip.distributed._spell_secrets.check_queued_spell`)."""
    check_queued_spell(spell)
    row = conn.execute(
        "WITH queued AS (INSERT INTO cantrip_work (entity_id, intent, spell) "
        "VALUES (%(entity)s, %(intent)s, %(spell)s) RETURNING id) "
        "SELECT id, pg_notify(%(channel)s, %(entity)s) FROM queued",
        {
            "entity": entity_id,
            "intent": intent,
            "spell": json.dumps(spell),
            "channel": WORK_CHANNEL,
        },
    ).fetchone()
    assert row is not None
    return int(row[0])


def enqueue_many_on(
    conn: Any, spell: dict[str, Any], work: Sequence[tuple[str, str]]
) -> dict[str, int]:
    """Queue many casts of one spell on ``conn`` in one statement (issue 46.1): ``work``
    is ``(entity id, intent)`` pairs, each entity once; the work id by entity. One
    round trip and one commit for the lot, where :func:`enqueue_on` in a loop pays one
    of each per cast; the spell is checked and encoded once, and each entity's
    notification still goes out (a waiting :class:`Dispatcher` listens for its own)."""
    check_queued_spell(spell)
    entities = [entity for entity, _ in work]
    if len(set(entities)) != len(entities):
        raise ValueError("an entity appears twice in one batch: queue its intents one by one")
    rows = conn.execute(
        "WITH queued AS (INSERT INTO cantrip_work (entity_id, intent, spell) "
        "SELECT e, i, %(spell)s FROM unnest(%(entities)s::text[], %(intents)s::text[]) "
        "AS t(e, i) RETURNING id, entity_id) "
        "SELECT id, entity_id, pg_notify(%(channel)s, entity_id) FROM queued",
        {
            "entities": entities,
            "intents": [intent for _, intent in work],
            "spell": json.dumps(spell),
            "channel": WORK_CHANNEL,
        },
    ).fetchall()
    return {str(entity): int(work_id) for work_id, entity, _ in rows}


def cancel_on(
    conn: Any, entity_id: str, *, work_id: int | None = None, reason: str = "cancelled"
) -> int:
    """:meth:`WorkQueue.cancel` inside the caller's transaction on ``conn``: the entity's
    open work, or only ``work_id``; ``reason`` is how the cut-off cast is recorded."""
    where = "entity_id = %(entity)s AND (%(work)s::bigint IS NULL OR id = %(work)s)"
    params = {"entity": entity_id, "work": work_id, "reason": reason}
    queued = conn.execute(
        "UPDATE cantrip_work SET state = 'cancelled', finished_at = clock_timestamp(), "
        "result = json_build_object('reason', %(reason)s::text)::text "
        f"WHERE {where} AND state = 'queued' AND attempts = 0",
        params,
    ).rowcount
    running = conn.execute(
        "UPDATE cantrip_work SET cancel_requested = true, cancel_reason = %(reason)s "
        f"WHERE {where} AND {OPEN}",
        params,
    ).rowcount
    conn.execute(
        "SELECT pg_notify(%s, %s)", (CANCEL_CHANNEL, cancel_payload(entity_id, reason, work_id))
    )
    return int(queued) + int(running)


def cancel_payload(entity_id: str, reason: str, work_id: int | None = None) -> str:
    """A ``cantrip_cancel`` notification: the entity id, then the reason if it is not
    plain ``cancelled`` or a work item is named, then the work item if one is (entity
    ids and reasons hold no space). The work item matters: an entity may have work
    queued behind its running one, and a cancel naming a queued item must not cut off
    the cast a worker runs for the entity."""
    if work_id is not None:
        return f"{entity_id} {reason} {work_id}"
    return entity_id if reason == "cancelled" else f"{entity_id} {reason}"


def parse_cancel(payload: str) -> tuple[str, str, int | None]:
    """(entity id, reason, the work item named or None: all of the entity's) of a
    ``cantrip_cancel`` notification."""
    entity_id, _, rest = payload.partition(" ")
    reason, _, work = rest.partition(" ")
    return entity_id, reason or "cancelled", int(work) if work else None


def steer_on(
    conn: Any, entity_id: str, text: str, admit: Callable[[int, int], None] | None = None
) -> int | None:
    """Add a message for the entity's running prompt (its oldest open work item) inside
    the caller's transaction; that work's id, or None if no work is open.

    The work row is locked (``FOR UPDATE``) while the message is added, so a message and
    the work's end are ordered: the worker's ``finish`` waits for this transaction, or
    this finds the work ended (and adds nothing). A waiter that reads the work's result
    after it ended therefore sees every message ever accepted for it -- and messages of
    one work item commit in id order. ``admit`` is given, under that lock, how many
    messages the work has taken and their bytes (UTF-8); it raises to refuse this one
    (nothing is added), so concurrent senders cannot pass a bound it keeps."""
    while True:
        row = conn.execute(
            f"SELECT id FROM cantrip_work WHERE entity_id = %s AND {OPEN} "
            "ORDER BY id LIMIT 1 FOR UPDATE",
            (entity_id,),
        ).fetchone()
        if row is not None:
            break
        # the row found ended while we waited for its lock: is another open (queued)?
        more = conn.execute(
            f"SELECT 1 FROM cantrip_work WHERE entity_id = %s AND {OPEN} LIMIT 1", (entity_id,)
        ).fetchone()
        if more is None:
            return None
    if admit is not None:
        sent, size = conn.execute(
            "SELECT count(*), coalesce(sum(octet_length(text)), 0) FROM cantrip_messages "
            "WHERE work_id = %s",
            (row[0],),
        ).fetchone()
        admit(int(sent), int(size))
    conn.execute(
        "INSERT INTO cantrip_messages (entity_id, work_id, text) VALUES (%s, %s, %s)",
        (entity_id, row[0], text),
    )
    conn.execute("SELECT pg_notify(%s, %s)", (STEER_CHANNEL, entity_id))
    return int(row[0])


def messages_on(conn: Any, work_id: int, after: int = 0) -> list[tuple[int, str]]:
    """(id, text) of the messages sent to ``work_id`` with an id above ``after``, in order."""
    rows = conn.execute(
        "SELECT id, text FROM cantrip_messages WHERE work_id = %s AND id > %s ORDER BY id",
        (work_id, after),
    ).fetchall()
    return [(int(i), str(t)) for i, t in rows]


@attrs.frozen
class Claim:
    """A work item this worker now owns, under ``fence``."""

    work_id: int
    entity_id: str
    intent: str
    spell: dict[str, Any]
    fence: Fence
    attempt: int
    """The attempts this work item has cost: 1 on the first claim, one more for each
    claim after a run that stopped without an outcome -- except after a worker died
    holding it beside other casts (a bystander's recovery is free)."""
    base_turn: str | None
    """The entity's latest turn before this cast began (None: none, or not yet known)."""
    claim_latency_s: float
    """From enqueue to this claim (the queue's own clock)."""
    resumed: bool = False
    """An earlier claim ran it and stopped without an outcome: the loom and the gate
    journal may hold part of the cast."""
    quarantined: bool = False
    """A suspect (in a crash of a worker that held it among others): this worker runs
    it alone until it records a turn (:meth:`WorkQueue.cleared`) -- or, if it was cleared
    once already (``paroled``), until it ends."""
    paroled: bool = False
    """Cleared once before, then in a crash again: no second parole -- a cast that kills
    its worker a turn after each resume (its killing call journaled as started, its turn
    then recorded with that call's outcome unknown) must not walk free every time."""
