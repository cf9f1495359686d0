"""The utterance's journal row and the first call's start it carries (issue 46.2).

A turn's utterance is journaled with the start of its first journaled call, in one row.
The start holds only what a reader cannot rebuild from the utterance: in the common
turn -- the call at that ordinal, its gate the call's name, its arguments the call's --
the record is ``{"start": 0}``; before, it held the gate, the call id and (the gate
being handed a copy of the arguments) the arguments again. Each shape where a rebuilt
piece would differ keeps that piece, and every shape reads back as the very entry the
journal's replay compares (``cantrip._journal``): a start read back wrong would run a
started call again, or not at all.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import psycopg
import pytest
import trio

import gates
from cantrip import Cantrip, Circle, Identity, ScriptedLLM, ToolCall, max_turns
from cantrip._journal import (
    UTTERANCE,
    _dumps,
    _first_start,
    _with_first_start,
    decode_response,
    encode_response,
)
from cantrip.llm._contract import Response
from cantrip.loom import Loom
from cantrip.loom._codec import decode_record


def _data(args: Any, tool_call_id: str | None) -> str:
    """A call's journal data, as :meth:`TurnJournal.call` makes it."""
    return _dumps({"args": args, "tool_call_id": tool_call_id})


def _call(call_id: str, name: str, **args: Any) -> ToolCall:
    return ToolCall(call_id, name, MappingProxyType(args))


SHAPES: dict[str, tuple[tuple[ToolCall, ...], int, str, dict[str, Any], str | None, str]] = {
    # name: (the utterance's calls, ordinal, gate, the arguments the gate got, call id,
    #        the record expected)
    "common": ((_call("call_7f3a", "charge", job="j", step=1),), 0, "charge",
               {"job": "j", "step": 1}, "call_7f3a", '{"start":0}'),
    "after an unjournaled call": (
        (_call("d0", "think"), _call("c1", "charge", job="j")), 1, "charge", {"job": "j"},
        "c1", '{"start":1}'),
    "the call of that id at another place": (
        (_call("c1", "charge", job="j"), _call("c0", "charge", job="k")), 0, "charge",
        {"job": "k"}, "c0", '{"start":0,"call":"c0"}'),
    "a gate of another name": ((_call("c0", "Charge", job="j"),), 0, "charge", {"job": "j"},
                               "c0", '{"start":0,"gate":"charge"}'),
    "arguments the runtime changed": ((_call("c0", "charge", job="j"),), 0, "charge",
                                      {"job": "j", "step": 1}, "c0", ""),
    "equal as values, not as data": ((_call("c0", "charge", n=1),), 0, "charge", {"n": True},
                                     "c0", ""),
    "a call without an id": ((_call("c0", "charge", job="j"),), 0, "charge", {"job": "j"},
                             None, ""),
    "a repeated id, the second": (
        (_call("c", "charge", n=1), _call("c", "charge", n=2)), 1, "charge", {"n": 2}, "c",
        '{"start":1}'),
    "a repeated id, the first with the second's arguments": (
        (_call("c", "charge", n=1), _call("c", "charge", n=2)), 0, "charge", {"n": 2}, "c", ""),
}  # fmt: skip


@pytest.mark.parametrize("name", list(SHAPES))
def test_a_first_start_reads_back_as_the_entry_it_stands_for(name: str) -> None:
    calls, ordinal, gate, args, call_id, expected = SHAPES[name]
    data = _data(args, call_id)
    utterance = encode_response(Response(content=None, tool_calls=calls))
    record = _first_start(ordinal, gate, data, args, call_id, calls)
    if expected:
        assert record == expected
    else:  # the start keeps its data (and gate): a rebuilt one would differ
        assert decode_record(record) == {"start": ordinal, "gate": gate, "data": data}
    entries = _with_first_start([(UTTERANCE, "", utterance, record)])
    assert entries[ordinal] == (ordinal, gate, data, None)
    assert entries[UTTERANCE] == (UTTERANCE, "", utterance, None)
    assert decode_response(utterance).tool_calls == calls


def test_a_start_in_the_older_forms_reads_as_it_did() -> None:
    """Rows written before: the gate always, and the call's id or its data."""
    calls = (_call("c0", "charge", job="j"),)
    utterance = encode_response(Response(content=None, tool_calls=calls))
    data = _data({"job": "j"}, "c0")
    for record in (
        '{"start":0,"gate":"charge","call":"c0"}',
        _dumps({"start": 0, "gate": "charge", "data": data}),
    ):
        entries = _with_first_start([(UTTERANCE, "", utterance, record)])
        assert entries[0] == (0, "charge", data, None)


def test_a_cast_journals_its_first_starts_as_an_ordinal_alone(pg_url: str) -> None:
    """A real cast on a PostgreSQL loom: each utterance row's record is its first
    start's ordinal alone (before: the gate, the call id and the arguments again)."""
    script = [{"tool_calls": [{"gate": "echo", "args": {"text": f"needle {i}"}}]} for i in range(3)]
    script.append({"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]})
    loom = Loom.open(pg_url)
    circle = Circle([gates.done, gates.echo], [max_turns(5)])
    spell = Cantrip(llm=ScriptedLLM(script), identity=Identity(), circle=circle, loom=loom)
    try:
        result = trio.run(spell.cast_async, "work")
    finally:
        loom.close()
    assert result.result == "ok"
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(
            "SELECT sequence, gate, record FROM cantrip_journal WHERE ordinal = %s "
            "ORDER BY sequence",
            (UTTERANCE,),
        ).fetchall()
    assert rows == [(1, "", '{"start":0}'), (2, "", '{"start":0}'), (3, "", '{"start":0}')]
