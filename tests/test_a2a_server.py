"""A2A on ``cantrip serve``, driven by the official a2a-sdk's client (issue 33.2).

The client reads the Agent Card, sends messages (blocking and streamed), gets and
cancels tasks, and answers a paused cast (``input-required``) with a follow-up
message; raw JSON-RPC requests check that bad input gets the protocol's errors."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

import cantrip
from cantrip.protocols.http._serve import serve_http
from cantrip.protocols.middleware._guard import Guard
from cantrip.protocols.middleware._lifecycle import ServeOptions
from cantrip.protocols.sessions._limits import SessionLimits
from gates import ask_user, done, echo

pytest.importorskip("a2a.client", reason="the a2a extra is part of dev")

from a2a.client import ClientConfig, create_client
from a2a.helpers.proto_helpers import new_text_message
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import (
    InvalidParamsError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)

pytestmark = pytest.mark.loop_watch  # nothing here may block the trio loop (issue 28)


def spell(
    script: list[dict[str, Any]], counter: Path | None = None, loom: Path | None = None
) -> cantrip.Cantrip:
    @cantrip.gate(requires_approval=True)
    def bump() -> int:
        """Count once (a side effect that needs approval)."""
        assert counter is not None
        value = int(counter.read_text()) if counter.exists() else 0
        counter.write_text(str(value + 1))
        return value + 1

    @cantrip.gate
    async def slow() -> str:
        """Take a long time."""
        await trio.sleep(60)
        return "late"

    @cantrip.gate
    async def nap() -> str:
        """Take a moment."""
        await trio.sleep(0.5)
        return "rested"

    return cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(script),
        identity=cantrip.Identity(system_prompt="Books flights.\n\nMore detail."),
        circle=cantrip.Circle([done, echo, bump, slow, nap, ask_user], [cantrip.max_turns(6)]),
        loom=cantrip.Loom() if loom is None else cantrip.Loom.open(loom),
    )


def call(gate: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"gate": gate, "args": args}]}


@asynccontextmanager
async def serving(
    s: cantrip.Cantrip,
    token: str | None = None,
    limits: SessionLimits | None = None,
    options: ServeOptions | None = None,
) -> AsyncIterator[str]:
    async with trio.open_nursery() as nursery:
        guard = Guard(token=token)
        binds = await nursery.start(
            lambda task_status: serve_http(
                s,
                "127.0.0.1",
                0,
                task_status=task_status,
                guard=guard,
                limits=limits,
                options=options,
            )
        )
        yield binds[0]
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def client_for(url: str, *, streaming: bool = False) -> AsyncIterator[Any]:
    async with httpx.AsyncClient(timeout=20) as http:
        client = await create_client(url, ClientConfig(streaming=streaming, httpx_client=http))
        async with client:
            yield client


def message(text: str, *, context_id: str = "", task_id: str = "") -> pb.SendMessageRequest:
    msg = new_text_message(
        text, context_id=context_id or None, task_id=task_id or None, role=pb.ROLE_USER
    )
    return pb.SendMessageRequest(message=msg)


async def sent(client: Any, request: pb.SendMessageRequest) -> list[pb.StreamResponse]:
    return [event async for event in client.send_message(request)]


async def test_the_agent_card_names_the_endpoint_the_skills_and_streaming() -> None:
    async with serving(spell([])) as url, httpx.AsyncClient(base_url=url) as http:
        card = (await http.get("/.well-known/agent-card.json")).json()
        assert card["supportedInterfaces"] == [
            {"url": f"{url}/a2a", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
        ]
        assert card["description"] == "Books flights."
        assert card["capabilities"] == {"streaming": True, "pushNotifications": True}
        skills = {s["id"]: s for s in card["skills"]}
        assert set(skills) == {"echo", "bump", "slow", "nap", "ask_user"}
        assert skills["slow"]["description"] == "Take a long time."
        wrong = await http.post("/.well-known/agent-card.json", json={})
        assert wrong.status_code == 405


async def test_send_completes_a_task_and_the_context_is_the_session() -> None:
    script = [
        call("done", answer="booked LX318"),
        call("done", answer="it was LX318"),
    ]
    async with serving(spell(script)) as url, client_for(url) as client:
        (first,) = await sent(client, message("book a flight"))
        task = first.task
        assert task.status.state == pb.TASK_STATE_COMPLETED
        assert [p.text for p in task.artifacts[0].parts] == ["booked LX318"]
        assert task.history[0].parts[0].text == "book a flight"
        (second,) = await sent(client, message("which flight?", context_id=task.context_id))
        assert second.task.context_id == task.context_id, "one context, one session"
        assert second.task.id != task.id
        assert second.task.artifacts[0].parts[0].text == "it was LX318"
        got = await client.get_task(pb.GetTaskRequest(id=task.id))
        assert got.status.state == pb.TASK_STATE_COMPLETED and got.id == task.id
        async with httpx.AsyncClient(base_url=url) as http:
            thread = (await http.get(f"/sessions/{task.context_id}/thread")).json()["turns"]
        assert len(thread) == 2, "both tasks' turns are in the session's loom thread"


async def test_stream_reports_progress_then_the_answer() -> None:
    script = [call("echo", text="looking"), call("done", answer="found it")]
    async with serving(spell(script)) as url, client_for(url, streaming=True) as client:
        events = await sent(client, message("find it"))
        kinds = [e.WhichOneof("payload") for e in events]
        assert kinds[0] == "task" and events[0].task.status.state in (
            pb.TASK_STATE_SUBMITTED,
            pb.TASK_STATE_WORKING,
        )
        assert "status_update" in kinds[1:-2], kinds
        assert kinds[-2:] == ["artifact_update", "status_update"]
        assert events[-2].artifact_update.artifact.parts[0].text == "found it"
        assert events[-1].status_update.status.state == pb.TASK_STATE_COMPLETED
        progress = [
            json.dumps(list(e.status_update.status.message.parts[0].data.struct_value.keys()))
            for e in events
            if e.WhichOneof("payload") == "status_update"
            and e.status_update.status.state == pb.TASK_STATE_WORKING
        ]
        assert progress, "the cast's events arrive as working updates"


async def test_cancel_stops_a_running_task() -> None:
    script = [call("slow"), call("done", answer="never")]
    async with serving(spell(script)) as url, client_for(url) as client:
        request = message("take your time")
        request.configuration.return_immediately = True
        (first,) = await sent(client, request)
        task_id = first.task.id
        assert first.task.status.state == pb.TASK_STATE_WORKING
        with trio.fail_after(10):
            cancelled = await client.cancel_task(pb.CancelTaskRequest(id=task_id))
        assert cancelled.status.state == pb.TASK_STATE_CANCELED
        got = await client.get_task(pb.GetTaskRequest(id=task_id))
        assert got.status.state == pb.TASK_STATE_CANCELED
        async with httpx.AsyncClient(base_url=url) as http:
            turns = (await http.get(f"/sessions/{first.task.context_id}/thread")).json()["turns"]
        assert turns[-1]["reason"] == "cancelled", "the loom records the cancellation"
        with pytest.raises(TaskNotCancelableError, match="CANCELED"):
            await client.cancel_task(pb.CancelTaskRequest(id=task_id))


async def test_a_paused_cast_is_input_required_and_a_follow_up_answers_it(
    tmp_path: Path,
) -> None:
    counter = tmp_path / "n"
    script = [
        call("bump"),
        call("ask_user", question="Window or aisle?"),
        call("done", answer="counted"),
    ]
    async with serving(spell(script, counter)) as url, client_for(url) as client:
        (first,) = await sent(client, message("count once"))
        task = first.task
        assert task.status.state == pb.TASK_STATE_INPUT_REQUIRED
        assert "bump" in task.status.message.parts[0].text
        assert not counter.exists(), "nothing ran before the approval"
        follow = message("approve", context_id=task.context_id, task_id=task.id)
        (second,) = await sent(client, follow)
        assert second.task.id == task.id
        assert second.task.status.state == pb.TASK_STATE_INPUT_REQUIRED
        assert second.task.status.message.parts[0].text == "Window or aisle?"
        assert counter.read_text() == "1"
        (third,) = await sent(client, message("aisle", task_id=task.id))
        assert third.task.status.state == pb.TASK_STATE_COMPLETED
        assert third.task.artifacts[0].parts[0].text == "counted"
        async with httpx.AsyncClient(base_url=url) as http:
            turns = (await http.get(f"/sessions/{task.context_id}/thread")).json()["turns"]
        answers = [c["result"] for t in turns for c in t["gate_calls"] if c["gate"] == "ask_user"]
        assert answers == ["aisle"]
        with pytest.raises(InvalidParamsError, match="COMPLETED"):
            await sent(client, message("again", task_id=task.id))


async def test_a_paused_task_is_answered_after_its_session_left_memory(tmp_path: Path) -> None:
    counter = tmp_path / "n"
    script = [call("bump"), call("done", answer="other"), call("done", answer="counted")]
    limits = SessionLimits(max_sessions=1)
    s = spell(script, counter, tmp_path / "loom.db")
    async with serving(s, limits=limits) as url, client_for(url) as client:
        (first,) = await sent(client, message("count once"))
        assert first.task.status.state == pb.TASK_STATE_INPUT_REQUIRED
        (other,) = await sent(client, message("something else"))  # evicts the paused one
        assert other.task.context_id != first.task.context_id
        async with httpx.AsyncClient(base_url=url) as http:
            live = (await http.get("/sessions")).json()["sessions"]
        assert [x["session_id"] for x in live] == [other.task.context_id], "the limit holds"
        (answered,) = await sent(client, message("yes", task_id=first.task.id))
        assert answered.task.status.state == pb.TASK_STATE_COMPLETED, answered.task.status
        assert answered.task.artifacts[0].parts[0].text == "counted"
        assert counter.read_text() == "1"


async def test_list_tasks_filters_pages_and_trims(tmp_path: Path) -> None:
    script = [call("done", answer="one"), call("done", answer="two"), call("bump")]
    async with serving(spell(script, tmp_path / "n")) as url, client_for(url) as client:
        (first,) = await sent(client, message("a"))
        context = first.task.context_id
        (second,) = await sent(client, message("b", context_id=context))
        (third,) = await sent(client, message("c"))  # another context, paused
        everything = await client.list_tasks(pb.ListTasksRequest())
        assert [t.id for t in everything.tasks] == [third.task.id, second.task.id, first.task.id]
        assert everything.total_size == 3 and not everything.next_page_token
        assert not everything.tasks[1].artifacts, "artifacts only when asked for"
        mine = await client.list_tasks(
            pb.ListTasksRequest(context_id=context, include_artifacts=True, history_length=0)
        )
        assert [t.id for t in mine.tasks] == [second.task.id, first.task.id]
        assert mine.tasks[0].artifacts[0].parts[0].text == "two" and not mine.tasks[0].history
        waiting = await client.list_tasks(pb.ListTasksRequest(status=pb.TASK_STATE_INPUT_REQUIRED))
        assert [t.id for t in waiting.tasks] == [third.task.id]
        page = await client.list_tasks(pb.ListTasksRequest(page_size=2))
        assert [t.id for t in page.tasks] == [third.task.id, second.task.id]
        rest = await client.list_tasks(pb.ListTasksRequest(page_token=page.next_page_token))
        assert [t.id for t in rest.tasks] == [first.task.id] and not rest.next_page_token
        later = pb.ListTasksRequest()
        later.status_timestamp_after.CopyFrom(third.task.status.timestamp)
        assert [t.id for t in (await client.list_tasks(later)).tasks] == [third.task.id]
        for bad in (pb.ListTasksRequest(page_size=101), pb.ListTasksRequest(page_token="zz")):
            with pytest.raises(InvalidParamsError):
                await client.list_tasks(bad)


async def test_subscribe_follows_a_running_task_from_another_connection() -> None:
    script = [call("nap"), call("nap"), call("done", answer="rested twice")]
    async with (
        serving(spell(script)) as url,
        client_for(url) as starter,
        client_for(url, streaming=True) as watcher,
    ):
        (started,) = await sent(starter, immediately(message("rest")))
        task_id = started.task.id
        with trio.fail_after(20):
            events = [e async for e in watcher.subscribe(pb.SubscribeToTaskRequest(id=task_id))]
        kinds = [e.WhichOneof("payload") for e in events]
        assert kinds[0] == "task" and events[0].task.id == task_id
        assert "status_update" in kinds[1:-2], kinds
        assert kinds[-2:] == ["artifact_update", "status_update"]
        assert events[-1].status_update.status.state == pb.TASK_STATE_COMPLETED
        with pytest.raises(UnsupportedOperationError, match="terminal"):
            [e async for e in watcher.subscribe(pb.SubscribeToTaskRequest(id=task_id))]
        with pytest.raises(TaskNotFoundError):
            [e async for e in watcher.subscribe(pb.SubscribeToTaskRequest(id="nope"))]


def immediately(request: pb.SendMessageRequest) -> pb.SendMessageRequest:
    request.configuration.return_immediately = True
    return request


async def rpc(http: httpx.AsyncClient, body: Any, **headers: str) -> dict[str, Any]:
    raw = body if isinstance(body, str | bytes) else json.dumps(body)
    response = await http.post(
        "/a2a",
        content=raw,
        headers={"content-type": "application/json", "a2a-version": "1.0", **headers},
    )
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


async def test_bad_input_gets_json_rpc_errors_and_loses_nothing() -> None:
    ok = spell([call("done", answer="ok")])
    async with serving(ok) as url, httpx.AsyncClient(base_url=url, timeout=20) as http:
        assert (await rpc(http, "{not json"))["error"]["code"] == -32700
        assert (await rpc(http, [1, 2]))["error"]["code"] == -32600
        unknown = await rpc(http, {"jsonrpc": "2.0", "id": 1, "method": "Nope"})
        assert unknown["error"]["code"] == -32601 and unknown["id"] == 1
        bad_params = await rpc(
            http,
            {"jsonrpc": "2.0", "id": 2, "method": "SendMessage", "params": {"message": 3}},
        )
        assert bad_params["error"]["code"] == -32602
        no_parts = await rpc(
            http,
            {
                "jsonrpc": "2.0",
                "id": 3,
                "method": "SendMessage",
                "params": {"message": {"messageId": "m", "role": "ROLE_USER", "parts": []}},
            },
        )
        assert no_parts["error"]["code"] == -32602
        missing = await rpc(
            http, {"jsonrpc": "2.0", "id": 4, "method": "GetTask", "params": {"id": "x"}}
        )
        assert missing["error"]["code"] == -32001  # TaskNotFoundError
        too_big = await rpc(http, '{"pad": "' + "x" * (2 << 20) + '"}')
        assert too_big["error"]["code"] == -32600
        # A2A 0.3 method names are served too (the SDK's compatibility adapter).
        legacy = await http.post(
            "/a2a",
            json={
                "jsonrpc": "2.0",
                "id": 5,
                "method": "message/send",
                "params": {
                    "message": {
                        "kind": "message",
                        "messageId": "m1",
                        "role": "user",
                        "parts": [{"kind": "text", "text": "hello"}],
                    }
                },
            },
        )
        result = legacy.json()["result"]
        assert result["kind"] == "task" and result["status"]["state"] == "completed"
        sessions = (await http.get("/sessions")).json()["sessions"]
        assert [s["session_id"] for s in sessions] == [result["contextId"]]


async def test_the_guard_applies_to_the_a2a_endpoint_and_the_card() -> None:
    async with serving(spell([]), token="s3cret") as url:
        async with httpx.AsyncClient(base_url=url) as http:
            assert (await http.get("/.well-known/agent-card.json")).status_code == 401
            refused = await http.post("/a2a", json={"jsonrpc": "2.0", "id": 1, "method": "GetTask"})
            assert refused.status_code == 401
            other_host = await http.get(
                "/.well-known/agent-card.json",
                headers={"host": "evil.example", "authorization": "Bearer s3cret"},
            )
            assert other_host.status_code == 403
        auth = {"authorization": "Bearer s3cret"}
        async with httpx.AsyncClient(timeout=20, headers=auth) as http:
            client = await create_client(url, ClientConfig(streaming=False, httpx_client=http))
            async with client:
                with pytest.raises(TaskNotFoundError):
                    await client.get_task(pb.GetTaskRequest(id="nope"))


async def test_secrets_never_leave_through_a2a(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-a2a-0123456789abcdef"
    monkeypatch.setenv("SOME_SERVICE_TOKEN", secret)
    script = [call("echo", text=f"key {secret}"), call("done", answer=f"the key is {secret}")]
    async with serving(spell(script)) as url, client_for(url, streaming=True) as client:
        events = await sent(client, message("what is the key?"))
        task_id = events[0].task.id
        got = await client.get_task(pb.GetTaskRequest(id=task_id))
    seen = "".join(str(e) for e in events) + str(got)
    assert "[REDACTED]" in seen and secret not in seen


def _mutations(rng: random.Random) -> Any:
    """A JSON value of any shape, for a field that expects something else."""
    choice = rng.randrange(9)
    if choice == 0:
        return None
    if choice == 1:
        return rng.choice([True, False])
    if choice == 2:
        return rng.randrange(-(2**40), 2**40)
    if choice == 3:
        return rng.random() * 1e6
    if choice == 4:
        return "".join(chr(rng.randrange(0x20, 0x2FFF)) for _ in range(rng.randrange(30)))
    if choice == 5:
        return [rng.randrange(10)] * rng.randrange(4)
    if choice == 6:
        return {"kind": "text", "text": "x"}
    if choice == 7:
        return "ROLE_USER"
    return {}


def _fuzzed(rng: random.Random, index: int) -> dict[str, Any]:
    """A JSON-RPC request of a served method with one field (at any depth) replaced."""
    method = rng.choice(
        [
            "SendMessage",
            "SendStreamingMessage",
            "GetTask",
            "CancelTask",
            "message/send",
            "tasks/get",
            "tasks/cancel",
            "ListTasks",
            "SubscribeToTask",
            "CreateTaskPushNotificationConfig",
            "GetTaskPushNotificationConfig",
            "ListTaskPushNotificationConfigs",
            "DeleteTaskPushNotificationConfig",
            "tasks/resubscribe",
        ]
    )
    request: dict[str, Any] = {
        "jsonrpc": "2.0",
        "id": index,
        "method": method,
        "params": {
            "id": "task-x",
            "message": {
                "messageId": f"m{index}",
                "role": "ROLE_USER",
                "parts": [{"text": "hello"}],
                "contextId": "ctx-unknown",
                "taskId": "",
            },
            "configuration": {"historyLength": 2},
            "taskId": "task-x",
            "url": "http://127.0.0.1:9/hook",
            "pageSize": 5,
        },
    }
    paths = [
        ["jsonrpc"],
        ["id"],
        ["method"],
        ["params"],
        ["params", "id"],
        ["params", "message"],
        ["params", "message", "role"],
        ["params", "message", "parts"],
        ["params", "message", "contextId"],
        ["params", "message", "taskId"],
        ["params", "configuration"],
        ["params", "configuration", "historyLength"],
        ["params", "configuration", "taskPushNotificationConfig"],
        ["params", "pageSize"],
        ["params", "pageToken"],
        ["params", "status"],
        ["params", "taskId"],
        ["params", "url"],
    ]
    for _ in range(rng.randrange(1, 3)):
        *parents, last = rng.choice(paths)
        target: Any = request
        for key in parents:
            target = target.get(key) if isinstance(target, dict) else None
        if isinstance(target, dict):
            target[last] = _mutations(rng)
    return request


async def fuzz(http: httpx.AsyncClient, count: int = 300, seed: int = 33) -> set[int]:
    """``count`` fuzzed requests at ``/a2a``: each answered in JSON-RPC's shape (never an
    internal error); the error codes seen. Both servers are fuzzed with it."""
    rng = random.Random(seed)
    codes: set[int] = set()
    for index in range(count):
        body = _fuzzed(rng, index)
        response = await http.post(
            "/a2a", json=body, headers={"a2a-version": rng.choice(["1.0", "0.3", "9"])}
        )
        assert response.status_code == 200, (body, response.text)
        if response.headers["content-type"].startswith("text/event-stream"):
            continue  # a stream that started: its first event was checked by the SDK
        answer = response.json()
        assert answer["jsonrpc"] == "2.0" and ("error" in answer) != ("result" in answer)
        if "error" in answer:
            codes.add(answer["error"]["code"])
            error = answer["error"]
            # No internal errors -- except the SDK's 0.3 adapter, which reports a 0.3
            # method sent with A2A-Version 1.0 as -32603 (its 1.0 path says -32009).
            assert (
                error["code"] != -32603 or "is not supported by this handler" in (error["message"])
            ), (body, answer)
    return codes


async def test_fuzzed_requests_get_json_rpc_answers_and_the_server_stays_up() -> None:
    async with serving(spell([])) as url, httpx.AsyncClient(base_url=url, timeout=20) as http:
        codes = await fuzz(http)
        assert (await http.get("/health")).json()["ok"]
        assert (await http.get("/sessions")).json()["sessions"] == [], "nothing half-made"
    assert {-32600, -32601, -32602} <= codes, codes


def test_a_prompts_parts_are_read_as_the_gate_reads_a_reply() -> None:
    """One reading of parts on both sides: text, data as JSON, a URL, and an inline
    file described (its bytes are not text) rather than dropped; empty parts vanish."""
    from google.protobuf.struct_pb2 import Struct, Value

    from cantrip.protocols.a2a._server import text_of

    data = Struct()
    data.update({"city": "Oslo"})
    message = pb.Message(
        parts=[
            pb.Part(text="hi"),
            pb.Part(data=Value(struct_value=data)),
            pb.Part(raw=b"abc", filename="x.png", media_type="image/png"),
            pb.Part(url="https://files.example/f"),
            pb.Part(text=""),
        ]
    )
    assert text_of(message).splitlines() == [
        "hi",
        '{"city": "Oslo"}',
        "[image/png x.png: 3 bytes]",
        "https://files.example/f",
    ]


async def refuses_ids_that_are_not_text(http: httpx.AsyncClient) -> None:
    """Every A2A id a client sends (message, context and task ids, a task's id) that
    no UTF-8 can carry is JSON-RPC's invalid params, refused by the SDK's protobuf
    reader before anything is made (issue 39.10; both servers, SPEC.md "Ids from
    clients")."""

    def text(**ids: str) -> dict[str, Any]:
        return {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}], **ids}

    bad = "x\ud800"
    calls = [
        ("SendMessage", {"message": text(messageId=bad)}),
        ("SendMessage", {"message": text(contextId=bad)}),
        ("SendMessage", {"message": text(taskId=bad)}),
        ("GetTask", {"id": bad}),
        ("CancelTask", {"id": bad}),
    ]
    for index, (method, params) in enumerate(calls):
        body = {"jsonrpc": "2.0", "id": index, "method": method, "params": params}
        answer = await rpc(http, json.dumps(body))  # the surrogate travels as an escape
        assert answer.get("error", {}).get("code") == -32602, (method, params, answer)


async def test_a2a_ids_that_are_not_text_are_invalid_params() -> None:
    s = spell([call("done", answer="ok")])
    async with serving(s) as url, httpx.AsyncClient(base_url=url, timeout=20) as http:
        await refuses_ids_that_are_not_text(http)
        assert (await http.get("/sessions")).json()["sessions"] == []
