"""Loom costs: append throughput per store, thread extraction, fork-by-replay.

What it measures
----------------
**Append throughput.** ``Loom.append`` of pre-built turns, one after another,
on a fresh loom per run: ``memory`` (``MemoryStore``), ``sqlite`` (WAL, one
commit per turn, ``synchronous=NORMAL``: survives a process crash),
``sqlite-full`` (``synchronous=FULL``: an fsync per turn, survives power
loss), ``jsonl`` (one line per turn, flushed) and ``jsonl-fsync``. Timed is
everything an append costs: the loom's checks and index, ``Turn.to_dict``,
JSON encoding and the store's write and commit. Two turn shapes, both
conversation turns as the loop records them (content, tool call, gate-call
record with arguments and result, observation, metadata):

* ``small`` -- one tool call, a 150-character result (about 1.3 kB of JSON);
* ``typical`` -- one tool call, a 600-character result (about 2.7 kB);
* ``large`` -- two tool calls, 2,500-character results (about 12 kB).

Stores write into a fresh temporary folder per run; ``--dir`` picks where
(e.g. ``--dir /dev/shm`` takes the disk out and leaves the CPU cost).

**Thread extraction.** A 100,000-turn in-memory loom: one spine 10,000 turns
deep and 90,000 more turns in 10-turn branches hanging off random spine
turns. ``Loom.thread(leaf)`` (and ``Loom.lineage``) is timed for leaves at
depths 10, 100, 1,000 and 10,000, and the depth-10 case again on a loom of
only 1,000 turns: a walk up parent links costs O(depth), independent of the
loom's size. Also timed: opening the 100,000-turn loom from an SQLite file
(``Loom.open`` reads and indexes every record once; ``--no-load`` skips it).

**Fork by replay.** A JS and a Python entity run ``N`` code turns, each
calling a stateful gate once (``var vK = counter() + K``); the entity is
forked at its last turn and sent one more turn. Reported: the time the
replay took (``Entity.restore_report.duration_ms``: the sandbox re-running
``N`` code calls with every host call answered from the loom), a fit
``fixed + per_turn x N``, and a check that the gate ran exactly ``N + 1``
times (LOOM-13). For the conversation medium a fork is the context replay
alone (``Cantrip.fork``).

Targets (from the issue): SQLite >= 20,000 turns/s; thread extraction O(depth).

How to run
----------
From the repository root::

    python bench/loom.py                 # everything
    python bench/loom.py --repeats 5     # more runs per configuration
    python bench/loom.py --no-load --no-replay
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gates
from cantrip import Cantrip, Circle, Identity, ScriptedLLM, ToolCall, max_turns
from cantrip.loom import (
    EntityRecord,
    GateCallRecord,
    JSONLStore,
    Loom,
    LoomStore,
    MemoryStore,
    SQLiteStore,
    Turn,
    TurnMetadata,
)
from gates.fixtures import call_count, fixture_gate
from mediums.base import Medium
from mediums.conversation import conversation
from mediums.js import JsMedium
from mediums.python import PythonMedium

ENTITY = "entity-0123456789abcdef0123"
CANTRIP = "cantrip-0123456789abcdef"
_TEXT = (
    "the river rose after the storm and flooded the lower meadow while herons "
    "returned to the reed beds and otters moved upstream past the old mill"
)
WORDS = _TEXT.split()


def prose(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(WORDS)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:chars]


def make_turns(n: int, shape: str, seed: int = 7) -> list[Turn]:
    """A chain of ``n`` conversation turns of the given shape."""
    rng = random.Random(seed)
    calls, result_chars, content_chars = {
        "small": (1, 150, 80),
        "typical": (1, 600, 160),
        "large": (2, 2500, 160),
    }[shape]
    turns: list[Turn] = []
    parent = None
    for i in range(n):
        tool_calls = tuple(
            ToolCall(f"call_{i}_{k}", "search", {"query": prose(rng, 80), "limit": 10})
            for k in range(calls)
        )
        records = tuple(
            GateCallRecord(
                gate="search",
                args=c.arguments,
                result=prose(rng, result_chars),
                tool_call_id=c.id,
                duration_ms=12.5,
            )
            for c in tool_calls
        )
        content = prose(rng, content_chars)
        turn = Turn(
            id=Loom.new_turn_id(),
            parent_id=parent,
            entity_id=ENTITY,
            sequence=i + 1,
            cantrip_id=CANTRIP,
            intent="Survey the flood season" if i == 0 else None,
            utterance=content + "\n" + "\n".join(f"search({c.arguments_json})" for c in tool_calls),
            content=content,
            tool_calls=tool_calls,
            observation="\n".join(r.text for r in records),
            gate_calls=records,
            metadata=TurnMetadata(
                tokens_prompt=1200 + 40 * i,
                tokens_completion=85,
                tokens_cached=1024,
                duration_ms=850.0,
                timestamp="2025-01-01T00:00:00.000000+00:00",
                model="model-x",
                provider="provider-y",
            ),
        )
        turns.append(turn)
        parent = turn.id
    return turns


def entity_record() -> EntityRecord:
    return EntityRecord(ENTITY, CANTRIP, {"system_prompt": "You survey rivers."}, "conversation")


# -- append throughput --------------------------------------------------------------

STORES: dict[str, Callable[[Path], LoomStore]] = {
    "memory": lambda d: MemoryStore(),
    "sqlite": lambda d: SQLiteStore(d / "loom.db"),
    "sqlite-full": lambda d: SQLiteStore(d / "loom.db", durability="full"),
    "jsonl": lambda d: JSONLStore(d / "loom.jsonl"),
    "jsonl-fsync": lambda d: JSONLStore(d / "loom.jsonl", fsync=True),
}


def append_rate(store_name: str, turns: Sequence[Turn], where: str | None) -> float:
    with tempfile.TemporaryDirectory(prefix="cantrip-bench-loom-", dir=where) as tmp:
        loom = Loom(STORES[store_name](Path(tmp)))
        loom.register_entity(entity_record())
        start = time.perf_counter()
        for turn in turns:
            loom.append(turn)
        elapsed = time.perf_counter() - start
        loom.close()
    return len(turns) / elapsed


def bench_append(repeats: int, where: str | None) -> dict[str, dict[str, float]]:
    print(
        f"Append throughput (turns/s; best and median of {repeats} runs; "
        f"files in {where or tempfile.gettempdir()})"
    )
    print(f"  {'store':<12} {'shape':<8} {'json':>7} {'turns':>7} {'best':>10} {'median':>10}")
    results: dict[str, dict[str, float]] = {}
    for shape in ("small", "typical", "large"):
        for store in STORES:
            n = 20_000 if store in ("memory", "sqlite", "jsonl") else 2_000
            if shape == "large":
                n //= 2
            turns = make_turns(n, shape)
            size = len(json.dumps(turns[-1].to_dict()))
            rates = sorted(append_rate(store, turns, where) for _ in range(repeats))
            best, median = rates[-1], statistics.median(rates)
            results.setdefault(store, {})[shape] = best
            print(f"  {store:<12} {shape:<8} {size:>6}B {n:>7} {best:>10,.0f} {median:>10,.0f}")
    return results


# -- thread extraction ------------------------------------------------------------------


def branchy_loom(total: int, spine: int, seed: int = 3) -> tuple[Loom, dict[int, str]]:
    """``spine`` turns in a chain plus 10-turn branches until ``total`` turns;
    returns the loom and a leaf id for each measured depth."""
    rng = random.Random(seed)
    loom = Loom(MemoryStore())
    loom.register_entity(entity_record())
    spine_ids: list[str] = []
    parent = None
    for i in range(spine):
        turn = Turn(id=f"s{i}", parent_id=parent, entity_id=ENTITY, sequence=i + 1)
        loom.append(turn)
        spine_ids.append(turn.id)
        parent = turn.id
    count = spine
    branch = 0
    while count < total:
        at = rng.randrange(spine)
        parent = spine_ids[at]
        for k in range(min(10, total - count)):
            turn = Turn(
                id=f"b{branch}-{k}", parent_id=parent, entity_id=ENTITY, sequence=at + k + 2
            )
            loom.append(turn)
            parent = turn.id
            count += 1
        branch += 1
    depths = {d: spine_ids[d - 1] for d in (10, 100, 1_000, 10_000) if d <= spine}
    return loom, depths


def time_call(fn: Callable[[], object], min_time: float = 0.2) -> float:
    """Seconds per call: best of 5 batches, each long enough to time reliably."""
    runs = 1
    while True:
        start = time.perf_counter()
        for _ in range(runs):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= min_time / 5:
            break
        runs *= 2
    best = elapsed / runs
    for _ in range(4):
        start = time.perf_counter()
        for _ in range(runs):
            fn()
        best = min(best, (time.perf_counter() - start) / runs)
    return best


def bench_threads(load: bool) -> dict[str, float]:
    print("\nThread extraction (Loom.thread; the walk up parent links)")
    big, depths = branchy_loom(100_000, 10_000)
    small, small_depths = branchy_loom(1_000, 1_000)
    print(f"  {'loom turns':>10} {'depth':>7} {'thread()':>12} {'per level':>11} {'lineage()':>12}")
    per_level: dict[str, float] = {}
    for loom, table in ((big, depths), (small, {10: small_depths[10]})):
        for depth, leaf in sorted(table.items()):
            assert len(loom.thread(leaf)) == depth
            t = time_call(lambda loom=loom, leaf=leaf: loom.thread(leaf))
            lin = time_call(lambda loom=loom, leaf=leaf: loom.lineage(leaf))
            per_level[f"{len(loom)}:{depth}"] = t / depth
            print(
                f"  {len(loom):>10,} {depth:>7,} {t * 1e6:>10.1f}us {t / depth * 1e9:>9.0f}ns"
                f" {lin * 1e6:>10.1f}us"
            )
    ratio = per_level["100000:10000"] / per_level["100000:10"]
    size_ratio = per_level["100000:10"] / per_level["1000:10"]
    print(
        f"  per-level cost, depth 10,000 vs depth 10: x{ratio:.2f}; "
        f"depth 10 in a 100,000- vs a 1,000-turn loom: x{size_ratio:.2f} (O(depth): both ~1)"
    )
    if load:
        with tempfile.TemporaryDirectory(prefix="cantrip-bench-loom-") as tmp:
            path = Path(tmp) / "big.db"
            disk = Loom.open(path)
            disk.register_entity(entity_record())
            start = time.perf_counter()
            for turn in big.turns:
                disk.append(turn)
            write = time.perf_counter() - start
            disk.close()
            start = time.perf_counter()
            reopened = Loom.open(path)
            opened = time.perf_counter() - start
            t = time_call(lambda: reopened.thread(depths[10_000]))
            reopened.close()
        print(
            f"  SQLite file of 100,000 small turns: written in {write:.1f}s "
            f"({len(big) / write:,.0f}/s), opened and indexed in {opened:.2f}s "
            f"(once per process), then thread(depth 10,000) in {t * 1e3:.2f}ms"
        )
    return per_level


# -- fork by replay ----------------------------------------------------------------------


def code_for(medium: Medium, k: int) -> str:
    return f"var v{k} = counter() + {k};" if medium.name == "js" else f"v{k} = counter() + {k}"


async def replay_cost(medium: Medium, n: int) -> tuple[float, float]:
    """(replay ms, fork total ms) for a fork at the last of ``n`` code turns."""
    counter = fixture_gate("counter", stateful=True)
    script = [{"code": code_for(medium, k)} for k in range(n)]
    script.append({"code": "done(1);"} if medium.name == "js" else {"code": "done(1)"})
    spell = Cantrip(
        llm=ScriptedLLM(script),
        identity=Identity(),
        circle=Circle([gates.done, counter], [max_turns(n + 2)], medium),
    )
    outcome = await spell.cast_async("count")
    last_code_turn = outcome.turns[n - 1]
    probe = f"done(v{n - 1});" if medium.name == "js" else f"done(v{n - 1})"
    start = time.perf_counter()
    entity = spell.fork(last_code_turn, llm=ScriptedLLM([{"code": probe}]))
    async with entity:
        forked = await entity.send("and now?")
    total = (time.perf_counter() - start) * 1000.0
    assert forked.result == n - 1 + n, forked  # v_{n-1} = counter() (= n) + n - 1
    assert call_count(counter) == n, "replay must not run the gate (LOOM-13)"
    report = entity.restore_report
    assert report is not None and report.code_calls == n and report.hydrated == n
    return report.duration_ms, total


def fit(points: Sequence[tuple[int, float]]) -> tuple[float, float]:
    xs = [float(x) for x, _ in points]
    ys = [y for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    return my - slope * mx, slope


def bench_replay(repeats: int) -> dict[str, float]:
    print("\nFork by replay (best of", repeats, "runs)")
    print(f"  {'medium':<8} {'turns':>6} {'replay':>10} {'per turn':>10} {'fork+1 turn':>12}")
    slopes: dict[str, float] = {}
    for medium in (JsMedium(), PythonMedium()):
        points = []
        for n in (10, 50, 200):
            runs = [trio.run(replay_cost, medium, n) for _ in range(repeats)]
            replay = min(r[0] for r in runs)
            total = min(r[1] for r in runs)
            points.append((n, replay))
            print(
                f"  {medium.name:<8} {n:>6} {replay:>8.1f}ms {replay / n:>8.2f}ms {total:>10.1f}ms"
            )
        fixed, slope = fit(points)
        slopes[medium.name] = slope
        print(f"  {medium.name:<8} fit: {fixed:.1f} ms fixed + {slope:.3f} ms per replayed turn")
    for n in (100, 1000, 10_000):
        turns = make_turns(n, "typical")
        spell = Cantrip(
            llm=ScriptedLLM([]),
            identity=Identity(),
            circle=Circle([gates.done], [max_turns(2)], conversation),
        )
        spell.loom.register_entity(entity_record())
        for turn in turns:
            spell.loom.append(turn)
        t = time_call(lambda spell=spell, leaf=turns[-1]: spell.fork(leaf), min_time=0.5)
        print(
            f"  {'conv.':<8} {n:>6} {t * 1e3:>8.2f}ms {t / n * 1e3:>8.4f}ms   (context replay only)"
        )
    return slopes


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-load", action="store_true", help="skip the SQLite load test")
    parser.add_argument("--no-replay", action="store_true", help="skip fork-by-replay")
    parser.add_argument("--dir", help="where stores write (default: the temp folder)")
    args = parser.parse_args(argv)
    rates = bench_append(args.repeats, args.dir)
    levels = bench_threads(not args.no_load)
    if not args.no_replay:
        bench_replay(args.repeats)
    sqlite = rates["sqlite"]["typical"]
    print(
        f"\nTargets: SQLite >= 20,000 turns/s -- {rates['sqlite']['small']:,.0f} small, "
        f"{sqlite:,.0f} typical, {rates['sqlite']['large']:,.0f} large; thread extraction "
        "O(depth) -- "
        f"{levels['100000:10000'] * 1e9:.0f} ns/level at depth 10,000, "
        f"{levels['100000:10'] * 1e9:.0f} ns/level at depth 10."
    )


if __name__ == "__main__":
    main()
