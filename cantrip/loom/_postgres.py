"""The loom on PostgreSQL: one shared tree for any number of worker processes.

The same records and rules as the SQLite store -- append-only (enforced by
triggers in the database), one unified tree, rewards as the one annotation --
plus what many writers need: every write is checked against the writer's
:class:`~cantrip.loom._fence.Fence` in the same statement (the lease row is
locked ``FOR SHARE`` so a claim by another worker cannot interleave), the
gate journal, and the tables the work queue uses (:mod:`cantrip.distributed._queue`).

psycopg is blocking. The loom calls the write side (:meth:`write_batch`: turns,
entities, rewards and journal entries, queued by the loom and group-committed;
:meth:`journal_read`) through ``trio.to_thread`` behind :attr:`limiter`, one
pool connection per call. Each write is one statement with its fence check
inside; a batch is one pipeline (one round trip, one commit). The read side
answers the loom's synchronous queries directly; a worker reads what an
entity needs in a thread before running it (``Loom.refresh``).

The schema is created (and migrated) on first use, under an advisory lock so
that workers starting together do not race.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Sequence
from typing import Any

import trio

from cantrip._errors import LoomAppendOnlyError, LoomError
from cantrip._redact import redact
from cantrip._version import DISTRIBUTION
from cantrip.loom._blobs import (
    MISSING,
    decode_blob,
    encode_blob,
    externalize,
    has_refs,
    internalize,
)
from cantrip.loom._codec import decode_record, encode_record
from cantrip.loom._fence import Fence
from cantrip.loom._model import EntityRecord, Turn
from cantrip.loom._sqlite_index import JournalEntry
from cantrip.loom._stores import Record

SCHEMA_VERSION = 5
"""2: the append-only trigger lets prune delete whole trees (``cantrip.prune``).
3: big values stored once (``cantrip_blobs``, ``cantrip_blob_refs``; see ``_blobs``).
4: steering and double-texting under workers: ``cantrip_messages`` (a message sent to a
running prompt, for its worker to hand to the cast), and on ``cantrip_work`` the loom
position a cast began after (``base_pos``, set at its first claim: a prompt queued behind
another begins after it) and why a cancel was asked for (``cancel_reason``: ``interrupted``
for a prompt a newer one displaced).
5: a killed worker's casts are told apart from the cast that killed it
(``cantrip.distributed._queue``): on ``cantrip_work``, ``crashes`` (how often a worker
died holding it), ``spare`` (its next claim costs no attempt: its worker died holding
other casts too), ``suspect`` (run it in quarantine, alone), ``paroled`` (cleared by a
quarantine once: the next lasts to its end) and ``alone`` (its current claim is held by
a worker that holds nothing else).
Each statement is idempotent, so a database at any earlier version is brought up to
date by running the schema again."""
POOL_TIMEOUT_S = 5.0
"""How long a call waits for a pool connection before it fails (psycopg_pool's default is
30 s): callers are bounded by :attr:`PostgresStore.limiter` to the pool's size, so a
wait this long means the database is unreachable -- fail and let the caller's retry
loop back off, instead of hanging for half a minute after the database is back."""
_SCHEMA_LOCK = 0x63616E74  # "cant": the advisory lock schema creation runs under

_SCHEMA = """
CREATE TABLE IF NOT EXISTS cantrip_schema (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS cantrip_entities (
    pos BIGSERIAL PRIMARY KEY,
    entity_id TEXT UNIQUE NOT NULL,
    parent_entity_id TEXT,
    data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS cantrip_turns (
    pos BIGSERIAL PRIMARY KEY,
    id TEXT UNIQUE NOT NULL,
    parent_id TEXT,
    entity_id TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    data TEXT NOT NULL,
    reward DOUBLE PRECISION,
    UNIQUE (entity_id, sequence)
);
CREATE INDEX IF NOT EXISTS cantrip_turns_by_entity ON cantrip_turns (entity_id, pos);
CREATE INDEX IF NOT EXISTS cantrip_turns_by_parent ON cantrip_turns (parent_id);
CREATE OR REPLACE FUNCTION cantrip_append_only() RETURNS trigger AS $$
BEGIN
    -- prune (cantrip.loom._postgres_retention) removes whole trees in a transaction
    -- that has set cantrip.prune; nothing else may delete or change history
    IF TG_OP = 'DELETE' AND current_setting('cantrip.prune', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'loom is append-only';
END $$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS cantrip_turns_no_delete ON cantrip_turns;
CREATE TRIGGER cantrip_turns_no_delete BEFORE DELETE ON cantrip_turns
    FOR EACH ROW EXECUTE FUNCTION cantrip_append_only();
DROP TRIGGER IF EXISTS cantrip_turns_no_update ON cantrip_turns;
CREATE TRIGGER cantrip_turns_no_update
    BEFORE UPDATE OF id, parent_id, entity_id, sequence, data ON cantrip_turns
    FOR EACH ROW EXECUTE FUNCTION cantrip_append_only();
DROP TRIGGER IF EXISTS cantrip_entities_no_change ON cantrip_entities;
CREATE TRIGGER cantrip_entities_no_change BEFORE UPDATE OR DELETE ON cantrip_entities
    FOR EACH ROW EXECUTE FUNCTION cantrip_append_only();
CREATE TABLE IF NOT EXISTS cantrip_leases (
    entity_id TEXT PRIMARY KEY,
    owner TEXT,
    epoch BIGINT NOT NULL DEFAULT 0,
    expires_at TIMESTAMPTZ NOT NULL DEFAULT '-infinity'
);
CREATE TABLE IF NOT EXISTS cantrip_work (
    id BIGSERIAL PRIMARY KEY,
    entity_id TEXT NOT NULL,
    intent TEXT NOT NULL,
    spell TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'queued',
    owner TEXT,
    epoch BIGINT,
    attempts INTEGER NOT NULL DEFAULT 0,
    cancel_requested BOOLEAN NOT NULL DEFAULT false,
    result TEXT,
    enqueued_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    claimed_at TIMESTAMPTZ,
    finished_at TIMESTAMPTZ
);
ALTER TABLE cantrip_work ADD COLUMN IF NOT EXISTS base_pos BIGINT;
ALTER TABLE cantrip_work ADD COLUMN IF NOT EXISTS cancel_reason TEXT;
ALTER TABLE cantrip_work ADD COLUMN IF NOT EXISTS crashes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE cantrip_work ADD COLUMN IF NOT EXISTS spare BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE cantrip_work ADD COLUMN IF NOT EXISTS suspect BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE cantrip_work ADD COLUMN IF NOT EXISTS alone BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE cantrip_work ADD COLUMN IF NOT EXISTS paroled BOOLEAN NOT NULL DEFAULT false;
CREATE TABLE IF NOT EXISTS cantrip_messages (
    id BIGSERIAL PRIMARY KEY,
    entity_id TEXT NOT NULL,
    work_id BIGINT NOT NULL,
    text TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS cantrip_messages_by_work ON cantrip_messages (work_id, id);
CREATE INDEX IF NOT EXISTS cantrip_work_open ON cantrip_work (id)
    WHERE state IN ('queued', 'running');
CREATE INDEX IF NOT EXISTS cantrip_work_by_entity ON cantrip_work (entity_id, id);
CREATE INDEX IF NOT EXISTS cantrip_work_suspects ON cantrip_work (id)
    WHERE suspect AND state = 'running';
CREATE TABLE IF NOT EXISTS cantrip_blobs (hash TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS cantrip_blob_refs (
    hash TEXT NOT NULL,
    entity_id TEXT NOT NULL,
    PRIMARY KEY (hash, entity_id)
);
CREATE TABLE IF NOT EXISTS cantrip_journal (
    entity_id TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    ordinal INTEGER NOT NULL,
    gate TEXT NOT NULL,
    data TEXT NOT NULL,
    record TEXT,
    PRIMARY KEY (entity_id, sequence, ordinal)
);
"""

_LEASE = (
    "lease AS (SELECT 1 FROM cantrip_leases WHERE entity_id = %(lease_entity)s "
    "AND owner = %(owner)s AND epoch = %(epoch)s AND expires_at > clock_timestamp() FOR SHARE)"
)
"""The fence check, as a common table expression: this worker's lease, at this epoch,
unexpired -- and locked against a concurrent claim until the write's transaction ends.
A fenced write is one statement: this check and the write it guards
(``WHERE EXISTS (SELECT 1 FROM lease)``), so it costs one round trip and, alone, is
its own transaction (the connections are in autocommit mode)."""

_HELD = "EXISTS (SELECT 1 FROM lease)"


def _fenced(write: str, fence: Fence | None, *, also: str = "") -> str:
    return _fenced_sql(write, fence is not None, also)


@functools.cache
def _fenced_sql(write: str, fenced: bool, also: str) -> str:
    """One statement: ``write`` -- an INSERT ... SELECT or UPDATE ... RETURNING 1 with
    ``{where}`` / ``{and}`` where the fence's condition goes -- made only if ``fence``
    holds (no condition without a fence). ``also``: another data-modifying common
    table expression under the same condition. The statement answers one row,
    (lease held, something written)."""
    where, and_ = (f"WHERE {_HELD}", f"AND {_HELD}") if fenced else ("", "")
    ctes = [_LEASE] if fenced else []
    if also:
        ctes.append(also.format(where=where, **{"and": and_}))
    ctes.append(f"w AS ({write.format(where=where, **{'and': and_})})")
    held = _HELD if fenced else "true"
    return f"WITH {', '.join(ctes)} SELECT {held}, EXISTS (SELECT 1 FROM w)"


def _fence_params(fence: Fence | None) -> dict[str, Any]:
    if fence is None:
        return {}
    return {"lease_entity": fence.lease_entity, "owner": fence.owner, "epoch": fence.epoch}


_INSERT_TURN = (
    "INSERT INTO cantrip_turns (id, parent_id, entity_id, sequence, data) "
    "SELECT %(id)s, %(parent_id)s, %(entity_id)s, %(sequence)s, %(data)s {where} "
    "ON CONFLICT DO NOTHING RETURNING 1"
)
_INSERT_ENTITY = (
    "INSERT INTO cantrip_entities (entity_id, parent_entity_id, data) "
    "SELECT %(entity_id)s, %(parent_entity_id)s, %(data)s {where} "
    "ON CONFLICT DO NOTHING RETURNING 1"
)
_SET_REWARD = "UPDATE cantrip_turns SET reward = %(reward)s WHERE id = %(id)s {and} RETURNING 1"
_JOURNAL_CALL = (
    "INSERT INTO cantrip_journal (entity_id, sequence, ordinal, gate, data, record) "
    "SELECT %(entity_id)s, %(sequence)s, %(ordinal)s, %(gate)s, %(data)s, %(record)s {where} "
    "ON CONFLICT (entity_id, sequence, ordinal) "
    "DO UPDATE SET record = excluded.record WHERE cantrip_journal.record IS NULL RETURNING 1"
)
"""A gate call started (``record`` NULL) or its result: a result is written once."""
_JOURNAL_UTTERANCE = (
    "INSERT INTO cantrip_journal (entity_id, sequence, ordinal, gate, data, record) "
    "SELECT %(entity_id)s, %(sequence)s, %(ordinal)s, %(gate)s, %(data)s, %(record)s {where} "
    "ON CONFLICT (entity_id, sequence, ordinal) "
    "DO UPDATE SET gate = excluded.gate, data = excluded.data, record = excluded.record "
    "RETURNING 1"
)
"""A fresh utterance for a turn replaces an abandoned attempt's ..."""
_JOURNAL_VOID = (
    "void AS (DELETE FROM cantrip_journal WHERE entity_id = %(entity_id)s "
    "AND sequence = %(sequence)s AND ordinal >= 0 {and})"
)
"""... and voids the gate calls that attempt journaled (one statement with the write)."""


def _statement(
    op: tuple[str, Any, Fence | None], data: str | None = None
) -> tuple[str, dict[str, Any]]:
    """The one statement that makes a queued loom write (see :func:`_fenced`); ``data``:
    a turn's stored record, its big values already out in blobs."""
    kind, payload, fence = op
    params = _fence_params(fence)
    if kind == "turn":
        turn: Turn = payload
        params.update(
            id=turn.id,
            parent_id=turn.parent_id,
            entity_id=turn.entity_id,
            sequence=turn.sequence,
            data=data if data is not None else encode_record(turn.to_dict()),
        )
        return _fenced(_INSERT_TURN, fence), params
    if kind == "entity":
        record: EntityRecord = payload
        params.update(
            entity_id=record.entity_id,
            parent_entity_id=record.parent_entity_id,
            data=encode_record(record.to_dict()),
        )
        return _fenced(_INSERT_ENTITY, fence), params
    if kind == "journal":
        entity_id, sequence, ordinal, gate, data, journaled = payload
        params.update(
            entity_id=entity_id,
            sequence=sequence,
            ordinal=ordinal,
            gate=gate,
            data=data,
            record=journaled,
        )
        if ordinal < 0:  # a new utterance: what an abandoned attempt left is void
            return _fenced(_JOURNAL_UTTERANCE, fence, also=_JOURNAL_VOID), params
        return _fenced(_JOURNAL_CALL, fence), params
    turn_id, reward = payload
    params.update(id=turn_id, reward=reward)
    return _fenced(_SET_REWARD, fence), params


def _refusal(op: tuple[str, Any, Fence | None], row: Any) -> str | None:
    """Why a queued write was not made, from its statement's (held, written) row."""
    kind, payload, fence = op
    held, written = row
    if not held:
        assert fence is not None
        return lease_lost_message(fence)
    if written or kind in ("reward", "journal"):  # a result is journaled once: not an error
        return None
    if kind == "turn":
        return (
            f"loom is append-only: turn {payload.id} (or sequence "
            f"{payload.sequence} of {payload.entity_id}) is already recorded"
        )
    return f"loom is append-only: entity {payload.entity_id} exists"


_ROWS_FENCE = """
i AS (SELECT * FROM unnest({arrays}) WITH ORDINALITY AS i({columns}, n)),
held AS (
    SELECT i.n FROM i JOIN cantrip_leases l ON l.entity_id = i.lease_entity
        AND l.owner = i.owner AND l.epoch = i.epoch AND l.expires_at > clock_timestamp()
    FOR SHARE OF l
),
ok AS (SELECT * FROM i WHERE i.lease_entity IS NULL OR i.n IN (SELECT n FROM held))
"""
"""Many writes as one statement: their values as parallel arrays (``unnest``), each
row's fence checked by a join with its lease row -- locked ``FOR SHARE`` as for one
write -- and only the rows whose fence holds (or that have none) written."""

_FENCE_COLUMNS = (("lease_entity", "text"), ("owner", "text"), ("epoch", "bigint"))
_ROW_KINDS: dict[str, tuple[tuple[tuple[str, str], ...], str, str]] = {
    "turn": (
        (
            ("id", "text"),
            ("parent_id", "text"),
            ("entity_id", "text"),
            ("sequence", "integer"),
            ("data", "text"),
        ),
        "w AS (INSERT INTO cantrip_turns (id, parent_id, entity_id, sequence, data) "
        "SELECT id, parent_id, entity_id, sequence, data FROM ok ORDER BY n "
        "ON CONFLICT DO NOTHING RETURNING id)",
        "i.id IN (SELECT id FROM w)",
    ),
    "call": (
        (
            ("entity_id", "text"),
            ("sequence", "integer"),
            ("ordinal", "integer"),
            ("gate", "text"),
            ("data", "text"),
            ("record", "text"),
        ),
        "w AS (INSERT INTO cantrip_journal (entity_id, sequence, ordinal, gate, data, record) "
        "SELECT entity_id, sequence, ordinal, gate, data, record FROM ok "
        "ON CONFLICT (entity_id, sequence, ordinal) DO UPDATE SET record = excluded.record "
        "WHERE cantrip_journal.record IS NULL RETURNING 1)",
        "true",
    ),
    "utterance": (
        (
            ("entity_id", "text"),
            ("sequence", "integer"),
            ("ordinal", "integer"),
            ("gate", "text"),
            ("data", "text"),
            ("record", "text"),
        ),
        "void AS (DELETE FROM cantrip_journal j USING ok WHERE j.entity_id = ok.entity_id "
        "AND j.sequence = ok.sequence AND j.ordinal >= 0), "
        "w AS (INSERT INTO cantrip_journal (entity_id, sequence, ordinal, gate, data, record) "
        "SELECT entity_id, sequence, ordinal, gate, data, record FROM ok "
        "ON CONFLICT (entity_id, sequence, ordinal) DO UPDATE SET gate = excluded.gate, "
        "data = excluded.data, record = excluded.record RETURNING 1)",
        "true",
    ),
}


@functools.cache
def _rows_sql(kind: str) -> str:
    columns, write, written = _ROW_KINDS[kind]
    every = _FENCE_COLUMNS + columns
    arrays = ", ".join(f"%({name})s::{kind_}[]" for name, kind_ in every)
    head = _ROWS_FENCE.format(arrays=arrays, columns=", ".join(name for name, _ in every))
    return (
        f"WITH {head.strip()}, {write} "
        f"SELECT i.n IN (SELECT n FROM ok), {written} FROM i ORDER BY i.n"
    )


def _row_kind(op: tuple[str, Any, Fence | None]) -> str:
    kind, payload, _ = op
    if kind == "journal":
        return "utterance" if payload[2] < 0 else "call"
    return kind


def _row_values(op: tuple[str, Any, Fence | None], data: str | None = None) -> tuple[Any, ...]:
    kind, payload, fence = op
    fenced = (None, None, None) if fence is None else (fence.lease_entity, fence.owner, fence.epoch)
    if kind == "turn":
        turn: Turn = payload
        values = (turn.id, turn.parent_id, turn.entity_id, turn.sequence)
        return (*fenced, *values, data if data is not None else encode_record(turn.to_dict()))
    return (*fenced, *payload)


_INSERT_BLOBS = (
    "WITH b AS (INSERT INTO cantrip_blobs (hash, data) "
    "SELECT * FROM unnest(%(hashes)s::text[], %(datas)s::text[]) ON CONFLICT DO NOTHING) "
    "INSERT INTO cantrip_blob_refs (hash, entity_id) "
    "SELECT * FROM unnest(%(ref_hashes)s::text[], %(ref_entities)s::text[]) ON CONFLICT DO NOTHING"
)
"""A batch's new blobs and the references to them, in the batch's transaction (a blob
written for a turn whose fence then fails is left unreferenced: harmless, and prune
collects it)."""


def _turn_records(
    batch: Sequence[tuple[str, Any, Fence | None]],
) -> tuple[dict[int, str], tuple[str, dict[str, Any]] | None]:
    """Each turn's stored record (big values out, see ``_blobs``), and the statement
    that writes the blobs they refer to (None: no turn has any)."""
    records: dict[int, str] = {}
    blobs: dict[str, Any] = {}
    refs: set[tuple[str, str]] = set()
    for index, (kind, payload, _) in enumerate(batch):
        if kind != "turn":
            continue
        record, found = externalize(payload.to_dict())
        records[index] = encode_record(record)
        for digest, value in found:
            blobs.setdefault(digest, value)
            refs.add((digest, payload.entity_id))
    if not blobs:
        return records, None
    ordered = sorted(refs)
    params = {
        "hashes": list(blobs),
        "datas": [encode_blob(v) for v in blobs.values()],
        "ref_hashes": [h for h, _ in ordered],
        "ref_entities": [e for _, e in ordered],
    }
    return records, (_INSERT_BLOBS, params)


def _independent(batch: Sequence[tuple[str, Any, Fence | None]]) -> bool:
    """Whether the batch's writes touch distinct rows, so that writing them a kind at a
    time (one statement each) is the same as writing them in order. The loom's writers
    make such batches (an entity waits for each journal entry before its next write);
    anything else is written one statement per write, in order."""
    turns: set[tuple[str, Any]] = set()
    entities: set[str] = set()
    calls: set[tuple[str, int, int]] = set()
    call_turns: set[tuple[str, int]] = set()
    utterances: set[tuple[str, int]] = set()
    for kind, payload, _ in batch:
        if kind == "turn":
            keys = (("id", payload.id), ("seq", (payload.entity_id, payload.sequence)))
            if any(key in turns for key in keys):
                return False
            turns.update(keys)
        elif kind == "entity":
            if payload.entity_id in entities:
                return False
            entities.add(payload.entity_id)
        elif kind == "journal":
            entity_id, sequence, ordinal = payload[0], payload[1], payload[2]
            at = (entity_id, sequence)
            if ordinal < 0:  # an utterance voids the calls of its turn: alone there
                if at in utterances or at in call_turns:
                    return False
                utterances.add(at)
            else:
                if (entity_id, sequence, ordinal) in calls or at in utterances:
                    return False
                calls.add((entity_id, sequence, ordinal))
                call_turns.add(at)
        else:
            return False  # a reward updates a turn that may be in this very batch
    return True


_THREAD = """
WITH RECURSIVE up(id, parent_id, data, depth) AS (
    SELECT id, parent_id, data, 0 FROM cantrip_turns WHERE id = %s
    UNION ALL
    SELECT t.id, t.parent_id, t.data, up.depth + 1
    FROM cantrip_turns t JOIN up ON t.id = up.parent_id
)
SELECT data FROM up ORDER BY depth DESC
"""


def _fetched(cursor: Any) -> list[Any]:
    """A statement's rows (none for one that returns none, the blobs' insert)."""
    return cursor.fetchall() if cursor.description is not None else []


def _turn(data: str) -> Turn:
    return Turn.from_dict(decode_record(data))


def _entity(data: str) -> EntityRecord:
    return EntityRecord.from_dict(decode_record(data))


def lease_lost_message(fence: Fence) -> str:
    return (
        f"lease lost: worker {fence.owner} no longer holds {fence.lease_entity} "
        f"at epoch {fence.epoch} (expired or claimed by another worker)"
    )


class PostgresStore:
    """A loom store on PostgreSQL (psycopg 3 + a connection pool)."""

    deferred = True
    """Writes are queued by the loom and committed by :meth:`write_batch` in a thread."""

    def __init__(self, url: str, *, max_connections: int = 8, create: bool = True) -> None:
        """``create=False``: a database with no cantrip loom in it is a :class:`LoomError`
        instead of getting cantrip's tables -- for commands that read or edit a loom
        (``cantrip loom URL ...``), where a mistyped database name must not leave
        tables behind in somebody else's database."""
        try:
            import psycopg_pool
        except ImportError as exc:  # the optional dependency (the postgres extra)
            raise LoomError(
                f"a postgresql:// loom needs psycopg: pip install '{DISTRIBUTION}[postgres]'"
            ) from exc
        self.url = url
        self.path = None
        """Not a file (front ends that print a loom path print :meth:`__str__`)."""
        probe_connection(url)
        self.pool = psycopg_pool.ConnectionPool(
            url,
            min_size=1,
            max_size=max_connections,
            kwargs={"autocommit": True, "connect_timeout": 5},
            open=False,
            timeout=POOL_TIMEOUT_S,
        )
        try:
            self.pool.open(wait=True, timeout=10.0)
        except psycopg_pool.PoolTimeout as exc:
            self.pool.close()
            raise LoomError(f"cannot connect to PostgreSQL at {_safe(url)}: {exc}") from None
        self.limiter = trio.CapacityLimiter(max_connections)
        """Worker threads that may hold a pool connection at once."""
        try:
            self._migrate(create)
        except LoomError:
            self.pool.close()
            raise

    def __str__(self) -> str:
        return _safe(self.url)

    def _migrate(self, create: bool) -> None:
        with self.pool.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            exists = conn.execute("SELECT to_regclass('cantrip_schema')").fetchone()
            if exists is None or exists[0] is None:
                if not create:
                    raise LoomError(
                        f"no cantrip loom in the database at {_safe(self.url)} (it has no "
                        "cantrip_schema table); a loom is made there by `cantrip cast --db`, "
                        "`cantrip worker` or `cantrip serve --db`"
                    )
            else:
                row = conn.execute("SELECT max(version) FROM cantrip_schema").fetchone()
                if row is not None and row[0] is not None and int(row[0]) >= SCHEMA_VERSION:
                    return
            conn.execute(_SCHEMA)
            conn.execute("INSERT INTO cantrip_schema (version) VALUES (%s)", (SCHEMA_VERSION,))

    # -- writing ----------------------------------------------------------------

    def write_batch(self, batch: Sequence[tuple[str, Any, Fence | None]]) -> list[tuple[int, str]]:
        """Commit queued writes in order, in one transaction. Each write whose fence
        no longer holds is left out; returns (index, why) for every refused write.

        Each write is one statement that checks its own fence (:func:`_fenced`), and
        when a batch holds several turns or journal entries (a group commit of many
        entities' writes) each kind is one statement for all of them
        (:data:`_ROWS_FENCE`). One statement is its own transaction; several are
        ``BEGIN``, the statements, ``COMMIT`` -- one commit either way. (psycopg's
        pipeline mode measured slower than this: ``bench/pg_turn_cost.py``.)"""
        plan: list[tuple[str, dict[str, Any], list[int]]] = []
        records, blobs = _turn_records(batch)
        if len(batch) > 2 and _independent(batch):
            by_kind: dict[str, list[int]] = {}
            for index, op in enumerate(batch):
                by_kind.setdefault(_row_kind(op), []).append(index)
            for kind, indexes in by_kind.items():
                if len(indexes) == 1 or kind not in _ROW_KINDS:
                    plan.extend((*_statement(batch[i], records.get(i)), [i]) for i in indexes)
                    continue
                columns = _FENCE_COLUMNS + _ROW_KINDS[kind][0]
                rows_of = [_row_values(batch[i], records.get(i)) for i in indexes]
                params = {name: [row[c] for row in rows_of] for c, (name, _) in enumerate(columns)}
                plan.append((_rows_sql(kind), params, indexes))
        else:
            plan = [
                (*_statement(op, records.get(index)), [index]) for index, op in enumerate(batch)
            ]
        if blobs is not None:
            plan.insert(0, (*blobs, []))
        rows: list[Any] = [None] * len(batch)
        with self.pool.connection() as conn:
            if len(plan) == 1:
                results = [conn.execute(plan[0][0], plan[0][1]).fetchall()]
            else:
                with conn.transaction():
                    results = [_fetched(conn.execute(sql, params)) for sql, params, _ in plan]
        for (_, _, indexes), answered in zip(plan, results, strict=True):
            for index, row in zip(indexes, answered, strict=True):
                rows[index] = row
        refused: list[tuple[int, str]] = []
        for index, (op, row) in enumerate(zip(batch, rows, strict=True)):
            why = _refusal(op, row)
            if why is not None:
                refused.append((index, why))
        return refused

    def _write_now(self, op: tuple[str, Any, Fence | None]) -> None:
        refused = self.write_batch([op])
        if refused:
            raise LoomAppendOnlyError(refused[0][1])

    def append_entity(self, record: EntityRecord) -> None:
        self._write_now(("entity", record, None))

    def append_turn(self, turn: Turn) -> None:
        self._write_now(("turn", turn, None))

    def set_reward(self, turn_id: str, reward: float | None) -> None:
        with self.pool.connection() as conn:
            cursor = conn.execute(
                "UPDATE cantrip_turns SET reward = %s WHERE id = %s", (reward, turn_id)
            )
            if cursor.rowcount != 1:
                raise LoomError(f"no turn {turn_id!r} in {self}")

    # -- the gate journal -------------------------------------------------------

    def journal_write(
        self, entity_id: str, sequence: int, ordinal: int, gate: str, data: str, record: str | None
    ) -> None:
        refused = self.journal_write_fenced(entity_id, sequence, ordinal, gate, data, record, None)
        assert refused is None

    def journal_write_fenced(
        self,
        entity_id: str,
        sequence: int,
        ordinal: int,
        gate: str,
        data: str,
        record: str | None,
        fence: Fence | None,
    ) -> str | None:
        """Journal one entry under ``fence``; why it was refused, or None.

        One statement (one round trip, its own transaction): the fence check and the
        write -- for an utterance (``ordinal`` < 0), also voiding what an abandoned
        attempt of the turn journaled."""
        op = ("journal", (entity_id, sequence, ordinal, gate, data, record), fence)
        with self.pool.connection() as conn:
            row = conn.execute(*_statement(op)).fetchone()
        return _refusal(op, row)

    def journal_read(self, entity_id: str, sequence: int) -> list[JournalEntry]:
        with self.pool.connection() as conn:
            rows = conn.execute(
                "SELECT ordinal, gate, data, record FROM cantrip_journal "
                "WHERE entity_id = %s AND sequence = %s ORDER BY ordinal",
                (entity_id, sequence),
            ).fetchall()
        return [(int(o), str(g), str(d), r) for o, g, d, r in rows]

    # -- reading (IndexedStore) -------------------------------------------------

    def _read_turn(self, data: str) -> Turn:
        """A stored turn, its big values read back from ``cantrip_blobs``."""
        if not has_refs(data):
            return _turn(data)
        return Turn.from_dict(internalize(decode_record(data), self._blob, where=_safe(self.url)))

    def _blob(self, digest: str) -> Any:
        rows = self._rows("SELECT data FROM cantrip_blobs WHERE hash = %s", (digest,))
        return decode_blob(rows[0][0]) if rows else MISSING

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self.pool.connection() as conn:
            return conn.execute(sql, params).fetchall()

    def get_turn(self, turn_id: str) -> Turn | None:
        rows = self._rows("SELECT data FROM cantrip_turns WHERE id = %s", (turn_id,))
        return self._read_turn(rows[0][0]) if rows else None

    def get_entity(self, entity_id: str) -> EntityRecord | None:
        rows = self._rows("SELECT data FROM cantrip_entities WHERE entity_id = %s", (entity_id,))
        return _entity(rows[0][0]) if rows else None

    def entities(self) -> list[EntityRecord]:
        return [_entity(d) for (d,) in self._rows("SELECT data FROM cantrip_entities ORDER BY pos")]

    def entity_turns(self, entity_id: str) -> list[Turn]:
        rows = self._rows(
            "SELECT data FROM cantrip_turns WHERE entity_id = %s ORDER BY pos", (entity_id,)
        )
        return [self._read_turn(d) for (d,) in rows]

    def entity_turns_from(self, entity_id: str, turn_id: str) -> list[Turn]:
        rows = self._rows(
            "SELECT data FROM cantrip_turns WHERE entity_id = %s "
            "AND pos >= (SELECT pos FROM cantrip_turns WHERE id = %s) ORDER BY pos",
            (entity_id, turn_id),
        )
        return [self._read_turn(d) for (d,) in rows]

    def last_turn(self, entity_id: str) -> Turn | None:
        rows = self._rows(
            "SELECT data FROM cantrip_turns WHERE entity_id = %s ORDER BY pos DESC LIMIT 1",
            (entity_id,),
        )
        return self._read_turn(rows[0][0]) if rows else None

    def children(self, turn_id: str | None) -> list[Turn]:
        if turn_id is None:
            rows = self._rows("SELECT data FROM cantrip_turns WHERE parent_id IS NULL ORDER BY pos")
        else:
            rows = self._rows(
                "SELECT data FROM cantrip_turns WHERE parent_id = %s ORDER BY pos", (turn_id,)
            )
        return [self._read_turn(d) for (d,) in rows]

    def thread(self, leaf_id: str) -> list[Turn]:
        return [self._read_turn(d) for (d,) in self._rows(_THREAD, (leaf_id,))]

    def reward(self, turn_id: str) -> float | None:
        rows = self._rows("SELECT reward FROM cantrip_turns WHERE id = %s", (turn_id,))
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    def count_turns(self) -> int:
        return int(self._rows("SELECT count(*) FROM cantrip_turns")[0][0])

    def iter_turns(self) -> Iterator[Turn]:
        """Every turn in order, streamed with a server-side cursor (export, ``loom.turns``)."""
        with self.pool.connection() as conn, conn.transaction():
            cursor = conn.cursor(name="cantrip_iter_turns")
            cursor.execute("SELECT data FROM cantrip_turns ORDER BY pos")
            for (data,) in cursor:
                yield self._read_turn(data)

    def leaves(self) -> list[Turn]:
        rows = self._rows(
            "SELECT data FROM cantrip_turns t WHERE NOT EXISTS "
            "(SELECT 1 FROM cantrip_turns c WHERE c.parent_id = t.id) ORDER BY pos"
        )
        return [self._read_turn(d) for (d,) in rows]

    def load(self) -> Iterator[Record]:
        for record in self.entities():
            yield "entity", record
        with self.pool.connection() as conn, conn.transaction():
            cursor = conn.cursor(name="cantrip_load")
            cursor.execute("SELECT data, reward FROM cantrip_turns ORDER BY pos")
            for data, reward in cursor:
                turn = self._read_turn(data)
                yield "turn", turn
                if reward is not None:
                    yield "reward", (turn.id, float(reward))

    def close(self) -> None:
        self.pool.close()


CONNECT_TIMEOUT_S = 2
"""Seconds a first connection may take before the loom says the server does not answer."""


def probe_connection(url: str) -> None:
    """One direct connection before the pool opens, so a server that refuses, a wrong
    password or a missing database is a :class:`LoomError` naming that cause within
    :data:`CONNECT_TIMEOUT_S` -- the pool only says "initialization incomplete" after
    its own 10 s."""
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S, autocommit=True):
            return
    except psycopg.OperationalError as exc:
        raise LoomError(
            f"cannot connect to PostgreSQL at {_safe(url)}: {connect_cause(exc)}"
        ) from None
    except psycopg.ProgrammingError as exc:  # a URL psycopg cannot parse
        raise LoomError(f"not a PostgreSQL URL ({_safe(url)}): {exc}") from None


def connect_cause(exc: BaseException) -> str:
    """The cause of a failed connection in a few words (never the URL or password)."""
    text = " ".join(str(exc).split())
    lowered = text.lower()
    if "password authentication failed" in lowered or "authentication failed" in lowered:
        return "authentication failed (check the user and password)"
    database = re.search(r'database "([^"]+)" does not exist', text)
    if database is not None:
        name = database.group(1)
        return f"no such database {name!r} (create it with: createdb {name})"
    if "refused" in lowered:
        return "connection refused (is PostgreSQL running there, on that port?)"
    if "timeout" in lowered or "timed out" in lowered:
        return f"no answer within {CONNECT_TIMEOUT_S} s (is the host reachable?)"
    if "could not translate host name" in lowered or "name or service not known" in lowered:
        return "the host name does not resolve"
    if "role" in lowered and "does not exist" in lowered:
        found = re.search(r'role "([^"]+)" does not exist', text)
        return f"no such user {found.group(1)!r}" if found else "no such user"
    return redact(text)[:300]


def _safe(url: str) -> str:
    """The URL without its password (secrets never reach a message, PROD-8)."""
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        return "postgresql://..."
    try:
        parts = conninfo_to_dict(url)
    except Exception:  # noqa: BLE001 -- a malformed URL: say nothing of it
        return "postgresql://..."
    host, port = str(parts.get("host", "")), str(parts.get("port", ""))
    user, db = str(parts.get("user", "")), str(parts.get("dbname", ""))
    return f"postgresql://{user + '@' if user else ''}{host}{':' + port if port else ''}/{db}"
