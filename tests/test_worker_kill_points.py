"""Kill -9 at every point of a turn: no effect doubled, no turn lost (issue 46.2).

A worker process (``tests/kill_points.py``: ``cantrip worker`` that SIGKILLs itself
once, at a named point of turn 2) runs one cast of the chaos workload
(``tests/distributed_workload.py``: each turn but the last calls ``charge``, which
inserts one effect row). A worker started again under the same identity takes the cast
back at once (issue 46.3) and finishes it. Whatever the point, the thread is turns 1..5
once each, no step's effect is there twice, and every step either took effect or is
recorded as an unknown outcome -- the guarantees the journal keeps however few pieces
of a turn it writes (each once: ``cantrip._journal``). A real PostgreSQL
(tests/conftest.py) and real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import distributed_workload
import psycopg
import pytest
from distributed_workload import EFFECTS_TABLE

from cantrip.distributed._dispatcher import Dispatcher
from cantrip.distributed._spells import spell_from_factory
from cantrip.loom import Loom

TESTS = Path(__file__).resolve().parent
WORKLOAD = spell_from_factory("distributed_workload:build")
TURNS = 5
KILLING_WORKER = [sys.executable, str(TESTS / "kill_points.py"), "worker", "--db"]


@pytest.fixture
def db(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(EFFECTS_TABLE)
    Loom.open(pg_url).close()
    monkeypatch.setattr(distributed_workload, "_connection", None)
    return pg_url


def _worker(url: str, point: str, mark: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*KILLING_WORKER, url, "--worker-id", f"kp-{point}", "--lease", "120"],
        env={
            **os.environ,
            "PYTHONPATH": str(TESTS),
            "CANTRIP_TEST_DB": url,
            "WORKLOAD_TURNS": str(TURNS),
            "KILL_POINT": point,
            "KILL_SEQUENCE": "2",
            "KILL_MARK": str(mark),
        },
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab"),
    )


@pytest.mark.parametrize(
    ("point", "unknown"),
    [
        ("before_start", False),  # nothing of turn 2 durable: it is taken again whole
        ("after_start", True),  # started, never ran: not run again, outcome unknown
        ("in_gate", True),  # ran, result never journaled: not run again, unknown
        ("before_turn", None),  # returned, its result committed with the turn: either
        ("after_turn", False),  # recorded: the next turn goes on
    ],
)
def test_kill_9_at_every_point_of_a_turn_doubles_no_effect_and_loses_no_turn(
    db: str, tmp_path: Path, point: str, unknown: bool | None
) -> None:
    mark, log = tmp_path / "killed", tmp_path / "worker.log"
    dispatcher = Dispatcher(db)
    try:
        work_id, entity_id = dispatcher.submit(WORKLOAD, "job-k")
        first = _worker(db, point, mark, log)
        assert first.wait(timeout=120) == -signal.SIGKILL, log.read_text()
        assert mark.exists()
        again = _worker(db, point, mark, log)  # the same identity: takes it back at once
        try:
            state, _ = dispatcher.wait(work_id, timeout=120)
        finally:
            again.terminate()
            again.wait(timeout=60)
    finally:
        dispatcher.close()
    assert state == "done", log.read_text()
    loom = Loom.open(db)
    try:
        last = loom.last_turn(entity_id)
        assert last is not None and last.terminated
        thread = loom.thread(last.id)
        assert [t.sequence for t in thread] == list(range(1, TURNS + 1))  # no turn lost
        unknowns = {
            t.sequence for t in thread for r in t.gate_calls if r.detail.get("outcome_unknown")
        }
    finally:
        loom.close()
    with psycopg.connect(db) as conn:
        effects = dict(
            conn.execute("SELECT step, count(*) FROM chaos_effects GROUP BY step").fetchall()
        )
    assert all(n == 1 for n in effects.values()), effects  # no effect doubled
    for step in range(1, TURNS):  # each step took effect, or says it may have
        assert step in effects or step in unknowns, (step, effects, unknowns)
    if unknown is not None:
        assert unknowns == ({2} if unknown else set()), unknowns
    else:
        assert unknowns <= {2}, unknowns
    if point in ("in_gate", "before_turn"):
        assert effects.get(2) == 1  # it did take effect, once
    if point == "after_start":
        assert 2 not in effects  # never ran, and was not run again
