"""Concurrency benchmarks: many entities at once, batch waves, cancelling a tree.

Run: ``python bench/concurrency.py [--entities 10000]``. Prints:

(a) N concurrent entities, 5 turns each, against an LLM with 50 ms latency, in
    one process and one in-memory loom: wall time, peak RSS, RSS per entity.
    Targets: <= 2.5 s wall, <= 50 KiB per entity on a 2-core machine.
(b) a batch of 50 children (each one 50 ms LLM turn) under the default
    concurrency limit of 8, against the ideal ceil(50 / 8) waves.
    Target: within 10 % of ideal.
(c) time from cancelling a running tree of 100 entities (1 root, 9 children,
    90 grandchildren, all waiting on their LLM) until every one of them has
    recorded its final, truncated turn. Target: <= 50 ms.
"""

from __future__ import annotations

import argparse
import math
import resource
import time
from collections.abc import Mapping, Sequence
from typing import Any

import trio

import cantrip
from cantrip.llm import Message, Response, ToolChoice, ToolDefinition
from gates import call_agent_batch, done, echo


class LatencyLLM:
    """Echoes for ``turns - 1`` turns, then done; every answer after ``latency_s``."""

    name = "latency"

    def __init__(self, latency_s: float, turns: int) -> None:
        self.latency_s = latency_s
        self.turns = turns

    async def query(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Response:
        await trio.sleep(self.latency_s)
        answered = sum(1 for m in messages if m.role == "assistant")
        if answered + 1 >= self.turns:
            call = cantrip.ToolCall(f"d{answered}", "done", {"answer": "ok"})
        else:
            call = cantrip.ToolCall(f"e{answered}", "echo", {"text": "step"})
        return Response(tool_calls=(call,))


def rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


async def many_entities(n: int) -> None:
    spell = cantrip.Cantrip(
        llm=LatencyLLM(0.05, 5),
        identity=cantrip.Identity(system_prompt="bench"),
        circle=cantrip.Circle([done, echo], [cantrip.max_turns(6)]),
    )
    before = rss_kib()
    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(spell.cast_async, f"task {i}")
    wall = time.perf_counter() - start
    after = rss_kib()
    turns = len(spell.loom)
    print(f"(a) {n} entities x 5 turns: wall {wall:.2f} s, {turns} turns recorded")
    print(
        f"    peak RSS {after / 1024:.0f} MiB (grew {(after - before) / 1024:.0f} MiB), "
        f"{(after - before) / n:.1f} KiB per entity (targets: <= 2.5 s, <= 50 KiB)"
    )


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=10_000)
    args = parser.parse_args()
    trio.run(many_entities, args.entities)
    trio.run(batch_waves)
    trio.run(cancel_tree)


if __name__ == "__main__":
    main()
