"""The conversation medium: gates as tool calls, results as tool messages (4.5).

The default medium of the Python API. Each gate is its own tool definition and
``tool_choice`` defaults to ``auto``. Calls run in the order the utterance
gives them; after a successful ``done`` the rest are recorded as ``skipped``
(LOOP-3, D-003) so every call still has exactly one completion.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from cantrip.medium import (
    Gate,
    GateCallRecord,
    Message,
    Response,
    ToolChoice,
    ToolDefinition,
    Turn,
    ValueBoundaryError,
    WardKind,
    WardSet,
)
from mediums._code import boundary_arguments, refused_arguments
from mediums.base import Execution, GateHost, cut_off, visible_result

SKIPPED_AFTER_DONE = "skipped: done was already called in this utterance"


@attrs.frozen
class ConversationMedium:
    """Natural language plus structured gate calls: A = G - W."""

    name: str = "conversation"
    default_tool_choice: ToolChoice = "auto"

    def ward_kinds(self) -> Sequence[WardKind]:
        return ()

    def present(self, gates: Sequence[Gate]) -> tuple[ToolDefinition, ...]:
        return tuple(g.definition() for g in gates)

    async def open(self, wards: WardSet) -> ConversationSession:
        return _SESSION  # stateless, so one serves every entity

    def render_observation(self, turn: Turn) -> list[Message]:
        shown = turn.extras.get("shown")  # results cut to max_observation_chars, if any
        return [
            Message(
                role="tool",
                content=str(shown[index])
                if isinstance(shown, list | tuple) and index < len(shown)
                else visible_result(record),
                tool_call_id=record.tool_call_id,
                name=record.gate,
                is_error=record.is_error,
            )
            for index, record in enumerate(turn.gate_calls)
        ]


class ConversationSession:
    """Conversation keeps no state of its own: the loom thread is the state."""

    async def execute(self, response: Response, host: GateHost) -> Execution:
        if not response.tool_calls:
            return Execution(text_only=True)
        records: list[GateCallRecord] = []
        terminated = False
        result = None
        for call in response.tool_calls:
            if terminated:
                records.append(
                    host.unexecuted(
                        call.name, call.arguments, call.id, "skipped", SKIPPED_AFTER_DONE
                    )
                )
                continue
            if call.cut_off:
                records.append(
                    host.unexecuted(call.name, call.arguments, call.id, "error", cut_off(call))
                )
                continue
            if call.raw_arguments is not None and not call.arguments:
                message = f"arguments of {call.name!r} are not valid JSON: {call.raw_arguments!r}"
                records.append(host.unexecuted(call.name, {}, call.id, "error", message))
                continue
            try:  # the value boundary (cantrip._values): NaN, nesting too deep
                arguments = boundary_arguments(call.name, call.arguments)
            except ValueBoundaryError as exc:
                records.append(
                    host.unexecuted(
                        call.name, refused_arguments(call.arguments), call.id, "error", str(exc)
                    )
                )
                continue
            record = await host.call(call.name, arguments, call.id)
            records.append(record)
            if record.status == "ok" and host.terminates(call.name):
                terminated = True
                result = record.result
        if len(records) == 1:  # the common case, without a generator
            observation = records[0].text if records[0].executed else ""
        else:
            observation = "\n".join(r.text for r in records if r.executed)
        return Execution(
            gate_calls=tuple(records), terminated=terminated, result=result, observation=observation
        )

    async def aclose(self) -> None:
        pass


_SESSION = ConversationSession()
conversation = ConversationMedium()
