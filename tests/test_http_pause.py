"""Pauses over HTTP: a prompt that meets a call needing a human returns ``paused``;
``GET /sessions/{id}/pending`` lists it; ``POST /sessions/{id}/pending/{pause_id}``
answers it and the same turn goes on; a second answer is a 409."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

import cantrip
from cantrip.protocols.http._serve import serve_http
from gates import done

pytestmark = pytest.mark.loop_watch  # nothing here may block the trio loop (issue 28)


def spell(counter: Path, loom: Path | None = None, *, skip: int = 0) -> cantrip.Cantrip:
    @cantrip.gate(requires_approval=True)
    def bump() -> int:
        """Count (a side effect to count)."""
        value = int(counter.read_text()) if counter.exists() else 0
        counter.write_text(str(value + 1))
        return value + 1

    script = [
        {"tool_calls": [{"gate": "bump", "args": {}}]},
        {"tool_calls": [{"gate": "done", "args": {"answer": "counted"}}]},
    ] * 3
    return cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(script[skip:]),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done, bump], [cantrip.max_turns(5)]),
        loom=cantrip.Loom() if loom is None else cantrip.Loom.open(loom),
    )


@asynccontextmanager
async def serving(s: cantrip.Cantrip) -> AsyncIterator[httpx.AsyncClient]:
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve_http(s, "127.0.0.1", 0, task_status=task_status)
        )
        async with httpx.AsyncClient(base_url=binds[0], timeout=20) as http:
            yield http
        nursery.cancel_scope.cancel()


async def paused_prompt(http: httpx.AsyncClient) -> tuple[str, dict[str, Any]]:
    sid = (await http.post("/sessions")).json()["session_id"]
    answer = await http.post(f"/sessions/{sid}/prompt", json={"prompt": "count once"})
    assert answer.status_code == 200
    return sid, answer.json()


async def test_a_paused_prompt_is_listed_and_an_approval_continues_it(tmp_path: Path) -> None:
    counter = tmp_path / "n"
    async with serving(spell(counter)) as http:
        sid, paused = await paused_prompt(http)
        assert paused["reason"] == "paused" and not paused["terminated"]
        (pause,) = paused["pending"]
        assert pause["gate"] == "bump" and pause["kind"] == "approval"
        assert not counter.exists()
        listed = (await http.get(f"/sessions/{sid}/pending")).json()
        assert [p["pause_id"] for p in listed["pending"]] == [pause["pause_id"]]
        url = f"/sessions/{sid}/pending/{pause['pause_id']}"
        answered = await http.post(url, json={"decision": "approve"})
        assert answered.status_code == 200, answered.text
        assert answered.json()["result"] == "counted" and answered.json()["terminated"]
        assert counter.read_text() == "1"
        again = await http.post(url, json={"decision": "approve"})
        assert again.status_code == 409 and again.json()["error"]["code"] == "pause_answered"
        assert counter.read_text() == "1", "the gate ran exactly once"
        assert (await http.get(f"/sessions/{sid}/pending")).json()["pending"] == []


async def test_deny_over_http_is_an_error_observation_and_the_cast_goes_on(
    tmp_path: Path,
) -> None:
    counter = tmp_path / "n"
    async with serving(spell(counter)) as http:
        sid, paused = await paused_prompt(http)
        pause_id = paused["pending"][0]["pause_id"]
        denied = await http.post(
            f"/sessions/{sid}/pending/{pause_id}", json={"decision": "deny", "reason": "no"}
        )
        assert denied.json()["result"] == "counted"
        assert not counter.exists()
        thread = (await http.get(f"/sessions/{sid}/thread")).json()["turns"]
        calls = [c for t in thread for c in t["gate_calls"] if c["gate"] == "bump"]
        assert calls[-1]["is_error"] and calls[-1]["result"] == "denied by the user: no"


async def test_bad_answers_are_400_and_unknown_pauses_409(tmp_path: Path) -> None:
    async with serving(spell(tmp_path / "n")) as http:
        sid, paused = await paused_prompt(http)
        url = f"/sessions/{sid}/pending/{paused['pending'][0]['pause_id']}"
        for body in ({"decision": "maybe"}, {"decision": "edit"}, {"decision": "answer"}):
            wrong = await http.post(url, json=body)
            assert wrong.status_code == 400, body
        unknown = await http.post(f"/sessions/{sid}/pending/pause-nope", json={"decision": "deny"})
        assert unknown.status_code == 409
        text_to_approval = await http.post(url, json={"decision": "answer", "text": "hi"})
        assert text_to_approval.status_code == 409


async def test_a_pause_survives_a_server_restart(tmp_path: Path) -> None:
    counter = tmp_path / "n"
    loom = tmp_path / "loom.db"
    first = spell(counter, loom)
    async with serving(first) as http:
        sid, paused = await paused_prompt(http)
    first.loom.close()
    # A new server process on the same loom: its LLM answers what follows the approval.
    second = spell(counter, loom, skip=1)
    async with serving(second) as http:
        listed = (await http.get(f"/sessions/{sid}/pending")).json()["pending"]
        assert [p["pause_id"] for p in listed] == [paused["pending"][0]["pause_id"]]
        answered = await http.post(
            f"/sessions/{sid}/pending/{listed[0]['pause_id']}", json={"decision": "approve"}
        )
        assert answered.json()["terminated"], answered.text
    second.loom.close()
    assert counter.read_text() == "1"


def held_in_its_gate() -> tuple[cantrip.Cantrip, trio.Event, trio.Event]:
    """A spell whose approved gate, once answered, waits (``entered`` set) until the
    test sets ``release``."""
    entered, release = trio.Event(), trio.Event()

    @cantrip.gate(requires_approval=True)
    async def bump() -> int:
        """Count (held until the test lets it go)."""
        entered.set()
        await release.wait()
        return 1

    held = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(
            [
                {"tool_calls": [{"gate": "bump", "args": {}}]},
                {"tool_calls": [{"gate": "done", "args": {"answer": "counted"}}]},
            ]
        ),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done, bump], [cantrip.max_turns(5)]),
        loom=cantrip.Loom(),
    )
    return held, entered, release


async def test_a_second_answer_while_the_first_is_carried_out_is_pause_answered() -> None:
    """Two answers to one pause at once: the second, while the first one's
    continuation runs (held in the approved gate), is ``409 pause_answered`` -- as
    under ``serve --db`` -- not ``busy``, which says to try again (issue 41, drift 6)."""
    held, entered, release = held_in_its_gate()
    async with serving(held) as http:
        sid, paused = await paused_prompt(http)
        url = f"/sessions/{sid}/pending/{paused['pending'][0]['pause_id']}"
        first: list[httpx.Response] = []

        async def answer() -> None:
            first.append(await http.post(url, json={"decision": "approve"}))

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(answer)
                await entered.wait()  # the first answer is being carried out
                again = await http.post(url, json={"decision": "approve"})
                release.set()
        assert again.status_code == 409 and again.json()["error"]["code"] == "pause_answered"
        assert first[0].status_code == 200 and first[0].json()["result"] == "counted"


async def test_a_cancel_cuts_off_an_answer_being_carried_out() -> None:
    """The continuation of an answered pause is the session's running prompt: a cancel
    (unnamed) cuts it off, recorded ``cancelled``, as under ``serve --db`` -- in
    process it had no current prompt and the cancel found nothing (issue 41, drift 5)."""
    held, entered, release = held_in_its_gate()
    async with serving(held) as http:
        sid, paused = await paused_prompt(http)
        url = f"/sessions/{sid}/pending/{paused['pending'][0]['pause_id']}"
        answered: list[httpx.Response] = []

        async def answer() -> None:
            answered.append(await http.post(url, json={"decision": "approve"}))

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(answer)
                await entered.wait()  # the answer is being carried out, in its gate
                cancel = await http.post(f"/sessions/{sid}/cancel")
        assert cancel.status_code == 200, cancel.text
        assert cancel.json()["cancelled"] and cancel.json()["target"] == "running"
        assert answered[0].status_code == 200, answered[0].text
        assert answered[0].json()["reason"] == "cancelled", answered[0].text
        assert not release.is_set()  # cut off in its gate, not let go
