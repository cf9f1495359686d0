"""The Python medium (Monty sandbox), through the public API only."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

import cantrip
import gates
from cantrip import Cantrip, CastResult, Circle, Identity, ScriptedLLM, Ward, max_turns
from mediums.python import PythonMedium

pytestmark = pytest.mark.loop_watch  # nothing here may block the trio loop (issue 28)


def make(
    codes: Sequence[str],
    *,
    extra_gates: Sequence[cantrip.Gate] = (),
    wards: Sequence[Ward] = (),
    medium: PythonMedium | None = None,
) -> Cantrip:
    circle = Circle(
        [gates.done, gates.echo, *extra_gates],
        [max_turns(10), *wards],
        medium or PythonMedium(),
    )
    llm = ScriptedLLM([{"code": code} for code in codes])
    return Cantrip(llm=llm, identity=Identity(), circle=circle)


async def cast(codes: Sequence[str], **kwargs: Any) -> CastResult:
    return await make(codes, **kwargs).cast_async("work in python")


def calls(result: CastResult) -> list[tuple[str, Any, str]]:
    return [(r.gate, dict(r.args), r.status) for t in result.turns for r in t.gate_calls]


@cantrip.gate
def explode(reason: str) -> str:
    """Always fails."""
    raise cantrip.GateError(f"exploded: {reason}")


@cantrip.gate
def table() -> dict[str, Any]:
    """Structured data."""
    return {"rows": [1, 2, 3], "name": "t", "pair": (4, 5)}


# -- presentation ------------------------------------------------------------------


async def test_presents_one_required_python_tool_documenting_the_gates() -> None:
    spell = make(["done(1)"])
    tools = spell.circle.tools()
    assert [t.name for t in tools] == ["python"]
    assert spell.circle.tool_choice() == "required"
    assert tools[0].parameters["required"] == ["code"]
    description = tools[0].description
    assert "done / submit_answer(answer)" in description
    assert "echo(text)" in description
    assert PythonMedium().name == "python"
    assert {k.name for k in PythonMedium().ward_kinds()} == {"max_eval_ms", "max_memory_mb"}


# -- state and termination -----------------------------------------------------------


async def test_state_persists_across_turns_and_done_returns_an_int() -> None:
    result = await cast(["x = 40", "done(x + 2)"])
    assert result.terminated and result.reason == "done"
    assert result.result == 42
    assert type(result.result) is int
    assert len(result.turns) == 2
    assert result.turns[0].observation == "(no output)"


async def test_functions_and_classes_persist() -> None:
    result = await cast(
        [
            "def double(n):\n    return n * 2\n\nclass Box:\n    def __init__(self, v):\n"
            "        self.v = v",
            "b = Box(double(21))",
            "done(b.v)",
        ]
    )
    assert result.result == 42


async def test_submit_answer_is_an_alias_of_done() -> None:
    result = await cast(["submit_answer('finished')"])
    assert result.result == "finished"
    assert calls(result) == [("done", {"answer": "finished"}, "ok")]


async def test_done_with_structured_value_and_keyword_argument() -> None:
    result = await cast(["done(answer={'a': [1, 2], 'b': None})"])
    assert result.result == {"a": [1, 2], "b": None}


async def test_gates_are_first_class_functions() -> None:
    result = await cast(["finish = done\nsay = echo\nfinish(say('via alias'))"])
    assert result.result == "via alias"
    assert [c[0] for c in calls(result)] == ["echo", "done"]


async def test_code_after_done_is_skipped() -> None:
    result = await cast(["print('before')\ndone(7)\nprint('after')\necho('late')"])
    assert result.result == 7
    observation = result.turns[0].observation
    assert "before" in observation
    assert "after" not in observation
    assert "error" not in observation
    assert calls(result) == [("done", {"answer": 7}, "ok")]


async def test_done_cannot_be_swallowed_by_except_exception() -> None:
    code = "try:\n    done(1)\nexcept Exception:\n    print('swallowed')\necho('late')"
    result = await cast([code])
    assert result.result == 1
    assert "swallowed" not in result.turns[0].observation
    assert calls(result) == [("done", {"answer": 1}, "ok")]


async def test_gate_calls_after_a_swallowed_stop_are_recorded_as_skipped() -> None:
    code = (
        "try:\n    done(1)\nexcept BaseException:\n    pass\n"
        "try:\n    echo('late')\nexcept BaseException:\n    pass"
    )
    result = await cast([code])
    assert result.result == 1
    assert calls(result) == [("done", {"answer": 1}, "ok"), ("echo", {"args": ["late"]}, "skipped")]


# -- gate failures and arguments -----------------------------------------------------


async def test_gate_error_is_catchable_and_recorded_as_error() -> None:
    code = (
        "try:\n    explode('boom')\nexcept RuntimeError as e:\n    message = str(e)\n"
        "print('caught:', message)"
    )
    result = await cast([code, "done(message)"], extra_gates=[explode])
    assert "caught: exploded: boom" in result.turns[0].observation
    assert result.result == "exploded: boom"
    record = result.turns[0].gate_calls[0]
    assert (record.gate, record.is_error, record.status) == ("explode", True, "error")
    assert record.result == "exploded: boom"


async def test_uncaught_gate_error_is_an_error_observation() -> None:
    result = await cast(["explode('loud')", "done(0)"], extra_gates=[explode])
    observation = result.turns[0].observation
    assert "error: RuntimeError: exploded: loud" in observation
    assert "explode(" in observation and "[error]" in observation


async def test_wrong_gate_arguments() -> None:
    result = await cast(
        [
            "echo()",
            "echo('a', 'b')",
            "echo('a', text='b')",
            "echo(txt='a')",
            "r = echo(text='kw')\ndone(r)",
        ]
    )
    observations = [t.observation for t in result.turns]
    assert "error: RuntimeError: invalid arguments for gate 'echo'" in observations[0]
    assert "missing required argument 'text'" in observations[0]
    assert (
        "error: TypeError: echo() takes 1 argument(s) (text); 1 too many given" in (observations[1])
    )
    assert "multiple values for argument 'text'" in observations[2]
    assert "unexpected argument 'txt'" in observations[3]
    assert result.result == "kw"
    records = [r for t in result.turns for r in t.gate_calls]
    assert [r.is_error for r in records] == [True, True, True, True, False, False]
    assert records[1].args == {"args": ["a", "b"]}


async def test_gate_results_come_back_as_python_data() -> None:
    code = "t = table()\ndone([t['name'], sum(t['rows']), t['pair'][1], type(t['pair']).__name__])"
    result = await cast([code], extra_gates=[table])
    assert result.result == ["t", 6, 5, "tuple"]


# -- errors as observations -----------------------------------------------------------


async def test_unknown_function_is_a_name_error() -> None:
    result = await cast(["launch_missiles(3)", "done(1)"])
    observation = result.turns[0].observation
    assert "error: NameError: name 'launch_missiles' is not defined" in observation
    assert "line 1" in observation
    assert result.turns[0].gate_calls == ()
    assert result.result == 1


async def test_unknown_name_is_a_name_error() -> None:
    result = await cast(["y = undefined_thing + 1", "done(2)"])
    assert "NameError: name 'undefined_thing' is not defined" in result.turns[0].observation


async def test_syntax_error_observation_and_state_untouched() -> None:
    result = await cast(["x = 5", "def f(:\n    pass", "done(x)"])
    observation = result.turns[1].observation
    assert observation.startswith("error: SyntaxError")
    assert result.result == 5


async def test_runtime_error_reports_type_message_and_line() -> None:
    result = await cast(["a = 1\nb = 0\nc = a / b", "done(a)"])
    observation = result.turns[0].observation
    assert observation.startswith("error: ZeroDivisionError: division by zero")
    assert "line 3" in observation
    assert result.result == 1


# -- the sandbox boundary -----------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("import os\nos.listdir('/')", "PermissionError"),
        ("import os\nos.system('id')", "AttributeError: module 'os' has no attribute 'system'"),
        ("import os\nos.getenv('HOME')", "RuntimeError: 'os.getenv' is not supported"),
        ("open('/etc/passwd').read()", "PermissionError: Permission denied: '/etc/passwd'"),
        ("from pathlib import Path\nPath('/etc/passwd').read_text()", "PermissionError"),
        ("import subprocess", "ModuleNotFoundError: No module named 'subprocess'"),
        ("import socket", "ModuleNotFoundError: No module named 'socket'"),
        ("__import__('os')", "NameError: name '__import__' is not defined"),
        ("().__class__.__bases__[0].__subclasses__()", "AttributeError"),
        ("import sys\nsys.modules", "AttributeError: module 'sys' has no attribute 'modules'"),
    ],
)
async def test_sandbox_escapes_fail_as_observations(code: str, expected: str) -> None:
    result = await cast([code, "done('still fine')"])
    observation = result.turns[0].observation
    assert observation.startswith("error: ")
    assert expected in observation
    assert "root:" not in observation
    assert result.turns[0].gate_calls == ()
    assert result.result == "still fine"


# -- limits ------------------------------------------------------------------------------


async def test_infinite_loop_ends_the_turn_and_the_next_turn_works() -> None:
    started = time.perf_counter()
    result = await cast(
        ["x = 1", "while True:\n    x += 1", "done('alive')"],
        wards=[Ward("max_eval_ms", 300)],
    )
    elapsed = time.perf_counter() - started
    loop_observation = result.turns[1].observation
    assert "error: TimeoutError: the code ran longer than max_eval_ms=300" in loop_observation
    assert "notice: the sandbox was restarted" in result.turns[2].observation
    assert result.result == "alive"
    assert elapsed < 5


async def test_infinite_loop_inside_try_cannot_swallow_the_time_limit() -> None:
    code = (
        "while True:\n    try:\n        while True:\n            pass\n"
        "    except BaseException:\n        pass"
    )
    result = await cast([code, "done(3)"], wards=[Ward("max_eval_ms", 200)])
    assert "TimeoutError" in result.turns[0].observation
    assert result.result == 3


async def test_state_is_lost_after_a_time_limit_and_the_entity_is_told() -> None:
    result = await cast(
        ["x = 1", "while True:\n    pass", "x", "done('ok')"], wards=[Ward("max_eval_ms", 200)]
    )
    observation = result.turns[2].observation
    assert "variables defined before it are gone" in observation
    assert "NameError: name 'x' is not defined" in observation


async def test_memory_bomb_ends_the_turn_and_state_survives() -> None:
    result = await cast(
        ["x = 11", "s = 'x'\nwhile True:\n    s = s + s", "big = [0] * 10**9", "done(x)"],
        wards=[Ward("max_memory_mb", 16)],
    )
    for turn in result.turns[1:3]:
        assert "error: MemoryError: memory limit exceeded" in turn.observation
        assert "(max_memory_mb=16)" in turn.observation
    assert result.result == 11


async def test_memory_limit_cannot_be_caught() -> None:
    code = "try:\n    big = 'y' * (10**10)\nexcept MemoryError:\n    print('caught')"
    result = await cast([code, "done(0)"], wards=[Ward("max_memory_mb", 16)])
    assert "caught" not in result.turns[0].observation
    assert "MemoryError" in result.turns[0].observation


async def test_deep_recursion_ends_the_turn_and_state_survives() -> None:
    result = await cast(["x = 'kept'", "def f(n):\n    return f(n + 1)\n\nf(0)", "done(x)"])
    observation = result.turns[1].observation
    assert "error: RecursionError: maximum recursion depth exceeded" in observation
    assert len(observation) < 3000
    assert result.result == "kept"


async def test_sleep_counts_against_the_time_budget() -> None:
    started = time.perf_counter()
    result = await cast(
        ["import time\ntime.sleep(0.01)\n'slept'", "time.sleep(3600)", "done(1)"],
        wards=[Ward("max_eval_ms", 300)],
    )
    assert "result: 'slept'" in result.turns[0].observation
    assert "TimeoutError: sleeping exceeds max_eval_ms=300" in result.turns[1].observation
    assert time.perf_counter() - started < 5


async def test_wards_compose_with_the_medium_defaults() -> None:
    # the medium allows 100 ms; a looser ward does not loosen it
    medium = PythonMedium(max_eval_ms=100)
    started = time.perf_counter()
    result = await cast(
        ["while True:\n    pass", "done(0)"], wards=[Ward("max_eval_ms", 60_000)], medium=medium
    )
    assert "max_eval_ms=100" in result.turns[0].observation
    assert time.perf_counter() - started < 5


# -- observations ---------------------------------------------------------------------------


async def test_print_output_appears_in_the_observation() -> None:
    result = await cast(["print('hello', 1 + 1)\nprint('second line')", "done(0)"])
    assert result.turns[0].observation == "console:\nhello 2\nsecond line"


async def test_last_expression_value_is_shown_viewport_style() -> None:
    result = await cast(
        ["{'a': (1, 2), 'b': {3}}", "'text'", "list(range(1000))", "None", "done(0)"]
    )
    observations = [t.observation for t in result.turns]
    assert observations[0] == "result: {'a': (1, 2), 'b': {3}}"
    assert observations[1] == "result: 'text'"
    assert observations[2].startswith("result: [Result: list, 1000 items, 4890 chars] '[0, 1, 2")
    assert observations[3] == "(no output)"


async def test_console_and_host_calls_together() -> None:
    result = await cast(["print('a')\nr = echo('x')\nprint(r)\nr * 2", "done(0)"])
    assert result.turns[0].observation == (
        'console:\na\nx\nhost calls:\necho({"text": "x"}) -> x\nresult: \'xx\''
    )


async def test_text_only_answer_and_wrong_tool_are_handled() -> None:
    llm = ScriptedLLM(
        [
            {"tool_calls": [{"gate": "js", "args": {"code": "1"}}]},
            {"code": "x = 5"},
            {"content": "plain answer"},
        ]
    )
    circle = Circle([gates.done], [max_turns(5)], PythonMedium())
    result = await Cantrip(llm=llm, identity=Identity(), circle=circle).cast_async("go")
    assert "medium is Python: call the 'python' tool" in result.turns[0].observation
    assert result.turns[0].gate_calls == ()
    assert (result.reason, result.result) == ("text", "plain answer")


# -- isolation, recording, lifecycle ----------------------------------------------------------


async def test_two_entities_never_share_state() -> None:
    spell = make(["secret = 'mine'", "done(secret)"])
    other_llm = ScriptedLLM([{"code": "secret"}, {"code": "done('other')"}])
    first = spell.summon()
    second = spell.summon(llm=other_llm)
    async with first, second:
        mine = await first.send("set it")
        theirs = await second.send("look for it")
    assert mine.result == "mine"
    assert "NameError: name 'secret' is not defined" in theirs.turns[0].observation
    assert theirs.result == "other"


async def test_concurrent_entities_are_isolated() -> None:
    results: dict[int, Any] = {}

    async def run(n: int) -> None:
        spell = make([f"n = {n}", "total = sum(range(n + 1))", "done([n, total])"])
        results[n] = (await spell.cast_async("count")).result

    async with trio.open_nursery() as nursery:
        for n in (3, 10, 100):
            nursery.start_soon(run, n)
    assert results == {3: [3, 6], 10: [10, 55], 100: [100, 5050]}


async def test_the_loom_records_every_host_call_in_order() -> None:
    code = (
        "echo('a')\ntry:\n    explode('b')\nexcept RuntimeError:\n    pass\n"
        "for w in ['c', 'd']:\n    echo(w)"
    )
    spell = make([code, "echo('e')\nsubmit_answer('f')"], extra_gates=[explode])
    result = await spell.cast_async("record")
    expected = [
        ("echo", {"text": "a"}, "ok"),
        ("explode", {"reason": "b"}, "error"),
        ("echo", {"text": "c"}, "ok"),
        ("echo", {"text": "d"}, "ok"),
        ("echo", {"text": "e"}, "ok"),
        ("done", {"answer": "f"}, "ok"),
    ]
    assert calls(result) == expected
    stored = spell.loom.entity_turns(result.entity_id)
    assert [(r.gate, dict(r.args), r.status) for t in stored for r in t.gate_calls] == expected
    observation = stored[0].observation
    positions = [observation.index(f'"text": "{w}"') for w in "acd"]
    assert positions == sorted(positions)


async def test_state_survives_a_cast_cut_off_during_a_gate_call() -> None:
    ran: list[str] = []

    @cantrip.gate
    async def slow(label: str) -> str:
        """Takes a long time."""
        ran.append(label)
        await trio.sleep(30)
        return label

    llm = ScriptedLLM(
        [
            {"code": "x = 'before'"},
            {"code": "y = slow('once')\nx = 'after'"},
            {"code": "try:\n    y\n    has_y = True\nexcept NameError:\n    has_y = False"},
            {"code": "done([x, has_y])"},
        ]
    )
    circle = Circle([gates.done, slow], [max_turns(10), cantrip.timeout(0.5)], PythonMedium())
    spell = Cantrip(llm=llm, identity=Identity(), circle=circle)
    entity = spell.summon()
    async with entity:
        first = await entity.send("start")
        second = await entity.send("continue")
    assert first.reason == "timeout"
    assert [r.status for r in first.turns[-1].gate_calls] == ["cancelled"]
    # the interrupted code was finished off without calling anything: x kept, y never set
    assert second.result == ["before", False]
    assert ran == ["once"]


async def test_closing_an_entity_mid_feed_releases_the_sandbox() -> None:
    @cantrip.gate
    async def forever() -> None:
        """Never returns."""
        await trio.sleep_forever()

    llm = ScriptedLLM([{"code": "forever()"}])
    circle = Circle([gates.done, forever], [max_turns(3)], PythonMedium())
    spell = Cantrip(llm=llm, identity=Identity(), circle=circle)
    with trio.move_on_after(0.5) as scope:
        await spell.cast_async("hang")
    assert scope.cancelled_caught
    turns = spell.loom.turns
    assert turns[-1].reason == "cancelled"


def _monty_children() -> list[int]:
    """Pids of this process's ``monty`` worker children (Linux /proc)."""
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        if ppid == me and comm == "monty":
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
async def test_a_dead_worker_is_an_observation_and_the_next_turn_gets_a_fresh_sandbox() -> None:
    @cantrip.gate
    def kill_sandbox() -> int:
        """Kills the sandbox worker from outside, as the OS might."""
        pids = _monty_children()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        return len(pids)

    result = await cast(
        ["x = 1", "kill_sandbox()\nprint('unreachable')", "x = 2", "done(x)"],
        extra_gates=[kill_sandbox],
    )
    crashed = result.turns[1]
    assert crashed.gate_calls[0].result == 1
    assert "error: the code was stopped" in crashed.observation
    assert "the sandbox will restart without its state" in crashed.observation
    assert "unreachable" not in crashed.observation
    assert "variables defined before it are gone" in result.turns[2].observation
    assert result.result == 2
