"""How `cantrip serve` holds up under load and goes down cleanly (issue 24).

:class:`ServeOptions` are the server settings that decide whether a request
under load gets an answer, each chosen by measurement (bench/serve_load.py):

* ``keep_alive_s`` -- hypercorn closes a kept-alive connection after this much
  idle time. Its default, 5 s, equals httpx's (and many clients') pool expiry:
  a client that reuses a connection just as the server closes it loses the
  request. (In our runs the lost requests had not started a cast -- the loom
  held exactly the answered ones -- but hypercorn's idle close does not stop a
  request whose bytes arrived in the same moment, which is how the issue saw
  lost prompts run anyway; the Idempotency-Key makes the retry safe either
  way.) Measured (200 sessions, 6 waves of prompts 4.95 s apart): 12, 5 and
  69 of 1,200 prompts dropped in three runs at 5 s, none in two runs at 75 s
  (nginx's default). The server must outlast the clients' idle expiry, never
  match it.
* ``backlog`` -- the listen queue. Hypercorn's 100 is less than 200 clients
  connecting at once: the kernel counted 63-78 listen-queue overflows, each a
  dropped SYN the client re-sends a second later (p99 of creating 200
  sessions 1.5-1.8 s; 0 overflows and p99 0.9-1.0 s at 1024, which the kernel
  caps at ``net.core.somaxconn``).
* ``max_running`` -- prompts that may run at once; beyond it a prompt gets
  ``503`` with ``Retry-After`` instead of queueing without bound.
* ``grace_s`` -- at shutdown, how long running casts may go on before they are
  cut off with reason ``shutdown``.

:class:`Drain` is the shutdown: stop taking work (``503`` + ``Retry-After``
for new requests), give running casts the grace period, cut off the rest, end
every event stream with a ``shutdown`` event, and wait until every open request
has had its answer -- only then does hypercorn stop.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import attrs
import trio

from cantrip._redact import get_logger
from cantrip.protocols._sessions import SessionHub

log = get_logger("cantrip.http")


@attrs.frozen
class ServeOptions:
    """Settings of `cantrip serve` (see the module docstring for why each default)."""

    grace_s: float = 10.0
    keep_alive_s: float = 75.0
    backlog: int = 1024
    max_running: int | None = 1000
    retry_after_s: int = 1
    """What a ``503`` asks the client to wait, in whole seconds (RFC 9110 10.2.3)."""
    sticky_cancel_s: float = 5.0
    answer_timeout_s: float = 10.0
    """After the casts ended, how long open requests get to send their answers."""


class Drain:
    """Open requests and event streams of one server, and its shutdown."""

    def __init__(self) -> None:
        self.closing = False
        self.open = 0
        self._quiet = trio.Event()
        self._quiet.set()
        self._streams: set[trio.CancelScope] = set()

    @contextmanager
    def request(self) -> Iterator[None]:
        """Count one request from its arrival until its answer is sent."""
        if self.open == 0:
            self._quiet = trio.Event()
        self.open += 1
        try:
            yield
        finally:
            self.open -= 1
            if self.open == 0:
                self._quiet.set()

    @contextmanager
    def stream(self) -> Iterator[trio.CancelScope]:
        """A scope for a long-lived event stream; shutdown cancels it so it ends."""
        scope = trio.CancelScope()
        if self.closing:
            scope.cancel()
        self._streams.add(scope)
        try:
            with scope:
                yield scope
        finally:
            self._streams.discard(scope)

    async def close(self, hub: SessionHub, options: ServeOptions) -> None:
        """Stop taking work, let casts finish or cut them off, answer everyone."""
        self.closing = True
        log.info("shutting down: %d open request(s), grace %.1f s", self.open, options.grace_s)
        await hub.shutdown(options.grace_s)
        for scope in list(self._streams):
            scope.cancel()
        with trio.move_on_after(options.answer_timeout_s) as late:
            await self._quiet.wait()
        if late.cancelled_caught:
            log.warning("shutdown: %d request(s) still open after the casts ended", self.open)
