"""A worker restarted under the identity of one that died takes its casts back at once
(issue 46.3), fenced: the old process, if it still runs, can write nothing more to them.
A real PostgreSQL (tests/conftest.py), real worker processes and the chaos workload
(tests/distributed_workload.py: every turn's gate call inserts one effect row)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import distributed_workload
import psycopg
import pytest
import trio
from distributed_workload import EFFECTS_TABLE

from cantrip.distributed._dispatcher import Dispatcher
from cantrip.distributed._spells import spell_from_factory
from cantrip.distributed._worker import Worker
from cantrip.loom import Loom

TESTS = Path(__file__).resolve().parent
WORKLOAD = spell_from_factory("distributed_workload:build")
LONG_LEASE = 120.0
"""Far longer than any wait here: a cast taken back before it ran out was taken back by
its identity, not by lease expiry."""


@pytest.fixture
def db(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(EFFECTS_TABLE)
    Loom.open(pg_url).close()
    monkeypatch.setenv("CANTRIP_TEST_DB", pg_url)
    # the workload keeps one connection per process: another test's, to another
    # database, must not take this test's effects
    monkeypatch.setattr(distributed_workload, "_connection", None)
    return pg_url


def _effects(url: str) -> list[tuple[str, int, int]]:
    with psycopg.connect(url) as conn:
        return [
            (str(job), int(step), int(n))
            for job, step, n in conn.execute(
                "SELECT job, step, count(*) FROM chaos_effects GROUP BY job, step ORDER BY 1, 2"
            ).fetchall()
        ]


def _wait_for_effects(url: str, at_least: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while sum(n for _, _, n in _effects(url)) < at_least:
        assert time.monotonic() < deadline, "the cast never got going"
        time.sleep(0.05)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _worker(url: str, worker_id: str, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "cantrip", "worker", "--db", url, "--worker-id", worker_id,
         "--lease", str(LONG_LEASE)],
        env={**os.environ, "PYTHONPATH": str(TESTS), "CANTRIP_TEST_DB": url,
             "WORKLOAD_LATENCY_MS": "200"},
        stdout=subprocess.DEVNULL, stderr=log.open("ab"),
    )  # fmt: skip


def test_a_worker_restarted_under_its_identity_takes_its_cast_back_at_once(
    db: str, procs: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    dispatcher = Dispatcher(db)
    work_id, _ = dispatcher.submit(WORKLOAD, "job-a")
    procs.append(_worker(db, "host-1:slot-0", tmp_path / "a.log"))
    _wait_for_effects(db, 2)
    procs[0].send_signal(signal.SIGKILL)  # died mid-cast, its lease good for two minutes
    procs[0].wait()
    restarted = time.monotonic()
    with psycopg.connect(db) as conn:
        (restarted_at,) = conn.execute("SELECT clock_timestamp()").fetchone()  # type: ignore[misc]
    procs.append(_worker(db, "host-1:slot-0", tmp_path / "b.log"))
    state, outcome = dispatcher.wait(work_id, timeout=60)
    finished_in = time.monotonic() - restarted
    dispatcher.close()
    assert (state, outcome["turns"]) == ("done", 10), outcome
    assert finished_in < LONG_LEASE / 2  # not after the lease ran out
    assert all(n == 1 for _, _, n in _effects(db)), _effects(db)  # no effect doubled
    with psycopg.connect(db) as conn:
        (taken_after,) = conn.execute(  # type: ignore[misc]
            "SELECT extract(epoch FROM claimed_at - %s) FROM cantrip_work WHERE id = %s",
            (restarted_at, work_id),
        ).fetchone()
    print(f"taken back {float(taken_after):.2f} s after the restart began")  # the figure
    assert float(taken_after) < 15  # a process start and one claim, even on a loaded machine
    log = (tmp_path / "b.log").read_text()
    assert "took back 1 cast(s) of its identity" in log, log


async def test_the_old_process_under_that_identity_is_fenced_off(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both workers alive at once under one identity (a restart while the old process
    still runs): the new one takes the cast, the old one's writes are refused, and the
    thread has every turn once and every effect once."""
    monkeypatch.setenv("WORKLOAD_LATENCY_MS", "150")
    dispatcher = await trio.to_thread.run_sync(Dispatcher, db)
    work_id, entity = await trio.to_thread.run_sync(lambda: dispatcher.submit(WORKLOAD, "job-b"))
    async with trio.open_nursery() as nursery:
        old = Worker(db, worker_id="host-2:slot-0", lease_s=LONG_LEASE)
        await nursery.start(old.run)
        await trio.to_thread.run_sync(_wait_for_effects, db, 2)
        new = Worker(db, worker_id="host-2:slot-0", lease_s=LONG_LEASE)
        await nursery.start(new.run)
        assert new.reclaimed == 1
        with trio.fail_after(60):
            state, outcome = await trio.to_thread.run_sync(
                lambda: dispatcher.wait(work_id, timeout=60)
            )
        nursery.cancel_scope.cancel()
    dispatcher.close()
    assert (state, outcome["turns"]) == ("done", 10), outcome
    loom = Loom.open(db)
    turns = loom.entity_turns(entity)
    loom.close()
    assert [t.sequence for t in turns] == list(range(1, 11))
    assert all(n == 1 for _, _, n in _effects(db)), _effects(db)
