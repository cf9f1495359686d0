"""A turn at the cost of the wire: client CPU per turn against a lean server's per request.

Run: ``python bench/realsocket.py [--agents 1000] [--turns 5] [--history 10 200]``.

Two processes over real loopback sockets:

* the server, this script with ``--serve``: a lean OpenAI-compatible server on
  the standard library alone (``asyncio`` protocols, hand-parsed HTTP/1.1 with
  keep-alive, ``json``), answering ``POST .../chat/completions`` ``--latency``
  seconds after it read the request, with the completion of
  ``bench/loopback_openai.answer`` (``echo`` until the cast's last turn, then
  ``done``; the cast's length rides in its system prompt). It counts its
  requests and its own CPU, and reports both when asked on stdin, so each phase
  gets the server's CPU per request for exactly its requests;
* the client, this process: cantrip casts whose LLM is the OpenAI adapter as
  ``load_llm`` builds it (its default connection pool), gates ``done`` and
  ``echo``, an in-memory loom, CPython's default GC.

Phases (each a ``trio.run`` of its own, after a warm-up that pays the one-time
costs: imports, the adapter's pool, first connections):

1. ``--agents`` concurrent casts of ``--turns`` turns each: wall, client CPU
   per turn, server CPU per request, their ratio; casts not done, turns retried
   (and why), requests the server saw.
2. one cast at a time of N turns, for each N of ``--history`` (repeated so each
   N runs about ``--sequential-turns`` turns): client CPU per turn, server CPU
   per request, ratio; and the last N's per-turn cost over the first's
   (flatness: a turn must not cost more as the history grows).

``--floor`` adds, after phase 1, the same number of requests by the same number of
tasks without the runtime: through the adapter's pool and wire connections
(``ClientPool.post``), and on bare trio sockets -- the cost of the exchange alone,
so that the client's per-turn figure minus it is what the runtime spends.

Goals (issue 34): ratio <= 3x in both phases, no errors, and 1,000 x 5 in <= 1.5 s
wall. ``--profile FILE`` runs phase 1 under cProfile (GC off while profiling)
and prints the top functions by own time, scaled to microseconds per turn
(cProfile's own overhead inflates every figure: read them as shares).
On a shared machine read the CPU figures; wall includes whatever else runs.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import functools
import gc
import io
import logging
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio

HERE = Path(__file__).resolve().parent
KEY_ENV = "CANTRIP_BENCH_KEY"  # a placeholder key for the loopback server, not a secret


# -- the server (its own process) -----------------------------------------------------------


class Served:
    """What the server did since it started: requests answered."""

    requests = 0


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection: requests parsed by hand, answered after ``latency``."""

    def __init__(self, latency: float) -> None:
        from loopback_openai import answer  # the same completions as bench/concurrency.py's

        self.answer = answer
        self.latency = latency
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buffer[:end]).lower()
            at = head.find(b"\r\ncontent-length:")
            length = 0
            if at >= 0:
                stop = head.find(b"\r", at + 2)
                length = int(head[at + 17 : stop if stop >= 0 else len(head)])
            if len(buffer) < end + 4 + length:
                return
            target = head.split(b" ", 2)[1]
            body = bytes(buffer[end + 4 : end + 4 + length])
            del buffer[: end + 4 + length]
            self.loop.call_later(self.latency, self.respond, target, body)

    def respond(self, target: bytes, body: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if target.endswith(b"/chat/completions"):
            status, content = b"200 OK", self.answer(body)
        else:
            status, content = b"404 Not Found", b'{"error": {"message": "not found"}}'
        Served.requests += 1
        self.transport.write(
            b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (status, len(content), content)
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


async def serve(latency: float) -> None:
    """Listen on an ephemeral loopback port; answer ``stats`` on stdin until stdin closes."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: Connection(latency), "127.0.0.1", 0, backlog=65535, reuse_address=True
    )
    print(f"port {server.sockets[0].getsockname()[1]}", flush=True)
    closed = loop.create_future()
    stdin = sys.stdin.buffer.raw  # type: ignore[attr-defined]

    def command() -> None:
        line = stdin.readline()
        if not line:
            loop.remove_reader(stdin.fileno())
            closed.set_result(None)
        else:
            print(f"requests {Served.requests} cpu {time.process_time():.6f}", flush=True)

    loop.add_reader(stdin.fileno(), command)
    await closed
    server.close()


# -- the client (this process) --------------------------------------------------------------


class Server:
    """The ``--serve`` process; :meth:`stats` is (requests, CPU seconds) so far."""

    def __init__(self, latency: float) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve", "--latency", str(latency)],
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

    def stats(self) -> tuple[int, float]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("stats\n")
        self.process.stdin.flush()
        _, requests, _, cpu = self.process.stdout.readline().split()
        return int(requests), float(cpu)

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=60)


class RetryReasons(logging.Handler):
    """Why turns needed a retry: the errors the retry policy announces."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: collections.Counter[str] = collections.Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.seen[record.getMessage().split("): ", 1)[-1][:160]] += 1


class Phase:
    """One measured stretch: client CPU and wall here, the server's requests and CPU there;
    the client's cyclic-GC collections and their CPU (``gc.callbacks``)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.collections = 0
        self.gc_cpu = 0.0

    def _collected(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.gc_cpu -= time.process_time()
        else:
            self.collections += 1
            self.gc_cpu += time.process_time()

    def __enter__(self) -> Phase:
        gc.callbacks.append(self._collected)
        self.requests, self.server_cpu = self.server.stats()
        self.cpu = time.process_time()
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.start
        self.cpu = time.process_time() - self.cpu
        gc.callbacks.remove(self._collected)
        requests, server_cpu = self.server.stats()
        self.requests = requests - self.requests
        self.server_cpu = server_cpu - self.server_cpu

    def figures(self, turns: int) -> tuple[float, float, float]:
        """(client us per turn, server us per request, their ratio)."""
        client = self.cpu / turns * 1e6
        server = self.server_cpu / max(self.requests, 1) * 1e6
        return client, server, client / server if server else float("inf")


def spell_for(llm: object, turns: int) -> object:
    import cantrip
    from gates import done, echo

    return cantrip.Cantrip(
        llm=llm,  # type: ignore[arg-type]
        identity=cantrip.Identity(system_prompt=f"bench turns={turns}"),
        circle=cantrip.Circle([done, echo], [cantrip.max_turns(turns + 1)]),
    )


async def casts(llm: object, agents: int, turns: int, repeats: int = 1) -> list[object]:
    """``repeats`` rounds of ``agents`` concurrent casts of ``turns`` turns; their looms' turns."""
    spell: object = None
    recorded: list[object] = []
    for _ in range(repeats):
        spell = spell_for(llm, turns)
        async with trio.open_nursery() as nursery:
            for i in range(agents):
                nursery.start_soon(functools.partial(spell.cast_async, f"task {i}"))  # type: ignore[attr-defined]
        recorded.extend(spell.loom.turns)  # type: ignore[attr-defined]
    return recorded


def outcome(turns: list[object], casts_run: int) -> tuple[int, int]:
    """(casts not done, turns retried)."""
    done = sum(1 for t in turns if t.reason == "done")  # type: ignore[attr-defined]
    retried = sum(1 for t in turns if t.metadata.attempts > 1)  # type: ignore[attr-defined]
    return casts_run - done, retried


def top_of(profiler: cProfile.Profile, turns: int, count: int = 25) -> str:
    """The profile's top functions by own time, in microseconds per turn."""
    stats = pstats.Stats(profiler)
    rows = []
    for (file, line, name), (_cc, calls, own, cumulative, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{Path(file).name}:{line}({name})" if line else name
        rows.append((own, cumulative, calls, where))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    out = io.StringIO()
    print(
        f"    cProfile: {total / turns * 1e6:.0f} us/turn profiled in all; "
        "top by own time (us/turn own, cumulative, calls/turn):",
        file=out,
    )
    for own, cumulative, calls, where in rows[:count]:
        print(
            f"    {own / turns * 1e6:8.1f} {cumulative / turns * 1e6:8.1f} "
            f"{calls / turns:6.1f}  {where}",
            file=out,
        )
    return out.getvalue()


async def floor_pool(url: str, agents: int, turns: int, body: bytes) -> None:
    """``agents`` tasks of ``turns`` POSTs each through an adapter's connection pool and
    wire connections (``ClientPool.post``; the body read with orjson): no runtime."""
    import httpx
    import orjson

    from cantrip.llm.providers._clients import ClientPool

    pool = ClientPool(timeout=httpx.Timeout(60.0), trust_env=False, provider="openai")
    headers = {"content-type": "application/json", "accept": "application/json"}

    async def agent() -> None:
        for _ in range(turns):
            _status, _headers, content = await pool.post(url, body, headers)
            orjson.loads(content)

    async with trio.open_nursery() as nursery:
        for _ in range(agents):
            nursery.start_soon(agent)


async def floor_bare(port: int, agents: int, turns: int, body: bytes) -> None:
    """The same exchanges on bare trio sockets: a request written by hand, the response
    read up to its ``content-length`` and parsed with orjson, one connection a task."""
    import orjson

    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    )

    async def agent() -> None:
        sock = trio.socket.socket()
        await sock.connect(("127.0.0.1", port))
        buffer = b""
        for _ in range(turns):
            await sock.send(request)
            while True:
                buffer += await sock.recv(65536)
                end = buffer.find(b"\r\n\r\n")
                if end < 0:
                    continue
                head = buffer[:end].lower()
                length = int(head.partition(b"content-length: ")[2].partition(b"\r")[0])
                if len(buffer) >= end + 4 + length:
                    orjson.loads(buffer[end + 4 : end + 4 + length])
                    buffer = buffer[end + 4 + length :]
                    break
        sock.close()

    async with trio.open_nursery() as nursery:
        for _ in range(agents):
            nursery.start_soon(agent)


def floors(server: Server, args: argparse.Namespace) -> None:
    """The wire's own cost beside the server's: what a turn cannot cost less than."""
    import orjson

    body = orjson.dumps(
        {
            "model": "gpt-4o-mini",
            "messages": [
                {"role": "system", "content": f"bench turns={args.turns}"},
                {"role": "user", "content": "task 0"},
            ],
        }
    )
    url = f"http://127.0.0.1:{server.port}/v1/chat/completions"
    requests = args.agents * args.turns
    for name, run_floor in (
        (
            "adapter's pool and wire, no runtime",
            lambda: floor_pool(url, args.agents, args.turns, body),
        ),
        ("bare trio sockets", lambda: floor_bare(server.port, args.agents, args.turns, body)),
    ):
        with Phase(server) as phase:
            trio.run(run_floor)
        client, served, ratio = phase.figures(requests)
        print(
            f"    floor, {name}: client {client:.0f} us/request; server {served:.0f} "
            f"us/request; ratio {ratio:.1f}x; wall {phase.wall:.2f} s"
        )


def run(args: argparse.Namespace) -> None:
    from cantrip.llm import load_llm

    os.environ[KEY_ENV] = "sk-loopback-bench"
    server = Server(args.latency)
    try:

        def adapter() -> Any:
            """A fresh adapter: each phase starts with no memo of another's conversations."""
            llm = load_llm(
                "openai",
                "gpt-4o-mini",
                base_url=f"http://127.0.0.1:{server.port}/v1",
                api_key_env=KEY_ENV,
            )
            if args.connections:
                llm.max_connections = args.connections  # type: ignore[attr-defined]
            return llm

        llm = adapter()
        trio.run(casts, llm, 50, 3)  # warm-up: imports, the pool, first connections
        if args.gc == "cantrip":
            gc.freeze()  # as cantrip serve does once it loaded its spec (cli._process.settled_heap)
        reasons = RetryReasons()
        retry_log = logging.getLogger("cantrip.llm.retry")
        retry_log.setLevel(logging.INFO)
        retry_log.addHandler(reasons)
        print(
            f"lean stdlib server (own process), {args.latency * 1000:.0f} ms latency; "
            f"client: OpenAI adapter, pool of {llm.max_connections} connections, {args.gc} GC"  # type: ignore[attr-defined]
        )

        profiler = cProfile.Profile(time.thread_time) if args.profile else None
        turns_total = args.agents * args.turns
        with Phase(server) as phase:
            if profiler is not None:
                gc.disable()
                profiler.enable()
            recorded = trio.run(casts, llm, args.agents, args.turns)
            if profiler is not None:
                profiler.disable()
                gc.enable()
        failed, retried = outcome(recorded, args.agents)
        client, served, ratio = phase.figures(len(recorded))
        print(
            f"{args.agents} agents x {args.turns} turns: wall {phase.wall:.2f} s (goal <= 1.5 s), "
            f"client CPU {phase.cpu:.2f} s = {client:.0f} us/turn; server {served:.0f} us/request; "
            f"ratio {ratio:.1f}x (goal <= 3x)"
        )
        print(
            f"    {len(recorded)} turns recorded (of {turns_total}), {phase.requests} requests "
            f"served, {failed} casts not done, {retried} turns retried; "
            f"{phase.collections} GC collections took {phase.gc_cpu * 1e6 / len(recorded):.0f} "
            "us/turn of CPU"
        )
        for reason, count in reasons.seen.most_common(3):
            print(f"    retried {count}x: {reason}")
        if args.floor:
            floors(server, args)
        if profiler is not None:
            profiler.dump_stats(args.profile)
            print(top_of(profiler, len(recorded)))

        per_turn: list[float] = []
        for n in args.history:
            repeats = max(1, args.sequential_turns // n)
            del recorded, llm  # the last phase's looms and memos are not this one's heap
            gc.collect()
            llm = adapter()
            with Phase(server) as phase:
                recorded = trio.run(casts, llm, 1, n, repeats)
            failed, retried = outcome(recorded, repeats)
            client, served, ratio = phase.figures(len(recorded))
            per_turn.append(client)
            print(
                f"1 agent x {n} turns (x{repeats}, sequential): client {client:.0f} us/turn; "
                f"server {served:.0f} us/request; ratio {ratio:.1f}x (goal <= 3x); "
                f"{failed} casts not done, {retried} turns retried; "
                f"GC {phase.gc_cpu * 1e6 / len(recorded):.0f} us/turn"
            )
        if len(per_turn) > 1:
            print(
                f"    flatness: {args.history[-1]} turns cost {per_turn[-1] / per_turn[0]:.2f}x "
                f"per turn what {args.history[0]} turns cost (goal: ~1)"
            )
        retry_log.removeHandler(reasons)
    finally:
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--history", type=int, nargs="+", default=[10, 200])
    parser.add_argument(
        "--sequential-turns", type=int, default=200, help="turns per N of --history (repeats)"
    )
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--connections", type=int, help="the adapter's max_connections")
    parser.add_argument("--profile", metavar="FILE", help="cProfile phase 1 into FILE")
    parser.add_argument(
        "--floor",
        action="store_true",
        help="after phase 1, the same requests through the adapter's pool alone, "
        "then on bare trio sockets: the wire's cost without the runtime",
    )
    parser.add_argument(
        "--gc",
        choices=("default", "throughput", "cantrip"),
        default="default",
        help="CPython's collector settings; cantrip.gc_for_throughput() around the phases; "
        "or what cantrip serve and worker run under: that, and gc.freeze() after the warm-up",
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.latency))
        return
    sys.path.insert(0, str(HERE.parent))  # gates/
    if args.gc in ("throughput", "cantrip"):
        import cantrip

        with cantrip.gc_for_throughput():
            run(args)
    else:
        run(args)


if __name__ == "__main__":
    main()
