"""AG-UI runs a client can resume (issue 44, item 3): every event of a run carries an
``id:`` (its place in the run), and a client that loses the stream and sends the same
``RunAgentInput`` again with ``Last-Event-ID`` gets every event after that one -- no
gap, no duplicate -- then the live ones. A client that asks for it (``?reconnect_s=``)
keeps its prompt through a hang-up that long. Every event is checked against the 1.0
schema (tests/agui_schema_check.py) and each stream by ``ag-ui-validate``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio
from ag_ui_validate.pytest_plugin import assert_valid_agui
from agui_schema_check import check_event
from test_agui import TLS, run_input, serving

import cantrip
from gates import done

pytestmark = pytest.mark.loop_watch

RELEASE: dict[str, trio.Event] = {}
"""Per thread: what the ``hold`` gate waits for (the test sets it)."""


@cantrip.gate()
async def hold(thread: str) -> str:
    """Waits until the test lets it go: the run is live while it waits."""
    await RELEASE[thread].wait()
    return f"held {thread}"


def cast(thread: str) -> list[dict[str, Any]]:
    return [
        {
            "content": "Looking it up for you now.",
            "thinking": "hold first",
            "tool_calls": [{"gate": "hold", "args": {"thread": thread}}],
        },
        {"content": "Done waiting.", "tool_calls": [{"gate": "done", "args": {"answer": "held"}}]},
    ]


THREADS = [f"t-resume-{k}" for k in range(40)]


def spell(*threads: str) -> cantrip.Cantrip:
    """Casts for runs on ``threads``, in that order."""
    script = [turn for thread in threads for turn in cast(thread)]
    return cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(script),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done, hold], [cantrip.max_turns(4)]),
        loom=cantrip.Loom(),
    )


Frame = tuple[int, dict[str, Any]]


@asynccontextmanager
async def run_stream(
    http: httpx.AsyncClient,
    body: dict[str, Any],
    last: int | None = None,
    reconnect_s: int = 30,
    headers: dict[str, str] | None = None,
) -> AsyncIterator[AsyncIterator[Frame]]:
    """A run's SSE stream, read frame by frame: (id, event), each event checked."""
    headers = {"accept": "text/event-stream", **(headers or {})}
    if last is not None:
        headers["last-event-id"] = str(last)
    async with http.stream(
        "POST", f"/agui?reconnect_s={reconnect_s}", json=body, headers=headers
    ) as answer:
        assert answer.status_code == 200

        async def frames() -> AsyncIterator[Frame]:
            event_id: int | None = None
            async for line in answer.aiter_lines():
                if line.startswith("id: "):
                    event_id = int(line[4:])
                elif line.startswith("data: "):
                    data = json.loads(line[6:])
                    check_event(data)
                    assert event_id is not None, f"an event without an id: {data}"
                    yield event_id, data
                    event_id = None

        yield frames()


async def take(frames: AsyncIterator[Frame], n: int) -> list[Frame]:
    got = []
    async for frame in frames:
        got.append(frame)
        if len(got) == n:
            break
    return got


async def rest(frames: AsyncIterator[Frame]) -> list[Frame]:
    return [frame async for frame in frames]


def shape(events: list[dict[str, Any]], thread: str) -> list[tuple[str, str]]:
    """What a run on ``thread`` said, without what differs from run to run (times, ids
    of its own, the thread's name in the gate's arguments)."""
    said = [(e["type"], str(e.get("delta") or e.get("content") or "")) for e in events]
    return [(kind, text.replace(thread, "T")) for kind, text in said]


async def test_a_client_dropped_after_k_events_resumes_with_no_gap_and_no_duplicate() -> None:
    """For every k before the cast waits on its gate: a client reads k events, hangs
    up, sends the run again with the last id it had, and reads the rest -- the events
    it missed (none twice), then the live ones once the gate is let go; the two halves
    are the run an unbroken client reads, and the cast ran once, to its end."""
    s = spell("t-reference", *THREADS)
    async with serving(s) as base, httpx.AsyncClient(base_url=base, timeout=30, verify=TLS) as http:
        RELEASE["t-reference"] = trio.Event()
        RELEASE["t-reference"].set()
        reference_body = run_input("t-reference", "wait for it")
        async with run_stream(http, reference_body) as frames:
            reference = await rest(frames)
        assert [i for i, _ in reference] == list(range(len(reference)))
        events = [e for _, e in reference]
        assert_valid_agui(events, max_warnings=0)
        before_gate = next(
            i for i, e in enumerate(events) if e["type"] == "TOOL_CALL_END"
        )  # the hold call's: the last event before the cast waits
        assert before_gate >= 5
        for k in range(1, before_gate + 1):
            thread = THREADS[k - 1]
            RELEASE[thread] = trio.Event()
            body = run_input(thread, "wait for it")
            async with run_stream(http, body) as frames:
                first = await take(frames, k)
            # hung up; the prompt waits for its client (reconnect_s); it comes back
            async with run_stream(http, body, last=first[-1][0]) as frames:
                (opening,) = await take(frames, 1)
                missed = await take(frames, before_gate + 1 - k)
                RELEASE[thread].set()  # what comes now is live
                live = await rest(frames)
            assert opening[0] == 0 and opening[1]["type"] == "RUN_STARTED"
            ids = [i for i, _ in first + missed + live]
            assert ids == list(range(len(reference))), (k, ids)
            told = [e for _, e in first + missed + live]
            assert shape(told, thread) == shape(events, "t-reference"), k
            assert_valid_agui(told, max_warnings=0)  # what the client holds: one whole run
            assert told[-1]["outcome"] == {"type": "success"} and told[-1]["result"] == "held"
            # a message split by the hang-up keeps its id across the two connections
            texts = {e["messageId"] for e in told if e["type"].startswith("TEXT_MESSAGE")}
            assert len(texts) == 3, texts  # each turn's text, and the final answer
        casts = [t for t in s.loom.turns if t.terminated]
        assert len(casts) == before_gate + 1, "each run cast once and ran to its end"


async def test_a_client_back_after_the_run_ended_gets_the_rest_and_its_end() -> None:
    s = spell(THREADS[0])
    async with serving(s) as base, httpx.AsyncClient(base_url=base, timeout=30, verify=TLS) as http:
        thread = THREADS[0]
        RELEASE[thread] = trio.Event()
        body = run_input(thread, "wait for it")
        async with run_stream(http, body) as frames:
            first = await take(frames, 3)
        RELEASE[thread].set()
        with trio.fail_after(20):  # the cast goes on without its client, to its end
            while not any(t.terminated for t in s.loom.turns):
                await trio.sleep(0.05)
        async with run_stream(http, body, last=first[-1][0]) as frames:
            later = await rest(frames)
    ids = [i for i, _ in first + later[1:]]
    assert later[0][0] == 0 and ids == list(range(len(ids)))
    assert later[-1][1]["type"] == "RUN_FINISHED" and later[-1][1]["result"] == "held"
    assert sum(t.terminated for t in s.loom.turns) == 1


async def test_without_reconnect_s_a_hang_up_still_cancels_at_once() -> None:
    s = spell(THREADS[0])
    async with serving(s) as base, httpx.AsyncClient(base_url=base, timeout=30, verify=TLS) as http:
        thread = THREADS[0]
        RELEASE[thread] = trio.Event()  # never set: only a cancel ends the cast
        async with run_stream(http, run_input(thread, "wait"), reconnect_s=0) as frames:
            await take(frames, 3)
        with trio.fail_after(20):  # cancelled at once: the gate never lets go
            while True:
                sessions = (await http.get("/sessions")).json()["sessions"]
                if sessions and not sessions[0]["running"]:
                    break
                await trio.sleep(0.05)
        thread_ = (await http.get(f"/sessions/{sessions[0]['session_id']}/thread")).json()
    assert thread_["turns"][-1]["reason"] == "cancelled"


@pytest.mark.parametrize(
    ("headers", "query", "code"),
    [
        ({"last-event-id": "1.2"}, "", "bad_event_id"),
        ({"last-event-id": "9" * 13}, "", "bad_event_id"),
        ({}, "?reconnect_s=-1", "bad_request"),
        ({}, "?reconnect_s=nan", "bad_request"),
        ({}, "?reconnect_s=301", "bad_request"),
    ],
)
async def test_a_bad_last_event_id_or_reconnect_s_is_a_400_before_anything_runs(
    headers: dict[str, str], query: str, code: str
) -> None:
    s = spell("t-bad")
    async with serving(s) as base, httpx.AsyncClient(base_url=base, verify=TLS) as http:
        answer = await http.post(f"/agui{query}", json=run_input("t-bad"), headers=headers)
    assert answer.status_code == 400 and answer.json()["error"]["code"] == code
    assert len(s.loom) == 0


async def test_a_client_that_does_not_come_back_has_its_cast_cancelled_after_the_grace() -> None:
    s = spell(THREADS[0], THREADS[1])
    async with serving(s) as base, httpx.AsyncClient(base_url=base, timeout=30, verify=TLS) as http:
        RELEASE[THREADS[0]] = trio.Event()  # never set: only a cancel ends the cast
        async with run_stream(http, run_input(THREADS[0], "wait"), reconnect_s=1) as frames:
            await take(frames, 3)
        with trio.fail_after(20):
            while True:
                sessions = (await http.get("/sessions")).json()["sessions"]
                if sessions and not sessions[0]["running"]:
                    break
                await trio.sleep(0.05)
        thread_ = (await http.get(f"/sessions/{sessions[0]['session_id']}/thread")).json()
    assert thread_["turns"][-1]["reason"] == "cancelled"


def test_both_streams_read_last_event_id_one_way_each_with_its_own_grammar() -> None:
    """One reader of the ``Last-Event-ID`` header (the last one sent, any case,
    stripped) serves a session's ``/events`` and an AG-UI run; each keeps its own
    id grammar: ``2.1`` is an event id to the first and a 400 to the second."""
    from cantrip.protocols.agui._run import reconnection
    from cantrip.protocols.asgi._requests import last_event_id
    from cantrip.protocols.asgi._responses import HttpError
    from cantrip.protocols.http._streams import resume_point
    from cantrip.protocols.sessions import EventId

    def scope(*values: bytes) -> dict[str, Any]:
        names = [b"Last-Event-ID", b"last-event-id"]
        return {"headers": [(names[i % 2], v) for i, v in enumerate(values)]}

    assert last_event_id({"headers": []}) is None
    assert last_event_id(scope(b"1", b" 7 ")) == "7"
    assert reconnection(scope(b"1", b" 7 ")) == (7, 0.0)
    assert resume_point(scope(b"1", b" 7 "), {}) == 7
    assert resume_point(scope(b"2.1"), {}) == EventId(2, 1)
    with pytest.raises(HttpError) as bad:
        reconnection(scope(b"2.1"))
    assert bad.value.code == "bad_event_id"


@cantrip.gate(requires_approval=True)
def launch(target: str) -> str:
    """Something a person must approve first."""
    return f"launched at {target}"


async def test_a_resume_whose_stream_was_lost_is_sent_again_and_follows_its_continuation() -> None:
    """A run answers an interrupt (``resume``); its client reads part of the stream,
    loses it and sends the same run again with ``Last-Event-ID``: the interrupt is
    answered already with that very answer, so the run follows the continuation the
    answer started -- every event after that id, then the live ones -- and the gate
    ran once. Without it the second send was ``bad_resume`` (AGUI-17)."""
    thread = "t-resume-again"
    script = [
        {"tool_calls": [{"gate": "launch", "args": {"target": "moon"}}]},
        {
            "content": "Launched; waiting.",
            "tool_calls": [{"gate": "hold", "args": {"thread": thread}}],
        },
        {"tool_calls": [{"gate": "done", "args": {"answer": "landed"}}]},
    ]
    s = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(script),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done, hold, launch], [cantrip.max_turns(5)]),
        loom=cantrip.Loom(),
    )
    RELEASE[thread] = trio.Event()
    async with serving(s) as base, httpx.AsyncClient(base_url=base, timeout=30, verify=TLS) as http:
        async with run_stream(http, run_input(thread, "launch it")) as frames:
            paused = await rest(frames)
        (interrupt,) = paused[-1][1]["outcome"]["interrupts"]
        resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": True}]
        body = run_input(thread, None, resume=resume)
        async with run_stream(http, body) as frames:
            first = []
            async for frame in frames:  # to the hold call's start: the cast waits there
                first.append(frame)
                if frame[1]["type"] == "TOOL_CALL_END":
                    break
        async with run_stream(http, body, last=first[-1][0]) as frames:
            (opening,) = await take(frames, 1)
            RELEASE[thread].set()
            later = await rest(frames)
    assert opening[0] == 0 and opening[1]["type"] == "RUN_STARTED"
    told = first + later
    assert [i for i, _ in told] == list(range(len(told)))
    events = [e for _, e in told]
    assert_valid_agui(events, max_warnings=0)
    assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["result"] == "landed"
    results = [e["content"] for e in events if e["type"] == "TOOL_CALL_RESULT"]
    assert results[0] == "launched at moon" and f"held {thread}" in results
    launched = [r for t in s.loom.turns for r in t.gate_calls if r.gate == "launch"]
    assert len(launched) == 1, "the gate ran once"


@cantrip.gate()
async def note(text: str) -> str:
    """Notes something down, once the test lets it go (``RELEASE[text]``)."""
    await RELEASE[text].wait()
    return f"noted {text}"


async def test_a_run_past_the_held_events_is_not_resumable_and_says_so() -> None:
    """In process a session holds its latest ``RESUMABLE_EVENTS`` (2,000) live events.
    A prompt that told more (here ~2,100 text deltas in one answer) can no longer be
    told again from its beginning, so a client resuming its run would get events at
    the wrong places: it is told so instead -- ``RUN_STARTED`` and ``RUN_ERROR``
    ``not_resumable`` after the id it has -- never a stream with a silent gap or
    duplicate. The live client read the whole run; the cast goes on to its end."""
    from cantrip.llm._scripted import STREAM_CHUNK
    from cantrip.protocols.sessions._positions import RESUMABLE_EVENTS

    thread = "t-resume-long"
    # in answers of 450 deltas, each ending in a call the test lets go once it has read
    # that far (the scripted model streams without a pause; a follower more than
    # WATCHER_BUFFER events behind would be dropped)
    answers, per_answer = 5, 450
    deltas = answers * per_answer
    assert deltas > RESUMABLE_EVENTS
    notes = [f"{thread}-{k}" for k in range(answers)]
    script = [
        *(
            {
                "content": "y" * (STREAM_CHUNK * per_answer),
                "tool_calls": [{"gate": "note", "args": {"text": text}}],
            }
            for text in notes
        ),
        {"tool_calls": [{"gate": "hold", "args": {"thread": thread}}]},
        {"tool_calls": [{"gate": "done", "args": {"answer": "long"}}]},
    ]
    s = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(script),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done, hold, note], [cantrip.max_turns(answers + 3)]),
        loom=cantrip.Loom(),
    )
    for name in (thread, *notes):
        RELEASE[name] = trio.Event()
    body = run_input(thread, "talk a lot")
    async with serving(s) as base, httpx.AsyncClient(base_url=base, timeout=60, verify=TLS) as http:
        first = []
        names: dict[str, str] = {}
        async with run_stream(http, body) as frames:
            async for frame in frames:  # to the hold call: the cast waits there
                first.append(frame)
                event = frame[1]
                if event["type"] == "TOOL_CALL_START":
                    names[event["toolCallId"]] = event["toolCallName"]
                if event["type"] != "TOOL_CALL_END":
                    continue
                if names[event["toolCallId"]] == "hold":
                    break
                RELEASE[notes[sum(n == "note" for n in names.values()) - 1]].set()
        contents = [e for _, e in first if e["type"] == "TEXT_MESSAGE_CONTENT"]
        assert len(contents) == deltas and len(first) > RESUMABLE_EVENTS
        async with run_stream(http, body, last=first[10][0]) as frames:
            again = await rest(frames)
        RELEASE[thread].set()
        with trio.fail_after(30):  # the cast goes on to its end
            while not any(t.terminated for t in s.loom.turns):
                await trio.sleep(0.05)
    assert [(i, e["type"]) for i, e in again] == [(0, "RUN_STARTED"), (11, "RUN_ERROR")]
    assert again[-1][1]["code"] == "not_resumable"
    assert "no longer held" in again[-1][1]["message"] or "gone" in again[-1][1]["message"]


async def test_a_run_whose_prompt_streams_faster_than_it_reads_tells_every_event() -> None:
    """The scripted model streams an answer without a pause: ~1,500 text deltas reach
    the session before the run's own follower reads one, more than a follower may have
    waiting (``WATCHER_BUFFER``), so the session lets that follower go (``dropped``).
    The run is the session's client here: it follows again from the last event it was
    given -- the session still holds them -- so its client reads every delta once, in
    order, and the run ends. Before, the run went on to the cast's end with the rest of
    the stream missing (a silent gap)."""
    from cantrip.llm._scripted import STREAM_CHUNK
    from cantrip.protocols.sessions._positions import RESUMABLE_EVENTS, WATCHER_BUFFER

    deltas = WATCHER_BUFFER + 500
    assert deltas < RESUMABLE_EVENTS
    text = "".join(chr(ord("a") + k % 26) for k in range(STREAM_CHUNK * deltas))
    thread = "t-fast"
    script = [  # first a call the test lets go once the run follows the prompt live
        {"tool_calls": [{"gate": "hold", "args": {"thread": thread}}]},
        {"content": text, "tool_calls": [{"gate": "done", "args": {"answer": "fast"}}]},
    ]
    s = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(script),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done, hold], [cantrip.max_turns(3)]),
        loom=cantrip.Loom(),
    )
    RELEASE[thread] = trio.Event()
    body = run_input(thread, "talk fast")
    async with serving(s) as base, httpx.AsyncClient(base_url=base, timeout=60, verify=TLS) as http:
        told = []
        with trio.fail_after(60):
            async with run_stream(http, body) as frames:
                async for frame in frames:
                    told.append(frame)
                    if frame[1]["type"] == "TOOL_CALL_END":
                        RELEASE[thread].set()  # the burst comes while the run follows
    ids = [i for i, _ in told]
    assert ids == list(range(len(told)))  # no gap, no duplicate
    events = [e for _, e in told]
    first = next(e["messageId"] for e in events if e["type"] == "TEXT_MESSAGE_START")
    contents = [
        e["delta"]
        for e in events
        if e["type"] == "TEXT_MESSAGE_CONTENT" and e["messageId"] == first
    ]
    assert len(contents) == deltas
    assert "".join(contents) == text
    assert events[-1]["type"] == "RUN_FINISHED"
    assert events[-1]["outcome"]["type"] == "success"
