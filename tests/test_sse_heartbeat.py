"""Event streams say something while nothing happens (``cantrip serve --heartbeat-s``).

A proxy or load balancer closes a connection that carries no bytes for its idle
timeout (often 60 s); a model thinking for a minute, or a long gate call, would cut
a client's stream there. Every stream of ``cantrip serve`` -- the HTTP API's events,
AG-UI runs, in-process and on ``--db`` -- sends an SSE comment (``: idle``) when it
has been quiet for the heartbeat; SSE readers skip comments, so clients see no
event. The interval is the ``--heartbeat-s`` option (default 15 s; a value that is no
positive number is refused: tests/test_bad_input.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import trio
from seam_llm import Holds
from session_double import DoubleBackend
from test_agui import parse_sse, run_input, serving, spell

from cantrip.protocols.agui._run import serve_agui
from cantrip.protocols.asgi import _responses as _asgi


@pytest.fixture
def quick_heartbeat() -> Iterator[float]:
    """A heartbeat of 50 ms for this test (the process's setting is put back after)."""
    before = _asgi.heartbeat_s()
    _asgi.set_heartbeat_s(0.05)
    yield 0.05
    _asgi.set_heartbeat_s(before)


async def test_a_quiet_agui_run_sends_comments_and_its_events_still_parse(
    quick_heartbeat: float,
) -> None:
    """The model takes 0.4 s to answer: the in-process AG-UI stream says ``: idle``
    meanwhile, and its events are the run's events, valid as before."""
    done_call = {"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}], "delay_ms": 400}
    s = spell([done_call])
    async with serving(s) as base, httpx.AsyncClient(base_url=base, timeout=20) as http:
        answer = await http.post(
            "/agui", json=run_input("t1"), headers={"accept": "text/event-stream"}
        )
    assert answer.status_code == 200
    assert answer.text.count(": idle\n\n") >= 3  # 0.4 s quiet, a comment each 50 ms
    events = parse_sse(answer.text)
    assert events[0]["type"] == "RUN_STARTED" and events[-1]["type"] == "RUN_FINISHED"


async def test_a_busy_agui_run_sends_no_comments() -> None:
    """At the default heartbeat a quick run carries events only."""
    s = spell([{"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]}])
    async with serving(s) as base, httpx.AsyncClient(base_url=base, timeout=20) as http:
        answer = await http.post(
            "/agui", json=run_input("t1"), headers={"accept": "text/event-stream"}
        )
    assert ": idle" not in answer.text
    assert parse_sse(answer.text)[-1]["type"] == "RUN_FINISHED"


async def test_an_agui_run_over_recorded_turns_sends_comments_while_its_follow_is_quiet(
    quick_heartbeat: float,
) -> None:
    """The one AG-UI run (:mod:`cantrip.protocols.agui._run`) over a backend that
    tells recorded turns only, as ``--db`` does (tests/session_double.py): while the
    cast is held in its last model call nothing lands, and the stream says ``: idle``;
    once it ends the run's events are well formed."""
    holds = Holds()
    bodies: list[bytes] = []
    quiet = trio.Event()

    async def send(message: dict[str, Any]) -> None:
        bodies.append(message.get("body", b""))
        if bodies.count(b": idle\n\n") >= 3:
            quiet.set()

    request = [{"type": "http.request", "body": json.dumps(run_input("t-quiet", "hold:quiet"))
                .encode(), "more_body": False}]  # fmt: skip

    async def receive() -> dict[str, Any]:
        if request:
            return request.pop()
        await trio.sleep_forever()
        raise AssertionError

    async with DoubleBackend.open(holds) as backend, trio.open_nursery() as nursery:
        nursery.start_soon(serve_agui, backend, receive, send)
        async with holds.holding("quiet"):  # the cast's last call waits here
            with trio.fail_after(10):
                await quiet.wait()
            assert not [
                e for e in parse_sse(b"".join(bodies).decode()) if e["type"].startswith("RUN_F")
            ]
    events = parse_sse(b"".join(bodies).decode())
    assert events[0]["type"] == "RUN_STARTED" and events[-1]["type"] == "RUN_FINISHED"
    assert events[-1]["result"] == "hold:quiet ok #1"
