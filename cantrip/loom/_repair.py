"""Telling a loom from other files, checking a damaged one, and salvaging what it holds.

Opening a file as a loom must never write to a file that is not one (issue 20):
:func:`ensure_loom` looks before anything is opened for writing -- a missing or
empty file becomes a new loom; a ``.jsonl`` file must start with a loom record;
anything else must be an SQLite database that is empty or has the loom's
tables. A database SQLite cannot read is *damaged*, and the error says how to
get back what is readable:

* :func:`check` (``cantrip loom FILE check``) runs SQLite's ``integrity_check``
  (read-only) and reads every record it can, reporting what is intact;
* :func:`recover` (``cantrip loom FILE recover NEW``) copies the complete turns
  -- a record that parses, whose entity and parent were salvaged too -- into a
  new loom file, in their original order, with their rewards. The damaged file
  is only read.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import attrs
import orjson

from cantrip._errors import LoomError
from cantrip.loom._blobs import decode_blob, intact, internalize
from cantrip.loom._model import EntityRecord, Turn, with_columns

SQLITE_MAGIC = b"SQLite format 3\x00"
LOOM_TABLES = frozenset({"entities", "turns"})
MAX_SKIPPED = 10_000
"""Consecutive unreadable row positions a salvage steps over before it stops."""


def damaged_hint(path: str | os.PathLike[str]) -> str:
    return (
        f"run 'cantrip loom {path} check' to see what is readable, and "
        f"'cantrip loom {path} recover NEW.db' to copy the complete turns into a new file"
    )


def ensure_loom(path: str | os.PathLike[str]) -> None:
    """Raise :class:`LoomError` unless ``path`` is a loom, or nothing yet (never writes)."""
    file = Path(path)
    if not file.exists():
        return
    if file.is_dir():
        raise LoomError(f"{file} is a folder, not a loom file")
    if file.stat().st_size == 0:
        return
    with file.open("rb") as handle:
        head = handle.read(4096)
    if file.suffix == ".jsonl":
        if not _first_line_is_record(file):
            raise LoomError(f"{file} is not a loom: its first line is not a loom record")
        return
    if not head.startswith(SQLITE_MAGIC):
        what = "text" if _looks_like_text(head) else "data"
        raise LoomError(
            f"{file} is not a loom: it is not an SQLite database (it holds {what}); "
            "a loom is an SQLite file, or a .jsonl file"
        )
    tables = _tables(file)
    if tables and not tables >= LOOM_TABLES:
        listed = ", ".join(sorted(tables)[:5])
        raise LoomError(
            f"{file} is not a loom: it is an SQLite database of something else (tables: {listed})"
        )


def _first_line_is_record(file: Path) -> bool:
    with file.open("rb") as handle:
        line = handle.readline()
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return False
    return isinstance(record, dict) and "type" in record


def _looks_like_text(head: bytes) -> bool:
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return b"\x00" not in head


def _tables(file: Path) -> set[str]:
    """The tables of an SQLite file; a damaged schema is a :class:`LoomError`.

    Opened ``immutable``: no lock, no ``-shm`` or ``-wal`` file is created -- looking
    leaves no trace. (A schema still only in a live loom's WAL reads as no tables:
    an empty database, which is a loom to be.) If that read fails while a WAL file
    is present -- another process is writing the loom -- it is read again the
    ordinary way, through the WAL, before the file is called damaged."""
    uri = file.resolve().as_uri()
    attempts = [f"{uri}?immutable=1"]
    if file.with_name(file.name + "-wal").exists():
        attempts.append(f"{uri}?mode=ro")
    problem: sqlite3.DatabaseError | None = None
    for target in attempts:
        try:
            db = sqlite3.connect(target, uri=True)
            try:
                rows = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
            finally:
                db.close()
        except sqlite3.DatabaseError as exc:
            problem = exc
            continue
        return {str(name) for (name,) in rows}
    raise LoomError(f"{file} is a damaged loom ({problem}); {damaged_hint(file)}")


# -- check and salvage ------------------------------------------------------------------


@attrs.define
class Salvage:
    """What could be read from a loom file."""

    path: str
    kind: str
    integrity: list[str] = attrs.field(factory=list)
    """SQLite's ``integrity_check`` lines (``["ok"]`` for an intact database)."""
    entities: list[EntityRecord] = attrs.field(factory=list)
    turns: list[Turn] = attrs.field(factory=list)
    rewards: dict[str, float] = attrs.field(factory=dict)
    unreadable: int = 0
    """Records (rows or lines) that could not be read or parsed."""
    orphans: int = 0
    """Turns that parse but whose entity or parent was lost: not complete."""
    damaged_blobs: int = 0
    """Big values whose content no longer hashes to their key (their turns are kept
    with a note in the value's place)."""

    @property
    def intact(self) -> bool:
        return (
            self.integrity in ([], ["ok"])
            and not self.unreadable
            and not self.orphans
            and not self.damaged_blobs
        )

    def summary(self) -> dict[str, Any]:
        return {
            "file": self.path,
            "kind": self.kind,
            "intact": self.intact,
            "integrity": self.integrity,
            "entities": len(self.entities),
            "complete_turns": len(self.turns),
            "unreadable_records": self.unreadable,
            "orphaned_turns": self.orphans,
            "damaged_blobs": self.damaged_blobs,
        }


def salvage(path: str | os.PathLike[str]) -> Salvage:
    """Read every record of a loom file that can be read, without writing to it."""
    file = Path(path)
    if not file.is_file():
        raise LoomError(f"no loom file at {file}")
    if file.suffix == ".jsonl":
        found = _salvage_jsonl(file)
    else:
        with file.open("rb") as handle:
            if not handle.read(16).startswith(SQLITE_MAGIC):
                raise LoomError(f"{file} is not a loom: it is not an SQLite database")
        found = _salvage_sqlite(file)
    _keep_complete(found)
    return found


class LoomWriter(Protocol):
    """What recovering needs of a loom: register, append, annotate, close."""

    def register_entity(self, record: EntityRecord) -> None: ...
    def append(self, turn: Turn) -> object: ...
    def annotate_reward(self, turn_id: str, reward: float | None) -> None: ...
    def close(self) -> None: ...


def check(path: str | os.PathLike[str]) -> Salvage:
    """:func:`salvage`, for its report (``cantrip loom FILE check``)."""
    return salvage(path)


def recover(
    path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    open_loom: Callable[[Path], LoomWriter],
) -> Salvage:
    """Copy the complete turns of ``path`` into the new loom file ``out``, opened with
    ``open_loom`` (``Loom.open``: the layer above hands it down, so this module needs
    no import of the loom it repairs)."""
    target = Path(out)
    if target.exists():
        raise LoomError(f"{target} exists; recover writes a new file")
    if target.resolve() == Path(path).resolve():
        raise LoomError("recover writes a new file; give another name")
    found = salvage(path)
    loom = open_loom(target)
    try:
        for record in found.entities:
            loom.register_entity(record)
        for turn in found.turns:
            loom.append(turn)
            if turn.id in found.rewards:
                loom.annotate_reward(turn.id, found.rewards[turn.id])
    finally:
        loom.close()
    return found


def _salvage_jsonl(file: Path) -> Salvage:
    found = Salvage(str(file), "jsonl")
    rewards: dict[str, float | None] = {}
    blobs: dict[str, Any] = {}
    with file.open("rb") as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
                kind = obj.pop("type")
                if kind == "entity":
                    found.entities.append(EntityRecord.from_dict(obj))
                elif kind == "turn":
                    record = internalize(obj, _salvaged(blobs.get), damaged=_damaged)
                    found.turns.append(Turn.from_dict(record))
                elif kind == "blob":
                    blobs[str(obj["hash"])] = obj["data"]
                    if not intact(str(obj["hash"]), obj["data"]):
                        found.damaged_blobs += 1
                elif kind == "reward":
                    rewards[str(obj["turn_id"])] = obj["reward"]
                else:
                    found.unreadable += 1
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
                found.unreadable += 1
    found.rewards = {k: float(v) for k, v in rewards.items() if v is not None}
    return found


def _salvage_sqlite(file: Path) -> Salvage:
    """Read from a private copy (with its WAL, if any): the damaged file is never
    opened for writing. The copy's header page count is cleared, so SQLite sizes
    the database by the file -- what a truncated copy needs to be read at all."""
    found = Salvage(str(file), "sqlite")
    with tempfile.TemporaryDirectory(prefix="cantrip-salvage-") as scratch:
        copy = Path(scratch) / "loom.db"
        shutil.copyfile(file, copy)
        wal = file.with_name(file.name + "-wal")
        if wal.is_file():
            shutil.copyfile(wal, copy.with_name("loom.db-wal"))
        with copy.open("r+b") as handle:
            handle.seek(28)  # "in-header database size" (https://sqlite.org/fileformat.html)
            handle.write(b"\0\0\0\0")
        try:
            db = sqlite3.connect(copy)
        except sqlite3.DatabaseError as exc:
            found.integrity = [str(exc)]
            return found
        _read_sqlite(db, found)
    return found


def _read_sqlite(db: sqlite3.Connection, found: Salvage) -> None:
    try:
        try:
            rows = db.execute("PRAGMA integrity_check(20)").fetchall()
            found.integrity = [line for (text,) in rows for line in str(text).splitlines()]
        except sqlite3.DatabaseError as exc:
            found.integrity = [str(exc)]
        for data, _, _ in _rows(db, "entities", found):
            try:
                found.entities.append(EntityRecord.from_dict(orjson.loads(data)))
            except (orjson.JSONDecodeError, TypeError, ValueError):
                found.unreadable += 1
        fetch = _salvaged(functools.partial(_sqlite_blob, db))
        for data, reward, columns in _rows(db, "turns", found):
            try:
                record = with_columns(orjson.loads(data), [data, *columns])
                turn = Turn.from_dict(internalize(record, fetch, damaged=_damaged))
            except (orjson.JSONDecodeError, TypeError, ValueError, KeyError, AttributeError):
                found.unreadable += 1
                continue
            found.turns.append(turn)
            if reward is not None:
                found.rewards[turn.id] = float(reward)
        found.damaged_blobs = _damaged_blobs(db)
    finally:
        db.close()


def _damaged_blobs(db: sqlite3.Connection) -> int:
    """Blobs whose content no longer hashes to their key (a loom older than blobs
    has none)."""
    count = 0
    try:
        for digest, data in db.execute("SELECT hash, data FROM blobs"):
            try:
                good = intact(str(digest), decode_blob(data))
            except (ValueError, TypeError, KeyError):
                good = False
            count += not good
    except sqlite3.DatabaseError:
        return count  # no blobs table, or damage the integrity check reports
    return count


def _damaged(digest: str) -> str:
    """What salvage reads in place of a big value that does not match its key."""
    return f"[a large value (blob {digest[:12]}) is damaged: it does not match its key]"


def _sqlite_blob(db: sqlite3.Connection, digest: str) -> Any:
    try:
        row = db.execute("SELECT data FROM blobs WHERE hash = ?", (digest,)).fetchone()
    except sqlite3.DatabaseError:
        return None
    return None if row is None else decode_blob(row[0])


def _salvaged(fetch: Callable[[str], Any]) -> Callable[[str], Any]:
    """A blob lookup for salvage: a big value the damage took is said, not fatal."""

    def found(digest: str) -> Any:
        value = fetch(digest)
        return (
            f"[a large value (blob {digest[:12]}) was lost with the damage]"
            if value is None
            else value
        )

    return found


def _rows(
    db: sqlite3.Connection, table: str, found: Salvage
) -> Iterator[tuple[Any, Any, list[Any]]]:
    """(data, reward, the columns a stored turn leaves out of its data) of the rows in
    order of position, stepping over the ones SQLite cannot read.

    Reads in batches while the table reads cleanly; after the first error, one
    row at a time, so the rows before and after a damaged page are still found."""
    column = "reward" if table == "turns" else "NULL"
    columns = ", id, parent_id, entity_id, sequence" if table == "turns" else ""
    query = f"SELECT pos, data, {column}{columns} FROM {table} WHERE pos > ? ORDER BY pos LIMIT ?"
    last, skipped, batch_size = 0, 0, 256
    while skipped < MAX_SKIPPED:
        try:
            batch = db.execute(query, (last, batch_size)).fetchall()
        except sqlite3.DatabaseError:
            if batch_size > 1:
                batch_size = 1  # find out exactly which row cannot be read
                continue
            last += 1  # this position (or the page holding it) is lost: step over it
            skipped += 1
            if skipped == 1:
                found.unreadable += 1
            continue
        if not batch:
            return
        for pos, data, reward, *columns in batch:
            if not isinstance(pos, int) or pos <= last:
                # A damaged page can answer with rows out of order: never go back.
                last += 1
                skipped += 1
                found.unreadable += 1
                break
            skipped = 0
            last = pos
            yield data, reward, columns


def _keep_complete(found: Salvage) -> None:
    """Keep the turns that can stand in a loom: known entity, known (kept) parent."""
    entities = {e.entity_id for e in found.entities}
    kept: list[Turn] = []
    ids: set[str] = set()
    for turn in found.turns:
        if turn.entity_id in entities and (turn.parent_id is None or turn.parent_id in ids):
            kept.append(turn)
            ids.add(turn.id)
        else:
            found.orphans += 1
    found.turns = kept
    found.rewards = {k: v for k, v in found.rewards.items() if k in ids}


def report_lines(found: Salvage) -> list[str]:
    """``cantrip loom FILE check`` as text."""
    data = found.summary()
    state = "intact" if found.intact else "DAMAGED"
    lines = [f"{found.path}: {found.kind} loom, {state}"]
    if found.kind == "sqlite":
        shown = [line for line in found.integrity if not line.startswith("***")][:3]
        more = len(found.integrity) - len(shown) - 1
        lines.append(f"  integrity check: {'; '.join(shown) or 'not run'}")
        if more > 0:
            lines.append(f"  ... and {more} more integrity problem(s)")
    lines.append(
        f"  readable: {data['entities']} entit(ies), {data['complete_turns']} complete turn(s)"
    )
    if found.damaged_blobs:
        lines.append(
            f"  damaged: {found.damaged_blobs} large value(s) whose content does not match "
            "its key (recover keeps their turns, with a note in their place)"
        )
    if found.unreadable or found.orphans:
        lines.append(
            f"  lost: {found.unreadable} unreadable record(s), {found.orphans} turn(s) whose "
            "entity or parent is lost"
        )
    return lines


def dumps(found: Salvage) -> str:
    return json.dumps(found.summary())
