"""A remote A2A agent as a circle's gate provider: the value users write.

``A2AAgent(name="travel", url="https://agents.example/travel")`` in Python, or
one ``[[circle.a2a]]`` table in a spec file (read by :mod:`cantrip.spec._providers`),
names a remote agent; nothing is fetched until an entity of the circle first runs
(see :mod:`cantrip._providers`). The agent becomes one gate named ``name`` that sends
it a message and returns its answer (:mod:`cantrip.a2a._client`).

``headers`` values may name environment variables, ``"${NAME}"`` (``"Bearer
${TRAVEL_TOKEN}"``), read by the process that opens the agent, so a credential need
not be written in the spec; a spec run by workers (``--db``) must give them that way
(:mod:`cantrip.distributed._spell_secrets`: the check MCP servers' ``env`` and
``headers`` take).

This module is a plain value with checks; the SDK is imported only when the
agent is opened, so ``import cantrip`` stays cheap and works without the extra.
"""

from __future__ import annotations

from collections.abc import Mapping
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


DEFAULT_TIMEOUT_S = 300.0
DEFAULT_STARTUP_TIMEOUT_S = 30.0


@attrs.frozen
class A2AAgent:
    """One remote A2A agent an entity may delegate to, as the gate ``name``.

    ``url`` is where its Agent Card is (``<url>/.well-known/agent-card.json``);
    ``headers`` go with every request (credentials: never recorded; a value may name
    environment variables, ``"Bearer ${TOKEN}"``, read when the agent is opened); ``timeout_s``
    bounds each delegated task (the remote task is cancelled when it runs out) and
    ``startup_timeout_s`` the fetching of the card."""

    name: str
    url: str
    headers: Mapping[str, str] = attrs.field(factory=dict, converter=string_table, repr=False)
    timeout_s: float = DEFAULT_TIMEOUT_S
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S

    def __attrs_post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ConstructionError(problems)
        # declared, so about to be used: a missing SDK is said now (at spec load), once
        require_extra("a2a", f"A2A agent {self.name!r}")

    def problems(self) -> list[str]:
        out: list[str] = []
        if not isinstance(self.name, str) or not PROVIDER_NAME.match(self.name):
            out.append(
                f"A2A agent name {self.name!r} must start with a letter and use only "
                "letters, digits, '_' and '-' (at most 64)"
            )
        if not isinstance(self.url, str) or not self.url.startswith(("http://", "https://")):
            out.append(
                f"A2A agent {self.name!r}: url must be http:// or https://, got {self.url!r}"
            )
        if not self.timeout_s > 0 or not self.startup_timeout_s > 0:
            out.append(f"A2A agent {self.name!r}: timeout_s and startup_timeout_s must be positive")
        return out

    def describe(self) -> dict[str, Any]:
        """Where the agent is, for records and messages: no headers, no query (secrets)."""
        return {"name": self.name, "transport": "a2a", "target": url_without_secrets(self.url)}

    def resolved(self) -> A2AAgent:
        """This agent with every ``${NAME}`` in ``headers`` replaced by the variable's
        value here; each name becomes a known secret (redacted everywhere)."""
        resolved = resolve_references(f"A2A agent {self.name!r}", {"headers": self.headers})
        return attrs.evolve(self, headers=resolved["headers"])

    async def open(self, nursery: trio.Nursery) -> OpenProvider:
        from cantrip.a2a._client import open_agent

        return await open_agent(self.resolved())
