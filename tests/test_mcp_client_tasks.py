"""MCP tasks from the client side, and a child's pause under ``cantrip mcp``.

The server that offers tasks is a real ``cantrip mcp`` process (the SDK's server with
the ``io.modelcontextprotocol/tasks`` extension, :mod:`cantrip.protocols.mcp_server._tasks`)
opened as one of a circle's MCP servers: its ``cast`` tool is the gate ``inner_cast``,
and a call of it runs as a task (created, polled, answered, cancelled). A server without
tasks (the SDK-written test servers) is called as ever.

The second half serves a cantrip whose child entity (``call_agent``) pauses: the pause
waits in place inside the parent's running call, and must reach the MCP client that
called ``cast`` -- the top of the tree -- the way the parent's own pause would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import Client, StdioServerParameters
from mcp_support import BIN, PYTHON, SERVERS, call, finish, marks
from test_mcp_server import _toml
from test_mcp_server_elicitation import Person, accept
from test_mcp_tasks import Tasks

import cantrip
from cantrip.loom import Loom
from cantrip.mcp import MCPServer
from gates import call_agent, done

CANTRIP = str(BIN / "cantrip")


def inner_spec(folder: Path, script: list[dict[str, Any]], *, approve: bool = False) -> Path:
    spec = folder / "inner.toml"
    spec.write_text(
        "\n".join(
            [
                "[llm]",
                'provider = "scripted"',
                _toml(script),
                "[circle]",
                'medium = "conversation"',
                'gates = ["done", "echo"]',
                'approve = ["echo"]' if approve else "approve = []",
                "wards = [{ max_turns = 6 }]",
                "[loom]",
                f'path = "{folder / "inner.db"}"',
            ]
        )
        + "\n"
    )
    return spec


def outer(script: list[dict[str, Any]], server: MCPServer) -> cantrip.Cantrip:
    return cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(script),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done], [cantrip.max_turns(6)], providers=[server]),
    )


def inner(spec: Path, **options: Any) -> MCPServer:
    return MCPServer(name="inner", command=CANTRIP, args=["mcp", str(spec)], **options)


def the_call(outcome: cantrip.CastResult, gate: str) -> Any:
    (record,) = [r for t in outcome.turns for r in t.gate_calls if r.gate == gate]
    return record


def inner_turns(folder: Path) -> list[Any]:
    loom = Loom.open(folder / "inner.db")
    try:
        (entity_id,) = list(loom.entities)
        last = loom.last_turn(entity_id)
        return [] if last is None else list(loom.thread(last.id))
    finally:
        loom.close()


async def test_a_call_to_a_server_that_offers_tasks_runs_as_a_task(tmp_path: Path) -> None:
    spec = inner_spec(tmp_path, [call("echo", text="working"), finish("inner answer")])
    s = outer([call("inner_cast", intent="go"), finish("outer")], inner(spec))
    outcome = await s.cast_async("delegate")
    assert outcome.result == "outer"
    record = the_call(outcome, "inner_cast")
    assert not record.is_error, record.result
    assert record.result["result"] == "inner answer"
    task = record.detail["mcp_task"]
    assert task["task_id"].startswith("task-") and task["status"] == "completed"
    # the loom keeps the task's id with the call
    stored = [r for t in s.loom.turns for r in t.gate_calls if r.gate == "inner_cast"]
    assert stored[0].detail["mcp_task"]["task_id"] == task["task_id"]


async def test_a_tasks_status_messages_are_the_calls_progress(tmp_path: Path) -> None:
    """The task's status message (``cantrip mcp``: the latest turn, then ``done``) is
    told as ``GateProgress`` of the calling gate, counted 1, 2, ..."""
    from cantrip._events import GateProgress

    spec = inner_spec(tmp_path, [call("echo", text="working"), finish("inner answer")])
    s = outer([call("inner_cast", intent="go"), finish("outer")], inner(spec))
    events: list[Any] = []
    outcome = await s.cast_async("delegate", on_event=events.append)
    assert outcome.result == "outer"
    progress = [e for e in events if isinstance(e, GateProgress)]
    assert progress and all(e.gate == "inner_cast" for e in progress)
    assert [e.progress for e in progress] == [float(i + 1) for i in range(len(progress))]
    assert progress[-1].message == "done"


async def test_a_server_without_tasks_is_called_as_ever(tmp_path: Path) -> None:
    log = tmp_path / "marks"
    server = MCPServer(
        name="tb",
        command=PYTHON,
        args=[str(SERVERS / "toolbox.py")],
        env={"TOOLBOX_MARKS": str(log)},
    )
    s = outer([call("tb_add", a=2, b=3), finish("ok")], server)
    outcome = await s.cast_async("add")
    record = the_call(outcome, "tb_add")
    assert not record.is_error and "mcp_task" not in record.detail
    assert "call add 2 3" in marks(log)


async def test_a_tasks_question_is_the_calling_entitys_pause(tmp_path: Path) -> None:
    """The served cast's approval makes the task ``input_required``; cantrip asks it as
    the caller's pause (origin ``mcp:inner``) and answers with ``tasks/update``."""
    spec = inner_spec(tmp_path, [call("echo", text="rm -rf"), finish("approved")], approve=True)
    s = outer([call("inner_cast", intent="go"), finish("outer")], inner(spec, elicitation=True))
    asked: list[cantrip.Pause] = []

    async def human(pause: cantrip.Pause) -> cantrip.Decision:
        asked.append(pause)
        return cantrip.Decision.answer('{"approve": true}')

    entity = s.summon(on_pause=human)
    async with entity:
        with trio.fail_after(60):
            outcome = await entity.send("delegate")
    record = the_call(outcome, "inner_cast")
    assert record.result["result"] == "approved", record.result
    assert record.detail["mcp_task"]["status"] == "completed"
    (pause,) = asked
    assert pause.origin == "mcp:inner" and "Approve echo" in (pause.question or "")
    echo = next(r for t in inner_turns(tmp_path) for r in t.gate_calls if r.gate == "echo")
    assert echo.result == "rm -rf"


async def test_cancelling_the_cast_cancels_the_task_on_the_server(tmp_path: Path) -> None:
    """The outer cast is cancelled while its task waits (the served cast's own MCP
    server asks a question, in place): cantrip sends ``tasks/cancel`` and the server
    cuts its running cast off -- its loom records ``cancelled`` while the connection is
    still open, not only when the server process ends."""
    from test_mcp_elicitation import _spec_toml

    spec = tmp_path / "inner.toml"
    script = [call("asking_book", city="Oslo"), finish("never")]
    loom = f'[loom]\npath = "{tmp_path / "inner.db"}"\n'
    spec.write_text(_spec_toml(script, tmp_path / "marks") + loom)
    s = outer([call("inner_cast", intent="go"), finish("outer")], inner(spec, elicitation=True))
    entity = s.summon(pause="wait")
    results: list[cantrip.CastResult] = []
    async with entity:
        async with trio.open_nursery() as nursery:

            async def run() -> None:
                results.append(await entity.send("delegate"))

            nursery.start_soon(run)
            with trio.fail_after(60):
                while not entity.pending:
                    await trio.sleep(0.05)
            (pause,) = entity.pending
            assert pause.origin == "mcp:inner" and "How many seats" in (pause.question or "")
            assert entity.cancel()
        (outcome,) = results
        assert outcome.reason == "cancelled"
        with trio.fail_after(30):  # the inner server is still running: it heard the cancel
            while not ((turns := inner_turns(tmp_path)) and turns[-1].reason == "cancelled"):
                await trio.sleep(0.05)


# -- a child's pause under cantrip mcp ------------------------------------------------

CHILD_SCRIPT = [
    call("call_agent", intent="child work"),
    call("echo", text="rm -rf build"),  # needs approval
    finish("done"),
]
"""Each entity of the served spec reads the script from its start: the parent delegates;
the child's own ``call_agent`` is warded off (max_depth 1), then it calls ``echo`` (its
pause, waiting in place inside the parent's call) and finishes; then the parent calls
``echo`` itself (its own pause) and finishes."""
ERAS = {"2026-07-28": "auto", "2025-11-25": "legacy"}


def served_spec(folder: Path) -> Path:
    spec = folder / "served.toml"
    spec.write_text(
        "\n".join(
            [
                "[llm]",
                'provider = "scripted"',
                _toml(CHILD_SCRIPT),
                "[circle]",
                'medium = "conversation"',
                'gates = ["done", "echo", "call_agent"]',
                'approve = ["echo"]',
                "wards = [{ max_turns = 6 }, { max_depth = 1 }]",
                "[loom]",
                'path = "served.db"',
            ]
        )
        + "\n"
    )
    return spec


@pytest.mark.parametrize("way", [*ERAS, "tasks"])
async def test_a_childs_pause_is_asked_of_the_client_that_called_cast(
    tmp_path: Path, way: str
) -> None:
    """The child waits in place inside the parent's ``call_agent``; the client is asked
    exactly as for the parent's own pause -- at 2026-07-28 without tasks through
    ``InputRequiredResult`` and a retry, at 2025-11-25 mid-call, with tasks as the
    task's input request -- and the answer reaches the child."""
    spec = served_spec(tmp_path)
    person = Person(accept(approve=True), accept(approve=False, reason="not twice"))
    tasks = Tasks(person)
    async with Client(
        StdioServerParameters(command=CANTRIP, args=["mcp", str(spec)]),
        elicitation_callback=person,
        extensions=[tasks] if way == "tasks" else None,
        mode=ERAS.get(way, "auto"),
    ) as mcp:
        with trio.fail_after(30):  # before the fix: the child waited with nobody to ask
            result = await mcp.call_tool("cast", {"intent": "delegate"})
    structured = result.structured_content
    assert structured is not None and structured["terminated"], result
    assert [a.message for a in person.asked] == ['Approve echo({"text": "rm -rf build"})?'] * 2
    assert bool(tasks.created) == (way == "tasks")
    loom = Loom.open(tmp_path / "served.db")
    try:
        echoes = {t.entity_id: r for t in loom.turns for r in t.gate_calls if r.gate == "echo"}
    finally:
        loom.close()
    root = structured["entity_id"]
    (child,) = set(echoes) - {root}
    # the child's call was approved by the first answer, the parent's denied by the second
    assert echoes[child].result == "rm -rf build"
    assert echoes[child].detail["approval"]["decision"] == "approve"
    assert echoes[root].is_error and echoes[root].detail["approval"]["decision"] == "deny"


# -- a child's MCP question, in process and over cantrip serve ---------------------------


def child_asking(log: Path) -> cantrip.Cantrip:
    """A parent that delegates to a child whose MCP gate asks (a 2026-07-28 server
    without tasks: ``InputRequiredResult``, answered by the SDK's retry)."""
    server = MCPServer(
        name="asking",
        command=PYTHON,
        args=[str(SERVERS / "asking.py")],
        env={"ASKING_MARKS": str(log)},
        elicitation=True,
    )
    script = [
        call("call_agent", intent="book for me"),
        call("asking_book", city="Oslo"),  # the child's call
        finish("child done"),
        finish("parent done"),
    ]
    return cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(script),
        identity=cantrip.Identity(),
        circle=cantrip.Circle(
            [done, call_agent], [cantrip.max_turns(6), cantrip.max_depth(1)], providers=[server]
        ),
    )


async def test_a_childs_mcp_question_is_answered_by_the_parents_handler(tmp_path: Path) -> None:
    log = tmp_path / "marks"
    s = child_asking(log)
    asked: list[cantrip.Pause] = []

    async def human(pause: cantrip.Pause) -> cantrip.Decision:
        asked.append(pause)
        return cantrip.Decision.answer("4")

    entity = s.summon(on_pause=human)
    async with entity:
        with trio.fail_after(60):
            outcome = await entity.send("delegate")
    assert outcome.result == "parent done"
    (pause,) = asked
    assert pause.origin == "mcp:asking" and pause.entity_id != entity.id
    assert marks(log) == ["version 2026-07-28", "accept 4"]


async def test_a_childs_mcp_question_is_answered_over_http(tmp_path: Path) -> None:
    """``cantrip serve``: the child's question is the session's pending pause while the
    prompt runs; the answer posted to the session reaches the child's call."""
    import httpx

    from cantrip.protocols.http._serve import serve_http

    log = tmp_path / "marks"
    s = child_asking(log)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve_http(s, "127.0.0.1", 0, task_status=task_status)
        )
        async with httpx.AsyncClient(base_url=binds[0], timeout=60) as http:
            sid = (await http.post("/sessions")).json()["session_id"]
            answers: list[httpx.Response] = []

            async def prompt() -> None:
                answers.append(await http.post(f"/sessions/{sid}/prompt", json={"prompt": "go"}))

            nursery.start_soon(prompt)
            with trio.fail_after(60):
                while not (listed := (await http.get(f"/sessions/{sid}/pending")).json())[
                    "pending"
                ]:
                    await trio.sleep(0.05)
            (pause,) = listed["pending"]
            assert pause["origin"] == "mcp:asking"
            url = f"/sessions/{sid}/pending/{pause['pause_id']}"
            right = await http.post(url, json={"decision": "answer", "text": "2"})
            assert right.status_code == 202, right.text
            with trio.fail_after(60):
                while not answers:
                    await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    assert answers[0].status_code == 200 and answers[0].json()["result"] == "parent done"
    assert marks(log) == ["version 2026-07-28", "accept 2"]


async def test_a_childs_mcp_question_reaches_the_client_of_cantrip_mcp(tmp_path: Path) -> None:
    """Three levels: an MCP client calls ``cast`` (2026-07-28, no tasks); the served
    cast's child calls an MCP server that asks; the question reaches the top client
    through ``InputRequiredResult`` and the answer goes back down to the server."""
    from test_mcp_elicitation import ASKING

    log = tmp_path / "marks"
    spec = tmp_path / "served.toml"
    script = [
        call("call_agent", intent="book"),
        call("asking_book", city="Oslo"),
        finish("booked"),
    ]
    spec.write_text(
        "\n".join(
            [
                "[llm]",
                'provider = "scripted"',
                _toml(script),
                "[circle]",
                'medium = "conversation"',
                'gates = ["done", "call_agent"]',
                "wards = [{ max_turns = 6 }, { max_depth = 1 }]",
                "[[circle.mcp]]",
                'name = "asking"',
                f'command = "{PYTHON}"',
                f'args = ["{ASKING}"]',
                f'env = {{ ASKING_MARKS = "{log}" }}',
                "elicitation = true",
            ]
        )
        + "\n"
    )
    person = Person(accept(seats=6), accept(seats=7))
    async with Client(
        StdioServerParameters(command=CANTRIP, args=["mcp", str(spec)]),
        elicitation_callback=person,
    ) as mcp:
        with trio.fail_after(60):
            result = await mcp.call_tool("cast", {"intent": "book"})
    structured = result.structured_content
    assert structured is not None and structured["terminated"], result
    # the parent's script reads: call_agent, asking_book (its own), done -- so the
    # child's question comes first, then the parent's
    assert [a.message for a in person.asked] == [
        "mcp:asking asks (during asking_book): How many seats in Oslo?"
    ] * 2
    assert marks(log) == ["version 2026-07-28", "accept 6", "version 2026-07-28", "accept 7"]


async def test_a_task_over_streamable_http(tmp_path: Path) -> None:
    """The same over streamable HTTP: each ``tasks/*`` request is its own POST."""
    from test_mcp_server import http_server

    spec = inner_spec(tmp_path, [call("echo", text="far"), finish("from afar")])
    async with http_server(spec) as url:
        s = outer(
            [call("inner_cast", intent="go"), finish("outer")], MCPServer(name="inner", url=url)
        )
        outcome = await s.cast_async("delegate")
    record = the_call(outcome, "inner_cast")
    assert record.result["result"] == "from afar", record.result
    assert record.detail["mcp_task"]["status"] == "completed"
