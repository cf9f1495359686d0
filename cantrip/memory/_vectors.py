"""Semantic search's parts that both stores share: the search modes, the vectors as
stored, and the fusion of two rankings.

An item's vector is its searchable text (:func:`~cantrip.memory._model.searchable_text`,
what full-text search indexes too) embedded as a ``document``; a query's is the query
embedded as a ``query``. Vectors are stored scaled to length 1, so that cosine
similarity is their dot product -- the one number both databases, with or without
their vector extensions, compute the same way. Beside each vector is the SHA-256 of
the text it embeds: a put that leaves the text as it was (new metadata, the same
words) keeps the vector instead of asking the endpoint again.

Hybrid search merges the text ranking and the semantic ranking by reciprocal rank
fusion (Cormack, Clarke and Buettcher, SIGIR 2009): an item's score is the sum over
the rankings it appears in of ``1 / (RRF_K + rank)``, ranks from 1. Ranks, not
scores, are fused: bm25, ``ts_rank`` and cosine are on scales that do not compare.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from cantrip._redact import scrub_known, secret_values
from cantrip.llm._embed_contract import Embedder
from cantrip.memory._model import MAX_LIMIT, MemoryStoreError, SearchItem

SearchMode = Literal["text", "semantic", "hybrid"]
MODES: tuple[str, ...] = ("text", "semantic", "hybrid")
RRF_K = 60
"""The fusion constant: the usual 60, which damps the weight of the very top ranks."""
FUSION_DEPTH = 100
"""How deep each ranking is read before fusing (at least ``offset + limit``): an item
outside the top 100 of both rankings cannot reach a fused page's top."""


@dataclass(frozen=True, slots=True)
class Plan:
    """What a put does to its item's vector, decided before the write's transaction (an
    embedding is a request to a server: no lock is held while it runs)."""

    sha: str
    """The hash of the item's text (:func:`text_hash`)."""
    vector: list[float] | None
    """The new unit vector; None with ``keep``, or to drop the item's vector (no
    embedder, or a text with nothing to embed)."""
    keep: bool = False
    """The stored vector is already this text's: keep it, if it still is at the write."""


class Stale(Exception):
    """The text changed between the plan and the write: plan again, embedding."""


def resolve_mode(mode: str | None, embedder: Embedder | None) -> SearchMode:
    """The mode a search runs in: the one asked for, or hybrid when the store has an
    embedder and text when it has none. Semantic search without an embedder is refused
    (it would silently answer with nothing)."""
    if mode is None:
        return "hybrid" if embedder is not None else "text"
    if mode not in MODES:
        raise MemoryStoreError(f"a search mode is one of {', '.join(MODES)}; got {mode!r}"[:200])
    if mode != "text" and embedder is None:
        raise MemoryStoreError(
            f"a {mode} search needs an embedder: open the store with embedder= "
            "(see cantrip.llm.embedder_from_config)"
        )
    return mode  # type: ignore[return-value]  # checked against MODES just above


def fusion_depth(limit: int, offset: int) -> int:
    return min(MAX_LIMIT, max(FUSION_DEPTH, offset + limit))


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def unit(vector: Sequence[float]) -> list[float] | None:
    """``vector`` scaled to length 1; None for a zero vector, which has no direction to
    compare (an item with one is stored without a vector, a query with one finds
    nothing by meaning) -- refusing the put would lose the item over a search aid."""
    norm = math.sqrt(math.fsum(x * x for x in vector))
    if norm == 0.0 or not math.isfinite(norm):
        return None
    return [x / norm for x in vector]


def pack(vector: Sequence[float]) -> bytes:
    """A vector as float32, little-endian: sqlite-vec's own BLOB format."""
    return struct.pack(f"<{len(vector)}f", *vector)


def embed_one(
    embedder: Embedder, text: str, task: Literal["document", "query"]
) -> list[float] | None:
    """One text's unit vector (None: see :func:`unit`)."""
    vectors = embedder.embed([text], task)
    if len(vectors) != 1:
        raise MemoryStoreError(
            f"the embedder {embedder.model_id} returned {len(vectors)} vectors for one text"
        )
    return unit(vectors[0])


def embed_query(embedder: Embedder, query: str) -> list[float] | None:
    """A query's unit vector (None: nothing to embed, or no direction). The query loses
    the environment's secret values first, as an item's text did at put: what is
    embedded is sent to a provider."""
    if not query.strip():
        return None
    return embed_one(embedder, scrub_known(query, secret_values()), "query")


def embed_many(embedder: Embedder, texts: Sequence[str]) -> list[list[float] | None]:
    """Stored texts' unit vectors, one per text (a re-index's batch)."""
    vectors = embedder.embed(texts, "document")
    if len(vectors) != len(texts):
        raise MemoryStoreError(
            f"the embedder {embedder.model_id} returned {len(vectors)} vectors "
            f"for {len(texts)} texts"
        )
    return [unit(vector) for vector in vectors]


def check_dimensions(model_id: str, got: int, held: int | None) -> None:
    """A vector of ``got`` dimensions may join an index holding ``held`` (None: empty)."""
    if held is not None and got != held:
        raise MemoryStoreError(
            f"the embedder {model_id} returned {got} dimensions; the memory's vectors have "
            f"{held}: the model changed under the same name -- reindex (reindex=True)"
        )


def model_changed(held: str, model_id: str) -> MemoryStoreError:
    return MemoryStoreError(
        f"the memory's vectors were made by {held}, not by the embedder given ({model_id}); "
        "they do not compare: open the store with reindex=True to embed every item again "
        "with this one, or give the embedder that made them"
    )


def fuse(rankings: Sequence[Sequence[SearchItem]], limit: int, offset: int) -> list[SearchItem]:
    """Reciprocal rank fusion of ``rankings`` (each best first), one page of it. Ties:
    newest first, then namespace and key (the order of every other search)."""
    scores: dict[tuple[tuple[str, ...], str], float] = {}
    found: dict[tuple[tuple[str, ...], str], SearchItem] = {}
    for ranking in rankings:
        for rank, hit in enumerate(ranking, start=1):
            ident = (hit.item.namespace, hit.item.key)
            scores[ident] = scores.get(ident, 0.0) + 1.0 / (RRF_K + rank)
            found.setdefault(ident, hit)
    order = sorted(
        scores,
        key=lambda ident: (-scores[ident], -found[ident].item.updated_at.timestamp(), ident),
    )
    return [SearchItem(found[i].item, scores[i]) for i in order[offset : offset + limit]]


Ranking = Callable[[int, int], list[SearchItem]]
"""One store's ranking by one mode, a page of it: ``(limit, offset) -> items``."""


def ranked(
    mode: SearchMode, text: Ranking, semantic: Ranking, limit: int, offset: int
) -> list[SearchItem]:
    """One page of a search in ``mode``: the text or the semantic ranking, or (hybrid)
    both read :func:`fusion_depth` deep and fused. Written once for both stores."""
    if mode == "text":
        return text(limit, offset)
    if mode == "semantic":
        return semantic(limit, offset)
    depth = fusion_depth(limit, offset)
    return fuse([text(depth, 0), semantic(depth, 0)], limit, offset)
