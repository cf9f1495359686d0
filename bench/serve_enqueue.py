"""Many clients prompting one ``cantrip serve --db`` replica at once: how fast the prompts
are queued, and how many commits that costs (issue 46.1).

A throwaway PostgreSQL cluster with the durable defaults (fsync, synchronous commit and
full-page writes on: a commit is an fsync) and ``pg_stat_statements``, one replica and no
worker. ``--prompts`` sessions are made first; then as many clients each ``POST`` one
prompt to their own session at the same moment, and the clock runs until every prompt is
on the queue (``cantrip_prompts``, polled from a monitor connection) -- the prompts' own
requests then wait on casts no worker runs, and are dropped.

Printed: the wall time to queue them all, prompts queued per second, and what the replica
committed per prompt -- ``COMMIT`` statements (its write transactions: ``pg_stat_statements``)
and every transaction, reads included (``pg_stat_database.xact_commit``, read after the
replica has exited so its counters are flushed), and of those the reads (every
transaction but the write commits: the route's look at the session, the waiters' looks
at their prompts' work).

    python bench/serve_enqueue.py [--prompts 1000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psycopg
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from pg_cluster import fresh_database, postgres_cluster  # noqa: E402

DURABLE = (
    "-c fsync=on -c synchronous_commit=on -c full_page_writes=on "
    "-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all "
    "-c pg_stat_statements.track_utility=on -c max_connections=300"
)
KEY = "serve-enqueue-bench-key"
SPEC = """
[llm]
provider = "openai"
model = "gpt-5-mini"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "SERVE_ENQUEUE_BENCH_KEY"
[circle]
medium = "conversation"
gates = ["done"]
wards = [{ max_turns = 5 }]
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _commits(mon: psycopg.Connection[tuple[object, ...]]) -> tuple[int, int]:
    """(COMMIT statements, transactions) of this database so far."""
    mon.execute("SELECT pg_stat_clear_snapshot()")
    row = mon.execute(
        "SELECT (SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s "
        "WHERE s.dbid = d.datid AND s.query = 'COMMIT'), d.xact_commit "
        "FROM pg_stat_database d WHERE d.datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])  # type: ignore[call-overload]


async def _burst(base: str, sessions: list[str], url: str) -> tuple[float, int]:
    """Every session's prompt at once; the seconds until all are on the queue, and the
    looks that took (each one transaction)."""
    limits = httpx.Limits(max_connections=len(sessions) + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base, timeout=300, limits=limits) as client:

        async def one(sid: str) -> None:
            await client.post(f"/sessions/{sid}/prompt", json={"prompt": "go"})

        looks = 0
        with psycopg.connect(url, autocommit=True) as mon:

            def queued() -> int:
                nonlocal looks
                looks += 1
                row = mon.execute("SELECT count(*) FROM cantrip_prompts").fetchone()
                return int(row[0]) if row else 0

            async with trio.open_nursery() as nursery:
                start = time.perf_counter()
                for sid in sessions:
                    nursery.start_soon(one, sid)
                while await trio.to_thread.run_sync(queued) < len(sessions):
                    await trio.sleep(0.005)
                wall = time.perf_counter() - start
                nursery.cancel_scope.cancel()  # the requests wait on casts no worker runs
    return wall, looks


def run(
    server: str, name: str, prompts: int, spec: Path, env: dict[str, str]
) -> tuple[float, int, int]:
    url = fresh_database(server, name)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    port = _port()
    replica = subprocess.Popen(
        [sys.executable, "-m", "cantrip", "serve", str(spec), "--db", url, "--port", str(port)],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                httpx.get(base + "/health", timeout=2)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        with httpx.Client(base_url=base, timeout=60) as client:
            sessions = [client.post("/sessions").json()["session_id"] for _ in range(prompts)]
        with psycopg.connect(url, autocommit=True) as mon:
            time.sleep(1.5)  # the replica's counters so far are flushed
            commits0, xacts0 = _commits(mon)
            wall, looks = trio.run(_burst, base, sessions, url)
            commits1, _ = _commits(mon)
            replica.terminate()
            replica.wait(timeout=60)
            time.sleep(1.5)  # its backends exit and flush their counters
            _, xacts1 = _commits(mon)
    finally:
        replica.kill()
        replica.wait()
    # less the bench's own: its looks, and the monitor's two reads of the counters
    return wall, commits1 - commits0, xacts1 - xacts0 - looks - 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="cantrip-serve-enqueue-"))
    spec = root / "spec.toml"
    spec.write_text(SPEC)
    env = {**os.environ, "SERVE_ENQUEUE_BENCH_KEY": KEY,
           "CANTRIP_PROVIDERS_DIR": str(root / "providers")}  # fmt: skip
    with postgres_cluster(DURABLE) as server:
        runs = [run(server, f"burst_{n}", args.prompts, spec, env) for n in range(args.repeats)]
    for wall, commits, xacts in runs:
        print(
            f"{args.prompts} concurrent prompts to one serve --db replica: queued in "
            f"{wall:.2f} s ({args.prompts / wall:.0f} prompts/s); per prompt "
            f"{commits / args.prompts:.3f} write commits, {xacts / args.prompts:.2f} "
            f"transactions (reads included: {(xacts - commits) / args.prompts:.2f} reads)"
        )


if __name__ == "__main__":
    main()
