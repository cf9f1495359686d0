"""An MCP server as a circle's gate provider: the value users write.

``MCPServer(name="time", command="mcp-server-time")`` in Python, or one
``[[circle.mcp]]`` table in a spec file, describes a server; nothing is started
until an entity of the circle first runs (see :mod:`cantrip._providers`). Its
tools become gates named ``<prefix><tool>`` (prefix ``<name>_`` unless given).

This module is a plain value with checks; the SDK is imported only when a
server is opened (:mod:`cantrip.mcp._client`), so ``import cantrip`` stays cheap.

``env`` and ``headers`` values may name environment variables, ``"${NAME}"`` (alone or
inside text: ``"Bearer ${API_TOKEN}"``), resolved from the environment of the process
that opens the server -- the way ``api_key_env`` names a provider's key -- so a secret
need not be written in the spec. A spec queued for workers (``cantrip cast --db``,
``serve --db``) is stored in PostgreSQL: there every value must be given that way
(:func:`check_queued_spell`, issue 28.6).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import pydantic

from cantrip._errors import ConstructionError
from cantrip._redact import register_secret_env

if TYPE_CHECKING:
    import trio

    from cantrip._providers import OpenProvider

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
_PREFIX = re.compile(r"(?:[A-Za-z_][A-Za-z0-9_-]{0,47})?")
REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
"""``${NAME}``: an environment variable, read by the process that opens the server."""

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_STARTUP_TIMEOUT_S = 30.0


def _strings(value: Mapping[str, Any] | None) -> Mapping[str, str]:
    return MappingProxyType({str(k): str(v) for k, v in (value or {}).items()})


def _opt_tuple(value: Sequence[str] | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(value)


@attrs.frozen
class MCPServer:
    """One MCP server whose tools an entity may call as gates.

    Either ``command`` (+ ``args``, ``env``; spoken to over stdio) or ``url``
    (+ ``headers``; streamable HTTP). ``tools`` is an allow-list of the server's
    tool names (all when None); ``prefix`` is put before each tool's name to make
    its gate name; ``timeout_s`` bounds each call and ``startup_timeout_s`` the
    start-up (spawn or connect, handshake, tool listing).

    ``elicitation`` lets the server ask the user during a call (MCP elicitation,
    form and URL modes): cantrip declares the capability, and each question pauses
    the cast like ``ask_user`` (the circle then needs a human, as with ``ask_user``).
    Off by default: a server that asks anyway is told elicitation is not supported.
    """

    name: str
    command: str | None = None
    args: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    env: Mapping[str, str] = attrs.field(factory=dict, converter=_strings, repr=False)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = attrs.field(factory=dict, converter=_strings, repr=False)
    tools: tuple[str, ...] | None = attrs.field(default=None, converter=_opt_tuple)
    prefix: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S
    elicitation: bool = False

    def __attrs_post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ConstructionError(problems)

    def problems(self) -> list[str]:
        where = f"MCP server {self.name!r}"
        out: list[str] = []
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            out.append(
                f"MCP server name {self.name!r} must start with a letter and use only "
                "letters, digits, '_' and '-' (at most 64)"
            )
        if (self.command is None) == (self.url is None):
            out.append(f"{where} needs exactly one of command (stdio) or url (streamable HTTP)")
        if self.url is not None:
            if not self.url.startswith(("http://", "https://")):
                out.append(f"{where}: url must be http:// or https://, got {self.url!r}")
            if self.args or self.env or self.cwd:
                out.append(f"{where}: args, env and cwd belong to a command, not a url")
        if self.command is not None and self.headers:
            out.append(f"{where}: headers belong to a url, not a command")
        if not self.timeout_s > 0 or not self.startup_timeout_s > 0:
            out.append(f"{where}: timeout_s and startup_timeout_s must be positive")
        if self.prefix is not None and not _PREFIX.fullmatch(self.prefix):
            out.append(
                f"{where}: prefix {self.prefix!r} must start with a letter or '_' and use "
                "only letters, digits, '_' and '-' (at most 48), so that its gate names are "
                "ones every LLM provider accepts"
            )
        if self.tools is not None and len(set(self.tools)) != len(self.tools):
            out.append(f"{where}: tools lists a name twice")
        return out

    @property
    def asks_user(self) -> bool:
        """Whether calls of this server may pause for a human (its elicitations)."""
        return self.elicitation

    @property
    def gate_prefix(self) -> str:
        return f"{self.name}_" if self.prefix is None else self.prefix

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"

    def describe(self) -> dict[str, Any]:
        """Where the server is, for records and messages: no env, no headers (secrets)."""
        where = self.command if self.command is not None else _without_query(self.url or "")
        return {"name": self.name, "transport": self.transport, "target": where}

    def resolved(self) -> MCPServer:
        """This server with every ``${NAME}`` in ``env`` and ``headers`` replaced by the
        variable's value here; each name becomes a known secret (redacted everywhere)."""
        missing: list[str] = []

        def resolve(where: str, values: Mapping[str, str]) -> dict[str, str]:
            out: dict[str, str] = {}
            for key, value in values.items():
                for name in REFERENCE.findall(value):
                    register_secret_env(name)
                    if name not in os.environ:
                        missing.append(f"{where}.{key} names ${{{name}}}")
                out[key] = REFERENCE.sub(lambda m: os.environ.get(m.group(1), ""), value)
            return out

        env, headers = resolve("env", self.env), resolve("headers", self.headers)
        if missing:
            raise ConstructionError(
                f"MCP server {self.name!r}: {', '.join(missing)}, which is not set in "
                "this process's environment"
            )
        return attrs.evolve(self, env=env, headers=headers)

    async def open(self, nursery: trio.Nursery) -> OpenProvider:
        from cantrip.mcp._client import open_server

        return await open_server(self.resolved(), nursery)


def _without_query(url: str) -> str:
    """A URL without query or user info (either may carry a token)."""
    base = url.split("?", 1)[0].split("#", 1)[0]
    scheme, sep, rest = base.partition("://")
    host, slash, path = rest.partition("/")
    return f"{scheme}{sep}{host.rpartition('@')[2]}{slash}{path}"


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
    timeout_s: float = DEFAULT_TIMEOUT_S
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S
    elicitation: bool = False

    def build(self) -> MCPServer:
        return MCPServer(**self.model_dump())


def servers_from_tables(tables: Any) -> tuple[MCPServer, ...]:
    """``[[circle.mcp]]`` tables as servers; every problem reported at once."""
    return provider_tables(tables, "mcp", "server", MCPTable)


class _Buildable(Protocol):
    @classmethod
    def model_validate(cls, obj: Any) -> Any: ...


def provider_tables(tables: Any, key: str, kind: str, model: type[_Buildable]) -> tuple[Any, ...]:
    """``[[circle.KEY]]`` tables, each validated by ``model`` and built (``.build()``) into a
    gate provider with a ``name``: every problem of every table reported at once, and
    names unique. Shared by MCP servers and A2A agents (``cantrip.a2a._spec``)."""
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


def check_queued_spell(spell: Mapping[str, Any]) -> None:
    """Refuse a spell for the workers' queue whose MCP servers hold literal ``env`` or
    ``headers`` values: the queue stores the spec in PostgreSQL, and no secret goes into
    a table (issue 28.6). Each value must name variables (``"${NAME}"``), which every
    worker reads from its own environment -- as a provider key travels as the name in
    ``api_key_env``, never as the key."""
    spec = spell.get("spec")
    circle = spec.get("circle") if isinstance(spec, Mapping) else None
    tables = circle.get("mcp") if isinstance(circle, Mapping) else None
    if not isinstance(tables, list):
        return
    problems = []
    for i, table in enumerate(tables):
        if not isinstance(table, Mapping):
            continue
        for field in ("env", "headers"):
            values = table.get(field)
            for key, value in values.items() if isinstance(values, Mapping) else ():
                if not (isinstance(value, str) and REFERENCE.search(value)):
                    problems.append(
                        f"circle.mcp[{i}].{field}.{key}: a spec run by workers is stored in "
                        'the database, so give env and headers values as variables ("${NAME}") '
                        "that each worker reads from its own environment, not as literal values"
                    )
    if problems:
        raise ConstructionError(problems)
