"""Where a loom's records live: in memory, in SQLite, or in a JSONL file.

A store only appends and reads back. The :class:`~cantrip.loom.Loom` keeps the
index (ids, parents, children) in memory and asks the store to make each record
durable before the next turn begins (LOOM-1). Stores are synchronous on
purpose: an SQLite commit in WAL mode costs tens of microseconds, far less than
handing it to a worker thread would.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any, Literal, Protocol

from cantrip._errors import LoomAppendOnlyError, LoomError
from cantrip._redact import get_logger
from cantrip.loom._blobs import MISSING, Blob, encode_blob, externalize, internalize
from cantrip.loom._codec import decode_record, encode_record
from cantrip.loom._indexed import IndexedQueries, Record, query_sql
from cantrip.loom._model import EntityRecord, Turn

_log = get_logger("cantrip.loom")

_json = encode_record
_loads = decode_record


class LoomStore(Protocol):
    """The storage contract of a loom: append records, read them back in order."""

    def append_entity(self, record: EntityRecord) -> None: ...

    def append_turn(self, turn: Turn) -> None: ...

    def set_reward(self, turn_id: str, reward: float | None) -> None: ...

    def load(self) -> Iterator[Record]: ...

    def close(self) -> None: ...


class MemoryStore:
    """Keeps nothing beyond the loom's own index; the default for tests and casts."""

    def append_entity(self, record: EntityRecord) -> None:
        pass

    def append_turn(self, turn: Turn) -> None:
        pass

    def set_reward(self, turn_id: str, reward: float | None) -> None:
        pass

    def load(self) -> Iterator[Record]:
        return iter(())

    def close(self) -> None:
        pass


_SCHEMA = """
PRAGMA journal_mode=WAL;
CREATE TABLE IF NOT EXISTS entities (
    pos INTEGER PRIMARY KEY,
    entity_id TEXT UNIQUE NOT NULL,
    data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS turns (
    pos INTEGER PRIMARY KEY,
    id TEXT UNIQUE NOT NULL,
    parent_id TEXT,
    entity_id TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    data TEXT NOT NULL,
    reward REAL
);
CREATE TRIGGER IF NOT EXISTS turns_append_only_delete BEFORE DELETE ON turns
BEGIN SELECT RAISE(ABORT, 'loom is append-only'); END;
CREATE TRIGGER IF NOT EXISTS turns_append_only_update
BEFORE UPDATE OF id, parent_id, entity_id, sequence, data ON turns
BEGIN SELECT RAISE(ABORT, 'loom is append-only'); END;
CREATE TRIGGER IF NOT EXISTS entities_append_only_delete BEFORE DELETE ON entities
BEGIN SELECT RAISE(ABORT, 'loom is append-only'); END;
CREATE TRIGGER IF NOT EXISTS entities_append_only_update BEFORE UPDATE ON entities
BEGIN SELECT RAISE(ABORT, 'loom is append-only'); END;
CREATE TABLE IF NOT EXISTS blobs (hash TEXT PRIMARY KEY, data TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS blob_refs (
    hash TEXT NOT NULL,
    entity_id TEXT NOT NULL,
    PRIMARY KEY (hash, entity_id)
) WITHOUT ROWID;
"""

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


_INSERT_TURN = (
    "INSERT INTO turns (id, parent_id, entity_id, sequence, data) "
    "SELECT ?1, ?2, ?3, ?4, ?5 WHERE EXISTS (SELECT 1 FROM entities WHERE entity_id = ?3)"
)
"""A turn is written only while its entity is in the file: a session whose tree was
pruned while it was idle (another process, ``prune`` or ``serve --retain-days``) gets
an error instead of writing turns whose entity and parents are gone (issue 39)."""


class SQLiteStore(IndexedQueries):
    """The embedded default for a loom on disk.

    WAL mode, one commit per record. ``durability="normal"`` survives a crash
    of the process (the default); ``"full"`` also survives a power loss, at the
    cost of an fsync per turn. Append-only is enforced by triggers in the
    database itself, so another program cannot quietly edit history either.
    A loom written by one process can be opened and read by another. The loom
    reads it by query (:class:`~cantrip.loom._indexed.IndexedQueries`), never whole.
    """

    _sql = query_sql("", "?", "pos")

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Literal["normal", "full"] = "normal",
        read_only: bool = False,
    ) -> None:
        self.path = Path(path)
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        if read_only:
            # as it is: no schema added to an older file, and the connection refuses to
            # write. (Not ``mode=ro``: a read-only connection to a WAL file leaves its
            # -wal and -shm files behind; this one removes them on close, as ever.)
            self._db.execute("PRAGMA query_only = ON")
            self._cursor = self._db.cursor()
            return
        self._db.executescript(_SCHEMA)
        self._db.executescript(INDEX_SCHEMA)
        self._db.execute(f"PRAGMA synchronous={durability.upper()}")
        self._cursor = self._db.cursor()  # reused: one fewer object per append

    def append_entity(self, record: EntityRecord) -> None:
        try:
            self._db.execute(
                "INSERT INTO entities (entity_id, data) VALUES (?, ?)",
                (record.entity_id, _json(record.to_dict())),
            )
        except sqlite3.IntegrityError as exc:
            raise LoomAppendOnlyError(
                f"loom is append-only: entity {record.entity_id} is already recorded"
            ) from exc

    def append_turn(self, turn: Turn) -> None:
        record, blobs = externalize(turn.to_stored())  # each piece once (Turn.to_stored)
        if blobs:
            self._append_with_blobs(turn, record, blobs)
            return
        try:
            self._cursor.execute(
                _INSERT_TURN,
                (turn.id, turn.parent_id, turn.entity_id, turn.sequence, _json(record)),
            )
        except sqlite3.IntegrityError as exc:
            raise LoomAppendOnlyError(f"loom is append-only: turn {turn.id} exists") from exc
        if self._cursor.rowcount != 1:
            raise self._gone(turn)

    def _gone(self, turn: Turn) -> LoomError:
        return LoomError(
            f"entity {turn.entity_id} is no longer in {self.path} (its tree was pruned while "
            f"it was idle): turn {turn.id} is not recorded; start a new session"
        )

    def _append_with_blobs(self, turn: Turn, record: dict[str, Any], blobs: list[Blob]) -> None:
        """The turn, its new blobs and its references to them: one transaction."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany(
                "INSERT OR IGNORE INTO blobs (hash, data) VALUES (?, ?)",
                [(digest, encode_blob(value)) for digest, value in blobs],
            )
            db.executemany(
                "INSERT OR IGNORE INTO blob_refs (hash, entity_id) VALUES (?, ?)",
                [(digest, turn.entity_id) for digest, _ in blobs],
            )
            inserted = db.execute(
                _INSERT_TURN,
                (turn.id, turn.parent_id, turn.entity_id, turn.sequence, _json(record)),
            ).rowcount
            if inserted != 1:
                raise self._gone(turn)
        except sqlite3.IntegrityError as exc:
            db.execute("ROLLBACK")
            raise LoomAppendOnlyError(f"loom is append-only: turn {turn.id} exists") from exc
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def set_reward(self, turn_id: str, reward: float | None) -> None:
        cursor = self._db.execute("UPDATE turns SET reward = ? WHERE id = ?", (reward, turn_id))
        if cursor.rowcount != 1:
            raise LoomError(f"no turn {turn_id!r} in {self.path}")

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

    # -- how the shared queries (IndexedQueries) run here

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return self._db.execute(sql, params).fetchall()

    def _stream(self, sql: str) -> Iterator[Any]:
        return iter(self._db.execute(sql))

    def _location(self) -> str:
        return str(self.path)

    def close(self) -> None:
        self._db.close()


class JSONLStore:
    """One JSON object per line, appended and flushed per record (spec 6.5's format).

    Reward annotations are appended as their own lines, so the file itself is
    append-only too; the last annotation of a turn wins when it is read back.

    ``read_only`` (what ``cantrip loom FILE list|show|stats|export`` open): the file
    is never written -- a torn last line is skipped with a warning and left in place
    for the next writer to set aside -- so reading works on a full disk and never
    rewrites what it only reads.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, fsync: bool = False, read_only: bool = False
    ) -> None:
        self.path = Path(path)
        self._fsync = fsync
        self._read_only = read_only
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        mode = "r" if read_only else "a+"
        self._file: IO[str] = self.path.open(mode, encoding="utf-8", errors="surrogateescape")
        self._blobs: dict[str, Any] = {}
        """Blobs this file holds (read by :meth:`load`, which every JSONL loom runs at
        open, then written as turns need them)."""

    def _write(self, obj: dict[str, Any]) -> None:
        if self._read_only:
            raise LoomError(f"{self.path} was opened read-only: nothing can be recorded in it")
        self._file.write(_json(obj) + "\n")
        self._file.flush()
        if self._fsync:
            os.fsync(self._file.fileno())

    def append_entity(self, record: EntityRecord) -> None:
        self._write({"type": "entity", **record.to_dict()})

    def append_turn(self, turn: Turn) -> None:
        record, blobs = externalize(turn.to_dict())
        for digest, value in blobs:
            if digest not in self._blobs:
                self._write({"type": "blob", "hash": digest, "data": value})
                self._blobs[digest] = value
        self._write({"type": "turn", **record})

    def set_reward(self, turn_id: str, reward: float | None) -> None:
        self._write({"type": "reward", "turn_id": turn_id, "reward": reward})

    def load(self) -> Iterator[Record]:
        """Every record, in order. A torn final line (a process killed mid-append: no
        newline, not JSON) is dropped with a warning and set aside in ``<file>.torn``;
        every complete line is kept. A bad line anywhere else is corruption: an error
        naming the line and how to recover."""
        self._file.seek(0)
        lines = self._file.read().split("\n")
        tail = lines.pop()  # "" when the file ends with a newline, as every append does
        if tail and self._is_torn(tail):
            if self._read_only:
                _log.warning(
                    "%s: skipped a torn final line (%d bytes, a write cut off by a crash); "
                    "left in place: the next write to the loom sets it aside",
                    self.path,
                    len(tail.encode("utf-8", errors="surrogateescape")),
                )
            else:
                self._set_aside(tail)
        elif tail:
            lines.append(tail)  # a complete record that lost only its newline
            if not self._read_only:
                self._file.write("\n")
                self._file.flush()
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                obj = _loads(line)
            except (ValueError, RecursionError) as exc:
                raise LoomError(
                    f"{self.path}:{number}: not JSON ({exc}); the loom is corrupted in the "
                    f"middle. Lines 1-{number - 1} are intact: to recover them, copy them "
                    f"to a new file (head -n {number - 1} {self.path} > recovered.jsonl) "
                    "and open that"
                ) from exc
            if not isinstance(obj, dict) or "type" not in obj:
                raise LoomError(f"{self.path}:{number}: not a loom record (no 'type' field)")
            kind = obj.pop("type")
            try:
                if kind == "entity":
                    yield "entity", EntityRecord.from_dict(obj)
                elif kind == "turn":
                    yield "turn", Turn.from_dict(internalize(obj, self._blob, where=str(self.path)))
                elif kind == "blob":
                    self._blobs[obj["hash"]] = obj["data"]
                elif kind == "reward":
                    yield "reward", (obj["turn_id"], obj["reward"])
                else:
                    raise LoomError(f"{self.path}:{number}: unknown record type {kind!r}")
            except (KeyError, TypeError, ValueError) as exc:
                raise LoomError(
                    f"{self.path}:{number}: malformed {kind} record ({type(exc).__name__}: {exc})"
                ) from exc
        self._file.seek(0, os.SEEK_END)

    def _blob(self, digest: str) -> Any:
        return self._blobs.get(digest, MISSING)

    @staticmethod
    def _is_torn(tail: str) -> bool:
        try:
            _loads(tail)
        except (ValueError, RecursionError):
            return True
        return False

    def _set_aside(self, tail: str) -> None:
        """Cut the torn fragment off the file (appends must start on a fresh line), keeping
        it in ``<file>.torn`` so that nothing is destroyed."""
        aside = self.path.with_name(self.path.name + ".torn")
        with aside.open("a", encoding="utf-8", errors="surrogateescape") as out:
            out.write(tail + "\n")
        size = self.path.stat().st_size
        cut = len(tail.encode("utf-8", errors="surrogateescape"))
        self._file.flush()
        os.truncate(self.path, size - cut)
        self._file.seek(0, os.SEEK_END)
        _log.warning(
            "%s: dropped a torn final line (%d bytes, a write cut off by a crash); every "
            "complete record is kept, the fragment is saved in %s",
            self.path,
            cut,
            aside,
        )

    def close(self) -> None:
        self._file.close()


def open_store(path: str | os.PathLike[str], *, read_only: bool = False) -> LoomStore:
    """A store for ``path``, chosen by suffix: ``.jsonl`` or SQLite for anything else
    (``read_only``: an existing file, read and never written)."""
    if str(path) == ":memory:":
        return MemoryStore()
    if Path(path).suffix == ".jsonl":
        return JSONLStore(path, read_only=read_only)
    return SQLiteStore(path, read_only=read_only)
