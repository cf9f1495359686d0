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


@pytest.mark.parametrize(
    "raw",
    [
        '{"n": 123456789012345678901234567890}',  # orjson would read a float: digits lost
        '{"n": -9223372036854775809}',
        '{"n": 18446744073709551616}',
        '{"s": "\\ud800"}',  # a lone surrogate, which orjson refuses
        '{"x": 1e400}',  # too large for a float: the standard library reads inf
        '{"a": 1, "a": 2}',
        '  {"nested": [[[{"k": null}]]], "t": true, "f": 1.25e-7}  ',
        '{"x": 1,}',
        '{"x": "\x01"}',
    ],
)
def test_the_fast_reader_answers_what_the_standard_decoder_answers(raw: str) -> None:
    """Arguments are read by orjson first (issue 34): for every text, the same value
    or the same refusal as the standard library's strict decoder."""
    import json

    from cantrip.llm._openai_chat import _STRICT, strict_json

    def read(decode: object) -> object:
        try:
            return ("value", repr(decode(raw)))  # type: ignore[operator]
        except ValueError:
            return ("refused",)

    assert read(strict_json) == read(_STRICT.decode)
    assert read(strict_json) == read(json.loads) or "NaN" in raw or "Infinity" in raw


def test_the_fast_reader_agrees_on_generated_json() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from cantrip.llm._openai_chat import _STRICT, strict_json

    finite = st.floats(allow_nan=False, allow_infinity=False)
    scalars = st.none() | st.booleans() | st.integers() | finite | st.text()
    values = st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=20,
    )

    @settings(max_examples=300, deadline=None)
    @given(value=values, ascii_only=st.booleans())
    def check(value: object, ascii_only: bool) -> None:
        import json

        text = json.dumps(value, ensure_ascii=ascii_only)
        assert repr(strict_json(text)) == repr(_STRICT.decode(text))

    check()
