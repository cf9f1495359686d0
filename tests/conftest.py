"""Shared fixtures: a real PostgreSQL server for the distributed tests (started here), the
loop watch (``pytest.mark.loop_watch``: a test fails when the trio loop is blocked), and
every test's time limit (pytest-timeout; a trio test is cancelled at it)."""

from __future__ import annotations

import faulthandler
import functools
import itertools
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import trio
from loop_watch import pytest_configure, pytest_runtest_call
from pg_cluster import fresh_database, postgres_cluster

__all__ = ["pg_server", "pg_url", "pytest_configure", "pytest_runtest_call"]

_databases = itertools.count()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """One PostgreSQL cluster for the session, started on first use, stopped at the end."""
    with postgres_cluster() as url:
        yield url


@pytest.fixture
def pg_url(pg_server: str) -> str:
    """An empty database of its own for one test."""
    return fresh_database(pg_server, f"t{next(_databases)}")


# -- a time limit for every test (pytest-timeout; trio tests cancelled the trio way) --------

GRACE_S = 30.0
"""After a trio test is cancelled at its time limit: how long it may take to unwind
before the run is ended with every thread's stack dumped (it ignores cancellation)."""


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Trio tests run under :func:`_run_with_deadline` (after pytest-trio marked them)."""
    for item in items:
        obj = getattr(item, "obj", None)
        if item.get_closest_marker("trio") is None or hasattr(obj, "hypothesis"):
            continue  # pytest-timeout's own signal handler applies
        run = functools.partial(_run_with_deadline, item)
        item.add_marker(pytest.mark.trio(run=run), append=False)
        item.stash[_TRIO_DEADLINE] = 0.0


_TRIO_DEADLINE = pytest.StashKey[float]()


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    """pytest-timeout's SIGALRM handler raises wherever the main thread is: inside
    trio's run loop that breaks trio for every later test of the session. A trio
    test's limit is kept for :func:`_run_with_deadline` instead."""
    if _TRIO_DEADLINE not in item.stash:
        return None
    item.stash[_TRIO_DEADLINE] = float(settings.timeout or 0.0)
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> bool | None:
    return True if _TRIO_DEADLINE in item.stash else None


def _run_with_deadline(item: pytest.Item, fn: Any, **kwargs: Any) -> Any:
    """``trio.run(fn)``, cancelled once the test's time limit passes in real time (a
    MockClock's virtual time does not count): the test fails as timed out, and the
    next test starts on a clean trio."""
    limit = item.stash.get(_TRIO_DEADLINE, 0.0)
    if not limit:
        return trio.run(fn, **kwargs)
    hit = False

    async def guarded() -> Any:
        token = trio.lowlevel.current_trio_token()
        with trio.CancelScope() as scope:

            def alarm(signum: int, frame: Any) -> None:
                nonlocal hit
                if hit:  # cancelled GRACE_S ago and still running
                    faulthandler.dump_traceback(all_threads=True)
                    os._exit(f"{item.nodeid}: did not end {GRACE_S} s after its time limit")
                hit = True
                token.run_sync_soon(scope.cancel)  # signal-safe
                signal.setitimer(signal.ITIMER_REAL, GRACE_S)

            previous = signal.signal(signal.SIGALRM, alarm)
            signal.setitimer(signal.ITIMER_REAL, limit)
            try:
                return await fn()
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)

    try:
        result = trio.run(guarded, **kwargs)
    except BaseException as exc:
        if hit:
            pytest.fail(f"Timeout (>{limit:g}s): the test was cancelled", pytrace=False)
        raise exc from None
    if hit:
        pytest.fail(f"Timeout (>{limit:g}s): the test was cancelled", pytrace=False)
    return result
