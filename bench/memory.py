"""Memory's store: put and search latency, p50 and p99, at 1k and 10k items, text and semantic.

For each size the store is filled to N items (synthetic notes of 12 words from a
2,000-word vocabulary, in 50 namespaces ``("user", "uNN")``), then timed:

* **put new**: 300 puts of new keys (each grows the store by one);
* **put rev**: 300 puts of existing keys (a new revision each);
* **search 1w**: 300 searches of one word (``limit=10``; a word is in ~0.6% of items);
* **search 2w**: 300 searches of two words of one stored note (so at least it matches);
* **search ns**: the same under one user's namespace (a fiftieth of the items);
* **list**: 100 newest-first listings of one namespace (no query, ``limit=10``).

With ``--semantic`` the store has an embedder (:class:`HashEmbedder`: in process,
384 dimensions -- a small local model's size -- so what is timed is the store, not an
embeddings server) and the timings are:

* **put new** / **put rev**: as above, each put embedding its note and writing its vector;
* **sem**: 100 semantic searches (two words of a stored note, ``limit=10``): the
  distance to every vector, exactly;
* **sem ns**: the same under one user's namespace (a fiftieth of the vectors);
* **hybrid**: 100 hybrid searches (the text and the semantic ranking, 100 deep each,
  fused).

On SQLite the distance is sqlite-vec's where this Python's sqlite3 can load it, else
the Python function (the run says which: a pyenv-built Python cannot load it; Debian's
``/usr/bin/python3`` with ``PYTHONPATH`` naming the checkout and the venv's
site-packages can); on PostgreSQL pgvector's where the database has it, else the dot
product in SQL.

SQLite (a loom file in a temporary folder, the loom's durability: WAL,
synchronous=NORMAL) unless ``--only pg``; PostgreSQL too with ``--pg`` (a cluster of
its own, started and removed by the script as the tests do: ``tests/pg_cluster.py``,
fsync off) or when ``CANTRIP_BENCH_PG_URL`` names an empty database (the tables are
made there and left behind). At 100k items an exact semantic search without an index
takes seconds, so ``--semantic-samples`` cuts the semantic searches timed (its p99 is
then close to the maximum of a few).

    python bench/memory.py [--sizes 1000,10000,100000] [--semantic] [--pg] [--only sqlite|pg]
    CANTRIP_BENCH_PG_URL=postgresql://... python bench/memory.py

Figures (2 shared, busy cores; PostgreSQL 15 from tests/pg_cluster.py, fsync off),
in milliseconds, p50 / p99: see the closing note of issue 42 (the report of the
branch that added this file) -- they are printed by a run, not kept here.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from cantrip.memory import MemoryBackend, PostgresMemory, SQLiteMemory

WORDS = [f"w{n:04d}" for n in range(2000)]
USERS = 50
SAMPLES = 300
SEMANTIC_SAMPLES = 100
DIMENSIONS = 384


class HashEmbedder:
    """Words hashed to dimensions and signs, summed: deterministic, in process."""

    model_id = f"bench:hash@{DIMENSIONS}"

    def __init__(self) -> None:
        self.slots = {}
        for word in WORDS:
            digest = hashlib.sha256(word.encode()).digest()
            self.slots[word] = (int.from_bytes(digest[:4], "little") % DIMENSIONS, digest[4] % 2)

    def embed(self, texts: Sequence[str], task: str = "document") -> list[list[float]]:
        out = []
        for text in texts:
            vector = [0.0] * DIMENSIONS
            for word in text.split():
                slot, sign = self.slots.get(word, (0, 1))
                vector[slot] += 1.0 if sign else -1.0
            norm = math.sqrt(sum(x * x for x in vector)) or 1.0
            out.append([x / norm for x in vector])
        return out


def note(rng: random.Random) -> dict[str, str]:
    return {"text": " ".join(rng.choice(WORDS) for _ in range(12))}


def fill(store: MemoryBackend, start: int, stop: int, rng: random.Random, texts: list[str]) -> None:
    for n in range(start, stop):
        value = note(rng)
        texts.append(value["text"])
        store.put(("user", f"u{n % USERS:02d}"), f"k{n}", value)


def two_words(rng: random.Random, texts: list[str]) -> str:
    """Two words of one stored note: a query that finds at least that note."""
    return " ".join(rng.sample(rng.choice(texts).split(), 2))


def timed(calls: int, call: Callable[[int], object]) -> tuple[float, float]:
    """p50 and p99 of ``calls`` calls, in milliseconds."""
    took = []
    for n in range(calls):
        began = time.perf_counter()
        call(n)
        took.append((time.perf_counter() - began) * 1000)
    cuts = statistics.quantiles(took, n=100, method="inclusive")
    return cuts[49], cuts[98]


def measure(
    store: MemoryBackend, size: int, filled: int, rng: random.Random, texts: list[str]
) -> dict[str, str]:
    fill(store, filled, size, rng, texts)
    rows: dict[str, tuple[float, float]] = {}
    rows["put new"] = timed(
        SAMPLES, lambda n: store.put(("user", "fresh"), f"new-{size}-{n}", note(rng))
    )
    rows["put rev"] = timed(
        SAMPLES, lambda n: store.put(("user", f"u{n % USERS:02d}"), f"k{n}", note(rng))
    )
    rows["search 1w"] = timed(SAMPLES, lambda n: store.search(query=rng.choice(WORDS)))
    rows["search 2w"] = timed(SAMPLES, lambda n: store.search(query=two_words(rng, texts)))
    rows["search ns"] = timed(
        SAMPLES,
        lambda n: store.search(("user", f"u{n % USERS:02d}"), query=two_words(rng, texts)),
    )
    rows["list"] = timed(100, lambda n: store.search(("user", f"u{n % USERS:02d}")))
    return {name: f"{p50:7.3f} / {p99:7.3f}" for name, (p50, p99) in rows.items()}


def measure_semantic(
    store: MemoryBackend,
    size: int,
    filled: int,
    rng: random.Random,
    texts: list[str],
    samples: int = SEMANTIC_SAMPLES,
) -> dict[str, str]:
    fill(store, filled, size, rng, texts)
    rows: dict[str, tuple[float, float]] = {}
    rows["put new"] = timed(
        SAMPLES, lambda n: store.put(("user", "fresh"), f"new-{size}-{n}", note(rng))
    )
    rows["put rev"] = timed(
        SAMPLES, lambda n: store.put(("user", f"u{n % USERS:02d}"), f"k{n}", note(rng))
    )
    rows["sem"] = timed(
        samples,
        lambda n: store.search(query=two_words(rng, texts), mode="semantic"),
    )
    rows["sem ns"] = timed(
        samples,
        lambda n: store.search(
            ("user", f"u{n % USERS:02d}"), query=two_words(rng, texts), mode="semantic"
        ),
    )
    rows["hybrid"] = timed(
        samples, lambda n: store.search(query=two_words(rng, texts), mode="hybrid")
    )
    return {name: f"{p50:7.3f} / {p99:7.3f}" for name, (p50, p99) in rows.items()}


def run(
    kind: str,
    store: MemoryBackend,
    sizes: list[int],
    semantic: bool = False,
    samples: int = SEMANTIC_SAMPLES,
) -> None:
    rng = random.Random(42)
    texts: list[str] = []
    filled = 0
    for size in sizes:
        began = time.perf_counter()
        if semantic:
            result = measure_semantic(store, size, filled, rng, texts, samples)
        else:
            result = measure(store, size, filled, rng, texts)
        filled = size + SAMPLES  # the new keys stay
        print(f"{kind} at {size:,} items (ms, p50 / p99; {time.perf_counter() - began:.1f} s):")
        for name, figure in result.items():
            print(f"    {name:<10} {figure}")
        sys.stdout.flush()


@contextlib.contextmanager
def postgres_url(own: bool) -> Iterator[str | None]:
    """``CANTRIP_BENCH_PG_URL``, or with ``own`` an empty database on a cluster of the
    script's own (stopped and removed at the end); None: no PostgreSQL."""
    given = os.environ.get("CANTRIP_BENCH_PG_URL")
    if given or not own:
        yield given
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from pg_cluster import fresh_database, postgres_cluster

    with postgres_cluster() as server:
        yield fresh_database(server, "memory_bench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--semantic", action="store_true", help="with an embedder")
    parser.add_argument("--pg", action="store_true", help="start a PostgreSQL cluster too")
    parser.add_argument("--only", choices=("sqlite", "pg"), help="one database only")
    parser.add_argument(
        "--semantic-samples",
        type=int,
        default=SEMANTIC_SAMPLES,
        help=f"semantic searches timed per row (default {SEMANTIC_SAMPLES})",
    )
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    samples = args.semantic_samples
    embedder = HashEmbedder() if args.semantic else None
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    if args.only != "pg":
        with tempfile.TemporaryDirectory() as folder:
            store = SQLiteMemory(Path(folder) / "loom.db", embedder=embedder)
            distance = "sqlite-vec" if store.vectors.native else "Python fallback"
            kind = f"sqlite ({distance})" if embedder else "sqlite"
            try:
                run(kind, store, sizes, args.semantic, samples)
            finally:
                store.close()
    if args.only == "sqlite":
        return
    with postgres_url(args.pg or args.only == "pg") as url:
        if url:
            pg = PostgresMemory.open(url, embedder=embedder)
            distance = "pgvector" if pg.vectors.pgvector else "SQL dot product"
            kind = f"postgres ({distance})" if embedder else "postgres"
            try:
                run(kind, pg, sizes, args.semantic, samples)
            finally:
                pg.close()


if __name__ == "__main__":
    main()
