"""cantrip: a supervised trio runtime for LLM entities.

An LLM in a loop with an environment. The public API is everything imported
here; modules whose names start with an underscore are private.
"""

from typing import TYPE_CHECKING

from cantrip._version import __version__ as __version__

if TYPE_CHECKING:
    from cantrip import guardrails as guardrails
    from cantrip._approval import ApprovalPolicy, Decision, Pause, PauseError, Verdict
    from cantrip._cantrip import Cantrip
    from cantrip._chat_export import export_chat
    from cantrip._circle import Circle
    from cantrip._core import Entity
    from cantrip._errors import (
        CantripError,
        CastSuspended,
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
    from cantrip._events import (
        FinalResponse,
        GateProgress,
        MessageComplete,
        StepComplete,
        StepStart,
        ToolResultEvent,
        UsageEvent,
    )
    from cantrip._folding import FoldingPolicy, LLMFolder
    from cantrip._gate import Gate, GateArgumentError, GateError, GateResult, gate
    from cantrip._gc import gc_for_throughput
    from cantrip._identity import Identity
    from cantrip._outcome import CastResult
    from cantrip._output import OutputSchema
    from cantrip._providers import GateProvider, ProviderStartError
    from cantrip._server import EntityServer
    from cantrip._supervisor import ChildSpec, Restart, Strategy, Supervisor, SupervisorEscalation
    from cantrip._wards import (
        Ward,
        WardSet,
        max_cost_usd,
        max_depth,
        max_turns,
        require_done_tool,
        timeout,
    )
    from cantrip.a2a import A2AAgent
    from cantrip.guardrails import Guardrail, GuardrailError, Rewrite, Trip, guardrail
    from cantrip.llm import (
        LLM,
        Message,
        Query,
        ReasoningPart,
        Response,
        RetryPolicy,
        ScriptedLLM,
        ToolCall,
        ToolDefinition,
        Usage,
    )
    from cantrip.llm._config import load_llm
    from cantrip.llm._stream import Event, MessageStart, TextDelta, ThinkingDelta, ToolCallEvent
    from cantrip.llm._telemetry import Pricing
    from cantrip.loom import (
        EntityRecord,
        GateCallRecord,
        Loom,
        Turn,
        TurnMetadata,
        export_jsonl,
        export_thread_jsonl,
        load_jsonl,
    )
    from cantrip.mcp import MCPServer
    from cantrip.memory import Consolidate, MemoryBlock, MemorySettings

# Every name is loaded on first use, so `import cantrip` (and so every `cantrip.x`
# module, the `cantrip` command among them) costs nothing until a program asks for a
# name: `cantrip --version` reads one constant (issue 47.2), and a feature whose extra
# is not installed is imported only by the program that uses it.
_LAZY = {
    "ApprovalPolicy": "cantrip._approval",
    "Decision": "cantrip._approval",
    "Pause": "cantrip._approval",
    "PauseError": "cantrip._approval",
    "Verdict": "cantrip._approval",
    "Cantrip": "cantrip._cantrip",
    # from the module that also sets the default medium a circle gets (conversation,
    # MEDIUM-1): `cantrip.Circle([...])` built before any Cantrip still has one
    "Circle": "cantrip._cantrip",
    "Entity": "cantrip._core",
    "CantripError": "cantrip._errors",
    "CastSuspended": "cantrip._errors",
    "ChildCrashedError": "cantrip._errors",
    "ConstructionError": "cantrip._errors",
    "ImmutableError": "cantrip._errors",
    "IntentError": "cantrip._errors",
    "InvalidResponseError": "cantrip._errors",
    "LLMError": "cantrip._errors",
    "LoomAppendOnlyError": "cantrip._errors",
    "LoomError": "cantrip._errors",
    "ProviderError": "cantrip._errors",
    "ScriptExhaustedError": "cantrip._errors",
    "Gate": "cantrip._gate",
    "GateArgumentError": "cantrip._gate",
    "GateError": "cantrip._gate",
    "GateResult": "cantrip._gate",
    "gate": "cantrip._gate",
    "Identity": "cantrip._identity",
    "CastResult": "cantrip._outcome",
    "OutputSchema": "cantrip._output",
    "Ward": "cantrip._wards",
    "WardSet": "cantrip._wards",
    "max_cost_usd": "cantrip._wards",
    "max_depth": "cantrip._wards",
    "max_turns": "cantrip._wards",
    "require_done_tool": "cantrip._wards",
    "timeout": "cantrip._wards",
    "Guardrail": "cantrip.guardrails",
    "GuardrailError": "cantrip.guardrails",
    "Rewrite": "cantrip.guardrails",
    "Trip": "cantrip.guardrails",
    "guardrail": "cantrip.guardrails",
    "LLM": "cantrip.llm",
    "Message": "cantrip.llm",
    "Query": "cantrip.llm",
    "ReasoningPart": "cantrip.llm",
    "Response": "cantrip.llm",
    "RetryPolicy": "cantrip.llm",
    "ScriptedLLM": "cantrip.llm",
    "ToolCall": "cantrip.llm",
    "ToolDefinition": "cantrip.llm",
    "Usage": "cantrip.llm",
    "EntityRecord": "cantrip.loom",
    "GateCallRecord": "cantrip.loom",
    "Loom": "cantrip.loom",
    "Turn": "cantrip.loom",
    "TurnMetadata": "cantrip.loom",
    "Supervisor": "cantrip._supervisor",
    "ChildSpec": "cantrip._supervisor",
    "Restart": "cantrip._supervisor",
    "Strategy": "cantrip._supervisor",
    "SupervisorEscalation": "cantrip._supervisor",
    "EntityServer": "cantrip._server",
    "FoldingPolicy": "cantrip._folding",
    "LLMFolder": "cantrip._folding",
    "load_llm": "cantrip.llm._config",
    "Pricing": "cantrip.llm._telemetry",
    "gc_for_throughput": "cantrip._gc",
    "export_jsonl": "cantrip.loom",
    "export_thread_jsonl": "cantrip.loom",
    "export_chat": "cantrip._chat_export",
    "load_jsonl": "cantrip.loom",
    "Event": "cantrip.llm._stream",
    "StepStart": "cantrip._events",
    "StepComplete": "cantrip._events",
    "MessageStart": "cantrip.llm._stream",
    "MessageComplete": "cantrip._events",
    "TextDelta": "cantrip.llm._stream",
    "ThinkingDelta": "cantrip.llm._stream",
    "ToolCallEvent": "cantrip.llm._stream",
    "ToolResultEvent": "cantrip._events",
    "UsageEvent": "cantrip._events",
    "FinalResponse": "cantrip._events",
    "GateProgress": "cantrip._events",
    "GateProvider": "cantrip._providers",
    "ProviderStartError": "cantrip._providers",
    "MCPServer": "cantrip.mcp._provider",
    "A2AAgent": "cantrip.a2a._provider",
    "MemorySettings": "cantrip.memory._settings",
    "MemoryBlock": "cantrip.memory._settings",
    "Consolidate": "cantrip.memory._settings",
}


def __getattr__(name: str) -> object:
    import importlib

    module = _LAZY.get(name)
    if module is None:
        # A subpackage (`cantrip.guardrails`, `cantrip.loom`...): `import cantrip` used to
        # import them all, so `cantrip.loom.Loom` after `import cantrip` still works.
        try:
            return importlib.import_module(f"cantrip.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"cantrip.{name}":
                raise
        raise AttributeError(f"module 'cantrip' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is an ordinary attribute
    return value


__all__ = [
    "LLM",
    "A2AAgent",
    "ApprovalPolicy",
    "Cantrip",
    "CantripError",
    "CastResult",
    "CastSuspended",
    "ChildCrashedError",
    "ChildSpec",
    "Circle",
    "Consolidate",
    "ConstructionError",
    "Decision",
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
    "GateProgress",
    "GateProvider",
    "GateResult",
    "Guardrail",
    "GuardrailError",
    "Identity",
    "ImmutableError",
    "IntentError",
    "InvalidResponseError",
    "LLMError",
    "LLMFolder",
    "Loom",
    "LoomAppendOnlyError",
    "LoomError",
    "MCPServer",
    "MemoryBlock",
    "MemorySettings",
    "Message",
    "MessageComplete",
    "MessageStart",
    "OutputSchema",
    "Pause",
    "PauseError",
    "Pricing",
    "ProviderError",
    "ProviderStartError",
    "Query",
    "ReasoningPart",
    "Response",
    "Restart",
    "RetryPolicy",
    "Rewrite",
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
    "Trip",
    "Turn",
    "TurnMetadata",
    "Usage",
    "UsageEvent",
    "Verdict",
    "Ward",
    "WardSet",
    "export_chat",
    "export_jsonl",
    "export_thread_jsonl",
    "gate",
    "gc_for_throughput",
    "guardrail",
    "guardrails",
    "load_jsonl",
    "load_llm",
    "max_cost_usd",
    "max_depth",
    "max_turns",
    "require_done_tool",
    "timeout",
]
