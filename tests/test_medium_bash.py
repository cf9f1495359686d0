"""The bash medium (a persistent real shell per entity), through the public API.

Every test casts a real cantrip whose circle uses ``BashMedium``; a
:class:`cantrip.ScriptedLLM` turns ``{"code": ...}`` into a call of the one
offered tool, ``bash``. Each cast starts a real ``bash`` process.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

import cantrip
import gates
from cantrip import Cantrip, Circle, Identity, ScriptedLLM, Ward, max_turns
from mediums.bash import BashMedium

pytestmark = pytest.mark.loop_watch  # nothing here may block the trio loop (issue 28)

# -- gates used by the tests ---------------------------------------------------

CALLS: list[str] = []


@cantrip.gate
def tally(text: str) -> str:
    """Remember ``text`` on the host and return it in capitals."""
    CALLS.append(text)
    return text.upper()


@cantrip.gate
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@cantrip.gate
def boom(text: str) -> str:
    """Always fail."""
    raise cantrip.GateError(f"boom gate failed on {text}")


@cantrip.gate
async def slow(text: str) -> str:
    """Wait 0.4 s on the host, then return ``text``."""
    await trio.sleep(0.4)
    return text


EXTRA = (tally, add, boom, slow)


@pytest.fixture(autouse=True)
def _reset() -> None:
    CALLS.clear()


# -- helpers -------------------------------------------------------------------


def make(
    tmp_path: Path | None,
    *script: str | dict[str, Any],
    wards: Sequence[Ward] = (),
    max_output_chars: int = 20000,
) -> Cantrip:
    entries = [{"code": s} if isinstance(s, str) else s for s in script]
    return Cantrip(
        llm=ScriptedLLM(entries),
        identity=Identity(),
        circle=Circle(
            [gates.done, gates.echo, *EXTRA],
            [max_turns(10), *wards],
            BashMedium(workdir=tmp_path, max_output_chars=max_output_chars),
        ),
    )


async def cast(
    tmp_path: Path | None,
    *script: str | dict[str, Any],
    wards: Sequence[Ward] = (),
    max_output_chars: int = 20000,
) -> cantrip.CastResult:
    spell = make(tmp_path, *script, wards=wards, max_output_chars=max_output_chars)
    return await spell.cast_async("run the code")


def observations(result: cantrip.CastResult) -> list[str]:
    return [t.observation for t in result.turns]


def console(observation: str) -> list[str]:
    """The console lines of an observation (between ``console:`` and the next section)."""
    lines = observation.split("\n")
    assert "console:" in lines, observation
    out: list[str] = []
    for line in lines[lines.index("console:") + 1 :]:
        if line in ("host calls:",) or line.startswith("error: "):
            break
        out.append(line)
    return out


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting to be reaped counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def wait_gone(pid: int) -> None:
    """Killed processes are reaped by their new parent: allow that a moment."""
    with trio.move_on_after(3):
        while alive(pid):
            await trio.sleep(0.02)
    assert not alive(pid), f"process {pid} is still running"


# -- presentation --------------------------------------------------------------


async def test_one_required_bash_tool_that_says_it_is_no_sandbox(tmp_path: Path) -> None:
    spell = make(tmp_path, "submit_answer ok")
    result = await spell.cast_async("go")
    assert result.result == "ok"
    llm = spell.llm
    assert isinstance(llm, ScriptedLLM)
    query = llm.invocations[0]
    assert query.tool_choice == "required"
    assert [t.name for t in query.tools] == ["bash"]
    tool = query.tools[0]
    assert list(tool.parameters["properties"]) == ["code"]
    assert tool.parameters["required"] == ["code"]
    assert "NOT a sandbox" in tool.description
    # gate names that are free become commands; shell builtins go through cantrip_gate
    assert "- submit_answer ANSWER:" in tool.description
    assert "- tally TEXT:" in tool.description
    assert "- add A B:" in tool.description
    assert "- cantrip_gate echo TEXT:" in tool.description


# -- state ---------------------------------------------------------------------


async def test_cwd_exports_variables_and_functions_persist(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    result = await cast(
        tmp_path,
        'cd sub && export X=5; Y=7; greet() { echo "hi $1"; }; echo $$',
        'pwd; echo "$X $Y"; greet you; bash -c \'echo "child sees [$X] [$Y]"\'; echo $$',
        "submit_answer finished",
    )
    assert result.result == "finished"
    first, second, _ = observations(result)
    shell_pid = console(first)[0]
    assert console(second) == [
        str(tmp_path / "sub"),
        "5 7",
        "hi you",
        "child sees [5] []",  # exported reaches children, a plain variable does not
        shell_pid,  # the same shell process
    ]


async def test_default_workdir_is_fresh_per_session_and_removed_on_close() -> None:
    result = await cast(None, "pwd; touch made-here; ls", "submit_answer ok")
    lines = console(result.turns[0].observation)
    workdir = Path(lines[0])
    assert workdir.name.startswith("cantrip-bash-")
    assert lines[1:] == ["made-here"]
    assert not workdir.exists()


async def test_given_workdir_is_kept_and_home_is_it(tmp_path: Path) -> None:
    result = await cast(tmp_path, 'echo "$HOME"; echo data > kept.txt', "submit_answer ok")
    assert console(result.turns[0].observation) == [str(tmp_path)]
    assert (tmp_path / "kept.txt").read_text() == "data\n"


# -- done / gates --------------------------------------------------------------


async def test_submit_answer_ends_the_loop_and_skips_the_rest_of_the_code(
    tmp_path: Path,
) -> None:
    result = await cast(
        tmp_path,
        "echo before; submit_answer 'forty two'; echo after; touch should-not-exist",
        "echo never",
    )
    assert result.terminated and result.reason == "done"
    assert result.result == "forty two"
    assert len(result.turns) == 1
    turn = result.turns[0]
    assert console(turn.observation) == ["before"]
    assert [c.gate for c in turn.gate_calls] == ["done"]
    assert turn.gate_calls[0].args == {"answer": "forty two"}
    assert not (tmp_path / "should-not-exist").exists()


async def test_done_inside_a_function_in_a_loop_stops_everything(tmp_path: Path) -> None:
    result = await cast(
        tmp_path,
        'f() { submit_answer "$1"; echo in-f-after; }\n'
        "for i in 1 2 3; do echo loop $i; f $i; echo loop-after; done\necho end",
    )
    assert result.result == "1"
    assert console(result.turns[0].observation) == ["loop 1"]


async def test_cantrip_gate_done_and_the_done_keyword_hint(tmp_path: Path) -> None:
    result = await cast(tmp_path, "done 3", "cantrip_gate --json done '{\"answer\": [1, 2]}'")
    first = result.turns[0].observation
    assert "syntax error near unexpected token `done'" in first
    assert "error: exit status 2" in first
    assert "submit_answer" in first  # the hint
    assert result.result == [1, 2]
    assert result.reason == "done"


async def test_gates_are_commands_recorded_in_order(tmp_path: Path) -> None:
    result = await cast(
        tmp_path,
        'x=$(cantrip_gate echo "hello world"); echo "x=$x"\n'
        "tally abc\n"
        "sum=$(add 2 40); echo sum=$sum\n"
        "boom zap; echo boom-status=$?\n"
        'cantrip_gate --json add \'{"a": 1, "b": 2}\'\n'
        "cantrip_gate nosuch 1; echo nosuch-status=$?",
        "submit_answer ok",
    )
    turn = result.turns[0]
    assert [(c.gate, c.status) for c in turn.gate_calls] == [
        ("echo", "ok"),
        ("tally", "ok"),
        ("add", "ok"),
        ("boom", "error"),
        ("add", "ok"),
        ("nosuch", "error"),
    ]
    assert [c.result for c in turn.gate_calls[:3]] == ["hello world", "ABC", 42]
    assert CALLS == ["abc"]
    lines = console(turn.observation)
    assert lines[:3] == ["x=hello world", "ABC", "sum=42"]
    assert "boom: boom gate failed on zap" in lines
    assert "boom-status=1" in lines
    assert "3" in lines
    assert "nosuch-status=1" in lines
    assert "host calls:" in turn.observation
    assert "error: " not in turn.observation  # the last command succeeded


async def test_time_in_gates_does_not_count_against_max_eval_ms(tmp_path: Path) -> None:
    result = await cast(
        tmp_path,
        "slow a; slow b; slow c",
        "submit_answer ok",
        wards=[Ward("max_eval_ms", 300)],
    )
    first = result.turns[0]
    assert console(first.observation) == ["a", "b", "c"]
    assert [c.status for c in first.gate_calls] == ["ok", "ok", "ok"]
    assert "timed out" not in first.observation


# -- exit status, stderr, output cap -------------------------------------------


async def test_non_zero_exit_status_is_an_error_and_the_shell_lives_on(tmp_path: Path) -> None:
    result = await cast(
        tmp_path,
        "V=kept; echo partial; ls /definitely/not/here",
        "(exit 3)",
        'echo "$V"',
        "submit_answer ok",
    )
    first, second, third, _ = observations(result)
    assert console(first)[0] == "partial"
    assert "No such file or directory" in first
    assert first.endswith("error: exit status 2")
    assert second == "error: exit status 3"
    assert third == "console:\nkept"
    # a failed command makes an error turn, though no gate failed
    assert [t.is_error for t in result.turns] == [True, True, False, False]
    assert result.turns[1].extras["error"] == "exit status 3"


async def test_stderr_is_captured_in_order_with_stdout(tmp_path: Path) -> None:
    result = await cast(
        tmp_path, "echo one; echo two >&2; echo three; nosuchcommand_x", "submit_answer ok"
    )
    lines = console(result.turns[0].observation)
    assert lines == ["one", "two", "three", "bash: line 1: nosuchcommand_x: command not found"]
    assert "error: exit status 127" in result.turns[0].observation


async def test_output_is_capped_with_a_note(tmp_path: Path) -> None:
    result = await cast(tmp_path, "seq 1 100000", "submit_answer ok", max_output_chars=2000)
    observation = result.turns[0].observation
    assert len(observation) < 2600
    lines = console(observation)
    assert lines[0] == "1"
    assert lines[-1] == "100000"  # the end is kept too
    notes = [line for line in lines if line.startswith("[output truncated")]
    assert len(notes) == 1
    assert str(len("\n".join(str(i) for i in range(1, 100001)) + "\n")) in notes[0]
    assert "99999" not in lines[:-2] and "50000" not in lines


async def test_default_cap_bounds_a_flood(tmp_path: Path) -> None:
    result = await cast(tmp_path, "head -c 3000000 /dev/zero | tr '\\0' a", "submit_answer ok")
    observation = result.turns[0].observation
    assert 20000 <= len(observation) < 21000
    assert "[output truncated: 3000000 bytes in all" in observation


# -- time limit, shell death, cancellation -------------------------------------


async def test_timeout_kills_the_process_group_and_the_next_turn_gets_a_fresh_shell(
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    result = await cast(
        tmp_path,
        "export KEEP=yes; echo $$ > shell.pid",
        "sleep 300 & echo $! > bg.pid; echo started; sleep 30",
        'echo "[$KEEP]"; pwd; echo $$',
        "submit_answer ok",
        wards=[Ward("max_eval_ms", 500)],
    )
    assert time.monotonic() - started < 10
    _, timed_out, after, _ = observations(result)
    assert console(timed_out) == ["started"]
    assert "error: timed out after 500 ms" in timed_out
    assert result.turns[1].is_error
    shell_pid = int((tmp_path / "shell.pid").read_text())
    bg_pid = int((tmp_path / "bg.pid").read_text())
    await wait_gone(shell_pid)
    await wait_gone(bg_pid)  # the background child was in the killed process group
    assert "shell state was lost" in after
    assert "timed out" in after.split("\n")[0]
    lines = console(after)
    assert lines[:2] == ["[]", str(tmp_path)]
    assert int(lines[2]) != shell_pid
    assert result.result == "ok"


async def test_exit_ends_the_shell_and_the_next_turn_says_so(tmp_path: Path) -> None:
    result = await cast(tmp_path, "A=1; echo bye; exit 4", 'echo "[$A]"', "submit_answer ok")
    first, second, _ = observations(result)
    assert console(first) == ["bye"]
    assert "the shell exited (status 4)" in first
    assert "shell state was lost" in second
    assert console(second) == ["[]"]


async def test_a_cast_cut_off_by_timeout_s_kills_the_shell_and_the_entity_works_on(
    tmp_path: Path,
) -> None:
    spell = make(
        tmp_path,
        "echo $$ > shell.pid; sleep 300 & echo $! > bg.pid; sleep 30",
        "echo again",
        "submit_answer ok",
        wards=[cantrip.timeout(1.0)],
    )
    async with spell.summon() as entity:
        first = await entity.send("first")
        assert first.truncated and first.reason == "timeout"
        await wait_gone(int((tmp_path / "shell.pid").read_text()))
        await wait_gone(int((tmp_path / "bg.pid").read_text()))
        second = await entity.send("second")
    assert second.result == "ok"
    assert "shell state was lost" in second.turns[0].observation
    assert console(second.turns[0].observation) == ["again"]


async def test_closing_the_entity_kills_the_shell_and_its_jobs(tmp_path: Path) -> None:
    spell = make(tmp_path, "echo $$; sleep 300 & echo $!", "submit_answer ok")
    async with spell.summon() as entity:
        result = await entity.send("go")
        shell_pid, bg_pid = map(int, console(result.turns[0].observation))
        assert alive(shell_pid) and alive(bg_pid)  # the shell outlives the cast...
    await wait_gone(shell_pid)  # ...but not the entity
    await wait_gone(bg_pid)


async def test_two_entities_have_separate_shells(tmp_path: Path) -> None:
    spell_a = make(tmp_path, "V=a; echo $$", 'echo "[$V]"', "submit_answer ok")
    spell_b = make(tmp_path, "echo $$", 'echo "[$V]"', "submit_answer ok")
    a, b = await spell_a.cast_async("a"), await spell_b.cast_async("b")
    assert console(a.turns[0].observation) != console(b.turns[0].observation)
    assert console(a.turns[1].observation) == ["[a]"]
    assert console(b.turns[1].observation) == ["[]"]


# -- environment ---------------------------------------------------------------


async def test_environment_is_scrubbed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret-value")
    monkeypatch.setenv("CANTRIP_TEST_SECRET", "hush")
    assert os.environ["OPENAI_API_KEY"] == "sk-test-secret-value"
    result = await cast(
        tmp_path,
        'echo "[$OPENAI_API_KEY]"; echo "[$CANTRIP_TEST_SECRET]"; echo "$LANG"; env | sort',
        "submit_answer ok",
    )
    observation = result.turns[0].observation
    lines = console(observation)
    assert lines[:3] == ["[]", "[]", "C.UTF-8"]
    assert "sk-test-secret-value" not in observation and "hush" not in observation
    names = {line.split("=", 1)[0] for line in lines[3:]}
    assert {"PATH", "HOME", "LANG"} <= names
    assert names <= {"PATH", "HOME", "LANG", "PWD", "SHLVL", "_", "OLDPWD"}
