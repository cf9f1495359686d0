"""What resumable streams cost (issue 44): an event id and the log that keeps events
resumable, per event; and how long a client that reconnects waits for the first event
it missed.

What it measures
----------------
* **per event, in process** -- the session stamps every event the entity emits with
  its id and keeps it in its log (``EventLog.record``), watched or not. Timed per
  event over a stream of token deltas: ``event_dict`` alone (the JSON shape, which a
  watcher's follow computed per event before), ``record`` (the shape + the id + the
  log), and the memory one held event takes (``tracemalloc``, the log full).
* **per event, on --db** -- ``TurnIds.told``: a turn's recorded events with their ids
  (the replica reads the turn anyway).
* **reconnect to first missed event** -- a session of ``--turns`` recorded turns (a
  scripted three-turn cast per prompt); a follow resumed after an event near its end
  (the events after it are held: the common case, a dropped connection) and after
  its first event (a catch-up of every turn from the loom): from the call to the
  first event, p50/p99 over ``-n`` reconnects; in process at the seam and over HTTP
  (``GET /events`` with ``Last-Event-ID`` on hypercorn, to the first ``data:`` line),
  and on ``--db`` (``PostgresBackend`` on a throwaway cluster, as the tests start
  one, fsync off).

How to run
----------
From the repository root::

    python bench/resume.py             # 100 turns, 200 reconnects
    python bench/resume.py --no-db     # in process only
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import httpx  # noqa: E402
import trio  # noqa: E402

from cantrip.llm._stream import TextDelta  # noqa: E402
from cantrip.loom._model import Turn  # noqa: E402
from cantrip.protocols.sessions import EventId, ProcessBackend, SessionBackend  # noqa: E402
from cantrip.protocols.sessions._hub import SessionHub  # noqa: E402
from cantrip.protocols.sessions._positions import RESUMABLE_EVENTS, EventLog, TurnIds  # noqa: E402
from cantrip.protocols.sessions._shapes import event_dict  # noqa: E402


def _per_event(run: Callable[[], object], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        run()
    return (time.perf_counter() - start) / n


def _ms(values: list[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"p50 {statistics.median(ordered) * 1000:7.2f} ms   p99 {p99 * 1000:7.2f} ms"


def per_event(turn: Turn) -> None:
    delta = TextDelta(text="a token ", entity_id="entity-bench")
    n = 200_000
    shape = _per_event(lambda: event_dict(delta), n)
    log = EventLog()
    record = _per_event(lambda: log.record(delta, "entity-bench", lambda: ()), n)
    print(f"per event, in process ({n} token deltas):")
    print(f"  event_dict alone                 {shape * 1e6:6.2f} us")
    print(f"  record (shape + id + log)        {record * 1e6:6.2f} us")
    print(f"  the id and the log               {(record - shape) * 1e6:6.2f} us")
    gc.collect()
    tracemalloc.start()
    full = EventLog()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(RESUMABLE_EVENTS):
        full.record(delta, "entity-bench", lambda: ())
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    print(f"  memory per held event            {held / RESUMABLE_EVENTS:6.0f} B "
          f"({held / 1024:.0f} KiB for a full log of {RESUMABLE_EVENTS})")  # fmt: skip
    ids = TurnIds(0)
    told = _per_event(lambda: ids.told(turn), 20_000)
    print(f"per recorded turn, --db (TurnIds.told, its events with ids): {told * 1e6:6.2f} us")


async def reconnects(
    label: str, backend: SessionBackend, sid: str, n: int, first: Callable[..., Awaitable[float]]
) -> None:
    """Time ``n`` reconnects after an event near the end and after the first one."""
    info = await backend.find(sid)
    told = []
    events = backend.follow(sid, 0)
    try:
        async for event in events:
            told.append(event)
            if event.id == EventId(info.turns, 1):  # the last turn's final response
                break
    finally:
        await events.aclose()
    near_end, start = told[-3].id, told[0].id
    assert near_end is not None and start is not None
    for name, after in (("near its end", near_end), ("after its first event", start)):
        waits = [await first(after) for _ in range(n)]
        print(f"  {label:<10} resumed {name:<22} {_ms(waits)}")


async def in_process(turns: int, n: int) -> None:
    from test_http import make_spell, serving

    script: list[dict[str, Any]] = []
    for _ in range(turns // 3):
        script += [
            {"content": "Looking.", "tool_calls": [{"gate": "echo", "args": {"text": "a"}}]},
            {"content": "Still.", "tool_calls": [{"gate": "echo", "args": {"text": "b"}}]},
            {"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]},
        ]
    spell = make_spell(script)
    async with ProcessBackend.open(SessionHub(spell)) as backend:
        info, _ = await backend.create()
        sid = info.session_id
        for _ in range(turns // 3):
            submitted = await backend.submit(sid, "Go")
            await backend.result(sid, submitted.prompt_id)

        async def seam(after: EventId) -> float:
            start = time.perf_counter()
            events = backend.follow(sid, after)
            await events.__anext__()
            took = time.perf_counter() - start
            await events.aclose()
            return took

        print(f"reconnect to the first missed event ({turns} turns, {n} reconnects):")
        await reconnects("seam", backend, sid, n, seam)
    async with serving(make_spell(script)) as http:  # (a scripted LLM answers once)
        sid2 = (await http.post("/sessions")).json()["session_id"]
        for _ in range(turns // 3):
            await http.post(f"/sessions/{sid2}/prompt", json={"prompt": "Go"})

        async def over_http(after: EventId) -> float:
            start = time.perf_counter()
            headers = {"Last-Event-ID": str(after)}
            async with http.stream("GET", f"/sessions/{sid2}/events", headers=headers) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        return time.perf_counter() - start
            raise AssertionError("no event")

        ids = await _ids_over_http(http, sid2)
        for name, after in (("near its end", ids[-3]), ("after its first event", ids[0])):
            waits = [await over_http(after) for _ in range(n)]
            print(f"  {'http':<10} resumed {name:<22} {_ms(waits)}")


async def _ids_over_http(http: httpx.AsyncClient, sid: str) -> list[EventId]:
    ids: list[EventId] = []
    turns = (await http.get(f"/sessions/{sid}")).json()["turns"]
    async with http.stream("GET", f"/sessions/{sid}/events", params={"after": "0"}) as r:
        async for line in r.aiter_lines():
            if line.startswith("id: "):
                turn, index = line[4:].split(".")
                ids.append(EventId(int(turn), int(index)))
            if line.startswith("data: ") and ids and ids[-1] == EventId(turns, 1):
                break
    return ids


async def on_db(turns: int, n: int) -> None:
    from fake_providers import serve
    from pg_cluster import fresh_database, postgres_cluster
    from seam_llm import KEY, Holds, SeamOpenAI, spec

    from cantrip.distributed._worker import Worker
    from cantrip.protocols.sessions import PostgresBackend

    os.environ["SEAM_TEST_KEY"] = KEY
    with postgres_cluster("-c fsync=off") as server:
        db = fresh_database(server, "bench_resume")
        async with serve(SeamOpenAI(Holds()), "/v1") as base_url, trio.open_nursery() as nursery:
            await nursery.start(Worker(db, concurrency=4, poll_s=0.2).run)
            spell = {"spec": spec(base_url)}
            async with PostgresBackend.open(db, spell, poll_s=0.2, tail_s=0.05) as backend:
                info, _ = await backend.create()
                sid = info.session_id
                for i in range(turns // 3):
                    submitted = await backend.submit(sid, f"Go {i}.")
                    await backend.result(sid, submitted.prompt_id)

                async def seam(after: EventId) -> float:
                    start = time.perf_counter()
                    events = backend.follow(sid, after)
                    await events.__anext__()
                    took = time.perf_counter() - start
                    await events.aclose()
                    return took

                await reconnects("--db seam", backend, sid, n, seam)
            nursery.cancel_scope.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=99)
    parser.add_argument("-n", type=int, default=200)
    parser.add_argument("--no-db", action="store_true")
    args = parser.parse_args()
    from cantrip.loom._model import Turn as _Turn

    turn = _Turn(id="t", entity_id="entity-bench", parent_id=None, sequence=1, terminated=True)
    per_event(turn)
    trio.run(in_process, args.turns, args.n)
    if not args.no_db:
        trio.run(on_db, args.turns, max(args.n // 4, 20))


if __name__ == "__main__":
    main()
