"""An MCP server as a circle's gate provider: the value users write.

``MCPServer(name="time", command="mcp-server-time")`` in Python, or one
``[[circle.mcp]]`` table in a spec file (read by :mod:`cantrip.spec._providers`),
describes a server; nothing is started until an entity of the circle first runs (see
:mod:`cantrip._providers`). Its tools become gates named ``<prefix><tool>`` (prefix
``<name>_`` unless given).

This module is a plain value with checks; the SDK is imported only when a
server is opened (:mod:`cantrip.mcp._client`), so ``import cantrip`` stays cheap.

``env`` and ``headers`` values may name environment variables, ``"${NAME}"`` (alone or
inside text: ``"Bearer ${API_TOKEN}"``), resolved from the environment of the process
that opens the server -- the way ``api_key_env`` names a provider's key -- so a secret
need not be written in the spec. A spec queued for workers (``cantrip cast --db``,
``serve --db``) is stored in PostgreSQL: there every value must be given that way
(:mod:`cantrip.distributed._spell_secrets`, one check for every table that carries
credentials). The ``${NAME}`` form and its resolution are shared with A2A agents
(:mod:`cantrip._provider_fields`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from cantrip._errors import ConstructionError
from cantrip._install import require_extra
from cantrip._provider_fields import (
    PROVIDER_NAME,
    resolve_references,
    string_table,
    url_without_secrets,
)

if TYPE_CHECKING:
    import trio

    from cantrip._providers import OpenProvider

_PREFIX = re.compile(r"(?:[A-Za-z_][A-Za-z0-9_-]{0,47})?")

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_STARTUP_TIMEOUT_S = 30.0


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
    env: Mapping[str, str] = attrs.field(factory=dict, converter=string_table, repr=False)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = attrs.field(factory=dict, converter=string_table, repr=False)
    tools: tuple[str, ...] | None = attrs.field(default=None, converter=_opt_tuple)
    prefix: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S
    elicitation: bool = False

    def __attrs_post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ConstructionError(problems)
        # declared, so about to be used: a missing SDK is said now (at spec load), once
        require_extra("mcp", f"MCP server {self.name!r}")

    def problems(self) -> list[str]:
        where = f"MCP server {self.name!r}"
        out: list[str] = []
        if not isinstance(self.name, str) or not PROVIDER_NAME.match(self.name):
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
        where = self.command if self.command is not None else url_without_secrets(self.url or "")
        return {"name": self.name, "transport": self.transport, "target": where}

    def resolved(self) -> MCPServer:
        """This server with every ``${NAME}`` in ``env`` and ``headers`` replaced by the
        variable's value here; each name becomes a known secret (redacted everywhere)."""
        fields = {"env": self.env, "headers": self.headers}
        resolved = resolve_references(f"MCP server {self.name!r}", fields)
        return attrs.evolve(self, env=resolved["env"], headers=resolved["headers"])

    async def open(self, nursery: trio.Nursery) -> OpenProvider:
        from cantrip.mcp._client import open_server

        return await open_server(self.resolved(), nursery)
