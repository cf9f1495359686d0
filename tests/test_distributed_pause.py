"""Pauses under PostgreSQL workers: a human approves what an agent on a worker does.

Against a real PostgreSQL server (tests/conftest.py) and real workers (in this
process, and ``cantrip worker`` processes): a pause releases the worker's slot
and lease and ends the work ``paused``; an answer from any process is queued
work a worker claims; it is recorded before it is carried out, so a worker
killed after claiming it leaves the next worker to carry it out once; two
answers to one pause -> one wins.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import trio
from pause_workload import EFFECTS_TABLE

from cantrip import Decision, PauseError
from cantrip.distributed._dispatcher import Dispatcher
from cantrip.distributed._queue import WorkQueue
from cantrip.distributed._spells import build_spell, spell_from_factory
from cantrip.distributed._worker import Worker
from cantrip.loom import Loom

TESTS = Path(__file__).resolve().parent
PAUSING = spell_from_factory("pause_workload:build")


@pytest.fixture
def pay_db(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """``pg_url`` with the workload's effects table; the pay gate writes there."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(EFFECTS_TABLE)
    monkeypatch.setenv("CANTRIP_TEST_DB", pg_url)
    return pg_url


def _effects(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute("SELECT job FROM pause_effects ORDER BY id")]


def _lease(url: str, entity_id: str) -> tuple[str | None, bool]:
    """(owner, unexpired) of the entity's lease."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT owner, expires_at > clock_timestamp() FROM cantrip_leases WHERE entity_id = %s",
            (entity_id,),
        ).fetchone()
    assert row is not None
    return row[0], bool(row[1])


async def _with_worker(url: str, body: Any, **options: float) -> None:
    async with trio.open_nursery() as nursery:
        worker = Worker(url, **options)  # type: ignore[arg-type]
        await nursery.start(worker.run)
        await body(worker)
        nursery.cancel_scope.cancel()


async def _slot_freed(worker: Worker) -> None:
    """The worker lets the entity go right after it records the outcome."""
    with trio.fail_after(10):
        while worker._owned:
            await trio.sleep(0.01)


async def _call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return await trio.to_thread.run_sync(lambda: fn(*args, **kwargs))


async def test_a_pause_releases_the_worker_and_an_approval_from_anywhere_continues_it(
    pay_db: str,
) -> None:
    asking = await _call(Dispatcher, pay_db)
    answering = await _call(Dispatcher, pay_db)  # another process, as far as the queue knows

    async def body(worker: Worker) -> None:
        work, entity = await _call(asking.submit, PAUSING, "job-a")
        state, outcome = await _call(asking.wait, work, timeout=30)
        # the work ended paused: the call waits for a human, no worker holds the entity
        assert state == "paused" and outcome["reason"] == "paused"
        (pending,) = outcome["pending"]
        assert (pending["gate"], pending["args"], pending["kind"]) == (
            "pay",
            {"job": "job-a"},
            "approval",
        )
        assert _lease(pay_db, entity) == (None, False)  # released with the outcome
        await _slot_freed(worker)
        assert _effects(pay_db) == []
        (listed,) = await _call(answering.pending, entity)
        assert listed.pause_id == pending["pause_id"]

        again = await _call(answering.answer, entity, listed.pause_id, Decision.approve())
        state, outcome = await _call(answering.wait, again, timeout=30)
        assert (state, outcome["result"], outcome["terminated"]) == ("done", "paid job-a", True)
        assert await _call(answering.pending, entity) == []
        with pytest.raises(PauseError, match="already answered"):
            await _call(asking.answer, entity, listed.pause_id, {"decision": "approve"})

    await _with_worker(pay_db, body, concurrency=2)
    asking.close()
    answering.close()
    assert _effects(pay_db) == ["job-a"]  # the gate ran exactly once
    loom = Loom.open(pay_db)
    (entity_id,) = loom.entities
    calls = [r for t in loom.entity_turns(entity_id) for r in t.gate_calls if r.gate == "pay"]
    marks = [t.extras for t in loom.entity_turns(entity_id) if "answered" in t.extras]
    loom.close()
    assert [c.detail["approval"]["decision"] for c in calls] == ["approve"]
    assert marks[0]["answered"]["decision"] == "approve"  # recorded before it was carried out


async def test_a_denial_is_what_the_model_sees_and_the_cast_goes_on(pay_db: str) -> None:
    dispatcher = await _call(Dispatcher, pay_db)

    async def body(worker: Worker) -> None:
        work, entity = await _call(dispatcher.submit, PAUSING, "job-b")
        _, outcome = await _call(dispatcher.wait, work, timeout=30)
        pause_id = outcome["pending"][0]["pause_id"]
        answered = await _call(
            dispatcher.answer, entity, pause_id, {"decision": "deny", "reason": "too dear"}
        )
        state, outcome = await _call(dispatcher.wait, answered, timeout=30)
        assert state == "done" and outcome["result"] == "denied by the user: too dear"

    await _with_worker(pay_db, body, concurrency=2)
    dispatcher.close()
    assert _effects(pay_db) == []


async def test_a_wrong_kind_of_answer_is_refused_and_the_pause_still_waits(pay_db: str) -> None:
    dispatcher = await _call(Dispatcher, pay_db)

    async def body(worker: Worker) -> None:
        work, entity = await _call(dispatcher.submit, PAUSING, "job-c")
        _, outcome = await _call(dispatcher.wait, work, timeout=30)
        pause_id = outcome["pending"][0]["pause_id"]
        with pytest.raises(PauseError, match="asks for approval"):
            await _call(dispatcher.answer, entity, pause_id, Decision.answer("yes"))
        with pytest.raises(PauseError, match="no pending pause 'pause-nope'"):
            await _call(dispatcher.answer, entity, "pause-nope", Decision.approve())
        assert [p.pause_id for p in await _call(dispatcher.pending, entity)] == [pause_id]

    await _with_worker(pay_db, body, concurrency=2)
    dispatcher.close()


async def test_two_answers_at_once_one_wins(pay_db: str) -> None:
    dispatchers = [await _call(Dispatcher, pay_db) for _ in range(2)]
    outcomes: list[tuple[str, Any]] = []
    winner: list[str] = []

    async def body(worker: Worker) -> None:
        work, entity = await _call(dispatchers[0].submit, PAUSING, "job-d")
        _, outcome = await _call(dispatchers[0].wait, work, timeout=30)
        pause_id = outcome["pending"][0]["pause_id"]
        go = trio.Event()

        async def answer(dispatcher: Dispatcher, decision: Decision) -> None:
            await go.wait()
            try:
                outcomes.append((decision.kind, await _call(dispatcher.answer, entity, pause_id,
                                                            decision)))  # fmt: skip
            except PauseError as exc:
                outcomes.append((decision.kind, exc))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(answer, dispatchers[0], Decision.approve())
            nursery.start_soon(answer, dispatchers[1], Decision.deny("no"))
            await trio.sleep(0.05)
            go.set()
        ((kind, won),) = [o for o in outcomes if isinstance(o[1], int)]
        ((_, lost),) = [o for o in outcomes if isinstance(o[1], PauseError)]
        assert "already answered" in str(lost)
        state, outcome = await _call(dispatchers[0].wait, won, timeout=30)
        assert state == "done"
        winner.append(kind)
        assert outcome["result"] == (
            "paid job-d" if kind == "approve" else "denied by the user: no"
        )

    await _with_worker(pay_db, body, concurrency=2)
    for dispatcher in dispatchers:
        dispatcher.close()
    assert _effects(pay_db) == (["job-d"] if winner == ["approve"] else [])
    with psycopg.connect(pay_db) as conn:
        answers = conn.execute(
            "SELECT count(*) FROM cantrip_work WHERE spell LIKE '%\"answer\"%'"
        ).fetchone()
    assert answers == (1,)


async def test_an_answer_claimed_by_a_worker_that_died_is_carried_out_once(
    pay_db: str,
) -> None:
    """The worker that claimed the answer died at once (its lease runs out); the next
    worker carries the answer out: the gate runs once."""
    dispatcher = await _call(Dispatcher, pay_db)
    queue = WorkQueue(dispatcher.store)

    async def paused(worker: Worker) -> tuple[str, str]:
        work, entity = await _call(dispatcher.submit, PAUSING, "job-e")
        _, outcome = await _call(dispatcher.wait, work, timeout=30)
        return entity, outcome["pending"][0]["pause_id"]

    found: list[tuple[str, str]] = []

    async def first(worker: Worker) -> None:
        found.append(await paused(worker))

    await _with_worker(pay_db, first, concurrency=2)
    entity, pause_id = found[0]
    answer = await _call(dispatcher.answer, entity, pause_id, Decision.approve())
    ghost = await _call(queue.claim, "ghost-worker", 0.3)  # claims it, then never runs it
    assert ghost is not None and ghost.work_id == answer

    async def second(worker: Worker) -> None:
        state, outcome = await _call(dispatcher.wait, answer, timeout=30)
        assert (state, outcome["result"]) == ("done", "paid job-e")

    await _with_worker(pay_db, second, concurrency=2, poll_s=0.2)
    dispatcher.close()
    assert _effects(pay_db) == ["job-e"]
    with psycopg.connect(pay_db) as conn:
        row = conn.execute(
            "SELECT attempts, crashes FROM cantrip_work WHERE id = %s", (answer,)
        ).fetchone()
    assert row == (1, 1)  # taken over from the ghost at no attempt: its claim was not alone


# -- worker processes ------------------------------------------------------------------


def _spawn(url: str, log: Path, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "cantrip", "worker", "--db", url, "--lease", "1"],
        env={**os.environ, "PYTHONPATH": str(TESTS), **env},
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab"),
    )


def test_a_worker_killed_while_it_carries_out_an_approval_repeats_no_effect(
    pay_db: str, tmp_path: Path
) -> None:
    """kill -9 the worker in the middle of the approved call (its effect made, its
    result not yet journaled): the next worker does not run it again -- the model is
    told the outcome is unknown -- and the cast goes on to its end."""
    dispatcher = Dispatcher(pay_db)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(_spawn(pay_db, tmp_path / "w1.log", PAY_GATE_MS="60000"))
        work, entity = dispatcher.submit(PAUSING, "job-f")
        state, outcome = dispatcher.wait(work, timeout=60)
        assert state == "paused"
        answer = dispatcher.answer(entity, outcome["pending"][0]["pause_id"], Decision.approve())
        deadline = time.monotonic() + 60
        while not _effects(pay_db):  # the approved call is under way
            assert time.monotonic() < deadline, (tmp_path / "w1.log").read_text()
            time.sleep(0.05)
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait()
        procs.append(_spawn(pay_db, tmp_path / "w2.log"))
        state, outcome = dispatcher.wait(answer, timeout=60)
        assert state == "done" and outcome["terminated"], outcome
        assert outcome["result"].startswith("outcome unknown after a worker crash")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        dispatcher.close()
    assert _effects(pay_db) == ["job-f"]


ECHO = '  {tool_calls = [{gate = "echo", args = {text = "risky"}}]},\n'
DONE = '  {tool_calls = [{gate = "done", args = {answer = "finished"}}]},\n'


def test_cast_db_with_a_pausing_spec_says_what_waits_and_how_to_answer(
    pay_db: str, tmp_path: Path
) -> None:
    spec = tmp_path / "pay.toml"
    spec.write_text(
        '[llm]\nprovider = "scripted"\nresponses = [\n'
        + (ECHO + DONE)  # every cast plays the script from its first entry
        + "]\n"
        '[circle]\nmedium = "conversation"\ngates = ["done", "echo"]\n'
        'wards = [{max_turns = 4}]\napprove = ["echo"]\n'
    )
    worker = _spawn(pay_db, tmp_path / "w.log")
    env = {**os.environ, "PYTHONPATH": str(TESTS)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cantrip", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )

    try:
        paused = cli("cast", str(spec), "go", "--db", pay_db)
        assert paused.returncode == 3, paused.stderr
        assert "waits for a human: echo" in paused.stderr
        assert "cantrip answer --db" in paused.stderr
        data = cli("cast", str(spec), "go", "--db", pay_db, "--json")
        assert data.returncode == 3
        outcome = json.loads(data.stdout)
        assert outcome["state"] == "paused"
        (pending,) = outcome["pending"]
        answered = cli(
            "answer", "--db", pay_db, outcome["entity_id"], pending["pause_id"], "--approve"
        )
        assert answered.returncode == 0, answered.stderr
        assert answered.stdout.strip() == "finished"
        twice = cli(
            "answer", "--db", pay_db, outcome["entity_id"], pending["pause_id"], "--approve"
        )
        assert twice.returncode == 1 and "already answered" in twice.stderr
        assert "Traceback" not in twice.stderr
        approved = cli("cast", str(spec), "go", "--db", pay_db, "--approve-all")
        assert approved.returncode == 0, approved.stderr
        assert approved.stdout.strip() == "finished"
    finally:
        worker.kill()
        worker.wait()


@pytest.mark.parametrize("medium", ["js", "python"])
async def test_a_pause_inside_running_code_leaves_the_worker_too(pay_db: str, medium: str) -> None:
    """A code medium cannot go on from the middle of a block in another process, but
    the worker lets it go anyway (as if it had died): the work ends paused and holds
    nothing; the answer runs the gate once and tells the model the block's rest did
    not run."""
    dispatcher = await _call(Dispatcher, pay_db)

    async def body(worker: Worker) -> None:
        spell = spell_from_factory(f"pause_workload:build_{medium}")
        work, entity = await _call(dispatcher.submit, spell, "in code")
        state, outcome = await _call(dispatcher.wait, work, timeout=60)
        assert state == "paused", outcome
        (pending,) = outcome["pending"]
        assert (pending["gate"], pending["args"]) == ("pay", {"job": f"job-{medium}"})
        assert _lease(pay_db, entity) == (None, False)  # released with the outcome
        await _slot_freed(worker)
        answered = await _call(dispatcher.answer, entity, pending["pause_id"], Decision.approve())
        state, outcome = await _call(dispatcher.wait, answered, timeout=60)
        assert (state, outcome["result"]) == ("done", "after: the block was cut"), outcome

    await _with_worker(pay_db, body, concurrency=2)
    dispatcher.close()
    assert _effects(pay_db) == [f"job-{medium}"]
    loom = Loom.open(pay_db)
    (entity_id,) = loom.entities
    observations = [t.observation for t in loom.entity_turns(entity_id)]
    loom.close()
    assert any("the rest of that code block did not run" in (o or "") for o in observations)


async def test_a_childs_pause_waits_in_place_and_is_answered_from_another_process(
    pay_db: str,
) -> None:
    """A child cannot leave its parent's cast: its pause waits in place, in the worker,
    but is published -- listed by ``pending`` and answered by any process."""
    asking = await _call(Dispatcher, pay_db)
    answering = await _call(Dispatcher, pay_db)

    async def body(worker: Worker) -> None:
        spell = spell_from_factory("pause_workload:build_delegating")
        work, entity = await _call(asking.submit, spell, "delegate")
        with trio.fail_after(30):
            while not (pending := await _call(answering.pending, entity)):
                await trio.sleep(0.05)
        (pause,) = pending
        assert (pause.gate, pause.args, pause.entity_id != entity) == (
            "pay",
            {"job": "child-job"},
            True,
        )
        assert asking.queue.status(work)[0] == "running"  # the parent's cast goes on
        with pytest.raises(PauseError, match="asks for approval"):
            await _call(answering.answer, entity, pause.pause_id, Decision.answer("hm"))
        carried = await _call(answering.answer, entity, pause.pause_id, Decision.approve())
        assert carried == work  # the running work carries it out
        with pytest.raises(PauseError, match="already answered"):
            await _call(asking.answer, entity, pause.pause_id, Decision.deny())
        state, outcome = await _call(asking.wait, work, timeout=30)
        assert (state, outcome["result"]) == ("done", "parent")
        assert await _call(asking.pending, entity) == []

    await _with_worker(pay_db, body, concurrency=2)
    asking.close()
    answering.close()
    assert _effects(pay_db) == ["child-job"]


@asynccontextmanager
async def _delegating_replica(url: str) -> AsyncIterator[tuple[httpx.AsyncClient, trio.Nursery]]:
    """``serve --db``'s app in this process, on the delegating workload: a client of it,
    and the nursery it runs in (for requests a test sends alongside)."""
    from cantrip.protocols.http._serve import serve_http_db

    queued = spell_from_factory("pause_workload:build_delegating")
    async with trio.open_nursery() as nursery:
        (base,) = await nursery.start(
            lambda task_status: serve_http_db(
                queued, build_spell(queued, Loom()), url, "127.0.0.1", 0, task_status=task_status
            )
        )
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            yield http, nursery
        nursery.cancel_scope.cancel()


async def test_serve_db_answers_a_childs_pause_202_and_the_prompt_answers(pay_db: str) -> None:
    """``serve --db`` (its app, in this process, beside a worker): a prompt whose child
    pauses keeps waiting; the pause is listed and answered 202 (a second answer 409), and
    the waiting prompt answers with the finished cast."""

    async def body(worker: Worker) -> None:
        async with _delegating_replica(pay_db) as (http, nursery):
            sid = (await http.post("/sessions")).json()["session_id"]
            prompt: list[httpx.Response] = []

            async def send() -> None:
                prompt.append(await http.post(f"/sessions/{sid}/prompt", json={"intent": "x"}))

            nursery.start_soon(send)
            with trio.fail_after(30):
                while not (pending := (await http.get(f"/sessions/{sid}/pending")).json()[
                    "pending"
                ]):  # fmt: skip
                    await trio.sleep(0.05)
            url = f"/sessions/{sid}/pending/{pending[0]['pause_id']}"
            accepted = await http.post(url, json={"decision": "approve"})
            assert accepted.status_code == 202, accepted.text
            assert accepted.json() == {"answered": True, "pause_id": pending[0]["pause_id"]}
            assert (await http.post(url, json={"decision": "approve"})).status_code == 409
            with trio.fail_after(30):
                while not prompt:
                    await trio.sleep(0.05)
            assert prompt[0].status_code == 200
            assert prompt[0].json()["result"] == "parent"

    await _with_worker(pay_db, body, concurrency=2)
    assert _effects(pay_db) == ["child-job"]


async def test_serve_db_streams_a_childs_live_pause_as_event_pause(pay_db: str) -> None:
    """A streamed prompt whose child pauses in place: the stream sends ``event: pause``
    (the child's entity id, the pause its worker published); answering that pause id
    lets the stream go on to the result."""

    async def body(worker: Worker) -> None:
        async with _delegating_replica(pay_db) as (http, _):
            events: list[tuple[str, dict[str, Any]]] = []
            sid = (await http.post("/sessions")).json()["session_id"]
            entity = (await http.get(f"/sessions/{sid}")).json()["entity_id"]
            with trio.fail_after(60):
                async with http.stream(
                    "POST", f"/sessions/{sid}/prompt?stream=1", json={"intent": "x"}
                ) as response:
                    name = None
                    async for line in response.aiter_lines():
                        if line.startswith("event: "):
                            name = line[7:]
                        elif line.startswith("data: ") and name is not None:
                            events.append((name, json.loads(line[6:])))
                            if name == "pause":
                                pause = events[-1][1]["pause"]
                                answered = await http.post(
                                    f"/sessions/{sid}/pending/{pause['pause_id']}",
                                    json={"decision": "approve"},
                                )
                                assert answered.status_code == 202, answered.text
        pauses = [e for n, e in events if n == "pause"]
        assert len(pauses) == 1  # sent once, though the stream polled on
        (pause,) = pauses
        assert pause["type"] == "pause" and pause["entity_id"] != entity
        assert pause["entity_id"] == pause["pause"]["entity_id"]
        assert (pause["pause"]["gate"], pause["pause"]["args"]) == ("pay", {"job": "child-job"})
        assert events[-1][0] == "result" and events[-1][1]["result"] == "parent"

    await _with_worker(pay_db, body, concurrency=2)
    assert _effects(pay_db) == ["child-job"]
