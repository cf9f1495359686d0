"""Gate providers: outside tool sources that contribute gates to an entity's circle.

A circle may name *providers* beside its gates (an MCP server is one). A
provider is a resource, not a list of functions: it is opened in the entity's
nursery when the entity first runs, contributes gates that are added to the
entity's circle, and is closed when the entity ends or is cancelled. The medium,
the loom and replay see ordinary gate calls; only the provider knows that a
process or a URL is behind them (SPEC.md, "Gate providers").

This module is the seam: the :class:`GateProvider` protocol, and
:class:`ProviderScope`, which opens a circle's providers in a nursery, checks
their gates' names against the circle's own, and closes them again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import attrs
import trio

from cantrip._errors import ConstructionError
from cantrip._gate import Gate
from cantrip._redact import get_logger

log = get_logger("cantrip.providers")


class ProviderStartError(ConstructionError):
    """A gate provider could not be opened (a server that fails to start, hangs on
    its handshake, or lists tools whose names collide). Raised before the cast's
    first turn: nothing was recorded, nothing is lost."""


class OpenProvider(Protocol):
    """A provider while it is open: its gates, and how to close it."""

    @property
    def gates(self) -> Sequence[Gate]: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class GateProvider(Protocol):
    """A source of gates opened per entity (e.g. :class:`cantrip.mcp.MCPServer`)."""

    @property
    def name(self) -> str: ...

    async def open(self, nursery: trio.Nursery) -> OpenProvider:
        """Open in ``nursery`` (the entity's); raise :class:`ProviderStartError` on failure."""
        ...

    def describe(self) -> dict[str, Any]:
        """Where the provider is, for messages and records (no secrets)."""
        ...


@attrs.define(eq=False)
class ProviderScope:
    """The open providers of one entity, and the nursery their tasks run in.

    The nursery is the entity's: either one the entity opened for itself
    (``async with entity``), one a long-lived host lends it (a protocol server),
    or, failing both, one opened for a single cast. It is entered and left by
    hand so that an exception of the cast passes through unchanged (a nursery
    body would wrap it in an exception group); the providers' own tasks never
    raise into it -- each catches its server's failures at its boundary.
    """

    nursery: trio.Nursery
    _manager: Any = None
    """The nursery's context manager when this scope owns the nursery."""
    opened: list[OpenProvider] = attrs.field(factory=list)

    @classmethod
    async def enter(cls) -> ProviderScope:
        manager = trio.open_nursery()
        nursery = await manager.__aenter__()
        return cls(nursery, manager)

    @classmethod
    def lent(cls, nursery: trio.Nursery) -> ProviderScope:
        return cls(nursery)

    @property
    def owns_nursery(self) -> bool:
        return self._manager is not None

    async def open_all(
        self, providers: Sequence[GateProvider], own_gates: Sequence[Gate]
    ) -> list[Gate]:
        """Open every provider; their gates, checked for name collisions."""
        taken = {name: "the circle" for g in own_gates for name in (g.name, *g.aliases)}
        gates: list[Gate] = []
        try:
            for provider in providers:
                opened = await provider.open(self.nursery)
                self.opened.append(opened)
                for g in opened.gates:
                    owner = taken.get(g.name)
                    if owner is not None:
                        raise ProviderStartError(
                            f"gate name collision: {provider.name!r} provides {g.name!r}, "
                            f"which {owner} already has; give the server another prefix "
                            "or leave the tool out of its allow-list"
                        )
                    taken[g.name] = f"provider {provider.name!r}"
                    gates.append(g)
        except BaseException:
            await self.close_opened()
            raise
        return gates

    async def listing(
        self, providers: Sequence[GateProvider], own_gates: Sequence[Gate]
    ) -> list[tuple[str, str, str | None]]:
        """Open every provider, note its gates, close them all again (a spec check):
        ``(provider, gate, the provider's own name for it when that differs)``. An
        open provider may say which gates it renamed in a ``renamed`` mapping
        (gate -> own name; an MCP tool whose name providers refuse)."""
        try:
            await self.open_all(providers, own_gates)
            listed: list[tuple[str, str, str | None]] = []
            for provider, opened in zip(providers, self.opened, strict=True):
                renamed = getattr(opened, "renamed", {})
                listed.extend((provider.name, g.name, renamed.get(g.name)) for g in opened.gates)
            return listed
        finally:
            await self.aclose()

    async def close_opened(self) -> None:
        """Close every open provider (shielded: closing is cleanup)."""
        with trio.CancelScope(shield=True):
            opened, self.opened = self.opened, []
            for provider in reversed(opened):
                await provider.aclose()

    async def aclose(self) -> None:
        """Close every open provider, then leave the nursery if this scope owns it.

        The nursery is left outside any shield (a scope entered after it must
        be left before it); its tasks have ended by then, so leaving is prompt."""
        await self.close_opened()
        manager, self._manager = self._manager, None
        if manager is not None:
            await manager.__aexit__(None, None, None)
