"""The JavaScript medium (QuickJS in a worker process), through the public API.

Every test casts a real cantrip whose circle uses ``JsMedium``; a
:class:`cantrip.ScriptedLLM` turns ``{"code": ...}`` into a call of the one
offered tool, ``js``. Each cast starts a real sandbox worker process.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

import cantrip
import gates
from cantrip import Cantrip, Circle, Identity, ScriptedLLM, Ward, max_turns
from mediums.js import JsMedium

pytestmark = pytest.mark.loop_watch  # nothing here may block the trio loop (issue 28)

# -- gates used by the tests ---------------------------------------------------

CALLS: list[str] = []
"""What the ``tally`` gate saw: proves whether a gate body actually ran."""


@cantrip.gate
def tally(text: str) -> str:
    """Remember ``text`` on the host and return it."""
    CALLS.append(text)
    return text


@cantrip.gate
def boom(text: str) -> str:
    """Always fail."""
    raise cantrip.GateError(f"boom gate failed on {text}")


@cantrip.gate
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@cantrip.gate
async def slow(text: str) -> str:
    """Wait half a second on the host, then shout ``text``."""
    await trio.sleep(0.5)
    return text.upper()


SEEN_WORKERS: list[set[int]] = []


@cantrip.gate
def snapshot() -> int:
    """Note which sandbox workers are alive right now (called from inside the code)."""
    SEEN_WORKERS.append(js_workers())
    return len(SEEN_WORKERS[-1])


EXTRA = (tally, boom, add, slow, snapshot)


@pytest.fixture(autouse=True)
def _reset() -> None:
    CALLS.clear()
    SEEN_WORKERS.clear()


# -- helpers -------------------------------------------------------------------


def js_workers() -> set[int]:
    """Pids of this process's live JS sandbox workers (zombies have no cmdline)."""
    me = os.getpid()
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == me and b"_js_worker.py" in cmdline:
            found.add(int(entry))
    return found


def assert_gone(pid: int) -> None:
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def make(
    *script: str | dict[str, Any],
    wards: Sequence[Ward] = (),
    medium: JsMedium | None = None,
) -> Cantrip:
    entries = [{"code": s} if isinstance(s, str) else s for s in script]
    return Cantrip(
        llm=ScriptedLLM(entries),
        identity=Identity(),
        circle=Circle(
            [gates.done, gates.echo, *EXTRA],
            [max_turns(10), *wards],
            medium or JsMedium(),
        ),
    )


async def cast(
    *script: str | dict[str, Any],
    wards: Sequence[Ward] = (),
    medium: JsMedium | None = None,
) -> cantrip.CastResult:
    return await make(*script, wards=wards, medium=medium).cast_async("run the code")


def observations(result: cantrip.CastResult) -> list[str]:
    return [t.observation for t in result.turns]


def llm_of(spell: Cantrip) -> ScriptedLLM:
    llm = spell.llm
    assert isinstance(llm, ScriptedLLM)
    return llm


# -- presentation ----------------------------------------------------------------


async def test_one_js_tool_documents_host_functions_and_is_required() -> None:
    spell = make("var x = 40;", "done(x + 2);")
    result = await spell.cast_async("compute")
    assert result.result == 42
    query = llm_of(spell).invocations[0]
    assert query.tool_choice == "required"
    assert [t.name for t in query.tools] == ["js"]
    tool = query.tools[0]
    assert tool.parameters["required"] == ["code"]
    assert list(tool.parameters["properties"]) == ["code"]
    description = tool.description
    assert "JavaScript" in description
    assert "done / submit_answer(answer)" in description
    assert "echo(text): Return ``text`` unchanged." in description
    assert "add(a, b): Add two integers." in description
    assert "tally(text)" in description
    assert "snapshot()" in description
    # The same single tool is offered on every query.
    assert [t.name for t in llm_of(spell).invocations[1].tools] == ["js"]


async def test_observation_reaches_the_llm_as_the_result_of_the_js_call() -> None:
    spell = make("console.log('hello'); echo('gate says hi'); 6 * 7", "done(1)")
    await spell.cast_async("talk")
    second = llm_of(spell).invocations[1].messages
    call_id = spell.loom.turns[0].tool_calls[0].id
    tool_messages = [m for m in second if m.role == "tool"]
    assert len(tool_messages) == 1
    message = tool_messages[0]
    assert message.tool_call_id == call_id
    assert message.name == "js"
    assert message.content is not None
    assert "console:\nhello" in message.content
    assert 'echo({"text": "gate says hi"}) -> gate says hi' in message.content
    assert "result: 42" in message.content


# -- state: persistence and isolation ------------------------------------------


async def test_state_persists_across_turns() -> None:
    result = await cast(
        "var x = 40;",
        "function twice(n) { return 2 * n; } var log = [x];",
        "log.push(twice(x)); log.length",
        "done({x: x + 2, log: log, twice: twice(21)});",
    )
    assert result.terminated and result.reason == "done"
    assert result.result == {"x": 42, "log": [40, 80], "twice": 42}
    assert observations(result)[0] == "(no output)"
    assert observations(result)[2] == "result: 2"


async def test_state_persists_across_casts_of_a_summoned_entity() -> None:
    spell = make(
        "var counter = 1; done(counter)",
        "counter += 1; function bump() { counter *= 10; return counter; } done(counter)",
        "done(bump())",
    )
    async with spell.summon() as entity:
        first = await entity.send("start")
        second = await entity.send("again")
        third = await entity.send("and again")
    assert (first.result, second.result, third.result) == (1, 2, 20)
    assert first.entity_id == second.entity_id == third.entity_id


async def test_separate_casts_get_separate_sandboxes() -> None:
    spell = make("var x = 1; done(x)", "done(typeof x)")
    assert (await spell.cast_async("one")).result == 1
    assert (await spell.cast_async("two")).result == "undefined"


async def test_two_entities_never_share_state() -> None:
    spell = make("done(0)")  # the entities bring their own scripts
    llm_a = ScriptedLLM([{"code": "var secret = 'A-only'; done(secret)"}, {"code": "done(secret)"}])
    llm_b = ScriptedLLM(
        [{"code": "done(typeof secret)"}, {"code": "var secret = 'B'; done(secret)"}]
    )
    async with spell.summon(llm=llm_a) as a, spell.summon(llm=llm_b) as b:
        assert (await a.send("set")).result == "A-only"
        assert (await b.send("peek")).result == "undefined"
        assert (await b.send("overwrite")).result == "B"
        assert (await a.send("read")).result == "A-only"


async def test_concurrent_entities_stay_isolated() -> None:
    spell = make("done(0)")
    results: dict[str, Any] = {}

    async def run(name: str) -> None:
        llm = ScriptedLLM(
            [
                {"code": f"var who = '{name}'; var got = slow(who);"},
                {"code": "done([who, got])"},
            ]
        )
        async with spell.summon(llm=llm) as entity:
            results[name] = (await entity.send(f"be {name}")).result

    async with trio.open_nursery() as nursery:
        for name in ("left", "right", "middle"):
            nursery.start_soon(run, name)
    assert results == {
        "left": ["left", "LEFT"],
        "right": ["right", "RIGHT"],
        "middle": ["middle", "MIDDLE"],
    }


# -- termination: done / submit_answer -------------------------------------------


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("done(42)", 42),
        ("done(40 + 2.5)", 42.5),
        ("done('text')", "text"),
        ("done(null)", None),
        ("done(true)", True),
        (
            "done({a: [1, 2], b: {c: 'x'}, d: null, e: false})",
            {"a": [1, 2], "b": {"c": "x"}, "d": None, "e": False},
        ),
        ("submit_answer([1, 'two', 3.5, {n: 4}])", [1, "two", 3.5, {"n": 4}]),
        ("submit_answer(7)", 7),
    ],
)
async def test_done_terminates_with_json_values(code: str, expected: Any) -> None:
    result = await cast(code)
    assert result.terminated and result.reason == "done"
    assert len(result.turns) == 1
    assert result.result == expected
    assert type(result.result) is type(expected)
    record = result.turns[0].gate_calls[0]
    assert record.gate == "done"  # submit_answer is recorded under the gate's own name
    assert record.status == "ok" and not record.is_error
    assert dict(record.args) == {"answer": expected}


async def test_ints_stay_ints_through_gates() -> None:
    result = await cast("done([add(2, 3), add({a: 4, b: 5}), echo('x')])")
    assert result.result == [5, 9, "x"]
    assert [type(v) for v in result.result] == [int, int, str]
    assert [dict(r.args) for r in result.turns[0].gate_calls[:2]] == [
        {"a": 2, "b": 3},
        {"a": 4, "b": 5},
    ]


async def test_code_after_done_does_not_run() -> None:
    result = await cast("done(1); console.log('after done'); tally('after done'); 99")
    assert result.result == 1
    turn = result.turns[0]
    assert "after done" not in turn.observation
    assert "99" not in turn.observation
    assert [r.gate for r in turn.gate_calls] == ["done"]
    assert CALLS == []


async def test_catching_dones_stop_does_not_resurrect_the_code() -> None:
    code = (
        "try { done('finished') } catch (e) { console.log('caught: ' + e.message) }\n"
        "console.log('still running');\n"
        "tally('after done');"
    )
    result = await cast(code)
    assert result.terminated and result.result == "finished"
    turn = result.turns[0]
    assert "caught" not in turn.observation
    assert "still running" not in turn.observation
    assert CALLS == []  # the gate body never ran
    assert [(r.gate, r.status, r.executed) for r in turn.gate_calls] == [
        ("done", "ok", True),
        ("tally", "skipped", False),
    ]


async def test_second_code_call_after_done_is_skipped() -> None:
    utterance = {
        "tool_calls": [
            {"gate": "js", "args": {"code": "done('first')"}},
            {"gate": "js", "args": {"code": "tally('second call')"}},
        ]
    }
    result = await cast(utterance)
    assert result.result == "first"
    assert CALLS == []
    turn = result.turns[0]
    assert [(r.gate, r.status) for r in turn.gate_calls] == [
        ("done", "ok"),
        ("js", "skipped"),
    ]
    assert "skipped: done was already called" in turn.observation


async def test_gates_called_by_promise_jobs_run_and_respect_done() -> None:
    result = await cast(
        "async function f() { var a = tally('x'); await null; return a + tally('y'); }\n"
        "f().then(function (v) { console.log('async got ' + v) }); 'sync part'",
        "Promise.resolve().then(function () { done(5) });\n"
        "Promise.resolve().then(function () { tally('late') });",
    )
    first, second = result.turns
    assert "console:\nasync got xy" in first.observation
    assert 'result: "sync part"' in first.observation
    assert result.result == 5
    assert CALLS == ["x", "y"]
    assert [(r.gate, r.status) for r in second.gate_calls] == [("done", "ok"), ("tally", "skipped")]


async def test_other_tools_than_js_are_refused() -> None:
    result = await cast({"tool_calls": [{"gate": "tally", "args": {"text": "direct"}}]}, "done(1)")
    first = result.turns[0]
    assert "this circle's medium is JavaScript" in first.observation
    assert first.gate_calls == ()
    assert CALLS == []
    assert result.result == 1


# -- errors are observations -------------------------------------------------------


async def test_gate_failure_is_a_catchable_js_error() -> None:
    spell = make(
        "var seen;\n"
        "try { boom('a') } catch (e) { seen = [e instanceof Error, e.name, e.message] }\n"
        "seen",
        "done(seen)",
    )
    result = await spell.cast_async("fail softly")
    assert result.result == [True, "Error", "boom gate failed on a"]
    first = result.turns[0]
    assert "error:" not in first.observation  # caught, so not an uncaught error
    assert "boom gate failed on a [error]" in first.observation
    stored = spell.loom.get(first.id)
    [record] = stored.gate_calls
    assert (record.gate, record.is_error, record.status) == ("boom", True, "error")
    assert record.result == "boom gate failed on a"


async def test_uncaught_gate_failure_ends_the_code_and_the_loop_continues() -> None:
    result = await cast("boom('b'); tally('not reached')", "done('recovered')")
    first = result.turns[0]
    assert "error: Error: boom gate failed on b" in first.observation
    assert [(r.gate, r.is_error) for r in first.gate_calls] == [("boom", True)]
    assert CALLS == []
    assert result.result == "recovered"


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("echo(1, 2, 3)", "echo() takes 1 argument(s) (text); 2 too many given"),
        ("echo()", "missing required argument 'text'"),
        ("echo(5)", "argument 'text': Input should be a valid string"),
        ("add({a: 1, b: 'two'})", "argument 'b'"),
        ("add(1)", "missing required argument 'b'"),
    ],
)
async def test_wrong_gate_arguments(code: str, message: str) -> None:
    result = await cast(f"var r; try {{ {code} }} catch (e) {{ r = e.message }} r", "done(r)")
    assert message in result.result
    record = result.turns[0].gate_calls[0]
    assert record.is_error and record.status == "error"
    assert message in record.text
    uncaught = await cast(code, "done('next turn ran')")
    assert f"error: Error: {uncaught.turns[0].gate_calls[0].text}" in uncaught.turns[0].observation
    assert uncaught.result == "next turn ran"


async def test_undefined_function_is_a_reference_error() -> None:
    result = await cast("read('/etc/passwd')", "done('ok')")
    first = result.turns[0]
    assert "error: ReferenceError: read is not defined" in first.observation
    assert first.gate_calls == ()
    assert result.result == "ok"


async def test_syntax_error_is_an_observation_and_state_survives() -> None:
    result = await cast("var kept = 'yes';", "var = ;", "done(kept)")
    assert observations(result)[1].startswith("error: SyntaxError")
    assert result.result == "yes"


async def test_uncaught_throw_is_an_observation_and_the_loop_continues() -> None:
    result = await cast(
        "var before = 1; throw new Error('x'); before = 2",
        "throw {custom: true}",
        "done(before)",
    )
    assert observations(result)[0] == "error: Error: x"
    assert observations(result)[1].startswith("error:")
    assert result.result == 1
    assert not result.turns[0].terminated and not result.turns[0].truncated


async def test_an_unprintable_thrown_value_is_an_error_not_a_restart() -> None:
    result = await cast(
        "var kept = 'still here'; throw {toString: function () { throw 1 }}", "done(kept)"
    )
    first = result.turns[0].observation
    assert first.startswith("error: Error: uncaught exception whose value cannot be shown")
    assert "restart" not in first
    assert result.result == "still here"


# -- what the entity sees ------------------------------------------------------------


async def test_console_output() -> None:
    result = await cast(
        "console.log('a', 1, {b: 2}, [1, 2]); console.error('to stderr?'); "
        "console.info(null, undefined, true); 3",
        "done(1)",
    )
    assert observations(result)[0] == (
        'console:\na 1 {"b":2} [1,2]\nto stderr?\nnull undefined true\nresult: 3'
    )


async def test_console_output_is_bounded() -> None:
    result = await cast(
        "for (var i = 0; i < 1000; i++) console.log(i + ' ' + 'x'.repeat(100));", "done(1)"
    )
    text = observations(result)[0]
    # 10 lines of 102 characters, 90 of 103, 900 of 104: 103890, of which 20000 are shown
    assert text.endswith("[output truncated: 83890 more characters not shown]")
    assert len(text) < 25_000
    assert "999 " not in text


async def test_one_huge_console_line_is_cut_in_the_worker() -> None:
    result = await cast("console.log('x'.repeat(30 * 1000 * 1000)); 1", "done(1)")
    text = observations(result)[0]
    assert text.endswith("[output truncated: 29980000 more characters not shown]\nresult: 1")
    assert len(text) < 25_000


async def test_large_values_are_shown_viewport_style() -> None:
    spell = make(
        "'a'.repeat(5000)",
        "Array.from({length: 1000}, function (_, i) { return i })",
        "var big = echo('b'.repeat(2000)); big.length",
        "({short: 'shown verbatim'})",
        "done(1)",
    )
    result = await spell.cast_async("big values")
    texts = observations(result)
    assert texts[0].startswith("result: [Result: string, 5000 chars] 'aaaa")
    assert "a" * 200 not in texts[0]
    assert texts[1].startswith("result: [Result: array, 1000 items, ")
    assert "[Result: value, 2000 chars]" in texts[2]  # the gate's result
    assert 'echo([2012 chars] \'{"text": "bbbb' in texts[2]  # and its arguments
    assert "b" * 200 not in texts[2]
    assert texts[2].endswith("result: 2000")
    # The loom keeps the gate's whole result; only the view is summarised.
    assert result.turns[2].gate_calls[0].result == "b" * 2000
    assert texts[3] == 'result: {"short": "shown verbatim"}'


# -- the sandbox ----------------------------------------------------------------------


async def test_require_is_not_defined() -> None:
    result = await cast("require('fs').readFileSync('/etc/passwd')", "done(1)")
    assert observations(result)[0] == "error: ReferenceError: require is not defined"


async def test_no_std_or_os_modules() -> None:
    result = await cast(
        "done([typeof std, typeof os, typeof globalThis.std, typeof globalThis.os, "
        "typeof scriptArgs, typeof print, typeof process, typeof Deno])"
    )
    assert result.result == ["undefined"] * 8


async def test_modules_cannot_be_imported() -> None:
    result = await cast(
        "var r = {};\n"
        "['os', 'std', 'fs', './x.js'].forEach(function (name) {\n"
        "  r[name] = 'pending';\n"
        "  import(name).then(function (m) { r[name] = 'loaded: ' + Object.keys(m) },\n"
        "                    function (e) { r[name] = 'refused: ' + e.message });\n"
        "});",
        "import * as os from 'os';",
        "done(r)",
    )
    assert set(result.result) == {"os", "std", "fs", "./x.js"}
    for outcome in result.result.values():
        assert outcome.startswith("refused: could not load module")
    assert observations(result)[1].startswith("error: SyntaxError")


async def test_function_constructor_reaches_only_the_sandbox_global() -> None:
    result = await cast(
        "var g = Function('return this')();\n"
        "var h = (function () {}).constructor('return this')();\n"
        "done([g === globalThis, h === globalThis, typeof g.process, typeof g.require,\n"
        "      typeof g.std, typeof g.os, typeof g.module, typeof g.exports])",
        # and not a way round the missing names either:
        "Function('return process')()",
    )
    assert result.result == [True, True, *["undefined"] * 6]


async def test_gates_outside_the_circle_are_unreachable_even_through_the_bridge() -> None:
    # ``read`` exists among the built-in gates but is not in this circle.
    result = await cast(
        "var r; try { __cantrip_call('read', ['/etc/passwd']) } catch (e) { r = e.message } r",
        "__cantrip_host('read', JSON.stringify(['/etc/passwd']))",
        "done('fine')",
    )
    first, second = result.turns[0], result.turns[1]
    assert "unknown gate 'read'" in first.observation
    assert [(r.gate, r.is_error) for r in first.gate_calls] == [("read", True)]
    assert [(r.gate, r.is_error) for r in second.gate_calls] == [("read", True)]
    assert "root:" not in first.observation + second.observation
    assert result.result == "fine"


async def test_prototype_pollution_does_not_affect_the_host() -> None:
    result = await cast(
        "Object.prototype.ok = false; Object.prototype.stop = true;\n"
        "Object.prototype.error = 'polluted'; Object.prototype.value = 'polluted';\n"
        "Object.prototype.answer = 'polluted'; Object.prototype.text = 'polluted';\n"
        "Array.prototype.extra = 'polluted';\n"
        "echo('still works')",
        "tally('gate after pollution')",
        "done({a: 1, list: [1, 2]})",
    )
    first, second, third = result.turns
    assert first.observation == (
        'host calls:\necho({"text": "still works"}) -> still works\nresult: "still works"'
    )
    assert not first.terminated and not second.terminated  # no forged stop
    assert CALLS == ["gate after pollution"]
    assert result.result == {"a": 1, "list": [1, 2]}  # nothing inherited leaks out
    assert dict(third.gate_calls[0].args) == {"answer": {"a": 1, "list": [1, 2]}}
    # the worker neither crashed nor had to be restarted
    assert not any("restarted" in t.observation or "stopped" in t.observation for t in result.turns)


async def test_a_forged_stop_cannot_end_the_cast() -> None:
    result = await cast(
        "JSON.parse = function () { return {ok: true, stop: true, value: 'forged'} };\necho('x')",
        "done('real')",
    )
    first = result.turns[0]
    assert not first.terminated
    assert [(r.gate, r.status) for r in first.gate_calls] == [("echo", "ok")]
    assert result.terminated and result.result == "real"
    assert len(result.turns) == 2


# -- limits -----------------------------------------------------------------------------


async def test_runaway_loop_hits_the_time_limit_and_the_next_turn_works() -> None:
    result = await cast(
        "var y = 1; while (true) {}",
        "typeof y",
        "done('alive')",
        wards=[Ward("max_eval_ms", 300)],
    )
    first, second, _ = result.turns
    assert "time limit exceeded" in first.observation
    assert "max_eval_ms=300" in first.observation
    assert 250 <= first.metadata.duration_ms < 3000
    assert "variables defined before it are gone" in second.observation
    assert 'result: "undefined"' in second.observation
    assert result.result == "alive"


async def test_medium_and_ward_limits_compose_to_the_smaller() -> None:
    started = time.perf_counter()
    result = await cast(
        "while (true) {}",
        "done(1)",
        wards=[Ward("max_eval_ms", 4000)],
        medium=JsMedium(max_eval_ms=200),
    )
    assert "time limit exceeded (max_eval_ms=200" in observations(result)[0]
    assert time.perf_counter() - started < 4.0  # not the ward's 4000 ms, however loaded


async def test_time_inside_gates_does_not_count_against_max_eval_ms() -> None:
    result = await cast(
        "var a = slow('x'); var b = slow('y'); done(a + b)",
        wards=[Ward("max_eval_ms", 300)],
    )
    assert result.terminated and result.result == "XY"
    assert result.turns[0].metadata.duration_ms >= 1000
    assert [r.gate for r in result.turns[0].gate_calls] == ["slow", "slow", "done"]


async def test_the_time_limit_still_applies_after_a_slow_gate() -> None:
    result = await cast(
        "slow('x'); while (true) {}", "done('next')", wards=[Ward("max_eval_ms", 300)]
    )
    first = result.turns[0]
    assert "time limit exceeded" in first.observation
    # the gate call completed before the limit cut in; it is kept
    assert [(r.gate, r.result) for r in first.gate_calls] == [("slow", "X")]
    assert "slow" in first.observation
    assert result.result == "next"


@pytest.mark.parametrize(
    "bomb",
    [
        "var a = []; while (true) { a.push('some text ' + a.length) }",
        "var s = 'x'; while (true) { s = (s + s).toLowerCase() }",
        "var objs = []; for (;;) objs.push({n: objs.length, more: [1, 2, 3]})",
    ],
)
async def test_memory_bomb_is_out_of_memory_and_the_next_turn_works(bomb: str) -> None:
    result = await cast(
        bomb,
        "typeof a + ' ' + typeof s + ' ' + typeof objs",
        "var fresh = [1, 2, 3].map(function (n) { return {n: n} }); fresh.length",
        "done(echo('alive'))",
        wards=[Ward("max_memory_mb", 32)],
    )
    texts = observations(result)
    assert "out of memory" in texts[0]
    assert "max_memory_mb=32" in texts[0]
    assert "variables defined before it are gone" in texts[1]
    assert 'result: "undefined undefined undefined"' in texts[1]
    assert texts[2] == "result: 3"
    assert result.result == "alive"


async def test_string_doubling_hits_a_limit_and_the_next_turn_works() -> None:
    # quickjs-ng builds s + s as a rope: its string-length limit ends this before the
    # heap limit does; a catchable error, and the sandbox stays usable.
    result = await cast(
        "var s = 'x'; while (true) { s = s + s }",
        "done(echo('alive'))",
        wards=[Ward("max_memory_mb", 32)],
    )
    first = observations(result)[0]
    assert "InternalError: string too long" in first or "out of memory" in first
    assert result.result == "alive"


async def test_deep_recursion_is_a_stack_overflow_and_state_survives() -> None:
    result = await cast(
        "var keep = 7; function down(n) { return down(n + 1) + 1 } down(0)",
        "done(keep)",
    )
    assert observations(result)[0] == "error: RangeError: stack overflow (recursion too deep)"
    assert result.result == 7


# -- the worker process's lifetime ----------------------------------------------------------


async def test_closing_the_entity_kills_the_worker() -> None:
    spell = make("var x = 1; done(x)", "done(x + 1)")
    async with spell.summon() as entity:
        assert (await entity.send("first")).result == 1
        worker = entity._session._worker  # type: ignore[union-attr]  # private, for this check
        assert worker is not None
        pid = worker.pid
        os.kill(pid, 0)  # alive between casts: that is where the state lives
        assert (await entity.send("second")).result == 2
        assert pid in js_workers()
    assert_gone(pid)


async def test_no_worker_outlives_a_cast() -> None:
    before = js_workers()
    result = await cast("snapshot(); done(1)")
    assert result.result == 1
    [during] = SEEN_WORKERS
    new = during - before
    assert len(new) == 1
    assert_gone(new.pop())
    assert js_workers() <= before


async def cancelled_mid_evaluation(run: Callable[[], Awaitable[object]]) -> float:
    """Run ``run`` and cancel it once its code has called ``snapshot()``, so the cancel
    lands mid-evaluation whatever the machine's load (a fixed 0.3 s deadline was missed
    under load: the sandbox had not started yet); how long the cancel took to end it."""
    cancelled_at = 0.0
    with trio.fail_after(60), trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:

            async def cancel_once_running() -> None:
                nonlocal cancelled_at
                while not SEEN_WORKERS:
                    await trio.sleep(0.005)
                cancelled_at = time.perf_counter()
                scope.cancel()

            nursery.start_soon(cancel_once_running)
            await run()
            raise AssertionError("the code ended before it was cancelled")
    assert scope.cancelled_caught
    return time.perf_counter() - cancelled_at


async def test_cancelling_a_cast_mid_evaluation_kills_the_worker_and_records_the_turn() -> None:
    spell = make("echo('before the spin'); snapshot(); while (true) {}")
    before = js_workers()
    took = await cancelled_mid_evaluation(lambda: spell.cast_async("spin"))
    assert took < 3.0  # the cancel ended it, not the 5 s eval limit
    [during] = SEEN_WORKERS
    [pid] = during - before
    assert_gone(pid)
    [turn] = spell.loom.turns
    assert turn.truncated and turn.reason == "cancelled"
    assert not turn.terminated
    # nothing lost: the calls that completed are there, the code call is completed
    assert [(r.gate, r.status) for r in turn.gate_calls] == [
        ("echo", "ok"),
        ("snapshot", "ok"),
        ("js", "cancelled"),
    ]
    assert turn.gate_calls[0].result == "before the spin"
    assert turn.tool_calls[0].name == "js"
    assert "while (true)" in turn.utterance


async def test_a_summoned_entity_works_again_after_a_cancelled_send() -> None:
    spell = make(
        "var k = 1; snapshot(); slow('never returns in time')",
        "tally('second'); 'second result'",
        "done(typeof k)",
    )
    before = js_workers()
    async with spell.summon() as entity:
        await cancelled_mid_evaluation(lambda: entity.send("first"))
        [during] = SEEN_WORKERS
        [pid] = during - before
        assert_gone(pid)  # killed at once, not only when the entity closes
        result = await entity.send("second")
    first, second = result.turns
    assert CALLS == ["second"]  # the second code really ran, in a fresh sandbox
    assert "variables defined before it are gone" in first.observation
    assert 'result: "second result"' in first.observation
    assert result.result == "undefined"
    cut = spell.loom.entity_turns(entity.id)[0]
    assert cut.reason == "cancelled"
    assert [(r.gate, r.status) for r in cut.gate_calls] == [("snapshot", "ok"), ("js", "cancelled")]
    assert second.terminated


async def test_timeout_ward_mid_evaluation_kills_the_worker() -> None:
    # 1.5 s: room for the sandbox to start and the code to reach snapshot() on a loaded
    # machine, which a 0.5 s ward hardly left (the cast took 0.54 s at a load of 14)
    spell = make("snapshot(); while (true) {}", wards=[cantrip.timeout(1.5)])
    before = js_workers()
    started = time.perf_counter()
    result = await spell.cast_async("spin")
    assert time.perf_counter() - started < 4.5  # the ward ended it, not the 5 s eval limit
    assert result.truncated and result.reason == "timeout"
    [during] = SEEN_WORKERS
    [pid] = during - before
    assert_gone(pid)
    assert [(r.gate, r.status) for r in result.turns[0].gate_calls] == [
        ("snapshot", "ok"),
        ("js", "cancelled"),
    ]
