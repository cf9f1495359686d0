"""What an embedder is: texts in, one vector each out.

Apart from the adapters because the memory store (a higher room) takes any object
with this shape -- a provider's, a local model's, a test's deterministic one -- and
never imports httpx or a provider module to do it.

An embedder is synchronous on purpose: the memory stores are (like the loom's), and
:class:`~cantrip.memory.AsyncMemory` runs each store call -- the embedding at a put
and the query's embedding at a search among them -- in a worker thread, so the trio
loop never waits on the embeddings endpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

EmbeddingTask = Literal["document", "query"]
"""What a text is embedded for: a stored item (``document``) or a search (``query``).
Gemini embeds the two differently (``RETRIEVAL_DOCUMENT`` / ``RETRIEVAL_QUERY``);
OpenAI's endpoint has one kind and ignores it."""


class Embedder(Protocol):
    """Texts to vectors, each the same length, in the order given."""

    @property
    def model_id(self) -> str:
        """What the vectors are (provider, model, dimensions asked for): stored beside
        them, so a store notices when it is opened with an embedder whose vectors
        would not be comparable to the ones it holds."""
        ...

    def embed(self, texts: Sequence[str], task: EmbeddingTask = "document") -> list[list[float]]:
        """One vector per text, in order; batches of any size are split as the
        endpoint requires. Blocking: call it from a worker thread."""
        ...
