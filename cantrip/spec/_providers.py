"""The ``[[circle.KEY]]`` tables of gate providers: ``[[circle.mcp]]`` (MCP servers)
and ``[[circle.a2a]]`` (A2A agents).

Both are read the same way, each by its own pydantic model, so that every problem of
every table is reported at once (with the table's index) and names are unique among
them; each table is then built into the declaration a program would write
(:class:`~cantrip.mcp.MCPServer`, :class:`~cantrip.a2a.A2AAgent`), which checks its
values. Their fields that may carry credentials are listed once, in
:data:`cantrip._provider_fields.CREDENTIAL_FIELDS`, which the workers' queue checks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import pydantic

from cantrip._errors import ConstructionError
from cantrip.a2a import _provider as a2a
from cantrip.mcp import _provider as mcp
from cantrip.spec._circle import spec_path


class MCPTable(pydantic.BaseModel):
    """One ``[[circle.mcp]]`` table of a spec file (pydantic at the edge)."""

    model_config = pydantic.ConfigDict(extra="forbid")

    name: str
    command: str | None = None
    args: list[str] = pydantic.Field(default_factory=list)
    env: dict[str, str] = pydantic.Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = pydantic.Field(default_factory=dict)
    tools: list[str] | None = None
    prefix: str | None = None
    timeout_s: float = mcp.DEFAULT_TIMEOUT_S
    startup_timeout_s: float = mcp.DEFAULT_STARTUP_TIMEOUT_S
    elicitation: bool = False

    def build(self) -> mcp.MCPServer:
        return mcp.MCPServer(**self.model_dump())


class A2ATable(pydantic.BaseModel):
    """One ``[[circle.a2a]]`` table of a spec file (pydantic at the edge)."""

    model_config = pydantic.ConfigDict(extra="forbid")

    name: str
    url: str
    headers: dict[str, str] = pydantic.Field(default_factory=dict)
    timeout_s: float = a2a.DEFAULT_TIMEOUT_S
    startup_timeout_s: float = a2a.DEFAULT_STARTUP_TIMEOUT_S

    def build(self) -> a2a.A2AAgent:
        return a2a.A2AAgent(**self.model_dump())


def servers_from_tables(tables: Any) -> tuple[mcp.MCPServer, ...]:
    """``[[circle.mcp]]`` tables as servers; every problem reported at once."""
    return provider_tables(tables, "mcp", "server", MCPTable)


def agents_from_tables(tables: Any) -> tuple[a2a.A2AAgent, ...]:
    """``[[circle.a2a]]`` tables as agents; every problem reported at once."""
    return provider_tables(tables, "a2a", "agent", A2ATable)


def circle_servers(
    tables: list[dict[str, Any]], base_dir: Path | None, problems: list[str]
) -> tuple[mcp.MCPServer, ...]:
    """``[[circle.mcp]]`` tables as servers; a relative ``cwd`` (and an unset one)
    is the spec file's folder, so ``args = ["server.py"]`` finds its script."""
    if not tables:
        return ()
    if base_dir is not None:
        tables = [
            {**t, "cwd": str(spec_path(t.get("cwd") or ".", base_dir))}
            if isinstance(t, dict) and t.get("command") is not None
            else t
            for t in tables
        ]
    try:
        return servers_from_tables(tables)
    except ConstructionError as exc:
        problems.extend(exc.problems)
        return ()


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
