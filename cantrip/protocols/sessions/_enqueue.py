"""The statements that put ``serve --db`` prompts on the queue, many in one transaction.

A prompt is one work item (:func:`~cantrip.distributed._work.enqueue_on`) and one row of
``cantrip_prompts``, written under a transaction-scoped advisory lock on its entity
after the rules of :mod:`~cantrip.protocols.sessions._rows` (keys, double-texting,
armed cancels). :func:`queue_prompts` writes a whole batch of them in the caller's
transaction -- one commit for all (issue 46.1):

* every entity's lock first, in one statement and in the locks' order, so that two
  replicas' batches cannot deadlock on each other;
* one read of what each prompt meets: its session (whether there is one -- ``not_found``
  if not, before any other rule -- and its user, the ``user`` tag its cast is queued
  with), open work, an armed cancel, a key seen before. The session is checked here,
  under its entity's lock, not read by the request beforehand (issue 46: a prompt
  read its session three times);
  the *plain* prompts -- nothing met, their entity once in the batch, nothing written
  beside them -- are written together, a statement for their work items and one for
  their rows, in a savepoint;
* every other prompt (and each plain one again, should their savepoint fail) on its
  own, in a savepoint of its own, after the full rules.

So a batch costs a handful of round trips however many plain prompts it holds, and a
prompt that fails -- ``busy``, ``key_reused``, a constraint, input the database cannot
hold -- undoes only itself: its exception is its outcome, in its place.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from cantrip.distributed._work import (
    CWD_KEY,
    ENTITY_LOCK,
    INTERRUPTED,
    OPEN,
    REWIND_KEY,
    USER_KEY,
    cancel_on,
    enqueue_many_on,
    enqueue_on,
)
from cantrip.loom._model import RUNTIME_CANTRIPS
from cantrip.loom._postgres_schema import LAST_POS
from cantrip.protocols.sessions._backend import SessionError
from cantrip.protocols.sessions._hub import session_id_for

PROMPT_PREFIX = "work-"
"""A replica's prompt id is its work item's id (any replica can resolve it)."""


@attrs.frozen
class PromptRequest:
    """A prompt to queue (:func:`queue_prompts`)."""

    entity_id: str
    spell: dict[str, Any]
    intent: str
    key: str | None = None
    """Its ``Idempotency-Key``, if it came with one."""
    on_busy: str = "reject"
    also: Callable[[Any, int], None] | None = None
    """What to write with it, in its savepoint (connection, work id): an A2A task row."""
    session: str | None = None
    """The session as the caller named it (an unknown one's ``not_found`` says so);
    None: its entity's session id."""

    def unknown(self) -> SessionError:
        return unknown_session(self.session or session_id_for(self.entity_id))


@attrs.frozen
class Queued:
    """A prompt on the queue (new, or the one its Idempotency-Key named)."""

    work_id: int
    replayed: bool
    """True when the key named a prompt enqueued earlier (nothing new was queued)."""

    @property
    def prompt_id(self) -> str:
        return prompt_id_for(self.work_id)


def unknown_session(session_id: str) -> SessionError:
    """The ``not_found`` of a session the database does not know."""
    return SessionError("not_found", f"unknown session {session_id!r}")


def known_session(entity: str) -> str:
    """SQL: whether the entity ``entity`` (an SQL expression) is a session's -- a row of
    ``cantrip_sessions``, or a top-level entity the loom holds that is not the runtime's
    own (one ``cantrip cast --db`` enqueued). It takes the parameter ``%(runtime)s``:
    :data:`RUNTIME_PARAMS`. Both the batch and a session's read ask it so."""
    return (
        f"(EXISTS (SELECT 1 FROM cantrip_sessions WHERE entity_id = {entity}) "
        f"OR EXISTS (SELECT 1 FROM cantrip_entities WHERE entity_id = {entity} "
        "AND parent_entity_id IS NULL AND NOT starts_with("
        "data::jsonb->>'cantrip_id', %(runtime)s)))"
    )


RUNTIME_PARAMS = {"runtime": RUNTIME_CANTRIPS}


def prompt_id_for(work_id: int) -> str:
    return f"{PROMPT_PREFIX}{work_id}"


def work_id_for(prompt_id: str) -> int | None:
    """The work item a prompt id names; None for an id no replica hands out."""
    digits = prompt_id.removeprefix(PROMPT_PREFIX)
    if prompt_id.startswith(PROMPT_PREFIX) and digits.isdigit() and len(digits) < 19:
        return int(digits)
    return None


def queue_prompts(conn: Any, prompts: Sequence[PromptRequest]) -> list[Queued | Exception]:
    """Queue ``prompts`` in the transaction open on ``conn`` (see the module docstring);
    each one's outcome in its place. A connection lost meanwhile is raised: the batch
    fails as a whole."""
    if not prompts:
        return []
    conn.execute(
        "SELECT count(pg_advisory_xact_lock(%s, h)) FROM (SELECT DISTINCT hashtext(e) AS h "
        "FROM unnest(%s::text[]) AS e ORDER BY h) AS locks",
        (ENTITY_LOCK, sorted({p.entity_id for p in prompts})),
    )
    import psycopg

    outcomes: dict[int, Queued | Exception] = {}
    met = _meet(conn, prompts)
    for index, (prompt, meets) in enumerate(zip(prompts, met, strict=True)):
        if not meets.known:  # before every other rule, as a session read first was
            outcomes[index] = prompt.unknown()
    prompts = [_for_session(p, m) for p, m in zip(prompts, met, strict=True)]
    plain = _plain(prompts, met)
    if plain:
        try:
            with conn.transaction():  # a savepoint: should it fail, each goes on its own
                outcomes.update(_queue_plain(conn, prompts, plain))
        except (psycopg.Error, ValueError):  # a row the database refused, a spell that
            if conn.broken or conn.closed:  # holds a credential: each is tried alone below
                raise  # (and fails alone); a lost connection is the batch's
    for index, prompt in enumerate(prompts):
        if index in outcomes:
            continue
        try:
            with conn.transaction():  # a savepoint: this prompt's own
                outcomes[index] = _queue_one(conn, prompt)
        except Exception as exc:  # its outcome, raised to its own caller
            if conn.broken or conn.closed:  # the batch's, not this prompt's
                raise
            outcomes[index] = exc
    return [outcomes[index] for index in range(len(prompts))]


@attrs.frozen
class _Meets:
    """What one prompt of a batch meets (:func:`_meet`)."""

    known: bool
    """Its session exists."""
    user: str | None
    """Its session's user (the ``user`` tag of its casts)."""
    cwd: str | None
    """Its session's working directory (the ``cwd`` tag of its casts)."""
    busy: bool
    """Its entity has open work."""
    seen: bool
    """An armed cancel of the next prompt, or its key named a prompt or a cancel."""


def _meet(conn: Any, prompts: Sequence[PromptRequest]) -> list[_Meets]:
    """What each prompt meets, in one read for the whole batch: its session (is there
    one, its user and working directory), open work, an armed cancel, a key seen before."""
    rows = conn.execute(
        f"SELECT {known_session('p.e')}, "
        "(SELECT s.user_id FROM cantrip_sessions s WHERE s.entity_id = p.e), "
        "(SELECT s.workdir FROM cantrip_sessions s WHERE s.entity_id = p.e), "
        "EXISTS (SELECT 1 FROM cantrip_work w WHERE w.entity_id = p.e "
        f"AND w.{OPEN}), "
        "EXISTS (SELECT 1 FROM cantrip_sessions s WHERE s.entity_id = p.e "
        "AND s.cancel_until IS NOT NULL) "
        "OR EXISTS (SELECT 1 FROM cantrip_prompts c WHERE c.entity_id = p.e "
        "AND c.idempotency_key = p.k) "
        "OR EXISTS (SELECT 1 FROM cantrip_cancels x WHERE x.entity_id = p.e "
        "AND x.idempotency_key = p.k) "
        "FROM unnest(%(e)s::text[], %(k)s::text[]) WITH ORDINALITY AS p(e, k, n) "
        "ORDER BY p.n",
        {
            "e": [p.entity_id for p in prompts],
            "k": [p.key for p in prompts],
            **RUNTIME_PARAMS,
        },
    ).fetchall()
    return [_Meets(bool(k), u, w, bool(b), bool(s)) for k, u, w, b, s in rows]


def _for_session(prompt: PromptRequest, met: _Meets) -> PromptRequest:
    """The prompt with its session's user and working directory in its spell: the
    worker casts with them as the ``user`` tag (a memory namespace's ``{user}``) and
    the ``cwd`` tag (where an ACP session was created)."""
    spell = dict(prompt.spell)
    if met.user is not None:
        spell[USER_KEY] = met.user
    if met.cwd is not None:
        spell[CWD_KEY] = met.cwd
    return prompt if spell == prompt.spell else attrs.evolve(prompt, spell=spell)


def _plain(prompts: Sequence[PromptRequest], met: Sequence[_Meets]) -> list[int]:
    """The indexes of the prompts that meet nothing: their session exists, their
    entity is once in the batch, has no open work (or the prompt queues behind it) and
    no armed cancel of its next prompt, their key (if any) names no prompt and no
    armed cancel, and nothing is written beside them."""
    counts: dict[str, int] = {}
    for prompt in prompts:
        counts[prompt.entity_id] = counts.get(prompt.entity_id, 0) + 1
    return [
        index
        for index, (prompt, meets) in enumerate(zip(prompts, met, strict=True))
        if meets.known
        and counts[prompt.entity_id] == 1
        and prompt.also is None
        and not meets.seen
        and (not meets.busy or prompt.on_busy == "enqueue")
    ]


def _queue_plain(
    conn: Any, prompts: Sequence[PromptRequest], plain: list[int]
) -> dict[int, Queued]:
    """Write the plain prompts: their work items a statement per spell (most share the
    served one), then their rows in one statement, each with its entity's loom position
    now."""
    by_spell: dict[str, list[int]] = {}
    for index in plain:
        by_spell.setdefault(json.dumps(prompts[index].spell, sort_keys=True), []).append(index)
    work: dict[int, int] = {}
    for indexes in by_spell.values():
        spell = prompts[indexes[0]].spell
        queued = enqueue_many_on(
            conn, spell, [(prompts[i].entity_id, prompts[i].intent) for i in indexes]
        )
        work.update({i: queued[prompts[i].entity_id] for i in indexes})
    conn.execute(
        "INSERT INTO cantrip_prompts (work_id, entity_id, idempotency_key, intent, base_pos) "
        f"SELECT w, e, k, i, {LAST_POS.format(entity='p.e')} "
        "FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::text[]) AS p(w, e, k, i)",
        (
            [work[i] for i in plain],
            [prompts[i].entity_id for i in plain],
            [prompts[i].key for i in plain],
            [prompts[i].intent for i in plain],
        ),
    )
    return {i: Queued(work[i], replayed=False) for i in plain}


def _queue_one(conn: Any, prompt: PromptRequest) -> Queued:
    """Queue one prompt after the full rules, on ``conn`` under its entity's lock.

    A key this entity has seen returns that prompt (``key_reused`` if its intent
    differs). A session with open work follows ``on_busy``
    (:mod:`~cantrip.protocols.sessions._rows`): ``busy`` for ``reject``. An armed cancel
    of the next prompt, or one that named this prompt's key, makes it cancelled before
    it starts. ``also`` (connection, work id) writes what must exist exactly when the
    prompt does -- an A2A task row -- in the same transaction: both are stored or
    neither."""
    entity_id, intent, key = prompt.entity_id, prompt.intent, prompt.key
    if key is not None:
        seen = conn.execute(
            "SELECT work_id, intent FROM cantrip_prompts "
            "WHERE entity_id = %s AND idempotency_key = %s",
            (entity_id, key),
        ).fetchone()
        if seen is not None:
            if seen[1] != intent:
                raise SessionError(
                    "key_reused",
                    f"Idempotency-Key {key!r} was used for a different prompt on this session",
                )
            return Queued(int(seen[0]), replayed=True)
    spell = _make_way(conn, entity_id, prompt.spell, prompt.on_busy)
    sticky = conn.execute(
        "SELECT cancel_until > clock_timestamp() FROM cantrip_sessions "
        "WHERE entity_id = %s AND cancel_until IS NOT NULL",
        (entity_id,),
    ).fetchone()
    if sticky is not None:  # used now, or expired unused: either way disarmed
        conn.execute(
            "UPDATE cantrip_sessions SET cancel_until = NULL WHERE entity_id = %s", (entity_id,)
        )
    base = conn.execute(f"SELECT {LAST_POS.format(entity='%s')}", (entity_id,)).fetchone()
    base_pos = int(base[0]) if base else 0
    named = None
    if key is not None:
        named = conn.execute(
            "DELETE FROM cantrip_cancels WHERE entity_id = %s AND idempotency_key = %s"
            " RETURNING until > clock_timestamp()",
            (entity_id, key),
        ).fetchone()
    work_id = enqueue_on(conn, spell, intent, entity_id)
    if (sticky is not None and sticky[0]) or (named is not None and named[0]):
        # a cancel asked for the next prompt, or named this one before it came
        conn.execute(
            "UPDATE cantrip_work SET state = 'cancelled', finished_at = clock_timestamp(),"
            ' result = \'{"reason": "cancelled"}\' WHERE id = %s',
            (work_id,),
        )
    conn.execute(
        "INSERT INTO cantrip_prompts (work_id, entity_id, idempotency_key, intent, "
        "base_pos) VALUES (%s, %s, %s, %s, %s)",
        (work_id, entity_id, key, intent, base_pos),
    )
    if prompt.also is not None:
        prompt.also(conn, work_id)
    return Queued(work_id, replayed=False)


def _make_way(conn: Any, entity_id: str, spell: dict[str, Any], on_busy: str) -> dict[str, Any]:
    """Double-texting, under the entity's lock: what a new prompt does about the one
    running (its oldest open work item, locked here so no worker claims it meanwhile).
    Returns the spell to queue the new prompt with (a ``rollback`` carries its rewind
    point)."""
    running = conn.execute(
        "SELECT id, attempts, (result::json)->>'base_turn', result IS NOT NULL "
        f"FROM cantrip_work WHERE entity_id = %s AND {OPEN} ORDER BY id LIMIT 1 FOR UPDATE",
        (entity_id,),
    ).fetchone()
    if running is None or on_busy == "enqueue":
        return spell
    if on_busy == "reject":
        raise SessionError("busy", f"session {session_id_for(entity_id)} is already "
                           "running a prompt")  # fmt: skip
    if on_busy not in ("interrupt", "rollback"):
        raise ValueError(f"unknown on_busy policy {on_busy!r}")
    work_id, attempts, base_turn, claimed = running
    cancel_on(conn, entity_id, work_id=int(work_id), reason=INTERRUPTED)
    if on_busy == "rollback" and int(attempts) > 0 and claimed:
        # it began from base_turn (None: the entity's beginning); never claimed, it
        # never ran: it is cancelled before it starts, nothing to roll back
        return {**spell, REWIND_KEY: {"to": base_turn}}
    return spell
