"""Memory's store: put and search latency, p50 and p99, at 1k and 10k items.

For each size the store is filled to N items (synthetic notes of 12 words from a
2,000-word vocabulary, in 50 namespaces ``("user", "uNN")``), then timed:

* **put new**: 300 puts of new keys (each grows the store by one);
* **put rev**: 300 puts of existing keys (a new revision each);
* **search 1w**: 300 searches of one word (``limit=10``; a word is in ~0.6% of items);
* **search 2w**: 300 searches of two words of one stored note (so at least it matches);
* **search ns**: the same under one user's namespace (a fiftieth of the items);
* **list**: 100 newest-first listings of one namespace (no query, ``limit=10``).

SQLite always (a loom file in a temporary folder, the loom's durability: WAL,
synchronous=NORMAL); PostgreSQL too when ``CANTRIP_BENCH_PG_URL`` names an empty
database (the tables are made there and left behind).

    python bench/memory.py [--sizes 1000,10000]
    CANTRIP_BENCH_PG_URL=postgresql://... python bench/memory.py

Figures (2 shared, busy cores; PostgreSQL 15 from tests/pg_cluster.py, fsync off),
in milliseconds, p50 / p99: see the closing note of issue 42 (the report of the
branch that added this file) -- they are printed by a run, not kept here.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from cantrip.memory import MemoryBackend, PostgresMemory, SQLiteMemory

WORDS = [f"w{n:04d}" for n in range(2000)]
USERS = 50
SAMPLES = 300


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


def run(kind: str, store: MemoryBackend, sizes: list[int]) -> None:
    rng = random.Random(42)
    texts: list[str] = []
    filled = 0
    for size in sizes:
        began = time.perf_counter()
        result = measure(store, size, filled, rng, texts)
        filled = size + SAMPLES  # the new keys stay
        print(f"{kind} at {size:,} items (ms, p50 / p99; {time.perf_counter() - began:.1f} s):")
        for name, figure in result.items():
            print(f"    {name:<10} {figure}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,10000")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as folder:
        store = SQLiteMemory(Path(folder) / "loom.db")
        try:
            run("sqlite", store, sizes)
        finally:
            store.close()
    url = os.environ.get("CANTRIP_BENCH_PG_URL")
    if url:
        pg = PostgresMemory.open(url)
        try:
            run("postgres", pg, sizes)
        finally:
            pg.close()


if __name__ == "__main__":
    main()
