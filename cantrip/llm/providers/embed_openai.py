"""OpenAI's embeddings wire format (``POST {base_url}/embeddings``), which OpenAI and the
local servers that copy its API (llama.cpp's llama-server, Ollama, vLLM, LM Studio) speak.

Request: ``{"model", "input": [texts], "encoding_format": "float"}`` and, when asked,
``"dimensions"`` (models that can shorten their vectors: ``text-embedding-3-*``).
Response: ``{"object": "list", "data": [{"object": "embedding", "index": i,
"embedding": [...]}], "model", "usage": {"prompt_tokens", "total_tokens"}}`` -- the
``data`` put back in input order by ``index``, and an ``embedding`` given as base64
(float32, little-endian; what a server sends when it prefers it) read as well.
OpenAI takes at most 2,048 inputs per request, none of them empty.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from cantrip.llm._embed_contract import EmbeddingTask
from cantrip.llm.providers._embed_http import HTTPEmbedder, malformed

MAX_INPUTS = 2048
"""OpenAI's limit on the ``input`` array."""


class OpenAIEmbedder(HTTPEmbedder):
    max_batch: ClassVar[int] = MAX_INPUTS

    def build(self, texts: Sequence[str], task: EmbeddingTask) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {
            "model": self.model,
            "input": list(texts),
            "encoding_format": "float",
        }
        if self.dimensions is not None:
            body["dimensions"] = self.dimensions
        return f"{self.base_url}/embeddings", body

    def vectors(self, payload: Mapping[str, Any], count: int) -> list[Any]:
        label = self._label(f"{self.base_url}/embeddings")
        data = payload.get("data")
        if not isinstance(data, list) or len(data) != count:
            got = len(data) if isinstance(data, list) else "no list"
            raise malformed(label, f"expected 'data' with {count} embeddings, got {got}")
        by_index: dict[int, Any] = {}
        for entry in data:
            index = entry.get("index") if isinstance(entry, Mapping) else None
            if not isinstance(index, int) or not 0 <= index < count or index in by_index:
                raise malformed(label, f"an embedding has a missing or bad index ({index!r})")
            by_index[index] = entry.get("embedding")
        return [by_index[n] for n in range(count)]


EMBEDDER = OpenAIEmbedder
