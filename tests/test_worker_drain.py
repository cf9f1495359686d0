"""A worker stopped by SIGTERM (every deploy does it) loses no cast: it stops claiming,
lets its running casts reach their next turn boundary within ``--drain-s``, then hands
their leases back unrecorded -- no attempt, no crash -- and another worker resumes them
(real PostgreSQL server and real ``cantrip worker`` processes, as in
tests/test_worker_faults.py).

* **A deploy.** One of two workers running 120 casts is sent SIGTERM: it exits 0, every
  cast ends ``done`` -- none ``cancelled`` -- at one attempt and no crash, every thread
  whole and no effect doubled (before: about a third of the casts ended ``cancelled``
  with nobody cancelling them, each counting a crash).
* **The turn boundary.** A cast inside a gate call at SIGTERM finishes that turn (it is
  recorded), then its lease is handed back, and the next worker goes on from the next
  turn; the draining worker claims nothing, even with a slot free.
* **A second SIGTERM** hands back at once: the turn in flight is not recorded, and the
  next worker finishes it from the gate journal (the call is not run again).
* **The grace period's end** (``--drain-s``) hands back a cast stuck in a long gate call
  or a long model call the same way.

Ordering comes from events the tests wait for -- an effect row (a gate call began), a
file the model call creates, the worker's ``draining`` line -- never from sleeps.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from distributed_workload import CountingLLM
from test_worker_faults import (  # noqa: F401 -- fixtures
    effects_db,
    procs,
    spawn_worker,
    wait_ready,
)

import cantrip
from cantrip.distributed._dispatcher import Dispatcher
from cantrip.distributed._queue import WorkQueue
from cantrip.distributed._spells import spell_from_factory
from cantrip.loom import Loom
from cantrip.loom._postgres import PostgresStore
from gates import done

WORKLOAD = spell_from_factory("distributed_workload:build")
HOLDING = spell_from_factory("distributed_workload:holding")
TURNS = 5
LEASE_S = 10.0
"""The workers' leases here: long enough that a worker on a loaded machine (2 cores, load
20) never lets one run out between two heartbeats. A lease that ran out is a crash -- the
worker's own next claim reaps it and takes the cast again, at ``crashes`` 1 -- and these
tests are about casts handed back with none (losing a lease: tests/test_worker_faults.py)."""


def _until(what: str, ready: Callable[[], bool], log: Path, timeout: float = 60) -> None:
    """Wait for an event (polling what the test can see of it), at most ``timeout``."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"{what}: not after {timeout} s; {log.read_text()}"
        time.sleep(0.02)


def _said(log: Path, text: str) -> Callable[[], bool]:
    return lambda: text in log.read_text()


def _work(url: str) -> dict[int, dict[str, Any]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT w.id, w.entity_id, w.state, w.attempts, w.crashes, w.owner, w.spare, "
            "l.epoch, l.owner FROM cantrip_work w "
            "LEFT JOIN cantrip_leases l ON l.entity_id = w.entity_id"
        ).fetchall()
    keys = ("entity", "state", "attempts", "crashes", "owner", "spare", "epoch", "holder")
    return {int(r[0]): dict(zip(keys, r[1:], strict=True)) for r in rows}


def _effects(url: str, job: str) -> list[tuple[int, int]]:
    """(step, worker pid) of every effect ``job``'s gate calls had, in order."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT step, pid FROM chaos_effects WHERE job = %s ORDER BY id", (job,)
        ).fetchall()
    return [(int(s), int(p)) for s, p in rows]


def _turns(url: str, entity_id: str) -> int:
    loom = Loom.open(url)
    try:
        return len(loom.store.entity_turns(entity_id))  # type: ignore[attr-defined]
    finally:
        loom.close()


def _assert_intact(url: str, jobs: dict[str, str]) -> None:
    """Every cast's thread is whole, in order, each turn once, none cut off; no effect of
    a gate happened twice."""
    loom = Loom.open(url)
    try:
        for entity_id, job in jobs.items():
            last = loom.last_turn(entity_id)
            assert last is not None and last.terminated and last.result == f"{job} ok", entity_id
            thread = loom.thread(last.id)
            assert [t.sequence for t in thread] == list(range(1, TURNS + 1)), entity_id
            assert not [t for t in thread if t.reason == "cancelled"], entity_id
    finally:
        loom.close()
    with psycopg.connect(url) as conn:
        doubled = conn.execute(
            "SELECT job, step, count(*) FROM chaos_effects GROUP BY 1, 2 HAVING count(*) > 1"
        ).fetchall()
    assert doubled == []


def _handed_back(row: dict[str, Any]) -> None:
    """The row of a cast handed back: still running, nobody's, its next claim free."""
    assert row["state"] == "running" and row["owner"] is None and row["holder"] is None, row
    assert (row["attempts"], row["crashes"], row["spare"]) == (1, 0, True), row


def test_a_sigterm_during_120_casts_loses_none(
    effects_db: str,  # noqa: F811
    procs: list[subprocess.Popen[bytes]],  # noqa: F811
    tmp_path: Path,
) -> None:
    logs = [tmp_path / f"worker-{i}.log" for i in range(3)]
    env = {"CANTRIP_TEST_DB": effects_db, "WORKLOAD_LATENCY_MS": "100", "WORKLOAD_TURNS": "5"}
    dispatcher = Dispatcher(effects_db)
    jobs: dict[str, str] = {}
    works = []
    for i in range(120):
        work, entity_id = dispatcher.submit(WORKLOAD, f"job-{i}")
        works.append(work)
        jobs[entity_id] = f"job-{i}"
    procs.extend(
        spawn_worker(effects_db, logs[i], lease=LEASE_S, concurrency=64, **env) for i in range(2)
    )
    for i in range(2):
        wait_ready(logs[i], procs[i : i + 1])
    with psycopg.connect(effects_db, autocommit=True) as conn:

        def mid_cast() -> bool:  # every cast has a turn recorded
            row = conn.execute(
                "SELECT count(DISTINCT entity_id) FROM cantrip_turns t WHERE EXISTS "
                "(SELECT 1 FROM cantrip_work w WHERE w.entity_id = t.entity_id)"
            ).fetchone()
            return row is not None and row[0] == len(works)

        _until("every cast under way", mid_cast, logs[0])
        # the worker that runs more casts now is stopped: one that started first may have
        # ended all of its own already (owner: host:pid:suffix)
        running = conn.execute(
            "SELECT owner, count(*) FROM cantrip_work WHERE state = 'running' "
            "AND owner IS NOT NULL GROUP BY owner"
        ).fetchall()
        held = {int(owner.split(":")[-2]): int(n) for owner, n in running}
        index = max(range(2), key=lambda i: held.get(procs[i].pid, 0))
    stopped, stopped_log = procs[index], logs[index]
    stopped.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    assert stopped.wait(timeout=60) == 0, stopped_log.read_text()
    drained = time.monotonic() - sent
    procs.append(spawn_worker(effects_db, logs[2], lease=LEASE_S, concurrency=64, **env))
    wait_ready(logs[2], procs[-1:])  # a new one
    for work in works:
        state, outcome = dispatcher.wait(work, timeout=120)
        assert state in ("done", "cancelled"), (state, outcome)
    dispatcher.close()
    after = _work(effects_db)
    states = [after[w]["state"] for w in works]
    charged = [(after[w]["attempts"], after[w]["crashes"]) for w in works]
    handed = sum(1 for w in works if after[w]["epoch"] > 1)  # claimed again
    print(
        f"120 casts, SIGTERM to one of two workers: {states.count('done')} done, "
        f"{states.count('cancelled')} cancelled, {handed} handed back and resumed, "
        f"{sum(a > 1 for a, _ in charged)} charged an attempt, "
        f"{sum(c > 0 for _, c in charged)} counted a crash; the stopped worker exited "
        f"{drained:.2f} s after SIGTERM"
    )
    assert states == ["done"] * len(works), states
    assert charged == [(1, 0)] * len(works), (
        [after[w] for w in works if after[w]["crashes"] or after[w]["attempts"] != 1],
        [log.read_text() for log in logs],
    )
    assert handed > 0  # the stopped worker held casts mid-cast
    assert "handed back" in stopped_log.read_text()
    _assert_intact(effects_db, jobs)


def test_the_first_sigterm_stops_claiming_and_hands_back_at_the_turn_boundary(
    effects_db: str,  # noqa: F811
    procs: list[subprocess.Popen[bytes]],  # noqa: F811
    tmp_path: Path,
) -> None:
    """The cast is inside its second gate call at SIGTERM: that turn finishes and is
    recorded, the lease is handed back, and the worker -- whose slot is free then --
    claims neither it nor the cast queued behind it; the next worker goes on from turn 3."""
    log, later = tmp_path / "stopped.log", tmp_path / "next.log"
    hold = tmp_path / "hold"
    env = {
        "CANTRIP_TEST_DB": effects_db,
        "WORKLOAD_TURNS": str(TURNS),
        "WORKLOAD_HOLD_STEP": "2",
        "WORKLOAD_HOLD_FILE": str(hold),
    }
    dispatcher = Dispatcher(effects_db)
    held, held_entity = dispatcher.submit(HOLDING, "held")
    procs.append(spawn_worker(effects_db, log, lease=LEASE_S, concurrency=1, **env))
    stopped = procs[0]
    wait_ready(log, [stopped])
    _until("the second gate call began", lambda: len(_effects(effects_db, "held")) == 2, log)
    queued, queued_entity = dispatcher.submit(HOLDING, "queued")  # no slot free for it
    stopped.send_signal(signal.SIGTERM)
    _until("draining", _said(log, "draining"), log)
    hold.touch()  # the gate call returns: the turn ends, and the slot is free
    assert stopped.wait(timeout=60) == 0, log.read_text()
    before = _work(effects_db)
    _handed_back(before[held])
    assert _turns(effects_db, held_entity) == 2  # the turn in flight at SIGTERM, recorded
    assert before[queued]["state"] == "queued" and before[queued]["attempts"] == 0
    assert before[queued]["holder"] is None and before[queued]["epoch"] is None  # never leased
    procs.append(spawn_worker(effects_db, later, lease=LEASE_S, concurrency=1, **env))
    wait_ready(later, procs[-1:])
    for work in (held, queued):
        state, outcome = dispatcher.wait(work, timeout=60)
        assert state == "done", (state, outcome, later.read_text())
    dispatcher.close()
    after = _work(effects_db)
    assert [(after[w]["attempts"], after[w]["crashes"]) for w in (held, queued)] == [(1, 0)] * 2
    pids = [stopped.pid] * 2 + [procs[1].pid] * (TURNS - 3)
    assert _effects(effects_db, "held") == list(zip(range(1, TURNS - 1 + 1), pids, strict=True))
    _assert_intact(effects_db, {held_entity: "held", queued_entity: "queued"})


def _cut_off_and_resumed(
    url: str,
    procs: list[subprocess.Popen[bytes]],  # noqa: F811
    tmp_path: Path,
    stop: Callable[[subprocess.Popen[bytes], Path], None],
    *,
    drain_s: str,
    model: bool = False,
) -> float:
    """A cast stuck in its second turn -- in the gate call, or (``model``) in the model
    call -- when its worker is stopped by ``stop``: the worker hands it back without
    recording that turn and exits 0; the next worker finishes it, the gate call not run
    again (the journal says it started: its outcome is unknown). How long the worker took
    to exit after the first SIGTERM."""
    log, later = tmp_path / "stopped.log", tmp_path / "next.log"
    hold = tmp_path / "hold"
    env = {"CANTRIP_TEST_DB": url, "WORKLOAD_TURNS": str(TURNS), "WORKLOAD_HOLD_FILE": str(hold)}
    env["WORKLOAD_LLM_HOLD_TURN" if model else "WORKLOAD_HOLD_STEP"] = "2"
    dispatcher = Dispatcher(url)
    work, entity_id = dispatcher.submit(HOLDING if not model else WORKLOAD, "stuck")
    procs.append(spawn_worker(url, log, "--drain-s", drain_s, lease=LEASE_S, concurrency=4, **env))
    stopped = procs[0]
    wait_ready(log, [stopped])
    if model:
        _until("the second model call began", hold.with_suffix(".asked").exists, log)
    else:
        _until("the second gate call began", lambda: len(_effects(url, "stuck")) == 2, log)
    began = time.monotonic()
    stop(stopped, log)
    assert stopped.wait(timeout=60) == 0, log.read_text()
    took = time.monotonic() - began
    _handed_back(_work(url)[work])
    assert _turns(url, entity_id) == 1, log.read_text()  # the turn cut off is not recorded
    if model:
        hold.touch()  # (the next worker asks the model again)
    procs.append(spawn_worker(url, later, lease=LEASE_S, concurrency=4, **env))
    wait_ready(later, procs[-1:])
    state, outcome = dispatcher.wait(work, timeout=60)
    dispatcher.close()
    assert state == "done", (state, outcome, later.read_text())
    row = _work(url)[work]
    assert (row["attempts"], row["crashes"]) == (1, 0), row
    assert [s for s, _ in _effects(url, "stuck")] == list(range(1, TURNS)), log.read_text()
    _assert_intact(url, {entity_id: "stuck"})
    return took


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_second_sigterm_hands_back_at_once(
    effects_db: str,  # noqa: F811
    procs: list[subprocess.Popen[bytes]],  # noqa: F811
    tmp_path: Path,
    signum: signal.Signals,
) -> None:
    """(SIGINT -- Ctrl-C -- does what SIGTERM does.)"""

    def twice(worker: subprocess.Popen[bytes], log: Path) -> None:
        worker.send_signal(signum)
        _until("draining", _said(log, f"{signum.name}: draining"), log)
        worker.send_signal(signum)

    took = _cut_off_and_resumed(effects_db, procs, tmp_path, twice, drain_s="600")
    assert took < 60  # (the grace period was 600 s)
    assert "handing back at once" in (tmp_path / "stopped.log").read_text()


@pytest.mark.parametrize("model", [False, True], ids=["gate-call", "model-call"])
def test_the_grace_periods_end_hands_back_a_stuck_cast(
    effects_db: str,  # noqa: F811
    procs: list[subprocess.Popen[bytes]],  # noqa: F811
    tmp_path: Path,
    model: bool,
) -> None:
    def once(worker: subprocess.Popen[bytes], log: Path) -> None:
        worker.send_signal(signal.SIGTERM)

    took = _cut_off_and_resumed(effects_db, procs, tmp_path, once, drain_s="1", model=model)
    assert took >= 1  # the grace period, then at once
    assert "grace period (1 s) is over" in (tmp_path / "stopped.log").read_text()


# -- the parts: the turn boundary, and the queue's hand-back ----------------------------------


async def test_a_suspended_cast_stops_at_its_next_turn_boundary_and_resumes_from_there() -> None:
    """``Entity.suspend`` during turn 2: that turn is recorded whole, the cast raises
    ``CastSuspended`` before its next model call and records nothing more (no cut-off
    turn); a resumed entity continues from turn 3, each gate call run once."""
    charged: list[int] = []
    running: list[cantrip.Entity] = []

    @cantrip.gate
    def charge(job: str, step: int) -> str:
        charged.append(step)
        if step == 2:
            running[0].suspend()  # (the model is asked nothing more by this cast)
        return f"charged {job} step {step}"

    loom = Loom()
    spell = cantrip.Cantrip(
        llm=CountingLLM(0.0, TURNS),
        identity=cantrip.Identity(system_prompt="suspend"),
        circle=cantrip.Circle([done, charge], [cantrip.max_turns(TURNS + 5)]),
        loom=loom,
    )
    entity = spell.summon()
    running.append(entity)
    with pytest.raises(cantrip.CastSuspended):
        await entity.send("job")
    await entity.aclose()
    recorded = list(loom.entity_turns(entity.id))
    assert [(t.sequence, t.terminated, t.truncated) for t in recorded] == [
        (1, False, False),
        (2, False, False),
    ]
    assert charged == [1, 2]
    resumed = spell.resume(entity.id)
    result = await resumed.resume_cast("job", recorded)
    await resumed.aclose()
    assert result.terminated and result.result == "job ok"
    assert [t.sequence for t in loom.entity_turns(entity.id)] == list(range(1, TURNS + 1))
    assert charged == list(range(1, TURNS))


def test_a_handed_back_cast_is_claimed_again_at_no_attempt_and_no_crash(pg_url: str) -> None:
    """The queue's side: a hand-back releases the lease and leaves the row reaped and
    spare -- the next claim (another worker's, at once) costs no attempt even at the
    attempt limit, counts no crash, and sees the cast ``resumed``; a hand-back under a
    fence that is not the lease's any more changes nothing."""
    store = PostgresStore(pg_url, max_connections=2)
    try:
        queue = WorkQueue(store)
        queue.enqueue({"factory": "m:f"}, "kept", "entity-a")
        (first,) = queue.claim_many("stopping", 30, 1, max_attempts=1)
        assert queue.hand_back(first)
        assert not queue.hand_back(first)  # (given back already)
        (second,) = queue.claim_many("next", 30, 1, max_attempts=1)
        assert (second.attempt, second.resumed, second.fence.epoch) == (1, True, 2)
        assert not queue.hand_back(first)  # a stale fence hands nothing back
        with store.pool.connection() as conn:
            row = conn.execute(
                "SELECT state, owner, attempts, crashes, spare FROM cantrip_work"
            ).fetchone()
        assert row == ("running", "next", 1, 0, False)
    finally:
        store.close()


def test_a_negative_grace_period_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from cantrip.cli import _main as _cli

    code = _cli.main(["worker", "--db", "postgresql://nowhere/x", "--drain-s", "-1"])
    assert code == 1
    assert "--drain-s must be 0 or more seconds, not -1" in capsys.readouterr().err
