"""Errors of local OpenAI-compatible servers keep their meaning."""

from __future__ import annotations

from typing import Any

import pytest
from fake_providers import Raw, isolate, running

from cantrip import ProviderError
from cantrip.llm import Message

pytestmark = pytest.mark.loop_watch  # nothing here may block the trio loop (issue 28)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    isolate(monkeypatch, tmp_path)


async def test_llama_server_s_context_error_is_a_context_length_error() -> None:
    """llama-server words it "exceeds the available context size" (its server-context.cpp)."""
    body = (
        b'{"error":{"code":400,"message":"request (5000 tokens) exceeds the available context '
        b'size (2048 tokens), try increasing it","type":"exceed_context_size_error"}}'
    )
    reply = Raw(400, body, {"content-type": "application/json"})
    async with running("ollama", [reply], model="llama3.1:8b") as (_fake, llm):
        with pytest.raises(ProviderError) as info:
            await llm.query([Message("user", "hi")], [])
    assert info.value.code == "context_length_exceeded" and not info.value.retryable
