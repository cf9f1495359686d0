"""An MCP server (official SDK) whose tool names LLM providers refuse as function names.

MCP lets a server name its tools freely (SEP-986 only advises letters, digits, ``_``,
``-`` and ``.``, and the SDK merely warns); OpenAI, Anthropic and Gemini accept only
``[A-Za-z0-9_-]``, at most 64 characters (Gemini: led by a letter or ``_``). Each tool
answers with its own name, so a test can see which one the server was asked for.
Run as ``python oddnames.py`` (stdio); ``ODDNAMES_EXTRA`` (a JSON list) adds tools.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable

from mcp.server import MCPServer

NAMES = (
    "plain",
    "get weather",
    "fs/read",
    "a<b>",
    "line\nbreak",
    "github.create_issue",
    "9lives",
    "long_" + "x" * 75,
    *json.loads(os.environ.get("ODDNAMES_EXTRA", "[]")),
)

logging.getLogger("mcp.shared.tool_name_validation").setLevel(logging.ERROR)
server = MCPServer("oddnames", version="1.0", log_level="WARNING")


def _answer(name: str) -> Callable[[], str]:
    def answer() -> str:
        return f"I am {name!r}"

    return answer


for _name in NAMES:
    server.add_tool(
        _answer(_name),
        name=_name,
        description=f"Says its name ({_name!r}).",
        structured_output=False,
    )


if __name__ == "__main__":
    server.run("stdio")
