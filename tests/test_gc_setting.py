"""The opt-in collector setting for many concurrent entities (cantrip.gc_for_throughput)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import trio

import cantrip
import gates


@pytest.fixture(autouse=True)
def _keep_thresholds() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_raises_only_the_young_threshold_inside_the_block() -> None:
    gc.set_threshold(700, 10, 10)
    with cantrip.gc_for_throughput():
        assert gc.get_threshold() == (50_000, 10, 10)
    assert gc.get_threshold() == (700, 10, 10)


def test_restores_after_an_exception_and_when_nested() -> None:
    gc.set_threshold(700, 10, 10)
    with pytest.raises(RuntimeError), cantrip.gc_for_throughput(20_000):
        assert gc.get_threshold()[0] == 20_000
        with cantrip.gc_for_throughput(90_000):
            assert gc.get_threshold()[0] == 90_000
        assert gc.get_threshold()[0] == 20_000
        raise RuntimeError("boom")
    assert gc.get_threshold() == (700, 10, 10)


def test_refuses_a_threshold_that_would_turn_collection_off() -> None:
    with pytest.raises(ValueError, match="at least 1"), cantrip.gc_for_throughput(0):
        pass


def test_casts_run_inside_it_and_cyclic_garbage_is_still_collected() -> None:
    spell = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM([{"tool_calls": [{"gate": "done", "args": {"answer": 1}}]}]),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([gates.done], [cantrip.max_turns(2)]),
    )

    class Cycle:
        def __init__(self) -> None:
            self.me = self

    with cantrip.gc_for_throughput(1_000):
        result = trio.run(spell.cast_async, "go")
        gc.collect()
        before = sum(1 for o in gc.get_objects() if type(o) is Cycle)
        for _ in range(5_000):  # well past the young threshold
            Cycle()
        after = sum(1 for o in gc.get_objects() if type(o) is Cycle)
    assert result.result == 1
    assert before == 0
    assert after < 1_000 + 10  # collected in batches, not left to pile up
