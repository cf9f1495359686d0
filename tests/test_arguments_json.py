"""``ToolCall.arguments_json``: orjson where it gives the standard library's exact text.

The text is LLM-4's wire form and what a turn stores, so it must not change by a byte:
whatever the arguments, it is ``json.dumps(arguments, ensure_ascii=False,
sort_keys=True)``. orjson makes it several times cheaper for plain arguments (issue
46.4); these tests hold the two equal on generated arguments -- those orjson takes,
those it refuses (big integers, lone surrogates) and those it writes differently
(floats, text holding a separator) -- and check that the cheap path is the one taken.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cantrip.llm import _contract
from cantrip.llm._contract import ToolCall, _encode_arguments, _orjson_exact


def _stdlib(arguments: Any) -> str:
    return json.dumps(arguments, ensure_ascii=False, sort_keys=True)


_text = st.text(st.characters(codec=None), max_size=12)  # any code point, surrogates too
_plain_text = st.text(st.characters(codec="utf-8", exclude_characters=",:"), max_size=12)
_leaves = (
    st.none()
    | st.booleans()
    | st.integers()  # past 64 bits too: orjson refuses those
    | st.floats(allow_nan=True, allow_infinity=True)
    | _text
)
_values = st.recursive(
    _leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=12,
)
_plain_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | _plain_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_plain_text, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(_text, _values, max_size=5))
def test_any_arguments_encode_to_the_standard_librarys_text(arguments: dict[str, Any]) -> None:
    assert _encode_arguments(arguments) == _stdlib(arguments)
    assert ToolCall("c1", "g", arguments).arguments_json == _stdlib(arguments)


def _refuse(arguments: Any) -> str:
    raise AssertionError(f"plain arguments went to the standard library: {arguments!r}")


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(_plain_text, _plain_values, max_size=5))
def test_plain_arguments_take_orjson_and_give_the_same_text(arguments: dict[str, Any]) -> None:
    assert _orjson_exact(arguments)
    with pytest.MonkeyPatch.context() as patch:  # a plain argument must not reach it
        patch.setattr(_contract, "_encode_arguments_stdlib", _refuse)
        assert _encode_arguments(arguments) == _stdlib(arguments)


@pytest.mark.parametrize(
    "arguments",
    [
        {"url": "https://example.com/a,b"},  # separators inside text
        {"x": 1e16, "y": 0.1, "z": -0.0},  # floats: written differently
        {"k": {1: "a"}},  # a non-text key: the standard library turns it into text
        {"t": (1, 2)},  # a tuple: kept off the fast path
    ],
)
def test_what_orjson_writes_differently_takes_the_standard_library(
    arguments: dict[str, Any],
) -> None:
    assert not _orjson_exact(arguments)
    assert _encode_arguments(arguments) == _stdlib(arguments)


@pytest.mark.parametrize("arguments", [{"n": 2**70}, {"n": -(2**64)}, {"s": "a\ud800"}])
def test_what_orjson_refuses_takes_the_standard_library(arguments: dict[str, Any]) -> None:
    assert _orjson_exact(arguments)  # plain in shape: orjson is tried, and refuses
    assert _encode_arguments(arguments) == _stdlib(arguments)
