"""One real embeddings server, not ours: llama.cpp's ``llama-server --embeddings`` (opt-in).

Runs only with ``CANTRIP_REAL_EMBEDDINGS=1``, with what ``bench/real_llm_setup.sh``
installs for ``tests/test_real_llm.py`` (``llama-server`` and SmolLM2-135M as GGUF; or
``CANTRIP_LLAMA_SERVER`` / ``CANTRIP_LLAMA_MODEL``); with the variable set and either
missing, the test fails and says what to install. The test starts the server itself
(127.0.0.1, a free port, ``--embeddings --pooling mean``), embeds through
:class:`~cantrip.llm.OpenAIEmbedder` (``POST /v1/embeddings``, as for any
OpenAI-compatible local server), and runs a memory store's semantic and hybrid search
on its vectors. A 135M chat model is a poor embedder, so the assertions are about
cantrip: the wire is read, the vectors have one length, and every item is ranked."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from test_real_llm import free_port, model_file, server_binary

from cantrip.llm import OpenAIEmbedder
from cantrip.memory import AsyncMemory, SQLiteMemory

pytestmark = pytest.mark.skipif(
    os.environ.get("CANTRIP_REAL_EMBEDDINGS") != "1",
    reason="opt-in: set CANTRIP_REAL_EMBEDDINGS=1 after bench/real_llm_setup.sh",
)


@asynccontextmanager
async def embedding_server() -> AsyncIterator[str]:
    import httpx

    port = free_port()
    command = [
        str(server_binary()),
        "--model",
        str(model_file()),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--embeddings",
        "--pooling",
        "mean",
        "--threads",
        "2",
    ]
    log = (Path(os.environ.get("TMPDIR", "/tmp")) / f"llama-embed-{port}.log").open("ab")
    async with trio.open_nursery() as nursery:
        process = await nursery.start(
            lambda task_status: trio.run_process(
                command, stdout=log, stderr=log, check=False, task_status=task_status
            )
        )
        with trio.fail_after(120):
            async with httpx.AsyncClient(trust_env=False) as client:
                while True:
                    try:
                        if (await client.get(f"http://127.0.0.1:{port}/health")).is_success:
                            break
                    except httpx.TransportError:
                        pass
                    await trio.sleep(0.2)
        try:
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            process.terminate()
            await process.wait()
            nursery.cancel_scope.cancel()


async def test_a_real_local_server_embeds_and_memory_searches_by_meaning(tmp_path: Path) -> None:
    async with embedding_server() as url:
        embedder = OpenAIEmbedder(provider="llamacpp", model="smollm2", base_url=url)
        vectors = await trio.to_thread.run_sync(embedder.embed, ["one text", "another text"])
        assert len(vectors) == 2 and len(vectors[0]) == len(vectors[1]) > 0
        memory = AsyncMemory(SQLiteMemory(tmp_path / "loom.db", embedder=embedder))
        facts = ["Alice drives a car to work", "Bob plays the violin", "Tea at five"]
        for n, fact in enumerate(facts):
            await memory.put(("user",), f"k{n}", fact)
        semantic = await memory.search(query="automobile", mode="semantic", limit=3)
        hybrid = await memory.search(query="violin", limit=3)
        embedder.close()
    assert sorted(hit.item.key for hit in semantic) == ["k0", "k1", "k2"]
    assert all(hit.score is not None and -1.0 <= hit.score <= 1.0 for hit in semantic)
    assert hybrid[0].item.key == "k1"  # the text ranking alone puts it first
