"""An embedder named the way an LLM is: a provider's config, a model, the key's variable.

:func:`embedder_from_config` is what a spec's ``[memory]`` table (or code) calls: it reads
the provider's TOML (:func:`~cantrip.llm._config.load_provider_config`), takes the key
from the environment variable it names (never from a file), and picks the wire format
from the provider's ``api_format``: Gemini's for ``gemini-generate-content``, OpenAI's
``/embeddings`` for the OpenAI-compatible ones (OpenAI and the local
servers: Ollama, vLLM, llama.cpp, LM Studio). Anthropic has no embeddings endpoint and
is refused by name. Everything is checked here, before any request.
"""

from __future__ import annotations

import re

import httpx

from cantrip._errors import ConstructionError
from cantrip.llm._config import load_provider_config, resolve_api_key
from cantrip.llm._embed_contract import Embedder
from cantrip.llm._retry import RetryPolicy
from cantrip.llm.providers._embed_http import HTTPEmbedder
from cantrip.llm.providers.embed_gemini import GeminiEmbedder
from cantrip.llm.providers.embed_openai import OpenAIEmbedder

_FORMATS: dict[str, type[HTTPEmbedder]] = {
    "openai-chat": OpenAIEmbedder,
    "openai-responses": OpenAIEmbedder,
    "gemini-generate-content": GeminiEmbedder,
}


def embedder_from_config(
    provider: str,
    model: str | None = None,
    *,
    dimensions: int | None = None,
    base_url: str | None = None,
    api_key_env: str | None = None,
    batch_size: int | None = None,
    timeout_s: float | None = None,
    retry: RetryPolicy | None = None,
    client: httpx.Client | None = None,
) -> Embedder:
    """The embedder of ``provider``'s config (``model`` defaults to its
    ``default_embedding_model``); ``dimensions`` asks for shorter vectors where the
    model can give them (OpenAI ``dimensions``, Gemini ``outputDimensionality``)."""
    config = load_provider_config(provider)
    settings = config.provider
    kind = _FORMATS.get(settings.api_format)
    if kind is None:
        raise ConstructionError(
            f"provider {provider!r} ({settings.api_format}) has no embeddings endpoint: "
            "name an OpenAI-compatible provider (openai, ollama, vllm, llamacpp, ...) or gemini"
        )
    model = model or settings.default_embedding_model
    if not model:
        raise ConstructionError(
            f"provider {provider!r} has no default embedding model: name one (model=)"
        )
    url = base_url or settings.base_url
    if not url or not re.match(r"^https?://[^\s/]+", url):
        raise ConstructionError(f"provider {provider!r}: base_url {url!r} is not an http(s) URL")
    limit = settings.rate_limit
    return kind(
        provider=provider,
        model=model,
        base_url=url,
        api_key=resolve_api_key(config, api_key_env),
        dimensions=dimensions,
        batch_size=batch_size,
        timeout_s=timeout_s or min(settings.timeout_s, 120.0),
        headers=settings.headers,
        retry=retry,
        requests_per_minute=limit.requests_per_minute if limit is not None else None,
        # the bucket the provider's chat adapter draws on (HTTPAdapter.rate_limit_key)
        rate_limit_key=f"{provider}:{settings.api_key_env or url.rstrip('/')}",
        client=client,
    )
