"""The gate journal's encoder (``cantrip._journal._dumps``) lets orjson walk the value
once instead of copying it as plain data first (issue 46.4): its text must be exactly
what ``encode_record(plain_json(value))`` writes, because a resumed turn compares a
call's journaled data with the data it encodes anew (a difference would make it run
an effect again), and the loom's stored format does not change."""

from __future__ import annotations

import collections
import datetime
import enum
from types import MappingProxyType
from typing import Any

import pydantic
import pytest

from cantrip._journal import _dumps
from cantrip.llm._contract import plain_json
from cantrip.loom._codec import decode_record, encode_record


class _Answer(pydantic.BaseModel):
    city: str
    when: datetime.date


class _Colour(enum.Enum):
    RED = "red"


_Point = collections.namedtuple("_Point", "x y")  # a tuple subclass


class _Text(str):
    pass


VALUES: list[Any] = [
    {"args": {"amount": 3, "key": "k-1"}, "tool_call_id": "c1"},
    {"args": MappingProxyType({"nested": MappingProxyType({"a": (1, 2, [3])})})},
    {"model": _Answer(city="Lyon", when=datetime.date(2026, 1, 2))},
    {"point": _Point(1, 2), "set": {1}, "bytes": b"x", "colour": _Colour.RED},
    {"when": datetime.datetime(2026, 12, 7, 4, 30), "text": _Text("sub")},
    {"keys": {1: "one", None: "none", 2.5: "float"}},  # non-text keys: plain_json's str()
    {"big": 2**80, "inside": MappingProxyType({"big": -(2**70)})},  # past orjson's 64 bits
    {"lone": "\ud800 surrogate", "quote": 'a "b" \\ c'},
    {"deep": [[[[[[[[[[1]]]]]]]]]] * 3},
    {"float": 1.5, "none": None, "empty": {}, "tuple": ()},
]


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_journal_data_is_encoded_exactly_as_the_loom_encodes_plain_data(value: Any) -> None:
    assert _dumps(value) == encode_record(plain_json(value))


def test_very_deep_data_takes_the_general_route_to_the_same_text() -> None:
    deep: Any = "leaf"
    for _ in range(300):  # deeper than orjson serialises
        deep = MappingProxyType({"d": deep})
    text = _dumps({"deep": deep})
    assert text == encode_record(plain_json({"deep": deep}))
    assert decode_record(text)["deep"]["d"]["d"]["d"] is not None


def test_a_secret_in_journal_data_is_written_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-journal-secret-value-0123456789"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    value = {"args": MappingProxyType({"key": secret}), "tool_call_id": None}
    text = _dumps(value)
    assert secret not in text
    assert text == encode_record(plain_json(value))
    assert "[REDACTED]" in text
