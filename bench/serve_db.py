"""``cantrip serve --db``: what a prompt through a replica costs, and what waiting costs.

What it measures
----------------
A throwaway PostgreSQL (``tests/pg_cluster.py``, fsync off), a loopback OpenAI
server answering at once (``tests/serve_db_llm.py``: one ``done`` per prompt),
two ``cantrip worker`` processes and one ``cantrip serve --db`` replica.

**Latency, one at a time.** ``--sequential`` prompts on one session, each
waiting for the last: the round trip through the replica (HTTP -> enqueue ->
NOTIFY -> worker claim -> cast -> finish NOTIFY -> replica reads the result
from the loom) beside the same cast enqueued directly with ``Dispatcher``
(``cantrip cast --db``'s path, no HTTP, no result rebuilding). p50 and p99.

**Many waiting at once.** ``--concurrent`` sessions each send one prompt at
the same moment; wall time, p50/p99 of the prompts, and the replica's OS
thread count sampled while they wait (a thread per waiting request would
show as hundreds; the replica waits with one LISTEN connection).

How to run
----------
From the repository root::

    python bench/serve_db.py                    # 50 sequential, 200 concurrent
    python bench/serve_db.py --concurrent 500
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from pg_cluster import fresh_database, postgres_cluster  # noqa: E402
from serve_db_llm import KEY  # noqa: E402

from cantrip.distributed._dispatcher import Dispatcher  # noqa: E402
from cantrip.distributed._spells import spell_from_spec  # noqa: E402

SPEC = """
[llm]
provider = "openai"
model = "gpt-5-mini"
base_url = "{base_url}"
api_key_env = "SERVE_DB_TEST_KEY"
[circle]
medium = "conversation"
gates = ["done", "echo"]
wards = [{{ max_turns = 5 }}]
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ms(values: list[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"p50 {statistics.median(ordered) * 1000:7.1f} ms  p99 {p99 * 1000:7.1f} ms"


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return -1


async def _concurrent(base: str, n: int, pid: int) -> None:
    limits = httpx.Limits(max_connections=n + 10)
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as client:
        sessions = [(await client.post("/sessions")).json()["session_id"] for _ in range(n)]
        latencies: list[float] = []
        peak = 0

        async def one(sid: str) -> None:
            start = time.perf_counter()
            response = await client.post(f"/sessions/{sid}/prompt", json={"prompt": "go"})
            assert response.status_code == 200, response.text
            latencies.append(time.perf_counter() - start)

        async def sample() -> None:
            nonlocal peak
            while True:
                peak = max(peak, _threads(pid))
                await trio.sleep(0.05)

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample)
            async with trio.open_nursery() as prompts:
                for sid in sessions:
                    prompts.start_soon(one, sid)
            nursery.cancel_scope.cancel()
        wall = time.perf_counter() - start
    print(f"{n} prompts at once through one replica: wall {wall:.2f} s, {_ms(latencies)}")
    print(f"  replica OS threads while they waited: peak {peak} (idle {_threads(pid)})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sequential", type=int, default=50)
    parser.add_argument("--concurrent", type=int, default=200)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="cantrip-serve-db-bench-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests"), "SERVE_DB_TEST_KEY": KEY,
           "CANTRIP_PROVIDERS_DIR": str(root / "providers")}  # fmt: skip
    os.environ.update({"SERVE_DB_TEST_KEY": KEY})
    procs: list[subprocess.Popen[bytes]] = []
    with postgres_cluster() as server:
        url = fresh_database(server, "bench")
        try:
            llm = subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "serve_db_llm.py"), "--turns", "1"],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            procs.append(llm)
            assert llm.stdout is not None
            spec = root / "spec.toml"
            spec.write_text(SPEC.format(base_url=llm.stdout.readline().decode().split()[1]))
            for _ in range(2):
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "cantrip", "worker", "--db", url,
                     "--concurrency", "200"], env=env, stderr=subprocess.DEVNULL))  # fmt: skip
            port = _port()
            replica = subprocess.Popen(
                [sys.executable, "-m", "cantrip", "serve", str(spec), "--db", url,
                 "--port", str(port)], env=env, stderr=subprocess.DEVNULL)  # fmt: skip
            procs.append(replica)
            base = f"http://127.0.0.1:{port}"
            while True:
                try:
                    httpx.get(base + "/health", timeout=2)
                    break
                except httpx.TransportError:
                    time.sleep(0.1)
            with httpx.Client(base_url=base, timeout=60) as client:
                sid = client.post("/sessions").json()["session_id"]
                client.post(f"/sessions/{sid}/prompt", json={"prompt": "warm up"})
                http: list[float] = []
                for _ in range(args.sequential):
                    start = time.perf_counter()
                    client.post(f"/sessions/{sid}/prompt", json={"prompt": "go"})
                    http.append(time.perf_counter() - start)
            dispatcher = Dispatcher(url)
            spell = spell_from_spec(spec)
            direct: list[float] = []
            _, entity = dispatcher.submit(spell, "warm up")
            for _ in range(args.sequential):
                start = time.perf_counter()
                work, _ = dispatcher.submit(spell, "go", entity_id=entity)
                dispatcher.wait(work)
                direct.append(time.perf_counter() - start)
            dispatcher.close()
            print(f"one prompt at a time ({args.sequential}), zero LLM latency, 2 workers:")
            print(f"  through a serve --db replica: {_ms(http)}")
            print(f"  Dispatcher.submit + wait:     {_ms(direct)}")
            trio.run(_concurrent, base, args.concurrent, replica.pid)
            dispatcher = Dispatcher(url)
            start = time.perf_counter()
            works = [dispatcher.submit(spell, "go")[0] for _ in range(args.concurrent)]
            for work in works:
                dispatcher.wait(work)
            wall = time.perf_counter() - start
            dispatcher.close()
            print(f"  the same {args.concurrent} casts enqueued at once with Dispatcher "
                  f"(no HTTP): wall {wall:.2f} s")  # fmt: skip
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()


if __name__ == "__main__":
    main()
