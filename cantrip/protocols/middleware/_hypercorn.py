"""One fix to hypercorn's trio server: a connection whose client has gone is closed now.

hypercorn (0.18) runs each connection as a ``TCPServer`` whose task group holds the
request's task and, between requests, a keep-alive timer. When the client closes an
idle keep-alive connection, the read loop sees EOF and ends, but the timer task is
left running: the socket stays open (CLOSE_WAIT) until the keep-alive runs out --
75 s with ``cantrip serve``'s ``--keep-alive-s`` (issue 29: clients that connect,
ask and hang up leave one socket each behind for that long). The subclass stops the
timer once the read loop has ended, so the connection closes as soon as its request
(if one is running) has ended.

It is installed where hypercorn's trio worker builds its connections
(``hypercorn.trio.run.TCPServer``) when :func:`install` is called -- by
:func:`~cantrip.protocols.http._serve.serve_asgi`, not at import. The behaviour it changes
is hypercorn's own and only for the better (a connection nobody can use any more),
so a process that also serves something else with hypercorn loses nothing.
"""

from __future__ import annotations

_installed = False


def install() -> None:
    """Make hypercorn's trio worker close a connection when its client hangs up."""
    global _installed
    if _installed:
        return
    import hypercorn.trio.run as worker
    from hypercorn.trio.tcp_server import TCPServer

    class HangUpAwareTCPServer(TCPServer):
        async def _read_data(self) -> None:
            await super()._read_data()
            # EOF (or a read timeout): nobody will send another request on this
            # connection -- don't keep it open for the keep-alive timer.
            await self.idle_task.stop()

    if getattr(worker, "TCPServer", None) is TCPServer:  # (else: someone else's choice)
        setattr(worker, "TCPServer", HangUpAwareTCPServer)  # noqa: B010
    _installed = True
