"""The loop watch itself: it reports a blocked loop, and only a blocked loop."""

from __future__ import annotations

import gc
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import trio
from loop_watch import LoopWatch, MachineTime

pytest_plugins = ["pytester"]


def test_a_step_that_blocks_the_loop_is_reported_with_its_task() -> None:
    watch = LoopWatch(0.2)

    async def stall() -> None:
        time.sleep(0.35)  # what a sync FIFO open or a backtracking regex does

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stall, name="stall")
            await trio.sleep(0.01)

    trio.run(main, instruments=[watch])
    watch.close()
    report = watch.report()
    assert report is not None
    assert "blocked longer than 200 ms" in report and "'stall'" in report
    (block,) = watch.blocks
    assert block.held_s >= 0.3


def test_waiting_in_a_thread_or_sleeping_is_not_a_block() -> None:
    watch = LoopWatch(0.2)

    async def main() -> None:
        await trio.to_thread.run_sync(time.sleep, 0.3)
        await trio.sleep(0.3)

    trio.run(main, instruments=[watch])
    watch.close()
    assert watch.report() is None and watch.steps > 0


def test_time_in_a_garbage_collection_is_not_charged_to_the_step() -> None:
    """A full collection of a big test process's heap is the process's, not a block
    the code made; here a collection is stretched to 350 ms by a slow gc callback."""
    watch = LoopWatch(0.2)

    def slow_collection(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            time.sleep(0.35)

    async def collects() -> None:
        gc.callbacks.append(slow_collection)
        try:
            gc.collect()
        finally:
            gc.callbacks.remove(slow_collection)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(collects, name="collects")

    started = time.perf_counter()
    trio.run(main, instruments=[watch])
    watch.close()
    assert time.perf_counter() - started >= 0.35  # the collection did hold the loop
    assert watch.report() is None, watch.report()


_READ = {"x86_64": "0", "aarch64": "63"}.get(platform.machine())
"""The ``read`` system call's number here (``/proc/.../syscall``)."""


def _wait_until_in_read(thread_id: int) -> None:
    """Returns once the thread ``thread_id`` (a native id) sits in ``read``: a waiting
    loop of its own, since any ``threading`` wait would be a ``futex`` of this thread."""
    if _READ is None:  # unknown here: then no thread is ever seen in futex either
        return
    path = f"/proc/self/task/{thread_id}/syscall"
    deadline = time.monotonic() + 30
    while Path(path).read_text().split(" ", 1)[0] != _READ:
        assert time.monotonic() < deadline, "the loop thread never blocked in read"
        time.sleep(0.001)


def test_a_collection_on_another_thread_does_not_hide_a_stall_of_the_loop() -> None:
    """Only the loop thread's own collections are not charged: another thread's
    collection (stretched by 300 ms here by a slow callback) through which the loop
    thread stays blocked -- in a ``read`` of a pipe nobody writes, as a FIFO's open is --
    leaves the step reported with all of that time.

    Ordered by the collection itself, not by sleeps: the loop thread is released only
    after the collection has ended, so at its end the loop thread is blocked, not
    waiting for the GIL. (With a fixed 600 ms stall instead, a full collection of a big
    test process's heap on a loaded machine outlasted it: the loop thread then rightly
    waited for the GIL at the collection's end, the whole collection was not charged,
    and the stall went unreported -- ``ValueError: not enough values to unpack`` in a
    full run at load 6-19.)"""
    watch = LoopWatch(0.2)
    loop_thread = threading.get_ident()
    loop_native_id = threading.get_native_id()
    collected = threading.Event()
    blocked_for = 0.0
    read_end, write_end = os.pipe()

    def slow_collection(phase: str, info: dict[str, int]) -> None:
        nonlocal blocked_for
        if phase == "start" and threading.get_ident() != loop_thread:
            _wait_until_in_read(loop_native_id)
            blocked_for = time.perf_counter()
            time.sleep(0.3)

    def collect_elsewhere() -> None:
        nonlocal blocked_for
        gc.collect()
        blocked_for = time.perf_counter() - blocked_for  # the loop thread is still in read
        collected.set()
        os.write(write_end, b"x")

    async def stall() -> None:
        thread = threading.Thread(target=collect_elsewhere)
        thread.start()
        os.read(read_end, 1)  # the loop thread is blocked until the collection has ended
        thread.join()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stall, name="stall")

    gc.callbacks.append(slow_collection)
    try:
        trio.run(main, instruments=[watch])
    finally:
        gc.callbacks.remove(slow_collection)
        watch.close()
        os.close(read_end)
        os.close(write_end)
    assert collected.is_set() and blocked_for >= 0.3
    (block,) = (block for block in watch.blocks if block.task == "stall")
    assert block.held_s >= blocked_for, (block, blocked_for)


def test_a_collection_on_another_thread_that_makes_the_loop_wait_is_not_charged() -> None:
    """Another thread's collection holds the GIL throughout: a loop thread that only
    waits in ``futex`` through it (for the GIL; here it joins that thread too) is not
    blocked by the code under test. Here a thread holds the GIL (C code runs no
    bytecode, so it is not handed over) while the loop thread starts waiting, then
    collects, holding it ~0.35 s more through a callback (sums, as many as take that
    long on this machine: a fixed count ran under 0.2 s on an idle one)."""
    watch = LoopWatch(0.2)
    loop_thread = threading.get_ident()
    collected = threading.Event()
    clock = time.perf_counter()
    sum(range(1_000_000))
    per_million = max(time.perf_counter() - clock, 1e-4)
    hog = max(15_000_000, int(0.35 / per_million * 1_000_000))

    def hog_the_gil(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and threading.get_ident() != loop_thread:
            sum(range(hog))
            collected.set()

    def collect_elsewhere() -> None:
        sum(range(1_000_000))  # the loop thread asks for the GIL meanwhile, and waits
        gc.collect()

    async def wait() -> None:
        thread = threading.Thread(target=collect_elsewhere)
        thread.start()
        thread.join()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait, name="wait")

    gc.callbacks.append(hog_the_gil)
    started = time.perf_counter()
    try:
        trio.run(main, instruments=[watch])
    finally:
        gc.callbacks.remove(hog_the_gil)
        watch.close()
    assert collected.is_set() and time.perf_counter() - started >= 0.2
    assert watch.report() is None, watch.report()


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """An inner pytest run in trio mode that finds the loop watch on its path."""
    here = str(Path(__file__).resolve().parent)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    )
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    # only the plugins this needs: every installed one (schemathesis, playwright, xdist,
    # hypothesis...) took most of this test's 16 s to import under load
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    return pytester


def test_a_marked_async_test_that_blocks_the_loop_fails(inner: pytest.Pytester) -> None:
    pytester = inner
    pytester.makepyfile(
        test_blocking="""
        import time
        import pytest
        import trio

        pytestmark = pytest.mark.loop_watch

        async def test_blocks():
            await trio.sleep(0)
            time.sleep(0.4)

        async def test_awaits():
            await trio.to_thread.run_sync(time.sleep, 0.4)

        @pytest.mark.loop_watch(False)
        async def test_opted_out():
            time.sleep(0.4)
        """
    )
    result = pytester.runpytest_subprocess("-p", "pytest_trio.plugin", "-p", "loop_watch", "-q")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_blocks*",
            "*the trio loop was blocked longer than 200 ms*",
            '*task "<test *test_blocks*>" held it 4?? ms*',
        ]
    )


def test_plain_and_hypothesis_tests_are_watched_and_the_rest_named(inner: pytest.Pytester) -> None:
    """A plain test's own ``trio.run`` calls (a fuzzer's, on any thread) and each example
    of an async Hypothesis test are watched; a marked test with no trio loop here, or
    turned off, is named in the summary -- from pytest-xdist's workers too."""
    inner.makepyfile(
        test_kinds="""
        import threading
        import time
        import pytest
        import trio
        from hypothesis import given, settings, strategies as st

        pytestmark = pytest.mark.loop_watch

        async def blocks():
            await trio.sleep(0)
            time.sleep(0.4)

        def test_plain_blocks():
            trio.run(trio.sleep, 0)
            trio.run(blocks)

        def test_plain_blocks_on_a_thread():
            thread = threading.Thread(target=trio.run, args=(blocks,))
            thread.start()
            thread.join()

        def test_plain_awaits():
            trio.run(trio.to_thread.run_sync, time.sleep, 0.4)

        def test_plain_without_a_loop():
            assert sum(range(10)) == 45

        @settings(max_examples=3, deadline=None)
        @given(st.integers(0, 1))
        async def test_hypothesis_blocks(n):
            await trio.sleep(0)
            time.sleep(0.4)

        @settings(max_examples=3, deadline=None)
        @given(st.integers(0, 1))
        async def test_hypothesis_awaits(n):
            await trio.to_thread.run_sync(time.sleep, 0.1)

        @pytest.mark.loop_watch(False)
        def test_turned_off():
            trio.run(blocks)
        """
    )
    plugins = ["-p", "pytest_trio.plugin", "-p", "loop_watch", "-p", "xdist.plugin"]
    result = inner.runpytest_subprocess(*plugins, "-n", "1", "-rf")
    result.assert_outcomes(passed=4, failed=3)
    result.stdout.fnmatch_lines_random(
        [
            "FAILED test_kinds.py::test_plain_blocks - Failed: the trio*",
            "FAILED test_kinds.py::test_plain_blocks_on_a_thread - Failed: the trio*",
            "FAILED test_kinds.py::test_hypothesis_blocks - *the trio*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*- loop watch: marked tests not watched -*",
            "1, it ran no trio loop in this process:",
            "  test_kinds.py::test_plain_without_a_loop",
            "1, turned off for it: loop_watch(False):",
            "  test_kinds.py::test_turned_off",
        ]
    )


def test_machine_time_counts_waits_for_a_cpu_and_collections_not_sleeps() -> None:
    """What a test with a wall-time bound subtracts: a collection (stretched to 300 ms
    by a slow callback) and the time the thread waited for a CPU -- 500 ms of spinning
    on one CPU that five spinning processes share with it -- count; a 300 ms sleep does
    not."""

    def slow_collection(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            time.sleep(0.3)

    with MachineTime() as taken:
        time.sleep(0.3)
        assert taken() < 0.1
        gc.callbacks.append(slow_collection)
        try:
            gc.collect()
        finally:
            gc.callbacks.remove(slow_collection)
        assert taken() >= 0.3
        collected = taken()
        cpu = os.sched_getaffinity(0)
        one = {min(cpu)}
        hog = f"import os\nos.sched_setaffinity(0, {one!r})\nprint('ready', flush=True)\n"
        hog += "while 1: pass"
        hogs = [
            subprocess.Popen([sys.executable, "-c", hog], stdout=subprocess.PIPE) for _ in range(5)
        ]
        try:
            for started in hogs:  # each spins on that CPU from now on
                assert started.stdout is not None and started.stdout.readline() == b"ready\n"
            os.sched_setaffinity(0, one)
            try:
                end = time.perf_counter() + 0.5
                while time.perf_counter() < end:
                    pass
            finally:
                os.sched_setaffinity(0, cpu)
        finally:
            for started in hogs:
                started.kill()
                started.wait()
        assert taken() - collected >= 0.2  # of 0.5 s on a CPU shared six ways
