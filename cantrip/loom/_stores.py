"""Where a loom's records live: in memory, in SQLite, or in a JSONL file.

A store only appends and reads back. The :class:`~cantrip.loom.Loom` keeps the
index (ids, parents, children) in memory and asks the store to make each record
durable before the next turn begins (LOOM-1). Stores are synchronous on
purpose: an SQLite commit in WAL mode costs tens of microseconds, far less than
handing it to a worker thread would.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Literal, Protocol

import orjson

from cantrip._errors import LoomAppendOnlyError, LoomError
from cantrip._redact import scrub_known, secret_values
from cantrip.loom._model import EntityRecord, Turn

Record = (
    tuple[Literal["entity"], EntityRecord]
    | tuple[Literal["turn"], Turn]
    | tuple[Literal["reward"], tuple[str, float | None]]
)


def _json(record: dict[str, Any]) -> str:
    """A record as compact JSON (non-JSON leaves, such as datetimes, as text).

    Serialising is on every append's path (LOOM-1 commits each turn before the
    next begins); orjson does it several times faster than the standard library.

    Every record is checked for the secret values the environment holds before
    it is written, and scrubbed if one is there (PROD-8: the loom is not a
    credential store): a provider error quoting the key is stored as
    ``[REDACTED]``, so an export made later, by a process that does not know
    the key, cannot leak it. Every durable store writes through here. (Shapes
    of credentials are redacted on the way out, by exports and front ends.)
    """
    text = orjson.dumps(record, default=str).decode()
    secrets = secret_values()
    if any(secret in text for secret in secrets):
        text = orjson.dumps(scrub_known(record, secrets), default=str).decode()
    return text


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
"""


class SQLiteStore:
    """The embedded default for a loom on disk.

    WAL mode, one commit per record. ``durability="normal"`` survives a crash
    of the process (the default); ``"full"`` also survives a power loss, at the
    cost of an fsync per turn. Append-only is enforced by triggers in the
    database itself, so another program cannot quietly edit history either.
    A loom written by one process can be opened and read by another.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, durability: Literal["normal", "full"] = "normal"
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.executescript(_SCHEMA)
        self._db.execute(f"PRAGMA synchronous={durability.upper()}")
        self._cursor = self._db.cursor()  # reused: one fewer object per append

    def append_entity(self, record: EntityRecord) -> None:
        self._db.execute(
            "INSERT INTO entities (entity_id, data) VALUES (?, ?)",
            (record.entity_id, _json(record.to_dict())),
        )

    def append_turn(self, turn: Turn) -> None:
        try:
            self._cursor.execute(
                "INSERT INTO turns (id, parent_id, entity_id, sequence, data) VALUES (?,?,?,?,?)",
                (
                    turn.id,
                    turn.parent_id,
                    turn.entity_id,
                    turn.sequence,
                    _json(turn.to_dict()),
                ),
            )
        except sqlite3.IntegrityError as exc:
            raise LoomAppendOnlyError(f"loom is append-only: turn {turn.id} exists") from exc

    def set_reward(self, turn_id: str, reward: float | None) -> None:
        cursor = self._db.execute("UPDATE turns SET reward = ? WHERE id = ?", (reward, turn_id))
        if cursor.rowcount != 1:
            raise LoomError(f"no turn {turn_id!r} in {self.path}")

    def load(self) -> Iterator[Record]:
        entities = self._db.execute("SELECT data FROM entities ORDER BY pos").fetchall()
        for (data,) in entities:
            yield "entity", EntityRecord.from_dict(orjson.loads(data))
        rows = self._db.execute("SELECT data, reward FROM turns ORDER BY pos").fetchall()
        for data, reward in rows:
            turn = Turn.from_dict(orjson.loads(data))
            yield "turn", turn
            if reward is not None:
                yield "reward", (turn.id, reward)

    def close(self) -> None:
        self._db.close()


class JSONLStore:
    """One JSON object per line, appended and flushed per record (spec 6.5's format).

    Reward annotations are appended as their own lines, so the file itself is
    append-only too; the last annotation of a turn wins when it is read back.
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fsync = fsync
        self._file: IO[str] = self.path.open("a+", encoding="utf-8")

    def _write(self, obj: dict[str, Any]) -> None:
        self._file.write(_json(obj) + "\n")
        self._file.flush()
        if self._fsync:
            os.fsync(self._file.fileno())

    def append_entity(self, record: EntityRecord) -> None:
        self._write({"type": "entity", **record.to_dict()})

    def append_turn(self, turn: Turn) -> None:
        self._write({"type": "turn", **turn.to_dict()})

    def set_reward(self, turn_id: str, reward: float | None) -> None:
        self._write({"type": "reward", "turn_id": turn_id, "reward": reward})

    def load(self) -> Iterator[Record]:
        self._file.seek(0)
        for number, line in enumerate(self._file, start=1):
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
            except json.JSONDecodeError as exc:
                raise LoomError(f"{self.path}:{number}: not JSON ({exc})") from exc
            if not isinstance(obj, dict) or "type" not in obj:
                raise LoomError(f"{self.path}:{number}: not a loom record (no 'type' field)")
            kind = obj.pop("type")
            try:
                if kind == "entity":
                    yield "entity", EntityRecord.from_dict(obj)
                elif kind == "turn":
                    yield "turn", Turn.from_dict(obj)
                elif kind == "reward":
                    yield "reward", (obj["turn_id"], obj["reward"])
                else:
                    raise LoomError(f"{self.path}:{number}: unknown record type {kind!r}")
            except (KeyError, TypeError, ValueError) as exc:
                raise LoomError(
                    f"{self.path}:{number}: malformed {kind} record ({type(exc).__name__}: {exc})"
                ) from exc
        self._file.seek(0, os.SEEK_END)

    def close(self) -> None:
        self._file.close()


def open_store(path: str | os.PathLike[str]) -> LoomStore:
    """A store for ``path``, chosen by suffix: ``.jsonl`` or SQLite for anything else."""
    if str(path) == ":memory:":
        return MemoryStore()
    if Path(path).suffix == ".jsonl":
        return JSONLStore(path)
    return SQLiteStore(path)
