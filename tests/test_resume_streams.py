"""Resumable streams in process (issue 44 item 1): an SSE client that drops after its
k-th event and reconnects with ``Last-Event-ID`` is told exactly the rest -- on
``/sessions/{id}/events`` and on a prompt's own stream (named again by its
Idempotency-Key); after a restart from the loom; past what is held, a ``reset``; a
slow watcher is dropped, never holding up the cast; a bad id is a 400. The
``--db`` side is in tests/test_serve_db.py (``test_*_resumes_*``); the seam's own
behaviour is in tests/test_session_backend_contract.py."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from test_http import SCRIPT, make_spell, serving

from cantrip.protocols.sessions import EventId, ProcessBackend, _positions, _session
from cantrip.protocols.sessions._hub import SessionHub

pytestmark = pytest.mark.loop_watch

Event = tuple[str | None, str, dict[str, Any]]
"""``(id, event, data)`` of one SSE event."""


async def read_events(
    response: httpx.Response, limit: int | None = None, until: str = "final_response"
) -> list[Event]:
    """The stream's events until ``limit`` of them (the client drops there) or one of
    kind ``until`` (a ``result``, ``dropped`` or ``error`` also ends it)."""
    told: list[Event] = []
    event_id: str | None = None
    name = "message"
    async for line in response.aiter_lines():
        if line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            told.append((event_id, name, json.loads(line[6:])))
            event_id, name = None, "message"
            if len(told) == limit or told[-1][1] in (until, "result", "dropped", "error"):
                break
    return told


@asynccontextmanager
async def events_of(
    http: httpx.AsyncClient, sid: str, after: str | None = None
) -> AsyncIterator[httpx.Response]:
    headers = {} if after is None else {"Last-Event-ID": after}
    async with http.stream("GET", f"/sessions/{sid}/events", headers=headers) as response:
        assert response.status_code == 200
        yield response


async def whole_session(http: httpx.AsyncClient, sid: str) -> list[Event]:
    async with events_of(http, sid, "0") as response:  # (never told: from the start)
        return await read_events(response)


SCRIPT_LONG: list[dict[str, Any]] = [
    {"content": "Looking.", "tool_calls": [{"gate": "echo", "args": {"text": "one"}}]},
    {"content": "Still.", "tool_calls": [{"gate": "echo", "args": {"text": "two"}}]},
    {"tool_calls": [{"gate": "done", "args": {"answer": "Found it."}}]},
]


async def test_an_events_client_that_drops_after_k_events_resumes_with_exactly_the_rest() -> None:
    """For every k: the client reads k events, hangs up, reconnects naming the k-th
    event's id, and the events after it are those it had not seen -- live ones (token
    deltas, tool calls) from the session's log, turns from the loom -- once each."""
    async with serving(make_spell(SCRIPT_LONG)) as http:
        sid = (await http.post("/sessions")).json()["session_id"]
        assert (await http.post(f"/sessions/{sid}/prompt", json={"prompt": "Go"})).is_success
        with trio.fail_after(30):
            whole = await whole_session(http, sid)
            ids = [e[0] for e in whole]
            assert None not in ids and len(set(ids)) == len(ids)
            assert {"text_delta", "tool_call", "step_complete", "final_response"} <= {
                e[1] for e in whole
            }
            for k in range(1, len(whole) + 1):
                async with events_of(http, sid, "0") as response:
                    part = await read_events(response, limit=k)
                last = part[-1][0]
                assert last is not None
                if k == len(whole):
                    break  # nothing after the last one yet
                async with events_of(http, sid, last) as response:
                    rest = await read_events(response)
                assert part + rest == whole, k


async def test_a_prompt_stream_resumed_by_its_key_and_last_event_id_tells_the_rest() -> None:
    """A streamed prompt's client drops after k events; sending the same prompt again
    with its Idempotency-Key and ``Last-Event-ID`` is told the rest of that prompt's
    events and its result -- the cast ran once."""
    spell = make_spell(SCRIPT_LONG)
    async with serving(spell) as http:
        sid = (await http.post("/sessions")).json()["session_id"]
        body = {"prompt": "Go"}
        key = {"Idempotency-Key": "resume-prompt-1", "Accept": "text/event-stream"}
        with trio.fail_after(30):
            async with http.stream(
                "POST", f"/sessions/{sid}/prompt", json=body, headers=key
            ) as response:
                whole = await read_events(response, until="result")
            told = [e for e in whole if e[0] is not None]
            assert whole[0][1] == "prompt" and whole[-1][1] == "result"
            for k in range(1, len(told)):
                last = told[k - 1][0]
                assert last is not None
                async with http.stream(
                    "POST",
                    f"/sessions/{sid}/prompt",
                    json=body,
                    headers={**key, "Last-Event-ID": last},
                ) as response:
                    again = await read_events(response, until="result")
                assert [e for e in again if e[0] is not None] == told[k:], k
                assert again[-1] == whole[-1]  # the same result, the cast ran once
    assert len(spell.loom.turns) == 3


async def test_events_resume_after_a_restart_from_the_loom(tmp_path: Path) -> None:
    """A server restarted on the same loom: a client resuming after a turn's event is
    told every recorded event after it; after a live event the new process never held,
    a ``reset`` first, naming the oldest it can resume from."""
    loom = tmp_path / "loom.db"
    async with serving(make_spell(SCRIPT_LONG, loom)) as http:
        sid = (await http.post("/sessions")).json()["session_id"]
        await http.post(f"/sessions/{sid}/prompt", json={"prompt": "Go"})
        with trio.fail_after(30):
            before = await whole_session(http, sid)
    recorded = [e for e in before if e[1] in ("step_complete", "final_response")]
    live = [e for e in before if e[1] == "text_delta"]
    async with serving(make_spell(SCRIPT_LONG, loom)) as http:
        with trio.fail_after(30):
            async with events_of(http, sid, recorded[0][0]) as response:
                after_turn = await read_events(response)
            async with events_of(http, sid, live[0][0]) as response:
                after_live = await read_events(response)
    assert after_turn[0][1] == "reset"  # the live events of the next turn are gone
    assert after_turn[1:] == recorded[1:]
    assert after_live[0][1] == "reset" and after_live[0][0] is None
    assert after_live[0][2]["after"] == live[0][0]
    assert after_live[1:] == [e for e in recorded if e[0] > live[0][0]]  # type: ignore[operator]


async def test_an_id_past_what_is_held_gets_a_reset_then_the_recorded_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The log holds the latest events only: resuming after a live one it let go of
    is told ``reset`` (the id asked for, the oldest held), then every event after it
    the session still has -- the recorded turns from the loom, the held live ones."""
    monkeypatch.setattr(_positions, "RESUMABLE_EVENTS", 4)
    async with serving(make_spell(SCRIPT_LONG)) as http:
        sid = (await http.post("/sessions")).json()["session_id"]
        await http.post(f"/sessions/{sid}/prompt", json={"prompt": "Go"})
        with trio.fail_after(30):
            async with events_of(http, sid, "0") as response:
                told = await read_events(response)
    reset = told[0]
    assert reset[1] == "reset" and reset[0] is None
    assert reset[2]["after"] == "0.-1" and "no longer held" in reset[2]["message"]
    steps = [e[2]["sequence"] for e in told if e[1] == "step_complete"]
    assert steps == [1, 2, 3] and told[-1][1] == "final_response"


async def test_a_bad_last_event_id_is_a_clear_400_and_nothing_runs() -> None:
    spell = make_spell(SCRIPT)
    async with serving(spell) as http:
        sid = (await http.post("/sessions")).json()["session_id"]
        hostile = ["x", "1.", ".1", "-1", "1.2.3", "9" * 40, "1e3", "1 .2", "\uff10", "1.-1"]
        for bad in hostile:
            for route in ("events", "prompt"):
                if route == "events":
                    answer = await http.get(
                        f"/sessions/{sid}/events", headers={"Last-Event-ID": bad.encode()}
                    )
                else:
                    answer = await http.post(
                        f"/sessions/{sid}/prompt",
                        json={"prompt": "Book it"},
                        headers={"Last-Event-ID": bad.encode()},
                    )
                assert answer.status_code == 400, (bad, route, answer.text)
                assert answer.json()["error"]["code"] == "bad_event_id"
        future = await http.get(f"/sessions/{sid}/events", params={"after": "7.0"})
        assert future.status_code == 400 and "7.0" in future.json()["error"]["message"]
    assert not spell.loom.turns  # nothing ran


async def test_a_slow_watcher_is_dropped_with_a_clear_event_and_never_holds_the_cast(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A watcher that stops reading while the session goes on: its buffer fills, the
    prompt still ends, the watcher reads what was buffered and is told ``dropped``
    with the last id it was sent -- and resuming after that id tells exactly the rest."""
    monkeypatch.setattr(_session, "WATCHER_BUFFER", 3)
    async with ProcessBackend.open(SessionHub(make_spell(SCRIPT_LONG))) as backend:
        info, _ = await backend.create()
        sid = info.session_id
        stalled = backend.follow(sid, 0)
        async with contextlib.aclosing(stalled):
            with trio.fail_after(30):
                submitted = await backend.submit(sid, "Go")
                first = await anext(stalled)  # subscribed; then it reads no more
                outcome = await backend.result(sid, submitted.prompt_id)
                assert outcome.cast is not None and outcome.cast.result == "Found it."
                late = [first] + [e async for e in stalled]  # ends by itself
        whole = backend.follow(sid, 0, until=submitted.prompt_id)
        async with contextlib.aclosing(whole):
            every = [e async for e in whole]
        dropped = late[-1]
        assert dropped.type == "dropped" and dropped.id is None
        assert dropped.data["last_event_id"] == str(late[-2].id)
        assert late[:-1] == every[: len(late) - 1]
        resumed = backend.follow(sid, late[-2].id or EventId(0, 0), until=submitted.prompt_id)
        async with contextlib.aclosing(resumed):
            rest = [e async for e in resumed]
        assert late[:-1] + rest == every
