"""A2A on ``cantrip serve --db``: tasks valid at any replica, driven by the a2a-sdk client.

Real components throughout (tests/test_serve_db.py's stack): PostgreSQL, a loopback
OpenAI server answering in the real wire format (echo, echo, then done with
``"<prompt> ok #<n>"``), two ``serve --db`` replicas and a ``cantrip worker`` process.
A task sent at one replica is read, listed, followed, answered and cancelled at the
other."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio
from pg_cluster import fresh_database
from test_a2a_server import fuzz, message, refuses_ids_that_are_not_text, sent
from test_serve_db import Stack, open_stack

from cantrip.protocols.sessions._hub import entity_id_for

pytest.importorskip("a2a.client", reason="the a2a extra is part of dev")

from a2a.client import ClientConfig, create_client
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import (
    InvalidParamsError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    UnsupportedOperationError,
)

pytestmark = pytest.mark.loop_watch


@pytest.fixture(scope="module")
def stack(pg_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    url = fresh_database(pg_server, "a2a_db")
    with open_stack(url, tmp_path_factory.mktemp("a2a-db")) as built:
        yield built


@pytest.fixture(scope="module")
def pausing(stack: Stack) -> tuple[str, str]:
    """Two more replicas serving the spec with ``approve = ["echo"]``."""
    spec = stack.spec.with_name("pausing.toml")
    spec.write_text(stack.spec.read_text().replace("wards = [", 'approve = ["echo"]\nwards = [', 1))
    return stack.start_replica(spec), stack.start_replica(spec)


@asynccontextmanager
async def client_for(url: str, *, streaming: bool = False) -> AsyncIterator[Any]:
    async with httpx.AsyncClient(timeout=60) as http:
        client = await create_client(url, ClientConfig(streaming=streaming, httpx_client=http))
        async with client:
            yield client


def immediately(request: pb.SendMessageRequest) -> pb.SendMessageRequest:
    request.configuration.return_immediately = True
    return request


async def test_each_replica_serves_the_card_without_push(stack: Stack) -> None:
    for base in stack.replicas:
        async with httpx.AsyncClient(base_url=base) as http:
            card = (await http.get("/.well-known/agent-card.json")).json()
        assert card["supportedInterfaces"][0]["url"] == f"{base}/a2a"
        assert card["capabilities"] == {"streaming": True, "pushNotifications": False}
        assert {s["id"] for s in card["skills"]} == {"echo"}


async def test_a_task_sent_at_one_replica_is_read_and_listed_at_the_other(stack: Stack) -> None:
    a, b = stack.replicas[:2]
    async with client_for(a) as on_a, client_for(b) as on_b:
        (first,) = await sent(on_a, message("book"))
        task = first.task
        assert task.status.state == pb.TASK_STATE_COMPLETED, task.status
        assert task.artifacts[0].parts[0].text == "book ok #1"
        assert task.history[0].parts[0].text == "book"
        got = await on_b.get_task(pb.GetTaskRequest(id=task.id))
        assert got.status.state == pb.TASK_STATE_COMPLETED
        assert got.artifacts == task.artifacts and got.history == task.history
        (second,) = await sent(on_b, message("again", context_id=task.context_id))
        assert second.task.context_id == task.context_id
        assert second.task.artifacts[0].parts[0].text == "again ok #2", "one conversation"
        listed = await on_a.list_tasks(pb.ListTasksRequest(context_id=task.context_id))
        assert [t.id for t in listed.tasks] == [second.task.id, task.id], "newest first"
        assert listed.total_size == 2 and not listed.tasks[0].artifacts
        page = await on_b.list_tasks(pb.ListTasksRequest(context_id=task.context_id, page_size=1))
        assert [t.id for t in page.tasks] == [second.task.id] and page.next_page_token
        rest = await on_a.list_tasks(
            pb.ListTasksRequest(context_id=task.context_id, page_token=page.next_page_token)
        )
        assert [t.id for t in rest.tasks] == [task.id] and not rest.next_page_token
    async with httpx.AsyncClient(base_url=b) as http:
        thread = (await http.get(f"/sessions/{task.context_id}/thread")).json()["turns"]
    assert len(thread) == 6, "both tasks' turns are the session's thread"


async def test_a_stream_at_one_replica_and_a_subscription_at_the_other_see_the_task_through(
    stack: Stack,
) -> None:
    a, b = stack.replicas[:2]
    async with (
        client_for(a) as starting,
        client_for(a, streaming=True) as on_a,
        client_for(b, streaming=True) as on_b,
    ):
        (started,) = await sent(starting, immediately(message("trip")))
        task = started.task
        assert task.status.state == pb.TASK_STATE_WORKING
        with trio.fail_after(60):
            followed = [e async for e in on_b.subscribe(pb.SubscribeToTaskRequest(id=task.id))]
        kinds = [e.WhichOneof("payload") for e in followed]
        assert kinds[0] == "task" and kinds[-2:] == ["artifact_update", "status_update"], kinds
        assert followed[-1].status_update.status.state == pb.TASK_STATE_COMPLETED
        assert followed[-2].artifact_update.artifact.parts[0].text == "trip ok #1"
        with pytest.raises(UnsupportedOperationError, match="terminal"):
            [e async for e in on_b.subscribe(pb.SubscribeToTaskRequest(id=task.id))]

        with trio.fail_after(60):
            events = await sent(on_a, message("fly"))
        kinds = [e.WhichOneof("payload") for e in events]
        assert kinds[0] == "task" and kinds[-2:] == ["artifact_update", "status_update"]
        steps = [
            e.status_update.status.message.parts[0].data.struct_value["type"] for e in events[1:-2]
        ]
        assert steps == ["step_complete"] * 3, "a working update per turn as it lands"


async def test_cancel_at_one_replica_stops_the_worker_mid_cast_and_the_other_sees_it(
    stack: Stack,
) -> None:
    """Started at A, followed at B; once a turn has landed (the worker runs the cast)
    A cancels: the worker cuts the cast off and records it, B's stream ends canceled."""
    a, b = stack.replicas[:2]
    async with client_for(a) as on_a, client_for(b, streaming=True) as on_b:
        (started,) = await sent(on_a, immediately(message("long")))
        task = started.task
        followed: list[pb.StreamResponse] = []
        with trio.fail_after(60):
            async for event in on_b.subscribe(pb.SubscribeToTaskRequest(id=task.id)):
                followed.append(event)
                if event.WhichOneof("payload") == "status_update" and len(followed) == 2:
                    cancelled = await on_a.cancel_task(pb.CancelTaskRequest(id=task.id))
                    assert cancelled.status.state == pb.TASK_STATE_CANCELED, cancelled.status
        assert followed[-1].status_update.status.state == pb.TASK_STATE_CANCELED
        got = await on_b.get_task(pb.GetTaskRequest(id=task.id))
        assert got.status.state == pb.TASK_STATE_CANCELED
        with pytest.raises(TaskNotCancelableError, match="CANCELED"):
            await on_a.cancel_task(pb.CancelTaskRequest(id=task.id))
    entity = entity_id_for(task.context_id)
    states = await stack.query("SELECT state FROM cantrip_work WHERE entity_id = %s", entity)
    assert states == [("cancelled",)], "the work item was cancelled, not left to finish"
    async with httpx.AsyncClient(base_url=b) as http:
        thread = (await http.get(f"/sessions/{task.context_id}/thread")).json()["turns"]
    assert thread[-1]["reason"] == "cancelled", "the worker recorded the cancellation"


async def test_a_task_cancelled_as_soon_as_it_is_sent_ends_canceled(stack: Stack) -> None:
    a, b = stack.replicas[:2]
    async with client_for(a) as on_a, client_for(b) as on_b:
        (started,) = await sent(on_a, immediately(message("never")))
        with trio.fail_after(30):
            cancelled = await on_b.cancel_task(pb.CancelTaskRequest(id=started.task.id))
        assert cancelled.status.state == pb.TASK_STATE_CANCELED


async def test_a_paused_cast_is_input_required_and_answered_at_another_replica_once(
    stack: Stack, pausing: tuple[str, str]
) -> None:
    a, b = pausing
    async with client_for(a) as on_a, client_for(b) as on_b:
        (first,) = await sent(on_a, message("pay"))
        task = first.task
        assert task.status.state == pb.TASK_STATE_INPUT_REQUIRED, task.status
        assert "echo" in task.status.message.parts[0].text
        got = await on_b.get_task(pb.GetTaskRequest(id=task.id))
        assert got.status.state == pb.TASK_STATE_INPUT_REQUIRED

        answers: list[Any] = []

        async def answer(client: Any) -> None:
            try:
                answers.append(await sent(client, message("approve", task_id=task.id)))
            except InvalidParamsError as exc:
                answers.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(answer, on_a)
            nursery.start_soon(answer, on_b)
        refused = [x for x in answers if isinstance(x, InvalidParamsError)]
        (continued,) = [x for x in answers if not isinstance(x, InvalidParamsError)]
        assert len(refused) == 1, answers
        second = continued[0].task
        assert second.id == task.id and second.status.state == pb.TASK_STATE_INPUT_REQUIRED
        assert '"step 2"' in second.status.message.parts[0].text
        (third,) = await sent(on_a, message("deny", task_id=task.id))
        assert third.task.status.state == pb.TASK_STATE_COMPLETED, third.task.status
        assert third.task.artifacts[0].parts[0].text == "pay ok #1"
        assert [m.parts[0].text for m in third.task.history[:3]] == ["pay", "approve", "deny"]

        (other,) = await sent(on_b, message("pay"))
        assert other.task.status.state == pb.TASK_STATE_INPUT_REQUIRED
        cancelled = await on_a.cancel_task(pb.CancelTaskRequest(id=other.task.id))
        assert cancelled.status.state == pb.TASK_STATE_CANCELED
        with pytest.raises(InvalidParamsError, match="CANCELED"):
            await sent(on_b, message("approve", task_id=other.task.id))
    echoes = await stack.query(
        "SELECT count(*) FROM cantrip_journal WHERE gate = 'echo' AND record IS NOT NULL "
        "AND entity_id = %s",
        entity_id_for(task.context_id),
    )
    assert echoes == [(1,)], "the approved call ran once"


async def test_bad_input_at_a_replica_gets_the_protocols_errors(stack: Stack) -> None:
    a = stack.replicas[0]
    async with client_for(a) as client:
        with pytest.raises(InvalidParamsError, match="contextId"):
            await sent(client, message("x", context_id="ses_nope"))
        request = message("x")
        request.configuration.task_push_notification_config.url = "https://example.com/hook"
        with pytest.raises(PushNotificationNotSupportedError):
            await sent(client, request)
    async with httpx.AsyncClient(base_url=a, timeout=60) as http:
        codes = await fuzz(http, count=150)
        assert (await http.get("/health")).json()["ok"]
    assert {-32600, -32601, -32602} <= codes, codes
    made = await stack.query("SELECT count(*) FROM cantrip_a2a_tasks t WHERE NOT EXISTS "
                      "(SELECT 1 FROM cantrip_work w WHERE w.id = t.work_id)")  # fmt: skip
    assert made == [(0,)], "no task without its work item"


async def test_a2a_ids_that_are_not_text_at_a_replica_are_invalid_params(stack: Stack) -> None:
    count = "SELECT (SELECT count(*) FROM cantrip_work), (SELECT count(*) FROM cantrip_a2a_tasks)"
    before = await stack.query(count)
    async with httpx.AsyncClient(base_url=stack.replicas[0], timeout=60) as http:
        await refuses_ids_that_are_not_text(http)
    assert await stack.query(count) == before


async def test_the_token_guards_a_replicas_a2a(stack: Stack) -> None:
    base = stack.start_replica(token="s3cret")
    async with httpx.AsyncClient(base_url=base) as http:
        assert (await http.get("/.well-known/agent-card.json")).status_code == 401
        refused = await http.post("/a2a", json={"jsonrpc": "2.0", "id": 1, "method": "GetTask"})
        assert refused.status_code == 401
        bad = await http.post(
            "/a2a",
            content=b"{nope",
            headers={"authorization": "Bearer s3cret", "content-type": "application/json"},
        )
        assert bad.status_code == 200 and bad.json()["error"]["code"] == -32700


def test_a_task_row_is_written_in_its_prompts_transaction(pg_url: str) -> None:
    """SendMessage on ``--db`` queues the prompt and writes its task in one transaction
    (``DbSessions.enqueue``'s ``also``): a task exists exactly when its prompt does, so
    a replica dying between the two can no longer leave a prompt no task names. Here
    the task's write fails: the prompt is not queued either; then both are stored."""
    import psycopg

    from cantrip.loom._postgres import PostgresStore
    from cantrip.protocols.sessions._rows import DbSessions
    from cantrip.protocols.sessions._task_rows import TaskRows

    store = PostgresStore(pg_url)
    try:
        sessions, rows = DbSessions(store), TaskRows(store)
        session, _ = sessions.create(None)

        def failing(conn: Any, work_id: int) -> None:
            rows.add_on(conn, work_id, task_id="t1", entity_id=session.entity_id, message="{}")
            raise psycopg.errors.UniqueViolation("the replica died here")

        with pytest.raises(psycopg.errors.UniqueViolation):
            sessions.enqueue(session.entity_id, {}, "hello", None, also=failing)
        with psycopg.connect(pg_url) as conn:
            assert conn.execute("SELECT count(*) FROM cantrip_work").fetchone() == (0,)
            assert conn.execute("SELECT count(*) FROM cantrip_prompts").fetchone() == (0,)
            assert conn.execute("SELECT count(*) FROM cantrip_a2a_tasks").fetchone() == (0,)
        queued = sessions.enqueue(
            session.entity_id,
            {},
            "hello",
            None,
            also=lambda conn, work_id: rows.add_on(
                conn, work_id, task_id="t2", entity_id=session.entity_id, message="{}"
            ),
        )
        task = rows.get("t2")
        assert task is not None and queued.work_id in task
    finally:
        store.close()
