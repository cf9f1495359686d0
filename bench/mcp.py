"""What an MCP tool costs compared with a plain Python gate.

What it measures
----------------
1. **Per-call overhead over stdio.** One long-lived entity per configuration
   (its session is opened, and one warm-up cast run, before timing), then one
   cast of ``N`` turns, each turn one call of an ``add(a, b)`` gate, with a
   :class:`cantrip.ScriptedLLM` that answers instantly. Configurations:

   * ``python gate`` -- ``add`` written with ``cantrip.gate`` (in process);
   * ``mcp stdio`` -- the same ``add`` as a tool of the test server
     ``tests/mcp_servers/toolbox.py`` (official SDK, ``MCPServer``), a child
     process spoken to over stdio;
   * ``sdk direct`` -- ``mcp.Client.call_tool("add")`` on the same server with
     no cantrip in between: the floor the SDK and the process boundary set.

   Reported: the gate call as the gate-call boundary timed it
   (``GateCallRecord.duration_ms``; median and p95 over the ``N`` calls), and
   the wall time per turn of the whole cast. For ``sdk direct``, the time of
   each ``call_tool``.

2. **Start-up cost of a server session.** ``MCPServer.open()`` (spawn,
   handshake, ``tools/list``) and closing it again, ``--repeats`` times each,
   for the toolbox server and for the published ``mcp-server-time``.

Every configuration runs in its own ``trio.run``. On this project's machines
(2 shared cores) treat the figures as orders of magnitude.

How to run
----------
From the repository root::

    python bench/mcp.py              # N = 200 calls x 3 rounds, 5 start-ups per server
    python bench/mcp.py --calls 1000 --rounds 5 --repeats 10
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# This script shares its name with the SDK's package: keep its own folder off the
# import path, or ``import mcp`` would find this file.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import trio  # noqa: E402

import cantrip  # noqa: E402
from cantrip.mcp import MCPServer  # noqa: E402
from gates import done  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOOLBOX = ROOT / "tests" / "mcp_servers" / "toolbox.py"
BIN = Path(sys.executable).parent


@cantrip.gate
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _script(gate: str, n: int) -> list[dict[str, Any]]:
    turns = [{"tool_calls": [{"gate": gate, "args": {"a": i, "b": 1}}]} for i in range(n)]
    return [*turns, {"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]}]


def _toolbox() -> MCPServer:
    return MCPServer(name="tb", command=sys.executable, args=[str(TOOLBOX)])


async def _calls(provider: MCPServer | None, n: int) -> tuple[list[float], float]:
    gate = "add" if provider is None else "tb_add"
    warm = _script(gate, 3)
    script = warm + _script(gate, n)
    circle = cantrip.Circle(
        [done] if provider else [done, add],
        [cantrip.max_turns(n + 5)],
        providers=[provider] if provider else [],
    )
    spell = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(script), identity=cantrip.Identity(), circle=circle
    )
    async with spell.summon() as entity:
        await entity.send("warm up")
        started = time.perf_counter()
        outcome = await entity.send("timed")
        wall = time.perf_counter() - started
    records = [t.gate_calls[0] for t in outcome.turns[:-1]]
    assert all(not r.is_error for r in records), records[:1]
    return [r.duration_ms for r in records], wall / len(outcome.turns) * 1e3


async def _sdk_direct(n: int) -> list[float]:
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=[str(TOOLBOX)])
    durations = []
    async with Client(params) as client:
        await client.call_tool("add", {"a": 0, "b": 1})
        for i in range(n):
            started = time.perf_counter()
            await client.call_tool("add", {"a": i, "b": 1})
            durations.append((time.perf_counter() - started) * 1e3)
    return durations


async def _startup(server: MCPServer, repeats: int) -> tuple[list[float], list[float]]:
    opens, closes = [], []
    async with trio.open_nursery() as nursery:
        for _ in range(repeats):
            started = time.perf_counter()
            opened = await server.open(nursery)
            opens.append((time.perf_counter() - started) * 1e3)
            started = time.perf_counter()
            await opened.aclose()
            closes.append((time.perf_counter() - started) * 1e3)
    return opens, closes


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    n = args.calls

    print(f"per-call cost, {n} calls, best of {args.rounds} rounds (ms)")
    print(f"  {'configuration':<14} {'call p50':>9} {'call p95':>9} {'turn (wall)':>12}")
    best: dict[str, tuple[float, float, float]] = {}
    for _ in range(args.rounds):  # interleaved, so a noisy moment hits every configuration
        for label, provider in (("python gate", None), ("mcp stdio", _toolbox())):
            calls, turn = trio.run(_calls, provider, n)
            figures = (statistics.median(calls), _p(calls, 0.95), turn)
            best[label] = min(best.get(label, figures), figures)
        direct = trio.run(_sdk_direct, n)
        figures = (statistics.median(direct), _p(direct, 0.95), float("nan"))
        best["sdk direct"] = min(best.get("sdk direct", figures), figures)
    for label, (p50, p95, turn) in best.items():
        wall = "" if turn != turn else f"{turn:12.3f}"  # NaN: no turns to time
        print(f"  {label:<14} {p50:9.3f} {p95:9.3f} {wall}")
    print(
        f"  an MCP call costs {best['mcp stdio'][0] - best['python gate'][0]:.3f} ms more than "
        f"a python gate (p50); cantrip adds {best['mcp stdio'][0] - best['sdk direct'][0]:.3f} "
        "ms to the bare SDK call (p50)"
    )

    print(f"\nserver session start-up and close, {args.repeats} times (ms)")
    print(f"  {'server':<16} {'open p50':>9} {'open max':>9} {'close p50':>10}")
    servers = {
        "toolbox (SDK)": _toolbox(),
        "mcp-server-time": MCPServer(
            name="time", command=str(BIN / "mcp-server-time"), args=["--local-timezone", "UTC"]
        ),
    }
    for label, server in servers.items():
        opens, closes = trio.run(_startup, server, args.repeats)
        print(
            f"  {label:<16} {statistics.median(opens):9.1f} {max(opens):9.1f} "
            f"{statistics.median(closes):10.1f}"
        )


if __name__ == "__main__":
    main()
