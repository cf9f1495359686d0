"""The gate host one turn's medium calls: the circle as the medium sees it.

A medium runs an utterance and calls gates only through a :class:`GateHost`
(:mod:`cantrip.medium`). The entity hands it a :class:`TurnHost` per turn, which
remembers every completed call -- so a turn cut off midway is recorded with what
had already happened -- sends each result to the event sink, goes through the
gate journal when the loom keeps one, and, in a circle where calls may need a
human, through the pause's gatekeeper (:mod:`cantrip._core._pauses`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from cantrip._circle import Circle
from cantrip._core._budget import GATE_CALLS, TreeBudget, charge_reported
from cantrip._core._guard_calls import guarded_call, guarded_result
from cantrip._events import ToolResultEvent
from cantrip._gate import Gate
from cantrip._journal import TurnJournal
from cantrip.guardrails._model import GuardrailError
from cantrip.guardrails._run import Tripped
from cantrip.llm._stream import Event
from cantrip.loom._model import CallStatus, GateCallRecord

Gatekeeper = Callable[[str, Mapping[str, Any], "str | None"], Awaitable[GateCallRecord]]
"""Decides whether a call may run (a human may be asked), then runs it through the host."""


class TurnHost:
    """The circle as one turn's medium sees it, remembering every completion so a
    cut-off turn can be recorded with what had already happened."""

    __slots__ = (
        "budget",
        "circle",
        "emit",
        "failed",
        "gatekeeper",
        "journal",
        "records",
        "tripped",
    )

    def __init__(
        self,
        circle: Circle,
        emit: Callable[[Event], None] | None = None,
        journal: TurnJournal | None = None,
        gatekeeper: Gatekeeper | None = None,
    ) -> None:
        self.circle = circle
        self.emit = emit
        self.journal = journal
        """Set when the loom keeps a gate journal: calls go through it (cantrip._journal)."""
        self.gatekeeper = gatekeeper
        """Set when a call may need a human (Pauses.gate_call); it runs the gate through
        :meth:`run` once the call may go ahead."""
        self.records: list[GateCallRecord] = []
        self.budget: TreeBudget | None = None
        """The cast's tree account: each call (but a terminating one) takes one
        ``max_gate_calls`` unit before it runs; a refused call is not made."""
        self.tripped: Tripped | None = None
        """A ``call`` or ``result`` guardrail tripped: the loop ends the cast (reason
        ``guardrail``) once the utterance is done (:mod:`cantrip._core._guard_calls`)."""
        self.failed: GuardrailError | None = None
        """A ``call`` or ``result`` check failed: the loop raises it."""

    @property
    def gates(self) -> Sequence[Gate]:
        return self.circle.gates

    def gate(self, name: str) -> Gate | None:
        return self.circle.gate(name)

    def terminates(self, name: str) -> bool:
        return self.circle.terminates(name)

    async def call(
        self, name: str, args: Mapping[str, Any], tool_call_id: str | None = None
    ) -> GateCallRecord:
        if self.budget is not None and not self.circle.terminates(name):
            refused = self.budget.take(GATE_CALLS)
            if refused is not None:
                return self.unexecuted(name, args, tool_call_id, "error", refused)
        guard = self.circle.guard
        if self.journal is not None and (guard is not None or self.gatekeeper is not None):
            await self.journal.flush()  # a guardrail or a human may take long: commit first
        if guard is not None:
            go = self.gatekeeper if self.gatekeeper is not None else self.run
            record = await guarded_call(self, guard, name, args, tool_call_id, go)
        elif self.gatekeeper is not None:
            record = await self.gatekeeper(name, args, tool_call_id)
        else:
            record = await self.run(name, args, tool_call_id)
        self.records.append(record)
        if self.budget is not None:
            charge_reported(self.budget, record.detail)
        if self.emit is not None:
            self.emit(ToolResultEvent(record=record))
        return record

    async def run(
        self, name: str, args: Mapping[str, Any], tool_call_id: str | None
    ) -> GateCallRecord:
        """The gate call itself, through the journal when the loom keeps one; its
        result checked by the ``result`` guardrails before the model sees it."""
        if self.journal is not None:
            record = await self.journal.call(self.circle, name, args, tool_call_id)
        else:
            record = await self.circle.call(name, args, tool_call_id)
        guard = self.circle.guard
        if guard is not None and guard.has("result"):
            if self.journal is not None:
                await self.journal.flush()  # the guardrail may take long: commit first
            record = await guarded_result(self, guard, record)
        return record

    def unexecuted(
        self,
        name: str,
        args: Mapping[str, Any],
        tool_call_id: str | None,
        status: CallStatus,
        message: str,
    ) -> GateCallRecord:
        record = self.circle.unexecuted(name, args, tool_call_id, status, message)
        self.records.append(record)
        if self.emit is not None:
            self.emit(ToolResultEvent(record=record))
        return record
