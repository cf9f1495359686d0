# ruff: noqa: F811 (the contract's fixture ``world`` is every test's argument)
"""AG-UI over every session backend (issue 41): the one run of
:mod:`cantrip.protocols.agui._run` against the contract suite's backends -- in
process on a memory and an SQLite loom, PostgreSQL with a real worker, and the
in-memory double -- with the contract's model (tests/seam_llm.py: held calls, not
sleeps). The run is called as the HTTP apps call it, over an ASGI request here; every
stream is parsed by the official models and checked by the conformance validator.

tests/test_agui.py (in process) and tests/test_agui_db.py (replicas and a worker in
processes of their own) test the wire end to end; this module shows the features
that exist in both modes do the same on each backend.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
import trio
from ag_ui_validate.pytest_plugin import assert_valid_agui
from pg_cluster import fresh_database
from test_agui import parse_sse, run_input, types
from test_session_backend_contract import (  # noqa: F401 (the fixtures)
    LOCATE,
    World,
    key_env,
    new_session,
    world,
)

from cantrip.protocols.agui._input import thread_key
from cantrip.protocols.agui._run import serve_agui
from cantrip.protocols.asgi._responses import HttpError

pytestmark = pytest.mark.loop_watch


@pytest.fixture(scope="module")
def seam_db(pg_server: str) -> str:
    """This module's database for the PostgreSQL backend (the contract's ``world``
    asks for it by name)."""
    return fresh_database(pg_server, "agui_backends")


async def post(
    world: World, body: dict[str, Any], hang_up: trio.Event | None = None
) -> list[dict[str, Any]]:
    """One ``POST /agui`` to the run over ``world``'s backend; its events (checked by
    the validator). ``hang_up``: the client hangs up when it is set."""
    bodies: list[bytes] = []
    request = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]

    async def receive() -> dict[str, Any]:
        if request:
            return request.pop()
        if hang_up is None:
            await trio.sleep_forever()
        else:
            await hang_up.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            bodies.append(message.get("body", b""))

    with trio.fail_after(60):
        await serve_agui(world.backend, receive, send, gate_names=("done", "echo", "ask_user"))
    events = parse_sse(b"".join(bodies).decode())
    if events and hang_up is None:
        assert_valid_agui(events, max_warnings=0)
    return events


def state(events: list[dict[str, Any]]) -> dict[str, Any]:
    return dict([e for e in events if e["type"] == "STATE_SNAPSHOT"][-1]["snapshot"]["cantrip"])


async def test_a_run_tells_each_turn_and_ends_with_the_result(world: World) -> None:
    events = await post(world, run_input("b-run", "Weather?", state={"mine": 1}))
    kinds = types(events)
    assert kinds[:2] == ["RUN_STARTED", "STATE_SNAPSHOT"] and kinds[-1] == "RUN_FINISHED"
    assert events[-1]["result"] == "Weather? ok #1"
    assert [e["stepName"] for e in events if e["type"] == "STEP_FINISHED"] == [
        "turn-1",
        "turn-2",
        "turn-3",
    ]
    deltas = [e["delta"] for e in events if e["type"] == "STATE_DELTA"]
    assert deltas == [[{"op": "replace", "path": "/cantrip/turns", "value": n}] for n in (1, 2, 3)]
    results = [e["content"] for e in events if e["type"] == "TOOL_CALL_RESULT"]
    assert results == ["step 1", "step 2", "Weather? ok #1"]  # done's too
    closing = state(events)
    assert closing["turns"] == 3 and closing["reason"] == "done"
    messages = next(e for e in events if e["type"] == "MESSAGES_SNAPSHOT")["messages"]
    assert messages[0] == {**messages[0], "role": "user", "content": "Weather?"}


async def test_a_thread_is_one_session_and_may_name_one_of_the_api(world: World) -> None:
    one = await post(world, run_input("b-thread", "One."))
    two = await post(world, run_input("b-thread", "Two."))
    assert two[-1]["result"] == "Two. ok #2"  # the model saw the first run
    assert state(one)["session_id"] == state(two)["session_id"]
    assert two[1]["snapshot"]["cantrip"]["turns"] == 3  # it starts where the last ended
    sid = await new_session(world)
    named = await post(world, run_input(sid, "Here."))
    assert state(named)["session_id"] == sid and named[-1]["result"] == "Here. ok #1"


async def test_a_busy_thread_is_a_run_error(world: World) -> None:
    async with trio.open_nursery() as nursery:
        first: list[dict[str, Any]] = []

        async def run_first() -> None:
            first.extend(await post(world, run_input("b-busy", "hold:busy go")))

        nursery.start_soon(run_first)
        async with world.holds.holding("busy"):
            second = await post(world, run_input("b-busy", "again"))
    assert types(second) == ["RUN_STARTED", "STATE_SNAPSHOT", "RUN_ERROR"]
    assert second[-1]["code"] == "busy"
    assert first[-1]["result"] == "hold:busy go ok #1"


async def test_a_repeated_run_id_replays_that_run_and_casts_nothing_again(world: World) -> None:
    body = run_input("b-again", "Again.")
    first = await post(world, body)
    again = await post(world, body)
    assert first[-1]["result"] == again[-1]["result"] == "Again. ok #1"
    told = [e["content"] for e in again if e["type"] == "TOOL_CALL_RESULT"]
    assert told == [e["content"] for e in first if e["type"] == "TOOL_CALL_RESULT"]
    assert state(again)["turns"] == 3, "nothing was cast again"
    other = await post(world, {**body, "messages": [{"id": "x", "role": "user", "content": "no"}]})
    assert other[-1]["type"] == "RUN_ERROR" and other[-1]["code"] == "key_reused"


async def test_a_question_is_an_interrupt_resumed_once(world: World) -> None:
    paused = await post(world, run_input("b-ask", "ask: paint"))
    (interrupt,) = paused[-1]["outcome"]["interrupts"]
    assert interrupt["reason"] == "question" and interrupt["message"] == "Which colour?"
    resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": "blue"}]
    resumed = await post(world, run_input("b-ask", None, resume=resume))
    twice = await post(world, run_input("b-ask", None, resume=resume))
    otherwise = [{"interruptId": interrupt["id"], "status": "resolved", "payload": "red"}]
    other = await post(world, run_input("b-ask", None, resume=otherwise))
    (result,) = [e for e in resumed if e["type"] == "TOOL_CALL_RESULT"
                 and e["toolCallId"] == interrupt["toolCallId"]]  # fmt: skip
    assert result["content"] == "blue"
    assert resumed[-1]["result"] == "ask: paint ok #1 in blue"
    # the same answer sent again follows its continuation; another one is refused
    assert [e["type"] for e in twice] == [e["type"] for e in resumed]
    assert twice[-1]["result"] == resumed[-1]["result"]
    assert state(twice)["turns"] == state(resumed)["turns"], "nothing was cast again"
    assert other[-1]["type"] == "RUN_ERROR" and other[-1]["code"] == "bad_resume"


async def test_a_client_tool_is_called_at_the_client_and_its_result_observed(
    world: World,
) -> None:
    body = run_input("b-tool", "tool:locate where", tools=[LOCATE])
    called = await post(world, body)
    (start,) = [e for e in called if e["type"] == "TOOL_CALL_START"]
    assert start["toolCallName"] == "locate"
    assert called[-1]["type"] == "RUN_FINISHED"
    # success, with the call the client is to run (1.0's pendingToolCallIds)
    assert called[-1]["outcome"] == {
        "type": "success",
        "pendingToolCallIds": [e["toolCallId"] for e in called if e["type"] == "TOOL_CALL_START"],
    }
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
                    "function": {"name": "locate", "arguments": "{}"},
                }
            ],
        },
        {"id": "t1", "role": "tool", "toolCallId": call_id, "content": "Oslo"},
    ]
    continued = await post(world, {**run_input("b-tool", None, tools=[LOCATE]),
                                   "messages": messages})  # fmt: skip
    assert continued[-1]["result"] == "tool:locate where ok #1 in Oslo"
    assert all(e.get("toolCallId") != call_id for e in continued), "the client has that result"
    later = await post(world, run_input("b-tool", "tool:locate again"))
    assert later[-1]["result"] == "tool:locate again ok #2", "tools are the run's own"


async def test_a_client_that_hangs_up_cancels_the_runs_prompt(world: World) -> None:
    hang_up, ended = trio.Event(), trio.Event()
    told: list[dict[str, Any]] = []
    async with trio.open_nursery() as nursery:

        async def run() -> None:
            told.extend(await post(world, run_input("b-gone", "hold:gone wait"), hang_up))
            ended.set()

        nursery.start_soon(run)
        async with world.holds.holding("gone"):  # held until the cast is cut off (drift 9)
            hang_up.set()
            with trio.fail_after(60):
                await ended.wait()  # at once: its prompt is cancelled, not awaited
            assert "RUN_FINISHED" not in types(told), "nobody was there to tell"
            events = world.backend.follow(told[1]["snapshot"]["cantrip"]["session_id"])
            with trio.fail_after(60):
                async with contextlib.aclosing(events):
                    async for event in events:
                        if event.turn is not None and event.turn.truncated:
                            break
    assert event.turn is not None and event.turn.reason == "cancelled"


async def test_bad_input_is_a_400_before_anything_runs(world: World) -> None:
    with pytest.raises(HttpError) as refused:
        await post(world, run_input("b-bad", "hi", tools=[{"name": "echo", "description": "x"}]))
    assert refused.value.status == 400
    _, created = await world.backend.create(thread_key("b-bad"))
    assert created, "no session was made for the thread"
