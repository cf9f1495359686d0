"""Soak: clients that hang up mid-stream cost the server nothing once they are gone
(issue 29).

hypercorn closes a connection only when its request's task ends, and a streamed
prompt's task used to live as long as its cast: 30 streams abandoned per round left
about 30 more sockets open each round (12 -> 132 file descriptors over 4 rounds with
10 s casts), held until the casts ended. Now the cast runs in the server's own
nursery and the request ends when its client hangs up. 1,000 streams abandoned
after their first step: the server's file descriptors are back at the starting count
right after each round, while the casts still run, and once they have all ended the
objects a connection holds (channels, prompts, hypercorn streams, sockets) are back
at their starting count and memory did not grow beyond what the recorded turns take.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import pytest
import trio

import cantrip
from cantrip.llm import Message, Response, ToolChoice, ToolDefinition
from cantrip.protocols.http._serve import process_server, serve_asgi
from cantrip.protocols.middleware._arriving import arrivals
from cantrip.protocols.middleware._guard import Guard
from gates import done, echo

pytestmark = [pytest.mark.soak, pytest.mark.timeout(600)]

ROUNDS, PER_ROUND = 20, 50  # 1,000 abandoned streams


class SteppingLLM:
    """Two turns (echo, then done); a cast's first call waits for :attr:`release`, so
    every cast of a round outlives the client that hung up after its first step."""

    name = "stepping"

    def __init__(self) -> None:
        self.release = trio.Event()

    async def query(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Response:
        await self.release.wait()
        if messages[-1].role != "user":  # the echo's result is in: the cast's second turn
            return Response(tool_calls=(cantrip.ToolCall("d", "done", {"answer": "ok"}),))
        return Response(tool_calls=(cantrip.ToolCall("e", "echo", {"text": "step"}),))


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_kib() -> int:
    with open("/proc/self/status") as status:
        line = next(x for x in status if x.startswith("VmRSS:"))
    return int(line.split()[1])


def held() -> dict[str, int]:
    """Live objects a served connection or prompt holds, by type name."""
    gc.collect()
    names = {
        "Prompt", "MemorySendChannel", "MemoryReceiveChannel", "HTTPStream", "H11Protocol",
        "TCPServer", "SocketStream", "_SocketType", "SocketType",
    }  # fmt: skip
    counts = dict.fromkeys(sorted(names), 0)
    for obj in gc.get_objects():
        name = type(obj).__name__
        if name in counts:
            counts[name] += 1
    return counts


async def test_a_thousand_abandoned_streams_leave_no_sockets_and_no_growth() -> None:
    llm = SteppingLLM()
    spell = cantrip.Cantrip(
        llm=llm,
        identity=cantrip.Identity(system_prompt="soak"),
        circle=cantrip.Circle([done, echo], [cantrip.max_turns(3)]),
    )
    server = process_server(spell)  # served as serve_http serves it, its hub at hand
    app, backend = server.app, server.backend
    async with backend.running(), trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve_asgi(
                app,
                arrivals(Guard().wrap(app), backend.announce),
                "127.0.0.1",
                0,
                shutdown_trigger=None,
                read_timeout_s=30,
                task_status=task_status,
            )
        )
        base = binds[0]
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            sessions = [
                (await http.post("/sessions")).json()["session_id"] for _ in range(PER_ROUND)
            ]

        async def abandon(client: httpx.AsyncClient, sid: str) -> None:
            async with client.stream(
                "POST", f"/sessions/{sid}/prompt?stream=1", json={"prompt": "go"}
            ) as response:
                async for line in response.aiter_lines():
                    if line == "event: step_start":
                        return  # hang up mid-stream: the connection is closed

        async def round_of_streams() -> int:
            limits = httpx.Limits(max_connections=PER_ROUND)
            async with (
                httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client,
                trio.open_nursery() as clients,
            ):
                for sid in sessions:
                    clients.start_soon(abandon, client, sid)
            with trio.fail_after(20):  # every socket goes as its client hangs up...
                while open_fds() > baseline:
                    await trio.sleep(0.01)
            after = open_fds()
            assert backend.hub.running == PER_ROUND  # ...while every cast still runs
            llm.release.set()
            with trio.fail_after(60):
                await backend.hub._idle.wait()  # and ends, recorded
                while backend.nursery is not None and backend.nursery.child_tasks:
                    await trio.sleep(0.01)  # (their tasks' last checkpoint)
            llm.release = trio.Event()
            return after

        baseline = open_fds() + 2  # (a little slack for the client's own sockets)

        await round_of_streams()  # warm-up: caches, pools, lazy imports
        fds, objects, rss = open_fds(), held(), rss_kib()
        baseline = fds
        worst = max([await round_of_streams() for _ in range(ROUNDS - 1)])
        fds_end, objects_end, rss_end = open_fds(), held(), rss_kib()
        nursery.cancel_scope.cancel()
    turns = spell.loom.turns
    assert len(turns) == 2 * PER_ROUND * ROUNDS  # every abandoned cast ran to its end
    assert {t.reason for t in turns if t.terminated} == {"done"}
    print(f"fds {fds} -> worst {worst} -> {fds_end}; rss {rss} -> {rss_end} KiB; {objects_end}")
    assert worst <= fds and fds_end <= fds  # not +50 per round
    assert objects_end == objects
    # what stays is the loom's 2,000 turns (in memory here) -- well under 40 MiB
    assert rss_end - rss < 40 * 1024
