"""Long casts as MCP tasks (the ``io.modelcontextprotocol/tasks`` extension, SEP-2663),
against a real ``cantrip mcp`` process, over stdio and streamable HTTP.

The client is the official SDK's, given the client half of the extension here (the
SDK ships the extension mechanism -- result claims -- but no tasks client): a claim
for ``resultType: "task"`` that polls ``tasks/get``, answers ``inputRequests``
through the client's elicitation callback with ``tasks/update``, and returns the
task's ``CallToolResult`` -- so ``client.call_tool("cast", ...)`` reads as usual.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import mcp_types
import pytest
import trio
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp_support import BIN, call, finish
from pydantic import ConfigDict, Field
from test_mcp_server import _toml, http_server
from test_mcp_server_elicitation import Person, accept, loom_calls, write_spec

from cantrip.loom import Loom

CANTRIP = str(BIN / "cantrip")
TASKS = "io.modelcontextprotocol/tasks"


class TaskParams(mcp_types.RequestParams):
    task_id: str = Field(alias="taskId")


class UpdateParams(TaskParams):
    input_responses: dict[str, Any] = Field(alias="inputResponses")


class GetTask(mcp_types.Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskParams
    name_param = "taskId"


class UpdateTask(mcp_types.Request[UpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateParams
    name_param = "taskId"


class CancelTask(mcp_types.Request[TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskParams
    name_param = "taskId"


class TaskState(mcp_types.Result):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    task_id: str = Field(alias="taskId")
    status: str
    status_message: str | None = Field(default=None, alias="statusMessage")
    created_at: str = Field(alias="createdAt")
    last_updated_at: str = Field(alias="lastUpdatedAt")
    ttl_ms: int | None = Field(alias="ttlMs")
    poll_interval_ms: int | None = Field(default=None, alias="pollIntervalMs")
    input_requests: dict[str, Any] | None = Field(default=None, alias="inputRequests")
    result: dict[str, Any] | None = None


class CreatedTask(mcp_types.Result):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    result_type: Literal["task"] = Field(default="task", alias="resultType")
    task_id: str = Field(alias="taskId")
    status: str


class Tasks(ClientExtension):
    """The client half of the tasks extension, for the test: poll, answer, return."""

    identifier = TASKS

    def __init__(self, person: Person | None = None) -> None:
        self.person = person
        self.seen: list[str] = []
        self.created: list[CreatedTask] = []

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=self.resolve)]

    async def resolve(self, created: CreatedTask, ctx: ClaimContext) -> mcp_types.CallToolResult:
        self.created.append(created)
        session, task_id = ctx.session, created.task_id
        with trio.fail_after(60):
            while True:
                state = await session.send_request(
                    GetTask(params=TaskParams(taskId=task_id)), TaskState
                )
                self.seen.append(state.status)
                if state.status == "completed":
                    assert state.result is not None
                    return mcp_types.CallToolResult.model_validate(state.result)
                if state.status in ("cancelled", "failed"):
                    raise RuntimeError(f"task {state.status}: {state.status_message}")
                if state.status == "input_required" and state.input_requests:
                    assert self.person is not None
                    answers = {}
                    for key, request in state.input_requests.items():
                        params = mcp_types.ElicitRequestFormParams.model_validate(request["params"])
                        answer = await self.person(None, params)
                        answers[key] = answer.model_dump(by_alias=True, exclude_none=True)
                    await session.send_request(
                        UpdateTask(params=UpdateParams(taskId=task_id, inputResponses=answers)),
                        mcp_types.EmptyResult,
                    )
                await trio.sleep((state.poll_interval_ms or 100) / 1000)


def stdio_client(spec: Path, tasks: Tasks, person: Person | None) -> Client:
    return Client(
        StdioServerParameters(command=CANTRIP, args=["mcp", str(spec)]),
        elicitation_callback=person,
        extensions=[tasks],
    )


async def test_a_cast_is_a_task_its_pauses_are_input_required_and_its_result_the_calls(
    tmp_path: Path,
) -> None:
    spec = write_spec(tmp_path)
    person = Person(accept(approve=True), accept(answer="red"))
    tasks = Tasks(person)
    async with stdio_client(spec, tasks, person) as mcp:
        assert TASKS in (mcp.server_capabilities.extensions or {})
        result = await mcp.call_tool("cast", {"intent": "paint"})
    assert tasks.created and tasks.created[0].status == "working"
    assert "input_required" in tasks.seen and tasks.seen[-1] == "completed"
    structured = result.structured_content
    assert structured is not None and structured["result"] == "painted"
    approval, question = person.asked
    assert approval.message == 'Approve echo({"text": "rm -rf build"})?'
    assert question.message == "Which colour?"
    calls = {r.gate: r for r in loom_calls(tmp_path, structured["entity_id"])}
    assert calls["echo"].detail["approval"]["decision"] == "approve"
    assert calls["ask_user"].result == "red"


async def test_tasks_cancel_cancels_the_cast_and_the_loom_records_it(tmp_path: Path) -> None:
    slow = [call("echo", text="step one"), {"delay_ms": 600000, **finish("never")}]
    spec = tmp_path / "slow.toml"
    spec.write_text(
        "\n".join(
            [
                "[llm]",
                'provider = "scripted"',
                _toml(slow),
                "[circle]",
                'medium = "conversation"',
                'gates = ["done", "echo"]',
                "wards = [{ max_turns = 4 }]",
                "[loom]",
                'path = "served.db"',
            ]
        )
        + "\n"
    )
    tasks = Tasks()
    async with stdio_client(spec, tasks, None) as mcp:
        created = await mcp.session.call_tool("cast", {"intent": "wait"}, allow_claimed=True)
        assert isinstance(created, CreatedTask)
        session = mcp.session
        with trio.fail_after(30):
            while True:  # the first turn is recorded: the task says so
                state = await session.send_request(
                    GetTask(params=TaskParams(taskId=created.task_id)), TaskState
                )
                if state.status_message and state.status_message.startswith("turn 1"):
                    break
                await trio.sleep(0.05)
        assert state.status == "working"
        await session.send_request(
            CancelTask(params=TaskParams(taskId=created.task_id)), mcp_types.EmptyResult
        )
        with trio.fail_after(30):
            while state.status != "cancelled":
                state = await session.send_request(
                    GetTask(params=TaskParams(taskId=created.task_id)), TaskState
                )
                await trio.sleep(0.05)
        with pytest.raises(MCPError) as unknown:
            await session.send_request(GetTask(params=TaskParams(taskId="task-nope")), TaskState)
        assert unknown.value.code == mcp_types.INVALID_PARAMS
    loom = Loom.open(tmp_path / "served.db")
    try:
        (entity_id,) = list(loom.entities)
        turns = loom.entity_turns(entity_id)
    finally:
        loom.close()
    assert turns[0].utterance == 'echo({"text": "step one"})'
    assert turns[-1].truncated and turns[-1].reason == "cancelled"


async def test_a_task_over_streamable_http(tmp_path: Path) -> None:
    """Over HTTP each ``tasks/*`` request is its own POST (with ``Mcp-Name`` = the task
    id); the cast runs in the server between them."""
    from mcp.client.streamable_http import streamable_http_client

    spec = write_spec(tmp_path)
    person = Person(accept(approve=False, reason="no"), accept(answer="teal"))
    tasks = Tasks(person)
    async with (
        http_server(spec) as url,
        Client(streamable_http_client(url), elicitation_callback=person, extensions=[tasks]) as mcp,
    ):
        result = await mcp.call_tool("cast", {"intent": "paint"})
    assert tasks.created
    structured = result.structured_content
    assert structured is not None and structured["result"] == "painted"
    calls = {r.gate: r for r in loom_calls(tmp_path, structured["entity_id"])}
    assert calls["echo"].is_error and calls["echo"].result == "denied by the user: no"
    assert calls["ask_user"].result == "teal"


async def test_a_client_without_the_extension_gets_the_result_at_once(tmp_path: Path) -> None:
    spec = tmp_path / "quick.toml"
    spec.write_text(
        "\n".join(
            [
                "[llm]",
                'provider = "scripted"',
                _toml([finish("quick")]),
                "[circle]",
                'medium = "conversation"',
                'gates = ["done"]',
                "wards = [{ max_turns = 2 }]",
            ]
        )
        + "\n"
    )
    async with Client(StdioServerParameters(command=CANTRIP, args=["mcp", str(spec)])) as mcp:
        result = await mcp.call_tool("cast", {"intent": "go"})
    assert result.structured_content is not None
    assert result.structured_content["result"] == "quick"


@pytest.mark.parametrize("way", ["2025-11-25", "tasks", "2026-07-28 without tasks"])
async def test_a_question_from_one_of_the_circles_servers_reaches_the_client(
    tmp_path: Path, way: str
) -> None:
    """``cantrip mcp`` serving a circle whose MCP server asks the user: the server's form
    is passed on to the client -- mid-call at 2025-11-25, as the task's input request
    with tasks. A 2026-07-28 client without tasks can be asked only between requests:
    the call answers ``InputRequiredResult`` while the asking call waits in place in
    the server's session, and the retry's answer reaches it (issue 44; it was declined
    at once before)."""
    from test_mcp_elicitation import _spec_toml
    from test_mcp_elicitation import marks as read_marks

    log = tmp_path / "marks"
    spec = tmp_path / "nested.toml"
    spec.write_text(_spec_toml([call("asking_book", city="Oslo"), finish("booked")], log))
    person = Person(accept(seats=2))
    tasks = Tasks(person)
    async with Client(
        StdioServerParameters(command=CANTRIP, args=["mcp", str(spec)]),
        elicitation_callback=person,
        extensions=[tasks] if way == "tasks" else None,
        mode="legacy" if way == "2025-11-25" else "auto",
    ) as mcp:
        result = await mcp.call_tool("cast", {"intent": "book"})
    structured = result.structured_content
    assert structured is not None and structured["result"] == "booked", result
    (asked,) = person.asked
    assert asked.message == "mcp:asking asks (during asking_book): How many seats in Oslo?"
    assert asked.requested_schema["required"] == ["seats"]
    assert read_marks(log) == ["version 2026-07-28", "accept 2"]
    assert bool(tasks.created) == (way == "tasks")
