"""Embedders in the provider layer (issue 42.2): OpenAI's ``/v1/embeddings`` and Gemini's
``embedContent`` / ``batchEmbedContents``, each against a loopback fake that speaks the
wire format and refuses what the real service refuses (:mod:`fake_embeddings`).

The embedders are synchronous (the memory store calls them from its worker thread), so
each call here runs in ``trio.to_thread`` while the fake serves on the trio loop."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from fake_embeddings import NATIVE, FakeGeminiEmbeddings, FakeOpenAIEmbeddings, meaning
from fake_providers import Fault, Malformed, Raw, isolate, serve

from cantrip import ConstructionError, ProviderError
from cantrip.llm import (
    GeminiEmbedder,
    OpenAIEmbedder,
    RetryPolicy,
    embedder_from_config,
)

KEY = "sk-embed-secret-0123456789"
FAST = RetryPolicy(max_retries=2, base_delay=0.01, max_delay=0.02, jitter=0.0)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    isolate(monkeypatch, tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("GEMINI_API_KEY", KEY)


@asynccontextmanager
async def openai(script: list[Any] | None = None, **options: Any) -> AsyncIterator[Any]:
    fake = FakeOpenAIEmbeddings(script or [], key=KEY)
    async with serve(fake, "/v1") as url:
        options.setdefault("retry", FAST)
        embedder = embedder_from_config("openai", base_url=url, **options)
        try:
            yield fake, embedder
        finally:
            embedder.close()  # type: ignore[attr-defined]


@asynccontextmanager
async def gemini(script: list[Any] | None = None, **options: Any) -> AsyncIterator[Any]:
    fake = FakeGeminiEmbeddings(script or [], key=KEY)
    async with serve(fake, "/v1beta") as url:
        options.setdefault("retry", FAST)
        embedder = embedder_from_config("gemini", base_url=url, **options)
        try:
            yield fake, embedder
        finally:
            embedder.close()  # type: ignore[attr-defined]


async def run(call: Callable[..., Any], *args: Any) -> Any:
    return await trio.to_thread.run_sync(call, *args)


def close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) < 1e-9 for x, y in zip(a, b, strict=True))


# -- OpenAI -----------------------------------------------------------------------------------


async def test_openai_sends_the_documented_request_and_reads_the_vectors_in_order() -> None:
    async with openai(dimensions=16) as (fake, embedder):
        texts = ["Alice drives an automobile", "Bob plays the violin"]
        vectors = await run(embedder.embed, texts)
    [request] = fake.requests
    assert request.path == "/v1/embeddings"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.json() == {
        "model": "text-embedding-3-small",
        "input": texts,
        "encoding_format": "float",
        "dimensions": 16,
    }
    assert all(close(v, meaning(t, 16)) for v, t in zip(vectors, texts, strict=True))
    assert embedder.model_id == "openai:text-embedding-3-small@16"


async def test_openai_splits_more_than_2048_inputs_into_requests_it_accepts() -> None:
    """The fake refuses an input array over 2,048 (OpenAI's limit) with its 400."""
    texts = [f"note number {n}" for n in range(2100)]
    async with openai(batch_size=2048) as (fake, embedder):
        vectors = await run(embedder.embed, texts)
    assert [len(r.json()["input"]) for r in fake.requests] == [2048, 52]
    async with openai() as (fake, embedder):  # by default, 256 a request
        assert len(await run(embedder.embed, texts[:600])) == 600
    assert [len(r.json()["input"]) for r in fake.requests] == [256, 256, 88]
    assert len(vectors) == 2100 and close(vectors[2099], meaning(texts[2099]))


async def test_openai_reads_base64_vectors_too() -> None:
    """A server that answers in base64 (float32, little-endian) is read the same."""
    fake = FakeOpenAIEmbeddings([], key=KEY)
    original = fake.answer

    def prefers_base64(request: Any, body: Any) -> Any:
        return original(request, {**body, "encoding_format": "base64"})

    fake.answer = prefers_base64  # type: ignore[method-assign]
    async with serve(fake, "/v1") as url:
        embedder = OpenAIEmbedder(provider="local", model="m", base_url=url, api_key=KEY)
        [vector] = await run(embedder.embed, ["a kitten"])
        embedder.close()
    assert fake.requests[0].json()["encoding_format"] == "float"  # asked; base64 came back
    assert all(abs(x - y) < 1e-6 for x, y in zip(vector, meaning("a kitten"), strict=True))


async def test_openai_refusal_names_the_endpoint_not_the_key() -> None:
    """A 400 (dimensions for a model that cannot shorten) is final, named, keyless."""
    fake = FakeOpenAIEmbeddings([], key=KEY)
    async with serve(fake, "/v1") as url:
        embedder = embedder_from_config(
            "openai", "text-embedding-ada-002", dimensions=8, base_url=url, retry=FAST
        )
        with pytest.raises(ProviderError) as caught:
            await run(embedder.embed, ["x"])
        embedder.close()  # type: ignore[attr-defined]
    text = str(caught.value)
    assert caught.value.status == 400 and len(fake.requests) == 1
    assert f"POST {url}/embeddings" in text and "does not support specifying dimensions" in text
    assert KEY not in text and KEY not in repr(getattr(caught.value, "__notes__", ""))


async def test_a_wrong_key_is_a_401_not_retried() -> None:
    fake = FakeOpenAIEmbeddings([], key="another")
    async with serve(fake, "/v1") as url:
        embedder = embedder_from_config("openai", base_url=url, retry=FAST)
        with pytest.raises(ProviderError) as caught:
            await run(embedder.embed, ["x"])
        embedder.close()  # type: ignore[attr-defined]
    assert caught.value.status == 401 and len(fake.requests) == 1
    assert KEY not in str(caught.value)


async def test_transient_failures_are_retried_by_the_adapters_policy() -> None:
    """A 429 (with Retry-After), a 503 and a body that is not JSON are transient: the
    fourth attempt answers; the same policy object judges them as for chat."""
    script = [
        Fault(429, "slow down", headers={"retry-after": "0"}),
        Fault(503, "overloaded"),
        Malformed(b"{not json"),
    ]
    policy = RetryPolicy(max_retries=3, base_delay=0.01, max_delay=0.02, jitter=0.0)
    async with openai(script, retry=policy) as (fake, embedder):
        [vector] = await run(embedder.embed, ["a puppy"])
    assert len(fake.requests) == 4 and close(vector, meaning("a puppy"))


async def test_retries_give_up_after_the_policy_and_say_how_many() -> None:
    async with openai([Fault(503, "down")] * 3) as (fake, embedder):
        with pytest.raises(ProviderError) as caught:
            await run(embedder.embed, ["x"])
    assert len(fake.requests) == 3 and "after 3 attempts" in caught.value.__notes__[0]


async def test_an_answer_with_the_wrong_count_or_shape_is_refused_by_name() -> None:
    wrong = b'{"object":"list","data":[{"index":0,"embedding":[1.0,"x"]}],"usage":{}}'
    async with openai([Raw(200, wrong, {"content-type": "application/json"})]) as (_, embedder):
        with pytest.raises(ProviderError, match="vector 0 is not a list of finite numbers"):
            await run(embedder.embed, ["x"])
    two = b'{"object":"list","data":[{"index":0,"embedding":[1.0]}],"usage":{}}'
    async with openai([Raw(200, two, {"content-type": "application/json"})]) as (_, embedder):
        with pytest.raises(ProviderError, match="expected 'data' with 2 embeddings, got 1"):
            await run(embedder.embed, ["x", "y"])


async def test_vectors_of_another_length_than_asked_are_refused() -> None:
    """A server that ignores ``dimensions`` would fill the index with vectors that do
    not compare; the embedder refuses them."""
    fake = FakeOpenAIEmbeddings([], key=KEY)
    async with serve(fake, "/v1") as url:
        embedder = OpenAIEmbedder(
            provider="local", model="m", base_url=url, api_key=KEY, dimensions=NATIVE // 2
        )
        original = fake.answer
        fake.answer = lambda request, body: original(  # type: ignore[method-assign]
            request, {k: v for k, v in body.items() if k != "dimensions"}
        )
        with pytest.raises(ProviderError, match=f"has {NATIVE} dimensions, expected 32"):
            await run(embedder.embed, ["x"])
        embedder.close()


async def test_an_unreachable_server_is_named() -> None:
    embedder = OpenAIEmbedder(
        provider="local", model="m", base_url="http://127.0.0.1:9/v1", retry=FAST
    )
    with pytest.raises(ProviderError, match=r"cannot connect to http://127.0.0.1:9/v1"):
        await run(embedder.embed, ["x"])
    embedder.close()


def test_texts_to_embed_are_checked_before_any_request() -> None:
    embedder = OpenAIEmbedder(provider="local", model="m", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(ValueError, match="list of texts"):
        embedder.embed("one text")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty string"):
        embedder.embed(["ok", "  "])
    with pytest.raises(ConstructionError, match="batch_size is 1 to 2048"):
        OpenAIEmbedder(provider="p", model="m", base_url="http://x", batch_size=5000)
    with pytest.raises(ConstructionError, match="batch_size is 1 to 100"):
        GeminiEmbedder(provider="p", model="m", base_url="http://x", batch_size=101)
    embedder.close()


# -- Gemini -----------------------------------------------------------------------------------


async def test_gemini_embeds_one_text_with_embed_content_and_the_task_type() -> None:
    async with gemini(dimensions=24) as (fake, embedder):
        [document] = await run(embedder.embed, ["my physician"])
        [query] = await run(embedder.embed, ["doctor"], "query")
    first, second = fake.requests
    assert first.path == "/v1beta/models/gemini-embedding-001:embedContent"
    assert first.headers["x-goog-api-key"] == KEY and "authorization" not in first.headers
    assert KEY not in first.path
    assert first.json() == {
        "content": {"parts": [{"text": "my physician"}]},
        "taskType": "RETRIEVAL_DOCUMENT",
        "outputDimensionality": 24,
    }
    assert second.json()["taskType"] == "RETRIEVAL_QUERY"
    assert close(document, meaning("my physician", 24)) and close(query, meaning("doctor", 24))


async def test_gemini_batches_at_most_100_requests_each_naming_the_model() -> None:
    texts = [f"fact {n}" for n in range(250)]
    async with gemini() as (fake, embedder):
        vectors = await run(embedder.embed, texts)
    assert [r.path.rsplit(":", 1)[1] for r in fake.requests] == ["batchEmbedContents"] * 3
    assert [len(r.json()["requests"]) for r in fake.requests] == [100, 100, 50]
    entry = fake.requests[0].json()["requests"][0]
    assert entry == {
        "model": "models/gemini-embedding-001",
        "content": {"parts": [{"text": "fact 0"}]},
        "taskType": "RETRIEVAL_DOCUMENT",
    }
    assert all(close(v, meaning(t)) for v, t in zip(vectors, texts, strict=True))


async def test_gemini_errors_are_classified_like_the_chat_adapters() -> None:
    """A 429 is retried; a 400 (more dimensions than the model has) is final, names the
    endpoint, and the key (sent in a header) is nowhere in it."""
    async with gemini([Fault(429, "quota")]) as (fake, embedder):
        [vector] = await run(embedder.embed, ["a kitten"])
    assert len(fake.requests) == 2 and close(vector, meaning("a kitten"))
    async with gemini(dimensions=NATIVE + 1) as (fake, embedder):
        with pytest.raises(ProviderError) as caught:
            await run(embedder.embed, ["x", "y"], "query")
    text = str(caught.value)
    assert caught.value.status == 400 and len(fake.requests) == 1
    assert ":batchEmbedContents" in text and "output_dimensionality" in text
    assert KEY not in text


# -- the config -------------------------------------------------------------------------------


def test_embedder_from_config_picks_the_wire_format_and_checks_early(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert isinstance(embedder_from_config("openai"), OpenAIEmbedder)
    assert isinstance(embedder_from_config("gemini"), GeminiEmbedder)
    local = embedder_from_config("ollama", "nomic-embed-text")
    assert isinstance(local, OpenAIEmbedder) and local.model_id == "ollama:nomic-embed-text"
    assert local.base_url == "http://127.0.0.1:11434/v1"
    with pytest.raises(ConstructionError, match="no embeddings endpoint"):
        embedder_from_config("anthropic", "any")
    with pytest.raises(ConstructionError, match="no default embedding model"):
        embedder_from_config("ollama")
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(ConstructionError, match="OPENAI_API_KEY"):
        embedder_from_config("openai")


async def test_a_loopback_server_is_not_reached_through_a_proxy_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As the chat adapters: a local embeddings server (Ollama, llama.cpp) is asked
    directly even when the environment names a proxy (that proxy answers nothing)."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    async with openai() as (fake, embedder):
        [vector] = await run(embedder.embed, ["a puppy"])
    assert len(fake.requests) == 1 and close(vector, meaning("a puppy"))
