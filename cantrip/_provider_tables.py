"""``[[circle.KEY]]`` tables of gate providers (MCP servers, A2A agents): read the same
way, each by its own pydantic model, so that every problem of every table is reported
at once and names are unique among them; and the parts of the values they build that
are the same for both (the name rule, the string tables)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Protocol

import pydantic

from cantrip._errors import ConstructionError

PROVIDER_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
"""What an MCP server's or A2A agent's ``name`` may be."""


def string_table(value: Mapping[str, Any] | None) -> Mapping[str, str]:
    """``env``/``headers`` as an immutable table of strings (the attrs converter)."""
    return MappingProxyType({str(k): str(v) for k, v in (value or {}).items()})


class _Buildable(Protocol):
    @classmethod
    def model_validate(cls, obj: Any) -> Any: ...


def provider_tables(tables: Any, key: str, kind: str, model: type[_Buildable]) -> tuple[Any, ...]:
    """``[[circle.KEY]]`` tables, each validated by ``model`` and built (``.build()``) into a
    gate provider with a ``name``: every problem of every table reported at once, and
    names unique."""
    if tables is None:
        return ()
    if not isinstance(tables, list):
        raise ConstructionError(
            f"circle.{key} must be an array of tables ([[circle.{key}]]), one per {kind}"
        )
    problems: list[str] = []
    built: list[Any] = []
    for i, table in enumerate(tables):
        try:
            built.append(model.model_validate(table).build())
        except pydantic.ValidationError as exc:
            for error in exc.errors():
                where = ".".join(str(p) for p in error["loc"]) or "table"
                problems.append(f"circle.{key}[{i}].{where}: {error['msg']}")
        except ConstructionError as exc:
            problems.extend(exc.problems)
    names = [b.name for b in built]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        problems.append(f"circle.{key}: {kind} names must be unique; repeated: {repeated}")
    if problems:
        raise ConstructionError(problems)
    return tuple(built)
