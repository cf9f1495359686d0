"""The PostgreSQL loom's tables, and bringing a database up to date with them.

The loom's tables (entities and turns with their append-only triggers, the gate
journal, blobs) and those of the work queue (:mod:`cantrip.distributed`: leases,
work, messages) are one idempotent script with one version history, read in one
place; the front ends that keep sessions, tasks or live pauses add their own tables
beside these. :func:`migrate` runs the script on first use, under an advisory lock
so that workers starting together do not race.
"""

from __future__ import annotations

from typing import Any

from cantrip._errors import LoomError

SCHEMA_VERSION = 7
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
6: a fenced write takes no row lock (issue 46.2: a ``FOR SHARE`` lock on the lease row
was a WAL record per write): ``cantrip_fence_holds`` checks the fence under a shared
advisory lock on the entity, in a snapshot taken after the lock, and a claim takes the
entity only if it gets that lock exclusively (``cantrip_fence_take``, never waiting):
so a write and a claim of its entity are still ordered, as the row lock ordered them.
7: a claim rewrites its work row in place (issue 46.2: each claim and finish wrote a new
row version on another page, with a new entry in every index and a lock record first).
``cantrip_work.live`` (a stored generated column: the row is queued or running) is what
the partial indexes name instead of ``state``: PostgreSQL updates a row in place (HOT:
no index entries) only if no column an index names -- in its key or its predicate --
changes, and a claim changes ``state`` (queued to running) but not ``live``; the two
tables a cast updates (``cantrip_work``, ``cantrip_leases``) leave room on each page
(``fillfactor``) for the new versions of its rows. The open-work index is
``cantrip_work_live`` (was ``cantrip_work_open``), the suspects' ``cantrip_work_suspect``
(was ``cantrip_work_suspects``, on running suspects: no query could use it).
``cantrip_turns_by_entity`` (entity, position) is gone: an entity's turns are read in
sequence order through ``UNIQUE (entity_id, sequence)`` -- the order they are appended
in, one writer at a time under the entity's fence -- and a loom position ``p`` an
entity's reading goes on from (a cursor: ``base_pos``, a session's tail) is the
entity's largest sequence at or before ``p`` (:data:`TURNS_AFTER`).
Each statement is idempotent, so a database at any earlier version is brought up to
date by running the schema again."""
SCHEMA_LOCK = 0x63616E74  # "cant": the advisory lock schema creation runs under

WORK_OPEN = "live"
"""The predicate of an open (queued or running) ``cantrip_work`` row: its generated
``live`` column (schema 7), which the open-work index names -- a query must say
``live``, not the ``state`` it is made of, for the planner to use that index."""

TURNS_AFTER = (
    "sequence > coalesce((SELECT max(b.sequence) FROM cantrip_turns b "
    "WHERE b.entity_id = {entity} AND b.pos <= {pos}), 0)"
)
"""The predicate of ``{entity}``'s turns recorded after loom position ``{pos}`` (format
it with the two SQL expressions), through the (entity, sequence) index: the turns after
the entity's latest at or before that position (an entity's positions grow with its
sequence)."""

LAST_POS = (
    "coalesce((SELECT l.pos FROM cantrip_turns l WHERE l.entity_id = {entity} "
    "ORDER BY l.sequence DESC LIMIT 1), 0)"
)
"""The loom position of ``{entity}``'s latest turn, 0 if it has none (format it with
the SQL expression of the entity): where reading its next turns begins."""

WORK_FILLFACTOR = 40
"""How full an insert leaves a page of ``cantrip_work`` and ``cantrip_leases`` (percent):
the rest is for the new versions a claim, a finish and each heartbeat make of the rows
on it, written in place (a row's claim and finish; a lease's renewals)."""

SCHEMA = """
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
DROP INDEX IF EXISTS cantrip_turns_by_entity;
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
ALTER TABLE cantrip_work SET (fillfactor = {fill});
ALTER TABLE cantrip_leases SET (fillfactor = {fill});
ALTER TABLE cantrip_work ADD COLUMN IF NOT EXISTS live BOOLEAN
    GENERATED ALWAYS AS (state IN ('queued', 'running')) STORED;
DROP INDEX IF EXISTS cantrip_work_open;
DROP INDEX IF EXISTS cantrip_work_suspects;
CREATE INDEX IF NOT EXISTS cantrip_work_live ON cantrip_work (id) WHERE live;
CREATE INDEX IF NOT EXISTS cantrip_work_by_entity ON cantrip_work (entity_id, id);
CREATE INDEX IF NOT EXISTS cantrip_work_suspect ON cantrip_work (id) WHERE suspect AND live;
CREATE TABLE IF NOT EXISTS cantrip_blobs (hash TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS cantrip_blob_refs (
    hash TEXT NOT NULL,
    entity_id TEXT NOT NULL,
    PRIMARY KEY (hash, entity_id)
);
CREATE OR REPLACE FUNCTION cantrip_fence_key(entity TEXT) RETURNS BIGINT AS $$
    SELECT hashtextextended('cantrip.fence:' || entity, 0)
$$ LANGUAGE sql IMMUTABLE;
CREATE OR REPLACE FUNCTION cantrip_fence_holds(entity TEXT, holder TEXT, at_epoch BIGINT)
RETURNS BOOLEAN AS $$
BEGIN
    -- a claim of this entity waits for the writes that hold this lock to commit, and a
    -- write that waited for a claim reads the lease after it (a volatile function's
    -- statement takes a snapshot of its own): no write lands under a fence a claim
    -- replaced, and no lease row is locked (a row lock is a WAL record)
    PERFORM pg_advisory_xact_lock_shared(cantrip_fence_key(entity));
    RETURN EXISTS (SELECT 1 FROM cantrip_leases WHERE entity_id = entity
        AND owner = holder AND epoch = at_epoch AND expires_at > clock_timestamp());
END $$ LANGUAGE plpgsql VOLATILE;
CREATE OR REPLACE FUNCTION cantrip_fence_take(entity TEXT) RETURNS BOOLEAN AS $$
    -- a claim takes an entity only while no write under its old fence is in flight
    -- (never waiting: a claimer waits on no lock a writer holds, so no deadlock)
    SELECT pg_try_advisory_xact_lock(cantrip_fence_key(entity))
$$ LANGUAGE sql VOLATILE;
CREATE TABLE IF NOT EXISTS cantrip_journal (
    entity_id TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    ordinal INTEGER NOT NULL,
    gate TEXT NOT NULL,
    data TEXT NOT NULL,
    record TEXT,
    PRIMARY KEY (entity_id, sequence, ordinal)
);
""".replace("{fill}", str(WORK_FILLFACTOR))


def migrate(conn: Any, *, create: bool, where: str) -> None:
    """Bring the database behind ``conn`` (a psycopg connection) up to
    :data:`SCHEMA_VERSION`, in one transaction under :data:`SCHEMA_LOCK`.

    ``create=False``: a database without cantrip's tables is a :class:`LoomError`
    (naming the database as ``where``) instead of getting them."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
        exists = conn.execute("SELECT to_regclass('cantrip_schema')").fetchone()
        if exists is None or exists[0] is None:
            if not create:
                raise LoomError(
                    f"no cantrip loom in the database at {where} (it has no "
                    "cantrip_schema table); a loom is made there by `cantrip cast --db`, "
                    "`cantrip worker` or `cantrip serve --db`"
                )
        else:
            row = conn.execute("SELECT max(version) FROM cantrip_schema").fetchone()
            if row is not None and row[0] is not None and int(row[0]) >= SCHEMA_VERSION:
                return
        conn.execute(SCHEMA)
        conn.execute("INSERT INTO cantrip_schema (version) VALUES (%s)", (SCHEMA_VERSION,))
