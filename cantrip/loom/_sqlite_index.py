"""Reading an SQLite loom by query instead of loading it whole, and its gate journal.

Opening a loom used to read and index every record in memory: O(loom) before
the first read (about 1.4 s for 100,000 turns). An :class:`IndexedStore`
answers the loom's questions -- one turn, a thread, an entity's turns, its
latest turn, a page of entities -- with indexed queries, so opening costs
O(1) and reading a thread O(depth) whatever the loom's size. The loom keeps
what it reads or writes in a bounded cache (turns never change).

The gate journal (SPEC.md "Ownership, fencing and effects on PostgreSQL") lives
in the same file: a table of utterances and gate calls of the turn in flight,
keyed by (entity, turn sequence, call ordinal). See :mod:`cantrip._journal`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from cantrip.loom._blobs import MISSING, decode_blob, has_refs, internalize
from cantrip.loom._codec import decode_record
from cantrip.loom._model import EntityRecord, Turn

INDEX_SCHEMA = """
CREATE INDEX IF NOT EXISTS turns_by_entity ON turns (entity_id, pos);
CREATE INDEX IF NOT EXISTS turns_by_parent ON turns (parent_id);
CREATE TABLE IF NOT EXISTS journal (
    entity_id TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    ordinal INTEGER NOT NULL,
    gate TEXT NOT NULL,
    data TEXT NOT NULL,
    record TEXT,
    PRIMARY KEY (entity_id, sequence, ordinal)
);
"""
"""Added to an SQLite loom on open (``IF NOT EXISTS``: older files gain them once)."""

JournalEntry = tuple[int, str, str, str | None]
"""(ordinal, gate, data, record): ordinal -1 is the utterance, ``record`` is None
for a call that was started and never finished."""


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


def _turn(data: str | bytes) -> Turn:
    return Turn.from_dict(decode_record(data))


_THREAD = """
WITH RECURSIVE up(id, parent_id, data, depth) AS (
    SELECT id, parent_id, data, 0 FROM turns WHERE id = ?
    UNION ALL
    SELECT t.id, t.parent_id, t.data, up.depth + 1 FROM turns t JOIN up ON t.id = up.parent_id
)
SELECT data FROM up ORDER BY depth DESC
"""


class SQLiteQueries:
    """The :class:`IndexedStore` queries over an SQLite loom's tables."""

    _db: sqlite3.Connection
    path: Path

    def _index_schema(self) -> None:
        self._db.executescript(INDEX_SCHEMA)

    def _read_turn(self, data: str | bytes) -> Turn:
        """A stored turn, its big values read back from the blobs table (``_blobs``)."""
        if not has_refs(data):
            return _turn(data)
        return Turn.from_dict(internalize(decode_record(data), self._blob, where=str(self.path)))

    def _blob(self, digest: str) -> Any:
        row = self._db.execute("SELECT data FROM blobs WHERE hash = ?", (digest,)).fetchone()
        return MISSING if row is None else decode_blob(row[0])

    def get_turn(self, turn_id: str) -> Turn | None:
        row = self._db.execute("SELECT data FROM turns WHERE id = ?", (turn_id,)).fetchone()
        return self._read_turn(row[0]) if row else None

    def get_entity(self, entity_id: str) -> EntityRecord | None:
        row = self._db.execute(
            "SELECT data FROM entities WHERE entity_id = ?", (entity_id,)
        ).fetchone()
        return EntityRecord.from_dict(decode_record(row[0])) if row else None

    def entities(self) -> list[EntityRecord]:
        rows = self._db.execute("SELECT data FROM entities ORDER BY pos").fetchall()
        return [EntityRecord.from_dict(decode_record(d)) for (d,) in rows]

    def entity_turns(self, entity_id: str) -> list[Turn]:
        rows = self._db.execute(
            "SELECT data FROM turns WHERE entity_id = ? ORDER BY pos", (entity_id,)
        ).fetchall()
        return [self._read_turn(d) for (d,) in rows]

    def entity_turns_from(self, entity_id: str, turn_id: str) -> list[Turn]:
        rows = self._db.execute(
            "SELECT data FROM turns WHERE entity_id = ? "
            "AND pos >= (SELECT pos FROM turns WHERE id = ?) ORDER BY pos",
            (entity_id, turn_id),
        ).fetchall()
        return [self._read_turn(d) for (d,) in rows]

    def last_turn(self, entity_id: str) -> Turn | None:
        row = self._db.execute(
            "SELECT data FROM turns WHERE entity_id = ? ORDER BY pos DESC LIMIT 1", (entity_id,)
        ).fetchone()
        return self._read_turn(row[0]) if row else None

    def children(self, turn_id: str | None) -> list[Turn]:
        if turn_id is None:
            rows = self._db.execute(
                "SELECT data FROM turns WHERE parent_id IS NULL ORDER BY pos"
            ).fetchall()
        else:
            rows = self._db.execute(
                "SELECT data FROM turns WHERE parent_id = ? ORDER BY pos", (turn_id,)
            ).fetchall()
        return [self._read_turn(d) for (d,) in rows]

    def thread(self, leaf_id: str) -> list[Turn]:
        return [self._read_turn(d) for (d,) in self._db.execute(_THREAD, (leaf_id,)).fetchall()]

    def reward(self, turn_id: str) -> float | None:
        row = self._db.execute("SELECT reward FROM turns WHERE id = ?", (turn_id,)).fetchone()
        return None if row is None else row[0]

    def count_turns(self) -> int:
        row = self._db.execute("SELECT count(*) FROM turns").fetchone()
        return int(row[0])

    def iter_turns(self) -> Iterator[Turn]:
        for (data,) in self._db.execute("SELECT data FROM turns ORDER BY pos"):
            yield self._read_turn(data)

    def leaves(self) -> list[Turn]:
        rows = self._db.execute(
            "SELECT data FROM turns t WHERE NOT EXISTS "
            "(SELECT 1 FROM turns c WHERE c.parent_id = t.id) ORDER BY pos"
        ).fetchall()
        return [self._read_turn(d) for (d,) in rows]

    def journal_write(
        self, entity_id: str, sequence: int, ordinal: int, gate: str, data: str, record: str | None
    ) -> None:
        if ordinal < 0:  # a new utterance: what an abandoned attempt left is void
            self._db.execute(
                "DELETE FROM journal WHERE entity_id = ? AND sequence = ?", (entity_id, sequence)
            )
        self._db.execute(
            "INSERT INTO journal (entity_id, sequence, ordinal, gate, data, record) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (entity_id, sequence, ordinal) "
            "DO UPDATE SET record = excluded.record WHERE journal.record IS NULL",
            (entity_id, sequence, ordinal, gate, data, record),
        )

    def journal_read(self, entity_id: str, sequence: int) -> list[JournalEntry]:
        rows: Sequence[Any] = self._db.execute(
            "SELECT ordinal, gate, data, record FROM journal "
            "WHERE entity_id = ? AND sequence = ? ORDER BY ordinal",
            (entity_id, sequence),
        ).fetchall()
        return [(int(o), str(g), str(d), r) for o, g, d, r in rows]
