"""``serve --db`` under many prompts at once: they share commits (issue 46.1).

A real PostgreSQL cluster of this module's own, with ``pg_stat_statements`` loaded so a
commit is counted where it happens (every ``COMMIT`` the server ran); the replica's
:class:`~cantrip.protocols.sessions.PostgresBackend` in process, no worker (only the
queueing is under test).

To put prompts in one batch without hoping the machine is fast or slow enough, a test
holds one session's advisory lock from a connection of its own: the batch that holds a
prompt of that session waits on it -- the commit in flight -- while the test sends the
others, sees them wait for the next batch (``PostgresBackend.prompts.waiting``), and only
then lets the first batch go.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import psycopg
import pytest
import trio
from pg_cluster import fresh_database, postgres_cluster

from cantrip.distributed._work import ENTITY_LOCK, USER_KEY
from cantrip.protocols.sessions import PostgresBackend, SessionError, Submitted

pytestmark = pytest.mark.loop_watch  # nothing here may block the trio loop

SPELL = {"factory": "tests.nowhere:build"}  # no worker runs it: queueing only
STATS = (
    "-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all "
    "-c pg_stat_statements.track_utility=on"
)


@pytest.fixture(scope="module")
def stats_server() -> Iterator[str]:
    with postgres_cluster(STATS) as url:
        yield url


_databases = iter(range(10_000))


@pytest.fixture
def db(stats_server: str) -> str:
    url = fresh_database(stats_server, f"batch{next(_databases)}")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION pg_stat_statements")
    return url


def _query(url: str, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


async def query(url: str, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
    return await trio.to_thread.run_sync(_query, url, sql, params)


async def commits(url: str) -> int:
    """Every COMMIT this database's server has run (autocommit reads have none)."""
    [(count,)] = await query(
        url,
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE query = 'COMMIT' "
        "AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    return int(count)


async def until(condition: Callable[[], Any]) -> None:
    """Wait for ``condition`` (an event the test cannot be told of: polled)."""
    with trio.fail_after(30):
        while not await condition():
            await trio.sleep(0.01)


@contextlib.asynccontextmanager
async def open_backend(url: str) -> AsyncIterator[PostgresBackend]:
    async with PostgresBackend.open(url, SPELL, poll_s=0.2, tail_s=0.05) as backend:
        yield backend


@contextlib.asynccontextmanager
async def holding(url: str, entity_id: str) -> AsyncIterator[psycopg.Connection[Any]]:
    """The entity's advisory lock (the one its prompts are queued under), held from a
    connection of the test's own until the block ends."""
    conn = await trio.to_thread.run_sync(lambda: psycopg.connect(url, autocommit=True))
    try:
        await trio.to_thread.run_sync(
            conn.execute, "SELECT pg_advisory_lock(%s, hashtext(%s))", (ENTITY_LOCK, entity_id)
        )
        yield conn
    finally:
        await trio.to_thread.run_sync(conn.close)


async def lock_waited_on(url: str) -> bool:
    rows = await query(
        url, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    )
    return bool(rows[0][0])


class Sent:
    """Prompts sent from tasks of their own: each one's answer (or refusal) once it came."""

    def __init__(self, backend: PostgresBackend, nursery: trio.Nursery) -> None:
        self.backend = backend
        self.nursery = nursery
        self.answers: dict[str, Submitted | SessionError] = {}
        self.scopes: dict[str, trio.CancelScope] = {}

    def send(self, name: str, session_id: str, intent: str, **options: Any) -> None:
        scope = self.scopes[name] = trio.CancelScope()

        async def one() -> None:
            with scope:
                try:
                    self.answers[name] = await self.backend.submit(session_id, intent, **options)
                except SessionError as exc:
                    self.answers[name] = exc

        self.nursery.start_soon(one)

    def submitted(self, name: str) -> Submitted:
        answer = self.answers[name]
        assert isinstance(answer, Submitted), answer
        return answer

    def refused(self, name: str) -> SessionError:
        answer = self.answers[name]
        assert isinstance(answer, SessionError), answer
        return answer


async def queued_intents(url: str) -> list[str]:
    return [r[0] for r in await query(url, "SELECT intent FROM cantrip_work ORDER BY id")]


async def test_prompts_that_arrive_while_a_commit_is_in_flight_share_the_next(db: str) -> None:
    """40 prompts at once cost 2 commits, not 40: the first goes at once, alone (no
    timer), and the 39 that arrive while it commits go together in the next; each
    caller hears its own prompt id only once its batch has committed."""
    async with open_backend(db) as backend:
        sessions = [(await backend.create())[0] for _ in range(40)]
        first, rest = sessions[0], sessions[1:]
        before = await commits(db)
        async with holding(db, first.entity_id) as lock, trio.open_nursery() as nursery:
            sent = Sent(backend, nursery)
            sent.send("first", first.session_id, "go 0")
            await until(lambda: lock_waited_on(db))  # its batch is in flight, held
            for n, info in enumerate(rest, 1):
                sent.send(f"p{n}", info.session_id, f"go {n}")
            await until(lambda: _true(backend.prompts.waiting == len(rest)))
            assert sent.answers == {}  # nobody is told before a commit
            assert await queued_intents(db) == []
            await trio.to_thread.run_sync(lock.execute, "SELECT pg_advisory_unlock_all()")
        assert await commits(db) - before == 2
        assert backend.prompts.batches == 2
        ids = {sent.submitted(name).prompt_id for name in sent.answers}
        assert len(ids) == 40
        assert sorted(await queued_intents(db)) == sorted(f"go {n}" for n in range(40))


async def _true(value: bool) -> bool:
    return value


async def test_a_bad_prompt_fails_alone_and_the_rest_of_its_batch_commits(db: str) -> None:
    """In one batch: a prompt a constraint refuses, one the database cannot hold, one
    whose key was used for another prompt and one for a busy session each fail with
    their own error; the others are queued, in that batch's one commit."""
    async with open_backend(db) as backend:
        hold, busy, keyed, *plain = [(await backend.create())[0] for _ in range(8)]
        await backend.submit(busy.session_id, "already running")
        await backend.submit(keyed.session_id, "the first", key="k1")
        await query(  # a constraint the prompt table's rows may break
            db, "ALTER TABLE cantrip_work ADD CONSTRAINT no_poison CHECK (intent <> 'poison')"
        )
        before = await commits(db)
        async with holding(db, hold.entity_id) as lock, trio.open_nursery() as nursery:
            sent = Sent(backend, nursery)
            sent.send("hold", hold.session_id, "held")
            await until(lambda: lock_waited_on(db))
            sent.send("ok1", plain[0].session_id, "fine 1")
            sent.send("poison", plain[1].session_id, "poison")
            sent.send("nul", plain[2].session_id, "bad \x00 byte")
            sent.send("reused", keyed.session_id, "another prompt", key="k1")
            sent.send("busy", busy.session_id, "second")
            sent.send("ok2", plain[3].session_id, "fine 2")
            sent.send("ok3", plain[4].session_id, "fine 3", key="k9")
            await until(lambda: _true(backend.prompts.waiting == 7))
            await trio.to_thread.run_sync(lock.execute, "SELECT pg_advisory_unlock_all()")
        assert await commits(db) - before == 2  # the held batch, then all seven's
        assert sent.refused("poison").kind == "database_error"
        assert "CheckViolation" in sent.refused("poison").message
        assert sent.refused("nul").kind == "bad_request"
        assert sent.refused("reused").kind == "key_reused"
        assert sent.refused("busy").kind == "busy"
        for name in ("hold", "ok1", "ok2", "ok3"):
            assert not sent.submitted(name).replayed
        assert sorted(await queued_intents(db)) == sorted(
            ["already running", "the first", "held", "fine 1", "fine 2", "fine 3"]
        )
        [(prompts,)] = await query(db, "SELECT count(*) FROM cantrip_prompts")
        assert prompts == 6  # each queued prompt's row, no other


async def test_idempotency_keys_dedupe_within_a_batch_and_across_batches(db: str) -> None:
    """The same key twice in one batch queues one prompt (the second is a replay of
    it); a key queued in an earlier batch is replayed too."""
    async with open_backend(db) as backend:
        hold, a, b = [(await backend.create())[0] for _ in range(3)]
        earlier = await backend.submit(b.session_id, "b's", key="kb")
        async with holding(db, hold.entity_id) as lock, trio.open_nursery() as nursery:
            sent = Sent(backend, nursery)
            sent.send("hold", hold.session_id, "held")
            await until(lambda: lock_waited_on(db))
            sent.send("a1", a.session_id, "a's", key="ka", on_busy="enqueue")
            sent.send("a2", a.session_id, "a's", key="ka", on_busy="enqueue")
            sent.send("b", b.session_id, "b's", key="kb", on_busy="enqueue")
            await until(lambda: _true(backend.prompts.waiting == 3))
            await trio.to_thread.run_sync(lock.execute, "SELECT pg_advisory_unlock_all()")
        a1, a2, again = sent.submitted("a1"), sent.submitted("a2"), sent.submitted("b")
        assert a2.prompt_id == a1.prompt_id
        assert sorted([a1.replayed, a2.replayed]) == [False, True]  # whichever came first
        assert again.prompt_id == earlier.prompt_id and again.replayed
        assert sorted(await queued_intents(db)) == ["a's", "b's", "held"]


async def test_a_prompt_cancelled_while_it_waits_for_a_batch_is_never_queued(db: str) -> None:
    """A request cancelled while its prompt waits for the next batch takes it back: the
    batch is written without it, and the others in it are queued."""
    async with open_backend(db) as backend:
        hold, *others = [(await backend.create())[0] for _ in range(4)]
        async with holding(db, hold.entity_id) as lock, trio.open_nursery() as nursery:
            sent = Sent(backend, nursery)
            sent.send("hold", hold.session_id, "held")
            await until(lambda: lock_waited_on(db))
            for n, info in enumerate(others):
                sent.send(f"p{n}", info.session_id, f"go {n}")
            await until(lambda: _true(backend.prompts.waiting == 3))
            sent.scopes["p1"].cancel()
            await until(lambda: _true(backend.prompts.waiting == 2))
            await trio.to_thread.run_sync(lock.execute, "SELECT pg_advisory_unlock_all()")
        assert "p1" not in sent.answers
        assert {n for n in sent.answers} == {"hold", "p0", "p2"}
        assert sorted(await queued_intents(db)) == ["go 0", "go 2", "held"]


async def test_a_batch_cut_off_mid_commit_loses_nothing_acknowledged(db: str) -> None:
    """A batch whose connection dies before it commits queued nothing, and each of its
    callers is told the database was unavailable; what was acknowledged before stays
    queued, and the prompts that waited behind the lost batch go in the next."""
    async with open_backend(db) as backend:
        early, hold, *others = [(await backend.create())[0] for _ in range(5)]
        acknowledged = await backend.submit(early.session_id, "acknowledged")
        async with holding(db, hold.entity_id), trio.open_nursery() as nursery:
            sent = Sent(backend, nursery)
            sent.send("hold", hold.session_id, "cut off")
            await until(lambda: lock_waited_on(db))
            for n, info in enumerate(others):
                sent.send(f"p{n}", info.session_id, f"go {n}")
            await until(lambda: _true(backend.prompts.waiting == 3))
            await query(  # the batch's backend, waiting on the lock, is killed
                db,
                "SELECT pg_terminate_backend(pid) FROM pg_locks "
                "WHERE locktype = 'advisory' AND NOT granted",
            )
            await until(lambda: _true(len(sent.answers) == 4))
        assert sent.refused("hold").kind == "database_unavailable"
        queued = await queued_intents(db)
        assert "cut off" not in queued
        assert sorted(queued) == ["acknowledged", "go 0", "go 1", "go 2"]
        [(work,)] = await query(
            db, "SELECT count(*) FROM cantrip_prompts WHERE work_id = %s",
            (int(acknowledged.prompt_id.removeprefix("work-")),),
        )  # fmt: skip
        assert work == 1
        for n in range(3):
            assert sent.submitted(f"p{n}").prompt_id


async def test_a_batch_checks_each_prompts_session_and_queues_it_with_its_user(db: str) -> None:
    """The session is checked in the batch, not read before it (issue 46): a prompt to
    an unknown session fails alone, ``not_found`` naming it as the caller did, while
    the rest of its batch commits; a session's user travels in its prompt's queued
    spell, read in the same read as the batch's other rules (A2A's task prompts too)."""
    async with open_backend(db) as backend:
        hold, plain = [(await backend.create())[0] for _ in range(2)]
        ana = (await backend.create(user="ana"))[0]
        before = await commits(db)
        async with holding(db, hold.entity_id) as lock, trio.open_nursery() as nursery:
            sent = Sent(backend, nursery)
            sent.send("hold", hold.session_id, "held")
            await until(lambda: lock_waited_on(db))
            sent.send("nobody", "session-nobody", "to nobody")
            sent.send("ana", ana.session_id, "for ana")
            sent.send("plain", plain.session_id, "for nobody in particular")
            await until(lambda: _true(backend.prompts.waiting + len(sent.answers) == 3))
            told_before_the_commit = dict(sent.answers)  # (main told "nobody" at once)
            await trio.to_thread.run_sync(lock.execute, "SELECT pg_advisory_unlock_all()")
        assert told_before_the_commit == {}  # the unknown session waited for its batch
        assert await commits(db) - before == 2
        refused = sent.refused("nobody")
        assert (refused.kind, refused.message) == ("not_found", "unknown session 'session-nobody'")
        task = await backend.submit_task(
            ana.session_id, "a task", task_id="t1", message="{}", on_busy="enqueue"
        )
        spells = dict(await query(db, "SELECT intent, spell::jsonb FROM cantrip_work"))
        assert spells["for ana"][USER_KEY] == "ana"
        assert spells["a task"][USER_KEY] == "ana"
        assert USER_KEY not in spells["for nobody in particular"]
        assert sorted(spells) == sorted(["held", "for ana", "for nobody in particular", "a task"])
        assert task.session_id == ana.session_id
