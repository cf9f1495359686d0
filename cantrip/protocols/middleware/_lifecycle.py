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

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager

import attrs
import trio

from cantrip._redact import get_logger
from cantrip.protocols.sessions._hub import SessionError, SessionHub

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
    on_busy: str = "reject"
    """Double-texting: what a prompt does when its session runs one, unless the request
    says (``?on_busy=``): reject, enqueue, interrupt or rollback."""
    a2a_push_private: bool = False
    """Whether A2A push notifications may go to loopback and private addresses (a
    webhook URL is a client's; by default only public addresses are called)."""


class Tally:
    """How many of something are open, and the moment none is: the count a server
    waits on to empty at shutdown (open requests, or prompts a replica waits on)."""

    def __init__(self) -> None:
        self.count = 0
        self._empty = trio.Event()
        self._empty.set()

    @contextmanager
    def held(self) -> Iterator[None]:
        """Count one for as long as the block runs."""
        if self.count == 0:
            self._empty = trio.Event()
        self.count += 1
        try:
            yield
        finally:
            self.count -= 1
            if self.count == 0:
                self._empty.set()

    async def empty(self) -> None:
        """Return once nothing is counted (at once if nothing is)."""
        await self._empty.wait()


class Drain:
    """Open requests and event streams of one server, and its shutdown.

    The shutdown has three steps: :meth:`begin` (stop taking work), the server's
    own wait for its work (an in-process server's casts: :meth:`close`; a replica's
    waits on workers), then :meth:`end_streams`."""

    def __init__(self) -> None:
        self.closing = False
        self._requests = Tally()
        self._streams: set[trio.CancelScope] = set()

    @property
    def open(self) -> int:
        """Requests that have arrived and not yet had their answer."""
        return self._requests.count

    def request(self) -> contextlib.AbstractContextManager[None]:
        """Count one request from its arrival until its answer is sent."""
        return self._requests.held()

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

    def begin(self, grace_s: float) -> None:
        """Stop taking work: from now on a new request gets ``503`` + ``Retry-After``."""
        self.closing = True
        log.info("shutting down: %d open request(s), grace %.1f s", self.open, grace_s)

    async def end_streams(self, answer_timeout_s: float) -> None:
        """End every event stream, then give open requests ``answer_timeout_s`` to
        send their answers."""
        for scope in list(self._streams):
            scope.cancel()
        with trio.move_on_after(answer_timeout_s) as late:
            await self._requests.empty()
        if late.cancelled_caught:
            log.warning("shutdown: %d request(s) still open after the grace period", self.open)

    async def close(self, hub: SessionHub, options: ServeOptions) -> None:
        """Stop taking work, let casts finish or cut them off, answer everyone."""
        self.begin(options.grace_s)
        await hub.shutdown(options.grace_s)
        await self.end_streams(options.answer_timeout_s)


class Admission:
    """Whether a server takes a prompt now: the one place ``shutting_down`` and
    ``overloaded`` are decided, the same for every mode (drift 11: the in-process hub
    and the ``--db`` replica each decided them, at different moments).

    A prompt is refused before the backend sees it -- while the server drains, or while
    ``max_running`` prompts are open here (``waiting``: a request waits on its result
    or follows its stream; on ``--db`` the casts run at the workers, so what a replica
    holds is its waits). A prompt the backend accepted is never refused afterwards."""

    def __init__(self, drain: Drain, options: ServeOptions) -> None:
        self.drain = drain
        self.options = options
        self.open = Tally()
        """Prompts open at this server (``/health``'s ``running`` for a replica)."""

    def check(self) -> None:
        """Refuse a new prompt now (``SessionError``: the API maps it to 503)."""
        if self.drain.closing:
            raise SessionError("shutting_down", "the server is shutting down")
        limit = self.options.max_running
        if limit is not None and self.open.count >= limit:
            raise SessionError(
                "overloaded", f"{self.open.count} prompts are open here (the limit); try again"
            )

    def holding(self) -> contextlib.AbstractContextManager[None]:
        """Count one prompt open for as long as the block runs (one admitted already:
        an answer's continuation)."""
        return self.open.held()

    @contextmanager
    def admit(self) -> Iterator[None]:
        """:meth:`check`, then count the prompt open while the block runs (no
        checkpoint between: two requests cannot both take the last place)."""
        self.check()
        with self.open.held():
            yield
