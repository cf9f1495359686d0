"""simulate_latency: one timer service per run, cheap to wait on, cancellable."""

from __future__ import annotations

import math
import random
import threading
import time
from typing import Any

import pytest
import trio
import trio.testing

from cantrip.llm import Message, ScriptedLLM, simulate_latency
from cantrip.llm._latency import _TIMER, _Timer


async def test_waits_at_least_the_given_time() -> None:
    for seconds in (0.001, 0.02, 0.05):
        before = trio.current_time()
        with trio.fail_after(5):
            await simulate_latency(seconds)
        assert trio.current_time() - before >= seconds


async def test_zero_checkpoints_and_bad_durations_raise_like_trio_sleep() -> None:
    with trio.testing.assert_checkpoints():
        await simulate_latency(0)
    with pytest.raises(ValueError, match="NaN"):
        await simulate_latency(math.nan)
    with pytest.raises(ValueError, match="non-negative"):
        await simulate_latency(-1)
    with trio.move_on_after(0.01) as scope:
        await simulate_latency(math.inf)
    assert scope.cancelled_caught


async def test_concurrent_sleepers_wake_in_deadline_order_each_on_time(
    autojump_clock: Any,
) -> None:
    delays = [0.01 * k for k in range(1, 60)]
    random.Random(7).shuffle(delays)
    woke: list[tuple[float, float]] = []
    start = trio.current_time()

    async def sleeper(seconds: float) -> None:
        await simulate_latency(seconds)
        woke.append((seconds, trio.current_time() - start))

    async with trio.open_nursery() as nursery:
        for seconds in delays:
            nursery.start_soon(sleeper, seconds)
    assert [seconds for seconds, _ in woke] == sorted(delays)
    for seconds, at in woke:
        assert at == pytest.approx(seconds)


async def test_an_earlier_deadline_arriving_later_rearms_the_service() -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(simulate_latency, 30)
        await trio.testing.wait_all_tasks_blocked()  # the service now waits for t+30
        before = time.perf_counter()
        with trio.fail_after(5):
            await simulate_latency(0.05)
        assert 0.05 <= time.perf_counter() - before < 5
        nursery.cancel_scope.cancel()


async def test_outer_cancellation_interrupts_immediately() -> None:
    before = time.perf_counter()
    with trio.move_on_after(0.02) as scope:
        await simulate_latency(60)
    assert scope.cancelled_caught
    assert time.perf_counter() - before < 5

    # A cancel scope cancelled before the wait starts: Cancelled at once.
    with trio.CancelScope() as scope:
        scope.cancel()
        await simulate_latency(60)
    assert scope.cancelled_caught


async def test_a_cancelled_sleeper_is_never_rescheduled_by_the_service(
    autojump_clock: Any,
) -> None:
    # The cancelled sleeper's dead heap entry (due at +0.2) is popped while that
    # same task waits again; waking it there would end its second wait early.
    start = trio.current_time()
    second_wait_ended: list[float] = []
    finished: list[int] = []

    async def cancelled_then_waits_again() -> None:
        with trio.move_on_after(0.1) as scope:
            await simulate_latency(0.2)
        assert scope.cancelled_caught
        await simulate_latency(1.0)
        second_wait_ended.append(trio.current_time() - start)

    async def plain(index: int) -> None:
        await simulate_latency(0.2 + 0.1 * index)
        finished.append(index)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancelled_then_waits_again)
        for index in range(5):
            nursery.start_soon(plain, index)
    assert finished == [0, 1, 2, 3, 4]
    assert second_wait_ended == [pytest.approx(1.1)]


async def test_cancelled_sleepers_do_not_pile_up_in_the_heap(autojump_clock: Any) -> None:
    async with trio.open_nursery() as nursery:
        for _ in range(3000):
            nursery.start_soon(simulate_latency, 3600)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert len(_TIMER.get().heap) < 2048


async def test_virtual_time_autojumps_over_a_simulated_hour(autojump_clock: Any) -> None:
    wall = time.perf_counter()
    before = trio.current_time()
    await simulate_latency(3600)
    assert trio.current_time() - before >= 3600 - 1e-6
    assert time.perf_counter() - wall < 5


def test_each_run_has_its_own_service_which_ends_with_the_run() -> None:
    timers: list[_Timer] = []

    async def main() -> None:
        with trio.fail_after(5):  # a timer leaked from the previous run would hang here
            await simulate_latency(0.01)
        timers.append(_TIMER.get())

    trio.run(main)
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert len(timers) == 2
    assert timers[0] is not timers[1]
    assert all(timer.closed for timer in timers)  # the run cancelled each service


class _StepCounter(trio.abc.Instrument):
    def __init__(self) -> None:
        self.steps: dict[str, int] = {}

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps[task.name] = self.steps.get(task.name, 0) + 1


async def test_one_service_wakes_a_whole_batch_of_sleepers(autojump_clock: Any) -> None:
    counter = _StepCounter()
    trio.lowlevel.add_instrument(counter)
    try:
        async with trio.open_nursery() as nursery:
            for _ in range(500):
                nursery.start_soon(simulate_latency, 0.05)
    finally:
        trio.lowlevel.remove_instrument(counter)
    timer_steps = [n for name, n in counter.steps.items() if "simulate_latency timer" in name]
    assert timer_steps == [2]  # started, then woke once for all 500


def test_a_shielded_wait_that_outlives_the_service_still_ends() -> None:
    # A system task's shielded wait survives the run's shutdown, which cancels the
    # timer service; the wait must still end, after its full time.
    waited: list[float] = []

    async def shielded() -> None:
        before = trio.current_time()
        with trio.CancelScope(shield=True):
            await simulate_latency(0.1)
        waited.append(trio.current_time() - before)

    async def main() -> None:
        trio.lowlevel.spawn_system_task(shielded)
        await trio.testing.wait_all_tasks_blocked()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "the run hung on a sleeper its timer never woke"
    assert waited and waited[0] >= 0.1


async def test_scripted_llm_latency_and_entry_delay_add_up(autojump_clock: Any) -> None:
    llm = ScriptedLLM(
        [{"content": "a"}, {"content": "b", "delay_ms": 500}, {"content": "c"}], latency_s=2.0
    )
    # virtual time: a timer that never wakes would otherwise hang, not fail
    with trio.fail_after(60):
        messages = [Message("user", "hi")]
        before = trio.current_time()
        assert (await llm.query(messages)).content == "a"
        assert trio.current_time() - before == pytest.approx(2.0)
        before = trio.current_time()
        assert (await llm.query(messages)).content == "b"
        assert trio.current_time() - before == pytest.approx(2.5)
        before = trio.current_time()
        assert (await llm.stream(messages, on_event=lambda event: None)).content == "c"
        assert trio.current_time() - before == pytest.approx(2.0)
    assert _TIMER.get().heap == []  # waited on the shared timer, not trio.sleep


async def test_a_scripted_delay_is_cancellable() -> None:
    llm = ScriptedLLM([{"content": "slow", "delay_ms": 60_000}])
    with trio.move_on_after(0.02) as scope:
        await llm.query([])
    assert scope.cancelled_caught
