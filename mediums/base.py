"""The one small protocol every medium implements (MEDIUM-2).

A medium is the inside of a circle. It does four things:

* **gate presentation** -- :meth:`Medium.present` turns the circle's gates
  into the tool definitions the LLM sees, with a default ``tool_choice``;
* **action execution** -- :meth:`MediumSession.execute` runs one utterance,
  calling gates only through the :class:`GateHost` it is handed;
* **observation return** -- the :class:`Execution` it returns, and
  :meth:`Medium.render_observation`, which decides how a recorded turn reads
  in the entity's working context (LOOP-5: the circle mediates perception);
* **isolation** -- per-entity state lives in the session, which
  :meth:`Medium.open` creates for one entity and ``aclose`` ends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

import attrs

if TYPE_CHECKING:  # only types: mediums.base must import without the runtime
    from cantrip.medium import (
        CallStatus,
        Gate,
        GateCallRecord,
        Message,
        Response,
        ToolChoice,
        ToolDefinition,
        Turn,
        WardKind,
        WardSet,
    )


def visible_result(record: GateCallRecord) -> str:
    """A gate result as the working context shows it.

    An ephemeral gate's result is kept whole in the loom but projected as
    ``[ephemeral:<gate>]`` in every rendering of the context (PROD-5, D-010).
    """
    if record.detail.get("ephemeral") and record.status == "ok":
        return f"[ephemeral:{record.gate}]"
    return record.text


class GateHost(Protocol):
    """What a medium may do with the circle's gates: call them, by name, in order."""

    @property
    def gates(self) -> Sequence[Gate]: ...

    def gate(self, name: str) -> Gate | None: ...

    def terminates(self, name: str) -> bool: ...

    async def call(
        self, name: str, args: Mapping[str, Any], tool_call_id: str | None = None
    ) -> GateCallRecord: ...

    def unexecuted(
        self,
        name: str,
        args: Mapping[str, Any],
        tool_call_id: str | None,
        status: CallStatus,
        message: str,
    ) -> GateCallRecord:
        """The completion of a call that never ran (skipped, bad JSON, cancelled)."""
        ...


_NO_EXTRAS: Mapping[str, Any] = MappingProxyType({})


@attrs.frozen
class Execution:
    """What one utterance did in the medium."""

    gate_calls: tuple[GateCallRecord, ...] = ()
    terminated: bool = False
    result: Any = None
    observation: str = ""
    extras: Mapping[str, Any] = attrs.field(factory=lambda: _NO_EXTRAS)
    text_only: bool = False
    """The utterance made no gate call and ran no code (LOOP-6)."""


class MediumSession(Protocol):
    """One entity's private state inside the medium (MEDIUM-3, COMP-4)."""

    async def execute(self, response: Response, host: GateHost) -> Execution: ...

    async def aclose(self) -> None: ...


class Medium(Protocol):
    """A substrate the entity works in."""

    @property
    def name(self) -> str: ...

    @property
    def default_tool_choice(self) -> ToolChoice: ...

    def ward_kinds(self) -> Sequence[WardKind]: ...

    def present(self, gates: Sequence[Gate]) -> tuple[ToolDefinition, ...]: ...

    async def open(self, wards: WardSet) -> MediumSession:
        """A fresh session for one entity, with the circle's resolved wards."""
        ...

    def render_observation(self, turn: Turn) -> list[Message]: ...
