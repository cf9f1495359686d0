"""The SQL of the PostgreSQL loom's writes: each fenced, a batch planned as few statements.

Every write a worker makes carries its :class:`~cantrip.loom._fence.Fence`, and the
database makes it only while the worker's lease holds -- checked in the same
statement as the write (:func:`_fenced`) by ``cantrip_fence_holds``
(:mod:`~cantrip.loom._postgres_schema`): under a shared advisory lock on the entity
that a claim must take exclusively, so a claim by another worker cannot interleave --
and no row lock, which would be a WAL record per write. A group commit of many entities' writes
(:func:`plan_batch`) is one statement per kind of write (:data:`_ROWS_FENCE`), each
row's fence checked by a join, so that a batch costs one commit whatever its size.

This module only builds statements and reads their answers (:func:`refusals`);
:class:`~cantrip.loom._postgres.PostgresStore` runs them on its pool.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from cantrip.loom._blobs import encode_blob, externalize
from cantrip.loom._codec import encode_record
from cantrip.loom._fence import Fence, PendingOp
from cantrip.loom._indexed import journal_text
from cantrip.loom._model import EntityRecord, Turn

Statement = tuple[str, dict[str, Any]]
"""SQL and its named parameters."""
PlannedStatement = tuple[str, dict[str, Any], list[int]]
"""A statement of a batch's plan and the indexes (in the batch) of the writes it makes,
one answered row each, in order."""

_LEASE = "lease AS (SELECT 1 WHERE cantrip_fence_holds(%(lease_entity)s, %(owner)s, %(epoch)s))"
"""The fence check, as a common table expression: this worker's lease, at this epoch,
unexpired -- and a concurrent claim held off until the write's transaction ends.
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
_NEW_TURN = (
    "INSERT INTO cantrip_turns (id, parent_id, entity_id, sequence, data) "
    "SELECT %(id)s, %(parent_id)s, %(entity_id)s, %(sequence)s, %(data)s {where} RETURNING 1"
)
"""A turn, written on the expectation that it is new (see :func:`plan_batch`)."""
_INSERT_ENTITY = (
    "INSERT INTO cantrip_entities (entity_id, parent_entity_id, data) "
    "SELECT %(entity_id)s, %(parent_entity_id)s, %(data)s {where} "
    "ON CONFLICT DO NOTHING RETURNING 1"
)
_NEW_ENTITY = (
    "INSERT INTO cantrip_entities (entity_id, parent_entity_id, data) "
    "SELECT %(entity_id)s, %(parent_entity_id)s, %(data)s {where} RETURNING 1"
)
"""An entity, written on the expectation that it is new (see :func:`plan_batch`)."""
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
_JOURNAL_NEW = (
    "INSERT INTO cantrip_journal (entity_id, sequence, ordinal, gate, data, record) "
    "SELECT %(entity_id)s, %(sequence)s, %(ordinal)s, %(gate)s, %(data)s, %(record)s {where} "
    "RETURNING 1"
)
"""An utterance or a call's start, written on the expectation that its turn has no row
at that ordinal yet (see :func:`plan_batch`)."""


def _optimistic(op: PendingOp) -> bool:
    """Whether a write goes first as a plain ``INSERT`` (:func:`plan_batch`): an entity, a
    turn, an utterance or a call's start -- each new but after a crash or a refused
    append. A result or a checkpoint keeps ``ON CONFLICT``: it is written over its call's
    start row, or kept if one is there already."""
    kind, payload, _ = op
    if kind in ("turn", "entity"):
        return True
    return kind == "journal" and (payload[2] < 0 or payload[5] is None)


def statement(op: PendingOp, data: str | None = None, *, careful: bool = True) -> Statement:
    """The one statement that makes a queued loom write (see :func:`_fenced`); ``data``:
    a turn's stored record, its big values already out in blobs. ``careful=False``: a
    plain ``INSERT`` for what is expected to be new (:func:`_optimistic`)."""
    kind, payload, fence = op
    plain = not careful and _optimistic(op)
    params = _fence_params(fence)
    if kind == "turn":
        turn: Turn = payload
        params.update(
            id=turn.id,
            parent_id=turn.parent_id,
            entity_id=turn.entity_id,
            sequence=turn.sequence,
            data=data if data is not None else encode_record(turn.to_stored()),
        )
        return _fenced(_NEW_TURN if plain else _INSERT_TURN, fence), params
    if kind == "entity":
        record: EntityRecord = payload
        params.update(
            entity_id=record.entity_id,
            parent_entity_id=record.parent_entity_id,
            data=encode_record(record.to_dict()),
        )
        return _fenced(_NEW_ENTITY if plain else _INSERT_ENTITY, fence), params
    if kind == "journal":
        entity_id, sequence, ordinal, gate, data, journaled = payload
        params.update(
            entity_id=entity_id,
            sequence=sequence,
            ordinal=ordinal,
            gate=gate,
            data=data,
            record=journal_text(journaled),
        )
        if ordinal < 0:  # a new utterance: what an abandoned attempt left is void
            write = _JOURNAL_NEW if plain else _JOURNAL_UTTERANCE
            return _fenced(write, fence, also=_JOURNAL_VOID), params
        return _fenced(_JOURNAL_NEW if plain else _JOURNAL_CALL, fence), params
    turn_id, reward = payload
    params.update(id=turn_id, reward=reward)
    return _fenced(_SET_REWARD, fence), params


def refusal(op: PendingOp, row: Any) -> str | None:
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
    SELECT i.n FROM i
    WHERE i.lease_entity IS NOT NULL AND cantrip_fence_holds(i.lease_entity, i.owner, i.epoch)
),
ok AS (SELECT * FROM i WHERE i.lease_entity IS NULL OR i.n IN (SELECT n FROM held))
"""
"""Many writes as one statement: their values as parallel arrays (``unnest``), each
row's fence checked as for one write -- and only the rows whose fence holds (or that
have none) written. The arrays are sent in binary (``%(name)b``): in text, psycopg
escapes every quote of every JSON record with a regular expression, ~70 us a record
(issue 46); in binary a record is copied as it is."""

_FENCE_COLUMNS = (("lease_entity", "text"), ("owner", "text"), ("epoch", "bigint"))
_TURN_COLUMNS = (
    ("id", "text"),
    ("parent_id", "text"),
    ("entity_id", "text"),
    ("sequence", "integer"),
    ("data", "text"),
)
_JOURNAL_COLUMNS = (
    ("entity_id", "text"),
    ("sequence", "integer"),
    ("ordinal", "integer"),
    ("gate", "text"),
    ("data", "text"),
    ("record", "text"),
)
_ROW_KINDS: dict[str, tuple[tuple[tuple[str, str], ...], str, str]] = {
    "turn": (
        _TURN_COLUMNS,
        "w AS (INSERT INTO cantrip_turns (id, parent_id, entity_id, sequence, data) "
        "SELECT id, parent_id, entity_id, sequence, data FROM ok ORDER BY n "
        "ON CONFLICT DO NOTHING RETURNING id)",
        "i.id IN (SELECT id FROM w)",
    ),
    "call": (
        _JOURNAL_COLUMNS,
        "w AS (INSERT INTO cantrip_journal (entity_id, sequence, ordinal, gate, data, record) "
        "SELECT entity_id, sequence, ordinal, gate, data, record FROM ok "
        "ON CONFLICT (entity_id, sequence, ordinal) DO UPDATE SET record = excluded.record "
        "WHERE cantrip_journal.record IS NULL RETURNING 1)",
        "true",
    ),
    "new turn": (
        _TURN_COLUMNS,
        "w AS (INSERT INTO cantrip_turns (id, parent_id, entity_id, sequence, data) "
        "SELECT id, parent_id, entity_id, sequence, data FROM ok ORDER BY n RETURNING id)",
        "i.id IN (SELECT id FROM w)",
    ),
    "new start": (
        _JOURNAL_COLUMNS,
        "w AS (INSERT INTO cantrip_journal (entity_id, sequence, ordinal, gate, data, record) "
        "SELECT entity_id, sequence, ordinal, gate, data, record FROM ok RETURNING 1)",
        "true",
    ),
    "new utterance": (
        _JOURNAL_COLUMNS,
        "void AS (DELETE FROM cantrip_journal j USING ok WHERE j.entity_id = ok.entity_id "
        "AND j.sequence = ok.sequence AND j.ordinal >= 0), "
        "w AS (INSERT INTO cantrip_journal (entity_id, sequence, ordinal, gate, data, record) "
        "SELECT entity_id, sequence, ordinal, gate, data, record FROM ok RETURNING 1)",
        "true",
    ),
    "utterance": (
        _JOURNAL_COLUMNS,
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
    arrays = ", ".join(f"%({name})b::{kind_}[]" for name, kind_ in every)
    head = _ROWS_FENCE.format(arrays=arrays, columns=", ".join(name for name, _ in every))
    return (
        f"WITH {head.strip()}, {write} "
        f"SELECT i.n IN (SELECT n FROM ok), {written} FROM i ORDER BY i.n"
    )


def _row_kind(op: PendingOp, careful: bool) -> str:
    kind, payload, _ = op
    if kind == "journal":
        kind = "utterance" if payload[2] < 0 else "call"
    if careful or not _optimistic(op):
        return kind
    return "new start" if kind == "call" else f"new {kind}"


def _row_values(op: PendingOp, data: str | None = None) -> tuple[Any, ...]:
    kind, payload, fence = op
    fenced = (None, None, None) if fence is None else (fence.lease_entity, fence.owner, fence.epoch)
    if kind == "turn":
        turn: Turn = payload
        values = (turn.id, turn.parent_id, turn.entity_id, turn.sequence)
        return (*fenced, *values, data if data is not None else encode_record(turn.to_stored()))
    if kind == "journal":  # a result is encoded here, only when it is written
        return (*fenced, *payload[:5], journal_text(payload[5]))
    return (*fenced, *payload)


_INSERT_BLOBS = (
    "WITH b AS (INSERT INTO cantrip_blobs (hash, data) "
    "SELECT * FROM unnest(%(hashes)b::text[], %(datas)b::text[]) ON CONFLICT DO NOTHING) "
    "INSERT INTO cantrip_blob_refs (hash, entity_id) "
    "SELECT * FROM unnest(%(ref_hashes)b::text[], %(ref_entities)b::text[]) ON CONFLICT DO NOTHING"
)
"""A batch's new blobs and the references to them, in the batch's transaction (a blob
written for a turn whose fence then fails is left unreferenced: harmless, and prune
collects it)."""


def _turn_records(
    batch: Sequence[PendingOp],
) -> tuple[dict[int, str], tuple[str, dict[str, Any]] | None]:
    """Each turn's stored record (big values out, see ``_blobs``), and the statement
    that writes the blobs they refer to (None: no turn has any)."""
    records: dict[int, str] = {}
    blobs: dict[str, Any] = {}
    refs: set[tuple[str, str]] = set()
    for index, (kind, payload, _) in enumerate(batch):
        if kind != "turn":
            continue
        record, found = externalize(payload.to_stored())
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


def _independent(batch: Sequence[PendingOp]) -> bool:
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
            if ordinal < 0:  # an utterance voids the calls of its turn queued before it
                if at in utterances or at in call_turns:
                    return False
                utterances.add(at)
            else:  # (calls after their utterance: the utterances are written first)
                if (entity_id, sequence, ordinal) in calls:
                    return False
                calls.add((entity_id, sequence, ordinal))
                call_turns.add(at)
        else:
            return False  # a reward updates a turn that may be in this very batch
    return True


def lease_lost_message(fence: Fence) -> str:
    return (
        f"lease lost: worker {fence.owner} no longer holds {fence.lease_entity} "
        f"at epoch {fence.epoch} (expired or claimed by another worker)"
    )


_KIND_ORDER = {
    "entity": 0,
    "new entity": 0,
    "utterance": 1,
    "new utterance": 1,
    "call": 2,
    "new start": 2,
    "turn": 3,
    "new turn": 3,
}
"""The order a batch's kinds are written in: an utterance voids what an abandoned
attempt of its turn journaled, so it goes before the calls that follow it."""


def covered(batch: Sequence[PendingOp]) -> dict[int, int]:
    """The gate results of ``batch`` that its turns make unnecessary: {index of the
    result: index of its turn}. A result is journaled so that a resumed turn reuses it;
    committed in the same transaction as its turn, under the same fence, it would never
    be read (the turn holds it, and a recorded turn is never taken again), so it is not
    written: each piece once (``cantrip._journal``)."""
    turns = {(p.entity_id, p.sequence, f): i for i, (k, p, f) in enumerate(batch) if k == "turn"}
    if not turns:
        return {}
    dropped: dict[int, int] = {}
    for index, (kind, payload, fence) in enumerate(batch):
        if kind == "journal" and payload[2] >= 0 and payload[5] is not None:
            turn = turns.get((payload[0], payload[1], fence))
            if turn is not None and turn > index:
                dropped[index] = turn
    return dropped


def plan_batch(
    batch: Sequence[PendingOp], skip: Sequence[int] = (), *, careful: bool = False
) -> list[PlannedStatement]:
    """The statements that make ``batch``, in the order they run (one transaction),
    leaving out the writes at ``skip`` (:func:`covered`).

    An entity, a turn, an utterance and a call's start are new but for a crash or a refused
    append, so they are first written as a plain ``INSERT``: ``ON CONFLICT`` costs a
    WAL record per row (the speculative insertion's confirmation; issue 46.3). A
    batch where one is not new fails with a unique violation, rolls back whole, and
    is planned again ``careful`` -- every write as it handles a row already there.

    Each write is one statement that checks its own fence (:func:`_fenced`), and
    when a batch holds several turns or journal entries (a group commit of many
    entities' writes) each kind is one statement for all of them
    (:data:`_ROWS_FENCE`). The blobs the batch's turns refer to are written first
    (a statement that answers no row)."""
    plan: list[PlannedStatement] = []
    records, blobs = _turn_records(batch)
    left = set(skip)
    written = [i for i in range(len(batch)) if i not in left]
    if len(written) > 2 and _independent([batch[i] for i in written]):
        by_kind: dict[str, list[int]] = {}
        for index in written:
            by_kind.setdefault(_row_kind(batch[index], careful), []).append(index)
        ordered = sorted(by_kind.items(), key=lambda kv: _KIND_ORDER.get(kv[0], 9))
        for kind, indexes in ordered:
            if len(indexes) == 1 or kind not in _ROW_KINDS:
                plan.extend(
                    (*statement(batch[i], records.get(i), careful=careful), [i]) for i in indexes
                )
                continue
            columns = _FENCE_COLUMNS + _ROW_KINDS[kind][0]
            rows_of = [_row_values(batch[i], records.get(i)) for i in indexes]
            params = {name: [row[c] for row in rows_of] for c, (name, _) in enumerate(columns)}
            plan.append((_rows_sql(kind), params, indexes))
    else:
        plan = [(*statement(batch[i], records.get(i), careful=careful), [i]) for i in written]
    if blobs is not None:
        plan.insert(0, (*blobs, []))
    return plan


def refusals(
    batch: Sequence[PendingOp],
    plan: Sequence[PlannedStatement],
    answers: Sequence[list[Any]],
    skipped: dict[int, int] | None = None,
) -> list[tuple[int, str]]:
    """(index, why) for every write of ``batch`` that was not made, from the rows its
    ``plan``'s statements answered; a write ``skipped`` for a turn (:func:`covered`)
    is refused only as that turn's fence was."""
    rows: list[Any] = [None] * len(batch)
    for (_, _, indexes), answered in zip(plan, answers, strict=True):
        for index, row in zip(indexes, answered, strict=True):
            rows[index] = row
    for index, turn in (skipped or {}).items():
        rows[index] = rows[turn]
    refused: list[tuple[int, str]] = []
    for index, (op, row) in enumerate(zip(batch, rows, strict=True)):
        why = refusal(op, row)
        if why is not None:
            refused.append((index, why))
    return refused
