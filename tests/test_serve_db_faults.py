"""``serve --db`` replicas, workers and clients under faults, all real processes:

* **a worker killed and replaced under load** -- two replicas and two workers with a
  1 s lease take 200 prompts while one worker is SIGKILLed and a new one started: all
  200 are answered, every cast ``done``, none ``cancelled`` or ``crashed``;
* **a PostgreSQL restart** (``pg_ctl stop -m fast``, then start on the same port and
  data directory) while two workers run 100 casts, a ``cantrip cast --db`` waits, a
  ``Dispatcher`` made before the restart waits and a prompt waits at a replica: every
  process stays up and every cast finishes; while the database is down the replica
  answers ``503`` with ``Retry-After``.

Each prints its figures (``-s`` shows them).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import trio
from distributed_workload import EFFECTS_TABLE, TAKEN_OVER
from pg_cluster import fresh_database, postgres_cluster, start_cluster, stop_cluster
from test_serve_db import Stack, open_stack

from cantrip.distributed._dispatcher import Dispatcher
from cantrip.distributed._spells import spell_from_factory

WORKLOAD = spell_from_factory("distributed_workload:build")


async def _turn_reasons(stack: Stack) -> dict[str, int]:
    rows = await stack.query(
        "SELECT coalesce(data::json->>'reason', ''), count(*) FROM cantrip_turns GROUP BY 1"
    )
    return {r: int(n) for r, n in rows}


async def test_two_hundred_prompts_while_a_worker_is_killed_and_replaced(
    pg_server: str, tmp_path: Path
) -> None:
    url = fresh_database(pg_server, "kill_200")
    prompts = 200
    busy = ("--concurrency", "64")  # each worker holds many casts: busy heartbeats
    with open_stack(url, tmp_path, workers=0, replicas=2, delay_s=0.4) as stack:
        for _ in range(2):
            await trio.to_thread.run_sync(stack.start_worker, *busy)
        answers: dict[int, tuple[int, dict[str, Any]]] = {}
        took: list[float] = []

        async def prompt(i: int, client: httpx.AsyncClient) -> None:
            began = time.monotonic()
            sid = (await client.post("/sessions")).json()["session_id"]
            response = await client.post(f"/sessions/{sid}/prompt", json={"prompt": f"p{i}"})
            answers[i] = (response.status_code, response.json())
            took.append(time.monotonic() - began)

        started = time.monotonic()
        clients = [httpx.AsyncClient(base_url=b, timeout=180) for b in stack.replicas]
        try:
            async with trio.open_nursery() as nursery:
                for i in range(prompts):
                    nursery.start_soon(prompt, i, clients[i % 2])
                while len(answers) < prompts // 4:  # a quarter answered: kill one mid-load
                    await trio.sleep(0.05)
                victim = stack.workers[0]
                victim.kill()
                await trio.to_thread.run_sync(victim.wait)
                killed_at = len(answers)
                await trio.to_thread.run_sync(stack.start_worker, *busy)
        finally:
            for client in clients:
                await client.aclose()
        elapsed = time.monotonic() - started
        bad = {i: a for i, a in answers.items() if a[0] != 200 or a[1]["result"] != f"p{i} ok #1"}
        assert not bad, (list(bad.items())[:3], stack.log.read_text()[-3000:])
        states = dict(await stack.query("SELECT state, count(*) FROM cantrip_work GROUP BY 1"))
        reasons = await _turn_reasons(stack)
        (taken_over,) = (await stack.query(TAKEN_OVER))[0]
        assert states == {"done": prompts}, states
        assert "cancelled" not in reasons and "crashed" not in reasons, reasons
        alive = [w.poll() is None for w in stack.workers]
        assert alive == [False, True, True], stack.log.read_text()[-3000:]
    took.sort()
    print(
        f"\n200-prompt kill test (lease 1 s): {prompts}/{prompts} answered 200 and done in "
        f"{elapsed:.1f} s; worker killed after {killed_at} answers; {taken_over} casts taken "
        f"over; cancelled 0, crashed 0; per prompt p50 {statistics.median(took):.2f} s, "
        f"max {took[-1]:.2f} s"
    )


async def test_a_database_restart_is_waited_out_by_workers_replicas_and_clients(
    tmp_path: Path,
) -> None:
    casts = 100
    with postgres_cluster() as server:
        url = fresh_database(server, "restart")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(EFFECTS_TABLE)
        env = {"CANTRIP_TEST_DB": url, "WORKLOAD_LATENCY_MS": "100"}
        with open_stack(url, tmp_path, workers=0, replicas=1, delay_s=0.3, **env) as stack:
            for _ in range(2):
                await trio.to_thread.run_sync(stack.start_worker, "--concurrency", "64")
            dispatcher = await trio.to_thread.run_sync(Dispatcher, url)
            works = [
                (await trio.to_thread.run_sync(dispatcher.submit, WORKLOAD, f"job-{i}"))[0]
                for i in range(casts)
            ]
            waiting = subprocess.Popen(  # a `cast --db` that waits across the restart
                [
                    *(sys.executable, "-m", "cantrip", "cast", str(stack.spec), "across"),
                    *("--db", url, "--json"),
                ],
                env=stack.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            replica = stack.replicas[0]
            prompted: dict[str, Any] = {}
            async with httpx.AsyncClient(base_url=replica, timeout=120) as client:

                async def prompt() -> None:
                    sid = (await client.post("/sessions")).json()["session_id"]
                    response = await client.post(
                        f"/sessions/{sid}/prompt", json={"prompt": "through"}
                    )
                    prompted.update(status=response.status_code, body=response.json())

                def done_count() -> int:
                    return sum(1 for w in works if dispatcher.queue.status(w)[0] == "done")

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(prompt)
                    while await trio.to_thread.run_sync(done_count) < 5:
                        await trio.sleep(0.05)
                    done_before = await trio.to_thread.run_sync(done_count)
                    await trio.to_thread.run_sync(stop_cluster, url)
                    stopped = time.monotonic()
                    down = await client.get("/health")
                    refused = await client.post("/sessions")
                    await trio.sleep(1.5)
                    await trio.to_thread.run_sync(start_cluster, url)
                    restarted = time.monotonic()
                    waited = [
                        await trio.to_thread.run_sync(lambda w=w: dispatcher.wait(w, timeout=120))
                        for w in works
                    ]
                    recovered = time.monotonic()
            out, err = await trio.to_thread.run_sync(lambda: waiting.communicate(timeout=120))
            assert down.status_code == 503 and down.headers["retry-after"], down.text
            assert down.json()["error"]["code"] == "database_unavailable"
            assert refused.status_code == 503 and refused.headers["retry-after"]
            assert [s for s, _ in waited] == ["done"] * casts, stack.log.read_text()[-3000:]
            assert waiting.returncode == 0, err.decode()
            assert json.loads(out)["state"] == "done"
            assert prompted["status"] == 200 and prompted["body"]["result"] == "through ok #1"
            assert [w.poll() for w in stack.workers] == [None, None], stack.log.read_text()
            assert all(p.poll() is None for p in stack.procs if p not in stack.workers)
            log = stack.log.read_text()
            assert "bug in cantrip" not in log, log[-3000:]
            assert "reconnected to the database" in log
            (taken_over,) = (await stack.query(TAKEN_OVER))[0]
            doubled = await stack.query(
                "SELECT job, step FROM chaos_effects GROUP BY 1, 2 HAVING count(*) > 1"
            )
            await trio.to_thread.run_sync(dispatcher.close)
    assert doubled == []
    print(
        f"\nrestart test: {casts}/{casts} casts done ({done_before} before the stop), "
        f"the waiting cast --db and replica prompt done; down {restarted - stopped:.1f} s, "
        f"all finished {recovered - restarted:.1f} s after the start; {taken_over} casts "
        "claimed again"
    )


async def test_a_dead_lettered_prompt_is_reported_by_the_replica_and_cast_db(
    pg_server: str, tmp_path: Path
) -> None:
    """Work dead-lettered while its clients wait (here by the statement a worker's claim
    runs, once the item's last allowed attempt has run out) is reported to each of them:
    the replica answers 500 ``cast_dead_lettered``, ``cast --db`` prints why and exits 1."""
    from cantrip.distributed._queue import _REAP
    from cantrip.distributed._work import WORK_CHANNEL

    url = fresh_database(pg_server, "dead_letter")
    with open_stack(url, tmp_path, workers=0, replicas=1) as stack:
        waiting = subprocess.Popen(
            [
                *(sys.executable, "-m", "cantrip", "cast", str(stack.spec), "doomed"),
                *("--db", url),
            ],
            env=stack.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        async with httpx.AsyncClient(base_url=stack.replicas[0], timeout=60) as client:
            sid = (await client.post("/sessions")).json()["session_id"]
            answered: list[httpx.Response] = []

            async def prompt() -> None:
                answered.append(await client.post(f"/sessions/{sid}/prompt", json={"prompt": "x"}))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(prompt)
                while len(await stack.query("SELECT 1 FROM cantrip_work")) < 2:
                    await trio.sleep(0.05)
                with psycopg.connect(url, autocommit=True) as conn:
                    # two claims whose runs stopped on faults the runtime caught: each
                    # gave its lease up (released: owner NULL)
                    conn.execute(
                        "UPDATE cantrip_work SET state = 'running', attempts = 2, "
                        "result = '{}', owner = 'gone', epoch = 1"
                    )
                    conn.execute(
                        "INSERT INTO cantrip_leases (entity_id, owner, epoch) "
                        "SELECT entity_id, NULL, 1 FROM cantrip_work"
                    )
                    conn.execute(
                        _REAP,
                        {"max_attempts": 2, "quarantine_after": 2, "channel": WORK_CHANNEL},
                    )
        out, err = await trio.to_thread.run_sync(lambda: waiting.communicate(timeout=60))
    (response,) = answered
    assert response.status_code == 500, response.text
    assert response.json()["error"]["code"] == "cast_dead_lettered"
    assert "dead-lettered after 2 attempts" in response.json()["error"]["message"]
    assert waiting.returncode == 1
    assert "dead-lettered after 2 attempts" in err.decode() and not out
