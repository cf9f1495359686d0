"""Value matchers of the conformance schema.

Expected values in a case are literal values, or one of these forms:

* ``not_null`` / ``null`` (YAML ``~``) -- presence or absence;
* ``greater_than(x)`` / ``less_than(x)`` -- numeric comparison;
* ``turns[i].field`` -- a reference to a field of the i-th loom turn;
* symbolic entity labels (``parent``, ``child``, any word) for ``entity_id`` --
  bound to the first entity id they are compared with; distinct labels must
  bind distinct entities.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

_COMPARISON = re.compile(r"^(greater_than|less_than|at_least|at_most)\((-?[0-9.]+)\)$")
_REFERENCE = re.compile(r"^turns\[(\d+)\]\.(\w+)$")


class Mismatch(AssertionError):
    """An expectation that did not hold; the message says what and where."""


def values_equal(actual: Any, expected: Any) -> bool:
    if isinstance(expected, bool) or isinstance(actual, bool):
        return actual is expected or (actual == expected and type(actual) is type(expected))
    if isinstance(expected, int | float) and isinstance(actual, int | float):
        return float(actual) == float(expected)
    if isinstance(expected, Mapping) and isinstance(actual, Mapping):
        return set(expected) == set(actual) and all(
            values_equal(actual[k], v) for k, v in expected.items()
        )
    if isinstance(expected, list) and isinstance(actual, list | tuple):
        return len(actual) == len(expected) and all(
            values_equal(a, e) for a, e in zip(actual, expected, strict=True)
        )
    return bool(actual == expected)


def check_value(
    actual: Any,
    expected: Any,
    where: str,
    resolve: Callable[[str], Any] | None = None,
) -> None:
    """Raise :class:`Mismatch` unless ``actual`` satisfies ``expected``."""
    if isinstance(expected, str):
        if expected == "not_null":
            if actual is None:
                raise Mismatch(f"{where}: expected a value, got null")
            return
        comparison = _COMPARISON.match(expected)
        if comparison:
            op, bound = comparison.group(1), float(comparison.group(2))
            if not isinstance(actual, int | float) or isinstance(actual, bool):
                raise Mismatch(f"{where}: expected a number {op} {bound}, got {actual!r}")
            ok = {
                "greater_than": actual > bound,
                "less_than": actual < bound,
                "at_least": actual >= bound,
                "at_most": actual <= bound,
            }[op]
            if not ok:
                raise Mismatch(f"{where}: expected {op}({bound}), got {actual!r}")
            return
        reference = _REFERENCE.match(expected)
        if reference and resolve is not None:
            expected = resolve(expected)
    if expected is None:
        if actual is not None:
            raise Mismatch(f"{where}: expected null, got {actual!r}")
        return
    if not values_equal(actual, expected):
        raise Mismatch(f"{where}: expected {expected!r}, got {actual!r}")


def parse_reference(text: str) -> tuple[int, str] | None:
    match = _REFERENCE.match(text)
    return (int(match.group(1)), match.group(2)) if match else None


class LabelBinding:
    """Binds symbolic labels to concrete ids, one-to-one."""

    def __init__(self) -> None:
        self._by_label: dict[str, str] = {}
        self._by_value: dict[str, str] = {}

    def check(self, label: str, value: str, where: str) -> None:
        bound = self._by_label.get(label)
        if bound is None:
            owner = self._by_value.get(value)
            if owner is not None:
                raise Mismatch(f"{where}: {label!r} and {owner!r} name the same entity {value}")
            self._by_label[label] = value
            self._by_value[value] = label
        elif bound != value:
            raise Mismatch(f"{where}: {label!r} is {bound}, but this turn belongs to {value}")


def require_keys(obj: Mapping[str, Any], allowed: Sequence[str], where: str) -> None:
    unknown = sorted(set(obj) - set(allowed))
    if unknown:
        raise Mismatch(f"{where}: unknown key(s) {unknown} -- not part of the schema")
