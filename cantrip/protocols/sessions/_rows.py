"""HTTP sessions kept in PostgreSQL, so any ``cantrip serve --db`` replica serves any session.

A replica runs no entity: a session is a row naming its entity, a prompt is
work on the queue (:mod:`cantrip.distributed._queue`) that a ``cantrip worker`` runs, and
what the session did is read from the PostgreSQL loom by query. Two small
tables of our own, created beside the queue's:

* ``cantrip_sessions`` -- session id -> entity id, and a cancel of the next prompt
  (``cancel_until``, asked for with ``next``) that applies to the next prompt
  enqueued before it;
* ``cantrip_cancels`` -- cancels that named an Idempotency-Key no prompt had yet:
  the prompt enqueued with that key before ``until`` is cancelled at once;
* ``cantrip_prompts`` -- one row per prompt a replica enqueued: its work id,
  its ``Idempotency-Key`` (unique per entity), its intent, and ``base_pos``,
  the loom position of the entity's last turn when it was enqueued (the cast's
  turns are the entity's turns after the position its work item records at its
  first claim, ``cantrip_work.base_pos``; this one is the fallback for work claimed
  before that column existed).

Messages sent to a running prompt (``/messages``) are rows of the loom's
``cantrip_messages`` (:func:`~cantrip.distributed._work.steer_on`): the worker running
the prompt hands them to the cast in order, and the loom says how many joined a turn
(``extras.steering``), so the rest -- arrived as the cast ended -- are the result's
``undelivered``: nothing is lost, and nothing needs a "taken" flag that could disagree
with the loom.

A second prompt while one runs follows its ``on_busy`` policy (double-texting), decided
in the same transaction as the queueing: ``reject`` (``busy``), ``enqueue`` (queued
behind it: a worker claims an entity's work in order), ``interrupt`` (the running prompt
is cancelled with reason ``interrupted``, then this one runs) and ``rollback`` (the same,
and the work item carries the turn the cancelled prompt began from: its worker rewinds
the entity there before the cast).

Every change to one entity's prompts runs in one transaction under a
transaction-scoped advisory lock on the entity, so two replicas cannot both
enqueue a prompt for a busy session, nor both record the same key. Prompts are
queued many to a transaction, each in a savepoint of its own
(:mod:`~cantrip.protocols.sessions._enqueue`, issue 46.1).

Every method is blocking (psycopg); the HTTP app calls them through
``trio.to_thread`` behind the store's ``CapacityLimiter``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from cantrip._outcome import CastResult, recorded_cast
from cantrip.distributed._pauses import answer_on, live_pending_on
from cantrip.distributed._queue import WorkQueue
from cantrip.distributed._work import (
    ANSWER_KEY,
    ENDED,
    ENTITY_LOCK,
    OPEN,
    PAUSED,
    cancel_on,
    messages_on,
    steer_on,
)
from cantrip.loom._indexed import TURN_ROW
from cantrip.loom._model import Turn, new_entity_id
from cantrip.loom._postgres import PostgresStore
from cantrip.loom._postgres_schema import LAST_POS, TURNS_AFTER
from cantrip.protocols.sessions import _steering as steering
from cantrip.protocols.sessions._backend import same_user
from cantrip.protocols.sessions._enqueue import (
    RUNTIME_PARAMS,
    PromptRequest,
    Queued,
    known_session,
    prompt_id_for,
    queue_prompts,
    unknown_session,
    work_id_for,
)
from cantrip.protocols.sessions._hub import (
    MAX_ARMED_KEYS,
    SessionError,
    entity_id_for,
    not_running,
    session_id_for,
    steered,
)
from cantrip.protocols.sessions._idempotency import session_entity_id

_SCHEMA_LOCK = 0x73657276  # "serv": schema creation, once per database
_ENTITY_LOCK = ENTITY_LOCK  # "prom": the advisory-lock class of one entity's prompts (and answers)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS cantrip_sessions (
    session_id TEXT PRIMARY KEY,
    entity_id TEXT UNIQUE NOT NULL,
    cancel_until TIMESTAMPTZ,
    created_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS cantrip_sessions_by_age ON cantrip_sessions (created_at);
ALTER TABLE cantrip_sessions ADD COLUMN IF NOT EXISTS user_id TEXT;
ALTER TABLE cantrip_sessions ADD COLUMN IF NOT EXISTS workdir TEXT;
CREATE TABLE IF NOT EXISTS cantrip_cancels (
    entity_id TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    until TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (entity_id, idempotency_key)
);
CREATE TABLE IF NOT EXISTS cantrip_prompts (
    work_id BIGINT PRIMARY KEY,
    entity_id TEXT NOT NULL,
    idempotency_key TEXT,
    intent TEXT NOT NULL,
    base_pos BIGINT NOT NULL,
    UNIQUE (entity_id, idempotency_key)
);
"""

_TURNS_AFTER = (
    f"SELECT pos, {TURN_ROW} FROM cantrip_turns WHERE entity_id = %(e)s "
    f"AND {TURNS_AFTER.format(entity='%(e)s', pos='%(p)s')} ORDER BY sequence"
)
"""An entity's turns recorded after a loom position (:meth:`DbSessions.turns_after`)."""
_LAST_POS = f"SELECT {LAST_POS.format(entity='%s')}"
"""The loom position of an entity's latest turn (:meth:`DbSessions.last_pos`)."""
POS_OF = "SELECT pos FROM cantrip_turns WHERE entity_id = %s ORDER BY sequence OFFSET %s LIMIT 1"
"""The loom position of an entity's turn after its first ``n`` (parameters: entity, n)."""
__all__ = [
    "ENDED",
    "DbSessions",
    "Progress",
    "Queued",
    "SessionRow",
    "failure_message",
    "prompt_id_for",
]
LIST_LIMIT = 1000
"""``GET /sessions`` lists the most recent sessions, at most this many."""


@attrs.frozen
class SessionRow:
    """A session as the database knows it."""

    session_id: str
    entity_id: str
    running: bool
    turns: int
    user: str | None = None
    """The ``user`` tag of its casts, fixed at creation (a memory namespace's ``{user}``)."""
    cwd: str | None = None
    """The ``cwd`` tag of its casts: where it was created (column ``workdir``)."""

    def info(self) -> dict[str, Any]:
        """The ``SessionInfo`` shape of the in-process server."""
        return {
            "session_id": self.session_id,
            "entity_id": self.entity_id,
            "running": self.running,
            "turns": self.turns,
        }


@attrs.frozen
class Progress:
    """Where a work item is: its state, its outcome once it ended, and the loom position
    its cast began after (None until a worker first claimed it: no turn of it yet)."""

    state: str
    outcome: dict[str, Any] | None
    base_pos: int | None
    entity_id: str | None = None
    """The entity it is work of (a waiter checks the prompt is its session's with the
    same read)."""

    @property
    def ended(self) -> bool:
        return self.state in ENDED


class DbSessions:
    """Sessions, prompts, cancels and reads for ``cantrip serve --db``."""

    def __init__(self, store: PostgresStore, sticky_cancel_s: float = 5.0) -> None:
        self.store = store
        self.queue = WorkQueue(store)
        self.sticky_cancel_s = sticky_cancel_s
        with store.pool.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            conn.execute(_SCHEMA)

    # -- sessions ----------------------------------------------------------------

    def create(
        self, key: str | None, user: str | None = None, cwd: str | None = None
    ) -> tuple[SessionRow, bool]:
        """A new session, or with a key the session that key created (any replica,
        any time before); the flag says whether it is new. ``user`` and ``cwd`` are kept
        with it (a key naming a session of another user: ``user_conflict``)."""
        entity_id = session_entity_id(key) if key is not None else new_entity_id()
        session_id = session_id_for(entity_id)
        with self.store.pool.connection() as conn:
            inserted = conn.execute(
                "INSERT INTO cantrip_sessions (session_id, entity_id, user_id, workdir) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING 1",
                (session_id, entity_id, user, cwd),
            ).fetchone()
        row = self.get(session_id)
        assert row is not None
        if inserted is None:
            same_user(session_id, row.user, user)
        return row, inserted is not None

    def get(self, session_id: str) -> SessionRow | None:
        """The session (a top-level entity the loom holds counts too: one enqueued by
        ``cantrip cast --db``), or None."""
        entity_id = entity_id_for(session_id)
        with self.store.pool.connection() as conn:
            row = conn.execute(
                f"SELECT {known_session('%(e)s')}, "
                "(SELECT count(*) FROM cantrip_turns WHERE entity_id = %(e)s), "
                f"EXISTS (SELECT 1 FROM cantrip_work WHERE entity_id = %(e)s AND {OPEN}), "
                "(SELECT user_id FROM cantrip_sessions WHERE entity_id = %(e)s), "
                "(SELECT workdir FROM cantrip_sessions WHERE entity_id = %(e)s)",
                {"e": entity_id, **RUNTIME_PARAMS},
            ).fetchone()
        assert row is not None
        known, turns, running, user, cwd = row
        if not known:
            return None
        return SessionRow(
            session_id_for(entity_id), entity_id, bool(running), int(turns), user, cwd
        )

    def require(self, session_id: str) -> SessionRow:
        row = self.get(session_id)
        if row is None:
            raise unknown_session(session_id)
        return row

    def all(self) -> list[SessionRow]:
        with self.store.pool.connection() as conn:
            rows = conn.execute(
                "SELECT s.session_id, s.entity_id, "
                "(SELECT count(*) FROM cantrip_turns t WHERE t.entity_id = s.entity_id), "
                "EXISTS (SELECT 1 FROM cantrip_work w WHERE w.entity_id = s.entity_id "
                f"AND w.{OPEN}), s.user_id, s.workdir "
                "FROM (SELECT * FROM cantrip_sessions ORDER BY created_at DESC LIMIT %s) s "
                "ORDER BY s.created_at",
                (LIST_LIMIT,),
            ).fetchall()
        return [SessionRow(s, e, bool(r), int(n), u, c) for s, e, n, r, u, c in rows]

    def count(self) -> int:
        with self.store.pool.connection() as conn:
            row = conn.execute("SELECT count(*) FROM cantrip_sessions").fetchone()
        return int(row[0]) if row else 0

    # -- prompts -----------------------------------------------------------------

    def enqueue(
        self,
        entity_id: str,
        spell: dict[str, Any],
        intent: str,
        key: str | None,
        on_busy: str = "reject",
        also: Callable[[Any, int], None] | None = None,
    ) -> Queued:
        """Queue one prompt (a batch of one, :meth:`enqueue_batch`); its failure raised."""
        [outcome] = self.enqueue_batch(
            [PromptRequest(entity_id, spell, intent, key, on_busy, also)]
        )
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def enqueue_batch(self, prompts: Sequence[PromptRequest]) -> list[Queued | Exception]:
        """Queue many prompts in one transaction -- one commit for all (issue 46.1); each
        one's outcome in its place, a prompt that failed alone as its exception
        (:func:`~cantrip.protocols.sessions._enqueue.queue_prompts`). A lost connection,
        or a commit that fails, is raised: nothing of the batch was queued."""
        with self.store.pool.connection() as conn, conn.transaction():
            return queue_prompts(conn, prompts)

    # -- steering ----------------------------------------------------------------

    def steer(self, entity_id: str, text: str) -> dict[str, Any]:
        """A message for the session's running prompt (its open work; ``not_running``
        if none): the worker running it hands it to the cast, which takes it into its
        next turn. One that arrives as the cast ends comes back in the prompt's result
        (``undelivered``); see :func:`~cantrip.distributed._work.steer_on`. The work
        takes what :mod:`._steering` allows one cast (``steering_full`` beyond it),
        counted under the work row's lock with the insert."""
        text = text.strip()

        def admit(sent: int, sent_bytes: int) -> None:  # under the work row's lock
            why = steering.refusal(sent, sent_bytes, text)
            if why is not None:
                raise SessionError(steering.FULL, why)

        with self.store.pool.connection() as conn, conn.transaction():
            if steer_on(conn, entity_id, text, admit) is None:
                raise not_running(session_id_for(entity_id))
        return steered()

    # -- pauses ------------------------------------------------------------------

    def pending(self, entity_id: str) -> list[dict[str, Any]]:
        """The calls the session's cast waits on a human for (its work ended paused)."""
        return self.queue.pending(entity_id)

    def live_pending(self, entity_id: str) -> list[dict[str, Any]]:
        """The pauses the session's running cast waits on in place (a child's)."""
        with self.store.pool.connection() as conn:
            return live_pending_on(conn, entity_id)

    def answer(self, entity_id: str, pause_id: str, decision: dict[str, Any]) -> Queued:
        """Record the answer and queue its carrying-out, in one transaction under the
        entity's lock: of two answers to one pause (any replicas, any moment) one is
        queued and the other is a :class:`~cantrip.PauseError`. The continued cast's
        turns are the entity's turns after ``base_pos``. ``replayed`` here means the
        answer went to a running prompt whose tree waits in place (a child's pause):
        that prompt answers, nothing new was queued."""
        with self.store.pool.connection() as conn, conn.transaction():
            answered = answer_on(conn, entity_id, pause_id, decision)  # takes the lock
        return Queued(answered.work_id, replayed=answered.live)

    def answered(self, entity_id: str, pause_id: str, decision: dict[str, Any]) -> int | None:
        """The work carrying out ``decision`` on ``pause_id``, if that very answer was
        recorded (an answer sent again finds its own; another decision finds none)."""
        with self.store.pool.connection() as conn:
            row = conn.execute(
                "SELECT q.id, q.spell FROM cantrip_work w JOIN cantrip_work q "
                "ON q.id = ((w.result::json)->'answered'->>'work_id')::bigint "
                "WHERE w.entity_id = %s AND w.state = %s "
                "AND (w.result::json)->'answered'->>'pause_id' = %s ORDER BY w.id DESC LIMIT 1",
                (entity_id, PAUSED, pause_id),
            ).fetchone()
        if row is None:
            return None
        carried = json.loads(row[1]).get(ANSWER_KEY) or {}
        return int(row[0]) if carried.get("decision") == decision else None

    def progress(self, work_id: int) -> Progress:
        """The work item's state, outcome (once ended), base position and entity, in
        one query."""
        found = self.progress_of([work_id]).get(work_id)
        if found is None:
            raise LookupError(f"no work item {work_id}")
        return found

    def progress_of(self, work_ids: Sequence[int]) -> dict[int, Progress]:
        """:meth:`progress` of many work items in one query (those that exist): the looks
        of many waiters at once share it (:mod:`._looks`)."""
        with self.store.pool.connection() as conn:
            rows = conn.execute(
                "SELECT w.id, w.state, w.result, w.attempts, coalesce(w.base_pos, p.base_pos), "
                "w.entity_id "
                "FROM cantrip_work w LEFT JOIN cantrip_prompts p ON p.work_id = w.id "
                "WHERE w.id = ANY(%s)",
                (list(work_ids),),
            ).fetchall()
        found: dict[int, Progress] = {}
        for work_id, state, result, attempts, base, entity_id in rows:
            outcome = json.loads(result) if state in ENDED and result else None
            based = int(base) if attempts and base is not None else None
            found[int(work_id)] = Progress(state, outcome, based, entity_id)
        return found

    def outcome(
        self, entity_id: str, work_id: int, base_pos: int | None
    ) -> tuple[CastResult | None, list[str]]:
        """The work's cast, rebuilt from the loom (usage, cost, summary and all) from its
        turns after ``base_pos`` (to the next cast's first turn) -- None if it recorded no
        turn (cancelled before it began) -- and the messages sent to it that joined no
        turn (``undelivered``)."""
        turns = [] if base_pos is None else [t for _, t in self.turns_after(entity_id, base_pos)]
        with self.store.pool.connection() as conn:
            sent = [text for _, text in messages_on(conn, work_id)]
        cast = recorded_cast(turns, 0, self.store) if turns else None
        # its own turns only: a prompt queued behind it may have begun already
        joined = sum(len(t.extras.get("steering") or ()) for t in cast.turns) if cast else 0
        undelivered = sent[joined:]  # a worker hands them to the cast in order
        if cast is not None and undelivered:
            cast = attrs.evolve(cast, undelivered=tuple(undelivered))
        return cast, undelivered

    def turns_after(self, entity_id: str, pos: int) -> list[tuple[int, Turn]]:
        """The entity's turns recorded after loom position ``pos`` (tailing the loom),
        read as every reader of the loom reads them: a big value stored apart is read
        back whole (the store's decoder), never told as the reference in its place."""
        with self.store.pool.connection() as conn:
            rows = conn.execute(_TURNS_AFTER, {"e": entity_id, "p": pos}).fetchall()
        return [(int(r[0]), self.store._read_turn(r[1:])) for r in rows]

    def last_pos(self, entity_id: str) -> int:
        with self.store.pool.connection() as conn:
            row = conn.execute(_LAST_POS, (entity_id,)).fetchone()
        return int(row[0]) if row else 0

    def thread(self, entity_id: str) -> list[Turn]:
        """The session's thread, root first: a recursive query from its latest turn."""
        last = self.store.last_turn(entity_id)
        return self.store.thread(last.id) if last is not None else []

    # -- cancel ------------------------------------------------------------------

    def cancel(
        self,
        entity_id: str,
        prompt_id: str | None = None,
        key: str | None = None,
        next_prompt: bool = False,
    ) -> dict[str, Any]:
        """Cancel a prompt of the session through the queue; the ``Cancelled`` answer.
        The in-process server's rules (:meth:`SessionHub.request_cancel`), held in
        the database so a cancel at any replica targets the same prompt.

        Running work is flagged and its worker told (NOTIFY, heartbeat poll as the
        fallback): it cuts the cast off and records it as cancelled. Queued work is
        cancelled before any worker takes it. Named (``prompt_id``: the work id;
        ``key``): only that prompt, if open; a key no prompt had yet is armed for
        ``sticky_cancel_s``. Unnamed: the oldest open prompt (the running one) only,
        as in process -- prompts queued behind it stay. Unnamed with nothing open: nothing, unless
        ``next_prompt`` (then a prompt enqueued within ``sticky_cancel_s`` never
        starts)."""
        named = prompt_id is not None or key is not None
        with self.store.pool.connection() as conn, conn.transaction():
            _lock(conn, entity_id)
            rows = conn.execute(
                "SELECT w.id, w.state, w.attempts, w.intent, p.idempotency_key "
                "FROM cantrip_work w LEFT JOIN cantrip_prompts p ON p.work_id = w.id "
                f"WHERE w.entity_id = %s AND w.{OPEN} ORDER BY w.id",
                (entity_id,),
            ).fetchall()
            wanted = work_id_for(prompt_id) if prompt_id is not None else None
            if prompt_id is not None and wanted is None:
                return {"cancelled": False, "target": "none", "prompt_id": prompt_id}
            if key is not None:
                keyed = conn.execute(
                    "SELECT work_id FROM cantrip_prompts WHERE entity_id = %s "
                    "AND idempotency_key = %s",
                    (entity_id, key),
                ).fetchone()
                if keyed is not None and wanted not in (None, int(keyed[0])):
                    return {"cancelled": False, "target": "none", "prompt_id": prompt_id}
                if keyed is not None:
                    wanted = int(keyed[0])
                elif wanted is None:  # a prompt with this key may yet come: armed for it
                    return self._arm_key(conn, entity_id, key)
            hit = [r for r in rows if wanted is None or int(r[0]) == wanted]
            if not hit:
                if named:  # the prompt named is not open: it ended, or is unknown
                    ended = conn.execute(
                        "SELECT 1 FROM cantrip_work WHERE id = %s AND entity_id = %s",
                        (wanted, entity_id),
                    ).fetchone()
                    answer = {"cancelled": False, "target": "ended" if ended else "none"}
                    return {
                        **answer,
                        "prompt_id": prompt_id_for(wanted or 0),
                        "idempotency_key": key,
                    }
                if not next_prompt:
                    return {"cancelled": False, "target": "none"}
                conn.execute(
                    "UPDATE cantrip_sessions SET cancel_until = clock_timestamp() + "
                    "%s * interval '1 second' WHERE entity_id = %s",
                    (self.sticky_cancel_s, entity_id),
                )
                return {"cancelled": False, "target": "next", "sticky_s": self.sticky_cancel_s}
            work_id, state, attempts, intent, work_key = hit[0]
            # that work item only: others of the session may wait behind it (enqueue)
            cancel_on(conn, entity_id, work_id=int(work_id))
        target = "queued" if state == "queued" and int(attempts) == 0 else "running"
        return {
            "cancelled": True,
            "target": target,
            "prompt_id": prompt_id_for(int(work_id)),
            "intent": intent,
            "idempotency_key": work_key,
        }

    def _arm_key(self, conn: Any, entity_id: str, key: str) -> dict[str, Any]:
        """Arm a cancel for the prompt that comes with ``key`` (expired ones go)."""
        conn.execute(
            "DELETE FROM cantrip_cancels WHERE entity_id = %s AND until < clock_timestamp()",
            (entity_id,),
        )
        conn.execute(
            "INSERT INTO cantrip_cancels (entity_id, idempotency_key, until) VALUES "
            "(%s, %s, clock_timestamp() + %s * interval '1 second') ON CONFLICT "
            "(entity_id, idempotency_key) DO UPDATE SET until = excluded.until",
            (entity_id, key, self.sticky_cancel_s),
        )
        conn.execute(  # bounded per session, as in process: the oldest go
            "DELETE FROM cantrip_cancels WHERE entity_id = %(e)s AND idempotency_key NOT IN "
            "(SELECT idempotency_key FROM cantrip_cancels WHERE entity_id = %(e)s "
            "ORDER BY until DESC LIMIT %(n)s)",
            {"e": entity_id, "n": MAX_ARMED_KEYS},
        )
        return {
            "cancelled": False,
            "target": "next",
            "idempotency_key": key,
            "sticky_s": self.sticky_cancel_s,
        }


def failure_message(outcome: dict[str, Any] | None) -> str:
    """What a failed cast's worker recorded (an LLM that failed for good)."""
    error = (outcome or {}).get("error")
    return f"the cast failed: {error}" if error else "the cast failed"


def _lock(conn: Any, entity_id: str) -> None:
    """Serialize changes to one entity's prompts until the transaction ends."""
    conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_ENTITY_LOCK, entity_id))
