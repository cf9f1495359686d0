"""Reading a loom by query instead of loading it whole: one set of queries for both SQL stores.

Opening a loom used to read and index every record in memory: O(loom) before
the first read (about 1.4 s for 100,000 turns). An :class:`IndexedStore`
answers the loom's questions -- one turn, a thread, an entity's turns, its
latest turn, a page of entities -- with indexed queries, so opening costs
O(1) and reading a thread O(depth) whatever the loom's size. The loom keeps
what it reads or writes in a bounded cache (turns never change).

The SQLite store (:mod:`cantrip.loom._stores`) and the PostgreSQL store
(:mod:`cantrip.loom._postgres`) keep the same tables under different names
(``turns`` / ``cantrip_turns``) and spell a parameter differently (``?`` /
``%s``); :class:`IndexedQueries` is those queries written once, each store
giving its dialect (:class:`QuerySQL`) and how it runs a query.

The gate journal (SPEC.md "Ownership, fencing and effects on PostgreSQL") lives
beside the turns: a table of utterances and gate calls of the turn in flight,
keyed by (entity, turn sequence, call ordinal). See :mod:`cantrip._journal`.
Writing it differs by store (PostgreSQL checks a fence in the same statement);
reading it is one query here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, Literal, NamedTuple, Protocol, runtime_checkable

from cantrip.loom._blobs import MISSING, decode_blob, has_refs, internalize
from cantrip.loom._codec import decode_record
from cantrip.loom._model import EntityRecord, Turn, with_columns

JournalEntry = tuple[int, str, str, str | None]
"""(ordinal, gate, data, record): ordinal -1 is the utterance, ``record`` is None
for a call that was started and never finished."""

JournalRecord = str | Callable[[], str]
"""A gate result as the journal is given it: its text, or what makes its text. A
deferred store's group commit drops most results (committed with their turn, they
are never read: ``cantrip._journal``), so a result is encoded only if it is written
(:func:`journal_text`) -- not on the trio thread for every call (issue 46.4)."""


def journal_text(record: JournalRecord | None) -> str | None:
    """The text of a journaled result (made now if it was deferred)."""
    return record if record is None or isinstance(record, str) else record()


Record = (
    tuple[Literal["entity"], EntityRecord]
    | tuple[Literal["turn"], Turn]
    | tuple[Literal["reward"], tuple[str, float | None]]
)
"""One record as every store reads it back, in order (``LoomStore.load``)."""


@runtime_checkable
class IndexedStore(Protocol):
    """A store the loom can query instead of loading whole (SQLite, PostgreSQL)."""

    def get_turn(self, turn_id: str) -> Turn | None: ...

    def get_entity(self, entity_id: str) -> EntityRecord | None: ...

    def entities(self) -> list[EntityRecord]: ...

    def entity_turns(self, entity_id: str) -> list[Turn]: ...

    def entity_turns_from(self, entity_id: str, turn_id: str) -> list[Turn]:
        """``entity_id``'s turns from ``turn_id`` on (an index range, not the history)."""
        ...

    def last_turn(self, entity_id: str) -> Turn | None: ...

    def children(self, turn_id: str | None) -> list[Turn]: ...

    def thread(self, leaf_id: str) -> list[Turn]: ...

    def reward(self, turn_id: str) -> float | None: ...

    def count_turns(self) -> int: ...

    def iter_turns(self) -> Iterator[Turn]: ...

    def leaves(self) -> list[Turn]: ...


@runtime_checkable
class JournalStore(Protocol):
    """A store that keeps the gate journal (SQLite, PostgreSQL)."""

    def journal_write(
        self, entity_id: str, sequence: int, ordinal: int, gate: str, data: str, record: str | None
    ) -> None: ...

    def journal_read(self, entity_id: str, sequence: int) -> list[JournalEntry]: ...


class QuerySQL(NamedTuple):
    """The read queries of one SQL dialect (see :func:`query_sql`)."""

    get_turn: str
    get_entity: str
    entities: str
    entity_turns: str
    entity_turns_from: str
    last_turn: str
    roots: str
    children: str
    thread: str
    reward: str
    count_turns: str
    iter_turns: str
    leaves: str
    load_turns: str
    blob: str
    journal_read: str


TURN_ROW = "data, id, parent_id, entity_id, sequence"
"""What a turn is read from: its record and the columns the stored form keeps out of
it (:func:`~cantrip.loom._model.with_columns`)."""


def query_sql(prefix: str, param: str, order: Literal["pos", "sequence"]) -> QuerySQL:
    """The read queries over tables named ``prefix`` + ``turns`` (``entities``, ``blobs``,
    ``journal``) with ``param`` for a parameter (``?`` for SQLite, ``%s`` for psycopg).

    ``order``: the column an entity's turns are read in order of, by the store's index on
    (entity, that column). The same order either way -- an entity's turns are appended
    in sequence order -- but PostgreSQL holds one index for both its uniqueness and its
    reads (``sequence``: ``UNIQUE (entity_id, sequence)``; a second index on (entity,
    position) cost ~95 B of WAL a turn, issue 46.2); SQLite has no unique sequence (an
    old file may repeat one) and reads by position (``pos``)."""

    def sql(template: str) -> str:
        return template.format(
            turns=f"{prefix}turns",
            entities=f"{prefix}entities",
            blobs=f"{prefix}blobs",
            journal=f"{prefix}journal",
            row=TURN_ROW,
            p=param,
            order=order,
        )

    return QuerySQL(
        get_turn=sql("SELECT {row} FROM {turns} WHERE id = {p}"),
        get_entity=sql("SELECT data FROM {entities} WHERE entity_id = {p}"),
        entities=sql("SELECT data FROM {entities} ORDER BY pos"),
        entity_turns=sql("SELECT {row} FROM {turns} WHERE entity_id = {p} ORDER BY {order}"),
        entity_turns_from=sql(
            "SELECT {row} FROM {turns} WHERE entity_id = {p} "
            "AND {order} >= (SELECT {order} FROM {turns} WHERE id = {p}) ORDER BY {order}"
        ),
        last_turn=sql(
            "SELECT {row} FROM {turns} WHERE entity_id = {p} ORDER BY {order} DESC LIMIT 1"
        ),
        roots=sql("SELECT {row} FROM {turns} WHERE parent_id IS NULL ORDER BY pos"),
        children=sql("SELECT {row} FROM {turns} WHERE parent_id = {p} ORDER BY pos"),
        thread=sql(
            "WITH RECURSIVE up(data, id, parent_id, entity_id, sequence, depth) AS ("
            "SELECT {row}, 0 FROM {turns} WHERE id = {p} "
            "UNION ALL "
            "SELECT t.data, t.id, t.parent_id, t.entity_id, t.sequence, up.depth + 1 "
            "FROM {turns} t JOIN up ON t.id = up.parent_id"
            ") SELECT {row} FROM up ORDER BY depth DESC"
        ),
        reward=sql("SELECT reward FROM {turns} WHERE id = {p}"),
        count_turns=sql("SELECT count(*) FROM {turns}"),
        iter_turns=sql("SELECT {row} FROM {turns} ORDER BY pos"),
        leaves=sql(
            "SELECT {row} FROM {turns} t WHERE NOT EXISTS "
            "(SELECT 1 FROM {turns} c WHERE c.parent_id = t.id) ORDER BY pos"
        ),
        load_turns=sql("SELECT {row}, reward FROM {turns} ORDER BY pos"),
        blob=sql("SELECT data FROM {blobs} WHERE hash = {p}"),
        journal_read=sql(
            "SELECT ordinal, gate, data, record FROM {journal} "
            "WHERE entity_id = {p} AND sequence = {p} ORDER BY ordinal"
        ),
    )


def _entity(data: str | bytes) -> EntityRecord:
    return EntityRecord.from_dict(decode_record(data))


class IndexedQueries:
    """The :class:`IndexedStore` queries, the journal's read and :meth:`load`, over a
    store's tables. A store names its dialect (:attr:`_sql`) and gives :meth:`_rows`
    (a query's rows, all at once), :meth:`_stream` (a query's rows one at a time, for
    reading every turn) and :meth:`_location` (where the loom is, for messages)."""

    _sql: ClassVar[QuerySQL]

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        raise NotImplementedError

    def _stream(self, sql: str) -> Iterator[Any]:
        raise NotImplementedError

    def _location(self) -> str:
        raise NotImplementedError

    def _read_turn(self, row: Sequence[Any]) -> Turn:
        """A stored turn (a row of :data:`TURN_ROW`), its big values read back from the
        blobs table (``_blobs``)."""
        data = row[0]
        record = with_columns(decode_record(data), row)
        if not has_refs(data):
            return Turn.from_dict(record)
        return Turn.from_dict(internalize(record, self._blob, where=self._location()))

    def _blob(self, digest: str) -> Any:
        rows = self._rows(self._sql.blob, (digest,))
        return decode_blob(rows[0][0]) if rows else MISSING

    def _turns(self, sql: str, params: Sequence[Any] = ()) -> list[Turn]:
        return [self._read_turn(row) for row in self._rows(sql, params)]

    def get_turn(self, turn_id: str) -> Turn | None:
        rows = self._rows(self._sql.get_turn, (turn_id,))
        return self._read_turn(rows[0]) if rows else None

    def get_entity(self, entity_id: str) -> EntityRecord | None:
        rows = self._rows(self._sql.get_entity, (entity_id,))
        return _entity(rows[0][0]) if rows else None

    def entities(self) -> list[EntityRecord]:
        return [_entity(d) for (d,) in self._rows(self._sql.entities)]

    def entity_turns(self, entity_id: str) -> list[Turn]:
        return self._turns(self._sql.entity_turns, (entity_id,))

    def entity_turns_from(self, entity_id: str, turn_id: str) -> list[Turn]:
        return self._turns(self._sql.entity_turns_from, (entity_id, turn_id))

    def last_turn(self, entity_id: str) -> Turn | None:
        rows = self._rows(self._sql.last_turn, (entity_id,))
        return self._read_turn(rows[0]) if rows else None

    def children(self, turn_id: str | None) -> list[Turn]:
        if turn_id is None:
            return self._turns(self._sql.roots)
        return self._turns(self._sql.children, (turn_id,))

    def thread(self, leaf_id: str) -> list[Turn]:
        return self._turns(self._sql.thread, (leaf_id,))

    def reward(self, turn_id: str) -> float | None:
        rows = self._rows(self._sql.reward, (turn_id,))
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    def count_turns(self) -> int:
        return int(self._rows(self._sql.count_turns)[0][0])

    def iter_turns(self) -> Iterator[Turn]:
        """Every turn in order, read as they are taken (export, ``loom.turns``)."""
        for row in self._stream(self._sql.iter_turns):
            yield self._read_turn(row)

    def leaves(self) -> list[Turn]:
        return self._turns(self._sql.leaves)

    def journal_read(self, entity_id: str, sequence: int) -> list[JournalEntry]:
        rows = self._rows(self._sql.journal_read, (entity_id, sequence))
        return [(int(o), str(g), str(d), r) for o, g, d, r in rows]

    def load(self) -> Iterator[Record]:
        """Every record in order (the loom queries an indexed store instead; this is
        the :class:`~cantrip.loom._stores.LoomStore` contract's whole read)."""
        for record in self.entities():
            yield "entity", record
        for row in self._stream(self._sql.load_turns):
            turn, reward = self._read_turn(row), row[5]
            yield "turn", turn
            if reward is not None:
                yield "reward", (turn.id, float(reward))
