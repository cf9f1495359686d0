"""AG-UI on ``cantrip serve --db`` (issue 33, item 1): ``POST /agui`` at a replica,
the cast run by a worker, its turns told as AG-UI events read back from the loom.

Everything is real and started here: PostgreSQL, the loopback OpenAI server that
answers from the conversation (tests/serve_db_llm.py, with a line of text and of
reasoning per answer), two replicas that require a token and one worker. Every
stream is parsed by the ``ag-ui-protocol`` models and checked by ``ag-ui-validate``;
the official JavaScript client and the validator's CLI run against a live replica.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import test_agui as in_process
import trio
from ag_ui_validate.pytest_plugin import assert_valid_agui
from pg_cluster import fresh_database
from test_agui import BAD_BODIES, fuzz_runs, types
from test_agui_client import TOKEN, js_client, kinds, validate_live
from test_mcp_server import _toml
from test_serve_db import Stack, open_stack

from cantrip.cli._spec_file import load_cantrip
from cantrip.loom._indexed import TURN_ROW
from cantrip.loom._model import Turn, with_columns

pytestmark = pytest.mark.loop_watch  # nothing here may block the trio loop

AUTH = {"authorization": f"Bearer {TOKEN}"}
SECRET = "sk-proj-" + "Z9y8X7w6" * 5


@pytest.fixture(scope="module")
def stack(pg_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Two replicas with a token (one serving a spec whose ``echo`` needs approval)
    and one worker on a fresh database; the LLM says text and reasoning each turn."""
    url = fresh_database(pg_server, "agui_db")
    root = tmp_path_factory.mktemp("agui-db")
    (root / "holds").mkdir()
    with open_stack(
        url,
        root,
        replicas=0,
        delay_s=0.1,
        SERVE_DB_LLM_CHATTY="1",
        OPENAI_API_KEY=SECRET,
        SERVE_DB_LLM_HOLD_DIR=str(root / "holds"),
    ) as built:
        built.start_replica(token=TOKEN)
        built.start_replica(token=TOKEN)
        approving = built.spec.with_name("approving.toml")
        text = built.spec.read_text().replace("wards = [", 'approve = ["echo"]\nwards = [', 1)
        approving.write_text(text)
        built.start_replica(approving, token=TOKEN)
        asking = built.spec.with_name("asking.toml")
        asking.write_text(built.spec.read_text().replace('"echo"]', '"echo", "ask_user"]', 1))
        built.start_replica(asking, token=TOKEN)
        yield built


def run_input(thread: str, text: str | None = "hello", **more: Any) -> dict[str, Any]:
    messages = [] if text is None else [{"id": "u1", "role": "user", "content": text}]
    return {
        "threadId": thread,
        "runId": "run-" + uuid.uuid4().hex[:8],
        "messages": messages,
        "state": {},
        "tools": [],
        "context": [],
        "forwardedProps": {},
        **more,
    }


async def agui(
    base: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[httpx.Response, list[dict[str, Any]]]:
    """A run at a replica (its token sent), its events checked by the validator."""
    return await in_process.agui(base, body, {**AUTH, **(headers or {})}, timeout=60)


def last_state(events: list[dict[str, Any]]) -> dict[str, Any]:
    return dict([e for e in events if e["type"] == "STATE_SNAPSHOT"][-1]["snapshot"])


def joined(events: list[dict[str, Any]], kind: str) -> str:
    return "".join(e["delta"] for e in events if e["type"] == kind)


async def test_a_run_at_a_replica_tells_the_workers_turns_as_agui_events(stack: Stack) -> None:
    a, *_ = stack.replicas
    answer, events = await agui(a, run_input("db-weather", "weather", state={"mine": 1}))
    assert answer.status_code == 200, answer.text
    kinds_ = types(events)
    assert kinds_[:2] == ["RUN_STARTED", "STATE_SNAPSHOT"] and kinds_[-1] == "RUN_FINISHED"
    assert events[0]["protocolVersion"] == "1.0"
    assert events[-1]["result"] == "weather ok #1"
    # a text message and a reasoning message per turn (the worker's whole answers), and
    # the final answer (done's) as a message of its own
    said = "".join(f"Step {n}: weather" for n in (1, 2, 3))
    assert joined(events, "TEXT_MESSAGE_CONTENT") == said + "weather ok #1"
    assert joined(events, "REASONING_MESSAGE_CONTENT") == said
    calls = {e["toolCallId"]: e["toolCallName"] for e in events if e["type"] == "TOOL_CALL_START"}
    echoes = [i for i, name in calls.items() if name == "echo"]
    assert len(echoes) == 2
    args = [
        json.loads(
            "".join(
                e["delta"]
                for e in events
                if e.get("toolCallId") == i and e["type"] == "TOOL_CALL_ARGS"
            )
        )
        for i in echoes
    ]
    assert args == [{"text": "step 1"}, {"text": "step 2"}]
    results = {e["toolCallId"]: e["content"] for e in events if e["type"] == "TOOL_CALL_RESULT"}
    assert [results[i] for i in echoes] == ["step 1", "step 2"]
    assert [e["stepName"] for e in events if e["type"] == "STEP_FINISHED"] == [
        "turn-1",
        "turn-2",
        "turn-3",
    ]
    deltas = [e["delta"] for e in events if e["type"] == "STATE_DELTA"]
    assert deltas == [[{"op": "replace", "path": "/cantrip/turns", "value": n}] for n in (1, 2, 3)]
    state = last_state(events)
    assert state["mine"] == 1 and state["cantrip"]["turns"] == 3
    assert state["cantrip"]["reason"] == "done"
    assert state["cantrip"]["session_id"].startswith("session-")
    messages = next(e for e in events if e["type"] == "MESSAGES_SNAPSHOT")["messages"]
    assert [m["role"] for m in messages][:4] == ["user", "reasoning", "assistant", "tool"]
    (usage,) = events[-1]["usage"]
    assert usage["totalTokens"] > 0


async def test_a_thread_is_one_session_whichever_replica_runs_it(stack: Stack) -> None:
    a, b, *_ = stack.replicas
    _, one = await agui(a, run_input("db-thread", "first"))
    _, two = await agui(b, run_input("db-thread", "second"))
    assert one[-1]["result"] == "first ok #1" and two[-1]["result"] == "second ok #2"
    sid = last_state(one)["cantrip"]["session_id"]
    assert last_state(two)["cantrip"]["session_id"] == sid
    assert two[1]["snapshot"]["cantrip"]["turns"] == 3  # the run starts where the last ended
    users = [
        m["content"]
        for m in next(e for e in two if e["type"] == "MESSAGES_SNAPSHOT")["messages"]
        if m["role"] == "user"
    ]
    assert users == ["first", "second"]
    async with httpx.AsyncClient(base_url=b, headers=AUTH) as http:
        session = (await http.get(f"/sessions/{sid}")).json()
    assert session["turns"] == 6 and session["running"] is False


async def test_an_approval_interrupt_at_one_replica_is_resumed_at_another_once(
    stack: Stack,
) -> None:
    a, b, approving, _ = stack.replicas
    _, paused = await agui(approving, run_input("db-approve", "pay"))
    outcome = paused[-1]["outcome"]
    assert outcome["type"] == "interrupt", paused[-1]
    (interrupt,) = outcome["interrupts"]
    assert interrupt["reason"] == "approval" and interrupt["metadata"] == {
        "gate": "echo",
        "args": {"text": "step 1"},
    }
    waiting = interrupt["toolCallId"]
    assert waiting in {e["toolCallId"] for e in paused if e["type"] == "TOOL_CALL_START"}
    assert all(e["toolCallId"] != waiting for e in paused if e["type"] == "TOOL_CALL_RESULT")
    resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": True}]
    # answered at another replica (any replica serves any session)
    _, resumed = await agui(a, run_input("db-approve", None, resume=resume))
    _, twice = await agui(b, run_input("db-approve", None, resume=resume))
    denied_first = [{"interruptId": interrupt["id"], "status": "resolved", "payload": False}]
    _, other = await agui(a, run_input("db-approve", None, resume=denied_first))
    results = [e for e in resumed if e["type"] == "TOOL_CALL_RESULT"]
    assert results[0]["toolCallId"] == interrupt["toolCallId"] and results[0]["content"] == "step 1"
    assert resumed[-1]["outcome"]["type"] == "interrupt"  # step 2 asks again
    (second,) = resumed[-1]["outcome"]["interrupts"]
    assert second["metadata"]["args"] == {"text": "step 2"}
    # the same resume sent again (at another replica) follows the continuation it
    # started: told again, the same events; another answer to it is refused
    assert [e["type"] for e in twice] == [e["type"] for e in resumed]
    assert twice[-1]["outcome"] == resumed[-1]["outcome"]
    assert other[-1]["type"] == "RUN_ERROR" and other[-1]["code"] == "bad_resume"
    denied = [{"interruptId": second["id"], "status": "cancelled"}]
    _, finished = await agui(b, run_input("db-approve", None, resume=denied))
    assert finished[-1]["type"] == "RUN_FINISHED" and finished[-1]["result"] == "pay ok #1"
    texts = [e["content"] for e in finished if e["type"] == "TOOL_CALL_RESULT"]
    assert texts[0] == "denied by the user: cancelled by the user"
    entity = last_state(finished)["cantrip"]["entity_id"]
    ran = await stack.query(
        "SELECT count(*) FROM cantrip_journal WHERE entity_id = %s AND gate = 'echo' "
        "AND record IS NOT NULL",
        entity,
    )
    assert ran == [(1,)], "the approved echo ran once, the denied one never"


async def test_a_repeated_run_id_at_another_replica_replays_and_queues_nothing(
    stack: Stack,
) -> None:
    a, b, *_ = stack.replicas
    body = run_input("db-again", "again")
    _, first = await agui(a, body)
    _, replayed = await agui(b, body)
    assert first[-1]["result"] == replayed[-1]["result"] == "again ok #1"
    assert joined(first, "TEXT_MESSAGE_CONTENT") == joined(replayed, "TEXT_MESSAGE_CONTENT")
    entity = last_state(first)["cantrip"]["entity_id"]
    assert await stack.query("SELECT count(*) FROM cantrip_work WHERE entity_id = %s", entity) == [
        (1,)
    ]
    _, other = await agui(b, {**body, "messages": [{"id": "x", "role": "user", "content": "no"}]})
    assert other[-1]["type"] == "RUN_ERROR" and other[-1]["code"] == "key_reused"


async def test_a_client_that_hangs_up_cancels_the_work_item(stack: Stack) -> None:
    a, *_ = stack.replicas
    seen: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=a, timeout=60, headers=AUTH) as http:
        with trio.fail_after(60):
            async with http.stream("POST", "/agui", json=run_input("db-gone", "forever")) as s:
                async for line in s.aiter_lines():
                    if line.startswith("data: "):
                        seen.append(json.loads(line[6:]))
                        if seen[-1]["type"] == "STEP_FINISHED":
                            break  # the first turn landed: hang up mid-cast
        entity = seen[1]["snapshot"]["cantrip"]["entity_id"]
        sid = seen[1]["snapshot"]["cantrip"]["session_id"]
        with trio.fail_after(30):
            while True:
                (state,) = await stack.query(
                    "SELECT state FROM cantrip_work WHERE entity_id = %s", entity
                )
                if state[0] not in ("queued", "running"):
                    break
                await trio.sleep(0.1)
        thread = (await http.get(f"/sessions/{sid}/thread")).json()["turns"]
    assert state[0] == "cancelled"
    assert thread[-1]["reason"] == "cancelled"


async def test_a_cancel_through_the_api_finishes_the_run_as_cancelled(stack: Stack) -> None:
    a, b, *_ = stack.replicas
    got: list[Any] = []
    async with trio.open_nursery() as nursery, httpx.AsyncClient(base_url=b, headers=AUTH) as http:

        async def run() -> None:
            got.extend(await agui(a, run_input("db-cancel", "forever")))

        nursery.start_soon(run)
        with trio.fail_after(30):
            while True:
                # running *and* a turn recorded: a worker runs the cast (``running``
                # alone is open work, which may still be queued under load -- a cancel
                # then ends the run before its cast begins, with no reason to tell)
                listed = (await http.get("/sessions")).json()["sessions"]
                mine = [s for s in listed if s["running"] and s["turns"] > 0]
                if mine:
                    break
                await trio.sleep(0.1)
        cancelled = await http.post(f"/sessions/{mine[0]['session_id']}/cancel", json={})
    assert cancelled.json()["cancelled"] is True and cancelled.json()["target"] == "running"
    events = got[1]
    assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"] == {"type": "cancelled"}
    assert last_state(events)["cantrip"]["reason"] == "cancelled"


async def test_the_guard_and_the_redactor_cover_agui_at_a_replica(stack: Stack) -> None:
    a, *_ = stack.replicas
    async with httpx.AsyncClient(base_url=a) as http:
        no_token = await http.post("/agui", json=run_input("db-guard", "x"))
        foreign = await http.post(
            "/agui",
            json=run_input("db-guard", "x"),
            headers={**AUTH, "origin": "https://evil.example"},
        )
    assert no_token.status_code == 401 and foreign.status_code == 403
    answer, events = await agui(a, run_input("db-secret", f"leak {SECRET}"))
    assert events[-1]["type"] == "RUN_FINISHED"
    assert SECRET not in answer.text
    assert "ok #1" in events[-1]["result"]


async def test_bad_input_at_a_replica_is_a_clear_400_and_queues_nothing(stack: Stack) -> None:
    a, *_ = stack.replicas
    before = await stack.query("SELECT count(*) FROM cantrip_work")
    async with httpx.AsyncClient(base_url=a, headers=AUTH) as http:
        for body in BAD_BODIES:
            answer = await http.post("/agui", json=body)
            assert answer.status_code == 400, (body, answer.text)
            error = answer.json()["error"]
            assert error["code"] == "bad_request" and error["message"], body
    assert await stack.query("SELECT count(*) FROM cantrip_work") == before


def test_random_bodies_at_a_replica_get_a_400_or_a_well_formed_run(stack: Stack) -> None:
    """Fuzz the replica's endpoint as the in-process one's: a 400 with a message, or a
    valid AG-UI stream ending in RUN_FINISHED or RUN_ERROR."""
    a, *_ = stack.replicas

    async def main() -> None:
        await fuzz_runs(functools.partial(agui, a), examples=25)

    trio.run(main)


# -- the official JavaScript client and the validator, against a live replica ------------


async def test_the_official_js_client_chats_with_a_replica(stack: Stack) -> None:
    a, *_ = stack.replicas
    report = await js_client(a, "chat")
    first, second = report["runs"]
    assert first["error"] is None and second["error"] is None, report["runs"]
    for kind in ("REASONING_START", "TEXT_MESSAGE_CONTENT", "TOOL_CALL_ARGS", "TOOL_CALL_RESULT",
                 "STATE_DELTA", "MESSAGES_SNAPSHOT"):  # fmt: skip
        assert kind in kinds(first), kind
    assert first["result"] == "weather in Oslo? ok #1"
    assert second["result"] == "and tomorrow? ok #2"
    roles = [m["role"] for m in report["messages"]]
    assert roles.count("user") == 2 and roles.count("tool") >= 4
    assert report["state"]["cantrip"]["turns"] == 6  # the patches and snapshots applied


async def test_the_official_js_client_answers_interrupts_at_a_replica(stack: Stack) -> None:
    _, _, approving, _ = stack.replicas
    report = await js_client(approving, "approve")
    runs = report["runs"]
    assert [r["finished"]["outcome"] for r in runs] == ["interrupt", "interrupt", "success"]
    assert runs[-1]["result"] == "launch it ok #1"
    assert report["pendingInterrupts"] == []


async def test_the_official_js_client_aborting_cancels_the_work(stack: Stack) -> None:
    a, *_ = stack.replicas
    report = await js_client(a, "abort")
    (run,) = report["runs"]
    assert "TOOL_CALL_START" in kinds(run) and "RUN_FINISHED" not in kinds(run)
    entity = run["events"][1]["snapshot"]["cantrip"]["entity_id"]
    with trio.fail_after(30):
        while True:
            (state,) = await stack.query(
                "SELECT state FROM cantrip_work WHERE entity_id = %s", entity
            )
            if state[0] not in ("queued", "running"):
                break
            await trio.sleep(0.1)
    assert state[0] == "cancelled"


async def test_the_conformance_validator_passes_a_live_replica(stack: Stack) -> None:
    a, *_ = stack.replicas
    await validate_live(f"{a}/agui")


LOCATION_TOOL = {
    "name": "get_location",
    "description": "Where the user is (the browser knows).",
    "parameters": {"type": "object", "properties": {"precision": {"type": "string"}}},
}


async def test_a_front_end_tool_is_called_at_the_client_and_its_result_observed(
    stack: Stack,
) -> None:
    """The run's tools travel with its work to the worker, which offers them; the call
    ends the run; the next run (at another replica) carries the result, which the
    continued cast observes (the worker offers the same tools to the continuation)."""
    a, b, *_ = stack.replicas
    body = run_input("db-front", "where", tools=[LOCATION_TOOL])
    _, called = await agui(a, body)
    (start,) = [e for e in called if e["type"] == "TOOL_CALL_START"]
    assert start["toolCallName"] == "get_location"
    assert called[-1]["type"] == "RUN_FINISHED"
    # success, with the call the client is to run (1.0's pendingToolCallIds)
    assert called[-1]["outcome"] == {
        "type": "success",
        "pendingToolCallIds": [e["toolCallId"] for e in called if e["type"] == "TOOL_CALL_START"],
    }
    assert "TOOL_CALL_RESULT" not in types(called)
    call_id = start["toolCallId"]
    messages = [
        *body["messages"],
        {
            "id": "a1",
            "role": "assistant",
            "toolCalls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "get_location", "arguments": "{}"},
                }
            ],
        },
        {"id": "t1", "role": "tool", "toolCallId": call_id, "content": "Oslo, Norway"},
    ]
    _, continued = await agui(b, {**run_input("db-front", None, tools=[LOCATION_TOOL]),
                                  "messages": messages})  # fmt: skip
    assert continued[-1]["result"] == "where ok #1 in Oslo, Norway"
    assert all(e.get("toolCallId") != call_id for e in continued)
    entity = last_state(continued)["cantrip"]["entity_id"]
    rows = await stack.query(f"SELECT {TURN_ROW} FROM cantrip_turns WHERE entity_id = %s", entity)
    (record,) = [  # read as the loom reads a row (the stored form keeps each piece once)
        c
        for row in rows
        for c in Turn.from_dict(with_columns(json.loads(row[0]), row)).gate_calls
        if c.gate == "get_location"
    ]
    assert record.result == "Oslo, Norway" and record.tool_call_id == call_id


async def test_the_official_js_client_runs_a_front_end_tool_at_a_replica(stack: Stack) -> None:
    a, *_ = stack.replicas
    report = await js_client(a, "tools")
    called, continued = report["runs"]
    assert called["error"] is None and continued["error"] is None, report["runs"]
    assert called["finished"]["outcome"] == "success"
    assert continued["result"] == "where am I? ok #1 in Oslo, Norway"


async def test_an_ask_user_question_is_an_interrupt_answered_with_text_at_a_replica(
    stack: Stack,
) -> None:
    a, *_, asking = stack.replicas
    _, paused = await agui(asking, run_input("db-ask", "paint"))
    (interrupt,) = paused[-1]["outcome"]["interrupts"]
    assert interrupt["reason"] == "question" and interrupt["message"] == "Which colour?"
    wrong = [{"interruptId": interrupt["id"], "status": "resolved", "payload": True}]
    _, refused = await agui(a, run_input("db-ask", None, resume=wrong))
    assert refused[-1]["type"] == "RUN_ERROR" and refused[-1]["code"] == "bad_resume"
    resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": "blue"}]
    _, answered = await agui(a, run_input("db-ask", None, resume=resume))
    assert answered[-1]["result"] == "paint ok #1 in blue"
    (result,) = [e for e in answered if e.get("toolCallId") == interrupt["toolCallId"]
                 and e["type"] == "TOOL_CALL_RESULT"]  # fmt: skip
    assert result["content"] == "blue"


# -- issue 39, items 9 and 10, at a replica ------------------------------------------------


async def test_deep_input_and_lone_surrogate_ids_at_a_replica_are_a_400_and_queue_nothing(
    stack: Stack,
) -> None:
    a, *_ = stack.replicas
    count = "SELECT (SELECT count(*) FROM cantrip_work), (SELECT count(*) FROM cantrip_entities)"
    before = await stack.query(count)
    await in_process.refuses_hostile_bodies(a, AUTH)
    assert await stack.query(count) == before, "no session made, no work queued"


async def test_a_fault_after_run_started_at_a_replica_ends_with_run_error_and_a_log_line(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The replica's app in this process (on the stack's database, beside its worker),
    with a fault injected into the one event mapping: the worker's first recorded turn
    cannot be told, and the run ends with RUN_ERROR and one log line."""
    from cantrip.distributed._spells import build_spell, spell_from_spec
    from cantrip.loom._loom import Loom
    from cantrip.protocols.http._serve import serve_http_db

    for name, value in stack.env.items():
        monkeypatch.setenv(name, value)
    queued = spell_from_spec(stack.spec)
    in_process.break_step_complete(monkeypatch)
    caplog.set_level("INFO", logger="cantrip.agui")
    async with trio.open_nursery() as nursery:
        (base,) = await nursery.start(
            lambda task_status: serve_http_db(
                queued,
                build_spell(queued, Loom()),
                stack.url,
                "127.0.0.1",
                0,
                task_status=task_status,
            )
        )
        answer, events = await in_process.agui(base, run_input("db-fault", "fault"), timeout=60)
        nursery.cancel_scope.cancel()
    assert answer.status_code == 200
    in_process.told_the_fault(events, caplog)


async def test_a_client_comes_back_at_another_replica_for_the_rest_of_its_run(
    stack: Stack,
) -> None:
    """A client reads part of a run at one replica and loses it; the same run sent to
    another replica with ``Last-Event-ID`` tells every event after that one and the
    end -- the replica reads the prompt's stream from the loom, the same events with
    the same ids -- and the worker cast once."""
    from test_agui_resume import rest, run_stream, take

    a, b, *_ = stack.replicas
    body = run_input("db-reconnect", "weather")
    async with (
        httpx.AsyncClient(base_url=a, timeout=60, headers=AUTH) as http,
        run_stream(http, body) as frames,
    ):
        whole = await rest(frames)  # the run unbroken, for comparison
    again = {**body, "runId": body["runId"] + "-b"}
    async with (
        httpx.AsyncClient(base_url=a, timeout=60, headers=AUTH) as http,
        run_stream(http, again) as frames,
    ):
        first = await take(frames, 5)
    async with (
        httpx.AsyncClient(base_url=b, timeout=60, headers=AUTH) as http,
        run_stream(http, again, last=first[-1][0]) as frames,
    ):
        later = await rest(frames)
    assert later[0][0] == 0 and later[0][1]["type"] == "RUN_STARTED"
    told = first + later[1:]
    assert [i for i, _ in told] == list(range(len(told)))
    events = [e for _, e in told]
    assert_valid_agui(events, max_warnings=0)
    assert [e["type"] for e in events] == [e["type"] for _, e in whole[: len(events)]]
    assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["result"].startswith("weather ok")
    entity = last_state(events)["cantrip"]["entity_id"]
    assert await stack.query("SELECT count(*) FROM cantrip_work WHERE entity_id = %s", entity) == [
        (2,)
    ]  # one work item per run: the reconnect queued nothing


# -- issue 44 leftovers: a hang-up's grace shared by the replicas ---------------------------


async def _until(check: Any, what: str, timeout: float = 60) -> Any:
    """Wait (polling) until ``check()`` is true-ish; its value."""
    with trio.fail_after(timeout):
        while True:
            got = await check()
            if got:
                return got
            await trio.sleep(0.05)


async def _hang_up_after_a_turn(base: str, body: dict[str, Any], reconnect_s: int) -> Any:
    """A run at ``base`` read until its first turn is told, then dropped: the frames."""
    from test_agui_resume import run_stream

    first = []
    async with (
        httpx.AsyncClient(base_url=base, timeout=60, headers=AUTH) as http,
        run_stream(http, body, reconnect_s=reconnect_s) as frames,
    ):
        async for frame in frames:
            first.append(frame)
            if frame[1]["type"] == "STEP_FINISHED":
                break
    return first


def _held(stack: Stack, name: str) -> Any:
    holds = Path(stack.env["SERVE_DB_LLM_HOLD_DIR"])

    async def check() -> bool:
        return (holds / f"{name}.held").exists()

    return check


def _release(stack: Stack, name: str) -> None:
    (Path(stack.env["SERVE_DB_LLM_HOLD_DIR"]) / f"{name}.release").touch()


async def _work(stack: Stack, entity: str) -> tuple[int, str]:
    ((work_id, state),) = await stack.query(
        "SELECT id, state FROM cantrip_work WHERE entity_id = %s ORDER BY id DESC LIMIT 1", entity
    )
    return int(work_id), str(state)


async def test_a_hang_up_grace_holds_for_a_client_back_at_another_replica(stack: Stack) -> None:
    """AGUI-7 across replicas: a client hangs up at A (``?reconnect_s=5``) and comes
    back at B during the cast (its final answer held by the model). A's grace ends
    while B follows the prompt; A reads that from the database and does not cancel:
    the cast goes on and B's run finishes it, told whole."""
    from test_agui_resume import rest, run_stream

    a, b, *_ = stack.replicas
    body = run_input("db-grace-back", "hold:graceback")
    first = await _hang_up_after_a_turn(a, body, reconnect_s=5)
    entity = first[1][1]["snapshot"]["cantrip"]["entity_id"]
    work_id, _ = await _work(stack, entity)

    async def watches() -> list[Any]:
        return await stack.query(
            "SELECT grace_until IS NULL FROM cantrip_prompt_watches WHERE work_id = %s ORDER BY 1",
            work_id,
        )

    later: list[Any] = []
    async with (
        httpx.AsyncClient(base_url=b, timeout=60, headers=AUTH) as http,
        run_stream(http, body, last=first[-1][0], reconnect_s=30) as frames,
        trio.open_nursery() as nursery,
    ):

        async def read() -> None:
            later.extend(await rest(frames))

        nursery.start_soon(read)
        # A's grace (its hang-up, recorded) and B's run following the prompt
        both = await _until(lambda: _both(watches), "A's grace and B's watch")
        assert both == [(False,), (True,)]
        await _until(_held(stack, "graceback"), "the final answer held")
        # A's grace is over and A has decided: its watch is gone, B's stays
        assert await _until(lambda: _only_b(watches), "A's decision") == [(True,)]
        assert (await _work(stack, entity))[1] == "running", "A did not cancel it"
        _release(stack, "graceback")
    told = first + later[1:]
    assert [i for i, _ in told] == list(range(len(told)))
    events = [e for _, e in told]
    assert_valid_agui(events, max_warnings=0)
    assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"] == {"type": "success"}
    assert (await _work(stack, entity))[1] == "done"
    assert await watches() == [], "every watch let go"


async def _both(watches: Any) -> Any:
    rows = await watches()
    return rows if len(rows) == 2 else None


async def _only_b(watches: Any) -> Any:
    rows = await watches()
    return rows if len(rows) == 1 else None


async def test_a_hang_up_grace_with_no_client_back_cancels_and_records_it(stack: Stack) -> None:
    a, *_ = stack.replicas
    body = run_input("db-grace-gone", "hold:gracegone")
    first = await _hang_up_after_a_turn(a, body, reconnect_s=1)
    entity = first[1][1]["snapshot"]["cantrip"]["entity_id"]
    sid = first[1][1]["snapshot"]["cantrip"]["session_id"]
    try:

        async def ended() -> Any:
            work = await _work(stack, entity)
            return work if work[1] not in ("queued", "running") else None

        assert (await _until(ended, "the cancel"))[1] == "cancelled"
    finally:
        _release(stack, "gracegone")
    async with httpx.AsyncClient(base_url=a, timeout=60, headers=AUTH) as http:
        thread = (await http.get(f"/sessions/{sid}/thread")).json()["turns"]
    assert thread[-1]["reason"] == "cancelled"
    work_id, _ = await _work(stack, entity)
    rows = "SELECT count(*) FROM cantrip_prompt_watches WHERE work_id = %s"
    assert await stack.query(rows, work_id) == [(0,)], "its watch let go"


DELEGATING = [
    {
        "content": "delegating",
        "tool_calls": [{"gate": "call_agent", "args": {"intent": "look", "llm": "kid"}}],
    },
    {"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]},
]
KID = [{"content": "looking", "tool_calls": [{"gate": "done", "args": {"answer": "found"}}]}]
"""The parent says a line and delegates to a child on the ``kid`` LLM, which says its
own line and answers; then the parent answers."""


def delegating_spec(folder: Path) -> Path:
    spec = folder / "delegating.toml"
    spec.write_text(
        "[llm]\n"
        'provider = "scripted"\n' + _toml(DELEGATING) + "\n[llms.kid]\n"
        'provider = "scripted"\n' + _toml(KID) + "\n[circle]\n"
        'medium = "conversation"\n'
        'gates = ["done", "call_agent"]\n'
        "wards = [{ max_turns = 6 }, { max_depth = 1 }]\n"
    )
    return spec


def _shape(events: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    """A run's events as (type, who) -- who: the sub-agent's place among the run's
    sub-agents, None for the run's own -- without the token deltas (a live run splits a
    message or a call's arguments into any number of them; a told record sends each
    whole) and without ids (minted per run)."""
    order: dict[str, str] = {}
    shape: list[tuple[str, str | None]] = []
    for event in events:
        sub = event.get("subagentRunId")
        who = order.setdefault(sub, f"sub-{len(order) + 1}") if sub else None
        item = (event["type"], who)
        if shape and item == shape[-1] and item[0].endswith(("_CONTENT", "_ARGS")):
            continue
        shape.append(item)
    return shape


async def test_a_call_agent_child_is_a_subagent_at_a_replica_as_in_process(
    stack: Stack, tmp_path: Path
) -> None:
    """On ``serve --db`` a ``call_agent`` child's recorded turns are told as an AG-UI
    sub-agent before its call's result -- ``SUBAGENT_STARTED`` in the delegation call,
    its events carrying its ``subagentRunId``, ``SUBAGENT_FINISHED`` -- the same events
    in the same order as the in-process server tells for the same cast."""
    spec = delegating_spec(tmp_path)
    replica = stack.start_replica(spec, token=TOKEN)
    answer, events = await agui(replica, run_input("db-subagent", "go"))
    assert answer.status_code == 200 and events[-1]["type"] == "RUN_FINISHED", types(events)
    (started,) = [e for e in events if e["type"] == "SUBAGENT_STARTED"]
    child = started["subagentRunId"]
    assert child.startswith("entity-") and started["description"] == "look"
    (delegation,) = [
        e
        for e in events
        if e["type"] == "TOOL_CALL_START"
        and e["toolCallName"] == "call_agent"
        and "subagentRunId" not in e
    ]
    call_id = delegation["toolCallId"]
    assert started["parentToolCallId"] == call_id
    place = {
        (e["type"], e.get("subagentRunId"), e.get("toolCallId")): i for i, e in enumerate(events)
    }
    finished = place["SUBAGENT_FINISHED", child, None]
    result = place["TOOL_CALL_RESULT", None, call_id]
    assert place["SUBAGENT_STARTED", child, None] < finished < result
    assert events[finished]["outcome"] == {"type": "success"}
    said = "".join(
        e["delta"]
        for e in events
        if e["type"] == "TEXT_MESSAGE_CONTENT" and e.get("subagentRunId") == child
    )
    assert said == "looking"
    async with in_process.serving(load_cantrip(spec)) as base:
        _, live = await in_process.agui(base, run_input("subagent", "go"))
    assert _shape(events) == _shape(live)
