"""A real AG-UI client against a live ``cantrip serve`` (issue 33, item 1).

The official JavaScript client (``@ag-ui/client``'s ``HttpAgent``, pinned in
``tests/agui_client/package.json``) runs under node in ``tests/agui_client/run.mjs``
and prints what it received; the official conformance validator's CLI
(``ag-ui-validate``) checks the live endpoint with its transport rules too.
``npm ci`` runs once per checkout (tests/npm_packages.py) (the npm registry is
reachable; the install is bounded in time)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import trio
from ag_ui_validate.pytest_plugin import assert_valid_agui
from agui_schema_check import check_events
from npm_packages import ensure_npm_packages

import cantrip
from cantrip.protocols.http._serve import serve_http
from cantrip.protocols.middleware._guard import Guard
from gates import done

CLIENT = Path(__file__).parent / "agui_client"
TOKEN = "agui-test-token-0123456789"


async def ensure_client() -> None:
    """The client's packages, installed once (``npm ci`` from the lock file)."""
    await ensure_npm_packages(CLIENT, "@ag-ui/client")


@asynccontextmanager
async def serving(s: cantrip.Cantrip) -> AsyncIterator[str]:
    """A live server on loopback that requires a token, as a deployment would."""
    guard = Guard(bind_host="127.0.0.1", token=TOKEN)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve_http(s, "127.0.0.1", 0, task_status=task_status, guard=guard)
        )
        yield binds[0]
        nursery.cancel_scope.cancel()


async def validate_live(endpoint: str) -> None:
    """The official conformance validator's command line against a live endpoint
    (it makes its own runs, shared state among them): no error, no warning."""
    validator = Path(sys.executable).parent / "ag-ui-validate"
    with trio.fail_after(90):
        checked = await trio.run_process(
            [
                str(validator),
                endpoint,
                "--json",
                "--header",
                f"Authorization: Bearer {TOKEN}",
                "--features",
                "shared-state",
                "--max-warnings",
                "0",
            ],
            capture_stdout=True,
            check=False,
        )
    report = json.loads(checked.stdout)
    assert checked.returncode == 0, report
    assert report["summary"]["errors"] == 0 and report["summary"]["warnings"] == 0, report
    assert report["eventCount"] >= 10


async def js_client(base: str, scenario: str, query: str = "") -> dict[str, Any]:
    await ensure_client()
    node = shutil.which("node")
    assert node is not None
    with trio.fail_after(60):
        done_ = await trio.run_process(
            [node, "run.mjs", f"{base}/agui{query}", scenario, TOKEN],
            cwd=CLIENT,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert done_.returncode == 0, done_.stderr.decode()  # what node said, when it failed
    report: dict[str, Any] = json.loads(done_.stdout)
    for run in report["runs"]:
        check_events(run["events"])  # what the client received: AG-UI 1.0 events
    return report


def kinds(run: dict[str, Any]) -> list[str]:
    return [e["type"] for e in run["events"]]


@cantrip.gate()
def lookup(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def spell(script: list[dict[str, Any]], *gates: Any) -> cantrip.Cantrip:
    return cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(script),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done, *gates], [cantrip.max_turns(6)]),
        loom=cantrip.Loom(),
    )


async def test_the_official_js_client_chats_over_two_runs_of_one_thread() -> None:
    script = [
        {
            "content": "Let me look.",
            "thinking": "weather, so the lookup gate",
            "tool_calls": [{"gate": "lookup", "args": {"city": "Oslo"}}],
        },
        {"tool_calls": [{"gate": "done", "args": {"answer": "Sunny in Oslo."}}]},
        {"tool_calls": [{"gate": "done", "args": {"answer": "Sunny tomorrow too."}}]},
    ]
    async with serving(spell(script, lookup)) as base:
        report = await js_client(base, "chat")
    first, second = report["runs"]
    assert first["error"] is None and second["error"] is None, report["runs"]
    assert kinds(first)[0] == "RUN_STARTED" and kinds(first)[-1] == "RUN_FINISHED"
    assert first["events"][0]["protocolVersion"] == "1.0"
    for kind in (
        "REASONING_START",
        "REASONING_MESSAGE_CONTENT",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
        "STATE_SNAPSHOT",
        "MESSAGES_SNAPSHOT",
    ):
        assert kind in kinds(first), kind
    assert first["finished"]["outcome"] == "success"
    assert first["result"] == "Sunny in Oslo." and second["result"] == "Sunny tomorrow too."
    # The client's own view after the runs: the thread as the server's snapshot says.
    roles = [m["role"] for m in report["messages"]]
    assert roles.count("user") == 2 and "tool" in roles
    assert roles[:3] == ["user", "reasoning", "assistant"], roles  # the loom's order
    tool = next(m for m in report["messages"] if m["role"] == "tool")
    assert tool["content"] == "sunny in Oslo"
    assert report["messages"][-1]["content"] == "Sunny tomorrow too."
    assert report["state"]["cantrip"]["turns"] == 3


async def test_the_official_js_client_answers_an_approval_interrupt() -> None:
    counter: list[str] = []

    @cantrip.gate(requires_approval=True)
    def launch_counted(target: str) -> str:
        """Something a person must approve first."""
        counter.append(target)
        return f"launched at {target}"

    script = [
        {"tool_calls": [{"gate": "launch_counted", "args": {"target": "moon"}}]},
        {"tool_calls": [{"gate": "done", "args": {"answer": "launched"}}]},
    ]
    async with serving(spell(script, launch_counted)) as base:
        report = await js_client(base, "approve")
    paused, resumed = report["runs"]
    assert paused["finished"]["outcome"] == "interrupt", paused
    (interrupt,) = paused["finished"]["interrupts"]
    assert interrupt["reason"] == "approval" and interrupt["metadata"]["gate"] == "launch_counted"
    assert resumed["error"] is None and resumed["finished"]["outcome"] == "success"
    assert resumed["result"] == "launched"
    assert report["pendingInterrupts"] == []
    assert counter == ["moon"]


async def test_the_official_js_client_aborting_cancels_the_cast() -> None:
    started = trio.Event()

    @cantrip.gate()
    async def forever() -> str:
        """Never returns by itself."""
        started.set()
        await trio.sleep_forever()
        return "never"

    s = spell([{"tool_calls": [{"gate": "forever", "args": {}}]}], forever)
    async with serving(s) as base:
        report = await js_client(base, "abort")
        auth = {"authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=base, headers=auth) as http:
            with trio.fail_after(10):
                while True:  # the cancel lands once the server sees the hang-up
                    (session,) = (await http.get("/sessions")).json()["sessions"]
                    if not session["running"]:
                        break
                    await trio.sleep(0.05)
            thread = (await http.get(f"/sessions/{session['session_id']}/thread")).json()
    (run,) = report["runs"]
    assert "TOOL_CALL_START" in kinds(run) and "RUN_FINISHED" not in kinds(run)
    assert started.is_set()
    assert [t["reason"] for t in thread["turns"]] == ["cancelled"]


async def test_the_conformance_validator_passes_the_live_endpoint() -> None:
    script = [
        {
            "content": "Hello!",
            "thinking": "a greeting",
            "tool_calls": [{"gate": "lookup", "args": {"city": "Oslo"}}],
        },
        {"tool_calls": [{"gate": "done", "args": {"answer": "Hi."}}]},
    ]
    async with serving(spell(script, lookup)) as base:
        await validate_live(f"{base}/agui")


async def test_the_official_js_client_runs_a_front_end_tool_the_model_calls() -> None:
    script = [
        {"tool_calls": [{"gate": "get_location", "args": {"precision": "city"}}]},
        {"tool_calls": [{"gate": "done", "args": {"answer": "You are in Oslo."}}]},
    ]
    s = spell(script)
    async with serving(s) as base:
        report = await js_client(base, "tools")
    called, continued = report["runs"]
    assert called["error"] is None and continued["error"] is None, report["runs"]
    assert called["finished"]["outcome"] == "success"
    assert "TOOL_CALL_END" in kinds(called) and "TOOL_CALL_RESULT" not in kinds(called)
    assert continued["result"] == "You are in Oslo."
    (record,) = [c for t in s.loom.turns for c in t.gate_calls if c.gate == "get_location"]
    assert record.result == "Oslo, Norway"
    (start,) = [e for e in called["events"] if e["type"] == "TOOL_CALL_START"]
    answers = [m for m in report["messages"] if m.get("toolCallId") == start["toolCallId"]]
    assert [m["content"] for m in answers] == ["Oslo, Norway"]  # once: not told back twice


async def test_the_guides_client_mjs_runs_as_written(tmp_path: Path) -> None:
    """The AG-UI guide's ``client.mjs`` (issue 47.5), taken from the page as written and
    run by node against a live server with a token, prints the cast's answer."""
    import re

    page = (Path(__file__).parents[1] / "docs" / "how-to" / "agui.md").read_text()
    (script,) = re.findall(r"```js\n(// client\.mjs\n.*?)```", page, re.S)
    await ensure_client()
    (tmp_path / "client.mjs").write_text(script)
    (tmp_path / "node_modules").symlink_to(CLIENT / "node_modules")  # the pinned client
    node = shutil.which("node")
    assert node is not None
    spell = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(
            [{"tool_calls": [{"gate": "done", "args": {"answer": "I greeted the world."}}]}]
        ),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done], [cantrip.max_turns(3)]),
    )
    async with serving(spell) as base:
        env = {"PATH": os.environ["PATH"], "CANTRIP_AGUI_URL": f"{base}/agui"}
        with trio.fail_after(60):
            refused = await trio.run_process(
                [node, "client.mjs"], cwd=tmp_path, env=env, capture_stdout=True,
                capture_stderr=True, check=False,
            )  # fmt: skip
            ran = await trio.run_process(
                [node, "client.mjs"], cwd=tmp_path, env={**env, "CANTRIP_TOKEN": TOKEN},
                capture_stdout=True, capture_stderr=True, check=False,
            )  # fmt: skip
    assert refused.returncode != 0  # no token: the server's guard says no
    assert ran.returncode == 0, ran.stderr.decode()
    assert ran.stdout.decode().strip() == "I greeted the world."


async def test_the_vendored_schema_is_what_the_official_package_gives(tmp_path: Path) -> None:
    """tests/agui_schema/ag-ui-1.0.schema.json is rebuilt from the installed
    ``@ag-ui/core`` (its README says how): the copy the tests check against has not
    drifted from the package the JS client runs on."""
    await ensure_client()
    node = shutil.which("node")
    assert node is not None
    out = tmp_path / "schema.json"
    with trio.fail_after(60):
        await trio.run_process([node, "schema.mjs", str(out)], cwd=CLIENT)
    vendored = CLIENT.parent / "agui_schema" / "ag-ui-1.0.schema.json"
    assert json.loads(out.read_text()) == json.loads(vendored.read_text())


async def test_the_official_js_client_follows_a_long_gates_progress_as_an_activity(
    tmp_path: Path,
) -> None:
    """A gate that reports progress (an MCP tool's progress notifications) is an
    activity: ``ACTIVITY_SNAPSHOT`` at its first report, ``ACTIVITY_DELTA`` patches
    after, before the call's result -- and the official client takes them."""
    from mcp_support import call, finish, toolbox
    from mcp_support import spell as mcp_spell

    s = mcp_spell(
        [call("tb_count", n=3), finish("counted"), finish("again")], toolbox(tmp_path / "m")
    )
    async with serving(s) as base:
        report = await js_client(base, "chat")
    first = report["runs"][0]
    assert first["error"] is None, first
    told = kinds(first)
    activity = [e for e in first["events"] if e["type"].startswith("ACTIVITY_")]
    assert [e["type"] for e in activity] == ["ACTIVITY_SNAPSHOT"] + ["ACTIVITY_DELTA"] * 2
    assert activity[0]["activityType"] == "cantrip.gate_progress"
    assert activity[0]["content"] == {
        "gate": "tb_count",
        "progress": 1.0,
        "total": 3.0,
        "message": "step 1",
    }
    assert {e["messageId"] for e in activity} == {activity[0]["messageId"]}
    assert activity[-1]["patch"] == [
        {"op": "replace", "path": "/progress", "value": 3.0},
        {"op": "replace", "path": "/message", "value": "step 3"},
    ]
    assert told.index("ACTIVITY_DELTA") < told.index("TOOL_CALL_RESULT")
    assert "CUSTOM" not in told


async def test_the_official_js_client_takes_a_call_agent_child_as_a_subagent() -> None:
    """The client accepts a sub-agent's stream: its start, its attributed events (the
    client checks that each names a sub-agent it was told of) and its end."""
    from gates import call_agent

    s = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(
            [
                {"tool_calls": [{"gate": "call_agent", "args": {"intent": "x", "llm": "kid"}}]},
                {"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]},
                {"tool_calls": [{"gate": "done", "args": {"answer": "again"}}]},
            ]
        ),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done, call_agent], [cantrip.max_turns(6)]),
        loom=cantrip.Loom(),
    ).with_(llms={"kid": cantrip.ScriptedLLM([{"content": "kid's answer"}])})
    async with serving(s) as base:
        report = await js_client(base, "chat")
    first = report["runs"][0]
    assert first["error"] is None and first["result"] == "ok", first
    started = [e for e in first["events"] if e["type"] == "SUBAGENT_STARTED"]
    assert len(started) == 1
    kid = started[0]["subagentRunId"]
    texts = [e for e in first["events"] if e["type"] == "TEXT_MESSAGE_CONTENT"]
    assert [e.get("subagentRunId") for e in texts][:1] == [kid]
    assert kinds(first).index("SUBAGENT_FINISHED") < kinds(first).index("TOOL_CALL_RESULT")


async def test_the_official_js_client_reconnecting_gets_the_rest_of_the_run() -> None:
    """A client loses the run after 6 events (it aborts: a dropped connection, as far
    as the server can tell), and a second official client comes back for the same run
    with ``Last-Event-ID``: it is told the run again from ``RUN_STARTED`` on, then
    every event after the 6th -- the two together are one whole, valid run, each
    event once -- and the cast, kept through the hang-up (``?reconnect_s=``), ran once
    to its end."""

    @cantrip.gate()
    async def slow(city: str) -> str:
        """The weather, slowly."""
        await trio.sleep(1.0)
        return f"sunny in {city}"

    script = [
        {
            "content": "Let me look that up.",
            "tool_calls": [{"gate": "slow", "args": {"city": "Oslo"}}],
        },
        {"tool_calls": [{"gate": "done", "args": {"answer": "Sunny in Oslo."}}]},
    ]
    s = spell(script, slow)
    async with serving(s) as base:
        report = await js_client(base, "reconnect", "?reconnect_s=30")
    lost, back = report["runs"]
    # it aborted at its 6th event (a few more it had read already are handed to it)
    assert len(lost["events"]) >= 6 and lost["finished"] is None and lost["aborted"]
    assert back["error"] is None, back["error"]  # the client's verifier took the whole
    assert back["events"][0]["type"] == "RUN_STARTED"
    whole = lost["events"] + back["events"][1:]
    assert back["verified"] == len(whole)
    assert_valid_agui(whole, max_warnings=0)  # one run: nothing missing, nothing twice
    assert [e["type"] for e in whole].count("TEXT_MESSAGE_START") == 2
    said = "".join(e["delta"] for e in whole if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert said == "Let me look that up.Sunny in Oslo."
    assert back["result"] == "Sunny in Oslo." and back["finished"]["outcome"] == "success"
    assert sum(t.terminated for t in s.loom.turns) == 1, "cast once, to its end"
