"""The loom and its stores: append-only, ordered, durable across processes."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cantrip import LoomAppendOnlyError, LoomError, ToolCall
from cantrip.loom import (
    EntityRecord,
    GateCallRecord,
    JSONLStore,
    Loom,
    MemoryStore,
    SQLiteStore,
    Turn,
    TurnMetadata,
)

ENTITY = "entity-1"
CANTRIP = "cantrip-1"

READER = textwrap.dedent(
    """
    import json, sys
    from cantrip.loom import Loom

    loom = Loom.open(sys.argv[1])
    print(json.dumps({
        "ids": [t.id for t in loom.turns],
        "turns": [t.to_dict() for t in loom.turns],
        "rewards": {t.id: loom.reward(t.id) for t in loom.turns},
        "entities": sorted(loom.entities),
    }))
    loom.close()
    """
)


def entity_record(entity_id: str = ENTITY) -> EntityRecord:
    return EntityRecord(
        entity_id=entity_id,
        cantrip_id=CANTRIP,
        identity={"system_prompt": "be brief", "temperature": 0.25},
        llm="scripted",
        created_at="2024-01-01T00:00:00.000000+00:00",
    )


def make_turn(
    turn_id: str,
    parent_id: str | None,
    sequence: int,
    *,
    entity_id: str = ENTITY,
    text: str | None = None,
) -> Turn:
    """A turn with every field populated, so a store round trip is a real check."""
    call = ToolCall(f"call-{turn_id}", "echo", {"text": text or turn_id, "n": [1, 2]})
    return Turn(
        id=turn_id,
        parent_id=parent_id,
        entity_id=entity_id,
        sequence=sequence,
        cantrip_id=CANTRIP,
        intent="do the thing" if parent_id is None else None,
        utterance=f"echo({turn_id})",
        content=text,
        thinking="hmm",
        tool_calls=(call,),
        observation=text or turn_id,
        gate_calls=(
            GateCallRecord(
                gate="echo",
                args={"text": text or turn_id, "n": [1, 2]},
                result={"echoed": text or turn_id, "list": [1, "two"]},
                tool_call_id=call.id,
                duration_ms=1.5,
                detail={"ephemeral": False},
            ),
        ),
        metadata=TurnMetadata(
            tokens_prompt=10 * sequence,
            tokens_completion=sequence,
            duration_ms=2.25,
            timestamp=f"2024-01-01T00:00:0{sequence % 10}.000000+00:00",
            model="m",
            provider="scripted",
        ),
        extras={"console": "out", "nested": {"k": [1, 2]}},
    )


def new_loom(kind: str, tmp_path: Path) -> Loom:
    if kind == "memory":
        return Loom(MemoryStore())
    if kind == "sqlite":
        return Loom(SQLiteStore(tmp_path / "loom.db"))
    return Loom(JSONLStore(tmp_path / "loom.jsonl"))


def loom_path(kind: str, tmp_path: Path) -> Path:
    return tmp_path / ("loom.db" if kind == "sqlite" else "loom.jsonl")


def read_in_subprocess(path: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", READER, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def as_json(turn: Turn) -> Any:
    return json.loads(json.dumps(turn.to_dict()))


def build_chain(loom: Loom, n: int = 3) -> list[Turn]:
    loom.register_entity(entity_record())
    turns = []
    parent = None
    for i in range(1, n + 1):
        turn = make_turn(f"t{i}", parent, i, text=f"text {i}")
        loom.append(turn)
        turns.append(turn)
        parent = turn.id
    return turns


def build_tree(loom: Loom) -> dict[str, Turn]:
    """r -> a -> b, r -> c, a -> d; recorded r, a, c, b, d.

    Leaf creation order (c, b, d) differs from depth-first order (b, d, c).
    """
    loom.register_entity(entity_record())
    spec = [("r", None, 1), ("a", "r", 2), ("c", "r", 2), ("b", "a", 3), ("d", "a", 3)]
    turns = {}
    for turn_id, parent, seq in spec:
        turns[turn_id] = loom.append(make_turn(turn_id, parent, seq))
    return turns


@pytest.fixture
def closing() -> Iterator[Callable[[Loom], Loom]]:
    opened: list[Loom] = []

    def track(loom: Loom) -> Loom:
        opened.append(loom)
        return loom

    yield track
    for loom in opened:
        loom.close()


STORES = ["memory", "sqlite", "jsonl"]
DURABLE = ["sqlite", "jsonl"]


# -- append and read back --------------------------------------------------------


@pytest.mark.parametrize("kind", STORES)
def test_append_then_read_back_in_order(kind: str, tmp_path: Path, closing: Any) -> None:
    loom = closing(new_loom(kind, tmp_path))
    turns = build_chain(loom, 5)
    assert [t.id for t in loom.turns] == ["t1", "t2", "t3", "t4", "t5"]
    assert list(loom.turns) == turns
    assert len(loom) == 5
    assert loom.get("t3") == turns[2]
    assert list(loom.entity_turns(ENTITY)) == turns
    assert loom.last_turn(ENTITY) == turns[-1]
    assert loom.entity(ENTITY) == entity_record()
    assert loom.identity == {"system_prompt": "be brief", "temperature": 0.25}


@pytest.mark.parametrize("kind", DURABLE)
def test_reopen_in_same_process_reads_identical_turns(
    kind: str, tmp_path: Path, closing: Any
) -> None:
    loom = new_loom(kind, tmp_path)
    turns = build_chain(loom, 4)
    loom.close()
    reopened = closing(Loom.open(loom_path(kind, tmp_path)))
    assert list(reopened.turns) == turns
    assert reopened.entities == {ENTITY: entity_record()}
    assert reopened.thread("t4") == turns


@pytest.mark.parametrize("kind", DURABLE)
def test_reopened_by_a_separate_process(kind: str, tmp_path: Path, closing: Any) -> None:
    # The writer stays open: each record must be durable as soon as append returns.
    loom = closing(new_loom(kind, tmp_path))
    turns = build_chain(loom, 3)
    seen = read_in_subprocess(loom_path(kind, tmp_path))
    assert seen["ids"] == ["t1", "t2", "t3"]
    assert seen["turns"] == [as_json(t) for t in turns]
    assert seen["entities"] == [ENTITY]
    # ... and the other process saw exactly what this one reads back itself.
    reopened = closing(Loom.open(loom_path(kind, tmp_path)))
    assert [as_json(t) for t in reopened.turns] == seen["turns"]


def test_memory_store_keeps_nothing_across_looms() -> None:
    store = MemoryStore()
    loom = Loom(store)
    build_chain(loom, 2)
    assert len(Loom(store)) == 0


# -- rewards ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", DURABLE)
def test_reward_annotation_persists_across_reopen(kind: str, tmp_path: Path, closing: Any) -> None:
    loom = closing(new_loom(kind, tmp_path))
    build_chain(loom, 3)
    loom.annotate_reward("t2", 0.75)
    assert loom.reward("t2") == 0.75
    assert loom.reward("t1") is None
    seen = read_in_subprocess(loom_path(kind, tmp_path))
    assert seen["rewards"] == {"t1": None, "t2": 0.75, "t3": None}
    reopened = closing(Loom.open(loom_path(kind, tmp_path)))
    assert reopened.reward("t2") == 0.75
    assert reopened.reward("t3") is None


@pytest.mark.parametrize("kind", DURABLE)
def test_last_reward_annotation_wins(kind: str, tmp_path: Path, closing: Any) -> None:
    loom = closing(new_loom(kind, tmp_path))
    build_chain(loom, 2)
    loom.annotate_reward("t1", 0.1)
    loom.annotate_reward("t1", 0.9)
    loom.annotate_reward("t2", 1.0)
    assert loom.reward("t1") == 0.9
    seen = read_in_subprocess(loom_path(kind, tmp_path))
    assert seen["rewards"] == {"t1": 0.9, "t2": 1.0}


def test_jsonl_reward_annotations_are_appended_not_rewritten(tmp_path: Path) -> None:
    loom = Loom.open(tmp_path / "loom.jsonl")
    build_chain(loom, 1)
    loom.annotate_reward("t1", 0.1)
    loom.annotate_reward("t1", 0.9)
    loom.close()
    records = [json.loads(line) for line in (tmp_path / "loom.jsonl").read_text().splitlines()]
    assert [r["type"] for r in records] == ["entity", "turn", "reward", "reward"]
    assert [r["reward"] for r in records[2:]] == [0.1, 0.9]
    reopened = Loom.open(tmp_path / "loom.jsonl")
    try:
        assert reopened.reward("t1") == 0.9
    finally:
        reopened.close()


def test_annotating_an_unknown_turn_raises(tmp_path: Path, closing: Any) -> None:
    loom = closing(Loom.open(tmp_path / "loom.db"))
    build_chain(loom, 1)
    with pytest.raises(LoomError, match="nope"):
        loom.annotate_reward("nope", 1.0)


# -- append-only -----------------------------------------------------------------


@pytest.mark.parametrize("kind", STORES)
def test_delete_and_replace_are_refused(kind: str, tmp_path: Path, closing: Any) -> None:
    loom = closing(new_loom(kind, tmp_path))
    turns = build_chain(loom, 2)
    with pytest.raises(LoomAppendOnlyError, match="append-only"):
        loom.delete_turn("t1")
    with pytest.raises(LoomAppendOnlyError, match="append-only"):
        loom.replace_turn("t1", make_turn("t1", None, 1, text="rewritten"))
    assert list(loom.turns) == turns


@pytest.mark.parametrize("kind", STORES)
def test_duplicate_turn_id_is_refused(kind: str, tmp_path: Path, closing: Any) -> None:
    loom = closing(new_loom(kind, tmp_path))
    turns = build_chain(loom, 2)
    with pytest.raises(LoomAppendOnlyError, match="append-only"):
        loom.append(make_turn("t1", "t2", 3, text="impostor"))
    assert list(loom.turns) == turns


@pytest.mark.parametrize("kind", DURABLE)
def test_duplicate_turn_id_is_refused_after_reopen(kind: str, tmp_path: Path, closing: Any) -> None:
    loom = new_loom(kind, tmp_path)
    build_chain(loom, 2)
    loom.close()
    reopened = closing(Loom.open(loom_path(kind, tmp_path)))
    with pytest.raises(LoomAppendOnlyError):
        reopened.append(make_turn("t2", "t1", 2, text="impostor"))
    assert len(reopened) == 2


def test_duplicate_entity_is_refused() -> None:
    loom = Loom()
    loom.register_entity(entity_record())
    with pytest.raises(LoomAppendOnlyError, match="append-only"):
        loom.register_entity(entity_record())


@pytest.mark.parametrize("kind", STORES)
def test_unknown_parent_is_refused(kind: str, tmp_path: Path, closing: Any) -> None:
    loom = closing(new_loom(kind, tmp_path))
    build_chain(loom, 1)
    with pytest.raises(LoomError, match="unknown parent ghost"):
        loom.append(make_turn("orphan", "ghost", 2))
    assert [t.id for t in loom.turns] == ["t1"]
    with pytest.raises(LoomError):
        loom.get("orphan")


def test_unregistered_entity_is_refused() -> None:
    loom = Loom()
    with pytest.raises(LoomError, match="unregistered entity"):
        loom.append(make_turn("t1", None, 1, entity_id="stranger"))
    assert len(loom) == 0


def test_unknown_parent_is_not_written_to_disk(tmp_path: Path) -> None:
    loom = Loom.open(tmp_path / "loom.jsonl")
    build_chain(loom, 1)
    with pytest.raises(LoomError):
        loom.append(make_turn("orphan", "ghost", 2))
    loom.close()
    assert read_in_subprocess(tmp_path / "loom.jsonl")["ids"] == ["t1"]


# -- the SQLite triggers ---------------------------------------------------------


def test_sqlite_triggers_refuse_raw_delete_and_update(tmp_path: Path) -> None:
    path = tmp_path / "loom.db"
    loom = Loom.open(path)
    turns = build_chain(loom, 2)
    loom.close()

    raw = sqlite3.connect(path)
    try:
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            raw.execute("DELETE FROM turns")
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            raw.execute("DELETE FROM turns WHERE id = 't2'")
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            raw.execute("UPDATE turns SET data = '{}' WHERE id = 't1'")
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            raw.execute("UPDATE turns SET parent_id = NULL WHERE id = 't2'")
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            raw.execute("DELETE FROM entities")
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            raw.execute("UPDATE entities SET data = '{}'")
        raw.commit()
        assert raw.execute("SELECT COUNT(*) FROM turns").fetchone() == (2,)

        # The reward column is the one thing that may change (LOOM-3).
        raw.execute("UPDATE turns SET reward = 0.5 WHERE id = 't1'")
        raw.commit()
    finally:
        raw.close()

    reopened = Loom.open(path)
    try:
        assert list(reopened.turns) == turns
        assert reopened.reward("t1") == 0.5
        assert reopened.reward("t2") is None
    finally:
        reopened.close()


def test_sqlite_raw_errors_are_integrity_errors(tmp_path: Path) -> None:
    path = tmp_path / "loom.db"
    loom = Loom.open(path)
    build_chain(loom, 1)
    loom.close()
    raw = sqlite3.connect(path)
    try:
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            raw.execute("DELETE FROM turns")
    finally:
        raw.close()


# -- threads ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", STORES)
def test_thread_is_root_to_leaf_in_a_branched_tree(kind: str, tmp_path: Path, closing: Any) -> None:
    loom = closing(new_loom(kind, tmp_path))
    t = build_tree(loom)
    assert [x.id for x in loom.thread("b")] == ["r", "a", "b"]
    assert [x.id for x in loom.thread("d")] == ["r", "a", "d"]
    assert [x.id for x in loom.thread("c")] == ["r", "c"]
    assert loom.thread("r") == [t["r"]]
    # an inner turn's thread stops at it
    assert [x.id for x in loom.thread("a")] == ["r", "a"]
    assert [x.id for x in loom.children("a")] == ["b", "d"]
    assert [x.id for x in loom.children(None)] == ["r"]
    assert [x.id for x in loom.children("b")] == []
    # a third sibling, and a child of a turn that had one
    loom.append(make_turn("e", "a", 3))
    loom.append(make_turn("f", "b", 4))
    assert [x.id for x in loom.children("a")] == ["b", "d", "e"]
    assert [x.id for x in loom.children("b")] == ["f"]
    assert [x.id for x in loom.leaves()] == ["c", "d", "e", "f"]
    with pytest.raises(LoomError):
        loom.thread("missing")


@pytest.mark.parametrize("kind", STORES)
def test_threads_are_ordered_by_leaf_creation(kind: str, tmp_path: Path, closing: Any) -> None:
    loom = closing(new_loom(kind, tmp_path))
    build_tree(loom)
    assert [x.id for x in loom.leaves()] == ["c", "b", "d"]
    assert [[x.id for x in th] for th in loom.threads()] == [
        ["r", "c"],
        ["r", "a", "b"],
        ["r", "a", "d"],
    ]


@pytest.mark.parametrize("kind", DURABLE)
def test_tree_survives_reopen(kind: str, tmp_path: Path, closing: Any) -> None:
    loom = new_loom(kind, tmp_path)
    build_tree(loom)
    expected = [[x.id for x in th] for th in loom.threads()]
    loom.close()
    reopened = closing(Loom.open(loom_path(kind, tmp_path)))
    assert [[x.id for x in th] for th in reopened.threads()] == expected
    assert [x.id for x in reopened.children("r")] == ["a", "c"]


# -- malformed JSONL -------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        "this is not json",
        '{"type": "turn", "id": "t9"',  # a write cut off mid-line
        "[1, 2]",
        '{"id": "t9"}',  # no record type
        '{"type": "bogus"}',
        '{"type": "turn", "id": "t9"}',  # a turn without its required fields
        '{"type": "entity"}',  # an entity without its ids
        '{"type": "reward"}',  # a reward without its turn
    ],
)
def test_malformed_jsonl_line_names_file_and_line(tmp_path: Path, line: str) -> None:
    path = tmp_path / "loom.jsonl"
    loom = Loom.open(path)
    build_chain(loom, 1)
    loom.close()
    with path.open("a", encoding="utf-8") as f:
        f.write(line + "\n")
    # entity on line 1, turn on line 2, the bad record on line 3
    with pytest.raises(LoomError, match=rf"{path.name}:3\b"):
        Loom.open(path)


def test_blank_lines_in_jsonl_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "loom.jsonl"
    loom = Loom.open(path)
    turns = build_chain(loom, 2)
    loom.close()
    path.write_text(path.read_text().replace("\n", "\n\n"))
    reopened = Loom.open(path)
    try:
        assert list(reopened.turns) == turns
    finally:
        reopened.close()


def test_open_chooses_store_by_suffix(tmp_path: Path) -> None:
    jsonl = Loom.open(tmp_path / "x.jsonl")
    db = Loom.open(tmp_path / "x.db")
    try:
        assert isinstance(jsonl.store, JSONLStore)
        assert isinstance(db.store, SQLiteStore)
        assert isinstance(Loom.open(":memory:").store, MemoryStore)
    finally:
        jsonl.close()
        db.close()
