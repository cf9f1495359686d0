"""The value boundary (issue 13, item 1): hostile values from sandboxed code.

Property tests throw generated values -- big integers, lone surrogates, NaN,
bytes, complex numbers, sets, deep nesting, objects where a list belongs --
through every medium (conversation, Python, JavaScript, bash) into every loom
store (memory, SQLite, JSONL) at once, and assert: the cast goes on to its
``done``, each call is either carried exactly or refused as an ``is_error``
record, and every store reopens with the same, valid thread.
"""

from __future__ import annotations

import json
import math
import shlex
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
import trio
from hypothesis import HealthCheck, given, settings

import cantrip
import gates
from cantrip import Cantrip, Circle, Identity, ScriptedLLM, max_turns
from cantrip._values import MAX_VALUE_DEPTH, ValueBoundaryError, to_loom_value
from cantrip.loom import JSONLStore, Loom, SQLiteStore
from cantrip.loom._indexed import Record
from cantrip.loom._model import EntityRecord, Turn
from mediums.bash import BashMedium
from mediums.js import JsMedium
from mediums.python import PythonMedium


@cantrip.gate
def keep(value: Any) -> Any:
    """Return ``value`` unchanged (the test's window on what crossed the boundary)."""
    return value


class TeeStore:
    """Writes every record to an SQLite and a JSONL store at once (the Loom's own
    index is the memory store), so one cast exercises all three."""

    def __init__(self, folder: Path) -> None:
        self.stores = (SQLiteStore(folder / "l.db"), JSONLStore(folder / "l.jsonl"))

    def append_entity(self, record: EntityRecord) -> None:
        for s in self.stores:
            s.append_entity(record)

    def append_turn(self, turn: Turn) -> None:
        for s in self.stores:
            s.append_turn(turn)

    def set_reward(self, turn_id: str, reward: float | None) -> None:
        for s in self.stores:
            s.set_reward(turn_id, reward)

    def load(self) -> Iterator[Record]:
        return iter(())

    def close(self) -> None:
        for s in self.stores:
            s.close()


def cast_everywhere(medium: Any, script: list[dict[str, Any]]) -> list[Turn]:
    """Cast ``script`` into all three stores; check every reopened store holds the
    same valid thread, and return the turns."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        loom = Loom(TeeStore(folder))
        parts = (medium,) if medium is not None else ()
        circle = Circle([gates.done, keep], [max_turns(len(script) + 1)], *parts)
        spell = Cantrip(llm=ScriptedLLM(script), identity=Identity(), circle=circle, loom=loom)
        result = trio.run(spell.cast_async, "pass the values")
        assert result.result == "end", [t.observation for t in result.turns]
        turns = list(loom.turns)
        loom.close()
        expected = [finite(t.to_dict()) for t in turns]
        for name in ("l.db", "l.jsonl"):
            reopened = Loom.open(folder / name)
            try:
                assert [finite(t.to_dict()) for t in reopened.turns] == expected, name
                thread = reopened.thread(turns[-1].id)
                assert [t.id for t in thread] == [t.id for t in turns]
                assert [t.sequence for t in thread] == list(range(1, len(turns) + 1))
            finally:
                reopened.close()
        return turns


def finite(value: Any) -> Any:
    """``value`` compared modulo non-finite numbers: JSON has none, so an utterance's
    (the provider's) NaN reads back as null, or exactly when the record took the
    exact encoder -- never a gate argument, which the boundary refuses."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [finite(v) for v in value]
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    return value


def keep_calls(turns: list[Turn]) -> list[Any]:
    return [r for t in turns for r in t.gate_calls if r.gate == "keep"]


# -- generated values -----------------------------------------------------------------

HOSTILE_TEXT = st.sampled_from(["\ud800", "a\udfffb", "\udc80\ud800", "\x00", "\U0001f600"])
TEXT = st.text(st.characters(exclude_categories=()), max_size=6) | HOSTILE_TEXT
BIG = st.integers(min_value=-(10**40), max_value=10**40) | st.sampled_from([2**64, -(2**63) - 1])
FLOATS = st.floats(allow_nan=True, allow_infinity=True)
JSON_LEAVES = st.none() | st.booleans() | BIG | FLOATS | TEXT
PY_LEAVES = (
    JSON_LEAVES
    | st.binary(max_size=4)
    | st.complex_numbers(max_magnitude=1e6, allow_nan=False)
    | st.frozensets(st.integers(-5, 5), max_size=3)
    | st.sets(st.integers(-5, 5), max_size=3)
)


def nested(leaves: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        leaves,
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.tuples(inner, inner)
            | st.dictionaries(TEXT | st.integers(-3, 3), inner, max_size=3)
        ),
        max_leaves=8,
    )


DEPTHS = st.integers(min_value=MAX_VALUE_DEPTH - 2, max_value=MAX_VALUE_DEPTH + 400)


def deep(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def expectation(value: Any) -> tuple[bool, Any]:
    try:
        return True, to_loom_value(value)
    except ValueBoundaryError:
        return False, None


SETTINGS = settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)


# -- the converter itself ------------------------------------------------------------


@given(nested(PY_LEAVES))
@settings(max_examples=200, deadline=None, database=None)
def test_the_converter_is_total_and_loom_values_are_fixed_points(value: Any) -> None:
    ok, converted = expectation(value)
    if ok:
        assert to_loom_value(converted) == converted
        json.dumps(converted)  # a loom value is JSON (big ints, surrogates and all)


def test_refusals_say_what_and_how() -> None:
    cases = {
        b"x": "is a bytes",
        1j: "is a complex",
        frozenset({1}): "is a frozenset",
        math.nan: "nan, which JSON cannot carry",
        math.inf: "inf, which JSON cannot carry",
        object(): "is a object",
    }
    for value, words in cases.items():
        with pytest.raises(ValueBoundaryError, match=words):
            to_loom_value(value, "done() argument 'answer'")
    with pytest.raises(ValueBoundaryError, match=f"deeper than {MAX_VALUE_DEPTH}"):
        to_loom_value(deep(100_000))  # no RecursionError however deep
    with pytest.raises(ValueBoundaryError, match="dict key of type tuple"):
        to_loom_value({(1, 2): 3})
    assert to_loom_value({1: (2, "\ud800"), "k": 10**30}) == {
        "1": [2, "\ud800"],
        "k": 10**30,
    }


# -- through every medium into every store ----------------------------------------------


@given(st.lists(nested(JSON_LEAVES), min_size=1, max_size=4), DEPTHS)
@SETTINGS
def test_conversation_medium(values: list[Any], depth: int) -> None:
    # what a provider's JSON parser can hand over: NaN, big ints, lone surrogates, depth
    values = [*(json.loads(json.dumps(v)) for v in values), deep(depth)]
    script = [{"tool_calls": [{"gate": "keep", "args": {"value": v}}]} for v in values]
    turns = cast_everywhere(
        None, [*script, {"tool_calls": [{"gate": "done", "args": {"answer": "end"}}]}]
    )
    records = keep_calls(turns)
    assert len(records) == len(values)
    for value, record in zip(values, records, strict=True):
        ok, converted = expectation(value)
        assert record.is_error is not ok
        if ok:
            assert record.result == converted
        else:
            assert "cannot" in str(record.result) or "deeper" in str(record.result)


def py_source(value: Any) -> str:
    """Python source text that builds ``value`` (NaN, infinities and all)."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"float({str(value)!r})"
    if isinstance(value, complex):
        return f"complex({value.real!r}, {value.imag!r})"
    if isinstance(value, list):
        return "[" + ", ".join(py_source(v) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + "".join(py_source(v) + ", " for v in value) + ")"
    if isinstance(value, dict):
        items = ", ".join(f"{py_source(k)}: {py_source(v)}" for k, v in value.items())
        return "{" + items + "}"
    return repr(value)


@given(st.lists(nested(PY_LEAVES), min_size=1, max_size=4), DEPTHS)
@SETTINGS
def test_python_medium(values: list[Any], depth: int) -> None:
    lines = [
        f"try:\n    keep({py_source(v)})\nexcept Exception as e:\n    print(e)" for v in values
    ]
    lines.append(
        f"x = 0\nfor _ in range({depth}):\n    x = [x]\n"
        "try:\n    keep(x)\nexcept Exception as e:\n    print(e)"
    )
    script = [{"code": "\n".join(lines)}, {"code": "done('end')"}]
    turns = cast_everywhere(PythonMedium(), script)
    records = keep_calls(turns)
    assert len(records) == len(values) + 1
    for record in records:
        if record.is_error:
            assert "cannot" in str(record.result) or "deeper" in str(record.result)
        else:
            assert to_loom_value(record.result) == record.result
    assert records[-1].is_error is (depth > MAX_VALUE_DEPTH)


def js_source(value: Any) -> str:
    """JavaScript source for ``value``: big ints become BigInts, NaN stays NaN."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if abs(value) < 2**53 else f"{value}n"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # \\udXXX escapes: a lone surrogate stays one in JS
    if isinstance(value, list | tuple):
        return "[" + ", ".join(js_source(v) for v in value) + "]"
    items = ", ".join(f"{json.dumps(str(k))}: {js_source(v)}" for k, v in value.items())
    return "({" + items + "})"


JS_ODDITIES = st.sampled_from(
    [
        "undefined",
        "(function () {})",
        "Symbol('s')",
        "new Map([[1, 2]])",
        "new Date(0)",
        "(function () { var o = {}; o.self = o; return o; })()",
    ]
)
JS_BRIDGE = st.sampled_from(
    [
        "__cantrip_host('keep', '{\"value\": 1}')",
        "__cantrip_host('keep', 'not json')",
        "__cantrip_host('keep', '\"a string\"')",
        "__cantrip_host('keep', '[[[[[[[[1]]]]]]]]'.repeat(1))",
        "__cantrip_host('nosuch', '[1]')",
        "__cantrip_host('keep', JSON.stringify([1e400]))",
    ]
)


@given(
    st.lists(nested(JSON_LEAVES).map(js_source) | JS_ODDITIES | JS_BRIDGE, min_size=1, max_size=4),
    DEPTHS,
)
@SETTINGS
def test_js_medium(sources: list[str], depth: int) -> None:
    lines = [f"try {{ keep({s}); }} catch (e) {{ console.log(String(e)); }}" for s in sources]
    lines.append(
        f"var x = 0; for (var i = 0; i < {depth}; i++) {{ x = [x]; }}\n"
        "try { keep(x); } catch (e) { console.log(String(e)); }"
    )
    script = [{"code": "\n".join(lines)}, {"code": "done('end')"}]
    turns = cast_everywhere(JsMedium(), script)
    records = keep_calls(turns)
    for record in records:
        if not record.is_error:
            assert to_loom_value(record.result) == record.result
    assert records[-1].is_error is (depth > MAX_VALUE_DEPTH)


@given(st.lists(nested(JSON_LEAVES), min_size=1, max_size=4), DEPTHS)
@SETTINGS
def test_bash_medium(values: list[Any], depth: int) -> None:
    texts = [json.dumps({"value": v}) for v in values]  # NaN, big ints, \\udXXX escapes
    texts.append(json.dumps({"value": deep(depth)}))
    texts.append("[" * 5000 + "]" * 5000)  # deeper than the JSON parser will go
    lines = [f"cantrip_gate --json keep {shlex.quote(t)} >/dev/null || true" for t in texts]
    lines.append("printf 'x\\xff\\xfe' | { read -r b; cantrip_gate keep \"$b\"; } || true")
    script = [{"code": "\n".join(lines)}, {"code": "submit_answer end"}]
    turns = cast_everywhere(BashMedium(), script)
    records = keep_calls(turns)
    assert len(records) == len(texts) + 1
    for value, record in zip(values, records, strict=False):
        ok, converted = expectation(json.loads(json.dumps(value)))
        assert record.is_error is not ok
        if ok:
            assert record.result == converted
    assert records[len(values)].is_error is (depth > MAX_VALUE_DEPTH)
    assert records[len(values) + 1].is_error  # too deep for the JSON parser
    assert records[-1].result == "x\udcff\udcfe"  # bytes that are not UTF-8, kept exactly
    assert not records[-1].is_error


# -- what the user sees, for each value the issue names ---------------------------------


def first_observation(medium: Any, code: str) -> str:
    turns = cast_everywhere(medium, [{"code": code}, {"code": "done('end')"}])
    return turns[0].observation


def test_python_messages() -> None:
    seen = first_observation(
        PythonMedium(),
        "for v in [b'x', 1j, {1, 2}, frozenset(), float('nan')]:\n"
        "    try:\n        done(v)\n    except ValueError as e:\n        print(e)",
    )
    assert (
        "done() argument 'answer' is a bytes (b'x'), which the loom cannot store "
        "losslessly; decode it to text first (b.decode())"
    ) in seen
    assert "is a complex (1j)" in seen and "pass its parts as a list" in seen
    assert "is a set ({1, 2})" in seen and "pass a sorted list (sorted(s))" in seen
    assert "is a frozenset" in seen
    assert "done() argument 'answer' is nan, which JSON cannot carry" in seen


def test_js_messages() -> None:
    seen = first_observation(
        JsMedium(),
        "var deep = 0; for (var i = 0; i < 300; i++) deep = [deep];\n"
        "console.log(__cantrip_host('done', '{\"a\": 1}'));\n"
        "try { done(deep); } catch (e) { console.log(String(e)); }\n"
        "try { done(2n ** 70n); } catch (e) { console.log(String(e)); }\n"
        "console.log(keep('\\ud800') === '\\ud800', keep(2 ** 60));",
    )
    assert "done() needs its arguments as a list, got {'a': 1}" in seen  # no KeyError
    assert "Error: done() argument 1 is nested deeper than 100 levels; flatten it first" in seen
    assert "TypeError" in seen  # JSON has no BigInt: the engine refuses it, catchably
    assert "true 1152921504606847000" in seen
