"""ACP's stdio transport: one JSON-RPC message per line on stdin/stdout."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from cantrip._cantrip import Cantrip
from cantrip._redact import get_logger, redact_value
from cantrip.protocols.acp._rpc import INVALID_REQUEST, PARSE_ERROR
from cantrip.protocols.acp._rpc import error_response as _error
from cantrip.protocols.acp._server import AcpServer
from cantrip.protocols.sessions._backend import SessionBackend

log = get_logger("cantrip.acp")

MAX_LINE = 16 << 20
"""The longest JSON-RPC message line accepted on stdio (bytes)."""


async def serve_stdio(
    spell: Cantrip,
    *,
    stdin: trio.abc.ReceiveStream | None = None,
    stdout: trio.abc.SendStream | None = None,
    protocol: str = "v1",
    backend: SessionBackend | None = None,
) -> None:
    """Serve ACP on stdin/stdout, one JSON message per line, until stdin closes.

    Waiting idle for the next request is normal. Messages are taken in order;
    prompts run in the background, so a ``session/cancel`` reaches a running
    prompt (two prompts of one session run one after the other). Nothing but
    protocol messages is written to stdout, with secrets redacted (PROD-8).
    When stdin closes, running prompts finish and the server exits.

    ``protocol="v2-draft"`` also speaks the v2 draft (:mod:`._v2`) with a client that
    asks for it; ``backend``: a session backend run by its owner -- one shared with
    other connections, so several clients may follow one session, or PostgreSQL's
    (``cantrip acp --db``).
    """
    reader = stdin if stdin is not None else trio.lowlevel.FdStream(0)
    writer = stdout if stdout is not None else trio.lowlevel.FdStream(1)
    write_lock = trio.Lock()

    async def send(message: dict[str, Any]) -> None:
        data = json.dumps(redact_value(message), default=str).encode() + b"\n"
        log.debug("-> %s", data[:2000])
        async with write_lock:
            try:
                await writer.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                log.info("the client went away; a message was not delivered")

    server = AcpServer(spell, notify=send, protocol=protocol, backend=backend)

    async def answer(message: Any) -> None:
        response = await server.handle(message)
        if response is not None:
            await send(response)

    async def finish(run: Callable[[], Awaitable[dict[str, Any] | None]]) -> None:
        response = await run()
        if response is not None:
            await send(response)

    buffer = bytearray()
    skipping = False
    log.info("serving ACP on stdio (idle until a request arrives)")
    async with server.running(), trio.open_nursery() as nursery:
        while True:
            chunk = await reader.receive_some(65536)
            if not chunk:
                break
            scanned = len(buffer)  # what is already buffered holds no newline
            buffer.extend(chunk)
            if skipping:  # the rest of an oversized line: dropped unread
                newline = buffer.find(b"\n")
                if newline < 0:
                    buffer.clear()
                    continue
                del buffer[: newline + 1]
                skipping = False
                scanned = 0
            while (newline := buffer.find(b"\n", scanned)) >= 0:
                line = bytes(buffer[:newline]).strip()
                del buffer[: newline + 1]
                scanned = 0
                if not line:
                    continue
                log.debug("<- %s", line[:2000])
                try:
                    message = json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    await send(_error(None, PARSE_ERROR, f"not JSON: {exc}"))
                    continue
                except RecursionError:
                    await send(_error(None, PARSE_ERROR, "not JSON: nested too deeply"))
                    continue
                if isinstance(message, list):
                    await send(_error(None, INVALID_REQUEST, "batch requests are not supported"))
                elif isinstance(message, Mapping) and message.get("method") == "session/prompt":
                    prepared = await server.prepare_prompt(message)
                    if callable(prepared):
                        nursery.start_soon(finish, prepared)
                    elif message.get("id") is not None:
                        await send(prepared)
                else:
                    await answer(message)
            if len(buffer) > MAX_LINE:
                # One message may not hold the server's memory hostage: the
                # oversized line is answered with an error and skipped.
                await send(_error(None, INVALID_REQUEST, f"a message over {MAX_LINE} bytes"))
                buffer.clear()
                skipping = True
        log.info("stdin closed; finishing running prompts")
