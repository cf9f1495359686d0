"""Gemini's embeddings wire format: ``models/{model}:embedContent`` for one text,
``models/{model}:batchEmbedContents`` for several; the key in ``x-goog-api-key``, as
the Gemini chat adapter sends it (never in the URL).

One text: ``{"content": {"parts": [{"text"}]}, "taskType", "outputDimensionality"?}``
-> ``{"embedding": {"values": [...]}}``. Several: ``{"requests": [{"model":
"models/{model}", "content", "taskType", "outputDimensionality"?}, ...]}`` ->
``{"embeddings": [{"values": [...]}, ...]}``, in request order. Each request's
``model`` must be the URL's; a batch holds at most 100 requests. ``taskType`` is
``RETRIEVAL_DOCUMENT`` for what is stored and ``RETRIEVAL_QUERY`` for a search.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar
from urllib.parse import quote

from cantrip.llm._embed_contract import EmbeddingTask
from cantrip.llm.providers._embed_http import HTTPEmbedder, malformed

MAX_BATCH = 100
"""Gemini's limit on the requests of one ``batchEmbedContents``."""
TASK_TYPES: dict[str, str] = {"document": "RETRIEVAL_DOCUMENT", "query": "RETRIEVAL_QUERY"}


class GeminiEmbedder(HTTPEmbedder):
    max_batch: ClassVar[int] = MAX_BATCH

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        return {"x-goog-api-key": api_key} if api_key else {}

    def _request(self, text: str, task: EmbeddingTask) -> dict[str, Any]:
        request: dict[str, Any] = {
            "content": {"parts": [{"text": text}]},
            "taskType": TASK_TYPES[task],
        }
        if self.dimensions is not None:
            request["outputDimensionality"] = self.dimensions
        return request

    def _url(self, method: str) -> str:
        return f"{self.base_url}/models/{quote(self.model, safe='')}:{method}"

    def build(self, texts: Sequence[str], task: EmbeddingTask) -> tuple[str, dict[str, Any]]:
        if len(texts) == 1:
            return self._url("embedContent"), self._request(texts[0], task)
        name = f"models/{self.model}"
        requests = [{"model": name, **self._request(text, task)} for text in texts]
        return self._url("batchEmbedContents"), {"requests": requests}

    def vectors(self, payload: Mapping[str, Any], count: int) -> list[Any]:
        if count == 1:
            label = self._label(self._url("embedContent"))
            embedding = payload.get("embedding")
            if not isinstance(embedding, Mapping):
                raise malformed(label, "expected an 'embedding' object")
            return [embedding.get("values")]
        label = self._label(self._url("batchEmbedContents"))
        embeddings = payload.get("embeddings")
        if not isinstance(embeddings, list) or len(embeddings) != count:
            got = len(embeddings) if isinstance(embeddings, list) else "no list"
            raise malformed(label, f"expected 'embeddings' with {count} entries, got {got}")
        return [e.get("values") if isinstance(e, Mapping) else None for e in embeddings]


EMBEDDER = GeminiEmbedder
