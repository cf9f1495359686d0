"""Running a server from the command line: ``cantrip serve`` (either mode),
``cantrip worker``'s health server, ``cantrip mcp --http`` and ``cantrip loom FILE view``
all serve until SIGINT/SIGTERM, then drain, and all turn a port they cannot bind into one
line for the user instead of a traceback.

The commands start different servers (:func:`cantrip.protocols.http._serve.serve_http`,
:func:`cantrip.protocols.http._serve.serve_http_db`, ``cantrip mcp --http``, ``cantrip
loom FILE view``); the signal handling, the "serving on" lines and the bind failure are
the same, so they live here once (:func:`serve_until_signal`).
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import TextIO

import trio

from cantrip._failure import leaves, message

Start = Callable[..., Awaitable[None]]
"""A server bound to all its arguments (:func:`functools.partial`) but two, given here
as keywords: ``shutdown_trigger`` and ``task_status`` (which gets the bound URLs)."""


def serve_until_signal(
    start: Start,
    *,
    host: str,
    port: int,
    spec: object,
    draining: str | None,
    note: str = "",
    background: Callable[[], Awaitable[None]] | None = None,
    announce: Callable[[str], str] | None = None,
    then: Sequence[str] = (),
    err: TextIO | None = None,
) -> str | None:
    """Serve until SIGINT or SIGTERM, which starts the server's drain (said on ``err``,
    default stderr, as ``cantrip: SIGTERM: <draining>``, unless ``draining`` is None);
    each bound URL is announced as ``cantrip: serving <spec> on <url><note>`` (or as
    ``announce(url)`` says), followed by the lines ``then``. Returns None when the server
    stopped, or why it could not serve (the port is taken, the address is not ours).
    ``background`` (retention) runs beside the server and is cancelled when it stops."""

    def say(line: str) -> None:
        print(line, file=err if err is not None else sys.stderr, flush=True)

    async def run() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:

            async def until_signal() -> None:
                async for signum in signals:
                    if draining is not None:
                        say(f"cantrip: {signal.Signals(signum).name}: {draining}")
                    return

            async with trio.open_nursery() as nursery:

                async def serve(task_status: trio.TaskStatus[list[str]]) -> None:
                    await start(shutdown_trigger=until_signal, task_status=task_status)
                    nursery.cancel_scope.cancel()  # the server is done: so is the background

                binds = await nursery.start(serve)
                if background is not None:
                    nursery.start_soon(background)
                for bind in binds:
                    say(announce(bind) if announce else f"cantrip: serving {spec} on {bind}{note}")
                for line in then:
                    say(line)

    try:
        trio.run(run)
    except BaseException as exc:
        found = leaves(exc)
        if all(isinstance(leaf, OSError) for leaf in found):  # e.g. the port is taken
            return f"cannot serve on {host}:{port}: {message(found[0])}"
        raise
    return None
