"""Losing the database and getting it back: the backoff and the log lines of a retry loop.

A PostgreSQL restart (a deploy, a failover) breaks every connection of every worker,
replica and client. None of them gives up on it: each retries with a growing,
jittered delay, says once that the database went away and once that it is back, and
goes on. :class:`Outage` is that bookkeeping, shared by the blocking clients
(:class:`~cantrip.distributed._dispatcher.Dispatcher`) and the trio loops of the worker.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager

from cantrip._redact import redact

FIRST_DELAY_S = 0.1
MOST_DELAY_S = 5.0


def is_connection_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or any exception grouped in it) is a lost or refused database
    connection -- the fault to wait out, not a bug (psycopg's ``OperationalError``:
    a server shut down or restarting, a broken socket, a pool that cannot connect)."""
    try:
        import psycopg
    except ImportError:  # no PostgreSQL support installed: no such error either
        return False
    if isinstance(exc, BaseExceptionGroup):
        return any(is_connection_error(e) for e in exc.exceptions)
    return isinstance(exc, psycopg.OperationalError)


class Away:
    """What :func:`database_away` saw: the connection error it absorbed, if any."""

    __slots__ = ("exc",)

    def __init__(self) -> None:
        self.exc: Exception | None = None


@contextmanager
def database_away() -> Iterator[Away]:
    """The one check for "the database went away": the block's connection error (see
    :func:`is_connection_error`) is absorbed into the yielded :class:`Away` for the
    caller to wait out; any other error goes on up, untouched. Every retry loop of the
    worker and the dispatcher uses it, so what counts as an outage is decided here.

    ::

        with database_away() as away:
            rows = fetch()
        if away.exc is not None:
            ...  # back off, try again
    """
    away = Away()
    try:
        yield away
    except Exception as exc:
        if not is_connection_error(exc):
            raise
        away.exc = exc


def describe(exc: BaseException) -> str:
    """One redacted line for a connection error (its class and first line)."""
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return describe(exc.exceptions[0])
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return redact(f"{type(exc).__name__}: {first}" if first else type(exc).__name__)


class Outage:
    """The state of one retry loop: whether the database is away, and the next delay."""

    def __init__(self, what: str, log: logging.Logger) -> None:
        self.what = what
        self.log = log
        self.since: float | None = None
        self.delay = FIRST_DELAY_S

    @property
    def down(self) -> bool:
        return self.since is not None

    def failed(self, exc: BaseException) -> float:
        """A try failed on ``exc``: the seconds to wait before the next (logged once)."""
        if self.since is None:
            self.since = time.monotonic()
            self.log.warning(
                "%s: lost the database (%s); reconnecting with backoff", self.what, describe(exc)
            )
        delay, self.delay = self.delay, min(self.delay * 2, MOST_DELAY_S)
        return delay * random.uniform(0.5, 1.0)

    def ok(self) -> None:
        """A try succeeded: if the database had been away, say it is back."""
        if self.since is not None:
            self.log.warning(
                "%s: reconnected to the database after %.1f s",
                self.what,
                time.monotonic() - self.since,
            )
        self.since = None
        self.delay = FIRST_DELAY_S
