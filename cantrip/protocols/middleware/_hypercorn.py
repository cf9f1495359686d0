"""Two fixes to hypercorn's trio server's connections: hang-ups and the read timeout.

hypercorn (0.18) runs each connection as a ``TCPServer`` whose task group holds the
request's task, a read loop and, between requests, a keep-alive timer.

* **A connection whose client has gone is closed now.** When the client closes an idle
  keep-alive connection, the read loop sees EOF and ends, but the timer task is left
  running: the socket stays open (CLOSE_WAIT) until the keep-alive runs out -- 75 s with
  ``cantrip serve``'s ``--keep-alive-s`` (issue 29: clients that connect, ask and hang up
  leave one socket each behind for that long). The subclass stops the timer once the
  read loop has ended, so the connection closes as soon as its request (if one is
  running) has ended.
* **The read timeout counts only while the client owes the server bytes.** hypercorn
  bounds every read of its loop by ``read_timeout`` -- also while the client, its request
  sent, waits for the answer and has nothing to send: a prompt that ran longer than
  ``--client-timeout`` (30 s), or a stream that lasted longer, was cut off with no
  response ("server disconnected"). The timeout is there to drop a client that stops
  sending its request (slowloris); while the app is answering a request it read whole,
  the loop reads without a deadline (a hang-up still ends it at once), and once the
  answer is sent the keep-alive timer bounds the idle connection as before.

It is installed where hypercorn's trio worker builds its connections
(``hypercorn.trio.run.TCPServer``) when :func:`install` is called -- by
:func:`~cantrip.protocols.http._serve.serve_asgi`, not at import. The behaviour it changes
is hypercorn's own and only for the better, so a process that also serves something else
with hypercorn loses nothing.
"""

from __future__ import annotations

from math import inf
from typing import Any

import h11

_installed = False


def answering(protocol: Any) -> bool:
    """Whether the connection's client has sent its request whole and the app is answering
    it (so the client owes nothing): on HTTP/1.1, h11's client side is ``DONE`` and its
    server side is sending; on HTTP/2, a stream is open. ``protocol``: hypercorn's
    ``ProtocolWrapper``. Asked before each read of the connection."""
    inner = getattr(protocol, "protocol", None)
    streams = getattr(inner, "streams", None)
    if isinstance(streams, dict):  # HTTP/2
        return bool(streams)
    connection = getattr(inner, "connection", None)
    return getattr(connection, "their_state", None) is h11.DONE and getattr(
        connection, "our_state", None
    ) in (h11.SEND_RESPONSE, h11.SEND_BODY)


def install() -> None:
    """Make hypercorn's trio worker close a connection when its client hangs up, and
    apply its read timeout only while the client owes the server bytes."""
    global _installed
    if _installed:
        return
    import hypercorn.trio.run as worker
    import trio
    from hypercorn.events import Closed, RawData
    from hypercorn.trio.tcp_server import MAX_RECV, TCPServer

    class HangUpAwareTCPServer(TCPServer):
        async def _read_data(self) -> None:
            while True:
                limit = inf if answering(self.protocol) else self.config.read_timeout or inf
                try:
                    with trio.fail_after(limit):
                        data = await self.stream.receive_some(MAX_RECV)
                except (trio.ClosedResourceError, trio.BrokenResourceError, trio.TooSlowError):
                    break
                await self.protocol.handle(RawData(bytes(data)))
                if data == b"":
                    break
            await self.protocol.handle(Closed())
            # EOF (or a read timeout): nobody will send another request on this
            # connection -- don't keep it open for the keep-alive timer.
            await self.idle_task.stop()

    if getattr(worker, "TCPServer", None) is TCPServer:  # (else: someone else's choice)
        setattr(worker, "TCPServer", HangUpAwareTCPServer)  # noqa: B010
    _installed = True
