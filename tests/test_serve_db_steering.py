"""Steering and double-texting under ``cantrip serve --db`` (issue 32): replicas take the
message or the second prompt, the worker running the cast acts on it.

All real: a PostgreSQL server, the loopback OpenAI server of ``tests/serve_db_llm.py``
(it answers from the conversation: ``echo`` until a user message's third turn, then
``done`` with ``"<that message> ok #<user messages seen>"`` -- so a result says which
messages the model saw), two ``serve --db`` replicas and ``cantrip worker`` processes.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from pg_cluster import fresh_database
from test_serve_db import TURNS, Stack, _free_port, open_stack

pytestmark = pytest.mark.loop_watch

MESSAGE = "Use metric."
DELAY_S = 0.8
"""The LLM's latency per answer: a message sent as a turn lands in the loom reaches the
worker well before the next turn begins. (A worker commits a turn with the next one's
start at the latest, so "a turn landed" means the next turn's LLM call is out.)"""


@pytest.fixture(scope="module")
def stack(pg_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """PostgreSQL, the loopback LLM, two serve replicas and one worker, for this module."""
    url = fresh_database(pg_server, "serve_db_steering")
    root = tmp_path_factory.mktemp("serve-db-steering")
    (root / "held").mkdir()
    hold = {"SERVE_DB_LLM_HOLD_DIR": str(root / "held")}  # see tests/serve_db_llm.py
    with open_stack(url, root, delay_s=DELAY_S, **hold) as built:
        yield built


@contextlib.asynccontextmanager
async def _holding(stack: Stack, name: str) -> AsyncIterator[None]:
    """Waits until the cast whose prompt says ``hold:<name>`` is in its last turn, its
    model call held by the loopback LLM; the call is answered when the block is left."""
    folder = Path(stack.env["SERVE_DB_LLM_HOLD_DIR"])
    try:
        with trio.fail_after(60):
            while not (folder / f"{name}.held").exists():
                await trio.sleep(0.02)
        yield
    finally:
        (folder / f"{name}.release").touch()


def _client(base: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=base, timeout=60)


async def _new_session(http: httpx.AsyncClient) -> tuple[str, str]:
    sid = (await http.post("/sessions")).json()["session_id"]
    return sid, sid.replace("session-", "entity-")


async def _turns_landed(stack: Stack, entity: str, count: int) -> None:
    """Wait until the entity has ``count`` turns in the loom."""
    with trio.fail_after(60):
        while (
            len(await stack.query("SELECT 1 FROM cantrip_turns WHERE entity_id = %s", entity))
            < count
        ):
            await trio.sleep(0.02)


async def _in_background(
    nursery: trio.Nursery, http: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> list[httpx.Response]:
    out: list[httpx.Response] = []

    async def run() -> None:
        out.append(await http.post(path, json=body))

    nursery.start_soon(run)
    return out


async def _replace_worker_once(stack: Stack, entity: str, turn_where: str) -> None:
    """Once a turn of ``entity`` matching ``turn_where`` is recorded, SIGKILL the one
    running worker and start another (which takes the cast over). The new one holds 10 s
    leases: the tests count the kill as the cast's one crash, and on a loaded machine a
    live worker's 1 s lease can run out (a second crash, by design)."""
    with trio.fail_after(60):
        while not await stack.query(
            f"SELECT 1 FROM cantrip_turns WHERE entity_id = %s AND {turn_where}", entity
        ):
            await trio.sleep(0.02)
    (victim,) = [w for w in stack.workers if w.poll() is None]
    victim.kill()
    await trio.to_thread.run_sync(victim.wait)
    await trio.to_thread.run_sync(stack.start_worker, "--lease", "10")


def _steered(thread: list[dict[str, Any]]) -> list[str]:
    """Every steering message the thread's turns recorded, in order."""
    return [m for t in thread for m in t.get("extras", {}).get("steering", [])]


# -- a message joins the running cast ---------------------------------------------------


async def test_a_message_sent_to_one_replica_joins_the_cast_a_worker_runs(stack: Stack) -> None:
    a, b = stack.replicas
    async with _client(a) as on_a, _client(b) as on_b:
        sid, entity = await _new_session(on_a)
        idle = await on_b.post(f"/sessions/{sid}/messages", json={"text": "anyone?"})
        assert idle.status_code == 409, idle.text
        assert idle.json()["error"]["code"] == "not_running"
        async with trio.open_nursery() as nursery:
            first = await _in_background(
                nursery, on_a, f"/sessions/{sid}/prompt", {"prompt": "Do the work."}
            )
            await _turns_landed(stack, entity, 1)
            sent = await on_b.post(f"/sessions/{sid}/messages", json={"text": MESSAGE})
            assert sent.status_code == 202, sent.text
            assert sent.json() == {"accepted": True, "joins": "next_turn"}
        result = first[0].json()
        # the model saw it as the latest user message of the conversation
        assert result["result"] == f"{MESSAGE} ok #2", result
        assert result["terminated"] and "undelivered" not in result
        thread = (await on_a.get(f"/sessions/{sid}/thread")).json()["turns"]
        assert _steered(thread) == [MESSAGE]
        (joined,) = [t for t in thread if t.get("extras", {}).get("steering")]
        assert joined["sequence"] > 1 and joined["intent"] is None  # inside the cast
        assert [t["sequence"] for t in thread] == list(range(1, len(thread) + 1))
        # once it ended, nothing runs to take a message
        late = await on_a.post(f"/sessions/{sid}/messages", json={"text": "after"})
        assert late.status_code == 409 and late.json()["error"]["code"] == "not_running"
        blank = await on_a.post(f"/sessions/{sid}/messages", json={"text": "\x1c "})
        assert blank.status_code == 400 and blank.json()["error"]["code"] == "bad_request"
        unknown = await on_a.post("/sessions/session-0000/messages", json={"text": "x"})
        assert unknown.status_code == 404
    assert await stack.query("SELECT text FROM cantrip_messages WHERE entity_id = %s", entity) == [
        (MESSAGE,)
    ]


async def test_a_message_that_arrives_during_the_last_turn_comes_back_undelivered(
    stack: Stack,
) -> None:
    """Sent while the last turn's model call is out (held there until it is accepted),
    the message has no next turn to join: the prompt's result gives it back. (One sent
    once the cast has ended is refused: the first test of this module.)"""
    a, b = stack.replicas
    async with _client(a) as on_a, _client(b) as on_b:
        sid, _ = await _new_session(on_a)
        async with trio.open_nursery() as nursery:
            first = await _in_background(
                nursery, on_a, f"/sessions/{sid}/prompt", {"prompt": "Finish. hold:last_turn"}
            )
            async with _holding(stack, "last_turn"):
                sent = await on_b.post(f"/sessions/{sid}/messages", json={"text": "too late"})
        result = first[0].json()
        thread = (await on_b.get(f"/sessions/{sid}/thread")).json()["turns"]
    assert sent.status_code == 202, sent.text
    assert result["result"] == "Finish. hold:last_turn ok #1", result
    assert result["turns"] == TURNS
    assert result["undelivered"] == ["too late"]
    assert _steered(thread) == []


async def test_messages_racing_a_cast_to_its_end_each_land_once_or_come_back(
    stack: Stack,
) -> None:
    """Two clients send messages at two replicas as fast as they are answered, from the
    prompt's start until both are refused: every accepted message joins exactly one turn
    or is reported undelivered, in the order accepted; refused ones are nowhere; the
    thread has every turn once; and the session goes on to its next prompt."""
    a, b = stack.replicas
    async with _client(a) as on_a, _client(b) as on_b:
        sid, entity = await _new_session(on_a)
        accepted: list[str] = []
        refused: list[str] = []

        async def hammer(http: httpx.AsyncClient, name: str) -> None:
            await _turns_landed(stack, entity, 1)
            for i in range(400):
                text = f"{name}{i}"
                response = await http.post(f"/sessions/{sid}/messages", json={"text": text})
                if response.status_code in (409, 429):  # ended, or took all it takes
                    refused.append(text)
                    return
                assert response.status_code == 202, response.text
                accepted.append(text)
                await trio.sleep(0.15)

        async with trio.open_nursery() as nursery:
            first = await _in_background(
                nursery, on_a, f"/sessions/{sid}/prompt", {"prompt": "Race."}
            )
            nursery.start_soon(hammer, on_a, "a")
            nursery.start_soon(hammer, on_b, "b")
        result = first[0].json()
        thread = (await on_b.get(f"/sessions/{sid}/thread")).json()["turns"]
        joined = _steered(thread)
        undelivered = result.get("undelivered", [])
        assert joined + undelivered == sorted(accepted, key=await _order(stack, entity)), result
        assert len(joined) >= 1 and not set(refused) & set(joined + undelivered)
        assert [t["sequence"] for t in thread] == list(range(1, len(thread) + 1))
        assert result["turns"] == len(thread)
        after = (await on_a.post(f"/sessions/{sid}/prompt", json={"prompt": "Next."})).json()
        assert after["terminated"] and after["result"].startswith("Next. ok #")
        assert "undelivered" not in after  # a message never outlives its cast


async def _order(stack: Stack, entity: str) -> Any:
    """Sort key: the order the database accepted the messages in."""
    rows = await stack.query(
        "SELECT text FROM cantrip_messages WHERE entity_id = %s ORDER BY id", entity
    )
    rank = {text: i for i, (text,) in enumerate(rows)}
    return lambda text: rank[text]


async def test_a_cast_taken_over_after_steering_resumes_with_the_message_once(
    stack: Stack,
) -> None:
    a, b = stack.replicas
    async with _client(a) as on_a, _client(b) as on_b:
        sid, entity = await _new_session(on_a)
        async with trio.open_nursery() as nursery:
            first = await _in_background(
                nursery, on_a, f"/sessions/{sid}/prompt", {"prompt": "Survive."}
            )
            await _turns_landed(stack, entity, 1)
            assert (
                await on_b.post(f"/sessions/{sid}/messages", json={"text": MESSAGE})
            ).status_code == 202
            # the message is recorded in a turn: now kill
            await _replace_worker_once(stack, entity, "data::jsonb->'extras' ? 'steering'")
        result = first[0].json()
        thread = (await on_b.get(f"/sessions/{sid}/thread")).json()["turns"]
    assert result["result"] == f"{MESSAGE} ok #2", result
    assert "undelivered" not in result
    assert _steered(thread) == [MESSAGE]  # handed to the new worker's cast? not again
    assert [t["sequence"] for t in thread] == list(range(1, len(thread) + 1))
    ((attempts, crashes, state),) = await stack.query(
        "SELECT attempts, crashes, state FROM cantrip_work WHERE entity_id = %s", entity
    )
    assert (attempts, crashes, state) == (1, 1, "done")  # taken over, at no attempt


# -- double-texting --------------------------------------------------------------------


async def _stream(http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> list[Any]:
    events: list[tuple[str, dict[str, Any]]] = []
    async with http.stream("POST", path, json=body) as response:
        assert response.status_code == 200, await response.aread()
        name = None
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: ") and name is not None:
                events.append((name, json.loads(line[6:])))
    return events


@pytest.mark.parametrize("policy", ["enqueue", "interrupt", "rollback"])
async def test_a_second_prompt_while_one_runs_follows_on_busy(stack: Stack, policy: str) -> None:
    """The first prompt runs at the worker (held in its last turn until the second has
    been queued, or has cut it off); a second at the other replica, streamed, with
    ``?on_busy=``. What the model saw, the thread and the loom say what happened."""
    a, b = stack.replicas
    name = f"second_prompt_{policy}"
    first_task = f"First task. hold:{name}"
    async with _client(a) as on_a, _client(b) as on_b:
        sid, entity = await _new_session(on_a)
        zero = (await on_a.post(f"/sessions/{sid}/prompt", json={"prompt": "Zero."})).json()
        assert zero["result"] == "Zero. ok #1"
        streamed_events: list[list[Any]] = []

        async def second() -> None:
            path = f"/sessions/{sid}/prompt?on_busy={policy}&stream=1"
            streamed_events.append(await _stream(on_b, path, {"prompt": "Second task."}))

        async with trio.open_nursery() as nursery:
            first = await _in_background(
                nursery, on_a, f"/sessions/{sid}/prompt", {"prompt": first_task}
            )
            async with _holding(stack, name):
                refused = await on_b.post(f"/sessions/{sid}/prompt", json={"prompt": "No."})
                assert refused.status_code == 409  # the server's default: reject
                assert refused.json()["error"]["code"] == "busy"
                nursery.start_soon(second)
                if policy == "enqueue":  # the first answers once the second is queued
                    await _work_items(stack, entity, 3)
                else:  # it cuts the first one off
                    await _answered(first)
        events = streamed_events[0]
        a_result = first[0].json()
        b_result = events[-1][1]
        assert events[-1][0] == "result" and b_result["terminated"], events
        thread = (await on_a.get(f"/sessions/{sid}/thread")).json()["turns"]
        intents = [t["intent"] for t in thread if t["intent"]]
        streamed = [e["turn_id"] for name, e in events if name == "step_complete"]
        # its own turns only, in its result and its stream (it began after the first)
        assert b_result["turns"] == TURNS
        assert streamed == [t["id"] for t in thread[-TURNS:]]
        assert thread[-TURNS]["intent"] == "Second task."
        loom = await stack.query(
            "SELECT data::json->>'intent', data::json->>'reason' FROM cantrip_turns "
            "WHERE entity_id = %s ORDER BY pos",
            entity,
        )
    if policy == "enqueue":  # it waited for the first, then saw all three prompts
        assert a_result["terminated"] and a_result["result"] == f"{first_task} ok #2"
        assert b_result["result"] == "Second task. ok #3"
        assert intents == ["Zero.", first_task, "Second task."]
        return
    assert a_result["truncated"] and a_result["reason"] == "interrupted", a_result
    assert a_result["stop_reason"] == "cancelled"
    assert [r for _, r in loom].count("interrupted") == 1  # the cut-off turn, recorded
    if policy == "interrupt":  # the second prompt sees the cut-off first one
        assert b_result["result"] == "Second task. ok #3"
        assert intents == ["Zero.", first_task, "Second task."]
        assert any(t["reason"] == "interrupted" for t in thread)
    else:  # rollback: from before the first; its turns stay in the loom as a branch
        assert b_result["result"] == "Second task. ok #2"
        assert intents == ["Zero.", "Second task."]
        assert not any(t["reason"] == "interrupted" for t in thread)
        assert first_task in [i for i, _ in loom]  # the branch is kept
        second = next(t for t in thread if t["intent"] == "Second task.")
        assert second["parent_id"] == thread[TURNS - 1]["id"]  # continues from Zero's end
        ids = [t["id"] for t in thread]
        assert len(ids) == len(set(ids)) and len(loom) > len(thread)


async def test_a_rolled_back_cast_whose_worker_dies_is_resumed_from_its_branch(
    stack: Stack,
) -> None:
    a, b = stack.replicas
    async with _client(a) as on_a, _client(b) as on_b:
        sid, entity = await _new_session(on_a)
        assert (await on_a.post(f"/sessions/{sid}/prompt", json={"prompt": "Zero."})).json()[
            "result"
        ] == "Zero. ok #1"
        async with trio.open_nursery() as nursery:
            first = await _in_background(
                nursery, on_a, f"/sessions/{sid}/prompt", {"prompt": "First task."}
            )
            await _turns_landed(stack, entity, TURNS + 1)
            second = await _in_background(
                nursery, on_b, f"/sessions/{sid}/prompt?on_busy=rollback",
                {"prompt": "Second task."},
            )  # fmt: skip
            # the second cast took a turn: kill its worker
            await _replace_worker_once(stack, entity, "data::json->>'intent' = 'Second task.'")
        assert first[0].json()["reason"] == "interrupted"
        result = second[0].json()
        thread = (await on_b.get(f"/sessions/{sid}/thread")).json()["turns"]
    assert result["result"] == "Second task. ok #2", result
    assert result["turns"] == TURNS
    assert [t["intent"] for t in thread if t["intent"]] == ["Zero.", "Second task."]
    assert len(thread) == 2 * TURNS  # no turn lost, none twice
    (state, crashes, outcome) = (
        await stack.query(
            "SELECT state, crashes, result FROM cantrip_work WHERE entity_id = %s ORDER BY id",
            entity,
        )
    )[-1]
    assert (state, crashes) == ("done", 1)  # taken over mid-cast
    # what the worker recorded (``cast --db`` reports it) counts the cast's own turns,
    # not the thread before its rewind point
    assert json.loads(outcome)["turns"] == TURNS


@contextlib.contextmanager
def _serving(stack: Stack, *options: str) -> Iterator[str]:
    """One more ``serve --db`` replica, started with ``options``, until the block ends."""
    port = _free_port()
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "cantrip", "serve", str(stack.spec), "--db", stack.url),
            *("--port", str(port), "--grace-s", "1", *options),
        ],
        env=stack.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.1)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.parametrize("policy", ["reject", "enqueue", "interrupt", "rollback"])
def test_serve_db_takes_every_on_busy_policy_at_start(stack: Stack, policy: str) -> None:
    """``serve --db --on-busy <policy>`` starts (``enqueue`` was refused) and applies
    the policy to a prompt that does not say otherwise, sent while the first one runs
    (held in its last turn until the second was answered or queued)."""
    name = f"on_busy_{policy}"

    async def both(base: str) -> tuple[dict[str, Any], httpx.Response]:
        async with _client(base) as http:
            sid, entity = await _new_session(http)
            async with trio.open_nursery() as nursery:
                one = await _in_background(
                    nursery, http, f"/sessions/{sid}/prompt", {"prompt": f"One. hold:{name}"}
                )
                async with _holding(stack, name):
                    two = await _in_background(
                        nursery, http, f"/sessions/{sid}/prompt", {"prompt": "Two."}
                    )
                    if policy == "enqueue":  # the first answers once the second is queued
                        await _work_items(stack, entity, 2)
                    else:  # refused, or it has cut the first one off
                        await _answered(one if policy != "reject" else two)
            return one[0].json(), two[0]

    with _serving(stack, "--on-busy", policy) as base:
        one, two = trio.run(both, base)
    if policy == "reject":
        assert two.status_code == 409 and two.json()["error"]["code"] == "busy", two.text
        assert one["result"] == f"One. hold:{name} ok #1", one
        return
    answer = two.json()
    if policy == "enqueue":  # it waited for the first, then saw both prompts
        assert one["result"] == f"One. hold:{name} ok #1", one
        assert answer["result"] == "Two. ok #2", answer
        return
    assert one["truncated"] and one["reason"] == "interrupted", one
    if policy == "interrupt":  # the second sees the cut-off first one
        assert answer["result"] == "Two. ok #2", answer
    else:  # rollback: from before the first
        assert answer["result"] == "Two. ok #1", answer


async def _work_items(stack: Stack, entity: str, count: int) -> None:
    """Wait until the entity has ``count`` prompts queued or run."""
    with trio.fail_after(60):
        while (
            len(await stack.query("SELECT 1 FROM cantrip_work WHERE entity_id = %s", entity))
            < count
        ):
            await trio.sleep(0.02)


async def _answered(responses: list[httpx.Response]) -> None:
    """Wait until a background request has its response."""
    with trio.fail_after(60):
        while not responses:
            await trio.sleep(0.02)


# -- the schema and the queue underneath ----------------------------------------------------


def test_a_version_3_database_is_brought_to_version_4_in_place(pg_url: str) -> None:
    """A database made before steering (no ``cantrip_messages``, no ``base_pos`` or
    ``cancel_reason`` on ``cantrip_work``) gains them when a store opens it; its work
    stays."""
    import psycopg

    from cantrip.distributed._queue import WorkQueue
    from cantrip.loom._postgres import PostgresStore
    from cantrip.loom._postgres_schema import SCHEMA_VERSION

    store = PostgresStore(pg_url, max_connections=2)
    WorkQueue(store).enqueue({"factory": "m:f"}, "kept", "entity-old")
    store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:  # back to what v3 made
        conn.execute(
            "ALTER TABLE cantrip_work DROP COLUMN base_pos, DROP COLUMN cancel_reason; "
            "DROP TABLE cantrip_messages; DELETE FROM cantrip_schema; "
            "INSERT INTO cantrip_schema (version) VALUES (3)"
        )
    store = PostgresStore(pg_url, max_connections=2)
    try:
        claim = WorkQueue(store).claim("worker-1", 30)
        assert claim is not None and claim.intent == "kept"
    finally:
        store.close()
    with psycopg.connect(pg_url) as conn:
        version = conn.execute("SELECT max(version) FROM cantrip_schema").fetchone()
        assert version == (SCHEMA_VERSION,)  # and on, to the latest
        assert conn.execute("SELECT base_pos FROM cantrip_work").fetchall() == [(0,)]
        assert conn.execute("SELECT count(*) FROM cantrip_messages").fetchone() == (0,)


def test_an_interrupt_reaches_a_worker_that_missed_its_notification(pg_url: str) -> None:
    """The heartbeat -- the fallback of NOTIFY cantrip_cancel -- says why a cancel was
    asked for, so the cut is recorded ``interrupted`` either way."""
    from cantrip.distributed._queue import WorkQueue, heartbeat_on
    from cantrip.distributed._work import cancel_on
    from cantrip.loom._postgres import PostgresStore

    store = PostgresStore(pg_url, max_connections=2)
    try:
        queue = WorkQueue(store)
        running = queue.enqueue({"factory": "m:f"}, "first", "entity-a")
        queue.enqueue({"factory": "m:f"}, "second", "entity-a")
        claim = queue.claim("worker-1", 30)
        assert claim is not None and claim.work_id == running
        with store.pool.connection() as conn:
            assert heartbeat_on(conn, "worker-1", [claim.fence], 30) == {"entity-a": ""}
            with conn.transaction():
                cancel_on(conn, "entity-a", work_id=running, reason="interrupted")
            assert heartbeat_on(conn, "worker-1", [claim.fence], 30) == {"entity-a": "interrupted"}
            states = conn.execute(
                "SELECT intent, state, cancel_requested FROM cantrip_work ORDER BY id"
            ).fetchall()
        assert states == [("first", "running", True), ("second", "queued", False)]
        assert queue.heartbeat(claim.fence, 30) == (True, True)
    finally:
        store.close()


# -- issue 39.13: what one cast takes is bounded, across replicas --------------------------


async def test_one_cast_takes_a_bounded_number_and_size_of_messages_across_replicas(
    stack: Stack,
) -> None:
    """The bound of ``cantrip.protocols.sessions._steering``, kept by the database: messages sent
    to one cast through two replicas at once never exceed it (the count is taken under
    the work row's lock, with the insert), and only what was accepted is stored."""
    from test_steering import overfill_steering

    a, b = stack.replicas
    async with _client(a) as on_a, _client(b) as on_b:
        sid, entity = await _new_session(on_a)
        async with trio.open_nursery() as nursery:
            # "forever": the LLM answers ten times slower, so the cast outlives the test
            first = await _in_background(
                nursery, on_a, f"/sessions/{sid}/prompt", {"prompt": "Work forever."}
            )
            with trio.fail_after(60):  # the prompt is open work: a message finds it
                open_work = "SELECT 1 FROM cantrip_work WHERE entity_id = %s AND state = 'running'"
                while not await stack.query(open_work, entity):
                    await trio.sleep(0.02)
            accepted = await overfill_steering([on_a, on_b], sid)
            stored = await stack.query(
                "SELECT text FROM cantrip_messages WHERE entity_id = %s", entity
            )
            assert (await on_b.post(f"/sessions/{sid}/cancel")).json()["cancelled"] is True
        assert first[0].status_code == 200, first[0].text
    assert sorted(text for (text,) in stored) == sorted(accepted)


async def test_a_prompt_beyond_max_running_at_a_replica_is_refused_before_it_queues(
    stack: Stack,
) -> None:
    """One admission for both modes (drift 11), as in process
    (``tests/test_http_load.py::test_a_prompt_beyond_max_running_is_refused_before_it_queues``):
    with ``--max-running 1`` a replica waiting on one prompt refuses the next -- here one
    that would wait its turn on the same session -- 503 ``overloaded`` with
    ``Retry-After``, before anything is queued."""
    base = await trio.to_thread.run_sync(
        lambda: stack.start_replica(options=("--max-running", "1"))
    )
    async with _client(base) as http, trio.open_nursery() as nursery:
        sid, entity = await _new_session(http)
        first = await _in_background(nursery, http, f"/sessions/{sid}/prompt",
                                     {"prompt": "hold:capped first"})  # fmt: skip
        async with _holding(stack, "capped"):
            refused = await http.post(
                f"/sessions/{sid}/prompt?on_busy=enqueue", json={"prompt": "second"}
            )
    assert refused.status_code == 503 and "retry-after" in refused.headers
    assert refused.json()["error"]["code"] == "overloaded"
    assert first[0].status_code == 200, first[0].text
    assert len(await stack.query("SELECT id FROM cantrip_work WHERE entity_id = %s", entity)) == 1
