"""Search that finds (issue 42.2): semantic and hybrid search in the memory store, on
SQLite and on a real PostgreSQL (the ``pg_url`` fixture), with a deterministic embedder
(:func:`fake_embeddings.meaning`: synonyms share a vector) and, end to end, through the
loopback fakes of each embeddings wire format."""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
from fake_embeddings import FakeGeminiEmbeddings, FakeOpenAIEmbeddings, meaning
from fake_providers import isolate, serve

from cantrip.llm import embedder_from_config
from cantrip.memory import (
    AsyncMemory,
    MemoryBackend,
    MemoryStoreError,
    PostgresMemory,
    SQLiteMemory,
    memory_for,
)
from cantrip.memory._sqlite_vectors import cosine_distance
from cantrip.memory._vectors import RRF_K, fuse, pack

KINDS = ("sqlite", "postgres")


class Meaning:
    """An embedder in process: :func:`meaning`, counting the texts it embeds."""

    def __init__(self, model_id: str = "fake:meaning", dimensions: int = 64) -> None:
        self.model_id = model_id
        self.dimensions = dimensions
        self.embedded: list[tuple[str, str]] = []

    def embed(self, texts: Sequence[str], task: str = "document") -> list[list[float]]:
        self.embedded.extend((task, text) for text in texts)
        return [meaning(text, self.dimensions) for text in texts]


class Where:
    """One database of one kind; opens stores on it (with an embedder or not)."""

    def __init__(self, kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
        self.kind = kind
        self.path = tmp_path / "loom.db"
        self.url = request.getfixturevalue("pg_url") if kind == "postgres" else ""
        self._opened: list[MemoryBackend] = []

    def open(self, embedder: Any = None, reindex: bool = False) -> MemoryBackend:
        store: MemoryBackend
        if self.kind == "sqlite":
            store = SQLiteMemory(self.path, embedder=embedder, reindex=reindex)
        else:
            store = PostgresMemory.open(self.url, embedder=embedder, reindex=reindex)
        self._opened.append(store)
        return store

    def sql(self, statement: str) -> list[tuple[Any, ...]]:
        if self.kind == "sqlite":
            with sqlite3.connect(self.path) as db:
                return db.execute(statement).fetchall()
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            cursor = conn.execute(statement.replace("memory_", "cantrip_memory_"))
            return cursor.fetchall() if cursor.description is not None else []

    def close(self) -> None:
        for store in self._opened:
            store.close()


@pytest.fixture(params=KINDS)
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Where]:
    found = Where(request.param, tmp_path, request)
    yield found
    found.close()


def keys(hits: Sequence[Any]) -> list[str]:
    return [hit.item.key for hit in hits]


FACTS = {
    "car": "Alice drives an automobile to work",
    "violin": "Bob plays the violin every evening",
    "doctor": "Carol visits her physician on Mondays",
    "cat": "Dan adopted a kitten last spring",
}


def fill(store: MemoryBackend, ns: tuple[str, ...] = ("user", "u1")) -> None:
    for key, text in FACTS.items():
        store.put(ns, key, {"text": text})


# -- semantic search finds what the words miss ------------------------------------------------


def test_semantic_search_finds_a_paraphrase_the_text_search_misses(where: Where) -> None:
    store = where.open(Meaning())
    fill(store)
    assert store.search(("user",), query="car", mode="text") == []
    hits = store.search(("user",), query="car", mode="semantic", limit=2)
    assert keys(hits)[0] == "car"
    assert hits[0].score is not None and hits[0].score > 0.7 > (hits[1].score or 0.0)
    assert keys(store.search(query="a doctor", mode="semantic", limit=1)) == ["doctor"]
    # hybrid (the default with an embedder) finds it too
    assert keys(store.search(("user",), query="car", limit=1)) == ["car"]


def test_the_score_is_the_cosine_similarity(where: Where) -> None:
    store = where.open(Meaning())
    fill(store)
    hits = store.search(query="feline", mode="semantic", limit=4)
    expected = {
        key: sum(a * b for a, b in zip(meaning(text), meaning("feline"), strict=True))
        for key, text in FACTS.items()
    }
    assert {hit.item.key: round(hit.score or 0.0, 5) for hit in hits} == {
        key: round(value, 5) for key, value in expected.items()
    }
    scores = [hit.score for hit in hits]
    assert scores == sorted(scores, reverse=True)  # type: ignore[type-var]


def test_semantic_search_keeps_the_namespace_filter_limit_and_offset(where: Where) -> None:
    store = where.open(Meaning())
    fill(store, ("user", "u1"))
    fill(store, ("user", "u2"))
    store.put(("users", "x"), "car", {"text": "a car"})
    hits = store.search(("user", "u2"), query="automobile", mode="semantic", limit=10)
    assert {hit.item.namespace for hit in hits} == {("user", "u2")} and len(hits) == 4
    every = store.search(("user",), query="automobile", mode="semantic", limit=8)
    assert {hit.item.namespace for hit in every} == {("user", "u1"), ("user", "u2")}
    paged = [
        store.search(("user",), query="automobile", mode="semantic", limit=3),
        store.search(("user",), query="automobile", mode="semantic", limit=5, offset=3),
    ]
    assert [h.item for page in paged for h in page] == [h.item for h in every]


# -- hybrid: reciprocal rank fusion -----------------------------------------------------------


def test_fuse_is_reciprocal_rank_fusion_by_hand(where: Where) -> None:
    """Text ranks [A, B], semantic ranks [B, C, A]: B = 1/61 + 1/62 beats
    A = 1/61 + 1/63 beats C = 1/62."""
    store = where.open()
    a, b, c = (store.put(("n",), k, k) for k in "ABC")
    hit = {item.key: type("H", (), {"item": item})() for item in (a, b, c)}
    fused = fuse([[hit["A"], hit["B"]], [hit["B"], hit["C"], hit["A"]]], limit=3, offset=0)
    assert keys(fused) == ["B", "A", "C"]
    assert [h.score for h in fused] == [1 / 61 + 1 / 62, 1 / 61 + 1 / 63, 1 / 62]
    assert keys(fuse([[hit["A"], hit["B"]], [hit["B"], hit["C"], hit["A"]]], 1, 1)) == ["A"]


VOCABULARY = [*FACTS.values(), "car wash", "violin lessons", "physician notes", "kitten food"]


def test_hybrid_search_is_the_rrf_of_the_two_rankings_on_generated_items(where: Where) -> None:
    """Generated notes; the hybrid page equals RRF (k=60) computed here from the text and
    the semantic rankings the store gives for the same query."""
    rng = random.Random(42)
    store = where.open(Meaning())
    words = " ".join(VOCABULARY).split()
    for n in range(60):
        store.put(("g",), f"k{n:02d}", {"text": " ".join(rng.choices(words, k=5))})
    for query in ("automobile", "violin", "physician", "food", "kitten"):
        text = store.search(("g",), query=query, mode="text", limit=100)
        semantic = store.search(("g",), query=query, mode="semantic", limit=100)
        score: dict[str, float] = {}
        for ranking in (text, semantic):
            for rank, hit in enumerate(ranking, start=1):
                score[hit.item.key] = score.get(hit.item.key, 0.0) + 1 / (RRF_K + rank)
        by_key = {hit.item.key: hit.item for hit in [*text, *semantic]}
        expected = sorted(score, key=lambda k: (-score[k], -by_key[k].updated_at.timestamp(), k))[
            :10
        ]
        hybrid = store.search(("g",), query=query, mode="hybrid", limit=10)
        assert keys(hybrid) == expected, query
        assert [h.score for h in hybrid] == pytest.approx([score[k] for k in expected])
        assert text and semantic  # both rankings took part
        assert keys(text) != keys(semantic)[: len(text)]  # and they differ


# -- embedded at put, again when the text changes ---------------------------------------------


def test_a_put_embeds_its_text_once_and_again_only_when_it_changes(where: Where) -> None:
    embedder = Meaning()
    store = where.open(embedder)
    store.put(("n",), "k", {"text": "a kitten"}, {"seen": 1})
    store.put(("n",), "k", {"text": "a kitten"}, {"seen": 2})  # metadata only: same vector
    assert embedder.embedded == [("document", "a kitten")]
    store.put(("n",), "k", {"text": "a physician"})
    assert embedder.embedded[-1] == ("document", "a physician")
    hits = store.search(query="doctor", mode="semantic")
    assert keys(hits) == ["k"] and hits[0].score == pytest.approx(1.0)
    assert store.search(query="cat", mode="semantic")[0].score == pytest.approx(
        sum(a * b for a, b in zip(meaning("physician"), meaning("cat"), strict=True))
    )
    store.put(("n",), "k", 42)  # nothing to embed: the old vector goes
    assert store.search(query="doctor", mode="semantic") == []


def test_delete_takes_the_vector_with_the_item(where: Where) -> None:
    store = where.open(Meaning())
    fill(store)
    assert store.delete(("user", "u1"), "car")
    assert "car" not in keys(store.search(query="automobile", mode="semantic", limit=10))
    assert where.sql("SELECT count(*) FROM memory_vectors") == [(3,)]


def test_a_put_racing_a_put_of_other_text_keeps_no_stale_vector(where: Where) -> None:
    """A put whose text equals the stored one keeps its vector -- unless another put
    changed the text between its check and its write: then it embeds again."""
    embedder = Meaning()
    store = where.open(embedder)
    other = where.open(Meaning())
    store.put(("n",), "k", "a kitten")
    plan = store.vectors.plan(("n", "k"), "a kitten")  # type: ignore[attr-defined]
    assert plan.keep
    other.put(("n",), "k", "a physician")  # meanwhile: the kept vector is no longer the text's
    real_plan = store.vectors.plan  # type: ignore[attr-defined]
    calls: list[bool] = []

    def stale_once(item_key: Any, text: str, force: bool = False) -> Any:
        calls.append(force)
        return plan if not force else real_plan(item_key, text, force=True)

    store.vectors.plan = stale_once  # type: ignore[attr-defined]
    store.put(("n",), "k", "a kitten")
    assert calls == [False, True]
    assert keys(store.search(query="cat", mode="semantic")) == ["k"]
    assert store.search(query="cat", mode="semantic")[0].score == pytest.approx(1.0)


# -- without an embedder, and a change of embedder --------------------------------------------


def test_a_store_without_an_embedder_is_text_only_and_says_so(where: Where) -> None:
    store = where.open()
    fill(store)
    assert keys(store.search(query="automobile")) == ["car"]  # text by default
    with pytest.raises(MemoryStoreError, match="a semantic search needs an embedder"):
        store.search(query="car", mode="semantic")
    with pytest.raises(MemoryStoreError, match="a hybrid search needs an embedder"):
        store.search(query="car", mode="hybrid")
    with pytest.raises(MemoryStoreError, match="one of text, semantic, hybrid"):
        store.search(query="car", mode="fuzzy")  # type: ignore[arg-type]


def test_items_put_without_an_embedder_are_embedded_by_reindex(where: Where) -> None:
    plain = where.open()
    fill(plain)
    embedder = Meaning()
    store = where.open(embedder)
    assert store.search(query="car", mode="semantic") == []
    assert store.reindex() == 4
    assert keys(store.search(query="car", mode="semantic", limit=1)) == ["car"]
    assert store.reindex() == 0
    # a put through a store without an embedder drops the vector its new text outdated
    plain.put(("user", "u1"), "car", {"text": "Alice rides a bicycle"})
    assert "car" not in keys(store.search(query="automobile", mode="semantic", limit=4))
    assert store.reindex() == 1


def test_another_embedding_model_is_refused_or_reindexed(where: Where) -> None:
    fill(where.open(Meaning("fake:one")))
    with pytest.raises(MemoryStoreError) as caught:
        where.open(Meaning("fake:two"))
    assert "made by fake:one" in str(caught.value) and "fake:two" in str(caught.value)
    assert "reindex=True" in str(caught.value)
    two = Meaning("fake:two", dimensions=32)
    store = where.open(two, reindex=True)
    assert sorted(text for _, text in two.embedded) == sorted(FACTS.values())
    assert keys(store.search(query="automobile", mode="semantic", limit=1)) == ["car"]
    assert where.sql("SELECT model, dimensions FROM memory_vector_index") == [("fake:two", 32)]


def test_vectors_of_another_length_under_the_same_model_are_refused(where: Where) -> None:
    store = where.open(Meaning("fake:m", 64))
    store.put(("n",), "a", "a kitten")
    changed = where.open(Meaning("fake:m", 32))  # same name, the server changed underneath
    with pytest.raises(MemoryStoreError, match="returned 32 dimensions; the memory's vectors"):
        changed.put(("n",), "b", "a puppy")
    assert changed.get(("n",), "b") is None  # refused whole


def test_a_version_1_memory_gains_the_vector_tables(where: Where) -> None:
    fill(where.open())
    for table in ("memory_vectors", "memory_vector_index"):
        where.sql(f"DROP TABLE {table}" + (" CASCADE" if where.kind == "postgres" else ""))
    where.sql("DELETE FROM memory_schema")
    where.sql("INSERT INTO memory_schema (version) VALUES (1)")
    store = where.open(Meaning(), reindex=True)
    assert keys(store.search(query="automobile", mode="semantic", limit=1)) == ["car"]
    assert where.sql("SELECT max(version) FROM memory_schema") == [(2,)]


# -- end to end: the store embedding through each wire format, on the trio loop ---------------


@pytest.mark.parametrize("wire", ["openai", "gemini"])
async def test_async_memory_embeds_through_the_wire_in_worker_threads(
    where: Where, wire: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    isolate(monkeypatch, tmp_path)
    fake: Any = FakeOpenAIEmbeddings([]) if wire == "openai" else FakeGeminiEmbeddings([])
    async with serve(fake, "/v1" if wire == "openai" else "/v1beta") as url:
        embedder = embedder_from_config(wire, base_url=url, dimensions=48)
        memory = AsyncMemory(where.open(embedder))
        async with trio.open_nursery() as nursery:
            for key, text in FACTS.items():
                nursery.start_soon(memory.put, ("user", "u1"), key, {"text": text})
        hits = await memory.search(("user",), query="physician", limit=2)
        semantic = await memory.search(("user",), query="medic", mode="semantic", limit=1)
        embedder.close()  # type: ignore[attr-defined]
    assert keys(hits)[0] == "doctor" and keys(semantic) == ["doctor"]
    assert fake.served == len(FACTS) + 2


# -- the distance: sqlite-vec where it loads, the same numbers in Python ----------------------


def test_the_python_cosine_distance_is_sqlite_vecs() -> None:
    """Where this Python's sqlite3 can load extensions, sqlite-vec is used; where it
    cannot (pyenv builds without it), the Python function gives the same distances.
    Both are checked against each other in an interpreter that can load it: this one,
    or the system's Python 3 with this environment's packages on its path."""
    a, b = meaning("Alice drives an automobile"), meaning("car")
    expected = 1.0 - sum(x * y for x, y in zip(a, b, strict=True))
    assert cosine_distance(pack(a), pack(b)) == pytest.approx(expected, abs=1e-6)
    script = (
        "import sqlite3, sqlite_vec, sys, json\n"
        "db = sqlite3.connect(':memory:'); db.enable_load_extension(True); sqlite_vec.load(db)\n"
        "a, b = (bytes.fromhex(h) for h in sys.argv[1:3])\n"
        "print(json.dumps(db.execute('SELECT vec_distance_cosine(?, ?)', (a, b)).fetchone()[0]))\n"
    )
    python = _python_with_extensions()
    site = [p for p in sys.path if p.endswith("site-packages")]
    done = subprocess.run(
        [python, "-c", script, pack(a).hex(), pack(b).hex()],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": ":".join(site)},
        check=True,
    )
    assert float(done.stdout) == pytest.approx(expected, abs=1e-6)


def _python_with_extensions() -> str:
    if hasattr(sqlite3.connect(":memory:"), "enable_load_extension"):
        return sys.executable
    system = "/usr/bin/python3"
    probe = "import sqlite3; sqlite3.connect(':memory:').enable_load_extension"
    if Path(system).is_file() and subprocess.run([system, "-c", probe]).returncode == 0:
        return system
    pytest.fail("no Python here whose sqlite3 can load extensions (sqlite-vec untested)")


def test_the_native_distance_passes_the_same_searches(tmp_path: Path) -> None:
    """The SQLite searches of this module, run again in an interpreter where sqlite-vec
    loads (so ``vec_distance_cosine`` ranks them, not the Python function)."""
    python = _python_with_extensions()
    site = [p for p in sys.path if p.endswith("site-packages")]
    root = Path(__file__).resolve().parents[1]
    check = "from cantrip.memory import SQLiteMemory as S; import sys; "
    check += "sys.exit(0 if S(sys.argv[1]).vectors.native else 3)"
    env = {**os.environ, "PYTHONPATH": ":".join([str(root), *site])}
    assert subprocess.run([python, "-c", check, str(tmp_path / "m.db")], env=env).returncode == 0
    done = subprocess.run(
        [python, "-m", "pytest", "-n", "0", "-rA", "-p", "no:randomly", "-p", "no:cacheprovider",
         __file__, "-k", "sqlite and not native"],
        env=env, capture_output=True, text=True, timeout=300, cwd=root,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    ran = [line for line in done.stdout.splitlines() if line.startswith("PASSED ")]
    assert len(ran) > 10 and "FAILED" not in done.stdout and "SKIPPED" not in done.stdout


def test_memory_for_passes_the_embedder(where: Where, tmp_path: Path) -> None:
    from cantrip.loom import SQLiteStore
    from cantrip.loom._postgres import PostgresStore

    loom: Any = SQLiteStore(where.path) if where.kind == "sqlite" else PostgresStore(where.url)
    try:
        store = memory_for(loom, embedder=Meaning())
        fill(store)
        assert keys(store.search(query="automobile", mode="semantic", limit=1)) == ["car"]
        store.close()
    finally:
        loom.close()


def test_a_zero_vector_is_no_direction_not_a_failure(where: Where) -> None:
    """Words whose hashed signs cancel give a zero vector: the item is kept (without a
    vector) and a query with one finds nothing by meaning -- no put is lost to it."""

    class Zero(Meaning):
        def embed(self, texts: Sequence[str], task: str = "document") -> list[list[float]]:
            return [[0.0] * 8 if "void" in t else meaning(t, 8) for t in texts]

    store = where.open(Zero())
    item = store.put(("n",), "k", "the void")
    store.put(("n",), "j", "a kitten")
    assert store.get(("n",), "k") == item
    assert store.search(query="void", mode="semantic") == []
    assert keys(store.search(query="void", mode="hybrid")) == ["k"]  # the text still finds it
    assert where.sql("SELECT count(*) FROM memory_vectors") == [(1,)]


def test_postgres_ranks_with_pgvector_exactly_when_the_server_has_it(pg_url: str) -> None:
    """Detection, not assumption: pgvector is used when the server offers it (this
    machine's does not, so its searches above ran the dot product in SQL)."""
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        offered = conn.execute(
            "SELECT 1 FROM pg_available_extensions WHERE name = 'vector'"
        ).fetchone()
    store = PostgresMemory.open(pg_url, embedder=Meaning())
    try:
        assert store.vectors.pgvector is (offered is not None)
        sql = store.vectors.nearest_sql("i.key", "TRUE")
        assert ("<=>" in sql) is store.vectors.pgvector and ("unnest" in sql) is not (
            store.vectors.pgvector
        )
        fill(store)
        assert keys(store.search(query="automobile", mode="semantic", limit=1)) == ["car"]
    finally:
        store.close()


async def test_async_memory_passes_a_mode_only_when_one_is_asked(tmp_path: Path) -> None:
    """A backend written before search modes (no ``mode`` parameter) still searches
    through AsyncMemory; a mode asked of it is passed, and refused by its signature."""

    class Older:
        limiter = trio.CapacityLimiter(1)

        def search(
            self, prefix: Any = (), *, query: Any = None, limit: int = 10, offset: int = 0
        ) -> list[Any]:
            return [("searched", prefix, query)]

    memory = AsyncMemory(Older())  # type: ignore[arg-type]
    assert await memory.search(("n",), query="tea") == [("searched", ("n",), "tea")]
    with pytest.raises(TypeError, match="mode"):
        await memory.search(("n",), query="tea", mode="text")


def test_no_secret_value_reaches_the_embedder(
    where: Where, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What is embedded is sent to a provider: an item's text is the redacted one, and a
    query loses the environment's secret values before it is embedded too."""
    secret = "sk-memory-search-0123456789abcdef"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    embedder = Meaning()
    store = where.open(embedder)
    store.put(("n",), "k", f"the kitten's key is {secret}")
    store.search(query=f"kitten {secret}", mode="hybrid")
    sent = [text for _, text in embedder.embedded]
    assert sent == ["the kitten's key is [REDACTED]", "kitten [REDACTED]"]
