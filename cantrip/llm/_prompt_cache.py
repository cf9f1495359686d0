"""Prompt-cache routing keys shared by the OpenAI adapters.

OpenAI caches prompt prefixes automatically; ``prompt_cache_key`` tells it
which requests share a prefix so they land where that prefix is cached. One
identity (its instructions and tools) is the natural unit: every turn of every
entity with that identity starts with the same bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from cantrip.llm._contract import ToolDefinition


def cache_key(system: str, tools: Sequence[ToolDefinition]) -> str:
    """A routing key shared by requests with the same instructions and tools."""
    seed = "\x00".join([system, *(t.name for t in tools)])
    return "cantrip-" + hashlib.sha256(seed.encode()).hexdigest()[:32]
