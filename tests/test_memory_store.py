"""Memory's store (issue 42.1, 42.7): the same tests against the SQLite store and a real
PostgreSQL (started by the ``pg_url`` fixture), each in a loom's database."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from cantrip.loom import EntityRecord, JSONLStore, Loom, MemoryStore, SQLiteStore, Turn
from cantrip.loom._postgres import PostgresStore
from cantrip.memory import (
    MAX_DEPTH,
    MAX_KEY_CHARS,
    MAX_LIMIT,
    MAX_PART_CHARS,
    MAX_QUERY_CHARS,
    MAX_VALUE_BYTES,
    AsyncMemory,
    MemoryBackend,
    MemoryStoreError,
    PostgresMemory,
    SQLiteMemory,
    memory_for,
)

KINDS = ("sqlite", "postgres")


class Where:
    """A database of one kind for one test: opens memory stores on it, and reads back
    every text its memory tables hold (to look for a secret in them)."""

    def __init__(self, kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
        self.kind = kind
        self.path = tmp_path / "loom.db"
        self.url = request.getfixturevalue("pg_url") if kind == "postgres" else ""
        self._opened: list[MemoryBackend] = []

    def open(self) -> MemoryBackend:
        store: MemoryBackend = (
            SQLiteMemory(self.path) if self.kind == "sqlite" else PostgresMemory.open(self.url)
        )
        self._opened.append(store)
        return store

    def sql(self, statement: str) -> list[tuple[Any, ...]]:
        """Rows of ``statement`` on the database, outside any store (tables named
        ``memory_*``; on PostgreSQL with the ``cantrip_`` prefix)."""
        if self.kind == "sqlite":
            with sqlite3.connect(self.path) as db:
                return db.execute(statement).fetchall()
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            cursor = conn.execute(statement.replace("memory_", "cantrip_memory_"))
            return cursor.fetchall() if cursor.description is not None else []

    def has_memory_tables(self) -> bool:
        if self.kind == "sqlite":
            return bool(self.sql("SELECT 1 FROM sqlite_master WHERE name = 'memory_items'"))
        return self.sql("SELECT to_regclass('memory_items')") != [(None,)]

    def everything_stored(self) -> str:
        tables = ["memory_items", "memory_revisions"]
        if self.kind == "sqlite":
            tables.append("memory_fts")
        return "\n".join(repr(self.sql(f"SELECT * FROM {table}")) for table in tables)

    def close(self) -> None:
        for store in self._opened:
            store.close()


@pytest.fixture(params=KINDS)
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Where]:
    found = Where(request.param, tmp_path, request)
    yield found
    found.close()


@pytest.fixture
def mem(where: Where) -> MemoryBackend:
    return where.open()


# -- put, get, revisions, delete ---------------------------------------------------


def test_put_then_get_returns_the_value_its_metadata_and_times(mem: MemoryBackend) -> None:
    value = {"fact": "Alice likes tea ☕", "n": [1, 2.5, None, True], "deep": {"x": "y"}}
    put = mem.put(("user", "alice"), "drink", value, {"source": "turn-1"})
    got = mem.get(("user", "alice"), "drink")
    assert got == put
    assert got is not None
    assert got.value == value and got.metadata == {"source": "turn-1"}
    assert got.namespace == ("user", "alice") and got.key == "drink"
    assert got.revision == 1
    assert got.created_at == got.updated_at and got.created_at.tzinfo is not None
    assert mem.get(("user", "alice"), "food") is None
    assert mem.get(("user", "bob"), "drink") is None


def test_a_scalar_value_and_no_metadata_are_stored_too(mem: MemoryBackend) -> None:
    mem.put(("n",), "k", "just text")
    got = mem.get(("n",), "k")
    assert got is not None and got.value == "just text" and got.metadata == {}


def test_control_characters_inside_a_value_are_kept_and_its_words_found(
    mem: MemoryBackend,
) -> None:
    """A NUL is no name's, but a value may hold one: JSON escapes it, and the search
    text holds a space in its place (PostgreSQL's text refuses NUL)."""
    value = {"raw": "left\x00right\x1bend"}
    mem.put(("n",), "k", value)
    got = mem.get(("n",), "k")
    assert got is not None and got.value == value
    assert [hit.item.key for hit in mem.search(query="right")] == ["k"]


def test_each_put_of_a_key_is_a_new_revision_and_the_old_ones_are_kept(
    mem: MemoryBackend,
) -> None:
    first = mem.put(("user", "alice"), "city", {"city": "Paris"})
    second = mem.put(("user", "alice"), "city", {"city": "Lyon"}, {"why": "moved"})
    third = mem.put(("user", "alice"), "city", {"city": "Nantes"})
    assert (first.revision, second.revision, third.revision) == (1, 2, 3)
    assert third.created_at == first.created_at
    assert first.updated_at <= second.updated_at <= third.updated_at
    latest = mem.get(("user", "alice"), "city")
    assert latest is not None and latest.value == {"city": "Nantes"} and latest.revision == 3
    old = mem.get(("user", "alice"), "city", revision=2)
    assert old is not None
    assert (old.value, old.metadata, old.revision) == ({"city": "Lyon"}, {"why": "moved"}, 2)
    assert old.created_at == first.created_at and old.updated_at == second.updated_at
    oldest = mem.get(("user", "alice"), "city", revision=1)
    assert oldest is not None and oldest.value == {"city": "Paris"}
    assert mem.get(("user", "alice"), "city", revision=4) is None


def test_delete_forgets_the_item_and_all_its_revisions(where: Where, mem: MemoryBackend) -> None:
    mem.put(("user", "alice"), "pet", "a cat named Tom")
    mem.put(("user", "alice"), "pet", "a cat named Felix")
    mem.put(("user", "alice"), "other", "kept")
    assert mem.delete(("user", "alice"), "pet") is True
    assert mem.get(("user", "alice"), "pet") is None
    assert mem.get(("user", "alice"), "pet", revision=1) is None
    assert mem.search(query="Felix") == [] and mem.search(query="Tom") == []
    assert "Felix" not in where.everything_stored() and "Tom" not in where.everything_stored()
    assert mem.delete(("user", "alice"), "pet") is False
    again = mem.put(("user", "alice"), "pet", "a dog")
    assert again.revision == 1
    assert [hit.item.key for hit in mem.search(query="kept")] == ["other"]


def test_the_same_key_in_two_namespaces_is_two_items(mem: MemoryBackend) -> None:
    mem.put(("user", "alice"), "name", "Alice")
    mem.put(("user", "bob"), "name", "Bob")
    mem.put(("user", "bob"), "name", "Robert")
    alice = mem.get(("user", "alice"), "name")
    bob = mem.get(("user", "bob"), "name")
    assert alice is not None and (alice.value, alice.revision) == ("Alice", 1)
    assert bob is not None and (bob.value, bob.revision) == ("Robert", 2)


def test_the_store_is_durable_across_opening_again(where: Where) -> None:
    first = where.open()
    first.put(("a",), "k", {"v": 1})
    first.put(("a",), "k", {"v": 2})
    first.close()
    again = where.open()
    got = again.get(("a",), "k", revision=1)
    assert got is not None and got.value == {"v": 1}
    assert [hit.item.value for hit in again.search(("a",))] == [{"v": 2}]


# -- namespaces ----------------------------------------------------------------------


def test_list_namespaces_by_prefix_depth_and_page(mem: MemoryBackend) -> None:
    for namespace in [
        ("user", "bob", "notes"),
        ("user", "alice"),
        ("user", "alice", "notes"),
        ("users",),
        ("agent", "x"),
    ]:
        mem.put(namespace, "k", "v")
    mem.put(("user", "alice"), "k2", "v")  # two items, one namespace
    assert mem.list_namespaces() == [
        ("agent", "x"),
        ("user", "alice"),
        ("user", "alice", "notes"),
        ("user", "bob", "notes"),
        ("users",),
    ]
    # a prefix is whole parts: ("user",) is not a prefix of ("users",)
    assert mem.list_namespaces(("user",)) == [
        ("user", "alice"),
        ("user", "alice", "notes"),
        ("user", "bob", "notes"),
    ]
    assert mem.list_namespaces(("user", "alice")) == [("user", "alice"), ("user", "alice", "notes")]
    assert mem.list_namespaces(("user",), max_depth=2) == [("user", "alice"), ("user", "bob")]
    assert mem.list_namespaces(max_depth=1) == [("agent",), ("user",), ("users",)]
    assert mem.list_namespaces(limit=2, offset=1) == [("user", "alice"), ("user", "alice", "notes")]
    assert mem.list_namespaces(("nobody",)) == []
    mem.delete(("agent", "x"), "k")
    assert ("agent", "x") not in mem.list_namespaces()


# -- search --------------------------------------------------------------------------


def test_search_ranks_the_better_match_first(mem: MemoryBackend) -> None:
    # the better match is the older one: newest-first would order them the other way
    mem.put(("n",), "strong", {"text": "rose rose rose garden"})
    mem.put(("n",), "weak", {"text": "the garden has a rose and many other plants and trees"})
    mem.put(("n",), "none", {"text": "a kitchen with a kettle"})
    hits = mem.search(query="rose garden")
    assert [hit.item.key for hit in hits] == ["strong", "weak"]
    assert hits[0].score is not None and hits[1].score is not None
    assert hits[0].score > hits[1].score


def test_search_needs_every_word_and_stems_them(mem: MemoryBackend) -> None:
    mem.put(("n",), "both", "Alice keeps two cats")
    mem.put(("n",), "one", "Alice drinks coffee")
    assert [hit.item.key for hit in mem.search(query="Alice cat")] == ["both"]
    assert [hit.item.key for hit in mem.search(query="alice")] != []
    assert mem.search(query="Alice tea") == []


def test_search_indexes_the_values_strings_not_its_keys(mem: MemoryBackend) -> None:
    mem.put(("n",), "k", {"colour": ["blue", {"shade": "turquoise"}], "count": 3})
    assert [hit.item.key for hit in mem.search(query="turquoise")] == ["k"]
    assert mem.search(query="colour") == []


def test_search_filters_by_namespace_prefix(mem: MemoryBackend) -> None:
    mem.put(("user", "alice"), "a", "likes tea")
    mem.put(("user", "alice", "old"), "b", "likes tea")
    mem.put(("user", "bob"), "c", "likes tea")
    mem.put(("users",), "d", "likes tea")
    keys = lambda prefix: sorted(hit.item.key for hit in mem.search(prefix, query="tea"))  # noqa: E731
    assert keys(()) == ["a", "b", "c", "d"]
    assert keys(("user",)) == ["a", "b", "c"]
    assert keys(("user", "alice")) == ["a", "b"]
    assert keys(("user", "alice", "old")) == ["b"]
    assert keys(("nobody",)) == []


def test_search_limit_and_offset_page_through_the_ranking(mem: MemoryBackend) -> None:
    for n in range(5, 0, -1):  # the best match first, so it is the oldest
        mem.put(("n",), f"k{n}", " ".join(["apple"] * n + ["filler"] * (10 - n)))
    ranked = [hit.item.key for hit in mem.search(query="apple", limit=5)]
    assert ranked == ["k5", "k4", "k3", "k2", "k1"]
    assert [hit.item.key for hit in mem.search(query="apple", limit=2)] == ranked[:2]
    assert [hit.item.key for hit in mem.search(query="apple", limit=2, offset=2)] == ranked[2:4]
    assert mem.search(query="apple", offset=5) == []


def test_search_without_a_query_lists_newest_first(mem: MemoryBackend) -> None:
    mem.put(("n",), "a", "one")
    mem.put(("n",), "b", "two")
    mem.put(("n",), "a", "one again")  # updated: now the newest
    hits = mem.search(("n",))
    assert [hit.item.key for hit in hits] == ["a", "b"]
    assert all(hit.score is None for hit in hits)
    assert [hit.item.key for hit in mem.search(("n",), limit=1)] == ["a"]


def test_search_sees_only_the_latest_revision(mem: MemoryBackend) -> None:
    mem.put(("n",), "k", "the meeting is on Monday")
    mem.put(("n",), "k", "the meeting is on Friday")
    assert mem.search(query="Monday") == []
    hits = mem.search(query="Friday")
    assert [(hit.item.key, hit.item.revision) for hit in hits] == [("k", 2)]


def test_a_query_of_punctuation_or_search_syntax_is_words_only(mem: MemoryBackend) -> None:
    mem.put(("n",), "k", "error OR failure NEAR the 'quoted' AND thing")
    assert mem.search(query="!!! ??? ***") == []
    assert [hit.item.key for hit in mem.search(query='"quoted" AND (failure*')] == ["k"]


# -- bad input (42.7) ----------------------------------------------------------------

BAD_PUTS: list[tuple[str, Callable[[MemoryBackend], object], str]] = [
    ("empty namespace", lambda m: m.put((), "k", 1), "at least one part"),
    ("string namespace", lambda m: m.put("user", "k", 1), "tuple of strings"),  # type: ignore[arg-type]
    ("empty part", lambda m: m.put(("user", ""), "k", 1), "may not be empty"),
    ("part not a string", lambda m: m.put(("user", 3), "k", 1), "is a string"),  # type: ignore[arg-type]
    ("NUL in a part", lambda m: m.put(("us\x00er",), "k", 1), "NUL"),
    ("separator in a part", lambda m: m.put(("a\x1fb",), "k", 1), "control characters"),
    ("too deep", lambda m: m.put(tuple("abcdefghi"), "k", 1), f"{MAX_DEPTH} parts"),
    ("long part", lambda m: m.put(("x" * 129,), "k", 1), f"{MAX_PART_CHARS} characters"),
    ("empty key", lambda m: m.put(("n",), "", 1), "key may not be empty"),
    ("NUL in a key", lambda m: m.put(("n",), "k\x00", 1), "NUL"),
    ("long key", lambda m: m.put(("n",), "k" * 513, 1), f"{MAX_KEY_CHARS} characters"),
    ("lone surrogate key", lambda m: m.put(("n",), "k\ud800", 1), "lone surrogate"),
    ("value not JSON", lambda m: m.put(("n",), "k", {1j}), "not JSON"),
    ("NaN value", lambda m: m.put(("n",), "k", float("nan")), "not JSON"),
    ("lone surrogate value", lambda m: m.put(("n",), "k", "a\udc00"), "lone surrogate"),
    ("metadata not a dict", lambda m: m.put(("n",), "k", 1, [1]), "metadata is a JSON object"),  # type: ignore[arg-type]
    (
        "oversized value",
        lambda m: m.put(("n",), "k", "x" * MAX_VALUE_BYTES),
        f"at most {MAX_VALUE_BYTES} bytes",
    ),
    (
        "oversized metadata",
        lambda m: m.put(("n",), "k", "small", {"m": "é" * (MAX_VALUE_BYTES // 2)}),
        f"at most {MAX_VALUE_BYTES} bytes",
    ),
]


@pytest.mark.parametrize(("case", "call", "says"), BAD_PUTS, ids=[c[0] for c in BAD_PUTS])
def test_bad_input_to_put_is_refused_with_the_reason_and_stores_nothing(
    mem: MemoryBackend, case: str, call: Callable[[MemoryBackend], object], says: str
) -> None:
    with pytest.raises(MemoryStoreError, match=says):
        call(mem)
    assert mem.list_namespaces() == []


BAD_READS: list[tuple[str, Callable[[MemoryBackend], object], str]] = [
    ("get NUL key", lambda m: m.get(("n",), "\x00"), "NUL"),
    ("revision 0", lambda m: m.get(("n",), "k", revision=0), "a revision is an integer from 1"),
    ("revision True", lambda m: m.get(("n",), "k", revision=True), "a revision is an integer"),
    ("revision text", lambda m: m.get(("n",), "k", revision="1"), "a revision is an integer"),  # type: ignore[arg-type]
    ("delete empty namespace", lambda m: m.delete((), "k"), "at least one part"),
    ("long query", lambda m: m.search(query="q" * 1025), f"{MAX_QUERY_CHARS} characters"),
    ("query not text", lambda m: m.search(query=3), "query is a string"),  # type: ignore[arg-type]
    ("limit 0", lambda m: m.search(limit=0), f"1 to {MAX_LIMIT}"),
    ("limit too big", lambda m: m.search(limit=MAX_LIMIT + 1), f"1 to {MAX_LIMIT}"),
    ("negative offset", lambda m: m.search(offset=-1), "offset"),
    ("bad prefix", lambda m: m.search(("a", "")), "may not be empty"),
    ("listing limit", lambda m: m.list_namespaces(limit=MAX_LIMIT + 1), f"1 to {MAX_LIMIT}"),
    ("listing depth", lambda m: m.list_namespaces(max_depth=0), "max_depth"),
]


@pytest.mark.parametrize(("case", "call", "says"), BAD_READS, ids=[c[0] for c in BAD_READS])
def test_bad_input_to_reads_is_refused_with_the_reason(
    mem: MemoryBackend, case: str, call: Callable[[MemoryBackend], object], says: str
) -> None:
    with pytest.raises(MemoryStoreError, match=says):
        call(mem)


def test_the_bounds_themselves_are_accepted(mem: MemoryBackend) -> None:
    namespace = tuple("p" * MAX_PART_CHARS for _ in range(MAX_DEPTH))
    key = "k" * MAX_KEY_CHARS
    value = "v" * (MAX_VALUE_BYTES - len('""') - len("{}"))
    mem.put(namespace, key, value)
    got = mem.get(namespace, key)
    assert got is not None and got.value == value
    mem.search(query="q" * MAX_QUERY_CHARS, limit=MAX_LIMIT)


# -- secrets -------------------------------------------------------------------------

SECRET = "sk-memory-test-0123456789abcdef"


def test_secret_values_are_redacted_before_they_are_stored(
    where: Where, mem: MemoryBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    put = mem.put(
        ("user", "alice"),
        "creds",
        {"note": f"her key is {SECRET} (do not share)", "list": [SECRET]},
        {"seen": f"Bearer {SECRET}"},
    )
    put = mem.put(("user", "alice"), "creds", {"note": f"again {SECRET}"})
    assert put.value == {"note": "again [REDACTED]"}
    first = mem.get(("user", "alice"), "creds", revision=1)
    assert first is not None
    assert first.value == {"note": "her key is [REDACTED] (do not share)", "list": ["[REDACTED]"]}
    assert first.metadata == {"seen": "Bearer [REDACTED]"}
    assert SECRET not in where.everything_stored()
    assert "REDACTED" in where.everything_stored()


def test_a_secret_in_a_namespace_or_key_is_refused_without_echoing_it(
    mem: MemoryBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    for call in (lambda: mem.put(("u", SECRET), "k", 1), lambda: mem.put(("u",), SECRET, 1)):
        with pytest.raises(MemoryStoreError, match="secret value") as caught:
            call()
        assert SECRET not in str(caught.value)
    assert mem.list_namespaces() == []


# -- beside a loom, and its schema -----------------------------------------------------


def _entity() -> EntityRecord:
    return EntityRecord(
        entity_id="e1",
        cantrip_id="c1",
        identity={"system_prompt": "be brief"},
        llm="scripted",
        created_at="2024-01-01T00:00:00.000000+00:00",
    )


def _turn(turn_id: str, parent: str | None, sequence: int) -> Turn:
    return Turn(
        id=turn_id,
        parent_id=parent,
        entity_id="e1",
        sequence=sequence,
        cantrip_id="c1",
        intent="remember this" if parent is None else None,
        utterance=f"say {turn_id}",
        observation=f"seen {turn_id}",
    )


def test_memory_is_added_to_an_existing_loom_without_touching_its_turns(where: Where) -> None:
    store = SQLiteStore(where.path) if where.kind == "sqlite" else PostgresStore(where.url)
    store.append_entity(_entity())
    store.append_turn(_turn("t1", None, 1))
    store.append_turn(_turn("t2", "t1", 2))
    table = "turns" if where.kind == "sqlite" else "cantrip_turns"
    before = where.sql(f"SELECT pos, id, parent_id, entity_id, sequence, data FROM {table}")
    assert not where.has_memory_tables()
    memory = memory_for(store)
    try:
        memory.put(("user", "alice"), "fact", "the loom stays as it was")
        assert where.sql(f"SELECT pos, id, parent_id, entity_id, sequence, data FROM {table}") == (
            before
        )
        assert where.has_memory_tables()
        assert where.sql("SELECT count(*) FROM memory_items") == [(1,)]
    finally:
        memory.close()
        store.close()
    loom = Loom.open(where.path) if where.kind == "sqlite" else Loom.open(where.url)
    try:
        assert [turn.id for turn in loom.entity_turns("e1")] == ["t1", "t2"]
    finally:
        loom.close()
    again = where.open()  # opening again migrates nothing and finds the item
    assert [hit.item.key for hit in again.search(query="loom")] == ["fact"]


def test_a_loom_without_a_database_has_no_memory(tmp_path: Path) -> None:
    for store in (MemoryStore(), JSONLStore(tmp_path / "l.jsonl")):
        with pytest.raises(MemoryStoreError, match="SQLite or PostgreSQL loom"):
            memory_for(store)  # type: ignore[arg-type]
        store.close()


def test_memory_tables_written_by_a_newer_cantrip_are_refused(where: Where) -> None:
    where.open().put(("n",), "k", "v")
    where.sql("INSERT INTO memory_schema (version) VALUES (99)")
    with pytest.raises(MemoryStoreError, match=r"newer cantrip.*memory schema 99"):
        where.open()


# -- the async face ------------------------------------------------------------------


async def test_async_memory_runs_each_call_in_a_worker_thread(mem: MemoryBackend) -> None:
    memory = AsyncMemory(mem)
    threads: list[bool] = []
    real_put = mem.put

    def put(*args: Any, **kwargs: Any) -> Any:
        threads.append(trio.from_thread.check_cancelled() is None)
        return real_put(*args, **kwargs)

    mem.put = put  # type: ignore[method-assign]
    item = await memory.put(("user", "alice"), "k", "async tea")
    assert threads == [True]  # from_thread works only in a trio worker thread
    assert (await memory.get(("user", "alice"), "k")) == item
    hits = await memory.search(("user",), query="tea", limit=5)
    assert [hit.item for hit in hits] == [item]
    assert await memory.list_namespaces() == [("user", "alice")]
    assert await memory.delete(("user", "alice"), "k") is True


async def test_concurrent_puts_of_one_key_each_get_their_own_revision(where: Where) -> None:
    """Puts racing on one key (two stores on one database, several threads each) lose
    no revision and never give two puts the same one."""
    stores = [AsyncMemory(where.open()), AsyncMemory(where.open())]
    revisions: list[int] = []

    async def put(n: int) -> None:
        item = await stores[n % 2].put(("n",), "k", {"n": n})
        revisions.append(item.revision)

    async with trio.open_nursery() as nursery:
        for n in range(16):
            nursery.start_soon(put, n)
    assert sorted(revisions) == list(range(1, 17))
    kept = [where.open().get(("n",), "k", revision=r) for r in range(1, 17)]
    assert sorted(item.value["n"] for item in kept if item is not None) == list(range(16))
