"""Helpers for the MCP tests: real server processes, started and stopped by the tests."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

import cantrip
from cantrip.mcp import MCPServer
from gates import done

SERVERS = Path(__file__).parent / "mcp_servers"
TOOLBOX = SERVERS / "toolbox.py"
MISBEHAVING = SERVERS / "misbehaving.py"
ODDNAMES = SERVERS / "oddnames.py"
PYTHON = sys.executable
BIN = Path(sys.executable).parent


def toolbox(marks: Path, **options: Any) -> MCPServer:
    """The SDK-written test server over stdio; it appends what it does to ``marks``."""
    options.setdefault("name", "tb")
    return MCPServer(
        command=PYTHON, args=[str(TOOLBOX)], env={"TOOLBOX_MARKS": str(marks)}, **options
    )


def misbehaving(mode: str, **options: Any) -> MCPServer:
    options.setdefault("name", "bad")
    return MCPServer(command=PYTHON, args=[str(MISBEHAVING), mode], **options)


def marks(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def wait_for_mark(path: Path, line: str, *, within_s: float = 20.0) -> None:
    """Poll the server's marks file until ``line`` appears (a real process's side)."""
    with trio.fail_after(within_s):
        while line not in marks(path):
            await trio.sleep(0.02)


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs. A zombie does not: an orphan's zombie waits for
    whoever adopted it to reap it, and some init processes never do."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state != b"Z"


def started_pids(path: Path) -> list[int]:
    return [int(line.split()[1]) for line in marks(path) if line.startswith("start ")]


def spell(
    script: Sequence[dict[str, Any]],
    *servers: MCPServer,
    gates: Sequence[cantrip.Gate] = (done,),
    medium: Any = None,
    max_turns: int = 8,
) -> cantrip.Cantrip:
    circle = (
        cantrip.Circle(gates, [cantrip.max_turns(max_turns)], providers=servers)
        if medium is None
        else cantrip.Circle(gates, [cantrip.max_turns(max_turns)], medium, providers=servers)
    )
    return cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(list(script)), identity=cantrip.Identity(), circle=circle
    )


def call(gate: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"gate": gate, "args": args}]}


def finish(answer: Any = "ok") -> dict[str, Any]:
    return call("done", answer=answer)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def wait_for_port(port: int, *, within_s: float = 30.0) -> None:
    with trio.fail_after(within_s):
        while True:
            try:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
            except OSError:
                await trio.sleep(0.05)
                continue
            await stream.aclose()
            return


@asynccontextmanager
async def running(command: Sequence[str], port: int, **env: str) -> AsyncIterator[None]:
    """A server process listening on ``port`` for the block; stopped (and reaped) after."""
    process = await trio.lowlevel.open_process(list(command), env={**os.environ, **env})
    try:
        await wait_for_port(port)
        yield
    finally:
        with trio.CancelScope(shield=True):
            process.terminate()
            with trio.move_on_after(10):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
