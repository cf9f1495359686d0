"""The cost a memory-enabled cast adds over a plain one (issue 42's closing figure).

One cast of one turn (the scripted LLM answers ``done`` at once, so what is timed is
the runtime, not a model), on a fresh entity each time, its loom an SQLite file. Four
cantrips, the same but for their memory:

* **plain**: no memory;
* **blocks**: two pinned blocks (read from the store every cast, shown after the intent);
* **recall**: automatic recall of 5 items for the intent, in a store of ``--items``
  notes under the cast's namespace (the intent shares two words with some of them);
* **both**: blocks and recall.

Printed: p50 and p99 of a cast, in milliseconds, and what each adds to plain's p50.
The casts of the four kinds are interleaved (round-robin), so a busy machine's noise
falls on all of them alike.

    python bench/memory_turn.py [--casts 300] [--items 1000]

Figures: see the report of the branch that added this file (2 shared, busy cores).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import trio

from cantrip import (
    Cantrip,
    Circle,
    Identity,
    Loom,
    MemoryBlock,
    MemorySettings,
    ScriptedLLM,
    max_turns,
)
from cantrip.memory import memory_for
from gates import done

WORDS = [f"w{n:04d}" for n in range(2000)]
INTENT = "What do you know about w0001 and w0002?"


def spell(loom: Loom, memory: MemorySettings | None, casts: int) -> Cantrip:
    answer = {"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]}
    return Cantrip(
        llm=ScriptedLLM([answer] * (casts + 1)),
        identity=Identity(system_prompt="You answer."),
        circle=Circle([done], [max_turns(3)]),
        loom=loom,
        memory=memory,
    )


async def one_cast(cantrip: Cantrip) -> float:
    began = time.perf_counter()
    async with cantrip.summon() as entity:
        await entity.send(INTENT, tags={"user": "alice"})
    return (time.perf_counter() - began) * 1000


async def run(casts: int, items: int, folder: Path) -> None:
    loom = Loom.open(folder / "loom.db")
    store = memory_for(loom.store)
    rng = random.Random(42)
    for n in range(items):
        words = rng.sample(WORDS, 12)
        store.put(("user", "alice"), f"k{n}", " ".join(words))
    namespace = ("user", "{user}")
    blocks = (
        MemoryBlock("human", "Name: Alice. Likes short answers.", limit=500),
        MemoryBlock("persona", "A careful helper.", limit=500),
    )
    kinds = {
        "plain": spell(loom, None, casts),
        "blocks": spell(loom, MemorySettings(namespace=namespace, blocks=blocks), casts),
        "recall": spell(loom, MemorySettings(namespace=namespace, recall=True), casts),
        "both": spell(loom, MemorySettings(namespace=namespace, blocks=blocks, recall=True), casts),
    }
    took: dict[str, list[float]] = {kind: [] for kind in kinds}
    for cantrip in kinds.values():  # warm: the memory store opens once per cantrip
        await one_cast(cantrip)
    for _ in range(casts):
        for kind, cantrip in kinds.items():
            took[kind].append(await one_cast(cantrip))
    loom.close()
    base = statistics.median(took["plain"])
    print(f"one-turn cast, SQLite loom, {items:,} items in the namespace, {casts} casts each:")
    for kind, samples in took.items():
        cuts = statistics.quantiles(samples, n=100, method="inclusive")
        added = "" if kind == "plain" else f"   (+{cuts[49] - base:.3f} ms)"
        print(f"    {kind:<7} p50 {cuts[49]:7.3f} ms   p99 {cuts[98]:7.3f} ms{added}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--casts", type=int, default=300)
    parser.add_argument("--items", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        trio.run(run, args.casts, args.items, Path(folder))


if __name__ == "__main__":
    main()
