"""Values across the Python sandbox's edge, both ways, and how its errors read.

A gate's result goes into Monty as data it can hold (:func:`to_sandbox`: the rest
becomes text); a gate call's arguments come out as plain host data with Monty's
proxies unwrapped (:func:`from_sandbox`), mapped onto the gate's parameters
(:func:`call_arguments`) and kept in the record as loom values
(:func:`shown_arguments`). A snippet's last value and an uncaught error are
rendered for the observation (:func:`render_result`, :func:`error_text`) as the
sandbox itself would show them.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from pathlib import PurePath
from typing import Any

import pydantic_monty as monty

from cantrip.medium import Gate, ValueBoundaryError, to_loom_value
from mediums._code import map_arguments, refused_arguments

MAX_ERROR_CHARS = 2_000


def shown_arguments(shown: dict[str, Any]) -> dict[str, Any]:
    """The arguments as a record keeps them: loom values, or a preview if they are not."""
    try:
        value: dict[str, Any] = to_loom_value(shown)
    except ValueBoundaryError:
        return refused_arguments(shown)
    return value


def call_arguments(gate: Gate, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Positional (mapped like every code medium) and keyword arguments of a gate call."""
    mapped = map_arguments(gate, args)
    for key, value in kwargs.items():
        if key in mapped:
            raise TypeError(f"{gate.name}() got multiple values for argument {key!r}")
        mapped[key] = value
    return mapped


def error_text(exc: monty.MontyError, hint: str = "") -> str:
    """``Type: message`` first, then where it happened (Monty's traceback), kept short."""
    if not isinstance(exc, monty.MontySyntaxError | monty.MontyRuntimeError):
        return str(exc) + hint
    headline = exc.display("type-msg")
    frames = exc.display("traceback").removeprefix("Traceback (most recent call last):\n")
    frames = frames.removesuffix(headline).rstrip()
    headline += hint
    if len(frames) > MAX_ERROR_CHARS:
        frames = "  ...\n" + frames[-MAX_ERROR_CHARS:]
    return f"{headline}\n{frames}" if frames else headline


_PLAIN = (bool, int, float, complex, str, bytes, type(None))
_DATA = (
    *_PLAIN,
    datetime.datetime,
    datetime.date,
    datetime.time,
    datetime.timedelta,
    decimal.Decimal,
)


def to_sandbox(value: Any, depth: int = 0) -> Any:
    """A gate result as a value Monty can take: data stays data, the rest becomes text."""
    if isinstance(value, _DATA):
        return value
    if depth > 100:
        return str(value)
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, Mapping):
        return {_key(k): to_sandbox(v, depth + 1) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(to_sandbox(v, depth + 1) for v in value)
    if isinstance(value, list):
        return [to_sandbox(v, depth + 1) for v in value]
    if isinstance(value, frozenset):
        return frozenset(_key(v) for v in value)
    if isinstance(value, AbstractSet):
        return {_key(v) for v in value}
    return str(value)


def _key(value: Any) -> Any:
    return value if isinstance(value, _DATA) else str(value)


def from_sandbox(value: Any, depth: int = 0) -> Any:
    """An argument from the sandbox as plain host data (proxies unwrapped)."""
    if isinstance(value, _PLAIN):
        return value
    if depth > 100:
        return value  # the value boundary refuses it, with a message
    if isinstance(value, monty.MontyClassProxy):
        return {str(k): from_sandbox(v, depth + 1) for k, v in value.attributes.items()}
    if isinstance(value, monty.MontyClassTypeProxy | monty.MontyStdTypeProxy):
        return sandbox_repr(value)
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, dict):
        return {k: from_sandbox(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [from_sandbox(v, depth + 1) for v in value]
    if isinstance(value, tuple):
        return tuple(from_sandbox(v, depth + 1) for v in value)
    return value


def render_result(value: Any) -> tuple[str, str | None]:
    """(kind, text) of a snippet's last value; ``None`` shows nothing, as in a REPL."""
    if value is None:
        return "undefined", None
    kind = value.name if isinstance(value, monty.MontyClassProxy) else type(value).__name__
    if isinstance(value, list | tuple | dict | set | frozenset):
        kind = f"{kind}, {len(value)} items"
    return kind, sandbox_repr(value)


def sandbox_repr(value: Any, depth: int = 0) -> str:
    """Python's repr, with Monty's proxies shown as the sandbox would show them."""
    if depth > 50:
        return "..."
    inner = depth + 1
    if isinstance(value, monty.MontyClassProxy):
        fields = ", ".join(f"{k}={sandbox_repr(v, inner)}" for k, v in value.attributes.items())
        return f"{value.name}({fields})"
    if isinstance(value, monty.MontyClassTypeProxy):
        return f"<class {value.name!r}>"
    if isinstance(value, monty.MontyStdTypeProxy):
        if value.kind == "function":
            return f"<built-in function {value.name}>"
        return f"<class {value.name!r}>"
    if isinstance(value, list):
        return "[" + ", ".join(sandbox_repr(v, inner) for v in value) + "]"
    if isinstance(value, tuple):
        items = ", ".join(sandbox_repr(v, inner) for v in value)
        return f"({items},)" if len(value) == 1 else f"({items})"
    if isinstance(value, dict):
        pairs = (f"{sandbox_repr(k, inner)}: {sandbox_repr(v, inner)}" for k, v in value.items())
        return "{" + ", ".join(pairs) + "}"
    if isinstance(value, set | frozenset):
        if not value:
            return f"{type(value).__name__}()"
        items = "{" + ", ".join(sandbox_repr(v, inner) for v in value) + "}"
        return items if isinstance(value, set) else f"frozenset({items})"
    return repr(value)
