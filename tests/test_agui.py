"""AG-UI over ``cantrip serve`` (issue 33, item 1): ``POST /agui`` takes a
``RunAgentInput`` and answers AG-UI 1.0 events over SSE.

Every stream here is read off a live server, each event held to the AG-UI 1.0
JSON Schema (tests/agui_schema_check.py) and the stream checked by the
``ag-ui-validate`` conformance validator; ``test_agui_client.py`` runs the official
JavaScript client against the same server."""

from __future__ import annotations

import functools
import json
import logging
import ssl
import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from ag_ui_validate.pytest_plugin import assert_valid_agui
from agui_schema_check import parse_sse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cantrip
from cantrip.protocols.http._serve import serve_http
from cantrip.protocols.middleware._guard import Guard
from gates import ask_user, call_agent, done

pytestmark = pytest.mark.loop_watch  # nothing here may block the trio loop


def spell(script: list[dict[str, Any]], *, loom: Path | None = None, gates: Any = ()) -> Any:
    return cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(script),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done, *gates], [cantrip.max_turns(6)]),
        loom=cantrip.Loom() if loom is None else cantrip.Loom.open(loom),
    )


@asynccontextmanager
async def serving(s: cantrip.Cantrip, guard: Guard | None = None) -> AsyncIterator[str]:
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve_http(s, "127.0.0.1", 0, task_status=task_status, guard=guard)
        )
        yield binds[0]
        nursery.cancel_scope.cancel()


TLS = ssl.create_default_context()
"""One TLS context for every client :func:`agui` makes (none is used: the servers are
plain HTTP on loopback). The AG-UI fuzz's flake, test half: a client built its own,
loading the CA file on the test's loop thread -- where ``trio.from_thread.run`` runs
each request -- 150-670 ms on a busy machine, and the loop watch failed the test
(found by sampling the loop thread's stack; tests/test_agui.py's fuzz)."""


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
    base: str, body: Any, headers: dict[str, str] | None = None, *, timeout: float = 20
) -> tuple[httpx.Response, list[dict[str, Any]]]:
    async with httpx.AsyncClient(base_url=base, timeout=timeout, verify=TLS) as http:
        answer = await http.post(
            "/agui", json=body, headers={"accept": "text/event-stream", **(headers or {})}
        )
    events = parse_sse(answer.text) if answer.status_code == 200 else []
    if events:
        assert_valid_agui(events, max_warnings=0)  # the conformance validator's rules
    return answer, events


def first_result(events: list[dict[str, Any]]) -> str:
    """The content of the run's first gate result (the call an interrupt held)."""
    return str(next(e for e in events if e["type"] == "TOOL_CALL_RESULT")["content"])


def final_state(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The state the run ended with (its last STATE_SNAPSHOT; the first opens the run)."""
    snapshots = [e["snapshot"] for e in events if e["type"] == "STATE_SNAPSHOT"]
    assert len(snapshots) == 2, snapshots
    return dict(snapshots[-1])


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def the(events: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (event,) = [e for e in events if e["type"] == kind]
    return event


@cantrip.gate()
def lookup(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@cantrip.gate(requires_approval=True)
def launch(target: str) -> str:
    """Something a person must approve first."""
    return f"launched at {target}"


async def test_a_run_streams_text_tool_calls_their_results_and_snapshots() -> None:
    script = [
        {
            "content": "Let me look.",
            "thinking": "the user wants weather",
            "tool_calls": [{"gate": "lookup", "args": {"city": "Oslo"}}],
        },
        {"tool_calls": [{"gate": "done", "args": {"answer": "It is sunny in Oslo."}}]},
    ]
    async with serving(spell(script, gates=[lookup])) as base:
        answer, events = await agui(base, run_input("t-weather", "weather in Oslo?"))
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    kinds = types(events)
    assert kinds[0] == "RUN_STARTED" and kinds[-1] == "RUN_FINISHED"
    started = events[0]
    assert started["protocolVersion"] == "1.0" and started["threadId"] == "t-weather"
    for kind in ("REASONING_START", "REASONING_MESSAGE_CONTENT", "REASONING_END"):
        assert kind in kinds
    reasoning = "".join(e["delta"] for e in events if e["type"] == "REASONING_MESSAGE_CONTENT")
    assert reasoning == "the user wants weather"
    start = next(
        e for e in events if e["type"] == "TOOL_CALL_START" and e["toolCallName"] == "lookup"
    )
    call_id = start["toolCallId"]
    args = "".join(
        e["delta"] for e in events if e["type"] == "TOOL_CALL_ARGS" and e["toolCallId"] == call_id
    )
    assert json.loads(args) == {"city": "Oslo"}
    result = next(
        e for e in events if e["type"] == "TOOL_CALL_RESULT" and e["toolCallId"] == call_id
    )
    assert result["content"] == "sunny in Oslo"
    texts = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert "Let me look." in texts and "It is sunny in Oslo." in texts
    finished = events[-1]
    assert finished["result"] == "It is sunny in Oslo."
    assert finished.get("outcome", {"type": "success"})["type"] == "success"
    state = final_state(events)["cantrip"]
    assert state["session_id"].startswith("session-") and state["reason"] == "done"
    messages = the(events, "MESSAGES_SNAPSHOT")["messages"]
    assert [m["role"] for m in messages][:4] == ["user", "reasoning", "assistant", "tool"]
    assert all(isinstance(e["timestamp"], int) for e in events)
    assert messages[0]["content"] == "weather in Oslo?"


async def test_a_thread_is_one_session_across_runs() -> None:
    script = [
        {"tool_calls": [{"gate": "done", "args": {"answer": "first"}}]},
        {"tool_calls": [{"gate": "done", "args": {"answer": "second"}}]},
    ]
    async with serving(spell(script)) as base:
        _, one = await agui(base, run_input("t-same", "one"))
        _, two = await agui(base, run_input("t-same", "two"))
        async with httpx.AsyncClient(base_url=base) as http:
            sessions = (await http.get("/sessions")).json()["sessions"]
    sid = final_state(one)["cantrip"]["session_id"]
    assert final_state(two)["cantrip"]["session_id"] == sid
    assert [s["session_id"] for s in sessions] == [sid]
    users = [m["content"] for m in the(two, "MESSAGES_SNAPSHOT")["messages"] if m["role"] == "user"]
    assert users == ["one", "two"]
    assert two[-1]["result"] == "second"


async def test_a_thread_may_name_a_session_of_the_http_api() -> None:
    script = [{"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]}]
    async with serving(spell(script)) as base:
        async with httpx.AsyncClient(base_url=base) as http:
            sid = (await http.post("/sessions")).json()["session_id"]
        _, events = await agui(base, run_input(sid, "hi"))
    assert final_state(events)["cantrip"]["session_id"] == sid


async def test_an_approval_is_an_interrupt_and_a_resume_continues_the_cast(tmp_path: Path) -> None:
    script = [
        {"tool_calls": [{"gate": "launch", "args": {"target": "moon"}}]},
        {"tool_calls": [{"gate": "done", "args": {"answer": "launched"}}]},
    ]
    async with serving(spell(script, gates=[launch])) as base:
        _, paused = await agui(base, run_input("t-approve", "launch it"))
        outcome = paused[-1]["outcome"]
        assert outcome["type"] == "interrupt"
        (interrupt,) = outcome["interrupts"]
        assert interrupt["reason"] == "approval" and interrupt["metadata"]["gate"] == "launch"
        assert "TOOL_CALL_RESULT" not in types(paused)  # the call waits
        call_start = the(paused, "TOOL_CALL_START")
        assert interrupt["toolCallId"] == call_start["toolCallId"]
        resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": True}]
        _, resumed = await agui(base, run_input("t-approve", None, resume=resume))
        _, twice = await agui(base, run_input("t-approve", None, resume=resume))
        otherwise = [{"interruptId": interrupt["id"], "status": "resolved", "payload": False}]
        _, other = await agui(base, run_input("t-approve", None, resume=otherwise))
    results = [e for e in resumed if e["type"] == "TOOL_CALL_RESULT"]
    assert results[0]["toolCallId"] == interrupt["toolCallId"]
    # the approved call's result is told once: heard live, not again from its record
    # (the pause's own record piece came between them and the run lost track)
    assert [e["content"] for e in results] == ["launched at moon", "launched"]
    assert [e["toolCallName"] for e in resumed if e["type"] == "TOOL_CALL_START"] == [
        "launch",
        "done",
    ]
    assert resumed[-1]["result"] == "launched"
    # the same resume sent again (a client that lost its stream) follows the
    # continuation it started: told again, the same events; nothing ran again
    assert types(twice) == types(resumed) and twice[-1]["result"] == "launched"
    assert [e["content"] for e in twice if e["type"] == "TOOL_CALL_RESULT"] == [
        e["content"] for e in results
    ]
    assert final_state(twice)["cantrip"]["turns"] == final_state(resumed)["cantrip"]["turns"]
    # another answer to an answered interrupt is refused, and runs nothing
    assert other[-1]["type"] == "RUN_ERROR" and other[-1]["code"] == "bad_resume"
    assert interrupt["id"] in other[-1]["message"]
    assert "TOOL_CALL_RESULT" not in types(other), "the gate ran exactly once"


async def test_a_denied_or_cancelled_interrupt_is_an_error_observation() -> None:
    script = [
        {"tool_calls": [{"gate": "launch", "args": {"target": "moon"}}]},
        {"tool_calls": [{"gate": "done", "args": {"answer": "ok, not launched"}}]},
    ]
    async with serving(spell(script, gates=[launch])) as base:
        _, paused = await agui(base, run_input("t-deny", "launch it"))
        pause_id = paused[-1]["outcome"]["interrupts"][0]["id"]
        resume = [{"interruptId": pause_id, "status": "cancelled"}]
        _, resumed = await agui(base, run_input("t-deny", None, resume=resume))
    assert first_result(resumed) == "denied by the user: cancelled by the user"
    assert resumed[-1]["result"] == "ok, not launched"


async def test_ask_user_is_a_question_interrupt_answered_with_text() -> None:
    script = [
        {"tool_calls": [{"gate": "ask_user", "args": {"question": "Which colour?"}}]},
        {"tool_calls": [{"gate": "done", "args": {"answer": "blue it is"}}]},
    ]
    async with serving(spell(script, gates=[ask_user])) as base:
        _, paused = await agui(base, run_input("t-ask", "paint it"))
        (interrupt,) = paused[-1]["outcome"]["interrupts"]
        assert interrupt["reason"] == "question" and interrupt["message"] == "Which colour?"
        wrong = [{"interruptId": interrupt["id"], "status": "resolved", "payload": True}]
        _, refused = await agui(base, run_input("t-ask", None, resume=wrong))
        resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": "blue"}]
        _, resumed = await agui(base, run_input("t-ask", None, resume=resume))
    assert refused[-1]["type"] == "RUN_ERROR" and "question" in refused[-1]["message"]
    assert first_result(resumed) == "blue"
    assert resumed[-1]["result"] == "blue it is"


async def test_a_busy_thread_is_a_run_error() -> None:
    release, started = trio.Event(), trio.Event()

    @cantrip.gate()
    async def slow() -> str:
        """Waits."""
        started.set()
        await release.wait()
        return "late"

    script = [
        {"tool_calls": [{"gate": "slow", "args": {}}]},
        {"tool_calls": [{"gate": "done", "args": {"answer": "x"}}]},
    ]
    async with serving(spell(script, gates=[slow])) as base, trio.open_nursery() as nursery:
        first: list[Any] = []

        async def run_first() -> None:
            first.extend(await agui(base, run_input("t-busy", "go")))

        nursery.start_soon(run_first)
        with trio.fail_after(10):
            with trio.fail_after(10):
                await started.wait()
        _, second = await agui(base, run_input("t-busy", "again"))
        release.set()
    assert types(second) == ["RUN_STARTED", "STATE_SNAPSHOT", "RUN_ERROR"]
    assert second[-1]["code"] == "busy"
    assert first[1][-1]["result"] == "x"


async def test_a_client_that_hangs_up_cancels_the_cast(tmp_path: Path) -> None:
    started = trio.Event()

    @cantrip.gate()
    async def forever() -> str:
        """Never returns by itself."""
        started.set()
        await trio.sleep_forever()
        return "never"

    script = [{"tool_calls": [{"gate": "forever", "args": {}}]}]
    s = spell(script, gates=[forever], loom=tmp_path / "loom.db")
    async with serving(s) as base, httpx.AsyncClient(base_url=base, timeout=20) as http:
        async with trio.open_nursery() as nursery:

            async def run() -> None:
                body = run_input("t-gone", "wait forever")
                async with http.stream("POST", "/agui", json=body) as stream:
                    async for _ in stream.aiter_bytes():
                        pass

            nursery.start_soon(run)
            with trio.fail_after(10):
                await started.wait()
            nursery.cancel_scope.cancel()  # the client hangs up mid-run
        with trio.fail_after(10):
            while True:
                sessions = (await http.get("/sessions")).json()["sessions"]
                if sessions and not sessions[0]["running"]:
                    break
                await trio.sleep(0.05)
        thread = (await http.get(f"/sessions/{sessions[0]['session_id']}/thread")).json()
    assert thread["turns"][-1]["reason"] == "cancelled"


async def test_the_token_guard_covers_agui() -> None:
    script = [{"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]}]
    guard = Guard(bind_host="127.0.0.1", token="s3cret-token")
    async with serving(spell(script), guard) as base:
        refused, _ = await agui(base, run_input("t-tok", "hi"))
        answer, events = await agui(
            base, run_input("t-tok", "hi"), {"authorization": "Bearer s3cret-token"}
        )
        async with httpx.AsyncClient(base_url=base) as http:
            foreign = await http.post(
                "/agui",
                json=run_input("t-tok", "hi"),
                headers={
                    "authorization": "Bearer s3cret-token",
                    "origin": "https://evil.example",
                },
            )
    assert refused.status_code == 401
    assert foreign.status_code == 403
    assert answer.status_code == 200 and events[-1]["result"] == "ok"


async def test_secrets_are_redacted_from_the_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-proj-" + "A1b2C3d4" * 5
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    script = [{"tool_calls": [{"gate": "done", "args": {"answer": f"the key is {secret}"}}]}]
    async with serving(spell(script)) as base:
        answer, events = await agui(base, run_input("t-secret", "leak it"))
    assert events[-1]["type"] == "RUN_FINISHED"
    assert secret not in answer.text


BAD_BODIES: list[Any] = [
    [],
    "run",
    {},
    {"threadId": "t", "runId": "r"},  # no messages
    {"threadId": "t", "runId": "r", "messages": "hi"},
    {"threadId": "t", "runId": "r", "messages": [{"role": "user"}]},
    {"threadId": "t", "runId": "r", "messages": []},  # nothing to say
    {"threadId": "", "runId": "r", "messages": [{"id": "1", "role": "user", "content": "x"}]},
    {
        "threadId": "t" * 300,
        "runId": "r",
        "messages": [{"id": "1", "role": "user", "content": "x"}],
    },
    {"threadId": "t", "runId": "r", "messages": [], "resume": [{"interruptId": "x"}]},
]


async def test_bad_input_is_a_clear_400_and_touches_nothing() -> None:
    s = spell([{"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]}])
    async with serving(s) as base, httpx.AsyncClient(base_url=base) as http:
        for body in BAD_BODIES:
            answer = await http.post("/agui", json=body)
            assert answer.status_code == 400, (body, answer.text)
            error = answer.json()["error"]
            assert error["code"] == "bad_request" and error["message"], body
        wrong_method = await http.get("/agui")
        not_json = await http.post(
            "/agui", content=b"{not json", headers={"content-type": "application/json"}
        )
    assert wrong_method.status_code == 405
    assert not_json.status_code == 400
    assert len(s.loom) == 0, "no bad request reached an entity"


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)
_bodies = st.one_of(
    _json,
    st.fixed_dictionaries(
        {"threadId": _json, "runId": _json, "messages": _json},
        optional={"resume": _json, "state": _json, "tools": _json},
    ),
    st.fixed_dictionaries(
        {
            "threadId": st.text(min_size=1, max_size=20),
            "runId": st.text(min_size=1, max_size=20),
            "messages": st.lists(
                st.fixed_dictionaries(
                    {"id": st.text(max_size=4), "role": st.sampled_from(["user", "tool", "x"])},
                    optional={"content": _json},
                ),
                max_size=3,
            ),
        },
        optional={
            "resume": st.lists(
                st.fixed_dictionaries(
                    {"interruptId": st.text(max_size=6), "status": st.text(max_size=9)}
                ),
                max_size=2,
            )
        },
    ),
)


async def fuzz_runs(
    post: Callable[[Any], Awaitable[tuple[httpx.Response, list[dict[str, Any]]]]],
    *,
    examples: int,
) -> None:
    """Post ``examples`` random bodies: each is a 400 with a message, or a run whose
    stream is valid AG-UI ending in RUN_FINISHED or RUN_ERROR (both servers' fuzz)."""

    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(body=_bodies)
    def check(body: Any) -> None:
        answer, events = trio.from_thread.run(post, body)
        assert answer.status_code in (200, 400), (body, answer.status_code, answer.text)
        if answer.status_code == 400:
            assert answer.json()["error"]["message"]
        else:
            assert events[0]["type"] == "RUN_STARTED"
            assert events[-1]["type"] in ("RUN_FINISHED", "RUN_ERROR")

    await trio.to_thread.run_sync(check)


def test_random_bodies_get_a_400_or_a_well_formed_run() -> None:
    """Fuzz: any JSON body is a 400 with a message, or a run whose stream is valid
    AG-UI ending in RUN_FINISHED or RUN_ERROR -- never a 500 or a broken stream."""
    s = spell([{"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]}] * 200)

    async def main() -> None:
        async with serving(s) as base:
            await fuzz_runs(functools.partial(agui, base), examples=60)

    trio.run(main)


async def test_a_cancel_through_the_http_api_finishes_the_run_as_cancelled() -> None:
    started = trio.Event()

    @cantrip.gate()
    async def forever() -> str:
        """Never returns by itself."""
        started.set()
        await trio.sleep_forever()
        return "never"

    s = spell([{"tool_calls": [{"gate": "forever", "args": {}}]}], gates=[forever])
    async with serving(s) as base, trio.open_nursery() as nursery:
        got: list[Any] = []

        async def run() -> None:
            got.extend(await agui(base, run_input("t-cancel", "wait")))

        nursery.start_soon(run)
        with trio.fail_after(10):
            await started.wait()
        async with httpx.AsyncClient(base_url=base) as http:
            (session,) = (await http.get("/sessions")).json()["sessions"]
            cancelled = await http.post(f"/sessions/{session['session_id']}/cancel")
    assert cancelled.json()["cancelled"] is True
    events = got[1]
    assert events[-1]["type"] == "RUN_FINISHED"
    assert events[-1]["outcome"] == {"type": "cancelled"}
    assert final_state(events)["cantrip"]["reason"] == "cancelled"


async def test_each_recorded_turn_is_a_state_delta_on_the_opening_snapshot() -> None:
    """The run opens with the session's state; each turn recorded is a JSON Patch on
    it; applying the patches gives the turn count the closing snapshot holds."""
    script = [
        {"tool_calls": [{"gate": "lookup", "args": {"city": "Oslo"}}]},
        {"tool_calls": [{"gate": "lookup", "args": {"city": "Rome"}}]},
        {"tool_calls": [{"gate": "done", "args": {"answer": "both sunny"}}]},
    ]
    async with serving(spell(script, gates=[lookup])) as base:
        _, events = await agui(base, run_input("t-delta", "weather", state={"mine": 1}))
    kinds = types(events)
    assert kinds[:2] == ["RUN_STARTED", "STATE_SNAPSHOT"]
    opening = events[1]["snapshot"]
    assert opening["mine"] == 1 and opening["cantrip"]["turns"] == 0
    assert opening["cantrip"]["running"] is True
    deltas = [e["delta"] for e in events if e["type"] == "STATE_DELTA"]
    assert deltas == [[{"op": "replace", "path": "/cantrip/turns", "value": n}] for n in (1, 2, 3)]
    for delta in deltas:  # each follows its turn's STEP_FINISHED
        index = next(i for i, e in enumerate(events) if e.get("delta") == delta)
        assert events[index - 1]["type"] == "STEP_FINISHED"
    closing = final_state(events)
    assert closing["cantrip"]["turns"] == 3 and closing["cantrip"]["running"] is False


async def test_a_repeated_run_id_replays_that_run_and_casts_nothing_again() -> None:
    """A client that sends the same run again (a retry after a dropped stream) gets
    that run's cast told from the loom; the LLM is not asked again."""
    script = [
        {"content": "Looking.", "tool_calls": [{"gate": "lookup", "args": {"city": "Oslo"}}]},
        {"tool_calls": [{"gate": "done", "args": {"answer": "sunny"}}]},
    ]
    s = spell(script, gates=[lookup])
    body = run_input("t-again", "weather")
    async with serving(s) as base:
        _, first = await agui(base, body)
        _, again = await agui(base, body)
        _, other = await agui(
            base, {**body, "messages": [{"id": "u", "role": "user", "content": "something else"}]}
        )
    assert first[-1]["result"] == again[-1]["result"] == "sunny"
    assert len(s.loom) == 2, "the repeated runId cast nothing"
    results = [e["content"] for e in again if e["type"] == "TOOL_CALL_RESULT"]
    assert "sunny in Oslo" in results
    assert results == [e["content"] for e in first if e["type"] == "TOOL_CALL_RESULT"]
    assert "Looking." in "".join(e["delta"] for e in again if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert other[-1]["type"] == "RUN_ERROR" and other[-1]["code"] == "key_reused"


LOCATION_TOOL = {
    "name": "get_location",
    "description": "Where the user is (the browser knows).",
    "parameters": {"type": "object", "properties": {"precision": {"type": "string"}}},
}


async def test_a_front_end_tool_is_offered_called_at_the_client_and_its_result_observed() -> None:
    """The input's tools are offered to the model for the run; its call of one is
    TOOL_CALL_START/ARGS/END and the run ends; the client runs the tool and its next
    run carries the result (a tool message), which the cast observes and goes on from."""
    script = [
        {
            "content": "Let me ask your browser.",
            "tool_calls": [{"gate": "get_location", "args": {"precision": "city"}}],
        },
        {"tool_calls": [{"gate": "done", "args": {"answer": "You are in Oslo."}}]},
        {"tool_calls": [{"gate": "done", "args": {"answer": "bye"}}]},
    ]
    s = spell(script)
    async with serving(s) as base:
        _, called = await agui(base, run_input("t-front", "where am I?", tools=[LOCATION_TOOL]))
        start = the(called, "TOOL_CALL_START")
        assert start["toolCallName"] == "get_location"
        call_id = start["toolCallId"]
        assert json.loads(the(called, "TOOL_CALL_ARGS")["delta"]) == {"precision": "city"}
        assert "TOOL_CALL_END" in types(called) and "TOOL_CALL_RESULT" not in types(called)
        finished = called[-1]
        assert finished["type"] == "RUN_FINISHED"
        # success, with the call the client is to run (1.0's pendingToolCallIds)
        assert finished["outcome"] == {"type": "success", "pendingToolCallIds": [call_id]}
        messages = [
            {"id": "u1", "role": "user", "content": "where am I?"},
            {
                "id": "a1",
                "role": "assistant",
                "toolCalls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "get_location", "arguments": '{"precision":"city"}'},
                    }
                ],
            },
            {"id": "t1", "role": "tool", "toolCallId": call_id, "content": "Oslo, Norway"},
        ]
        body = {**run_input("t-front", None, tools=[LOCATION_TOOL]), "messages": messages}
        _, continued = await agui(base, body)
        _, later = await agui(base, run_input("t-front", "thanks"))
    assert continued[-1]["result"] == "You are in Oslo."
    assert all(e.get("toolCallId") != call_id for e in continued), "the client has that result"
    thread = [m for m in the(continued, "MESSAGES_SNAPSHOT")["messages"] if m["role"] == "tool"]
    assert [(m["toolCallId"], m["content"]) for m in thread][:1] == [(call_id, "Oslo, Norway")]
    # the model saw the tool in those runs, and its result as the call's observation
    offered = [[t.name for t in q.tools] for q in s.llm.invocations]
    assert "get_location" in offered[0] and "get_location" in offered[1]
    assert "get_location" not in offered[2], "tools are offered for the runs that send them"
    (record,) = [c for t in s.loom.turns for c in t.gate_calls if c.gate == "get_location"]
    assert record.result == "Oslo, Norway" and record.tool_call_id == call_id
    assert later[-1]["result"] == "bye"


async def test_front_end_tools_with_bad_names_are_a_400() -> None:
    s = spell([{"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]}])
    async with serving(s) as base, httpx.AsyncClient(base_url=base) as http:
        for tools in (
            [{"name": "has space", "description": "x"}],
            [{"name": "done", "description": "the circle's own"}],
            [{"name": "t", "description": "a"}, {"name": "t", "description": "b"}],
        ):
            answer = await http.post("/agui", json=run_input("t-badtool", "hi", tools=tools))
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]["code"] == "bad_request"
    assert len(s.loom) == 0


async def test_the_inputs_context_reaches_the_model_with_the_prompt() -> None:
    """AG-UI's ``context`` (what the application tells the agent beside the message)
    is shown to the model with the prompt and recorded with the intent; a run without
    it sends the message alone."""
    s = spell([{"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]}] * 2)
    context = [
        {"description": "The page the user is on", "value": "/invoices/42"},
        {"description": "Selected rows", "value": "[3, 7]"},
    ]
    async with serving(s) as base:
        answer, events = await agui(base, run_input("t1", "total them", context=context))
        assert answer.status_code == 200 and types(events)[-1] == "RUN_FINISHED"
        answer, _ = await agui(base, run_input("t2", "just this"))
        assert answer.status_code == 200
    first, second = (q.messages[-1].content for q in s.llm.invocations)
    assert first == (
        "total them\n\nContext from the application:\n"
        "- The page the user is on: /invoices/42\n- Selected rows: [3, 7]"
    )
    assert second == "just this"
    assert [t.intent for t in s.loom.turns if t.intent] == [first, second]


# -- issue 39, items 9 and 10: hostile input is a 400; a fault after RUN_STARTED is told --


def nested(depth: int) -> Any:
    """An object nested ``depth`` levels deep (``{}`` is one level)."""
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


LONE = "\ud800"
"""An unpaired surrogate: JSON can spell it (``"\\ud800"``), UTF-8 cannot."""


def hostile_bodies() -> dict[str, bytes]:
    """Bodies that passed the schema yet broke a run after it started (issue 39.9/.10),
    as raw JSON (``json.dumps`` escapes the surrogate, as a client's encoder does)."""
    user = [{"id": "u1", "role": "user", "content": "hello"}]

    def body(**fields: Any) -> bytes:
        base = {"threadId": "t-hostile", "runId": "r-hostile", "messages": user}
        return json.dumps({**base, **fields}).encode()

    deep = nested(300)
    assert len(json.dumps(deep)) < 2600  # the "2 KB state nested 300 deep"
    return {
        "state 300 deep": body(state=deep),
        "forwardedProps 300 deep": body(forwardedProps=deep),
        "context 300 deep": body(context=[{"description": "page", "value": "x", "more": deep}]),
        "messages 300 deep": body(messages=[{**user[0], "content": [deep]}]),
        "a body too deep to parse": b'{"state": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
        "threadId with a lone surrogate": body(threadId="t" + LONE),
        "runId with a lone surrogate": body(runId="r" + LONE),
        "a resumed interrupt id with a lone surrogate": body(
            messages=[], resume=[{"interruptId": "i" + LONE, "status": "resolved"}]
        ),
    }


async def refuses_hostile_bodies(base: str, headers: dict[str, str] | None = None) -> None:
    """Each hostile body is a 400 with a one-line message, before any event (both servers)."""
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as http:
        for name, raw in hostile_bodies().items():
            answer = await http.post(
                "/agui",
                content=raw,
                headers={"content-type": "application/json", "accept": "text/event-stream"},
            )
            assert answer.status_code == 400, (name, answer.status_code, answer.text[:300])
            assert answer.headers["content-type"] == "application/json", name
            message = answer.json()["error"]["message"]
            assert message and "\n" not in message, (name, message)
            if "surrogate" in name:
                assert "surrogate" in message, (name, message)
            elif "parse" not in name:
                assert "nests deeper than 64 levels" in message, (name, message)


async def test_deep_input_and_lone_surrogate_ids_are_a_400_before_any_event() -> None:
    s = spell([{"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]}])
    async with serving(s) as base:
        await refuses_hostile_bodies(base)
    assert len(s.loom) == 0, "no hostile request reached an entity"


async def test_state_nested_to_the_bound_comes_back_in_the_snapshots() -> None:
    """The bound (64) is the documented one, not lower: such a state is the client's,
    returned whole in both snapshots."""
    s = spell([{"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]}])
    state = {"mine": nested(63)}  # the state object itself is the 64th level
    async with serving(s) as base:
        answer, events = await agui(base, run_input("t-deep-ok", state=state))
    assert answer.status_code == 200 and events[-1]["type"] == "RUN_FINISHED"
    snapshots = [e["snapshot"] for e in events if e["type"] == "STATE_SNAPSHOT"]
    assert [snap["mine"] for snap in snapshots] == [state["mine"]] * 2


def break_step_complete(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inject a fault into the one event mapping both servers use: translating a
    recorded turn's end raises, as a bug there would -- after RUN_STARTED went out."""
    from cantrip._events import StepComplete
    from cantrip.protocols.agui._translate import Translator

    events = Translator.events

    def broken(self: Translator, event: Any) -> Any:
        if isinstance(event, StepComplete):
            raise RuntimeError("injected fault in the AG-UI mapping")
        return events(self, event)

    monkeypatch.setattr(Translator, "events", broken)


def told_the_fault(events: list[dict[str, Any]], caplog: pytest.LogCaptureFixture) -> None:
    """The stream ended with RUN_ERROR ``internal_error`` and the server logged the
    fault once, with its traceback."""
    assert types(events)[0] == "RUN_STARTED"
    assert events[-1]["type"] == "RUN_ERROR", types(events)
    assert events[-1]["code"] == "internal_error"
    assert "RuntimeError" in events[-1]["message"]
    assert "injected" not in events[-1]["message"], "the traceback stays in the log"
    logged = [r for r in caplog.records if r.name == "cantrip.agui" and r.levelname == "ERROR"]
    assert len(logged) == 1, [r.getMessage() for r in logged]
    assert "failed after it started" in logged[0].getMessage()
    assert logged[0].exc_info is not None
    assert "injected fault" in logging.Formatter().formatException(logged[0].exc_info)


async def test_a_fault_after_run_started_ends_with_run_error_and_a_log_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    break_step_complete(monkeypatch)
    caplog.set_level("INFO", logger="cantrip.agui")
    s = spell([{"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]}])
    async with serving(s) as base:
        answer, events = await agui(base, run_input("t-fault"))
    assert answer.status_code == 200
    told_the_fault(events, caplog)


def _depth(value: Any) -> int:
    """The reference: how deep ``value`` nests, by recursion (for small values only)."""
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(value=st.recursive(st.none() | st.integers(), lambda inner: (
    st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3)
), max_leaves=40), limit=st.integers(0, 12))  # fmt: skip
def test_the_depth_check_agrees_with_a_recursive_count(value: Any, limit: int) -> None:
    """``nests_deeper`` against the obvious recursive definition."""
    from cantrip.protocols.asgi._body import nests_deeper

    assert nests_deeper(value, limit) == (_depth(value) > limit)


def test_the_depth_check_takes_what_recursion_cannot() -> None:
    from cantrip.protocols.asgi._body import nests_deeper

    deep = nested(100_000)  # far past Python's recursion limit
    with pytest.raises(RecursionError):
        _depth(deep)
    assert nests_deeper(deep, 64) and nests_deeper(nested(65), 64)
    assert not nests_deeper(nested(64), 64)


async def test_a_call_agent_child_is_a_subagent_with_its_events_attributed() -> None:
    """A ``call_agent`` child (and its own child) is an AG-UI 1.0 sub-agent: announced
    with the delegation call it runs in, each of its events carrying its
    ``subagentRunId``, finished before its call's result; the run's own events carry
    none."""
    s = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(
            [
                {
                    "content": "delegating",
                    "tool_calls": [
                        {"gate": "call_agent", "args": {"intent": "ask around", "llm": "kid"}}
                    ],
                },
                {"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]},
            ]
        ),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done, call_agent], [cantrip.max_turns(5), cantrip.max_depth(2)]),
        loom=cantrip.Loom(),
    ).with_(
        llms={
            "kid": cantrip.ScriptedLLM(
                [
                    {
                        "thinking": "ask the grandkid",
                        "tool_calls": [
                            {"gate": "call_agent", "args": {"intent": "look", "llm": "grandkid"}}
                        ],
                    },
                    {"content": "kid's answer"},
                ]
            ),
            "grandkid": cantrip.ScriptedLLM([{"content": "grandkid's answer"}]),
        }
    )
    async with serving(s) as base:
        answer, events = await agui(base, run_input("t-subagents", "go"))
    assert answer.status_code == 200 and events[-1]["type"] == "RUN_FINISHED", types(events)
    calls = {e["toolCallId"]: e for e in events if e["type"] == "TOOL_CALL_START"}
    started = [e for e in events if e["type"] == "SUBAGENT_STARTED"]
    assert len(started) == 2
    kid, grandkid = (e["subagentRunId"] for e in started)
    assert calls[started[0]["parentToolCallId"]].get("subagentRunId") is None  # the run's call
    assert "parentSubagentRunId" not in started[0] and started[0]["description"] == "ask around"
    assert started[1]["parentSubagentRunId"] == kid
    assert calls[started[1]["parentToolCallId"]]["subagentRunId"] == kid  # the kid's call
    said = {
        who: "".join(
            e["delta"]
            for e in events
            if e["type"] == "TEXT_MESSAGE_CONTENT" and e.get("subagentRunId") == who
        )
        for who in (None, kid, grandkid)
    }
    assert said == {None: "delegatingok", kid: "kid's answer", grandkid: "grandkid's answer"}
    reasoning = [e for e in events if e["type"] == "REASONING_MESSAGE_CONTENT"]
    assert {e["subagentRunId"] for e in reasoning} == {kid}
    assert "".join(e["delta"] for e in reasoning) == "ask the grandkid"
    finished = {
        e["subagentRunId"]: i for i, e in enumerate(events) if e["type"] == "SUBAGENT_FINISHED"
    }
    assert set(finished) == {kid, grandkid}
    assert events[finished[kid]]["outcome"] == {"type": "success"}
    results = {e["toolCallId"]: i for i, e in enumerate(events) if e["type"] == "TOOL_CALL_RESULT"}
    assert finished[grandkid] < results[started[1]["parentToolCallId"]] < finished[kid]
    assert finished[kid] < results[started[0]["parentToolCallId"]]


def test_a_server_imports_the_protocols_off_the_loop_thread() -> None:
    """The AG-UI fuzz's flake, server half: a server mounted AG-UI, the viewer and A2A
    by importing them on the loop thread at start -- AG-UI's generated models alone held
    it 0.3-0.8 s (measured by sampling the loop thread's stack in the fuzz). In a fresh
    interpreter (nothing imported yet), no such module is imported on the loop thread
    while a server starts and answers a run."""
    code = textwrap.dedent(
        """
        import importlib.abc, json, sys, threading
        import httpx, trio, cantrip
        from cantrip.protocols.http._serve import serve_http

        PROTOCOLS = ("ag_ui", "cantrip.protocols.agui", "cantrip.protocols.viewer",
                     "cantrip.protocols.a2a._handler", "a2a")
        on_loop, in_loop = [], False

        class Spy(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if in_loop and name.startswith(PROTOCOLS) and (
                    threading.current_thread() is threading.main_thread()
                ):
                    on_loop.append(name)
                return None

        sys.meta_path.insert(0, Spy())
        from gates import done
        s = cantrip.Cantrip(
            llm=cantrip.ScriptedLLM([{"tool_calls": [{"gate": "done", "args": {"answer": 1}}]}]),
            identity=cantrip.Identity(),
            circle=cantrip.Circle([done], [cantrip.max_turns(2)]),
        )
        body = {"threadId": "t", "runId": "r", "messages": [
            {"id": "u", "role": "user", "content": "hi"}]}

        async def main():
            global in_loop
            in_loop = True
            async with trio.open_nursery() as nursery:
                base = (await nursery.start(serve_http, s, "127.0.0.1", 0))[0]
                async with httpx.AsyncClient(base_url=base) as http:
                    answer = await http.post("/agui", json=body)
                nursery.cancel_scope.cancel()
            assert answer.status_code == 200 and "RUN_FINISHED" in answer.text, answer.text

        trio.run(main)
        print(json.dumps(sorted(set(on_loop))))
        """
    )
    ran = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).parents[1],  # where ``gates`` is
    )
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout.splitlines()[-1]) == []


async def test_a_finished_run_says_success_and_its_usage_with_cached_tokens() -> None:
    """RUN_FINISHED names its outcome and carries the cast's tokens where 1.0 puts
    them: ``usage``, with the input tokens the provider read from its cache."""
    usage = {"prompt_tokens": 120, "completion_tokens": 7, "cached_tokens": 100}
    s = spell([{"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}], "usage": usage}])
    async with serving(s) as base:
        _, events = await agui(base, run_input("t-usage"))
    finished = events[-1]
    assert finished["outcome"] == {"type": "success"} and finished["result"] == "ok"
    assert finished["usage"] == [
        {"inputTokens": 120, "outputTokens": 7, "totalTokens": 127, "cachedInputTokens": 100}
    ]


async def test_a_megabyte_of_tools_or_messages_does_not_hold_the_loop() -> None:
    """Untrusted input is checked off the loop thread, in bounded work (the loop
    watch fails this module's tests for a step over 200 ms): 12,000 tools held it 4 s
    (a quadratic check of their names) -- now more than 128 are a 400 -- and 30,000
    messages ~0.2 s of validation, now in a worker thread (20,000 here: a megabyte's
    worth with the rest of the body)."""
    tools = [{"name": f"t{i}", "description": "d", "parameters": {}} for i in range(12_000)]
    messages = [{"id": str(i), "role": "assistant", "content": "x"} for i in range(20_000)]
    s = spell([{"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]}])
    async with serving(s) as base, httpx.AsyncClient(base_url=base, timeout=60) as http:
        many_tools = await http.post("/agui", json=run_input("t-tools", tools=tools))
        body = run_input("t-messages")
        body["messages"] = [*messages, *body["messages"]]
        answer, events = await agui(base, body)
    assert many_tools.status_code == 400
    assert "at most 128 tools" in many_tools.json()["error"]["message"]
    assert answer.status_code == 200 and events[-1]["type"] == "RUN_FINISHED"


async def test_a_run_a_guardrail_refuses_says_the_tokens_it_spent() -> None:
    """RUN_ERROR ``guardrail`` carries ``usage`` as RUN_FINISHED does (1.0 allows it on
    both): an output guardrail refuses an answer the model was paid to write."""
    usage = {"prompt_tokens": 90, "completion_tokens": 5, "cached_tokens": 60}
    s = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(
            [{"tool_calls": [{"gate": "done", "args": {"answer": "a bomb"}}], "usage": usage}]
        ),
        identity=cantrip.Identity(),
        circle=cantrip.Circle(
            [done],
            [cantrip.max_turns(3)],
            guardrails=[cantrip.guardrails.regex("bomb", on="output", blocking=True)],
        ),
        loom=cantrip.Loom(),
    )
    async with serving(s) as base:
        _, events = await agui(base, run_input("t-refused-usage"))
    ended = events[-1]
    assert ended["type"] == "RUN_ERROR" and ended["code"] == "guardrail", ended
    assert ended["usage"] == [
        {"inputTokens": 90, "outputTokens": 5, "totalTokens": 95, "cachedInputTokens": 60}
    ]


async def test_a_failed_cast_says_the_tokens_its_told_turns_spent() -> None:
    """A cast that fails (its provider refuses for good) ends the run with RUN_ERROR
    ``cast_failed``, carrying the tokens of the turns it recorded before it failed."""
    usage = {"prompt_tokens": 40, "completion_tokens": 3, "cached_tokens": 30}
    script = [
        {"tool_calls": [{"gate": "lookup", "args": {"city": "Oslo"}}], "usage": usage},
        {"error": {"message": "the provider says no", "status": 400}},
    ]
    async with serving(spell(script, gates=[lookup])) as base:
        _, events = await agui(base, run_input("t-failed-usage"))
    ended = events[-1]
    assert ended["type"] == "RUN_ERROR" and ended["code"] == "cast_failed", ended
    assert ended["usage"] == [
        {"inputTokens": 40, "outputTokens": 3, "totalTokens": 43, "cachedInputTokens": 30}
    ]
