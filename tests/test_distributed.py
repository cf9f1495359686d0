"""Scale-out on PostgreSQL, against a real server started by the tests (tests/conftest.py).

PostgresLoom semantics (append-only, one tree, fork, export with redaction),
fencing, the work queue and workers (in-process and as separate processes),
cancellation, and the chaos test: workers killed with SIGKILL while 200
entities run, after which every entity has finished with 0 lost turns and 0
duplicated effects.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import trio
from distributed_workload import EFFECTS_TABLE, TAKEN_OVER

import cantrip
from cantrip.distributed._dispatcher import Dispatcher
from cantrip.distributed._queue import WorkQueue
from cantrip.distributed._spells import spell_from_factory
from cantrip.distributed._worker import Worker
from cantrip.loom import Loom
from cantrip.loom._fence import Fence, LeaseLostError
from cantrip.loom._model import EntityRecord, Turn
from gates import done

TESTS = Path(__file__).resolve().parent
WORKLOAD = spell_from_factory("distributed_workload:build")


@pytest.fixture
def effects_db(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """``pg_url`` with the workload's effects table; the charge gate writes there."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(EFFECTS_TABLE)
    monkeypatch.setenv("CANTRIP_TEST_DB", pg_url)
    return pg_url


def _effects(url: str) -> list[tuple[str, int, int]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT job, step, count(*) FROM chaos_effects GROUP BY 1, 2"
        ).fetchall()
    return [(j, int(s), int(n)) for j, s, n in rows]


def _record(entity_id: str) -> EntityRecord:
    return EntityRecord(entity_id=entity_id, cantrip_id="c")


def _turn(entity_id: str, parent: str | None, seq: int, text: str = "") -> Turn:
    return Turn(
        id=Loom.new_turn_id(),
        parent_id=parent,
        entity_id=entity_id,
        sequence=seq,
        utterance=text,
        observation=f"obs {seq}",
    )


# -- the loom on PostgreSQL ------------------------------------------------------------


async def test_postgres_loom_is_one_append_only_tree_read_by_query(pg_url: str) -> None:
    spell = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(
            [
                {
                    "tool_calls": [
                        {"gate": "done", "args": {"answer": "first sk-abcdefghijklmnopqrstuvwx"}}
                    ]
                },
                {"tool_calls": [{"gate": "done", "args": {"answer": "forked"}}]},
            ]
        ),
        identity=cantrip.Identity(system_prompt="pg"),
        circle=cantrip.Circle([done], [cantrip.max_turns(3)]),
        loom=Loom.open(pg_url),
    )
    first = await spell.cast_async("hello")
    fork = await spell.fork_async(first.turns[-1].id, "again")
    spell.loom.close()

    loom = Loom.open(pg_url)  # another process's view: nothing loaded on open
    try:
        assert loom.indexed and len(loom._by_id) == 0
        thread = loom.thread(fork.turns[-1].id)
        assert [t.id for t in thread] == [first.turns[-1].id, fork.turns[-1].id]
        assert len(loom) == 2 and len(loom.entities) == 2
        assert [t.id for t in loom.leaves()] == [fork.turns[-1].id]  # the fork extends it
        assert loom.last_turn(first.entity_id) is not None
        # append-only, enforced by the database itself
        with psycopg.connect(pg_url) as conn, pytest.raises(psycopg.errors.RaiseException):
            conn.execute("DELETE FROM cantrip_turns")
        with pytest.raises(cantrip.LoomAppendOnlyError):
            loom.register_entity(loom.entity(first.entity_id))
        # export redacts secrets (PROD-8) exactly as from SQLite
        from cantrip.loom import export_jsonl

        text = export_jsonl(loom)
        assert "sk-abcdefghijklmnopqrstuvwx" not in text and "forked" in text
    finally:
        loom.close()


async def test_a_write_under_a_lost_lease_is_refused_and_not_recorded(pg_url: str) -> None:
    loom = Loom.open(pg_url)
    queue = WorkQueue(loom.store)  # type: ignore[arg-type]
    queue.enqueue({"factory": "x:y"}, "go", "entity-a")
    claim = queue.claim("worker-1", lease_s=30)
    assert claim is not None and claim.fence.epoch == 1
    loom.hold("entity-a", claim.fence)
    loom.register_entity(_record("entity-a"))
    first = loom.append(_turn("entity-a", None, 1))
    await loom.sync("entity-a")
    # the lease is taken over (worker-1 paused past its lease; worker-2 claimed it)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE cantrip_leases SET expires_at = clock_timestamp()")
        conn.execute("UPDATE cantrip_work SET state = 'running'")
    second_claim = queue.claim("worker-2", lease_s=30)
    assert second_claim is not None and second_claim.fence.epoch == 2
    late = loom.append(_turn("entity-a", first.id, 2, "late"))
    with pytest.raises(LeaseLostError, match="lease lost"):
        await loom.sync("entity-a")
    with pytest.raises(LeaseLostError):
        await loom.journal_write("entity-a", 2, 0, "charge", "{}", None)
    loom.release("entity-a")
    loom.close()
    reader = Loom.open(pg_url)
    assert [t.id for t in reader.entity_turns("entity-a")] == [first.id]
    assert reader._lookup(late.id) is None
    # the new owner writes under its own fence
    reader.hold("entity-a", second_claim.fence)
    reader.append(_turn("entity-a", first.id, 2, "new owner"))
    await reader.sync("entity-a")
    assert [t.utterance for t in reader.entity_turns("entity-a")] == ["", "new owner"]
    stale = Fence("entity-a", "worker-1", 1)
    assert WorkQueue(reader.store).heartbeat(stale, 30) == (False, False)  # type: ignore[arg-type]
    reader.close()


# -- workers ---------------------------------------------------------------------------


async def _with_worker(url: str, body, **options: float) -> None:  # type: ignore[no-untyped-def]
    async with trio.open_nursery() as nursery:
        worker = Worker(url, **options)  # type: ignore[arg-type]
        await nursery.start(worker.run)
        await body(worker)
        nursery.cancel_scope.cancel()


async def test_worker_runs_queued_casts_and_a_second_cast_continues_the_entity(
    effects_db: str,
) -> None:
    dispatcher = await trio.to_thread.run_sync(Dispatcher, effects_db)

    async def body(worker: Worker) -> None:
        work, entity = await trio.to_thread.run_sync(lambda: dispatcher.submit(WORKLOAD, "job-a"))
        state, outcome = await trio.to_thread.run_sync(lambda: dispatcher.wait(work, timeout=30))
        assert (state, outcome["result"], outcome["turns"]) == ("done", "job-a ok", 10)
        again, _ = await trio.to_thread.run_sync(
            lambda: dispatcher.submit(WORKLOAD, "job-b", entity_id=entity)
        )
        state, outcome = await trio.to_thread.run_sync(lambda: dispatcher.wait(again, timeout=30))
        assert state == "done" and outcome["entity_id"] == entity

    await _with_worker(effects_db, body, concurrency=4)
    dispatcher.close()
    loom = Loom.open(effects_db)
    turns = loom.entity_turns(_single_entity(loom))
    loom.close()
    assert [t.sequence for t in turns] == list(range(1, len(turns) + 1))
    assert [t.intent for t in turns if t.intent] == ["job-a", "job-b"]
    assert all(n == 1 for _, _, n in _effects(effects_db))


def _single_entity(loom: Loom) -> str:
    (entity_id,) = loom.entities
    return entity_id


async def test_cancel_reaches_the_worker_by_notify_and_is_recorded(
    effects_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKLOAD_LATENCY_MS", "200")
    dispatcher = await trio.to_thread.run_sync(Dispatcher, effects_db)

    async def body(worker: Worker) -> None:
        work, entity = await trio.to_thread.run_sync(lambda: dispatcher.submit(WORKLOAD, "slow"))
        with trio.fail_after(60):
            while entity not in worker._owned or worker._owned[entity].entity is None:
                await trio.sleep(0.02)
        await trio.sleep(0.3)
        await trio.to_thread.run_sync(lambda: dispatcher.cancel(entity))
        state, outcome = await trio.to_thread.run_sync(lambda: dispatcher.wait(work, timeout=10))
        assert state == "cancelled" and outcome["reason"] == "cancelled"

    await _with_worker(effects_db, body, concurrency=2, lease_s=30.0, poll_s=30.0)
    dispatcher.close()
    loom = Loom.open(effects_db)
    last = loom.last_turn(_single_entity(loom))
    loom.close()
    assert last is not None and last.truncated and last.reason == "cancelled"


# -- the gate journal (SQLite: one process) ----------------------------------------------


async def test_journal_reuses_recorded_results_and_refuses_to_guess_unknown_outcomes(
    tmp_path: Path,
) -> None:
    from cantrip._journal import encode_response

    runs: list[str] = []

    @cantrip.gate
    def pay(to: str) -> str:
        """Pay someone (not idempotent)."""
        runs.append(f"pay {to}")
        return f"paid {to}"

    @cantrip.gate(idempotent=True)
    def lookup(key: str) -> str:
        """Read-only: safe to run again."""
        runs.append(f"lookup {key}")
        return f"value of {key}"

    calls = (
        cantrip.ToolCall("a", "pay", {"to": "ann"}),
        cantrip.ToolCall("b", "pay", {"to": "bob"}),
        cantrip.ToolCall("c", "lookup", {"key": "k"}),
    )
    llm = cantrip.ScriptedLLM([{"tool_calls": [{"gate": "done", "args": {"answer": "fin"}}]}])
    loom = Loom.open(tmp_path / "loom.db", journal=True)
    spell = cantrip.Cantrip(
        llm=llm,
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done, pay, lookup], [cantrip.max_turns(5)]),
        loom=loom,
    )
    entity = spell.summon(entity_id="entity-j")
    # What a worker that crashed in the middle of turn 1 left in the journal:
    # the utterance, pay(ann) recorded, pay(bob) and lookup(k) started only.
    from cantrip.llm import Response

    def data(call: cantrip.ToolCall) -> str:
        import orjson

        return orjson.dumps({"args": dict(call.arguments), "tool_call_id": call.id}).decode()

    loom.store.journal_write(
        "entity-j", 1, -1, "", encode_response(Response(tool_calls=calls)), None
    )  # type: ignore[attr-defined]
    paid = cantrip.GateCallRecord(
        gate="pay", args={"to": "ann"}, result="paid ann", tool_call_id="a"
    )
    import orjson

    loom.store.journal_write(
        "entity-j", 1, 0, "pay", data(calls[0]), orjson.dumps(paid.to_dict()).decode()
    )  # type: ignore[attr-defined]
    loom.store.journal_write("entity-j", 1, 1, "pay", data(calls[1]), None)  # type: ignore[attr-defined]
    loom.store.journal_write("entity-j", 1, 2, "lookup", data(calls[2]), None)  # type: ignore[attr-defined]

    result = await entity.resume_cast("pay them", [])
    await entity.aclose()
    first = result.turns[0]
    assert [r.result for r in first.gate_calls] == [
        "paid ann",  # reused: never paid twice
        cantrip._journal.OUTCOME_UNKNOWN,  # started, unrecorded, not idempotent
        "value of k",  # idempotent: run again
    ]
    assert first.gate_calls[1].is_error
    assert runs == ["lookup k"]
    assert result.terminated and result.result == "fin"
    assert len(llm.invocations) == 1  # turn 1's utterance came from the journal
    loom.close()


# -- separate worker processes -----------------------------------------------------------


def _spawn(url: str, lease: float, log: Path, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cantrip",
            "worker",
            "--db",
            url,
            "--lease",
            str(lease),
            "--concurrency",
            "40",
        ],
        env={**os.environ, "PYTHONPATH": str(TESTS), **env},
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab"),
    )


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        proc.wait()


def _check_threads(url: str, jobs: dict[str, str], turns: int) -> None:
    loom = Loom.open(url)
    try:
        for entity_id, job in jobs.items():
            last = loom.last_turn(entity_id)
            assert last is not None and last.terminated, entity_id
            thread = loom.thread(last.id)
            assert [t.sequence for t in thread] == list(range(1, turns + 1)), entity_id
            assert thread[0].intent == job
            assert last.result == f"{job} ok"
    finally:
        loom.close()


@pytest.mark.soak  # chaos: ~40 s under load; CI runs it (pytest -m soak)
def test_chaos_workers_killed_at_random_lose_no_turn_and_repeat_no_effect(
    effects_db: str, workers: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    entities, turns = 200, 10
    log = tmp_path / "workers.log"
    env = {"CANTRIP_TEST_DB": effects_db, "WORKLOAD_LATENCY_MS": "20", "WORKLOAD_GATE_MS": "5"}
    workers.extend(_spawn(effects_db, 1.5, log, **env) for _ in range(3))
    dispatcher = Dispatcher(effects_db)
    jobs: dict[str, str] = {}
    for i in range(entities):
        _, entity_id = dispatcher.submit(WORKLOAD, f"job-{i}")
        jobs[entity_id] = f"job-{i}"
    rng = random.Random(17)
    kills, started = 0, time.monotonic()
    queue = dispatcher.queue
    # Kills are paced by progress, not by the clock (however fast the workers are,
    # six kills land while work runs): one each time another ~1/7 of the casts is done.
    thresholds = [entities * k // 7 for k in range(1, 7)]
    while True:
        with psycopg.connect(effects_db) as conn:
            open_work, done = conn.execute(
                "SELECT count(*) FILTER (WHERE state IN ('queued', 'running')), "
                "count(*) FILTER (WHERE state = 'done') FROM cantrip_work"
            ).fetchone()
        if open_work == 0:
            break
        assert time.monotonic() - started < 90, f"{open_work} casts unfinished; see {log}"
        time.sleep(0.05 + rng.random() * 0.25)
        if kills < len(thresholds) and done >= thresholds[kills] and open_work > 20:
            victim = rng.choice([w for w in workers if w.poll() is None])
            victim.kill()  # SIGKILL: no cleanup, the lease just stops being renewed
            victim.wait()
            kills += 1
            workers.append(_spawn(effects_db, 1.5, log, **env))
    dispatcher.close()
    assert kills >= 3
    with psycopg.connect(effects_db) as conn:
        states = dict(
            conn.execute("SELECT state, count(*) FROM cantrip_work GROUP BY 1").fetchall()
        )
        resumed = conn.execute(TAKEN_OVER).fetchone()[0]
    assert states == {"done": entities}
    assert resumed > 0  # some casts really were taken over from a killed worker
    _check_threads(effects_db, jobs, turns)  # 0 lost turns, every thread valid
    effects = _effects(effects_db)
    assert all(n == 1 for _, _, n in effects), [e for e in effects if e[2] > 1]  # 0 duplicates
    # every step either took effect once or is recorded as an unknown outcome
    loom = Loom.open(effects_db)
    unknown = 0
    for entity_id in jobs:
        for turn in loom.entity_turns(entity_id):
            unknown += sum(1 for r in turn.gate_calls if r.detail.get("outcome_unknown"))
    loom.close()
    assert len(effects) + unknown >= entities * (turns - 1)
    del queue


def test_a_worker_frozen_past_its_lease_cannot_append_after_it_wakes(
    effects_db: str, workers: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    log = tmp_path / "frozen.log"
    env = {"CANTRIP_TEST_DB": effects_db, "WORKLOAD_LATENCY_MS": "150"}
    frozen = _spawn(effects_db, 1.0, log, **env)
    workers.append(frozen)
    dispatcher = Dispatcher(effects_db)
    work, entity_id = dispatcher.submit(WORKLOAD, "fenced")
    loom = Loom.open(effects_db)
    deadline = time.monotonic() + 60
    while len(loom.entity_turns(entity_id)) < 2:
        assert time.monotonic() < deadline, "the frozen worker's cast did not start"
        time.sleep(0.05)
    frozen.send_signal(signal.SIGSTOP)
    frozen_at = len(loom.entity_turns(entity_id))
    time.sleep(2.5)  # past the 1 s lease
    workers.append(_spawn(effects_db, 1.0, log, **env))  # takes the entity over, epoch + 1
    state, outcome = dispatcher.wait(work, timeout=30)
    assert state == "done" and outcome["turns"] == 10
    frozen.send_signal(signal.SIGCONT)
    # the woken worker tries to go on: its appends are refused and it says so (waited
    # for, not slept on: under load the woken process may take a while to get there)
    deadline = time.monotonic() + 30
    while "lease lost" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    dispatcher.close()
    assert "lease lost" in log.read_text()
    loom.close()
    _check_threads(effects_db, {entity_id: "fenced"}, 10)
    assert all(n == 1 for _, _, n in _effects(effects_db))
    assert frozen_at >= 2


def test_spec_loom_url_and_cast_db_through_a_worker_process(
    effects_db: str, workers: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    from cantrip.loom._postgres import PostgresStore
    from cantrip.spec import build_cantrip, parse_spec

    spec = parse_spec(
        {
            "llm": {"responses": [{"tool_calls": [{"gate": "done", "args": {"answer": "hi"}}]}]},
            "circle": {"medium": "conversation", "gates": ["done"], "wards": [{"max_turns": 2}]},
            "loom": {"url": effects_db},
        }
    )
    spell = build_cantrip(spec)
    assert isinstance(spell.loom.store, PostgresStore)
    assert spell.cast("hello").result == "hi"
    spell.loom.close()

    workers.append(_spawn(effects_db, 5.0, tmp_path / "cast.log"))
    example = TESTS.parent / "examples" / "hello.toml"
    done_ = subprocess.run(
        [
            *(sys.executable, "-m", "cantrip", "cast", str(example)),
            *("Greet the world, then finish.", "--db", effects_db, "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done_.returncode == 0, done_.stderr
    import json

    outcome = json.loads(done_.stdout)
    assert outcome["state"] == "done" and outcome["terminated"]
    loom = Loom.open(effects_db)
    assert loom.last_turn(outcome["entity_id"]) is not None
    loom.close()
