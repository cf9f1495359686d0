"""A test fails when something blocks the trio loop (issue 28, item 2).

Untrusted input must never make the event loop thread stall: while one task
step runs, no other task, timeout, ``/health`` answer or signal handler can.
:class:`LoopWatch` is a trio instrument that times every task step and keeps
the ones that held the loop thread longer than a limit (200 ms by default).

The time charged to a step is what the *loop thread itself* spent: wall time
minus the time the thread sat in the kernel's run queue waiting for a CPU
(``run_delay`` in ``/proc/thread-self/schedstat``). Time on a CPU counts, and so
does time blocked in a system call (a FIFO that nobody writes, a lock, a slow
disk), which is what a stall is; time lost only because the machine is busy
does not. So the limit holds on a loaded two-core machine without flaking: a
step of 5 ms of work that the scheduler stretched to 300 ms of wall time is not
reported, a ``time.sleep(0.3)`` or 300 ms of regex backtracking is. Time inside a
garbage collection is not charged either (measured by a ``gc.callbacks`` hook): a
full collection of a test process's heap, grown by the hundreds of tests an xdist
worker runs, is a property of that process, not a call the code under test made.

Use: mark a module ``pytestmark = pytest.mark.loop_watch`` (or a test); each
test so marked runs with the instrument installed and fails, naming the task and
the time, if any step went over: an async test as a whole, each example of an
async Hypothesis test, and each ``trio.run`` a plain test makes (on any thread --
the fuzzers drive their own loop). ``loop_watch(limit_s=...)`` changes the limit,
``loop_watch(False)`` turns it off for one test. A marked test left unwatched --
turned off, or a plain test that ran no trio loop in the process -- is named at the
end of the run, never skipped silently. The plugin is loaded by ``tests/conftest.py``.
"""

from __future__ import annotations

import functools
import gc
import inspect
import os
import platform
import threading
import time
from collections.abc import Callable, Generator, Sequence
from typing import Any

import attrs
import pytest
import trio

LIMIT_S = 0.2
"""How long one task step may hold the loop thread."""


def _schedstat_reader() -> Callable[[], float] | None:
    """A reader of this thread's run-queue wait in seconds (one ``pread``, ~3 us), or
    None where the kernel does not expose it (then wall time alone is measured)."""
    try:
        fd = os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat", os.O_RDONLY)
    except OSError:
        return None

    def run_delay() -> float:
        return int(os.pread(fd, 128, 0).split()[1]) / 1e9

    try:
        run_delay()
    except (OSError, IndexError, ValueError):
        os.close(fd)
        return None
    run_delay.fd = fd  # type: ignore[attr-defined]
    return run_delay


_FUTEX = {"x86_64": "202", "aarch64": "98"}.get(platform.machine())
"""The ``futex`` system call's number here (``/proc/.../syscall``): a thread waiting
for the GIL waits in it."""


def _futex_wait_reader() -> Callable[[], bool]:
    """A check of whether this thread sits in ``futex`` right now -- waiting for the
    GIL, most likely -- read from another thread; never true where unknown."""
    path = f"/proc/self/task/{threading.get_native_id()}/syscall"

    def in_futex() -> bool:
        try:
            with open(path) as state:
                return state.read().split(" ", 1)[0] == _FUTEX
        except OSError:
            return False

    return in_futex if _FUTEX is not None else lambda: False


def _runnable_reader() -> Callable[[], bool]:
    """A check of whether this thread is runnable right now (``R`` in ``/proc/.../stat``:
    on a CPU or in the run queue), read from another thread; never true where unknown."""
    path = f"/proc/self/task/{threading.get_native_id()}/stat"

    def runnable() -> bool:
        try:
            with open(path) as stat:
                return stat.read().rsplit(")", 1)[1].split()[0] == "R"
        except (OSError, IndexError):
            return False

    return runnable


class _CollectorClock:
    """Seconds spent in garbage collection since it was made that the loop thread
    could not run through (a ``gc.callbacks`` hook that times each collection from its
    start to its stop): its own collections, and another thread's at whose start and end
    the loop thread waits in ``futex`` (for the GIL, which a collection holds throughout).

    Not another thread's collection as such: it may overlap a step in which the loop
    thread was itself stalled -- in a ``time.sleep``, a FIFO's open -- and subtracting
    it hid the stall (a 350 ms sleep charged 140 ms while a worker-sized heap was
    collected elsewhere: the loop watch's own test failed once in a full run). So at
    the start the loop thread must be waiting in ``futex`` or be runnable (on its way
    to ``futex`` for the GIL -- on a loaded machine it can sit in the run queue at that
    instant: the whole collection was charged to it once, 586 ms), and at the end it
    must be in ``futex``; a thread asleep at the start is never excused."""

    def __init__(self) -> None:
        self.total = 0.0
        self._started: float | None = None
        self._thread = threading.get_ident()
        self._loop_in_futex = _futex_wait_reader()
        self._loop_runnable = _runnable_reader()
        gc.callbacks.insert(0, self._on_gc)  # first: it times the other callbacks too

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            mine = threading.get_ident() == self._thread
            waits = mine or self._loop_in_futex() or self._loop_runnable()
            self._started = time.perf_counter() if waits else None
        elif self._started is not None:
            if threading.get_ident() == self._thread or self._loop_in_futex():
                self.total += time.perf_counter() - self._started
            self._started = None

    def close(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)


class MachineTime:
    """Seconds a busy machine took from the thread that made it, since then: its waits
    in the kernel's run queue for a CPU, and the garbage collections it could not run
    through (a full one of an xdist worker's big heap takes a while). A test that bounds
    its own wall time subtracts this -- its margin, measured -- so a loaded machine
    does not fail it and a slow product still does. Use it as a context manager."""

    def __init__(self) -> None:
        self._run_delay = _schedstat_reader()
        self._collector = _CollectorClock()
        self._delay0 = self._run_delay() if self._run_delay is not None else 0.0
        self._final: float | None = None

    def __call__(self) -> float:
        """So far; once the block has ended, up to its end."""
        if self._final is not None:
            return self._final
        waited = self._run_delay() - self._delay0 if self._run_delay is not None else 0.0
        return waited + self._collector.total

    def __enter__(self) -> MachineTime:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._final = self()
        self._collector.close()
        fd = getattr(self._run_delay, "fd", None)
        if fd is not None:
            os.close(fd)


@attrs.define
class Block:
    """One task step that held the loop thread too long."""

    task: str
    held_s: float
    """Wall time less run-queue wait and garbage collection: on a CPU or blocked in
    the kernel."""
    wall_s: float


class LoopWatch(trio.abc.Instrument):
    """Times every task step of the trio run it is installed in (the loop thread)."""

    def __init__(self, limit_s: float = LIMIT_S) -> None:
        self.limit_s = limit_s
        self.blocks: list[Block] = []
        self.steps = 0
        self._run_delay = _schedstat_reader()
        self._collector = _CollectorClock()
        self._gc0 = 0.0
        self.longest = Block("", 0.0, 0.0)
        """The step that held the loop longest (for ``LOOP_WATCH_LOG``)."""
        self._wall0: float | None = None  # None: the step that installed it, unmeasured
        self._delay0 = 0.0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._wall0 = time.perf_counter()
        self._gc0 = self._collector.total
        if self._run_delay is not None:
            self._delay0 = self._run_delay()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if self._wall0 is None:
            return
        self.steps += 1
        wall = time.perf_counter() - self._wall0
        if wall <= self.limit_s / 4:
            return
        held = wall - (self._collector.total - self._gc0)
        if self._run_delay is not None:
            held -= self._run_delay() - self._delay0
        if held > self.longest.held_s:
            self.longest = Block(task.name, held, wall)
        if held > self.limit_s:
            self.blocks.append(Block(task.name, held, wall))

    def close(self) -> None:
        self._collector.close()
        fd = getattr(self._run_delay, "fd", None)
        if fd is not None:
            os.close(fd)
            self._run_delay = None

    def report(self) -> str | None:
        """What a failing test says, or None if no step went over the limit."""
        if not self.blocks:
            return None
        worst = sorted(self.blocks, key=lambda b: -b.held_s)[:5]
        lines = [
            f"  task {b.task!r} held it {b.held_s * 1000:.0f} ms ({b.wall_s * 1000:.0f} ms wall)"
            for b in worst
        ]
        return (
            f"the trio loop was blocked longer than {self.limit_s * 1000:.0f} ms "
            f"in {len(self.blocks)} of {self.steps} task steps:\n" + "\n".join(lines)
        )


def _finish(watch: LoopWatch, name: str) -> str | None:
    """Closes ``watch``, logs its longest step (``LOOP_WATCH_LOG``), and returns what
    the test fails with, if anything.

    With ``LOOP_WATCH_LOG=FILE`` each watched run appends its longest step to FILE. That
    is how the limit was chosen: on the 2-core machine at a load of 6-7, the longest step
    of any watched test held the loop 96 ms (a hypercorn connection handler, 286 ms wall),
    most stay under 35 ms; a stall (a FIFO, a backtracking pattern) holds it for seconds."""
    watch.close()
    log = os.environ.get("LOOP_WATCH_LOG")
    if log:
        worst = watch.longest
        with open(log, "a") as out:
            out.write(
                f"{worst.held_s * 1000:.1f}\t{worst.wall_s * 1000:.1f}\t{name}\t{worst.task}\n"
            )
    return watch.report()


def watched(test: Callable[..., Any], limit_s: float, name: str = "") -> Callable[..., Any]:
    """``test`` (an async test function) run with a :class:`LoopWatch` installed."""

    @functools.wraps(test)
    async def run(**kwargs: Any) -> None:
        watch = LoopWatch(limit_s)
        trio.lowlevel.add_instrument(watch)
        try:
            await test(**kwargs)
        finally:
            # end the test's last step while the watch still sees it
            await trio.lowlevel.cancel_shielded_checkpoint()
            trio.lowlevel.remove_instrument(watch)
        problem = _finish(watch, name)
        if problem is not None:
            pytest.fail(problem, pytrace=False)

    return run


def watched_sync(
    test: Callable[..., Any], limit_s: float, name: str, unwatched: Callable[[str], None]
) -> Callable[..., Any]:
    """``test`` (a plain test function) with every ``trio.run`` it makes, on any thread,
    run with a :class:`LoopWatch` installed: a sync test in a watched module is most
    often a fuzzer that drives its own trio loop. One that runs no trio loop here is
    reported through ``unwatched`` (its loop, if any, runs in another process)."""

    @functools.wraps(test)
    def run(**kwargs: Any) -> Any:
        plain_run = trio.run
        problems: list[str] = []
        runs = 0

        def watched_run(*args: Any, instruments: Sequence[Any] = (), **options: Any) -> Any:
            nonlocal runs
            runs += 1
            watch = LoopWatch(limit_s)  # made on the thread that runs the loop
            try:
                return plain_run(*args, instruments=[*instruments, watch], **options)
            finally:
                problem = _finish(watch, name)
                if problem is not None:
                    problems.append(problem)

        trio.run = watched_run
        try:
            result = test(**kwargs)
        finally:
            trio.run = plain_run
        if problems:
            pytest.fail("\n".join(problems), pytrace=False)
        if not runs:
            unwatched("it ran no trio loop in this process")
        return result

    return run


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "loop_watch(limit_s=0.2): fail a test whose trio task steps block the trio loop",
    )
    if not config.pluginmanager.has_plugin("loop_watch_unwatched"):  # loaded twice
        config.pluginmanager.register(Unwatched(), "loop_watch_unwatched")


_PROPERTY = "loop_watch: not watched"
"""The user property a test's report names a reason it was not watched in (the
report reaches pytest-xdist's controller from its worker with it)."""


class Unwatched:
    """Names every marked test that ran unwatched, by reason, at the end of the run: a
    silent gap in the watch is how both AG-UI fuzzers went unwatched (issue 39)."""

    def __init__(self) -> None:
        self.found: list[tuple[str, str]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call":
            self.found += [
                (report.nodeid, str(why)) for key, why in report.user_properties if key == _PROPERTY
            ]

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.found:
            return
        terminalreporter.section("loop watch: marked tests not watched", sep="-")
        for reason in sorted({why for _, why in self.found}):
            names = sorted(nodeid for nodeid, why in self.found if why == reason)
            terminalreporter.line(f"{len(names)}, {reason}:")
            for name in names:
                terminalreporter.line(f"  {name}")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """Wraps a marked test in the watch (before pytest-trio wraps it to run it): an
    async test as a whole, each example of an async Hypothesis test, each ``trio.run``
    of a plain test. A test it cannot watch is named in the summary at the end."""
    marker = item.get_closest_marker("loop_watch")
    obj = getattr(item, "obj", None)
    if marker is None or obj is None:
        yield
        return

    def unwatched(reason: str) -> None:
        item.user_properties.append((_PROPERTY, reason))

    limit = float(marker.kwargs.get("limit_s", LIMIT_S))
    hypothesis = getattr(obj, "hypothesis", None)
    if marker.args and not marker.args[0]:
        unwatched("turned off for it: loop_watch(False)")
    elif hypothesis is not None and inspect.iscoroutinefunction(hypothesis.inner_test):
        hypothesis.inner_test = watched(hypothesis.inner_test, limit, item.nodeid)
    elif not inspect.iscoroutinefunction(obj):
        item.obj = watched_sync(obj, limit, item.nodeid, unwatched)  # type: ignore[attr-defined]
    else:
        item.obj = watched(obj, limit, item.nodeid)  # type: ignore[attr-defined]
    yield
