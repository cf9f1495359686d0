"""The value boundary: what sandboxed code may hand the host (issue 13, item 1).

Everything a code medium's sandbox passes to a gate or to ``done`` is written by
the model, so it is untrusted input. Every medium (conversation, Python, JS,
bash) converts it with :func:`to_loom_value` before a gate runs, and a value
that cannot be carried into the loom *losslessly* becomes a clear error for
that one call (an ``is_error`` gate-call record and an error the code can
catch) instead of a crashed cast.

The loom's value model is JSON's, with Python's exact numbers and strings:

* ``None``, ``bool``, ``int`` of any size, finite ``float``, ``str`` (any
  code points, lone surrogates included);
* ``list`` (a ``tuple`` becomes a list, as in JSON);
* ``dict`` whose keys are ``str`` (``int`` and ``bool`` keys become their JSON
  text, as ``json.dumps`` does);
* at most :data:`MAX_VALUE_DEPTH` levels of nesting.

Refused, with a hint how to convert: ``bytes``, ``complex``, ``set``,
``frozenset``, NaN and infinities, other objects, other key types, deeper
nesting. The stores keep big integers and lone surrogates exactly (see
:mod:`cantrip.loom._stores`).

This module imports nothing from the runtime: mediums and stores both use it.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping
from typing import Any

MAX_VALUE_DEPTH = 100
"""Levels of nesting a sandbox value may have (a list in a list ... counts each level)."""

_HINTS: dict[str, str] = {
    "bytes": "decode it to text first (b.decode())",
    "bytearray": "decode it to text first (b.decode())",
    "complex": "pass its parts as a list ([z.real, z.imag])",
    "set": "pass a sorted list (sorted(s))",
    "frozenset": "pass a sorted list (sorted(s))",
}

_PREVIEW = reprlib.Repr()
_PREVIEW.maxlevel = 4
_PREVIEW.maxstring = 80
_PREVIEW.maxother = 80
_PREVIEW.maxlist = _PREVIEW.maxtuple = _PREVIEW.maxdict = _PREVIEW.maxset = 6


class ValueBoundaryError(ValueError):
    """A sandbox value that the loom cannot carry losslessly; the message says why."""


def to_loom_value(value: Any, where: str = "value") -> Any:
    """``value`` in the loom's value model, or :class:`ValueBoundaryError`.

    ``where`` names the value in the message (``"done() argument 'answer'"``).
    Never recurses deeper than :data:`MAX_VALUE_DEPTH`, so no input can
    exhaust the host's stack.
    """
    return _convert(value, where, 0)


def _convert(value: Any, where: str, depth: int) -> Any:
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is str:
        return value
    if kind is float:
        if math.isfinite(value):
            return value
        raise ValueBoundaryError(
            f"{where} is {value!r}, which JSON cannot carry; pass a string such as "
            f"'{value}' or a number"
        )
    if depth >= MAX_VALUE_DEPTH:
        raise ValueBoundaryError(
            f"{where} is nested deeper than {MAX_VALUE_DEPTH} levels; flatten it first"
        )
    if kind is list or kind is tuple:
        return [_convert(v, where, depth + 1) for v in value]
    if kind is dict or (isinstance(value, Mapping) and not isinstance(value, type)):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out[_key(key, where)] = _convert(item, where, depth + 1)
        return out
    if isinstance(value, bool | int | str):
        return _convert(_base(value), where, depth)  # subclasses (IntEnum, str enums)
    if isinstance(value, float):
        return _convert(float(value), where, depth)
    name = type(value).__name__
    hint = _HINTS.get(name, "pass a str, number, bool, None, list or dict instead")
    raise ValueBoundaryError(
        f"{where} is a {name} ({preview(value)}), which the loom cannot store losslessly; {hint}"
    )


def _base(value: bool | int | str) -> bool | int | str:
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    return str(value)


def _key(key: Any, where: str) -> str:
    if type(key) is str:
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        return str(int(key))
    if isinstance(key, str):
        return str(key)
    raise ValueBoundaryError(
        f"{where} has a dict key of type {type(key).__name__} ({preview(key)}); "
        "dict keys must be strings"
    )


def preview(value: Any) -> str:
    """A short, bounded, printable description of any value (for error messages)."""
    try:
        text = _PREVIEW.repr(value)
    except Exception:  # noqa: BLE001 -- a hostile __repr__; the type name will do
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 200 else text[:200] + "..."


# -- the observation cap (issue 13, item 2) -------------------------------------------

OBSERVATION_CAP_CHARS = 65_536
"""Default size of one observation text (``max_observation_chars`` ward)."""


def cap_text(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, with a marker saying how much was cut.

    Everything an entity observes (console output, gate results, error messages,
    child results) passes through this before it reaches the loom's observation
    and the next LLM request: one ``console.log`` of 30 MB must not become a
    30 MB observation and a 30 MB request.
    """
    if len(text) <= limit:
        return text
    cut = len(text) - limit
    return (
        f"{text[:limit]}\n[truncated: {cut} of {len(text)} characters cut "
        f"(max_observation_chars={limit})]"
    )
