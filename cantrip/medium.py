"""The extension point for mediums: every runtime name a medium needs.

A medium (the substrate an entity works in: a conversation, a code sandbox, a
shell) is written against these names and the protocol in :mod:`mediums.base`
only. The built-in mediums in ``mediums/`` import nothing else from cantrip,
so they are the model for your own. Everything here is re-exported from the
private modules that define it; the names are the stable part.
"""

from __future__ import annotations

from cantrip._errors import ConstructionError
from cantrip._gate import Gate
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
    "Gate",
    "GateCallRecord",
    "Message",
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
    "history_view",
    "preview",
    "register_ward_kind",
    "render_code_observation",
    "running_entity",
    "to_loom_value",
]
