"""Prompt-cache routing keys shared by the OpenAI adapters.

OpenAI caches prompt prefixes automatically; ``prompt_cache_key`` tells it
which requests share a prefix so they land where that prefix is cached. One
identity (its instructions and tools) is the natural unit: every turn of every
entity with that identity starts with the same bytes.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence

from cantrip.llm._contract import ToolDefinition


def cache_key(system: str, tools: Sequence[ToolDefinition]) -> str:
    """A routing key shared by requests with the same instructions and tools."""
    return _key(system, tuple(t.name for t in tools))


@functools.lru_cache(maxsize=256)
def _key(system: str, names: tuple[str, ...]) -> str:
    """Remembered: every turn of every entity of an identity asks for the same key."""
    seed = "\x00".join([system, *names])
    return "cantrip-" + hashlib.sha256(seed.encode()).hexdigest()[:32]
