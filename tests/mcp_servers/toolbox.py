"""An MCP server for the tests, written with the official SDK (``mcp.server.MCPServer``).

Run as ``python toolbox.py`` (stdio) or ``python toolbox.py --http PORT`` (streamable
HTTP on 127.0.0.1). Its tools cover what the MCP client must handle: plain and
structured results, a tool error (``isError``), progress notifications, a call that
waits until it is cancelled, a call that kills the server mid-call, a call that
starts a grandchild process, and a huge result.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel

server = MCPServer("toolbox", version="1.0", log_level="WARNING")
MARKS = Path(os.environ.get("TOOLBOX_MARKS", os.devnull))
"""A file the server appends lines to (``cancelled <id>``), so tests can see its side."""
WIRE = os.dup(1)
"""The stdout the server was started with (over stdio: the pipe to the client)."""


def _mark(line: str) -> None:
    if str(MARKS) != os.devnull:
        with MARKS.open("a") as f:
            f.write(line + "\n")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    _mark(f"call add {a} {b}")
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Say the text back."""
    return text


class Weather(BaseModel):
    city: str
    celsius: float


@server.tool()
def weather(city: str) -> Weather:
    """Structured content: the weather in a city (always mild)."""
    return Weather(city=city, celsius=21.5)


@server.tool()
def refuse(reason: str) -> str:
    """Always fails: the result has isError true."""
    raise ToolError(f"refused: {reason}")


@server.tool()
async def count(n: int, ctx: Context) -> str:
    """Report progress n times, then answer."""
    for i in range(1, n + 1):
        await ctx.report_progress(i, n, f"step {i}")
    return f"counted to {n}"


@server.tool()
async def wait_forever(tag: str) -> str:
    """Never answers on its own; records its cancellation."""
    _mark(f"started {tag}")
    try:
        await anyio.sleep_forever()
    finally:
        _mark(f"cancelled {tag}")
    return "unreachable"


@server.tool()
def die(code: int = 1) -> str:
    """The server process exits in the middle of this call."""
    _mark("died")
    os._exit(code)


@server.tool()
def spawn(hold_stdout: bool = False) -> int:
    """Start a grandchild (``sleep 1000``) that outlives this call; its pid. With
    ``hold_stdout`` its stdout is the server's own wire to the client, as a child
    started by a shell wrapper or a server in another language would have it (the
    SDK's server moves the wire off fd 1, so a plain child would not hold it)."""
    child = subprocess.Popen(
        ["sleep", "1000"],
        stdin=subprocess.DEVNULL,
        stdout=WIRE if hold_stdout else subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _mark(f"spawned {child.pid}")
    return child.pid


@server.tool(structured_output=False)
def big(megabytes: int) -> str:
    """A text result of ``megabytes`` million characters (``z`` repeated)."""
    return "z" * (megabytes * 1_000_000)


@server.tool()
def pid() -> int:
    """The server's process id (to tell incarnations apart)."""
    return os.getpid()


@server.tool()
def env_digest(name: str) -> str:
    """The SHA-256 of the environment variable ``name`` as this server sees it (so a test
    can check what the server was given without the value travelling anywhere)."""
    import hashlib

    value = os.environ.get(name)
    return "unset" if value is None else hashlib.sha256(value.encode()).hexdigest()


def main() -> None:
    _mark(f"start {os.getpid()}")
    if len(sys.argv) >= 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
