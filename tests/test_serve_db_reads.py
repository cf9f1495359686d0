"""What one prompt costs a ``serve --db`` replica in reads (issue 46): the session is
read once per request, not once per call.

``serve --db``'s app runs in this process beside a worker (the loopback model of
tests/seam_llm.py), on a database of the cluster tests/conftest.py starts. The
replica's store hands out connections that count what is run on them: every
statement, and every transaction (an autocommit statement, or an explicit block) --
the worker's own connections are not counted.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import attrs
import httpx
import psycopg
import pytest
import trio
from fake_providers import serve
from pg_cluster import fresh_database
from seam_llm import KEY, Holds, SeamOpenAI, spec

from cantrip.distributed._spells import build_spell
from cantrip.distributed._worker import Worker
from cantrip.loom import Loom
from cantrip.loom._postgres import PostgresStore
from cantrip.protocols.http._serve import serve_http_db
from cantrip.protocols.sessions import PostgresBackend, _postgres

pytestmark = pytest.mark.loop_watch  # nothing here may block the trio loop

SESSION_READ = "(SELECT count(*) FROM cantrip_turns WHERE entity_id = %(e)s)"
"""A statement that reads a session's row (:meth:`DbSessions.get`)."""
QUEUEING = "pg_advisory_xact_lock(%s, h)"
"""The first statement of a batch that queues prompts (:func:`queue_prompts`)."""


@attrs.define
class Counted:
    """What the replica ran: each statement, and whether it began a transaction."""

    runs: list[tuple[str, bool]] = attrs.Factory(list)

    def transactions(self, since: int = 0) -> int:
        return sum(began for _, began in self.runs[since:])

    def statements(self, containing: str, since: int = 0) -> int:
        return sum(containing in sql for sql, _ in self.runs[since:])

    def index(self, containing: str, since: int = 0) -> int:
        return next(i for i, (sql, _) in enumerate(self.runs) if i >= since and containing in sql)


class CountingConnection:
    """A pool connection that counts what runs on it (everything else as it is)."""

    def __init__(self, conn: psycopg.Connection[Any], counted: Counted) -> None:
        self._conn = conn
        self._counted = counted

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def _idle(self) -> bool:
        return self._conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE

    def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        self._counted.runs.append((str(query), self._idle()))  # idle: autocommit, one
        return self._conn.execute(query, *args, **kwargs)

    @contextlib.contextmanager
    def transaction(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        if self._idle():  # a block of its own (a nested one is a savepoint)
            self._counted.runs.append(("BEGIN", True))
        with self._conn.transaction(*args, **kwargs) as tx:
            yield tx


def counting_store(counted: Counted) -> Any:
    """:class:`PostgresStore` whose pool connections count into ``counted``."""

    def make(*args: Any, **kwargs: Any) -> PostgresStore:
        store = PostgresStore(*args, **kwargs)
        real = store.pool.connection

        @contextlib.contextmanager
        def connection(*a: Any, **k: Any) -> Iterator[Any]:
            with real(*a, **k) as conn:
                yield CountingConnection(conn, counted)

        setattr(store.pool, "connection", connection)  # noqa: B010 -- on this pool only
        return store

    return make


@pytest.fixture
def reads_db(pg_server: str) -> str:
    return fresh_database(pg_server, "serve_reads")


@contextlib.asynccontextmanager
async def replica(
    url: str, counted: Counted, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[httpx.AsyncClient]:
    """``serve --db``'s app in this process (its store counting) beside a worker."""
    monkeypatch.setenv("SEAM_TEST_KEY", KEY)
    monkeypatch.setattr(_postgres, "PostgresStore", counting_store(counted))
    async with serve(SeamOpenAI(Holds()), "/v1") as base_url, trio.open_nursery() as nursery:
        spell = {"spec": spec(base_url)}
        await nursery.start(Worker(url, concurrency=2, poll_s=0.2).run)
        (base,) = await nursery.start(
            lambda task_status: serve_http_db(
                spell, build_spell(spell, Loom()), url, "127.0.0.1", 0, task_status=task_status
            )
        )
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            yield http
        nursery.cancel_scope.cancel()


async def test_a_prompt_reads_its_session_once_and_queues_after_that_one_read(
    reads_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt (``POST /sessions/{id}/prompt``, its result awaited) reads the session
    once -- the route's look, handed down to ``submit`` and ``result`` -- and that look
    is the only transaction before its batch queues it; no read of its own says the
    prompt is the session's (the result's first look does). On main the session was
    read three times, two transactions came before the queueing, and the prompt's
    owner was a read of its own."""
    counted = Counted()
    async with replica(reads_db, counted, monkeypatch) as http:
        sid = (await http.post("/sessions")).json()["session_id"]
        start = len(counted.runs)
        answer = await http.post(f"/sessions/{sid}/prompt", json={"prompt": "hi"})
        assert answer.status_code == 200, answer.text
        assert answer.json()["result"] == "hi ok #1"
        assert counted.statements(SESSION_READ, start) == 1
        queued = counted.index(QUEUEING, start) - 1  # its block's BEGIN
        assert counted.runs[queued] == ("BEGIN", True)
        assert counted.transactions(start) - counted.transactions(queued) == 1
        assert counted.statements("SELECT entity_id FROM cantrip_work WHERE id", start) == 0
        # the rest: the result's looks at its work (woken by NOTIFY: how many varies)
        # and its outcome -- 5-6 transactions in all here against 9-10 on main
        assert counted.transactions(start) <= 8


async def test_many_waiters_look_at_their_prompts_in_one_read(
    reads_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many requests waiting for their prompts' results at once look at their work in
    a read or two between them (:mod:`cantrip.protocols.sessions._looks`), not a read
    each. No worker runs: the prompts stay queued. The waiters start once the replica
    has heard every enqueue's notification (none wakes them later), with a poll too
    slow to come; on main each waiter's look was its own read (and the session and the
    prompt's owner two more)."""
    counted = Counted()
    monkeypatch.setattr(_postgres, "PostgresStore", counting_store(counted))
    spell = {"factory": "tests.nowhere:build"}  # no worker runs it
    waiters = 30
    async with PostgresBackend.open(reads_db, spell, poll_s=600) as backend:
        infos = [(await backend.create())[0] for _ in range(waiters)]
        prompts = [(await backend.submit(info, "go")).prompt_id for info in infos]
        with trio.fail_after(30):
            while backend.notifier.heard < waiters:  # every enqueue's NOTIFY, heard
                await trio.sleep(0.01)
        start = len(counted.runs)
        async with trio.open_nursery() as nursery:
            for info, prompt_id in zip(infos, prompts, strict=True):
                nursery.start_soon(backend.result, info, prompt_id)
            with trio.fail_after(30):
                while backend.looks.looked < waiters:
                    await trio.sleep(0.01)
            assert backend.waiting == waiters
            assert counted.transactions(start) <= 2
            nursery.cancel_scope.cancel()
