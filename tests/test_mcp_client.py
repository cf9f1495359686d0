"""MCP servers as gates, against real server processes.

* ``toolbox`` -- written here with the official SDK (``mcp.server.MCPServer``),
  spoken to over stdio and over streamable HTTP on 127.0.0.1;
* ``mcp-server-time`` -- a published server from PyPI that works offline;
* ``misbehaving`` -- hand-written JSON-RPC, for the failures a real server can have.
"""

from __future__ import annotations

import io
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp_support import (
    BIN,
    PYTHON,
    TOOLBOX,
    alive,
    call,
    finish,
    free_port,
    marks,
    misbehaving,
    running,
    spell,
    started_pids,
    toolbox,
    wait_for_mark,
)

import cantrip
from cantrip._events import GateProgress
from cantrip._providers import ProviderStartError
from cantrip.cli._main import main as cli_main
from cantrip.mcp import MCPServer
from cantrip.spec import servers_from_tables
from gates import done, echo
from mediums.python import python


async def test_tools_become_gates_with_their_schema_and_results_become_observations(
    tmp_path: Path,
) -> None:
    log = tmp_path / "marks"
    script = [
        {
            "tool_calls": [
                {"gate": "tb_add", "args": {"a": 40, "b": 2}},
                {"gate": "tb_echo", "args": {"text": "hi"}},
                {"gate": "tb_weather", "args": {"city": "Oslo"}},
                {"gate": "tb_refuse", "args": {"reason": "not today"}},
            ]
        },
        finish("done"),
    ]
    seen_tools: list[Any] = []

    class Recording(cantrip.ScriptedLLM):
        async def query(self, messages: Any, tools: Any = (), *rest: Any, **kw: Any) -> Any:
            seen_tools.append(tools)
            return await super().query(messages, tools, *rest, **kw)

    s = spell(script, toolbox(log))
    s = s.with_(llm=Recording(script))
    outcome = await s.cast_async("use the tools")
    assert outcome.terminated and outcome.result == "done"
    calls = {r.gate: r for r in outcome.turns[0].gate_calls}
    assert calls["tb_add"].result == {"result": 42} and not calls["tb_add"].is_error
    assert calls["tb_echo"].result == {"result": "hi"}
    assert calls["tb_weather"].result == {"city": "Oslo", "celsius": 21.5}
    refused = calls["tb_refuse"]
    assert refused.is_error and refused.status == "error"
    assert "refused: not today" in refused.result  # isError -> is_error; the loop went on
    assert dict(refused.detail) == {"via": "mcp:tb", "mcp_tool": "refuse"}
    assert dict(calls["tb_add"].detail) == {"via": "mcp:tb", "mcp_tool": "add"}
    # The tool's JSON Schema reaches the provider unchanged (as the server lists it).
    presented = {t.name: t for t in seen_tools[0]}
    assert set(presented) == {
        "done",
        "tb_add",
        "tb_echo",
        "tb_weather",
        "tb_refuse",
        "tb_count",
        "tb_wait_forever",
        "tb_die",
        "tb_spawn",
        "tb_big",
        "tb_pid",
        "tb_env_digest",
    }
    assert presented["tb_add"].parameters == {
        "type": "object",
        "properties": {
            "a": {"title": "A", "type": "integer"},
            "b": {"title": "B", "type": "integer"},
        },
        "required": ["a", "b"],
        "title": "addArguments",
    }
    assert presented["tb_add"].description == "Add two integers."
    assert "call add 40 2" in marks(log)


async def test_progress_notifications_become_live_events(tmp_path: Path) -> None:
    events: list[GateProgress] = []
    s = spell([call("tb_count", n=3), finish()], toolbox(tmp_path / "m"))
    outcome = await s.cast_async(
        "count", on_event=lambda e: events.append(e) if isinstance(e, GateProgress) else None
    )
    assert outcome.turns[0].gate_calls[0].result == {"result": "counted to 3"}
    assert [(e.gate, e.progress, e.total, e.message) for e in events] == [
        ("tb_count", 1.0, 3.0, "step 1"),
        ("tb_count", 2.0, 3.0, "step 2"),
        ("tb_count", 3.0, 3.0, "step 3"),
    ]
    assert all(e.entity_id == outcome.entity_id for e in events)


async def test_allow_list_and_prefix(tmp_path: Path) -> None:
    seen: list[list[str]] = []

    class Names(cantrip.ScriptedLLM):
        async def query(self, messages: Any, tools: Any = (), *rest: Any, **kw: Any) -> Any:
            seen.append([t.name for t in tools])
            return await super().query(messages, tools, *rest, **kw)

    script = [call("plus", a=1, b=2), finish()]
    s = spell(script, toolbox(tmp_path / "m", tools=["add"], prefix="")).with_(llm=Names(script))
    outcome = await s.cast_async("add")
    assert seen[0] == ["done", "add"]
    assert outcome.turns[0].gate_calls[0].is_error  # "plus" is not a gate
    with pytest.raises(cantrip.ConstructionError, match="lists a name twice"):
        toolbox(tmp_path / "m", tools=["add", "add"])
    s2 = spell([call("tb_add", a=1, b=2), finish()], toolbox(tmp_path / "m", tools=["add"]))
    outcome = await s2.cast_async("add")
    assert outcome.turns[0].gate_calls[0].result == {"result": 3}, "default prefix: <name>_"


async def test_allow_list_naming_a_missing_tool_is_a_startup_error(tmp_path: Path) -> None:
    s = spell([finish()], toolbox(tmp_path / "m", tools=["add", "nope"]))
    with pytest.raises(ProviderStartError, match=r"does not offer \['nope'\]"):
        await s.cast_async("go")
    assert list(s.loom.turns) == []


async def test_a_name_collision_is_a_clear_spec_error_and_nothing_runs(tmp_path: Path) -> None:
    s = spell([finish()], toolbox(tmp_path / "m", prefix=""), gates=(done, echo))
    with pytest.raises(cantrip.ConstructionError) as raised:
        await s.cast_async("go")
    message = str(raised.value)
    assert "collision" in message and "'echo'" in message and "prefix" in message
    assert list(s.loom.turns) == [], "no turn was taken or lost"
    # The server that was started for the check was stopped again.
    assert not any(alive(pid) for pid in started_pids(tmp_path / "m"))


async def test_two_servers_with_one_prefix_collide(tmp_path: Path) -> None:
    a = toolbox(tmp_path / "a", name="one", prefix="t_")
    b = toolbox(tmp_path / "b", name="two", prefix="t_", tools=["add"])
    with pytest.raises(cantrip.ConstructionError, match="collision: 'two' provides 't_add'"):
        await spell([finish()], a, b).cast_async("go")


async def test_nothing_leaks_after_the_cast(tmp_path: Path) -> None:
    log = tmp_path / "m"
    outcome = await spell([call("tb_pid"), finish()], toolbox(log)).cast_async("pid")
    pid = outcome.turns[0].gate_calls[0].result["result"]
    assert started_pids(log) == [pid]
    assert not alive(pid), "the server process ended with the cast"


async def test_a_long_lived_entity_keeps_its_session_across_casts(tmp_path: Path) -> None:
    log = tmp_path / "m"
    s = spell([call("tb_pid"), finish(1), call("tb_pid"), finish(2)], toolbox(log))
    async with s.summon() as entity:
        first = await entity.send("one")
        second = await entity.send("two")
        pids = [o.turns[0].gate_calls[0].result["result"] for o in (first, second)]
        assert pids[0] == pids[1] and alive(pids[0])
    assert started_pids(log) == [pids[0]]
    assert not alive(pids[0])


async def test_a_server_that_dies_mid_call_is_an_error_and_comes_back(tmp_path: Path) -> None:
    log = tmp_path / "m"
    script = [call("tb_pid"), call("tb_die"), call("tb_pid"), finish()]
    outcome = await spell(script, toolbox(log)).cast_async("die")
    before, died, after = (t.gate_calls[0] for t in outcome.turns[:3])
    assert died.is_error and "closed the connection during the call" in died.result
    assert dict(died.detail)["via"] == "mcp:tb"
    assert not after.is_error, "the next call started the server again"
    assert after.result["result"] != before.result["result"]
    assert outcome.terminated and len(outcome.turns) == 4, "no turn was lost"
    assert len(started_pids(log)) == 2


async def test_a_servers_own_child_processes_end_with_the_cast(tmp_path: Path) -> None:
    log = tmp_path / "m"
    script = [call("tb_spawn"), call("tb_spawn", hold_stdout=True), finish()]
    outcome = await spell(script, toolbox(log)).cast_async("spawn")
    grandchildren = [t.gate_calls[0].result["result"] for t in outcome.turns[:2]]
    assert [f"spawned {p}" for p in grandchildren] == [m for m in marks(log) if "spawned" in m]
    assert not alive(started_pids(log)[0])
    assert not any(alive(p) for p in grandchildren), "the server's children ended with it"


async def test_a_server_that_crashes_while_its_child_holds_stdout_is_restarted(
    tmp_path: Path,
) -> None:
    log = tmp_path / "m"
    script = [
        call("tb_spawn", hold_stdout=True),
        call("tb_die", code=7),
        call("tb_pid"),
        finish(),
    ]
    outcome = await spell(script, toolbox(log, timeout_s=60)).cast_async("die")
    spawned, died, after = (t.gate_calls[0] for t in outcome.turns[:3])
    # Noticed by the process's exit, not by a timeout (the pipe stays open).
    assert died.is_error and "did not answer" not in died.result
    assert "closed the connection during the call (its process exited with status 7)" in (
        died.result
    )
    assert not alive(spawned.result["result"]), "the crashed server's group was ended"
    assert not after.is_error, "the next call started the server again"
    assert len(started_pids(log)) == 2 and started_pids(log)[1] == after.result["result"]
    assert outcome.terminated and len(outcome.turns) == 4


async def test_a_crashed_servers_children_end_at_the_crash_not_with_the_entity(
    tmp_path: Path,
) -> None:
    """Issue 39.7: a server that crashes between calls (killed, as the OOM killer
    would) takes its whole group with it at once: its grandchild does not wait for the
    next call, a restart or the entity's end (the stop path, which those run, ends the
    group too, and would hide a crash path that does not)."""
    log = tmp_path / "m"
    script = [call("tb_spawn"), finish(1), call("tb_pid"), finish(2)]
    s = spell(script, toolbox(log))
    async with s.summon() as entity:
        first = await entity.send("spawn")
        grandchild = first.turns[0].gate_calls[0].result["result"]
        server = started_pids(log)[0]
        os.kill(server, signal.SIGKILL)
        # No call is in flight or follows: only the crash path can end it.
        with trio.fail_after(10):
            while alive(grandchild):
                await trio.sleep(0.02)
        second = await entity.send("again")
        restarted = second.turns[0].gate_calls[0].result
        assert restarted == {"result": started_pids(log)[1]}, "started again on the next call"
    assert not any(alive(p) for p in [*started_pids(log), grandchild])


async def test_a_long_lived_entity_reconnects_after_the_server_dies(tmp_path: Path) -> None:
    log = tmp_path / "m"
    s = spell([call("tb_die"), finish(1), call("tb_pid"), finish(2)], toolbox(log))
    async with s.summon() as entity:
        first = await entity.send("die")
        assert first.turns[0].gate_calls[0].is_error
        second = await entity.send("again")
    assert not second.turns[0].gate_calls[0].is_error
    assert len(started_pids(log)) == 2


async def test_a_call_that_outlives_timeout_s_is_an_error_and_is_cancelled(
    tmp_path: Path,
) -> None:
    log = tmp_path / "m"
    s = spell([call("tb_wait_forever", tag="t1"), finish()], toolbox(log, timeout_s=1.0))
    async with s.summon() as entity:
        outcome = await entity.send("wait")
        record = outcome.turns[0].gate_calls[0]
        assert record.is_error and "did not answer 'wait_forever' within 1s" in record.result
        # notifications/cancelled reached the server while it is still running.
        await wait_for_mark(log, "cancelled t1")
        assert len(started_pids(log)) == 1 and alive(started_pids(log)[0])
    assert outcome.terminated


async def test_cancelling_the_cast_sends_notifications_cancelled(tmp_path: Path) -> None:
    log = tmp_path / "m"
    s = spell([call("tb_wait_forever", tag="c1"), call("tb_pid"), finish()], toolbox(log))
    async with s.summon() as entity:
        outcome: list[cantrip.CastResult] = []

        async def run() -> None:
            outcome.append(await entity.send("wait"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            await wait_for_mark(log, "started c1")
            assert entity.cancel()
        cut = outcome[0]
        assert cut.truncated and cut.reason == "cancelled"
        record = cut.turns[-1].gate_calls[0]
        assert record.status == "cancelled" and record.gate == "tb_wait_forever"
        await wait_for_mark(log, "cancelled c1")
        pid = started_pids(log)[0]
        assert alive(pid), "the session stays for the entity's next cast"
        again = await entity.send("next")
        assert again.turns[0].gate_calls[0].result == {"result": pid}
    assert not alive(pid)


async def test_the_server_is_reachable_from_code_and_replay_never_calls_it(
    tmp_path: Path,
) -> None:
    log = tmp_path / "m"
    script = [
        {"code": "x = tb_add(a=2, b=3)\ny = tb_add(x['result'], 10)\ny"},
        {"code": "done(y['result'])"},
    ]
    s = spell(script, toolbox(log), medium=python)
    outcome = await s.cast_async("add in code")
    assert outcome.result == 15
    assert [m for m in marks(log) if m.startswith("call")] == ["call add 2 3", "call add 5 10"]
    forked = s.fork(outcome.turns[0], llm=cantrip.ScriptedLLM([{"code": "done(y['result'] * 2)"}]))
    async with forked:
        again = await forked.send("double it")
    assert again.result == 30, "the sandbox was rebuilt with the recorded results"
    assert [m for m in marks(log) if m.startswith("call")] == ["call add 2 3", "call add 5 10"]
    report = forked.restore_report
    assert report is not None and report.hydrated == 2 and not report.divergences


async def test_a_child_entity_gets_its_own_session(tmp_path: Path) -> None:
    from gates import call_agent

    log = tmp_path / "m"
    script = [
        call("tb_pid"),
        call("call_agent", intent="child work"),
        call("tb_pid"),  # the child's first turn
        finish("child done"),  # the child's answer
        finish("parent done"),
    ]
    s = spell(script, toolbox(log), gates=(done, call_agent))
    s = s.with_(
        circle=cantrip.Circle(
            [done, call_agent],
            [cantrip.max_turns(6), cantrip.max_depth(1)],
            providers=[toolbox(log)],
        )
    )
    outcome = await s.cast_async("delegate")
    assert outcome.result == "parent done"
    pids = started_pids(log)
    assert len(pids) == 2, "the child opened its own session"
    assert not any(alive(p) for p in pids)


# -- start-up failures ---------------------------------------------------------------


async def test_a_command_that_cannot_start_is_a_clear_error() -> None:
    s = spell([finish()], MCPServer(name="ghost", command="/no/such/mcp-server"))
    with pytest.raises(ProviderStartError) as raised:
        await s.cast_async("go")
    message = str(raised.value)
    assert "MCP server 'ghost' (stdio: /no/such/mcp-server) failed to start" in message
    assert "No such file" in message
    assert list(s.loom.turns) == []


async def test_a_server_that_exits_at_once_reports_its_stderr() -> None:
    s = spell([finish()], misbehaving("exit"))
    with pytest.raises(ProviderStartError) as raised:
        await s.cast_async("go")
    assert "failed to start" in str(raised.value)
    assert "cannot open my database (on purpose)" in str(raised.value)
    assert list(s.loom.turns) == []


@pytest.mark.parametrize("mode", ["hang-init", "hang-list"])
async def test_a_server_that_hangs_at_start_up_is_a_clear_error(mode: str) -> None:
    s = spell([finish()], misbehaving(mode, startup_timeout_s=1.5))
    with trio.fail_after(30):  # never a hang
        with pytest.raises(ProviderStartError, match=r"did not finish starting .* within 1\.5s"):
            await s.cast_async("go")
    assert list(s.loom.turns) == []


async def test_a_malformed_result_is_an_error_observation() -> None:
    s = spell([call("bad_broken"), finish()], misbehaving("malformed"))
    outcome = await s.cast_async("go")
    record = outcome.turns[0].gate_calls[0]
    assert record.is_error and "sent a malformed result for 'broken'" in record.result
    assert outcome.terminated and len(outcome.turns) == 2


async def test_secrets_in_env_never_reach_an_error() -> None:
    secret = "hunter2-very-secret"
    s = spell(
        [finish()],
        MCPServer(
            name="s",
            command=PYTHON,
            args=["-c", "import os, sys; sys.stderr.write(os.environ['TOKEN']); sys.exit(1)"],
            env={"TOKEN": secret},
        ),
    )
    with pytest.raises(ProviderStartError) as raised:
        await s.cast_async("go")
    assert secret not in str(raised.value) and "[REDACTED]" in str(raised.value)
    assert secret not in repr(s.circle.providers[0])


# -- transports and published servers -------------------------------------------------


async def test_streamable_http_server_on_loopback(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "m"
    server = MCPServer(name="web", url=f"http://127.0.0.1:{port}/mcp", headers={"X-Trace": "1"})
    events: list[GateProgress] = []
    async with running([PYTHON, str(TOOLBOX), "--http", str(port)], port, TOOLBOX_MARKS=str(log)):
        outcome = await spell(
            [call("web_add", a=1, b=2), call("web_count", n=2), finish()], server
        ).cast_async(
            "add over http",
            on_event=lambda e: events.append(e) if isinstance(e, GateProgress) else None,
        )
    first = outcome.turns[0].gate_calls[0]
    assert first.result == {"result": 3} and dict(first.detail)["via"] == "mcp:web"
    assert [e.progress for e in events] == [1.0, 2.0]
    assert "call add 1 2" in marks(log)


async def test_published_time_server_from_pypi() -> None:
    server = MCPServer(
        name="time",
        command=str(BIN / "mcp-server-time"),
        args=["--local-timezone", "UTC"],
        tools=["convert_time"],
    )
    convert = "time_convert_time"
    script = [
        call(convert, source_timezone="UTC", time="12:00", target_timezone="Asia/Tokyo"),
        call(convert, source_timezone="Nowhere/Land", time="12:00", target_timezone="UTC"),
        finish(),
    ]
    outcome = await spell(script, server).cast_async("what time in Tokyo")
    ok, bad = outcome.turns[0].gate_calls[0], outcome.turns[1].gate_calls[0]
    assert not ok.is_error
    assert ok.result["target"]["timezone"] == "Asia/Tokyo"
    assert ok.result["target"]["datetime"].split("T")[1].startswith("21:00")
    assert bad.is_error and "Nowhere/Land" in bad.result


# -- the spec file ----------------------------------------------------------------------


def test_spec_tables_report_every_problem_at_once() -> None:
    with pytest.raises(cantrip.ConstructionError) as raised:
        servers_from_tables(
            [
                {"name": "a", "command": "x", "url": "http://y"},
                {"name": "b", "url": "ftp://y", "headers": {"A": "1"}},
                {"name": "c", "command": "x", "headers": {"A": "1"}, "bogus": 1},
                {"name": "1bad", "command": "x"},
                {"name": "d"},
            ]
        )
    problems = raised.value.problems
    assert any("'a' needs exactly one of command" in p for p in problems)
    assert any("url must be http:// or https://" in p for p in problems)
    assert any("circle.mcp[2].bogus" in p for p in problems)
    assert any("'1bad' must start with a letter" in p for p in problems)
    assert any("'d' needs exactly one of command" in p for p in problems)
    with pytest.raises(cantrip.ConstructionError, match="names must be unique"):
        servers_from_tables([{"name": "a", "command": "x"}, {"name": "a", "command": "y"}])


def test_cast_a_spec_with_an_mcp_server_and_see_it_in_loom_show(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "toolbox.py").write_text(TOOLBOX.read_text())
    spec = tmp_path / "spec.toml"
    spec.write_text(
        f"""
[llm]
provider = "scripted"
responses = [
  {{ tool_calls = [{{ gate = "tb_add", args = {{ a = 40, b = 2 }} }}] }},
  {{ tool_calls = [{{ gate = "done", args = {{ answer = "42" }} }}] }},
]
[circle]
medium = "conversation"
gates = ["done"]
wards = [{{ max_turns = 4 }}]
[[circle.mcp]]
name = "tb"
command = {json.dumps(PYTHON)}
args = ["toolbox.py"]   # relative to the spec file's folder
tools = ["add"]
timeout_s = 30
[loom]
path = "loom.db"
"""
    )
    assert cli_main(["cast", "-q", str(spec), "add them"]) == 0
    assert capsys.readouterr().out.strip() == "42"
    assert cli_main(["loom", str(tmp_path / "loom.db"), "list", "--json"]) == 0
    entity = json.loads(capsys.readouterr().out)["entities"][0]["entity_id"]
    assert cli_main(["loom", str(tmp_path / "loom.db"), "show", entity]) == 0
    shown = capsys.readouterr().out
    assert 'tb_add({"a": 40, "b": 2}) -> {"result": 42}  (via mcp:tb)' in shown


def test_cast_reports_a_server_that_fails_to_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(
        """
[llm]
provider = "scripted"
responses = [{ tool_calls = [{ gate = "done", args = { answer = "x" } }] }]
[circle]
medium = "conversation"
gates = ["done"]
wards = [{ max_turns = 2 }]
[[circle.mcp]]
name = "ghost"
command = "/no/such/server"
"""
    )
    assert cli_main(["cast", "-q", str(spec), "go"]) == 1
    err = capsys.readouterr().err
    assert "MCP server 'ghost' (stdio: /no/such/server) failed to start" in err
    assert "Traceback" not in err


def test_public_names_and_no_sdk_at_import() -> None:
    import subprocess

    assert cantrip.MCPServer is MCPServer
    assert cantrip.ProviderStartError is ProviderStartError
    assert cantrip.GateProgress is GateProgress
    assert isinstance(MCPServer(name="x", command="y"), cantrip.GateProvider)
    probe = "import sys, cantrip; print('mcp' in sys.modules, 'mcp_types' in sys.modules)"
    out = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False", "the SDK loads only when a server is opened"


def test_a_circle_refuses_a_provider_that_is_not_one() -> None:
    with pytest.raises(cantrip.ConstructionError, match="gate providers"):
        cantrip.Circle([done], [cantrip.max_turns(2)], providers=["mcp-server-time"])  # type: ignore[list-item]


async def test_an_http_session_keeps_its_mcp_session_across_prompts(tmp_path: Path) -> None:
    import httpx

    from cantrip.protocols.http._serve import serve_http

    log = tmp_path / "m"
    s = spell(
        [call("tb_pid"), finish(1), call("tb_count", n=2), call("tb_pid"), finish(2)],
        toolbox(log),
    )
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(serve_http, s, "127.0.0.1", 0)
        async with httpx.AsyncClient(base_url=binds[0], timeout=30) as http:
            sid = (await http.post("/sessions")).json()["session_id"]
            first = (await http.post(f"/sessions/{sid}/prompt", json={"prompt": "one"})).json()
            pid = started_pids(log)[0]
            assert alive(pid), "the MCP session outlives the prompt"
            async with http.stream(
                "POST", f"/sessions/{sid}/prompt?stream=1", json={"prompt": "two"}
            ) as streamed:
                lines = [line async for line in streamed.aiter_lines()]
        nursery.cancel_scope.cancel()
    assert first["result"] == 1
    progress = [json.loads(x[6:]) for x in lines if x.startswith("data: ") and "gate_progress" in x]
    assert [(p["gate"], p["progress"]) for p in progress] == [("tb_count", 1.0), ("tb_count", 2.0)]
    assert started_pids(log) == [pid], "one server for both prompts"
    assert not alive(pid), "closed with the server"


def test_the_docs_mcp_snippets_are_valid() -> None:
    import re
    import tomllib

    readme = (Path(__file__).resolve().parents[1] / "docs" / "how-to" / "mcp.md").read_text()
    toml_block = next(
        b for b in re.findall(r"```toml\n(.*?)```", readme, re.S) if "circle.mcp" in b
    )
    servers = servers_from_tables(tomllib.loads(toml_block)["circle"]["mcp"])
    assert [(s.name, s.transport, s.gate_prefix) for s in servers] == [
        ("time", "stdio", "time_"),
        ("search", "http", "web_"),
    ]
    config = next(b for b in re.findall(r"```json\n(.*?)```", readme, re.S) if "mcpServers" in b)
    assert json.loads(config)["mcpServers"]["cantrip"]["args"][0] == "mcp"


def test_cast_progress_on_a_terminal_shows_gate_progress() -> None:
    from rich.console import Console

    from cantrip.protocols.terminal._progress import Progress

    buffer = io.StringIO()
    progress = Progress(Console(file=buffer, width=120), enabled=True)
    progress(GateProgress(entity_id="e1", gate="tb_count", progress=2, total=3, message="step 2"))
    progress(GateProgress(entity_id="e1", gate="tb_count", progress=5))
    assert buffer.getvalue().splitlines() == ["  … tb_count 2/3 step 2", "  … tb_count 5"]


async def test_an_entity_without_a_nursery_opens_its_servers_per_cast(tmp_path: Path) -> None:
    log = tmp_path / "m"
    entity = spell([call("tb_pid"), finish(1), call("tb_pid"), finish(2)], toolbox(log)).summon()
    first = await entity.send("one")
    pid = first.turns[0].gate_calls[0].result["result"]
    assert not alive(pid), "no nursery outlives the cast, so neither does the server"
    second = await entity.send("two")
    assert second.turns[0].gate_calls[0].result["result"] != pid
    await entity.aclose()
    assert len(started_pids(log)) == 2


async def test_cancelling_from_outside_cancels_the_call_and_closes_the_session(
    tmp_path: Path,
) -> None:
    log = tmp_path / "m"
    s = spell([call("tb_wait_forever", tag="c2"), finish()], toolbox(log))
    with trio.CancelScope() as outer:

        async def cancel_when_started() -> None:
            await wait_for_mark(log, "started c2")
            outer.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_when_started)
            await s.cast_async("wait")
    assert outer.cancelled_caught
    assert "cancelled c2" in marks(log), "the server saw the call cancelled"
    pid = started_pids(log)[0]
    assert not alive(pid), "and the session was closed with the entity"
    cut = s.loom.turns[-1]
    assert cut.truncated and cut.reason == "cancelled"
    assert cut.gate_calls[0].status == "cancelled"
