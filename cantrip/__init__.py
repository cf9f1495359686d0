"""cantrip: a supervised trio runtime for LLM entities.

An LLM in a loop with an environment. The public API is everything imported
here; modules whose names start with an underscore are private.
"""

from cantrip._cantrip import Cantrip
from cantrip._circle import Circle
from cantrip._entity import CastResult, Entity
from cantrip._errors import (
    CantripError,
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

__version__ = "0.1.0"

__all__ = [
    "LLM",
    "Cantrip",
    "CantripError",
    "CastResult",
    "Circle",
    "ConstructionError",
    "Entity",
    "EntityRecord",
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
    "Loom",
    "LoomAppendOnlyError",
    "LoomError",
    "Message",
    "ProviderError",
    "Query",
    "Response",
    "RetryPolicy",
    "ScriptExhaustedError",
    "ScriptedLLM",
    "ToolCall",
    "ToolDefinition",
    "Turn",
    "TurnMetadata",
    "Usage",
    "Ward",
    "WardSet",
    "gate",
    "max_depth",
    "max_turns",
    "require_done_tool",
    "timeout",
]
