"""Workers under faults, on a real PostgreSQL server (tests/conftest.py): a worker stalled
past its leases while it has free slots, a poison cast among good ones.

* **One run of an entity at a time.** A worker frozen (SIGSTOP) past its 1 s leases
  wakes with free slots: it must not claim an entity its old run still holds, the old
  run's cut-off turn must never land under a newer fence, and every cast still ends
  ``done`` -- never ``cancelled`` (nobody cancelled it) -- with no turn lost or
  effect doubled. Several freezes in one test: the race is timing-dependent.
* **A cast that cannot run fails alone.** A queued spell the worker cannot build
  fails that work item (its error recorded, redacted); the workers stay up and every
  good cast finishes. An item whose claims keep dying is dead-lettered after the
  attempt limit, visibly.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from distributed_workload import EFFECTS_TABLE

from cantrip.distributed._dispatcher import Dispatcher
from cantrip.distributed._spells import spell_from_factory
from cantrip.loom import Loom

TESTS = Path(__file__).resolve().parent
WORKLOAD = spell_from_factory("distributed_workload:build")
START_S = 120.0
"""How long a worker may take to say ``ready``: an interpreter's start-up, which on a loaded
machine takes many seconds. The tests' own time limits start after it (:func:`wait_ready`)."""


@pytest.fixture
def effects_db(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """``pg_url`` with the workload's effects table; the charge gate writes there."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(EFFECTS_TABLE)
    monkeypatch.setenv("CANTRIP_TEST_DB", pg_url)
    return pg_url


def spawn_worker(
    url: str, log: Path, *args: str, lease: float = 1.0, concurrency: int = 64, **env: str
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "cantrip", "worker", "--db", url),
            *("--lease", str(lease), "--concurrency", str(concurrency), *args),
        ],
        env={**os.environ, "PYTHONPATH": str(TESTS), **env},
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab"),
    )


def wait_ready(log: Path, workers: list[subprocess.Popen[bytes]]) -> None:
    """Wait until every one of ``workers`` (all writing to ``log``) said ``ready``, so that
    the time limits a test starts after this count its work, not the interpreters'
    start-up."""
    deadline = time.monotonic() + START_S
    while len(re.findall(r"worker \S+ ready", log.read_text())) < len(workers):
        exited = [w.returncode for w in workers if w.poll() is not None]
        assert not exited, f"a worker exited {exited} before it was ready: {log.read_text()}"
        assert time.monotonic() < deadline, f"not ready after {START_S} s: {log.read_text()}"
        time.sleep(0.02)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        proc.wait()


def _states(url: str, works: list[int]) -> dict[int, str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT id, state FROM cantrip_work WHERE id = ANY(%s)", (works,)
        ).fetchall()
    return {int(i): s for i, s in rows}


def _wait_ended(url: str, works: list[int], worker: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        states = _states(url, works)
        if all(s not in ("queued", "running") for s in states.values()):
            return
        assert worker.poll() is None, f"the worker exited {worker.returncode}: {log.read_text()}"
        assert time.monotonic() < deadline, f"unfinished: {states}; see {log.read_text()}"
        time.sleep(0.05)


def test_a_worker_frozen_past_its_leases_with_free_slots_runs_each_entity_once(
    effects_db: str, procs: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    env = {"CANTRIP_TEST_DB": effects_db, "WORKLOAD_LATENCY_MS": "100"}
    worker = spawn_worker(effects_db, log, **env)
    procs.append(worker)
    wait_ready(log, [worker])  # (the first round's 30 s do not count its start-up)
    dispatcher = Dispatcher(effects_db)
    loom = Loom.open(effects_db)
    jobs: dict[str, str] = {}
    rounds = 3
    try:
        for round_ in range(rounds):
            works = []
            for i in range(8):
                work, entity_id = dispatcher.submit(WORKLOAD, f"r{round_}-{i}")
                works.append(work)
                jobs[entity_id] = f"r{round_}-{i}"
            mine = [e for e, j in jobs.items() if j.startswith(f"r{round_}-")]
            deadline = time.monotonic() + 30
            while min(len(loom.store.entity_turns(e)) for e in mine) < 2:  # type: ignore[attr-defined]
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.02)
            worker.send_signal(signal.SIGSTOP)
            time.sleep(2.5)  # past the 1 s leases; 56 of 64 slots free when it wakes
            worker.send_signal(signal.SIGCONT)
            _wait_ended(effects_db, works, worker, log)
            states = _states(effects_db, works)
            assert set(states.values()) == {"done"}, (round_, states, log.read_text())
    finally:
        dispatcher.close()
    assert worker.poll() is None, log.read_text()
    for entity_id, job in jobs.items():  # every thread whole, in order, no turn twice
        last = loom.last_turn(entity_id)
        assert last is not None and last.terminated and last.result == f"{job} ok", entity_id
        thread = loom.thread(last.id)
        assert [t.sequence for t in thread] == list(range(1, 11)), entity_id
        assert not [t for t in thread if t.reason == "cancelled"], entity_id
    loom.close()
    with psycopg.connect(effects_db) as conn:
        doubled = conn.execute(
            "SELECT job, step, count(*) FROM chaos_effects GROUP BY 1, 2 HAVING count(*) > 1"
        ).fetchall()
    assert doubled == []


POISON_SPEC = """
[llm]
provider = "openai"
model = "gpt-5-mini"
api_key_env = "CANTRIP_TEST_ABSENT_KEY"

[circle]
medium = "conversation"
gates = ["done"]
wards = [{ max_turns = 3 }]
"""


def test_a_cast_that_cannot_run_fails_alone_and_the_workers_stay_up(
    effects_db: str, procs: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    log = tmp_path / "workers.log"
    env = {"CANTRIP_TEST_DB": effects_db, "WORKLOAD_LATENCY_MS": "20"}
    procs.extend(spawn_worker(effects_db, log, concurrency=4, **env) for _ in range(3))
    wait_ready(log, procs)  # (the time limits below do not count their start-up)
    spec = tmp_path / "poison.toml"
    spec.write_text(POISON_SPEC)
    dispatcher = Dispatcher(effects_db)
    good = [dispatcher.submit(WORKLOAD, f"good-{i}")[0] for i in range(6)]
    secret = dispatcher.submit(spell_from_factory("distributed_workload:poison"), "x")[0]
    good += [dispatcher.submit(WORKLOAD, f"good-{i}")[0] for i in range(6, 12)]
    # the waiting client of a cast whose spec does not build on the workers hears why
    waiting = subprocess.run(
        [sys.executable, "-m", "cantrip", "cast", str(spec), "hello", "--db", effects_db],
        env={**os.environ, "PYTHONPATH": str(TESTS)},
        capture_output=True,
        text=True,
        timeout=START_S + 60,  # (its own start-up, then the cast)
    )
    assert waiting.returncode == 1, waiting.stderr
    assert "CANTRIP_TEST_ABSENT_KEY" in waiting.stderr and "Traceback" not in waiting.stderr
    for work in [*good, secret]:
        dispatcher.wait(work, timeout=60)
    states = _states(effects_db, [*good, secret])
    assert [states[w] for w in good] == ["done"] * 12
    state, outcome = dispatcher.queue.status(secret)
    assert state == "failed" and "cannot build" in outcome["error"]
    assert "sk-poison" not in json_text(effects_db), "the recorded error keeps the key"
    dispatcher.close()
    assert [p.poll() for p in procs] == [None, None, None], log.read_text()


def json_text(url: str) -> str:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT coalesce(result, '') FROM cantrip_work").fetchall()
    return "\n".join(r[0] for r in rows)


def test_a_cast_that_kills_its_workers_is_dead_lettered_after_the_attempt_limit(
    effects_db: str, procs: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    import json

    log = tmp_path / "workers.log"
    env = {"CANTRIP_TEST_DB": effects_db, "WORKLOAD_LATENCY_MS": "20"}
    limit = ("--max-attempts", "2")
    # one slot each: a worker the poison kills held nothing else (a killed worker's other
    # casts are claimed again too, and count an attempt like the poison does)
    procs.extend(spawn_worker(effects_db, log, *limit, concurrency=1, **env) for _ in range(3))
    wait_ready(log, procs)  # (the time limits below do not count their start-up)
    dispatcher = Dispatcher(effects_db)
    crash = dispatcher.submit(spell_from_factory("distributed_workload:crasher"), "boom")[0]
    good = [dispatcher.submit(WORKLOAD, f"good-{i}")[0] for i in range(12)]
    state, outcome = dispatcher.wait(crash, timeout=60)
    assert state == "dead" and outcome["attempts"] == 2, outcome
    assert "dead-lettered after 2 attempts" in outcome["error"]
    for work in good:
        assert dispatcher.wait(work, timeout=60)[0] == "done"
    dispatcher.close()
    assert sum(p.poll() is None for p in procs) == 1  # two claimed it and died; one is left
    listed = subprocess.run(
        [sys.executable, "-m", "cantrip", "worker", "--db", effects_db, "--dead-letters"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    (item,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert (item["work_id"], item["intent"], item["attempts"]) == (crash, "boom", 2)
