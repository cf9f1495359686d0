"""The LLM contract, the scripted LLM, and the provider stack's building blocks.

Provider adapters and the resilience wrappers are imported on first use
(``cantrip.llm.load_llm``, ``cantrip.llm.FallbackLLM``, ...), so importing
cantrip never loads httpx or a provider module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from cantrip.llm._contract import (
    LLM,
    Message,
    Query,
    ReasoningPart,
    Response,
    StreamingLLM,
    ToolCall,
    ToolChoice,
    ToolDefinition,
    Usage,
)
from cantrip.llm._embed_contract import Embedder, EmbeddingTask
from cantrip.llm._finish import Finish, mark_cut_off, resolve_finish
from cantrip.llm._latency import simulate_latency
from cantrip.llm._openai_chat import parse_chat_completion
from cantrip.llm._retry import RetryingLLM, RetryPolicy
from cantrip.llm._scripted import ScriptedLLM
from cantrip.llm._transcript import render_transcript
from cantrip.llm._transcript_check import validate_transcript
from cantrip.llm._transcript_ids import project_id
from cantrip.llm._transcript_incremental import IncrementalRenderer, RenderedView
from cantrip.llm._transcript_model import (
    DEFAULT_POLICY,
    PROVIDER_FORMATS,
    CompletionPolicy,
    ProviderFormat,
    RenderDiagnostics,
    RenderedTranscript,
    TranscriptError,
)

if TYPE_CHECKING:
    from cantrip.llm._config import (
        Compat,
        ModelInfo,
        ProviderConfig,
        available_providers,
        clear_cache,
        load_llm,
        load_provider_config,
    )
    from cantrip.llm._embeddings import embedder_from_config
    from cantrip.llm._fallback import FallbackLLM
    from cantrip.llm._ratelimit import RateLimitedLLM, TokenBucket
    from cantrip.llm._telemetry import Pricing, TelemetryLLM
    from cantrip.llm.providers.embed_gemini import GeminiEmbedder
    from cantrip.llm.providers.embed_openai import OpenAIEmbedder

_LAZY = {
    "Compat": "cantrip.llm._config",
    "ModelInfo": "cantrip.llm._config",
    "ProviderConfig": "cantrip.llm._config",
    "available_providers": "cantrip.llm._config",
    "clear_cache": "cantrip.llm._config",
    "load_llm": "cantrip.llm._config",
    "load_provider_config": "cantrip.llm._config",
    "FallbackLLM": "cantrip.llm._fallback",
    "embedder_from_config": "cantrip.llm._embeddings",
    "OpenAIEmbedder": "cantrip.llm.providers.embed_openai",
    "GeminiEmbedder": "cantrip.llm.providers.embed_gemini",
    "RateLimitedLLM": "cantrip.llm._ratelimit",
    "TokenBucket": "cantrip.llm._ratelimit",
    "Pricing": "cantrip.llm._telemetry",
    "TelemetryLLM": "cantrip.llm._telemetry",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_POLICY",
    "LLM",
    "PROVIDER_FORMATS",
    "Compat",
    "CompletionPolicy",
    "Embedder",
    "EmbeddingTask",
    "FallbackLLM",
    "Finish",
    "GeminiEmbedder",
    "IncrementalRenderer",
    "Message",
    "ModelInfo",
    "OpenAIEmbedder",
    "Pricing",
    "ProviderConfig",
    "ProviderFormat",
    "Query",
    "RateLimitedLLM",
    "ReasoningPart",
    "RenderDiagnostics",
    "RenderedTranscript",
    "RenderedView",
    "Response",
    "RetryPolicy",
    "RetryingLLM",
    "ScriptedLLM",
    "StreamingLLM",
    "TelemetryLLM",
    "TokenBucket",
    "ToolCall",
    "ToolChoice",
    "ToolDefinition",
    "TranscriptError",
    "Usage",
    "available_providers",
    "clear_cache",
    "embedder_from_config",
    "load_llm",
    "load_provider_config",
    "mark_cut_off",
    "parse_chat_completion",
    "project_id",
    "render_transcript",
    "resolve_finish",
    "simulate_latency",
    "validate_transcript",
]
