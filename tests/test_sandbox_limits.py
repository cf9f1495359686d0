"""Resource limits and cut-offs in every medium (issue 13, items 3 and 4).

* After a memory-limit error whose memory is still held by the code's
  variables, the sandbox restarts (and says so) instead of failing every later
  code call -- ``done`` included.
* Runaway code is cut off promptly by ``timeout_s`` (or any cancellation) in
  every medium, even when the medium's own time limit is far away: the worker
  is killed and the next call gets a fresh sandbox. A blocking gate running in
  a thread is abandoned, recorded ``cancelled``.

The prompt cut-off is checked against a medium time limit of 60 s: without it
these casts would take a minute. The latency itself is measured in
``bench/medium_costs.py``, not here.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import trio

import cantrip
import gates
from cantrip import Cantrip, Circle, Identity, ScriptedLLM, Ward, max_turns
from mediums.bash import BashMedium
from mediums.js import JsMedium
from mediums.python import PythonMedium

# -- item 3: a heap kept full ------------------------------------------------------


async def cast(medium: Any, codes: list[str], wards: list[Ward]) -> cantrip.CastResult:
    circle = Circle([gates.done], [max_turns(len(codes)), *wards], medium)
    llm = ScriptedLLM([{"code": c} for c in codes])
    return await Cantrip(llm=llm, identity=Identity(), circle=circle).cast_async("fill it")


async def test_python_a_heap_kept_full_restarts_the_sandbox_and_done_still_ends_the_cast() -> None:
    keep_growing = "a = []\nwhile True:\n    a.append('x' * 1000)"
    result = await cast(PythonMedium(), [keep_growing, "done('end')"], [Ward("max_memory_mb", 16)])
    first, second = (t.observation for t in result.turns)
    assert "MemoryError: memory limit exceeded" in first
    assert "(max_memory_mb=16); the variables still fill the memory limit" in first
    assert "the sandbox will restart without its state" in first
    assert "variables defined before it are gone" in second
    assert result.result == "end"


async def test_python_a_bomb_whose_memory_is_freed_keeps_the_variables() -> None:
    result = await cast(
        PythonMedium(),
        ["x = 7", "s = 'x'\nwhile True:\n    s = s + s", "done(x)"],
        [Ward("max_memory_mb", 16)],
    )
    assert "restart" not in result.turns[1].observation
    assert result.result == 7


async def test_js_a_caught_out_of_memory_that_keeps_the_heap_full_restarts() -> None:
    hoard = (
        "var a = []; try { while (true) a.push('x'.repeat(1000) + a.length); } "
        "catch (e) {} a.length > 0"
    )
    result = await cast(JsMedium(), [hoard, "done('end')"], [Ward("max_memory_mb", 16)])
    first, second = (t.observation for t in result.turns)
    assert "out of memory (the variables fill the heap) (max_memory_mb=16)" in first
    assert "the sandbox will restart without its state" in first
    assert "variables defined before it are gone" in second
    assert result.result == "end"


# -- item 4: cut off on time ---------------------------------------------------------

RUNAWAY = {
    "python": (PythonMedium(max_eval_ms=60_000), "while True:\n    pass", "done(x)", "x = 1"),
    "js": (JsMedium(max_eval_ms=60_000), "while (true) {}", "done(x)", "var x = 1"),
    "bash": (BashMedium(max_eval_ms=60_000), "while :; do :; done", "submit_answer $x", "x=1"),
}


@pytest.mark.parametrize("name", sorted(RUNAWAY))
async def test_runaway_code_is_cut_off_by_timeout_s_and_the_entity_goes_on(name: str) -> None:
    medium, loop, finish, setup = RUNAWAY[name]
    circle = Circle([gates.done], [max_turns(10), Ward("timeout_s", 0.3)], medium)
    llm = ScriptedLLM(
        [
            {"code": setup},
            {"code": loop},
            {"code": "x=2" if name != "js" else "var x = 2"},
            {"code": finish},
        ]
    )
    spell = Cantrip(llm=llm, identity=Identity(), circle=circle)
    started = time.monotonic()
    async with spell.summon() as entity:
        cut = await entity.send("loop")
        elapsed = time.monotonic() - started
        after = await entity.send("finish")
    assert elapsed < 20, f"{name}: the runaway code ran {elapsed:.1f}s"  # not the 60 s limit
    last = cut.turns[-1]
    assert last.truncated and last.reason == "timeout"
    assert after.result in (2, "2")
    assert "gone" in after.turns[0].observation or "lost" in after.turns[0].observation


GATE_RELEASE = threading.Event()


@cantrip.gate(blocking=True)
def stuck(text: str) -> str:
    """Block a worker thread until the test releases it (at most 30 s)."""
    GATE_RELEASE.wait(30)
    return text


async def test_a_blocking_gate_is_abandoned_on_timeout_and_recorded_cancelled() -> None:
    GATE_RELEASE.clear()
    circle = Circle([gates.done, stuck], [max_turns(3), Ward("timeout_s", 0.3)])
    llm = ScriptedLLM([{"tool_calls": [{"gate": "stuck", "args": {"text": "x"}}]}])
    started = time.monotonic()
    try:
        result = await Cantrip(llm=llm, identity=Identity(), circle=circle).cast_async("wait")
    finally:
        GATE_RELEASE.set()  # let the abandoned thread finish
    assert time.monotonic() - started < 20  # not the gate's 30 s
    turn = result.turns[-1]
    assert turn.truncated and turn.reason == "timeout"
    assert [r.status for r in turn.gate_calls] == ["cancelled"]
    await trio.sleep(0)


async def test_a_python_cut_mid_code_is_recorded_and_a_fork_replays_it_as_a_reset() -> None:
    # The cut killed the worker, so the variables were lost: the cut turn says so, and a
    # fork from it resets the sandbox there instead of running the loop again (which
    # would take the whole 60 s limit) and ends up with the same (lost) state.
    medium = PythonMedium(max_eval_ms=60_000)
    circle = Circle([gates.done], [max_turns(10), Ward("timeout_s", 0.5)], medium)
    llm = ScriptedLLM([{"code": "x = 1"}, {"code": "while True:\n    pass"}])
    spell = Cantrip(llm=llm, identity=Identity(), circle=circle)
    cut = await spell.cast_async("loop")
    last = cut.turns[-1]
    assert last.truncated and last.extras.get("sandbox_lost") is True
    probe = "try:\n    x\n    kept = True\nexcept NameError:\n    kept = False\ndone(kept)"
    started = time.monotonic()
    forked = await spell.fork_async(last, "again", llm=ScriptedLLM([{"code": probe}]))
    assert time.monotonic() - started < 20
    assert forked.result is False
