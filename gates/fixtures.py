"""Gates defined by a behaviour instead of code: for tests, demos and dry runs.

A declarative spec (or a conformance case) can declare a gate the runtime does
not ship by saying what it does:

* ``result = X`` -- always returns ``X``;
* ``behavior = "delay"`` with ``delay_ms`` -- waits, then returns ``result``;
* ``behavior = "throw"`` with ``error`` -- fails with that message;
* ``stateful = true`` -- counts its calls and returns the count. The count
  lives in the gate, so it shows whether a gate really ran (replay forking
  must not run it, LOOM-13).

Each is an ordinary :class:`~cantrip.Gate` and goes through the same
validation and gate-call boundary as every other gate.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any, Literal

import pydantic
import trio

from cantrip import ConstructionError, Gate, GateError

Behavior = Literal["constant", "delay", "throw", "counter"]


class CallCounter:
    """How often a stateful fixture gate has actually run."""

    def __init__(self) -> None:
        self._count = itertools.count(1)
        self.calls = 0

    def tick(self) -> int:
        self.calls = next(self._count)
        return self.calls


def fixture_gate(
    name: str,
    *,
    behavior: Behavior | None = None,
    result: Any = None,
    error: str | None = None,
    delay_ms: float = 0.0,
    stateful: bool = False,
    parameters: Mapping[str, Any] | None = None,
    description: str | None = None,
) -> Gate:
    """Build a gate from a behaviour description (see the module docstring)."""
    if behavior is None:
        behavior = "counter" if stateful else "constant"
    schema = dict(parameters) if parameters is not None else {"type": "object", "properties": {}}
    doc = description or f"Fixture gate ({behavior})."

    if behavior == "constant":
        value = result

        async def constant(**_: Any) -> Any:
            return value

        fn = constant
    elif behavior == "delay":
        seconds = float(delay_ms) / 1000.0
        value = result

        async def delayed(**_: Any) -> Any:
            await trio.sleep(seconds)
            return value

        fn = delayed
    elif behavior == "throw":
        message = error or f"gate {name} failed"

        async def throwing(**_: Any) -> Any:
            raise GateError(message)

        fn = throwing
    elif behavior == "counter":
        counter = CallCounter()

        async def counting(**_: Any) -> Any:
            return counter.tick()

        counting.counter = counter  # type: ignore[attr-defined]
        fn = counting
    else:
        raise ConstructionError(
            f"gate {name!r}: unknown behavior {behavior!r} (constant, delay, throw, counter)"
        )
    # Fixture gates accept whatever arguments their declared schema names.
    return Gate(
        name=name,
        fn=fn,
        description=doc,
        args_model=_permissive_model(name),
        parameters=schema,
    )


def call_count(g: Gate) -> int | None:
    """How often a stateful fixture gate ran, or None for other gates."""
    counter = getattr(g.fn, "counter", None)
    return counter.calls if isinstance(counter, CallCounter) else None


def _permissive_model(name: str) -> type[pydantic.BaseModel]:
    model: type[pydantic.BaseModel] = pydantic.create_model(
        f"{name}_arguments", __config__=pydantic.ConfigDict(extra="allow")
    )
    return model
