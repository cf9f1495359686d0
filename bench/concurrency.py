"""Concurrency benchmarks: many entities at once, batch waves, cancelling a tree.

Run: ``python bench/concurrency.py [--entities 10000]``. Prints:

(a) N concurrent entities, 5 turns each, against an LLM with 50 ms latency, in
    one process and one in-memory loom: wall time, peak RSS, RSS per entity.
    Targets: <= 2.5 s wall, <= 50 KiB per entity on a 2-core machine.
    Three configurations, each in a fresh process (so peak RSS is its own):
    the LLM waits with ``cantrip.llm.simulate_latency`` under CPython's default
    collector settings; the same inside ``cantrip.gc_for_throughput()``; and
    the LLM waiting with ``trio.sleep`` (default collector) for comparison --
    trio.sleep wakes each sleeper by raising a Cancelled, 1.65 s of CPU for
    these 50,000 waits alone. Also printed: trio's own floor for the same
    waits without any entity.
(b) a batch of 50 children (each one 50 ms LLM turn) under the default
    concurrency limit of 8, against the ideal ceil(50 / 8) waves.
    Target: within 10 % of ideal.
(c) time from cancelling a running tree of 100 entities (1 root, 9 children,
    90 grandchildren, all waiting on their LLM) until every one of them has
    recorded its final, truncated turn. Target: <= 50 ms.
"""

from __future__ import annotations

import argparse
import gc
import math
import resource
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import trio

import cantrip
from cantrip.llm import Message, Response, ToolChoice, ToolDefinition, simulate_latency
from gates import call_agent_batch, done, echo


class LatencyLLM:
    """Echoes for ``turns - 1`` turns, then done; every answer after ``latency_s``.

    Stateless like a real LLM: it tells which turn it is on from the context,
    which holds the system prompt and the intent, then one assistant message and
    one tool result per earlier turn (counted by length, so the LLM's own cost
    stays O(1) per query).
    """

    name = "latency"

    def __init__(
        self,
        latency_s: float,
        turns: int,
        wait: Callable[[float], Awaitable[None]] = simulate_latency,
    ) -> None:
        self.latency_s = latency_s
        self.turns = turns
        self.wait = wait

    async def query(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Response:
        await self.wait(self.latency_s)
        answered = (len(messages) - 2) // 2
        if answered + 1 >= self.turns:
            call = cantrip.ToolCall(f"d{answered}", "done", {"answer": "ok"})
        else:
            call = cantrip.ToolCall(f"e{answered}", "echo", {"text": "step"})
        return Response(tool_calls=(call,))


def rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


WAITS = {"simulate_latency": simulate_latency, "trio.sleep": trio.sleep}


async def many_entities(n: int, wait: str, gc_setting: str) -> None:
    spell = cantrip.Cantrip(
        llm=LatencyLLM(0.05, 5, WAITS[wait]),
        identity=cantrip.Identity(system_prompt="bench"),
        circle=cantrip.Circle([done, echo], [cantrip.max_turns(6)]),
    )
    collections = [0, 0.0]

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections[1] -= time.perf_counter()
        else:
            collections[0] += 1
            collections[1] += time.perf_counter()

    before = rss_kib()
    gc.callbacks.append(count)
    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(spell.cast_async, f"task {i}")
    wall = time.perf_counter() - start
    gc.callbacks.remove(count)
    after = rss_kib()
    turns = len(spell.loom)
    print(
        f"(a) {n} entities x 5 turns, LLM waits with {wait}, {gc_setting} GC: "
        f"wall {wall:.2f} s (target <= 2.5 s), {turns} turns recorded"
    )
    print(
        f"    peak RSS {after / 1024:.0f} MiB (grew {(after - before) / 1024:.0f} MiB), "
        f"{(after - before) / n:.1f} KiB per entity (target <= 50 KiB); "
        f"{collections[0]} collections took {collections[1]:.2f} s"
    )


async def wait_floor(n: int, wait: str) -> None:
    """The same waits in the same number of tasks, without entities."""
    pause = WAITS[wait]

    async def waiter() -> None:
        for _ in range(5):
            await pause(0.05)

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(waiter)
    floor = time.perf_counter() - start
    print(f"    floor: {n} tasks x 5 waits with {wait}, no entities: {floor:.2f} s")


def run_many(n: int, wait: str, gc_setting: str) -> None:
    if gc_setting == "throughput":
        with cantrip.gc_for_throughput():
            trio.run(many_entities, n, wait, gc_setting)
    else:
        trio.run(many_entities, n, wait, gc_setting)


async def batch_waves() -> None:
    requests = [{"intent": f"part {i}"} for i in range(50)]
    latency = 0.05
    walls = []
    for _ in range(3):  # the first run also pays one-time costs (imports, caches)
        parent = cantrip.ScriptedLLM(
            [
                {"tool_calls": [{"gate": "call_agent_batch", "args": {"requests": requests}}]},
                {"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]},
            ]
        )
        spell = cantrip.Cantrip(
            llm=parent,
            identity=cantrip.Identity(),
            circle=cantrip.Circle([done, call_agent_batch], [cantrip.max_turns(3)]),
            llms={"child_llm": LatencyLLM(latency, 1)},
        )
        start = time.perf_counter()
        await spell.cast_async("fan out")
        walls.append(time.perf_counter() - start)
    wall = min(walls)
    ideal = math.ceil(50 / 8) * latency
    print(
        f"(b) batch of 50 under the default limit 8: {wall * 1000:.0f} ms (best of 3; first "
        f"{walls[0] * 1000:.0f} ms) vs ideal {ideal * 1000:.0f} ms "
        f"({(wall / ideal - 1) * 100:+.1f} %; target within 10 %)"
    )


class TreeLLM:
    """Root and children fan out by batch; leaves wait on their LLM 'forever'."""

    name = "tree"

    async def query(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Response:
        if any(t.name == "call_agent_batch" for t in tools):
            fan = 9 if messages[0].content == "root" else 10
            requests = [{"intent": f"leaf {i}"} for i in range(fan)]
            return Response(
                tool_calls=(cantrip.ToolCall("b", "call_agent_batch", {"requests": requests}),)
            )
        await trio.sleep(3600)
        raise AssertionError("unreachable")


async def cancel_tree() -> None:
    spell = cantrip.Cantrip(
        llm=TreeLLM(),
        identity=cantrip.Identity(system_prompt="root"),
        circle=cantrip.Circle(
            [done, call_agent_batch],
            [cantrip.max_turns(3), cantrip.max_depth(2), cantrip.Ward("max_concurrency", 10)],
        ),
    )
    loom = spell.loom
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(spell.cast_async, "grow a tree")
            while len(loom.entities) < 100 or len(loom) < 10:
                await trio.sleep(0.001)
            await trio.sleep(0.05)
            started = time.perf_counter()
            scope.cancel()
    elapsed = time.perf_counter() - started
    finals = [loom.last_turn(e) for e in loom.entities]
    recorded = sum(1 for t in finals if t is not None and t.truncated)
    print(
        f"(c) cancel a running tree of {len(loom.entities)} entities: all recorded in "
        f"{elapsed * 1000:.1f} ms ({recorded} truncated final turns; target <= 50 ms)"
    )


CONFIGURATIONS = (
    ("simulate_latency", "default"),
    ("simulate_latency", "throughput"),
    ("trio.sleep", "default"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=10_000)
    parser.add_argument("--only-a", nargs=2, metavar=("WAIT", "GC"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.only_a:  # one configuration of (a), in its own process
        wait, gc_setting = args.only_a
        run_many(args.entities, wait, gc_setting)
        trio.run(wait_floor, args.entities, wait)
        return
    for wait, gc_setting in CONFIGURATIONS:
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--entities",
                str(args.entities),
                "--only-a",
                wait,
                gc_setting,
            ],
            check=True,
        )
    trio.run(batch_waves)
    trio.run(cancel_tree)


if __name__ == "__main__":
    main()
