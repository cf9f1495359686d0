"""`cantrip serve` under load: 200 sessions prompting at once, through the real OpenAI adapter.

Run: ``python bench/serve_load.py [--sessions 200] [--waves 3] [--turns 5]``.

Three processes, as an operator would run them on one machine:

* a loopback OpenAI-compatible provider (``tests/fake_providers.FakeOpenAI``:
  the Chat Completions wire format, streamed, with its request validation),
  answering every call after ``--latency`` seconds: ``echo`` until the cast's
  last turn, then ``done`` -- worked out from the conversation, like a real,
  stateless model;
* ``cantrip serve`` on a spec whose ``[llm]`` is ``provider = "openai"`` with
  ``base_url`` pointing at that provider, recording into a SQLite loom;
* this process, the client: httpx with one connection per session.

Prints: creating the N sessions at once on fresh connections (p50 / p99, and
the kernel's listen-queue overflows); per wave of N concurrent
``POST /sessions/{id}/prompt``: p50 / p99 / max latency, how many answers were
200 / 503 (with ``Retry-After``) / other / dropped (no HTTP answer at all), and
the CPU the server, the provider and the client used; how many casts ran
although their answer was lost; the server's peak RSS and open fds (sampled
from /proc). Then two checks of issue 24: a cancel sent together with each
prompt, on its own warm connection (how the prompts ended, and what each cancel
said it hit: ``next`` means it arrived first and was sticky), and every prompt
sent twice at once with one ``Idempotency-Key`` (identical answers, one cast).

``--pause 4.95 --serve-arg=--keep-alive-s=5`` reproduces the dropped
connections of hypercorn's default keep-alive; ``--serve-arg=--backlog=100``
the listen-queue overflows of its default backlog; ``--profile FILE`` runs
the server under cProfile. On a shared machine, read the CPU figures: wall
times include whatever else runs.

Target on a 2-core machine: 0 dropped, p99 < 2 s for 200 concurrent prompts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
KEY = "bench-key"
STICKY_S = 5.0
"""The server's sticky-cancel window (ServeOptions.sticky_cancel_s)."""


# -- the provider process ------------------------------------------------------------------


def run_provider(latency: float, turns: int) -> None:
    """Serve a stateless loopback OpenAI model on an ephemeral port; print its URL."""
    sys.path.insert(0, str(ROOT))
    from tests.fake_providers import Answer, Call, FakeOpenAI, serve

    class LoadOpenAI(FakeOpenAI):
        """Echo until the cast's last turn, then done; each answer after ``latency``."""

        async def respond(self, request: Any, send: Any) -> None:
            await trio.sleep(latency)
            try:
                messages = json.loads(request.body).get("messages") or []
            except ValueError:
                messages = []
            # This cast's tool results: those after its last user message.
            answered = 0
            for message in reversed(messages):
                if message.get("role") == "user":
                    break
                answered += message.get("role") == "tool"
            if answered + 1 >= turns:
                call = Call("done", {"answer": f"done after {answered + 1} turns"})
            else:
                call = Call("echo", {"text": f"step {answered + 1}"})
            self.script = [Answer(calls=(call,))]
            self.requests.clear()
            await super().respond(request, send)

    async def main() -> None:
        async with serve(LoadOpenAI([], key=KEY), "/v1") as url:
            print(url, flush=True)
            await trio.sleep_forever()

    trio.run(main)


# -- measuring the server ------------------------------------------------------------------


def proc_figures(pid: int) -> tuple[int, int]:
    """(RSS in KiB, open fds) of a process, from /proc."""
    rss = 0
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


class Peak:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.rss = 0
        self.fds = 0

    def sample(self) -> None:
        rss, fds = proc_figures(self.pid)
        self.rss, self.fds = max(self.rss, rss), max(self.fds, fds)

    async def watch(self) -> None:
        while True:
            self.sample()
            await trio.sleep(0.05)


def listen_overflows() -> int:
    """The kernel's count of connections refused by a full listen queue (system-wide)."""
    with open("/proc/net/netstat") as netstat:
        header, values = [line.split() for line in netstat if line.startswith("TcpExt:")][:2]
    return int(dict(zip(header, values, strict=True)).get("ListenOverflows", 0))


def cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# -- the client ----------------------------------------------------------------------------


async def prompt_wave(
    clients: list[httpx.AsyncClient], sids: list[str], wave: int
) -> dict[str, Any]:
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    dropped: list[str] = []
    retry_after_missing = 0

    async def one(i: int) -> None:
        nonlocal retry_after_missing
        start = time.perf_counter()
        try:
            answer = await clients[i].post(
                f"/sessions/{sids[i]}/prompt", json={"prompt": f"wave {wave} task {i}"}
            )
        except httpx.HTTPError as exc:
            dropped.append(type(exc).__name__)
            return
        latencies.append(time.perf_counter() - start)
        key = str(answer.status_code)
        statuses[key] = statuses.get(key, 0) + 1
        if answer.status_code == 503 and "retry-after" not in answer.headers:
            retry_after_missing += 1

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(len(sids)):
            nursery.start_soon(one, i)
    return {
        "wall": time.perf_counter() - start,
        "latencies": latencies,
        "statuses": statuses,
        "dropped": dropped,
        "retry_after_missing": retry_after_missing,
    }


async def cancel_wave(
    clients: list[httpx.AsyncClient], sids: list[str], server: str
) -> tuple[dict[str, int], dict[str, float]]:
    """Each session: a prompt and, at the same moment, a cancel on another connection.

    Returns how the prompts ended (by reason) and what the cancels said they hit."""
    outcomes: dict[str, int] = {}
    targets: dict[str, float] = {}
    waits: list[float] = []
    # One client per cancel, like the prompts: one shared pool of 200 connections
    # would cost the client more than the server (httpcore scans its pool per request).
    side = [httpx.AsyncClient(base_url=server, timeout=60) for _ in sids]

    async def cancel(i: int) -> None:
        start = time.perf_counter()
        target = (await side[i].post(f"/sessions/{sids[i]}/cancel")).json()["target"]
        waits.append(time.perf_counter() - start)
        targets[target] = targets.get(target, 0) + 1

    async def one(i: int) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel, i)
            answer = await clients[i].post(f"/sessions/{sids[i]}/prompt", json={"prompt": "x"})
        reason = answer.json().get("reason") if answer.status_code == 200 else answer.status_code
        outcomes[str(reason)] = outcomes.get(str(reason), 0) + 1

    # Open the cancels' connections first, so that a cancel and its prompt race
    # on equal terms (both on a warm connection).
    async with trio.open_nursery() as warming:
        for client in side:
            warming.start_soon(client.get, "/health")
    async with trio.open_nursery() as nursery:
        for i in range(len(sids)):
            nursery.start_soon(one, i)
    for client in side:
        await client.aclose()
    targets["cancel p50 s"] = round(percentile(waits, 0.5), 2)
    targets["cancel p99 s"] = round(percentile(waits, 0.99), 2)
    return outcomes, targets


async def idempotent_wave(
    clients: list[httpx.AsyncClient], sids: list[str], server: str
) -> tuple[int, int, int]:
    """Each prompt sent twice at once with one Idempotency-Key: (same answers, casts run)."""
    same = 0
    before = 0
    for sid in sids:
        before += len((await clients[0].get(f"/sessions/{sid}/thread")).json()["turns"])

    async def one(i: int) -> None:
        nonlocal same
        key = str(uuid.uuid4())
        answers: list[Any] = []

        async def send(client: httpx.AsyncClient) -> None:
            answer = await client.post(
                f"/sessions/{sids[i]}/prompt",
                json={"prompt": "once"},
                headers={"Idempotency-Key": key},
            )
            answers.append(answer.json())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, clients[i])
            nursery.start_soon(send, extra[i])
        if len(answers) == 2 and answers[0] == answers[1]:
            same += 1

    extra = [httpx.AsyncClient(base_url=server, timeout=60) for _ in sids]
    async with trio.open_nursery() as nursery:
        for i in range(len(sids)):
            nursery.start_soon(one, i)
    for client in extra:
        await client.aclose()
    after = 0
    for sid in sids:
        after += len((await clients[0].get(f"/sessions/{sid}/thread")).json()["turns"])
    return same, before, after


async def drive(server: str, pid: int, provider_pid: int, args: argparse.Namespace) -> None:
    peak = Peak(pid)
    peak.sample()
    idle_rss, idle_fds = peak.rss, peak.fds
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    clients = [
        httpx.AsyncClient(base_url=server, timeout=60, limits=limits) for _ in range(args.sessions)
    ]
    sids: list[str] = [""] * args.sessions

    creating_s: list[float] = []

    async def create(i: int) -> None:
        start = time.perf_counter()
        sids[i] = (await clients[i].post("/sessions")).json()["session_id"]
        creating_s.append(time.perf_counter() - start)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(peak.watch)
        overflows = listen_overflows()
        async with trio.open_nursery() as creating:
            for i in range(args.sessions):
                creating.start_soon(create, i)
        print(
            f"server {server}: {args.sessions} sessions created at once on new connections: "
            f"p50 {percentile(creating_s, 0.5):.2f} s, p99 {percentile(creating_s, 0.99):.2f} s; "
            f"listen queue overflows {listen_overflows() - overflows}; "
            f"idle RSS {idle_rss / 1024:.0f} MiB, {idle_fds} fds"
        )
        answered = 0
        for wave in range(1, args.waves + 1):
            cpu = cpu_seconds(pid), cpu_seconds(provider_pid), time.process_time()
            result = await prompt_wave(clients, sids, wave)
            answered += result["statuses"].get("200", 0)
            spent = (
                cpu_seconds(pid) - cpu[0],
                cpu_seconds(provider_pid) - cpu[1],
                time.process_time() - cpu[2],
            )
            lat = result["latencies"]
            print(
                f"wave {wave}: {args.sessions} prompts x {args.turns} turns at once: wall "
                f"{result['wall']:.2f} s; p50 {percentile(lat, 0.5):.2f} s, p99 "
                f"{percentile(lat, 0.99):.2f} s, max {max(lat):.2f} s; answers "
                f"{json.dumps(result['statuses'])}, dropped {len(result['dropped'])} "
                f"{sorted(set(result['dropped']))}"
                + (
                    f", 503 without Retry-After {result['retry_after_missing']}"
                    if result["retry_after_missing"]
                    else ""
                )
            )
            print(
                f"        CPU: server {spent[0]:.2f} s, provider {spent[1]:.2f} s, "
                f"client {spent[2]:.2f} s"
            )
            if args.pause:
                await trio.sleep(args.pause)
        turns = 0
        for sid in sids:
            turns += len((await clients[0].get(f"/sessions/{sid}/thread")).json()["turns"])
        print(
            f"casts recorded {turns // args.turns}, answered {answered}: "
            f"{turns // args.turns - answered} ran although their answer was lost"
        )
        if args.checks:
            outcomes, targets = await cancel_wave(clients, sids, server)
            print(
                f"a cancel sent with each prompt: prompts ended {json.dumps(outcomes)}; "
                f"the cancels hit {json.dumps(targets)}"
            )
            await trio.sleep(STICKY_S)  # let any unused sticky cancel expire
            same, before, after = await idempotent_wave(clients, sids, server)
            print(
                f"each prompt sent twice with one Idempotency-Key: {same}/{args.sessions} "
                f"identical answer pairs; {after - before} turns recorded "
                f"(one cast each: {args.sessions * args.turns})"
            )
        nursery.cancel_scope.cancel()
    print(f"server peak RSS {peak.rss / 1024:.0f} MiB, peak open fds {peak.fds}")
    for client in clients:
        await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--waves", type=int, default=3)
    parser.add_argument("--turns", type=int, default=5, help="turns per cast (default 5)")
    parser.add_argument("--latency", type=float, default=0.05, help="provider latency, s")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds between waves")
    parser.add_argument("--no-checks", dest="checks", action="store_false")
    parser.add_argument(
        "--serve-arg", action="append", default=[], help="extra argument for cantrip serve"
    )
    parser.add_argument("--profile", metavar="FILE", help="run the server under cProfile")
    parser.add_argument("--provider", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.provider:
        run_provider(args.latency, args.turns)
        return
    env = {**os.environ, "OPENAI_API_KEY": KEY, "PYTHONUNBUFFERED": "1"}
    provider = subprocess.Popen(
        [sys.executable, __file__, "--provider", "--latency", str(args.latency),
         "--turns", str(args.turns)],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    folder = Path(tempfile.mkdtemp(prefix="serve-load-"))
    server: subprocess.Popen[str] | None = None
    try:
        assert provider.stdout is not None
        provider_url = provider.stdout.readline().strip()
        spec = folder / "load.toml"
        spec.write_text(
            f'[llm]\nprovider = "openai"\nmodel = "gpt-4o-mini"\nbase_url = "{provider_url}"\n'
            '[circle]\nmedium = "conversation"\ngates = ["done", "echo"]\n'
            f"wards = [{{ max_turns = {args.turns + 1} }}]\n"
            f'[loom]\npath = "{folder / "load.db"}"\n'
        )
        server = subprocess.Popen(
            [sys.executable,
             *(["-m", "cProfile", "-o", args.profile] if args.profile else []),
             "-m", "cantrip", "serve", str(spec), "--port", "0", *args.serve_arg],
            stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        assert server.stderr is not None
        line = server.stderr.readline()
        if "serving" not in line:
            raise SystemExit(f"cantrip serve did not start: {line}{server.stderr.read()}")
        url = line.strip().rsplit(" ", 1)[-1]
        trio.run(drive, url, server.pid, provider.pid, args)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        provider.terminate()
        provider.wait(timeout=10)


if __name__ == "__main__":
    main()
