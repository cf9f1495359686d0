"""A2A written once over the session seam: the same tests against both modes.

Each test runs against ``cantrip serve`` in process and against a ``serve --db``
replica (PostgreSQL, a ``cantrip worker`` process), both on tests/test_serve_db.py's
stack and its loopback OpenAI server (echo, echo, then done with
``"<prompt> ok #<n>"``): one handler (:mod:`cantrip.protocols.a2a._handler`), two
backends, one behaviour."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from pg_cluster import fresh_database
from test_a2a_server import message, sent
from test_serve_db import Stack, _free_port, open_stack

pytest.importorskip("a2a.client", reason="the a2a extra is part of dev")

from a2a.client import ClientConfig, create_client
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import InvalidParamsError, TaskNotCancelableError

pytestmark = pytest.mark.loop_watch

MODES = ["process", "db"]


def serve_in_process(stack: Stack, spec: Path) -> str:
    """``cantrip serve`` (no ``--db``) on the stack's spec, once its /health answers."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cantrip", "serve", str(spec), "--port", str(port)],
        env=stack.env,
        stdout=subprocess.DEVNULL,
        stderr=stack.log.open("ab"),
    )
    stack.procs.append(proc)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, f"the server exited; see {stack.log.read_text()}"
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return base
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the server did not come up"
        time.sleep(0.1)


def process_and_replica(stack: Stack) -> dict[str, str]:
    """Each serve mode's server over the stack's spec: ``cantrip serve`` in process on an
    SQLite loom beside the stack's files, and the stack's first replica."""
    spec = stack.spec.with_name("sqlite.toml")
    loom = stack.spec.with_name("loom.db")
    spec.write_text(stack.spec.read_text() + f'\n[loom]\npath = "{loom}"\n')
    return {"process": serve_in_process(stack, spec), "db": stack.replicas[0]}


@pytest.fixture(scope="module")
def stack(pg_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    url = fresh_database(pg_server, "a2a_modes")
    with open_stack(url, tmp_path_factory.mktemp("a2a-modes"), replicas=1) as built:
        yield built


@pytest.fixture(scope="module")
def servers(stack: Stack) -> dict[str, str]:
    """Each mode's server: the in-process one and the replica."""
    return {"process": serve_in_process(stack, stack.spec), "db": stack.replicas[0]}


@pytest.fixture(scope="module")
def pausing(stack: Stack) -> dict[str, str]:
    """Each mode's server of the spec with ``approve = ["echo"]``."""
    spec = stack.spec.with_name("pausing.toml")
    spec.write_text(stack.spec.read_text().replace("wards = [", 'approve = ["echo"]\nwards = [', 1))
    return {"process": serve_in_process(stack, spec), "db": stack.start_replica(spec)}


@asynccontextmanager
async def client_for(url: str, *, streaming: bool = False) -> AsyncIterator[Any]:
    async with httpx.AsyncClient(timeout=60) as http:
        client = await create_client(url, ClientConfig(streaming=streaming, httpx_client=http))
        async with client:
            yield client


def immediately(request: pb.SendMessageRequest) -> pb.SendMessageRequest:
    request.configuration.return_immediately = True
    return request


async def sessions_at(base: str) -> int:
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        return len((await http.get("/sessions")).json()["sessions"])


@pytest.mark.parametrize("mode", MODES)
async def test_a_task_completes_and_its_context_goes_on(servers: dict[str, str], mode: str) -> None:
    async with client_for(servers[mode]) as client:
        (first,) = await sent(client, message("book"))
        task = first.task
        assert task.status.state == pb.TASK_STATE_COMPLETED, task.status
        assert task.artifacts[0].parts[0].text == "book ok #1"
        (second,) = await sent(client, message("again", context_id=task.context_id))
        assert second.task.artifacts[0].parts[0].text == "again ok #2", "one conversation"
        got = await client.get_task(pb.GetTaskRequest(id=task.id))
        assert got.status.state == pb.TASK_STATE_COMPLETED and got.artifacts == task.artifacts
        listed = await client.list_tasks(pb.ListTasksRequest(context_id=task.context_id))
        assert [t.id for t in listed.tasks] == [second.task.id, task.id], "newest first"


@pytest.mark.parametrize("mode", MODES)
async def test_a_stream_tells_each_turn_then_the_answer(servers: dict[str, str], mode: str) -> None:
    async with client_for(servers[mode], streaming=True) as client:
        with trio.fail_after(60):
            events = await sent(client, message("fly"))
    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds[0] == "task" and events[0].task.status.state == pb.TASK_STATE_WORKING
    assert kinds[-2:] == ["artifact_update", "status_update"], kinds
    assert events[-2].artifact_update.artifact.parts[0].text == "fly ok #1"
    steps = [
        e.status_update.status.message.parts[0].data.struct_value["type"]
        for e in events[1:-2]
        if e.status_update.status.message.parts[0].data.struct_value["type"] == "step_complete"
    ]
    assert len(steps) == 3, "a working update per turn, whatever else the mode tells"


@pytest.mark.parametrize("mode", MODES)
async def test_a_busy_context_and_an_unknown_one_are_invalid_params(
    servers: dict[str, str], mode: str
) -> None:
    async with client_for(servers[mode]) as client:
        with pytest.raises(InvalidParamsError, match="contextId"):
            await sent(client, message("x", context_id="session-nope"))
        (started,) = await sent(client, immediately(message("long")))
        with pytest.raises(InvalidParamsError, match="running another task"):
            await sent(client, message("more", context_id=started.task.context_id))
        with trio.fail_after(30):
            cancelled = await client.cancel_task(pb.CancelTaskRequest(id=started.task.id))
        assert cancelled.status.state == pb.TASK_STATE_CANCELED
        with pytest.raises(TaskNotCancelableError, match="CANCELED"):
            await client.cancel_task(pb.CancelTaskRequest(id=started.task.id))


@pytest.mark.parametrize("mode", MODES)
async def test_request_headers_are_checked_before_anything_is_queued(
    servers: dict[str, str], mode: str
) -> None:
    """An ``A2A-Version`` the server does not speak (or none: 0.3, for a 1.0 method), or
    an ``A2A-Extensions`` that lists no extension URIs, is refused before a session is
    made or a prompt queued (issue 41: as MCP's headers); an extension the server does
    not implement is ignored, as the protocol says."""
    base = servers[mode]
    before = await sessions_at(base)
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}},
    }
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        for headers in ({"a2a-version": "9"}, {"a2a-version": "0.3"}, {}):
            answer = (await http.post("/a2a", json=body, headers=headers)).json()
            assert answer["error"]["code"] == -32009, (headers, answer)
        for listed in ("urn:x,,urn:y", "not a uri", "https://x.example/e, \x7f"):
            headers = {"a2a-version": "1.0", "a2a-extensions": listed}
            answer = (await http.post("/a2a", json=body, headers=headers)).json()
            assert answer["error"]["code"] == -32600, (listed, answer)
            assert "A2A-Extensions" in answer["error"]["message"]
        served = {"a2a-version": "1.0", "a2a-extensions": "https://x.example/ext/v1"}
        ok = (await http.post("/a2a", json=body, headers=served)).json()
        assert ok["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED", ok
    assert await sessions_at(base) == before + 1, "only the request with good headers"


@pytest.mark.parametrize("mode", MODES)
async def test_a_paused_task_is_answered_once_or_cancelled_while_it_waits(
    pausing: dict[str, str], mode: str
) -> None:
    async with client_for(pausing[mode]) as client:
        (first,) = await sent(client, message("pay"))
        task = first.task
        assert task.status.state == pb.TASK_STATE_INPUT_REQUIRED, task.status
        assert "echo" in task.status.message.parts[0].text
        answers: list[Any] = []

        async def answer() -> None:
            try:
                answers.append(await sent(client, message("approve", task_id=task.id)))
            except InvalidParamsError as exc:
                answers.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(answer)
            nursery.start_soon(answer)
        refused = [x for x in answers if isinstance(x, InvalidParamsError)]
        assert len(refused) == 1, answers
        (third,) = await sent(client, message("deny", task_id=task.id))
        assert third.task.status.state == pb.TASK_STATE_COMPLETED, third.task.status
        assert [m.parts[0].text for m in third.task.history[:3]] == ["pay", "approve", "deny"]

        (other,) = await sent(client, message("pay"))
        cancelled = await client.cancel_task(pb.CancelTaskRequest(id=other.task.id))
        assert cancelled.status.state == pb.TASK_STATE_CANCELED
        with pytest.raises(InvalidParamsError, match="CANCELED"):
            await sent(client, message("approve", task_id=other.task.id))
