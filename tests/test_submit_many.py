"""Many casts queued in one statement and one commit (issue 46.1):
``Dispatcher.submit_many``. Against a real PostgreSQL (tests/conftest.py) and a real
worker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from cantrip._errors import CantripError
from cantrip.distributed._dispatcher import Dispatcher
from cantrip.distributed._spells import spell_from_factory
from cantrip.distributed._worker import Worker
from cantrip.loom import Loom

WORKLOAD = spell_from_factory("distributed_workload:build")


def _rows(url: str) -> list[tuple[str, str, str]]:
    """Every work row: entity, intent, and the transaction that wrote it."""
    with psycopg.connect(url) as conn:
        return [
            (str(e), str(i), str(x))
            for e, i, x in conn.execute(
                "SELECT entity_id, intent, xmin::text FROM cantrip_work ORDER BY id"
            ).fetchall()
        ]


def test_a_batch_is_one_transaction_with_a_new_entity_per_intent(pg_url: str) -> None:
    dispatcher = Dispatcher(pg_url)
    intents = [f"job-{n}" for n in range(50)]
    queued = dispatcher.submit_many(WORKLOAD, intents)
    dispatcher.close()
    assert len(queued) == 50 and len({entity for _, entity in queued}) == 50
    rows = _rows(pg_url)
    assert [(e, i) for e, i, _ in rows] == [
        (e, i) for (_, e), i in zip(queued, intents, strict=True)
    ]
    assert len({x for _, _, x in rows}) == 1  # one commit for the lot
    assert [w for w, _ in queued] == sorted(w for w, _ in queued)


async def test_a_worker_runs_every_cast_of_a_batch(pg_url: str) -> None:
    dispatcher = await trio.to_thread.run_sync(Dispatcher, pg_url)
    intents = [f"job-{n}" for n in range(6)]
    queued = await trio.to_thread.run_sync(lambda: dispatcher.submit_many(WORKLOAD, intents))
    outcomes: list[tuple[str, Any]] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(Worker(pg_url, concurrency=3).run)
        for work, _ in queued:
            state, outcome = await trio.to_thread.run_sync(
                lambda w=work: dispatcher.wait(w, timeout=60)
            )
            outcomes.append((state, outcome["result"]))
        nursery.cancel_scope.cancel()
    dispatcher.close()
    assert outcomes == [("done", f"{intent} ok") for intent in intents]


def test_a_bad_intent_or_a_secret_in_the_spell_writes_nothing(pg_url: str) -> None:
    dispatcher = Dispatcher(pg_url)
    with pytest.raises(CantripError):
        dispatcher.submit_many(WORKLOAD, ["fine", "  "])
    leaky = {
        "spec": {"circle": {"mcp": [{"name": "x", "command": "y", "env": {"TOKEN": "sk-lit"}}]}}
    }
    with pytest.raises(CantripError):
        dispatcher.submit_many(leaky, ["fine"])
    assert dispatcher.submit_many(WORKLOAD, []) == []
    dispatcher.close()
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM cantrip_work").fetchone() == (0,)


def test_a_retry_after_a_lost_reply_queues_nothing_twice(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch committed but the reply was lost (the connection broke after the
    commit): the retry finds the batch's work instead of queuing it again."""
    dispatcher = Dispatcher(pg_url)
    real = dispatcher.queue.enqueue_many
    tries = []

    def committed_then_lost(spell: dict[str, Any], work: Any) -> dict[str, int]:
        ids = real(spell, work)
        tries.append(ids)
        if len(tries) == 1:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return ids

    monkeypatch.setattr(dispatcher.queue, "enqueue_many", committed_then_lost)
    queued = dispatcher.submit_many(WORKLOAD, ["a", "b", "c"])
    dispatcher.close()
    assert len(tries) == 1  # the retry looked, found the batch, queued nothing
    assert [w for w, _ in queued] == [tries[0][e] for _, e in queued]
    assert [i for _, i, _ in _rows(pg_url)] == ["a", "b", "c"]


def test_cast_db_with_intents_queues_them_in_one_commit_and_prints_each(
    pg_url: str, tmp_path: Path
) -> None:
    """``cantrip cast SPEC --db URL --intents FILE --json``: one JSON object per intent,
    in the file's order, from a real worker process."""
    spec = tmp_path / "echo.toml"
    spec.write_text(
        '[llm]\nprovider = "scripted"\nresponses = [{ content = "answered" }]\n'
        '[circle]\nmedium = "conversation"\ngates = ["done"]\nwards = [{ max_turns = 2 }]\n'
    )
    (tmp_path / "intents.txt").write_text("first\n\nsecond\nthird\n")
    Loom.open(pg_url).close()  # the schema, before the worker and the client race for it
    worker = subprocess.Popen(
        [sys.executable, "-m", "cantrip", "worker", "--db", pg_url, "--concurrency", "4"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        run = subprocess.run(
            [sys.executable, "-m", "cantrip", "cast", str(spec), "--db", pg_url,
             "--intents", "intents.txt", "--json"],
            cwd=tmp_path, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        worker.kill()
        worker.wait()
    assert run.returncode == 0, run.stderr
    assert "queued 3 casts in one commit" in run.stderr
    outcomes = [json.loads(line) for line in run.stdout.splitlines()]
    assert [(o["state"], o["result"]) for o in outcomes] == [("done", "answered")] * 3
    assert len({o["entity_id"] for o in outcomes}) == 3
    intents = {i for e, i, _ in _rows(pg_url) if e in {o["entity_id"] for o in outcomes}}
    assert intents == {"first", "second", "third"}


def test_intents_without_db_is_a_usage_error(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "cantrip", "cast", "spec.toml", "--intents", "x.txt"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2
    assert "--intents queues casts for workers: give it with --db" in run.stderr
