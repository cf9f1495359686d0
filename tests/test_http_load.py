"""`cantrip serve` under load and at shutdown (issue 24).

Idempotency keys (recorded in the loom, so they survive a restart), the sticky
cancel, 503 with Retry-After, graceful drain on shutdown, cancel on client
hang-up -- each over real sockets, with hypercorn serving and httpx asking.
The casts wait on a :class:`GatedLLM` the test opens, so nothing is timed.
"""

from __future__ import annotations

import functools
import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

import cantrip
from cantrip._outcome import recorded_cast, result_dict
from cantrip.llm import Message, Response, ToolChoice, ToolDefinition
from cantrip.protocols.http._serve import serve_http
from cantrip.protocols.middleware._lifecycle import ServeOptions
from cantrip.protocols.sessions._hub import SessionError, SessionHub
from cantrip.protocols.sessions._idempotency import session_entity_id
from gates import done, echo

pytestmark = pytest.mark.loop_watch  # nothing here may block the trio loop (issue 28)

pytest.importorskip("hypercorn")


class GatedLLM:
    """Answers ``done`` with the intent once :attr:`release` is set; counts queries."""

    name = "gated"

    def __init__(self) -> None:
        self.release = trio.Event()
        self.waiting = 0
        self.queries = 0
        self.asked = trio.Event()

    async def query(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Response:
        self.queries += 1
        self.waiting += 1
        self.asked.set()
        try:
            await self.release.wait()
        finally:
            self.waiting -= 1
        intent = next(m.text() for m in reversed(messages) if m.role == "user")
        return Response(
            tool_calls=(cantrip.ToolCall(f"d{self.queries}", "done", {"answer": intent}),)
        )


def gated_spell(llm: GatedLLM, loom: Path | None = None) -> cantrip.Cantrip:
    return cantrip.Cantrip(
        llm=llm,
        identity=cantrip.Identity(system_prompt="load"),
        circle=cantrip.Circle([done], [cantrip.max_turns(3)]),
        loom=cantrip.Loom.open(loom) if loom is not None else cantrip.Loom(),
    )


@asynccontextmanager
async def serving(
    spell: cantrip.Cantrip,
    options: ServeOptions | None = None,
    shutdown: trio.Event | None = None,
) -> AsyncIterator[httpx.AsyncClient]:
    async with trio.open_nursery() as nursery:
        trigger = shutdown.wait if shutdown is not None else None
        binds = await nursery.start(
            lambda task_status: serve_http(
                spell,
                "127.0.0.1",
                0,
                shutdown_trigger=trigger,
                options=options,
                task_status=task_status,
            )
        )
        async with httpx.AsyncClient(base_url=binds[0], timeout=20) as client:
            yield client
        if shutdown is None:
            nursery.cancel_scope.cancel()


async def new_session(http: httpx.AsyncClient) -> str:
    return str((await http.post("/sessions")).json()["session_id"])


async def wait_until(predicate: Any, within_s: float = 30.0) -> None:
    with trio.fail_after(within_s):
        while not predicate():
            await trio.sleep(0.005)


# -- idempotency -------------------------------------------------------------------------


async def test_a_repeated_idempotency_key_returns_the_recorded_result_without_casting(
    tmp_path: Path,
) -> None:
    llm = GatedLLM()
    llm.release.set()
    spell = gated_spell(llm, tmp_path / "keys.db")
    key = {"Idempotency-Key": "order-7"}
    async with serving(spell) as http:
        sid = await new_session(http)
        first = await http.post(f"/sessions/{sid}/prompt", json={"prompt": "book"}, headers=key)
        again = await http.post(f"/sessions/{sid}/prompt", json={"prompt": "book"}, headers=key)
        assert first.status_code == again.status_code == 200
        assert again.json() == first.json() and first.json()["result"] == "book"
        assert llm.queries == 1 and len(spell.loom) == 1
        # the key is in the loom, on the cast's first turn
        assert spell.loom.turns[0].extras["idempotency_key"] == "order-7"
        # the same key for another prompt is a client mistake, and changes nothing
        other = await http.post(f"/sessions/{sid}/prompt", json={"prompt": "sell"}, headers=key)
        assert other.status_code == 422 and other.json()["error"]["code"] == "key_reused"
        async with http.stream(
            "POST", f"/sessions/{sid}/prompt?stream=1", json={"prompt": "sell"}, headers=key
        ) as streamed:
            assert streamed.status_code == 422
        replay_stream = await http.post(
            f"/sessions/{sid}/prompt?stream=1", json={"prompt": "book"}, headers=key
        )
        assert "event: result" in replay_stream.text and '"result": "book"' in replay_stream.text
        bad = await http.post(
            f"/sessions/{sid}/prompt", json={"prompt": "x"}, headers={"Idempotency-Key": "k" * 256}
        )
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_idempotency_key"
        assert llm.queries == 1 and len(spell.loom) == 1
    spell.loom.close()

    # A restart: a new process on the same loom file still knows the key.
    fresh = GatedLLM()
    restarted = gated_spell(fresh, tmp_path / "keys.db")
    async with serving(restarted) as http:
        replayed = await http.post(f"/sessions/{sid}/prompt", json={"prompt": "book"}, headers=key)
        assert replayed.status_code == 200
        assert {k: v for k, v in replayed.json().items()} == first.json()
    assert fresh.queries == 0 and len(restarted.loom) == 1
    restarted.loom.close()


async def test_a_repeat_while_the_cast_runs_joins_it() -> None:
    llm = GatedLLM()
    hub = SessionHub(gated_spell(llm))
    session = hub.new()
    outcomes: list[cantrip.CastResult | None] = []

    async def ask() -> None:
        outcomes.append(await hub.prompt(session, "once", key="join-me"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask)
        await llm.asked.wait()
        nursery.start_soon(ask)  # the retry of a client that lost its connection
        await trio.testing.wait_all_tasks_blocked()
        assert session.current is not None and llm.waiting == 1
        with pytest.raises(SessionError, match="already running"):
            await hub.prompt(session, "another")  # a different prompt is still refused
        with pytest.raises(SessionError, match="different prompt"):
            await hub.prompt(session, "changed", key="join-me")
        llm.release.set()
    assert len(outcomes) == 2 and outcomes[0] is outcomes[1]
    assert outcomes[0] is not None and outcomes[0].result == "once"
    assert llm.queries == 1 and len(hub.spell.loom) == 1
    await hub.aclose()


async def test_session_creation_with_a_key_names_the_same_session_after_a_restart(
    tmp_path: Path,
) -> None:
    llm = GatedLLM()
    llm.release.set()
    spell = gated_spell(llm, tmp_path / "sessions.db")
    key = {"Idempotency-Key": "client-42-session"}
    async with serving(spell) as http:
        created = await http.post("/sessions", headers=key)
        repeated = await http.post("/sessions", headers=key)
        other = await http.post("/sessions", headers={"Idempotency-Key": "someone-else"})
    assert (created.status_code, repeated.status_code, other.status_code) == (201, 201, 201)
    assert repeated.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in created.headers
    sid = created.json()["session_id"]
    assert repeated.json()["session_id"] == sid != other.json()["session_id"]
    assert created.json()["entity_id"] == session_entity_id("client-42-session")
    assert len(spell.loom.entities) == 2
    spell.loom.close()

    restarted = gated_spell(GatedLLM(), tmp_path / "sessions.db")
    async with serving(restarted) as http:
        again = await http.post("/sessions", headers=key)
    assert again.status_code == 201 and again.json()["session_id"] == sid
    assert again.headers["idempotent-replayed"] == "true"
    assert len(restarted.loom.entities) == 2
    restarted.loom.close()


# -- cancels target a prompt (issue 29) ---------------------------------------------------


async def test_a_cancel_with_nothing_running_cancels_nothing_and_says_so() -> None:
    """The old sticky cancel cut off whichever prompt came next: a cancel that arrived
    just after its prompt ended stopped an unrelated one. Now it says it found nothing."""
    llm = GatedLLM()
    llm.release.set()
    spell = gated_spell(llm)
    async with serving(spell) as http:
        sid = await new_session(http)
        late = await http.post(f"/sessions/{sid}/cancel")
        assert late.json() == {"cancelled": False, "target": "none"}
        ok = await http.post(f"/sessions/{sid}/prompt", json={"prompt": "runs"})
    assert ok.json()["result"] == "runs" and ok.json()["reason"] == "done"
    assert [(t.intent, t.reason) for t in spell.loom.turns] == [("runs", "done")]


async def test_a_cancel_asked_for_the_next_prompt_applies_to_it_and_records_nothing() -> None:
    """The prompt it cuts off is cancelled before its first turn, with nothing recorded:
    its intent never reaches the loom, nor the next prompt's model -- as under ``serve
    --db`` (issue 41, drift 7: in process it was recorded as a cancelled turn)."""
    llm = GatedLLM()
    llm.release.set()
    spell = gated_spell(llm)
    async with serving(spell) as http:
        sid = await new_session(http)
        early = await http.post(f"/sessions/{sid}/cancel", json={"next": True})
        assert early.json() == {"cancelled": False, "target": "next", "sticky_s": 5.0}
        cut = await http.post(f"/sessions/{sid}/prompt", json={"prompt": "too late"})
        assert cut.json()["reason"] == "cancelled" and cut.json()["stop_reason"] == "cancelled"
        # taken once: the next prompt runs
        ok = await http.post(f"/sessions/{sid}/prompt", json={"prompt": "go"})
        assert ok.json()["result"] == "go"
        both = await http.post(
            f"/sessions/{sid}/cancel", json={"next": True, "idempotency_key": "k"}
        )
        assert both.status_code == 400 and both.json()["error"]["code"] == "bad_request"
    assert cut.json()["turns"] == 0
    assert cut.json()["summary"] == "cancelled before the first turn"
    assert llm.queries == 1  # the cancelled prompt never reached the LLM
    assert [(t.intent, t.reason) for t in spell.loom.turns] == [("go", "done")]


async def test_a_cancel_names_its_prompt_and_never_cuts_off_another() -> None:
    """By Prompt-Id or Idempotency-Key: the named prompt while it runs; once it has
    ended, nothing -- not the prompt running now."""
    llm = GatedLLM()
    spell = gated_spell(llm)
    async with serving(spell) as http:
        sid = await new_session(http)
        answers: dict[str, httpx.Response] = {}

        async def prompt(name: str, key: str) -> None:
            answers[name] = await http.post(
                f"/sessions/{sid}/prompt", json={"prompt": name}, headers={"Idempotency-Key": key}
            )

        llm.release.set()
        await prompt("first", "k1")
        first_id = answers["first"].headers["prompt-id"]
        assert answers["first"].json()["prompt_id"] == first_id
        llm.release = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(prompt, "second", "k2")
            await wait_until(lambda: llm.waiting == 1)
            by_key = await http.post(f"/sessions/{sid}/cancel", json={"idempotency_key": "k1"})
            by_id = await http.post(f"/sessions/{sid}/cancel", json={"prompt_id": first_id})
            unknown = await http.post(f"/sessions/{sid}/cancel", json={"prompt_id": "prompt-0"})
            assert by_key.json() == {"cancelled": False, "target": "ended", "idempotency_key": "k1"}
            # ended, not "none": the client reads its result (SPEC, "A cancel targets a prompt")
            assert by_id.json() == {"cancelled": False, "target": "ended", "prompt_id": first_id}
            assert unknown.json()["target"] == "none"
            llm.release.set()
        assert answers["second"].json()["result"] == "second"  # untouched

        llm.release = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(prompt, "third", "k3")
            await wait_until(lambda: llm.waiting == 1)
            hit = await http.post(f"/sessions/{sid}/cancel", json={"idempotency_key": "k3"})
        assert hit.json()["target"] == "running" and hit.json()["intent"] == "third"
        assert answers["third"].json()["reason"] == "cancelled"
        assert answers["third"].json()["prompt_id"] == hit.json()["prompt_id"]
    assert [(t.intent, t.reason) for t in spell.loom.turns] == [
        ("first", "done"),
        ("second", "done"),
        ("third", "cancelled"),
    ]


async def test_a_cancel_that_overtakes_its_keyed_prompt_waits_for_that_key_only() -> None:
    llm = GatedLLM()
    llm.release.set()
    spell = gated_spell(llm)
    async with serving(spell) as http:
        sid = await new_session(http)
        armed = await http.post(f"/sessions/{sid}/cancel", json={"idempotency_key": "late"})
        assert armed.json() == {
            "cancelled": False,
            "target": "next",
            "idempotency_key": "late",
            "sticky_s": 5.0,
        }
        other = await http.post(
            f"/sessions/{sid}/prompt", json={"prompt": "other"}, headers={"Idempotency-Key": "x"}
        )
        plain = await http.post(f"/sessions/{sid}/prompt", json={"prompt": "plain"})
        named = await http.post(
            f"/sessions/{sid}/prompt", json={"prompt": "late"}, headers={"Idempotency-Key": "late"}
        )
    assert other.json()["reason"] == plain.json()["reason"] == "done"
    assert named.json()["reason"] == "cancelled"


async def test_a_cancel_while_the_prompt_body_arrives_cancels_that_prompt() -> None:
    llm = GatedLLM()
    llm.release.set()
    spell = gated_spell(llm)
    cancelled = trio.Event()
    answers: dict[str, Any] = {}
    async with serving(spell) as http:
        sid = await new_session(http)
        side = httpx.AsyncClient(base_url=str(http.base_url), timeout=20)

        async def body() -> AsyncIterator[bytes]:
            yield b'{"prompt": '
            await cancelled.wait()
            yield b'"slow body"}'

        async def prompt() -> None:
            answer = await http.post(
                f"/sessions/{sid}/prompt",
                content=body(),
                headers={"content-type": "application/json", "Idempotency-Key": "slow"},
            )
            answers["prompt"] = answer

        async with side, trio.open_nursery() as nursery:
            nursery.start_soon(prompt)
            with trio.fail_after(60):
                while True:  # until the server has the request and waits for its body
                    info = (await side.get(f"/sessions/{sid}")).json()
                    answer = (await side.post(f"/sessions/{sid}/cancel")).json()
                    if answer["target"] == "starting":
                        break
                    assert answer == {"cancelled": False, "target": "none"}
                    await trio.sleep(0.005)
            answers["cancel"] = answer
            cancelled.set()
    assert info["running"] is False
    assert answers["cancel"] == {
        "cancelled": True,
        "target": "starting",
        "prompt_id": answers["prompt"].headers["prompt-id"],
        "intent": None,  # not read yet
        "idempotency_key": "slow",
    }
    assert answers["prompt"].json()["reason"] == "cancelled"
    assert llm.queries == 0


async def test_a_cancel_of_the_next_prompt_expires_after_its_window() -> None:
    """A real window (1.5 s): a prompt inside it is cut off, one after it runs -- for a
    cancel of the next prompt and for one armed for an Idempotency-Key alike."""
    llm = GatedLLM()
    llm.release.set()
    spell = gated_spell(llm)
    window = 1.5
    async with serving(spell, ServeOptions(sticky_cancel_s=window)) as http:
        sid = await new_session(http)
        keyed = {"Idempotency-Key": "k"}
        outcomes = []
        for ask, headers in (({"next": True}, {}), ({"idempotency_key": "k"}, keyed)):
            armed_at = trio.current_time()
            armed = await http.post(f"/sessions/{sid}/cancel", json=ask)
            assert armed.json()["target"] == "next" and armed.json()["sticky_s"] == window
            inside = await http.post(
                f"/sessions/{sid}/prompt", json={"prompt": "in"}, headers=headers
            )
            assert trio.current_time() - armed_at < window  # it did arrive in the window
            again = await http.post(f"/sessions/{sid}/cancel", json=ask)
            assert again.json()["target"] == ("next" if "next" in ask else "ended")
            await trio.sleep(window + 0.3)
            after = await http.post(f"/sessions/{sid}/prompt", json={"prompt": "after"})
            outcomes.append((inside.json()["reason"], after.json()["reason"]))
    assert outcomes == [("cancelled", "done"), ("cancelled", "done")]


class JitteryLLM:
    """Answers ``done`` with the intent after 0-40 ms (seeded): prompts end at
    uneven moments, as under real load."""

    name = "jittery"

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)

    async def query(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Response:
        await trio.sleep(self.random.uniform(0, 0.04))
        intent = next(m.text() for m in reversed(messages) if m.role == "user")
        return Response(tool_calls=(cantrip.ToolCall("d", "done", {"answer": intent}),))


async def test_stale_cancels_under_mixed_load_never_cut_off_an_untargeted_prompt() -> None:
    """Sessions prompting back to back -- streams cancelled by their Prompt-Id, keyed
    prompts by their key, plain prompts never -- with each cancel sent 0-60 ms after
    its prompt and not waited for: many arrive after their prompt ended, while the
    next one runs. A cancel cuts off only the prompt it names (issue 29: the sticky
    cancel stopped 206 plain prompts this way)."""
    pick = random.Random(29)
    spell = cantrip.Cantrip(
        llm=JitteryLLM(29),
        identity=cantrip.Identity(system_prompt="load"),
        circle=cantrip.Circle([done], [cantrip.max_turns(3)]),
    )
    ended: list[tuple[str, str]] = []  # (kind, reason)

    async with serving(spell) as http:

        async def cancel_later(sid: str, delay: float, body: dict[str, Any]) -> None:
            await trio.sleep(delay)
            answer = await http.post(f"/sessions/{sid}/cancel", json=body)
            assert answer.status_code == 200

        async def client(n: int, nursery: trio.Nursery) -> None:
            sid = await new_session(http)
            for i in range(24):
                kind = pick.choice(["stream", "keyed", "plain", "plain"])
                delay = pick.uniform(0, 0.06)
                if kind == "stream":
                    async with http.stream(
                        "POST", f"/sessions/{sid}/prompt?stream=1", json={"prompt": f"s{i}"}
                    ) as response:
                        named = response.headers.get("prompt-id")  # (none before issue 29)
                        body = {"prompt_id": named} if named else {}
                        nursery.start_soon(cancel_later, sid, delay, body)
                        lines = [line async for line in response.aiter_lines()]
                    result = json.loads(lines[lines.index("event: result") + 1][6:])
                elif kind == "keyed":
                    key = f"c{n}-{i}"
                    nursery.start_soon(cancel_later, sid, delay, {"idempotency_key": key})
                    answer = await http.post(
                        f"/sessions/{sid}/prompt",
                        json={"prompt": f"k{i}"},
                        headers={"Idempotency-Key": key},
                    )
                    result = answer.json()
                else:
                    answer = await http.post(f"/sessions/{sid}/prompt", json={"prompt": f"p{i}"})
                    result = answer.json()
                ended.append((kind, result["reason"]))

        with trio.fail_after(240):
            async with trio.open_nursery() as cancels, trio.open_nursery() as clients:
                for n in range(8):
                    clients.start_soon(client, n, cancels)

    plain = [reason for kind, reason in ended if kind == "plain"]
    targeted = [reason for kind, reason in ended if kind != "plain"]
    assert len(ended) == 8 * 24 and plain
    assert set(plain) == {"done"}, f"{plain.count('cancelled')} plain prompts were cut off"
    assert "cancelled" in targeted  # the cancels did land on the prompts they named


# -- load --------------------------------------------------------------------------------


async def test_beyond_max_running_a_prompt_gets_503_with_retry_after() -> None:
    llm = GatedLLM()
    spell = gated_spell(llm)
    async with serving(spell, ServeOptions(max_running=1, retry_after_s=3)) as http:
        first, second = await new_session(http), await new_session(http)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                functools.partial(http.post, f"/sessions/{first}/prompt", json={"prompt": "a"})
            )
            await llm.asked.wait()
            refused = await http.post(f"/sessions/{second}/prompt", json={"prompt": "b"})
            llm.release.set()
        assert refused.status_code == 503 and refused.headers["retry-after"] == "3"
        assert refused.json()["error"]["code"] == "overloaded"
        ok = await http.post(f"/sessions/{second}/prompt", json={"prompt": "b"})
        assert ok.json()["result"] == "b"
    assert [t.intent for t in spell.loom.turns] == ["a", "b"]


async def test_concurrent_sessions_on_a_shared_scripted_llm_each_run_their_turns() -> None:
    """Issue 24 (1), inside serve: concurrent casts used to get each other's answers."""
    n = 20
    script: list[dict[str, Any]] = [
        {"tool_calls": [{"gate": "echo", "args": {"text": f"entry {i}"}}], "delay_ms": 20}
        for i in range(2 * n)
    ]
    spell = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(script),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done, echo], [cantrip.max_turns(2)]),
    )
    results: list[dict[str, Any]] = []
    async with serving(spell) as http:
        sids = [await new_session(http) for _ in range(n)]
        async with trio.open_nursery() as nursery:
            for sid in sids:
                await nursery.start(_prompt_started, http, sid, results)
    assert [r["turns"] for r in results] == [2] * n
    # every script entry answered exactly one query: nobody got another's answer
    echoed = sorted(t.gate_calls[0].result for t in spell.loom.turns)
    assert echoed == sorted(f"entry {i}" for i in range(2 * n))


async def _prompt_started(
    http: httpx.AsyncClient,
    sid: str,
    results: list[dict[str, Any]],
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    task_status.started()
    results.append((await http.post(f"/sessions/{sid}/prompt", json={"prompt": "go"})).json())


# -- shutdown ----------------------------------------------------------------------------


async def test_shutdown_lets_running_casts_finish_within_grace_and_refuses_new_work() -> None:
    llm = GatedLLM()
    spell = gated_spell(llm)
    stop = trio.Event()
    answers: list[httpx.Response] = []
    async with serving(spell, ServeOptions(grace_s=60), shutdown=stop) as http:
        sid, other = await new_session(http), await new_session(http)
        async with trio.open_nursery() as nursery:

            async def ask() -> None:
                answers.append(await http.post(f"/sessions/{sid}/prompt", json={"prompt": "a"}))

            nursery.start_soon(ask)
            await llm.asked.wait()
            stop.set()
            refused = await http.post(f"/sessions/{other}/prompt", json={"prompt": "b"})
            health = await http.get("/health")
            llm.release.set()  # the running cast finishes inside its grace period
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "shutting_down"
    assert health.status_code == 503
    assert answers[0].status_code == 200 and answers[0].json()["result"] == "a"
    assert [(t.intent, t.reason) for t in spell.loom.turns] == [("a", "done")]


async def test_after_the_grace_period_casts_are_cut_off_with_reason_shutdown() -> None:
    llm = GatedLLM()
    spell = gated_spell(llm)
    stop = trio.Event()
    answers: list[httpx.Response] = []
    events: list[str] = []
    async with serving(spell, ServeOptions(grace_s=0), shutdown=stop) as http:
        sid, watched = await new_session(http), await new_session(http)
        subscribed = trio.Event()
        async with trio.open_nursery() as nursery:

            async def ask() -> None:
                answers.append(await http.post(f"/sessions/{sid}/prompt", json={"prompt": "a"}))

            async def listen() -> None:
                async with http.stream("GET", f"/sessions/{watched}/events") as stream:
                    async for line in stream.aiter_lines():
                        if line.startswith(": subscribed"):
                            subscribed.set()
                        events.append(line)

            nursery.start_soon(listen)
            await subscribed.wait()
            nursery.start_soon(ask)
            await llm.asked.wait()
            stop.set()
    assert answers[0].status_code == 200
    body = answers[0].json()
    assert (body["reason"], body["stop_reason"], body["truncated"]) == (
        "shutdown",
        "cancelled",
        True,
    )
    assert "event: shutdown" in events  # the event stream was told, then ended
    assert [(t.intent, t.reason) for t in spell.loom.turns] == [("a", "shutdown")]


# -- client hang-up ----------------------------------------------------------------------


@pytest.mark.parametrize("cancel_on_disconnect", [True, False])
async def test_a_streamed_prompt_whose_client_hangs_up(cancel_on_disconnect: bool) -> None:
    llm = GatedLLM()
    spell = gated_spell(llm)
    async with serving(spell) as http:
        sid = await new_session(http)
        flag = "&cancel_on_disconnect=1" if cancel_on_disconnect else ""
        async with http.stream(
            "POST", f"/sessions/{sid}/prompt?stream=1{flag}", json={"prompt": "a"}
        ) as stream:
            async for line in stream.aiter_lines():
                if line.startswith("event: step_start"):
                    break
        # the client has gone
        if cancel_on_disconnect:
            await wait_until(lambda: spell.loom.turns)
            assert spell.loom.turns[0].reason == "cancelled"
        else:
            await llm.asked.wait()
            llm.release.set()  # the cast runs on, unobserved, to its end in the loom
            await wait_until(lambda: spell.loom.turns)
            assert spell.loom.turns[0].reason == "done"
        info = (await http.get(f"/sessions/{sid}")).json()
    assert info["turns"] == 1


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_a_plain_prompt_whose_client_hangs_up_lets_its_connection_go_at_once() -> None:
    """hypercorn closes a connection when its request's task ends: a request that held
    its cast kept the socket for as long as the cast ran. The cast now runs in the
    server's nursery; the request ends at the hang-up, the cast runs on, recorded."""
    llm = GatedLLM()
    spell = gated_spell(llm)
    async with serving(spell) as http:
        sid = await new_session(http)
        before = _open_fds()
        async with httpx.AsyncClient(base_url=str(http.base_url), timeout=20) as client:
            with trio.move_on_after(60):  # (the hang-up below comes first)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(
                        functools.partial(
                            client.post, f"/sessions/{sid}/prompt", json={"prompt": "bye"}
                        )
                    )
                    await llm.asked.wait()
                    nursery.cancel_scope.cancel()  # hang up while the cast runs
        with trio.fail_after(20):
            while _open_fds() > before:  # the server's end of the socket is closed...
                await trio.sleep(0.01)
        assert llm.waiting == 1  # ...while the cast still runs
        llm.release.set()
        await wait_until(lambda: spell.loom.turns)
        info = (await http.get(f"/sessions/{sid}")).json()
    assert spell.loom.turns[0].reason == "done" and info["turns"] == 1


# -- the entity underneath ---------------------------------------------------------------


async def test_entity_sticky_cancel_tags_and_withdrawal(autojump_clock: Any) -> None:
    spell = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM([{"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]}]),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done], [cantrip.max_turns(2)]),
    )
    entity = spell.summon()
    assert entity.cancel("shutdown", next_cast=True) is False
    cut = await entity.send("first", tags={"idempotency_key": "k1"})
    assert (cut.reason, cut.truncated) == ("shutdown", True)
    assert entity.cancel(next_cast=True) is False and entity.uncancel() is True
    ok = await entity.send("second")
    assert ok.result == "ok"
    first, second = spell.loom.turns
    assert first.extras["idempotency_key"] == "k1" and "idempotency_key" not in second.extras
    assert json.loads(json.dumps(first.to_dict()))["extras"] == {"idempotency_key": "k1"}


# -- the commands, stopped by signals ----------------------------------------------------

CANTRIP = str(Path(sys.executable).with_name("cantrip"))
SLOW_SPEC = """
[llm]
provider = "scripted"
responses = [
  { tool_calls = [{ gate = "echo", args = { text = "first step" } }] },
  { content = "thinking for a long time", delay_ms = 600000 },
]
[circle]
medium = "conversation"
gates = ["done", "echo"]
wards = [{ max_turns = 4 }]
[loom]
path = "slow.db"
"""


def recorded(path: Path) -> list[cantrip.Turn]:
    loom = cantrip.Loom.open(path)
    try:
        return list(loom.turns)
    finally:
        loom.close()


async def wait_for_turns(path: Path, n: int) -> None:
    with trio.fail_after(30):
        while len(recorded(path)) < n:
            await trio.sleep(0.02)


async def started(process: trio.Process) -> str:
    """The URL `cantrip serve` prints on stderr once it listens."""
    assert process.stderr is not None
    seen = b""
    with trio.fail_after(30):
        while b"\n" not in seen:
            seen += await process.stderr.receive_some(1)
    line = seen.decode()
    assert "serving" in line, line
    return line.strip().rsplit(" ", 1)[-1]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_cantrip_serve_on_a_signal_answers_the_request_in_flight_and_exits_0(
    tmp_path: Path, signum: signal.Signals
) -> None:
    (tmp_path / "slow.toml").write_text(SLOW_SPEC)
    process = await trio.lowlevel.open_process(
        [CANTRIP, "serve", "slow.toml", "--port", "0", "--grace-s", "0.2"],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    answers: list[httpx.Response] = []
    try:
        base = await started(process)
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            sid = (await http.post("/sessions")).json()["session_id"]

            async def ask() -> None:
                answers.append(await http.post(f"/sessions/{sid}/prompt", json={"prompt": "go"}))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(ask)
                await wait_for_turns(tmp_path / "slow.db", 1)  # now in its slow second turn
                process.send_signal(signum)
            with trio.fail_after(30):
                assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    body = answers[0].json()
    assert answers[0].status_code == 200
    assert (body["reason"], body["stop_reason"], body["turns"]) == ("shutdown", "cancelled", 2)
    assert [t.reason for t in recorded(tmp_path / "slow.db")] == [None, "shutdown"]


async def test_cantrip_invoke_on_sigterm_records_the_cast_as_shutdown_and_exits_0(
    tmp_path: Path,
) -> None:
    (tmp_path / "slow.toml").write_text(SLOW_SPEC)
    process = await trio.lowlevel.open_process(
        [CANTRIP, "invoke", "slow.toml", "-q", "--grace-s", "0.2"],
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stdin is not None
        await process.stdin.send_all(b"take your time\n")
        await wait_for_turns(tmp_path / "slow.db", 1)
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    turns = recorded(tmp_path / "slow.db")
    assert [(t.intent, t.reason) for t in turns] == [("take your time", None), (None, "shutdown")]


def test_a_cast_a_killed_process_never_finished_replays_as_interrupted() -> None:
    script: list[dict[str, Any]] = [
        {"tool_calls": [{"gate": "echo", "args": {"text": "half way"}}]},
        {"tool_calls": [{"gate": "done", "args": {"answer": "whole"}}]},
    ]
    spell = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(script),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done, echo], [cantrip.max_turns(3)]),
    )
    turns = spell.cast("job").turns
    whole = recorded_cast(turns, 0, spell.loom)
    assert (whole.result, whole.reason, whole.terminated, len(whole.turns)) == (
        "whole",
        "done",
        True,
        2,
    )
    cut = recorded_cast(turns[:1], 0, spell.loom)  # the process died after the first turn
    assert (cut.result, cut.reason, cut.truncated, cut.terminated) == (
        None,
        "interrupted",
        True,
        False,
    )
    assert result_dict(cut)["stop_reason"] == "cancelled"


async def test_with_every_kept_session_busy_a_new_session_gets_503_with_retry_after() -> None:
    """The session cap cannot make room while every kept session runs a prompt: that
    503 says when to come back, as every other 503 of the server does."""
    from cantrip.protocols.sessions._limits import SessionLimits

    llm = GatedLLM()
    spell = gated_spell(llm)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve_http(
                spell,
                "127.0.0.1",
                0,
                options=ServeOptions(retry_after_s=4),
                limits=SessionLimits(max_sessions=1),
                task_status=task_status,
            )
        )
        async with httpx.AsyncClient(base_url=binds[0], timeout=20) as http:
            busy = await new_session(http)
            async with trio.open_nursery() as prompts:
                prompts.start_soon(
                    functools.partial(http.post, f"/sessions/{busy}/prompt", json={"prompt": "a"})
                )
                await llm.asked.wait()
                refused = await http.post("/sessions")
                llm.release.set()
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "too_many_sessions"
            assert refused.headers["retry-after"] == "4"
            assert (await http.post("/sessions")).status_code == 201  # room again
        nursery.cancel_scope.cancel()
    assert [t.intent for t in spell.loom.turns] == ["a"]


# -- one admission for both modes (issue 41, drift 11) -----------------------------------


async def test_a_prompt_beyond_max_running_is_refused_before_it_queues() -> None:
    """``max_running`` counts the prompts open at the server, decided before the backend
    sees a prompt -- the same rule as a ``serve --db`` replica's: a prompt that would
    wait its turn (``enqueue``) behind the one running is refused 503 now, and nothing
    of it is cast. (In process it used to be taken into the line and meet the limit
    when its turn came, if ever.)"""
    llm = GatedLLM()
    spell = gated_spell(llm)
    async with serving(spell, ServeOptions(max_running=1, retry_after_s=2)) as http:
        sid = await new_session(http)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                functools.partial(http.post, f"/sessions/{sid}/prompt", json={"prompt": "a"})
            )
            await llm.asked.wait()
            refused = await http.post(
                f"/sessions/{sid}/prompt?on_busy=enqueue", json={"prompt": "b"}
            )
            llm.release.set()
        assert refused.status_code == 503 and refused.headers["retry-after"] == "2"
        assert refused.json()["error"]["code"] == "overloaded"
    assert [t.intent for t in spell.loom.turns] == ["a"]


async def test_events_resume_after_the_turn_a_last_event_id_names() -> None:
    """``/events`` starts from now by default; a client that names a position (a
    number of turns, as ``Last-Event-ID`` or ``?after=``) gets the recorded turns
    after it first, each event with its id (``<turn>.<index>``)."""
    llm = GatedLLM()
    llm.release.set()
    spell = gated_spell(llm)
    async with serving(spell) as http:
        sid = await new_session(http)
        for intent in ("one", "two", "three"):
            await http.post(f"/sessions/{sid}/prompt", json={"prompt": intent})

        async def first_events(**options: Any) -> list[str]:
            lines: list[str] = []
            async with http.stream("GET", f"/sessions/{sid}/events", **options) as response:
                async for line in response.aiter_lines():
                    lines.append(line)
                    if '"final_response"' in line and '"three"' in line:
                        return lines
            raise AssertionError(lines)

        with trio.fail_after(20):
            resumed = await first_events(headers={"Last-Event-ID": "1"})
            again = await first_events(params={"after": "2"})
        bad = await http.get(f"/sessions/{sid}/events", headers={"Last-Event-ID": "x"})
    assert recorded_ids(resumed) == ["2.0", "2.1", "3.0", "3.1"]
    finals = [json.loads(line[6:])["result"] for line in resumed if '"final_response"' in line]
    assert finals == ["two", "three"]
    assert recorded_ids(again) == ["3.0", "3.1"]
    assert bad.status_code == 400


def recorded_ids(lines: list[str]) -> list[str]:
    """The ids of the turns' events (a stream's ``id:`` lines, each before its
    ``event:``); every id of the stream in order, the live ones between them too."""
    ids, kinds = [], []
    for index, line in enumerate(lines):
        if line.startswith("id: "):
            ids.append(tuple(int(p) for p in line[4:].split(".")))
            kinds.append(lines[index + 1].removeprefix("event: "))
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    recorded = ("step_complete", "final_response")
    return [f"{t}.{i}" for (t, i), k in zip(ids, kinds, strict=True) if k in recorded]


def test_a_prompt_admitted_holds_its_place_before_its_cast_begins() -> None:
    """``SessionHub.admit`` decides every refusal at once and puts the prompt in its
    session's line, so a second prompt is ``busy`` (or waits behind it) before the first
    one's cast has begun -- the in-process backend's ``submit`` answers a refusal without
    counting on when trio runs the cast's task."""
    llm = GatedLLM()
    hub = SessionHub(gated_spell(llm))
    session = hub.new()
    first = hub.admit(session, "a", key="k-a")
    assert first.action == "cast" and not first.prompt.waiting
    with pytest.raises(SessionError) as busy:
        hub.admit(session, "b")
    assert busy.value.kind == "busy"
    with pytest.raises(SessionError) as reused:
        hub.admit(session, "other", key="k-a", on_busy="enqueue")
    assert reused.value.kind == "key_reused"
    again = hub.admit(session, "a", key="k-a")  # the same prompt, in line: joined
    assert again.action == "join" and again.prompt is first.prompt
    second = hub.admit(session, "b", on_busy="enqueue")
    assert second.action == "cast" and second.prompt.waiting
    assert session.waiting == [first.prompt, second.prompt]
    assert llm.queries == 0  # nothing was cast
