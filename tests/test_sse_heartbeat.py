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

from collections.abc import AsyncIterator, Iterator
from typing import Any

import attrs
import httpx
import pytest
import trio
from test_agui import parse_sse, run_input, serving, spell

from cantrip.protocols.agui import _db as _db_agui
from cantrip.protocols.asgi import _responses as _asgi
from cantrip.protocols.sessions._tail import Beat


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


@attrs.define
class _Stream:
    said: list[str] = attrs.Factory(list)

    async def event(self, event: Any) -> None:
        self.said.append("event")

    async def idle(self) -> None:
        self.said.append("idle")


async def test_a_db_agui_run_sends_comments_between_quiet_looks(
    monkeypatch: pytest.MonkeyPatch, quick_heartbeat: float
) -> None:
    """On ``--db`` the run is told from the loom, a look at a time: a look that
    finds nothing after the heartbeat has passed sends a comment; looks right
    after a turn landed do not."""
    from cantrip.protocols.sessions._rows import Progress

    ended = Progress(state="done", outcome=None, base_pos=0)

    async def looks(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        yield Beat(None, heard=True, landed=False)  # at once: still within the heartbeat
        for _ in range(3):
            await trio.sleep(0.06)
            yield Beat(None, heard=False, landed=False)  # quiet past the heartbeat
        yield Beat(ended, heard=True, landed=True, last=True)

    monkeypatch.setattr(_db_agui, "follow", looks)
    stream = _Stream()
    replica: Any = type("Replica", (), {"_db_waiting": None})()
    row: Any = type("Row", (), {"entity_id": "e1"})()
    run = _db_agui.DbAguiRun(replica, row, None, stream)  # type: ignore[arg-type]
    assert await run._tell(1) is ended
    assert stream.said == ["idle", "idle", "idle"]
