"""A hand-written stdio MCP server that misbehaves on purpose (for the client's failure tests).

It speaks just enough of the 2025-06-18 handshake (newline-delimited JSON-RPC 2.0 on
stdin/stdout, https://modelcontextprotocol.io/specification/2025-06-18/basic/transports#stdio)
to get where the failure is wanted. ``python misbehaving.py MODE``:

* ``exit`` -- writes a line to stderr and exits with status 3 before any answer;
* ``hang-init`` -- reads requests and never answers (not even ``initialize``);
* ``hang-list`` -- completes the handshake, never answers ``tools/list``;
* ``malformed`` -- lists one tool, ``broken``, whose result is not a CallToolResult
  (``content`` must be an array of content blocks, spec "Tool Result"; here a string).
"""

from __future__ import annotations

import json
import sys

MODE = sys.argv[1] if len(sys.argv) > 1 else "malformed"
TOOL = {
    "name": "broken",
    "description": "Answers with a malformed result.",
    "inputSchema": {"type": "object", "properties": {}},
}


def answer(request_id: object, result: object) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}) + "\n")
    sys.stdout.flush()


def error(request_id: object, code: int, message: str) -> None:
    body = {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
    sys.stdout.write(json.dumps(body) + "\n")
    sys.stdout.flush()


def main() -> None:
    if MODE == "exit":
        sys.stderr.write("misbehaving: cannot open my database (on purpose)\n")
        sys.stderr.flush()
        raise SystemExit(3)
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        method, request_id = message.get("method"), message.get("id")
        if request_id is None or MODE == "hang-init":
            continue  # notifications need no answer; hang-init answers nothing at all
        if method == "initialize":
            answer(
                request_id,
                {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "misbehaving", "version": "0"},
                },
            )
        elif method == "tools/list":
            if MODE != "hang-list":
                answer(request_id, {"tools": [TOOL]})
        elif method == "tools/call":
            answer(request_id, {"content": "this should have been a list", "isError": "no"})
        else:
            error(request_id, -32601, f"method not found: {method}")


if __name__ == "__main__":
    main()
