"""The extension point for mediums: the medium protocol and every runtime name a medium needs.

A medium (the substrate an entity works in: a conversation, a code sandbox, a
shell) is written against these names only. The built-in mediums in
``mediums/`` import nothing else from cantrip, so they are the model for your
own; :mod:`mediums.base` re-exports the protocol under its historical name.

The protocol (MEDIUM-2) is defined here, below the entity that drives it: a
medium is the inside of a circle. It does four things:

* **gate presentation** -- :meth:`Medium.present` turns the circle's gates
  into the tool definitions the LLM sees, with a default ``tool_choice``;
* **action execution** -- :meth:`MediumSession.execute` runs one utterance,
  calling gates only through the :class:`GateHost` it is handed;
* **observation return** -- the :class:`Execution` it returns, and
  :meth:`Medium.render_observation`, which decides how a recorded turn reads
  in the entity's working context (LOOP-5: the circle mediates perception);
* **isolation** -- per-entity state lives in the session, which
  :meth:`Medium.open` creates for one entity and ``aclose`` ends.

The other names are re-exported from the private modules that define them;
the names are the stable part.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Protocol

import attrs

from cantrip._errors import ConstructionError
from cantrip._gate import Gate
from cantrip._install import MissingExtraError, require_extra
from cantrip._running import RunningEntity, running_entity
from cantrip._values import (
    OBSERVATION_CAP_CHARS,
    ValueBoundaryError,
    cap_text,
    preview,
    to_loom_value,
)
from cantrip._wards import WardKind, WardSet, register_ward_kind
from cantrip.llm._contract import Message, Response, ToolCall, ToolChoice, ToolDefinition
from cantrip.loom._model import CallStatus, GateCallRecord, Turn
from cantrip.loom._view import history_view, render_code_observation

__all__ = [
    "OBSERVATION_CAP_CHARS",
    "CallStatus",
    "ConstructionError",
    "Execution",
    "Gate",
    "GateCallRecord",
    "GateHost",
    "Medium",
    "MediumSession",
    "Message",
    "MissingExtraError",
    "Response",
    "RunningEntity",
    "ToolCall",
    "ToolChoice",
    "ToolDefinition",
    "Turn",
    "ValueBoundaryError",
    "WardKind",
    "WardSet",
    "cap_text",
    "capped_execution",
    "cut_off",
    "history_view",
    "preview",
    "register_ward_kind",
    "render_code_observation",
    "require_extra",
    "running_entity",
    "to_loom_value",
    "visible_result",
]


def visible_result(record: GateCallRecord) -> str:
    """A gate result as the working context shows it.

    An ephemeral gate's result is kept whole in the loom but projected as
    ``[ephemeral:<gate>]`` in every rendering of the context (PROD-5, D-010).
    """
    if record.detail.get("ephemeral") and record.status == "ok":
        return f"[ephemeral:{record.gate}]"
    return record.text


def cut_off(call: ToolCall) -> str:
    """What the model reads about a call the output-token limit cut off (issue 22).

    The call is not run: its arguments may be incomplete even where they parse.
    """
    shown = call.raw_arguments if call.raw_arguments is not None else call.arguments_json
    preview = shown if len(shown) <= 200 else shown[:200] + "..."
    return (
        f"the arguments of {call.name!r} were cut off by the output token limit (max_tokens), "
        f"so the call was not made; received only {preview!r}. Make the call again with "
        "shorter arguments, or split the work into smaller calls."
    )


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


def capped_execution(execution: Execution, limit: int) -> Execution:
    """``execution`` with everything the entity will observe cut to ``limit`` characters
    (issue 13, item 2): the observation, each code call's observation, the code's
    error, and -- for mediums that render gate results directly (conversation) --
    each result's shown text, kept in ``extras["shown"]``. The gate-call records
    themselves keep more: they are the data code worked with and what a replay answers
    from (LOOM-13), cut only by the record cap (``max_record_chars``) when stored.
    """
    extras = execution.extras
    observation = execution.observation
    texts = extras.get("observations") if extras else None
    error = extras.get("error") if extras else None
    over = len(observation) > limit or (isinstance(error, str) and len(error) > limit)
    if not over and isinstance(texts, list | tuple):
        over = any(len(str(t)) > limit for t in texts)
    if not over:
        return execution  # the common case, every turn: nothing to cut, nothing to copy
    changed: dict[str, Any] = {}
    if isinstance(texts, list | tuple):
        changed["observations"] = [cap_text(str(t), limit) for t in texts]
    if isinstance(error, str):
        changed["error"] = cap_text(error, limit)
    if texts is None and execution.gate_calls and len(observation) > limit:
        # (the observation holds every executed result: when it fits, each one does)
        shown = [visible_result(r) for r in execution.gate_calls]
        if any(len(t) > limit for t in shown):
            changed["shown"] = [cap_text(t, limit) for t in shown]
    return attrs.evolve(
        execution, observation=cap_text(observation, limit), extras={**extras, **changed}
    )


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
