"""A model's tool arguments are read as strict JSON: NaN and Infinity are not JSON.

Python's ``json`` reads them as floats; replayed to the provider in the next
request they would become ``null`` (orjson) or invalid JSON. Refused, the call
keeps its raw text and becomes an ``is_error`` observation naming it (see
``tests/test_loop.py`` for what the loop does with unparsed arguments).
"""

from __future__ import annotations

import pytest

from cantrip.llm._openai_chat import parse_arguments
from cantrip.llm.providers.anthropic import _json_or_text


@pytest.mark.parametrize("raw", ['{"x": NaN}', '{"x": [1, Infinity]}', '{"x": {"y": -Infinity}}'])
def test_chat_arguments_with_nan_or_infinity_stay_raw(raw: str) -> None:
    assert parse_arguments(raw) == ({}, raw)


@pytest.mark.parametrize("raw", ['{"x": NaN}', '{"x": [1, Infinity]}'])
def test_streamed_anthropic_input_with_nan_or_infinity_stays_text(raw: str) -> None:
    assert _json_or_text(raw) == raw


def test_finite_arguments_still_parse() -> None:
    assert parse_arguments('{"x": 1.5e308, "y": [0, -2]}') == ({"x": 1.5e308, "y": [0, -2]}, None)
    assert _json_or_text('{"x": 1}') == {"x": 1}
