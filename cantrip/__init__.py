"""cantrip: a supervised trio runtime for LLM entities.

An LLM in a loop with an environment. The public API is everything imported
here; modules whose names start with an underscore are private.
"""

from typing import TYPE_CHECKING

from cantrip._cantrip import Cantrip
from cantrip._circle import Circle
from cantrip._entity import CastResult, Entity
from cantrip._errors import (
    CantripError,
    ChildCrashedError,
    ConstructionError,
    ImmutableError,
    IntentError,
    InvalidResponseError,
    LLMError,
    LoomAppendOnlyError,
    LoomError,
    ProviderError,
    ScriptExhaustedError,
)
from cantrip._gate import Gate, GateArgumentError, GateError, GateResult, gate
from cantrip._identity import Identity
from cantrip._wards import Ward, WardSet, max_depth, max_turns, require_done_tool, timeout
from cantrip.llm import (
    LLM,
    Message,
    Query,
    Response,
    RetryPolicy,
    ScriptedLLM,
    ToolCall,
    ToolDefinition,
    Usage,
)
from cantrip.loom import EntityRecord, GateCallRecord, Loom, Turn, TurnMetadata

if TYPE_CHECKING:
    from cantrip._events import (
        Event,
        FinalResponse,
        MessageComplete,
        MessageStart,
        StepComplete,
        StepStart,
        TextDelta,
        ThinkingDelta,
        ToolCallEvent,
        ToolResultEvent,
        UsageEvent,
    )
    from cantrip._folding import FoldingPolicy, LLMFolder
    from cantrip._gc import gc_for_throughput
    from cantrip._server import EntityServer
    from cantrip._supervisor import ChildSpec, Restart, Strategy, Supervisor, SupervisorEscalation
    from cantrip.llm._config import load_llm
    from cantrip.loom import export_chat, export_jsonl, export_thread_jsonl, load_jsonl

from cantrip._version import __version__ as __version__

# Loaded on first use, so `import cantrip` stays cheap (no provider, supervisor or
# export machinery until a program asks for it).
_LAZY = {
    "Supervisor": "cantrip._supervisor",
    "ChildSpec": "cantrip._supervisor",
    "Restart": "cantrip._supervisor",
    "Strategy": "cantrip._supervisor",
    "SupervisorEscalation": "cantrip._supervisor",
    "EntityServer": "cantrip._server",
    "FoldingPolicy": "cantrip._folding",
    "LLMFolder": "cantrip._folding",
    "load_llm": "cantrip.llm._config",
    "gc_for_throughput": "cantrip._gc",
    "export_jsonl": "cantrip.loom",
    "export_thread_jsonl": "cantrip.loom",
    "export_chat": "cantrip.loom",
    "load_jsonl": "cantrip.loom",
    "Event": "cantrip._events",
    "StepStart": "cantrip._events",
    "StepComplete": "cantrip._events",
    "MessageStart": "cantrip._events",
    "MessageComplete": "cantrip._events",
    "TextDelta": "cantrip._events",
    "ThinkingDelta": "cantrip._events",
    "ToolCallEvent": "cantrip._events",
    "ToolResultEvent": "cantrip._events",
    "UsageEvent": "cantrip._events",
    "FinalResponse": "cantrip._events",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'cantrip' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "LLM",
    "Cantrip",
    "CantripError",
    "CastResult",
    "ChildCrashedError",
    "ChildSpec",
    "Circle",
    "ConstructionError",
    "Entity",
    "EntityRecord",
    "EntityServer",
    "Event",
    "FinalResponse",
    "FoldingPolicy",
    "Gate",
    "GateArgumentError",
    "GateCallRecord",
    "GateError",
    "GateResult",
    "Identity",
    "ImmutableError",
    "IntentError",
    "InvalidResponseError",
    "LLMError",
    "LLMFolder",
    "Loom",
    "LoomAppendOnlyError",
    "LoomError",
    "Message",
    "MessageComplete",
    "MessageStart",
    "ProviderError",
    "Query",
    "Response",
    "Restart",
    "RetryPolicy",
    "ScriptExhaustedError",
    "ScriptedLLM",
    "StepComplete",
    "StepStart",
    "Strategy",
    "Supervisor",
    "SupervisorEscalation",
    "TextDelta",
    "ThinkingDelta",
    "ToolCall",
    "ToolCallEvent",
    "ToolDefinition",
    "ToolResultEvent",
    "Turn",
    "TurnMetadata",
    "Usage",
    "UsageEvent",
    "Ward",
    "WardSet",
    "export_chat",
    "export_jsonl",
    "export_thread_jsonl",
    "gate",
    "gc_for_throughput",
    "load_jsonl",
    "load_llm",
    "max_depth",
    "max_turns",
    "require_done_tool",
    "timeout",
]
