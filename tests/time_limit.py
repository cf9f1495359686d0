"""Every test's time limit (pytest-timeout), trio tests cancelled the trio way at it.

pytest-timeout's SIGALRM handler raises wherever the main thread happens to be: inside
trio's run loop that breaks trio for every later test of the session. So a trio test's
limit is kept here instead: the test is *cancelled* when it passes (it fails as timed
out, and the next test starts on a clean trio); one that still runs ``timeout_grace``
seconds later ignores cancellation, and its process is ended then -- the test's name,
where each trio task waits and every thread's stack on the real stderr, exit status
:data:`EXIT_STUCK` -- since nothing else would stop it. (Under pytest-xdist that process
is a worker: xdist reports it crashed in that test, and the run fails.) Loaded by
``tests/conftest.py``.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any, NoReturn

import pytest
import trio

GRACE_S = 30.0
"""After a trio test is cancelled at its time limit: how long it may take to unwind
before the run is ended with every thread's stack dumped (it ignores cancellation).
The ``timeout_grace`` ini option changes it."""

EXIT_STUCK = int(pytest.ExitCode.INTERRUPTED)
"""The exit status of a run ended because a test ignored its cancellation."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "timeout_grace",
        "seconds a trio test cancelled at its time limit may take to unwind before the "
        "run is ended (default 30)",
        default=str(GRACE_S),
    )


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
    """A trio test's limit is kept for :func:`_run_with_deadline`."""
    if _TRIO_DEADLINE not in item.stash:
        return None
    item.stash[_TRIO_DEADLINE] = float(settings.timeout or 0.0)
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> bool | None:
    return True if _TRIO_DEADLINE in item.stash else None


def _end_the_run(item: pytest.Item, grace: float) -> NoReturn:
    """Ends the test process: ``item`` still runs ``grace`` seconds after it was
    cancelled. Its name and every thread's stack go to the real stderr -- pytest's
    capture (on by default) would keep them in a file that dies with the process."""
    capture = item.config.pluginmanager.getplugin("capturemanager")
    uncaptured = capture.global_and_fixture_disabled() if capture else contextlib.nullcontext()
    with uncaptured:
        sys.stdout.flush()
        sys.stderr.write(
            f"\n{item.nodeid} did not end {grace:g} s after it was cancelled at its time "
            "limit (it ignores cancellation): the test run is ended\n"
        )
        sys.stderr.write("".join(_trio_tasks()))
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        os._exit(EXIT_STUCK)


def _trio_tasks() -> Iterator[str]:
    """Where each task of the running trio run waits (a waiting task's frames are on no
    thread's stack, so the dump of the threads does not show the test's own code)."""
    yield "Trio tasks (most recent call last):\n"
    tasks = [trio.lowlevel.current_root_task()]
    while tasks:
        task = tasks.pop()
        if task is None:
            continue
        yield f"  task {task.name!r}:\n"
        for frame, line in task.iter_await_frames():
            code = frame.f_code
            yield f'    File "{code.co_filename}", line {line} in {code.co_name}\n'
        tasks.extend(child for nursery in task.child_nurseries for child in nursery.child_tasks)


def _run_with_deadline(item: pytest.Item, fn: Any, **kwargs: Any) -> Any:
    """``trio.run(fn)``, cancelled once the test's time limit passes in real time (a
    MockClock's virtual time does not count): the test fails as timed out, and the
    next test starts on a clean trio."""
    limit = item.stash.get(_TRIO_DEADLINE, 0.0)
    if not limit:
        return trio.run(fn, **kwargs)
    grace = float(str(item.config.getini("timeout_grace")))
    hit = False

    async def guarded() -> Any:
        token = trio.lowlevel.current_trio_token()
        with trio.CancelScope() as scope:

            def alarm(signum: int, frame: Any) -> None:
                nonlocal hit
                if hit:  # cancelled `grace` seconds ago and still running
                    _end_the_run(item, grace)
                hit = True
                token.run_sync_soon(scope.cancel)  # signal-safe
                signal.setitimer(signal.ITIMER_REAL, grace)

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
