"""Concurrency benchmarks: many entities at once, batch waves, cancelling a tree.

Run: ``python bench/concurrency.py [--entities 1000 10000]``. Prints:

(a) The headline: N concurrent entities, 5 turns each, in one process and one
    in-memory loom, under CPython's default collector settings, whose LLM is
    the real OpenAI adapter (``load_llm("openai", ...)``) talking HTTP to a
    loopback OpenAI-compatible server (``bench/loopback_openai.py``, its own
    process) that answers each request after 50 ms. Wall time, peak RSS, RSS
    per entity, collections. Printed for 1,000 and 10,000 entities side by
    side with their floor: the same number of bare trio tasks doing the same
    socket waits (5 keep-alive HTTP requests each to the same server, no
    entity, no httpx, no JSON). Targets: <= 2.5 s wall, <= 50 KiB per entity.
    The adapter gets an ``httpx.AsyncClient`` whose pool holds one connection
    per entity (the default 256 connections would queue them; pass ``client=`` to
    ``load_llm`` to size yours).
(a') The same loop without sockets, for comparison: the LLM waits in-process
    with ``cantrip.llm.simulate_latency`` (default GC, and inside
    ``cantrip.gc_for_throughput()``) or ``trio.sleep``, with trio's floor for
    the same waits. This measures the runtime alone; (a) is what a user runs.
(b) a batch of 50 children (each one 50 ms LLM turn) under the default
    concurrency limit of 8, against the ideal ceil(50 / 8) waves.
    Target: within 10 %.
(c) time from cancelling a running tree of 100 entities (1 root, 9 children,
    90 grandchildren, all waiting on their LLM) until every one of them has
    recorded its final, truncated turn. Target: <= 50 ms.

Each configuration of (a) and (a') runs in a fresh process, so its peak RSS is
its own.
"""

from __future__ import annotations

import argparse
import collections
import functools
import gc
import logging
import math
import os
import resource
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import trio

import cantrip
from cantrip.llm import Message, Response, ToolChoice, ToolDefinition, load_llm, simulate_latency
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


SERVER = Path(__file__).with_name("loopback_openai.py")
KEY_ENV = "CANTRIP_BENCH_KEY"  # a placeholder key for the loopback server, not a secret


class GcCount:
    """Counts collections and the CPU time they take, through ``gc.callbacks``
    (CPU, not wall: on a shared machine a collection may be descheduled)."""

    def __init__(self) -> None:
        self.count = 0
        self.seconds = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.seconds -= time.process_time()
        else:
            self.count += 1
            self.seconds += time.process_time()


class RetryReasons(logging.Handler):
    """Why turns needed a retry: the errors the retry policy announces."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: collections.Counter[str] = collections.Counter()

    def emit(self, record: logging.LogRecord) -> None:
        # "retrying <llm> in <s>s (attempt <n> of <m>): <the error>" -> the error
        self.seen[record.getMessage().split("): ", 1)[-1][:160]] += 1


SHARD = 100
"""Entities per adapter in the sharded configuration: httpcore's pool scans every
connection it holds for every request, so one pool of 10,000 connections costs
O(n) per request; a pool of 100 per 100 entities keeps that constant."""


async def socket_entities(n: int, port: int, pool: str) -> None:
    """(a): entities whose LLM is the OpenAI adapter, waiting on a loopback socket.

    ``pool``: ``default`` -- one adapter as ``load_llm`` builds it (its own client,
    up to 256 connections); ``sharded`` -- one adapter per 100 entities, each given an
    ``httpx.AsyncClient`` with 100 connections (``load_llm(client=...)``).
    """
    os.environ[KEY_ENV] = "sk-loopback-bench"
    clients: list[httpx.AsyncClient] = []

    def adapter(client: httpx.AsyncClient | None) -> cantrip.LLM:
        return load_llm(
            "openai",
            "gpt-4o-mini",
            base_url=f"http://127.0.0.1:{port}",
            api_key_env=KEY_ENV,
            client=client,
        )

    if pool == "default":
        llms = [adapter(None)]
    else:
        limits = httpx.Limits(max_connections=SHARD, max_keepalive_connections=SHARD)
        clients = [httpx.AsyncClient(limits=limits, timeout=120) for _ in range(0, n, SHARD)]
        llms = [adapter(c) for c in clients]
    spell = cantrip.Cantrip(
        llm=llms[0],
        identity=cantrip.Identity(system_prompt="bench"),
        circle=cantrip.Circle([done, echo], [cantrip.max_turns(6)]),
    )
    collected = GcCount()
    reasons = RetryReasons()
    retry_log = logging.getLogger("cantrip.llm.retry")
    retry_log.setLevel(logging.INFO)
    retry_log.addHandler(reasons)
    before = rss_kib()
    gc.callbacks.append(collected)
    cpu = time.process_time()
    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(
                functools.partial(spell.cast_async, f"task {i}", llm=llms[i // SHARD % len(llms)])
            )
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu
    gc.callbacks.remove(collected)
    retry_log.removeHandler(reasons)
    for client in clients:
        await client.aclose()
    after = rss_kib()
    turns = list(spell.loom.turns)
    retried = sum(1 for t in turns if t.metadata.attempts > 1)
    done_casts = sum(1 for t in turns if t.reason == "done")
    shape = (
        "one adapter, its default 256 connections"
        if pool == "default"
        else (f"{len(llms)} adapters, a pool of {SHARD} each")
    )
    print(
        f"(a) {n} entities x 5 turns, OpenAI adapter ({shape}) -> loopback server "
        f"(50 ms), default GC: wall {wall:.2f} s (target <= 2.5 s), CPU {cpu:.2f} s"
    )
    print(
        f"    {len(turns)} turns recorded, {done_casts} casts done, {retried} turns retried; "
        f"peak RSS {after / 1024:.0f} MiB (grew {(after - before) / 1024:.0f} MiB), "
        f"{(after - before) / n:.1f} KiB per entity (target <= 50 KiB); "
        f"{collected.count} collections took {collected.seconds:.2f} s of CPU"
    )
    for reason, count in reasons.seen.most_common(3):
        print(f"    retried {count}x: {reason}")


async def socket_floor(n: int, port: int) -> None:
    """(a) floor: bare trio tasks, 5 keep-alive requests each to the same server."""
    request = b"GET /wait HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"

    async def waiter() -> None:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            for _ in range(5):
                await stream.send_all(request)
                received = b""
                while not received.endswith(b"\r\n\r\nok"):
                    data = await stream.receive_some(4096)
                    if not data:
                        raise ConnectionError("the loopback server closed the connection")
                    received += data

    before = rss_kib()
    cpu = time.process_time()
    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(waiter)
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu
    print(
        f"(a) floor: {n} bare trio tasks x 5 requests on their own sockets to the same server: "
        f"wall {wall:.2f} s, CPU {cpu:.2f} s, RSS grew {(rss_kib() - before) / 1024:.0f} MiB"
    )


class LoopbackServer:
    """``bench/loopback_openai.py`` in its own process, for one configuration."""

    def __init__(self, delay: float = 0.05) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(SERVER), "--delay", str(delay)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().split()
        if len(line) != 2 or line[0] != "port":
            self.close()
            raise RuntimeError(f"the loopback server did not start: {line}")
        self.port = int(line[1])

    def close(self) -> str:
        """Stop the server (it stops when its stdin closes); its CPU time, as printed."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        rest = self.process.stdout.read()
        self.process.wait(timeout=60)
        return rest.split()[-1] if rest.strip() else "?"


def run_socket(n: int, what: str) -> None:
    """One configuration of (a), in this (fresh) process, against a fresh server."""
    server = LoopbackServer()
    try:
        if what == "floor":
            trio.run(socket_floor, n, server.port)
        else:
            trio.run(socket_entities, n, server.port, what)
    finally:
        print(f"    the loopback server used {server.close()} s of CPU")


async def many_entities(n: int, wait: str, gc_setting: str) -> None:
    spell = cantrip.Cantrip(
        llm=LatencyLLM(0.05, 5, WAITS[wait]),
        identity=cantrip.Identity(system_prompt="bench"),
        circle=cantrip.Circle([done, echo], [cantrip.max_turns(6)]),
    )
    collected = GcCount()
    before = rss_kib()
    gc.callbacks.append(collected)
    cpu = time.process_time()
    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(spell.cast_async, f"task {i}")
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu
    gc.callbacks.remove(collected)
    after = rss_kib()
    turns = len(spell.loom)
    print(
        f"(a') {n} entities x 5 turns, LLM waits in-process with {wait}, {gc_setting} GC: "
        f"wall {wall:.2f} s, CPU {cpu:.2f} s, {turns} turns recorded"
    )
    print(
        f"    peak RSS {after / 1024:.0f} MiB (grew {(after - before) / 1024:.0f} MiB), "
        f"{(after - before) / n:.1f} KiB per entity; "
        f"{collected.count} collections took {collected.seconds:.2f} s of CPU"
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


def _child(*args: str) -> None:
    subprocess.run([sys.executable, __file__, *args], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, nargs="+", default=[1_000, 10_000])
    parser.add_argument("--only-a", nargs=2, metavar=("WAIT", "GC"), help=argparse.SUPPRESS)
    parser.add_argument("--only-socket", metavar="WHAT", help=argparse.SUPPRESS)
    parser.add_argument(
        "--pools",
        default="default,sharded",
        help="configurations of (a) to run, comma-separated: default, sharded",
    )
    parser.add_argument("--skip-synthetic", action="store_true", help="leave out (a')")
    args = parser.parse_args()
    if args.only_socket:  # one configuration of (a), in its own process
        run_socket(args.entities[0], args.only_socket)
        return
    if args.only_a:  # one configuration of (a'), in its own process
        wait, gc_setting = args.only_a
        run_many(args.entities[0], wait, gc_setting)
        trio.run(wait_floor, args.entities[0], wait)
        return
    for n in args.entities:
        for what in [*args.pools.split(","), "floor"]:
            _child("--entities", str(n), "--only-socket", what)
    if not args.skip_synthetic:
        for wait, gc_setting in CONFIGURATIONS:
            _child("--entities", str(max(args.entities)), "--only-a", wait, gc_setting)
    trio.run(batch_waves)
    trio.run(cancel_tree)


if __name__ == "__main__":
    main()
