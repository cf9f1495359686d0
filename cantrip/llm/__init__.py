"""The LLM contract, the scripted LLM, and the provider stack's building blocks."""

from cantrip.llm._contract import (
    LLM,
    Message,
    Query,
    Response,
    ToolCall,
    ToolChoice,
    ToolDefinition,
    Usage,
)
from cantrip.llm._openai_chat import parse_chat_completion
from cantrip.llm._retry import RetryingLLM, RetryPolicy
from cantrip.llm._scripted import ScriptedLLM

__all__ = [
    "LLM",
    "Message",
    "Query",
    "Response",
    "RetryPolicy",
    "RetryingLLM",
    "ScriptedLLM",
    "ToolCall",
    "ToolChoice",
    "ToolDefinition",
    "Usage",
    "parse_chat_completion",
]
