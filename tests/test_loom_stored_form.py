"""The loom's stored form (issue 46.2): a database row holds each piece of a turn once,
and reads back as the very turn that was appended; rows written before it read as
they always did.

``Turn.to_stored`` leaves out what ``Turn.from_dict`` rebuilds from the rest (the
utterance, the observation, a gate-call record's arguments and gate, default fields),
each only when the rebuilt value is the value. The shapes below are the turns where a
rebuilt value would differ (a custom utterance, arguments a gate rewrote, a repeated
call id, a NaN, a zero that is not ``False``): each must come back exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from cantrip import ToolCall
from cantrip._errors import LoomError
from cantrip.loom import EntityRecord, GateCallRecord, Loom, SQLiteStore, Turn, TurnMetadata
from cantrip.loom._codec import decode_record, encode_record
from cantrip.loom._model import with_columns
from cantrip.loom._postgres import PostgresStore

ENTITY = "entity-stored"
NEEDLE = "needle-4d1f"
"""An argument value that appears nowhere else in a turn: how often a row holds it."""


def entity() -> EntityRecord:
    return EntityRecord(entity_id=ENTITY, cantrip_id="cantrip-s", created_at="2026-01-01")


def _turn(sequence: int, **fields: Any) -> Turn:
    return Turn(
        id=f"turn-{sequence}",
        parent_id=None if sequence == 1 else f"turn-{sequence - 1}",
        entity_id=ENTITY,
        sequence=sequence,
        cantrip_id="cantrip-s",
        **fields,
    )


def typical(sequence: int = 1) -> Turn:
    """The loop's common turn: one call, no text, the record holding the call's own
    arguments, the observation its result."""
    call = ToolCall("c1", "charge", {"job": NEEDLE, "step": 2})
    record = GateCallRecord(
        gate="charge", args=call.arguments, result="charged", tool_call_id="c1", duration_ms=0.5
    )
    return _turn(
        sequence,
        intent="charge the job" if sequence == 1 else None,
        utterance=f"charge({call.arguments_json})",
        tool_calls=(call,),
        observation="charged",
        gate_calls=(record,),
        metadata=TurnMetadata(duration_ms=1.25, timestamp="2026-01-01T00:00:00+00:00"),
    )


def _shapes() -> dict[str, Turn]:
    a = ToolCall("a", "echo", {"text": "x", "n": [1, 2]})
    b = ToolCall("b", "echo", {"text": "y"})
    same_id = ToolCall("a", "echo", {"text": "second"})
    nan = ToolCall("n", "measure", {"value": math.nan, "inf": math.inf})
    raw = ToolCall("r", "echo", {}, raw_arguments='{"text": "unparsed', cut_off=True)
    echo_a = GateCallRecord(gate="echo", args=a.arguments, result="x", tool_call_id="a")
    echo_b = GateCallRecord(gate="echo", args=b.arguments, result={"k": [1, 2.5]}, tool_call_id="b")
    return {
        "typical": typical(),
        "text and two calls": _turn(
            1,
            content="let me look",
            thinking="hmm",
            utterance=f"let me look\necho({a.arguments_json})\necho({b.arguments_json})",
            tool_calls=(a, b),
            observation='x\n{"k": [1, 2.5]}',
            gate_calls=(echo_a, echo_b),
        ),
        "an utterance of its own": _turn(
            1, utterance="echo(x)", tool_calls=(a,), observation="seen", gate_calls=(echo_a,)
        ),
        "arguments the gate rewrote": _turn(
            1,
            utterance=f"echo({a.arguments_json})",
            tool_calls=(a,),
            observation="x",
            gate_calls=(
                GateCallRecord(
                    gate="echo",
                    args={"text": "x", "n": [1, 2], "added": True},
                    result="x",
                    tool_call_id="a",
                ),
            ),
        ),
        "the same arguments in another order": _turn(
            1,
            utterance=f"echo({a.arguments_json})",
            tool_calls=(a,),
            observation="x",
            gate_calls=(
                GateCallRecord(
                    gate="echo", args={"n": [1, 2], "text": "x"}, result="x", tool_call_id="a"
                ),
            ),
        ),
        "one for one: 1 is not true": _turn(
            1,
            utterance='flag({"on": 1})',
            tool_calls=(ToolCall("f", "flag", {"on": 1}),),
            observation="ok",
            gate_calls=(
                GateCallRecord(gate="flag", args={"on": True}, result="ok", tool_call_id="f"),
            ),
        ),
        "another gate than the call named": _turn(
            1,
            utterance=f"echo({a.arguments_json})",
            tool_calls=(a,),
            observation="x",
            gate_calls=(
                GateCallRecord(gate="echo_v2", args=a.arguments, result="x", tool_call_id="a"),
            ),
        ),
        "a repeated call id": _turn(
            1,
            utterance=f"echo({a.arguments_json})\necho({same_id.arguments_json})",
            tool_calls=(a, same_id),
            observation="x\nsecond",
            gate_calls=(
                echo_a,
                GateCallRecord(
                    gate="echo", args=same_id.arguments, result="second", tool_call_id="a"
                ),
            ),
        ),
        "a record without a call id beside a call": _turn(
            1,
            utterance=f"echo({a.arguments_json})",
            tool_calls=(a,),
            observation="x",
            gate_calls=(GateCallRecord(gate="echo", args=a.arguments, result="x"),),
        ),
        "records in another order than their calls": _turn(
            1,
            utterance=f"echo({a.arguments_json})\necho({b.arguments_json})",
            tool_calls=(a, b),
            observation='{"k": [1, 2.5]}\nx',
            gate_calls=(echo_b, echo_a),
        ),
        "a call id no call of the turn has": _turn(
            1,
            utterance=f"echo({a.arguments_json})",
            tool_calls=(a,),
            observation="x",
            gate_calls=(
                GateCallRecord(gate="echo", args=a.arguments, result="x", tool_call_id="zz"),
            ),
        ),
        "more records than calls": _turn(
            1,
            utterance=f"echo({a.arguments_json})",
            tool_calls=(a,),
            observation="x\nx",
            gate_calls=(echo_a, GateCallRecord(gate="echo", args={"text": "x"}, result="x")),
        ),
        "a NaN and an infinity": _turn(
            1,
            utterance=f"measure({nan.arguments_json})",
            tool_calls=(nan,),
            observation="NaN",
            gate_calls=(
                GateCallRecord(
                    gate="measure", args=nan.arguments, result=math.nan, tool_call_id="n"
                ),
            ),
        ),
        "raw arguments, cut off": _turn(
            1,
            utterance='echo({"text": "unparsed)',
            tool_calls=(raw,),
            observation="",
            gate_calls=(
                GateCallRecord(
                    gate="echo",
                    args={},
                    result="cut off",
                    is_error=True,
                    tool_call_id="r",
                    status="skipped",
                ),
            ),
            truncated=True,
            reason="max_tokens",
        ),
        "code: calls without tool calls": _turn(
            1,
            utterance="print(echo('x'))",
            content="print(echo('x'))",
            observation="x\n",
            gate_calls=(GateCallRecord(gate="echo", args={"text": "x"}, result="x"),),
            extras={"console": "x\n"},
        ),
        "zeros that are not defaults": _turn(
            2,
            intent="",
            content="",
            observation="",
            result=0,
            terminated=True,
            reason="done",
            metadata=TurnMetadata(
                duration_ms=0,
                attempts=2,
                tokens_prompt=0,
                model="",
                usage_missing=True,
                cost_usd=0.0,
            ),
            gate_calls=(
                GateCallRecord(
                    gate="done",
                    args={"answer": 0},
                    result=0,
                    duration_ms=0,
                    status="ok",
                    is_error=False,
                ),
            ),
        ),
        "a result of false": _turn(1, result=False, terminated=True, observation="not heard"),
        "nothing but the columns": Turn(id="turn-1", parent_id=None, entity_id=ENTITY, sequence=1),
    }


SHAPES = _shapes()


def _exact(turn: Turn) -> str:
    """A turn as an export writes it (a NaN reads back as null there, as ever)."""
    return encode_record(turn.to_dict())


@pytest.mark.parametrize("name", list(SHAPES))
def test_the_stored_form_reads_back_as_the_turn(name: str) -> None:
    turn = SHAPES[name]
    columns = [None, turn.id, turn.parent_id, turn.entity_id, turn.sequence]
    back = Turn.from_dict(with_columns(decode_record(encode_record(turn.to_stored())), columns))
    as_before = Turn.from_dict(decode_record(encode_record(turn.to_dict())))
    assert _exact(back) == _exact(as_before)  # what the old form reads back, exactly
    if name != "a NaN and an infinity":  # (NaN != NaN)
        assert back == as_before == turn


def test_the_common_turn_is_stored_without_repeating_itself() -> None:
    stored = typical().to_stored()
    text = encode_record(stored)
    assert text.count(NEEDLE) == 1  # the call's arguments, nowhere else
    assert not {"id", "parent_id", "entity_id", "sequence"} & set(stored)  # the row's columns
    assert "utterance" not in stored and "observation" not in stored
    # the record's call is the turn's call at its place: its id is not written again
    assert stored["gate_calls"] == [{"result": "charged", "duration_ms": 0.5}]
    assert len(text) < len(encode_record(typical().to_dict())) * 0.6


# -- through the stores ------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def where(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if store_kind == "sqlite":
        return str(tmp_path / "loom.db")
    return str(request.getfixturevalue("pg_url"))


def _open(where: str) -> Loom:
    if where.startswith("postgresql"):
        return Loom(PostgresStore(where))
    return Loom(SQLiteStore(Path(where)))


@pytest.fixture
def loom(where: str) -> Iterator[Loom]:
    opened = _open(where)
    opened.register_entity(entity())
    yield opened
    opened.close()


def _append(loom: Loom, *turns: Turn) -> None:
    """Append and commit (a PostgreSQL loom queues its writes for a group commit)."""
    for turn in turns:
        loom.append(turn)
    trio.run(loom.sync)


def _raw_rows(where: str) -> list[tuple[str, str]]:
    """(id, data) of every stored turn, as the table holds them."""
    if where.startswith("postgresql"):
        with psycopg.connect(where) as conn:
            return conn.execute("SELECT id, data FROM cantrip_turns ORDER BY pos").fetchall()
    import sqlite3

    db = sqlite3.connect(where)
    try:
        return db.execute("SELECT id, data FROM turns ORDER BY pos").fetchall()
    finally:
        db.close()


def _insert_raw(where: str, turn: Turn, data: str) -> None:
    row = (turn.id, turn.parent_id, turn.entity_id, turn.sequence, data)
    if where.startswith("postgresql"):
        with psycopg.connect(where) as conn:
            conn.execute(
                "INSERT INTO cantrip_turns (id, parent_id, entity_id, sequence, data) "
                "VALUES (%s, %s, %s, %s, %s)",
                row,
            )
        return
    import sqlite3

    db = sqlite3.connect(where)
    try:
        db.execute(
            "INSERT INTO turns (id, parent_id, entity_id, sequence, data) VALUES (?,?,?,?,?)", row
        )
        db.commit()
    finally:
        db.close()


def test_a_stored_row_holds_the_arguments_once(loom: Loom, where: str) -> None:
    """Fails before the stored form: the utterance, the call and its record each held
    the arguments (three times)."""
    turn = typical()
    _append(loom, turn)
    ((_, data),) = _raw_rows(where)
    assert data.count(NEEDLE) == 1
    reopened = _open(where)
    try:
        assert reopened.get(turn.id) == turn
        assert _exact(reopened.get(turn.id)) == _exact(turn)
    finally:
        reopened.close()


def test_every_shape_reads_back_from_the_store(loom: Loom, where: str) -> None:
    appended = []
    for i, turn in enumerate(SHAPES.values(), start=1):
        moved = Turn.from_dict(
            {
                **turn.to_dict(),
                "id": f"turn-{i}",
                "sequence": i,
                "parent_id": None if i == 1 else f"turn-{i - 1}",
            }
        )
        appended.append(moved)
    _append(loom, *appended)
    reopened = _open(where)
    try:
        assert [_exact(t) for t in reopened.entity_turns(ENTITY)] == [_exact(t) for t in appended]
    finally:
        reopened.close()


def test_a_row_in_the_old_form_reads_as_it_did(loom: Loom, where: str) -> None:
    """A row written before the stored form (``to_dict``'s record, as every earlier
    version wrote it) reads back identically, beside rows in the new form."""
    old, new = typical(1), typical(2)
    _insert_raw(where, old, encode_record(old.to_dict()))
    _append(loom, new)
    reopened = _open(where)
    try:
        assert list(reopened.entity_turns(ENTITY)) == [old, new]
        assert reopened.get(old.id).to_dict() == old.to_dict()
        assert reopened.thread(new.id) == [old, new]
    finally:
        reopened.close()
    stored = dict(_raw_rows(where))
    assert "form" not in decode_record(stored[old.id])
    assert decode_record(stored[new.id])["form"] == 3


def test_a_row_in_form_2_reads_as_it_did(loom: Loom, where: str) -> None:
    """Form 2 (written before form 3) left a gate-call record's ``tool_call_id`` out only
    when it had none: such a record still reads back without one, though the turn has
    a call at its place; one that named its call reads back as ever."""
    call = ToolCall("c9", "echo", {"text": "x"})
    turn = _turn(
        1,
        utterance=f"echo({call.arguments_json})",
        tool_calls=(call,),
        observation="x\ny",
        gate_calls=(
            GateCallRecord(gate="echo", args={"text": "x"}, result="x"),
            GateCallRecord(gate="echo", args=call.arguments, result="y", tool_call_id="c9"),
        ),
    )
    form_2 = {
        "form": 2,
        "cantrip_id": "cantrip-s",
        "tool_calls": [{"id": "c9", "name": "echo", "arguments": {"text": "x"}}],
        "gate_calls": [
            {"gate": "echo", "args": {"text": "x"}, "result": "x"},
            {"result": "y", "tool_call_id": "c9"},
        ],
    }
    _insert_raw(where, turn, encode_record(form_2))
    reopened = _open(where)
    try:
        back = reopened.get(turn.id)
        assert back == turn
        assert [r.tool_call_id for r in back.gate_calls] == [None, "c9"]
    finally:
        reopened.close()


def test_a_damaged_stored_record_names_the_turn() -> None:
    """A record in the stored form whose gate call lost its call says so, naming the
    turn, instead of reading as a call without arguments."""
    stored = with_columns(typical().to_stored(), [None, "turn-1", None, ENTITY, 1])
    stored["tool_calls"] = []
    with pytest.raises(LoomError, match=r"turn-1: .* names no tool call"):
        Turn.from_dict(stored)
