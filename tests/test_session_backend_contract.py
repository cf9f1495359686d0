"""The session backend contract (issue 41): one set of tests, every backend.

Each test runs against the in-process backend on a memory loom and on an SQLite loom,
the PostgreSQL backend with a real worker (a :class:`~cantrip.distributed._worker.Worker`
in this trio run, on a database of the cluster tests/conftest.py starts), and
tests/session_double.py, which passes by implementing :class:`SessionBackend` alone.
The model is tests/seam_llm.py: the same rule for every backend, held calls instead
of sleeps.

The ``test_drift_*`` tests at the end run one scenario on both real backends and show
where they differ today: each asserts the pair of answers as it is, so it fails the
day the drift is removed (phase 2) and becomes a contract test.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from fake_providers import serve
from pg_cluster import fresh_database
from seam_llm import KEY, Holds, SeamOpenAI, spec
from session_double import DoubleBackend

from cantrip import Decision, PauseError
from cantrip.distributed._spells import build_spell
from cantrip.distributed._worker import Worker
from cantrip.loom import Loom
from cantrip.protocols.sessions import (
    BUSY_POLICIES,
    EventId,
    PostgresBackend,
    ProcessBackend,
    PromptOutcome,
    SessionBackend,
    SessionEvent,
)
from cantrip.protocols.sessions._hub import SessionError, SessionHub

KINDS = ["memory", "sqlite", "postgres", "double"]


@attrs.define
class World:
    kind: str
    backend: SessionBackend
    holds: Holds


@pytest.fixture(scope="module")
def seam_db(pg_server: str) -> str:
    """One database for this module's PostgreSQL backends (every test its own sessions)."""
    return fresh_database(pg_server, "seam_contract")


@pytest.fixture
def key_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEAM_TEST_KEY", KEY)


@contextlib.asynccontextmanager
async def open_world(kind: str, tmp_path: Path, db: str | None) -> AsyncIterator[World]:
    holds = Holds()
    if kind == "double":
        async with DoubleBackend.open(holds) as double:
            yield World(kind, double, holds)
        return
    async with serve(SeamOpenAI(holds), "/v1") as base_url:
        spell = {"spec": spec(base_url)}
        if kind == "postgres":
            assert db is not None
            async with trio.open_nursery() as nursery:
                await nursery.start(Worker(db, concurrency=4, poll_s=0.2).run)
                async with PostgresBackend.open(db, spell, poll_s=0.2, tail_s=0.05) as pg:
                    yield World(kind, pg, holds)
                nursery.cancel_scope.cancel()
            return
        loom = Loom() if kind == "memory" else Loom.open(tmp_path / "loom.db")
        try:
            hub = SessionHub(build_spell(spell, loom))
            async with ProcessBackend.open(hub) as process:
                yield World(kind, process, holds)
        finally:
            loom.close()


@pytest.fixture(params=KINDS)
async def world(
    request: pytest.FixtureRequest, tmp_path: Path, key_env: None
) -> AsyncIterator[World]:
    db = request.getfixturevalue("seam_db") if request.param == "postgres" else None
    async with open_world(request.param, tmp_path, db) as built:
        yield built


@pytest.fixture
async def both(tmp_path: Path, key_env: None, seam_db: str) -> AsyncIterator[tuple[World, World]]:
    """The in-process backend (memory loom) and the PostgreSQL one, side by side."""
    async with (
        open_world("memory", tmp_path, None) as process,
        open_world("postgres", tmp_path, seam_db) as postgres,
    ):
        yield process, postgres


async def finished(world: World, sid: str, prompt_id: str) -> PromptOutcome:
    """The prompt's outcome; a backend that never ends it fails here, not at the suite's
    time limit."""
    with trio.fail_after(60):
        return await world.backend.result(sid, prompt_id)


async def cast(world: World, sid: str, intent: str, **options: Any) -> PromptOutcome:
    submitted = await world.backend.submit(sid, intent, **options)
    return await finished(world, sid, submitted.prompt_id)


async def new_session(world: World) -> str:
    info, created = await world.backend.create()
    assert created
    return info.session_id


async def first_turn(world: World, sid: str) -> None:
    """Until the session's first turn is recorded."""
    events = world.backend.follow(sid)
    with trio.fail_after(60):
        async with contextlib.aclosing(events):
            async for event in events:
                if event.position is not None:
                    return


def text(outcome: PromptOutcome) -> Any:
    assert outcome.cast is not None, outcome
    return outcome.cast.result


def steering(turns: Any) -> list[str]:
    return [m for t in turns for m in t.extras.get("steering", ())]


@contextlib.contextmanager
def refused(kind: str) -> Iterator[None]:
    with pytest.raises(SessionError) as caught:
        yield
    assert caught.value.kind == kind, caught.value


# -- sessions ---------------------------------------------------------------------------


async def test_sessions_are_created_listed_and_found(world: World) -> None:
    backend = world.backend
    first, created = await backend.create()
    second, _ = await backend.create()
    assert created and first.session_id != second.session_id
    assert (first.running, first.turns) == (False, 0)
    listed = {s.session_id for s in await backend.sessions()}
    assert {first.session_id, second.session_id} <= listed
    found = await backend.find(first.session_id)
    assert found == first
    health = await backend.health()
    assert health.sessions >= 2 and health.mode == backend.capabilities.mode


async def test_a_key_names_one_session_wherever_it_is_asked(world: World) -> None:
    backend = world.backend
    made, created = await backend.create(key="seam-session-1")
    again, created_again = await backend.create(key="seam-session-1")
    other, _ = await backend.create(key="seam-session-2")
    assert (created, created_again) == (True, False)
    assert again.session_id == made.session_id != other.session_id


async def test_a_sessions_user_tags_its_casts_and_no_create_switches_it(world: World) -> None:
    """A session made for a user casts with it as the ``user`` tag (a memory namespace's
    ``{user}``); its key, asked again for another user, is refused; a bad user is
    refused before anything is made."""
    backend = world.backend
    info, created = await backend.create(user="alice")
    assert created and info.user == "alice" and info.to_dict()["user"] == "alice"
    assert (await backend.find(info.session_id)).user == "alice"
    await cast(world, info.session_id, "Add one.")
    await cast(world, info.session_id, "Add two.")
    thread = await backend.thread(info.session_id)
    assert [t.extras.get("user") for t in thread if t.intent] == ["alice", "alice"]
    plain, _ = await backend.create()
    assert plain.user is None and "user" not in plain.to_dict()
    await cast(world, plain.session_id, "Add one.")
    assert all("user" not in t.extras for t in await backend.thread(plain.session_id))

    keyed, _ = await backend.create(key="seam-user-1", user="bob")
    again, created_again = await backend.create(key="seam-user-1", user="bob")
    assert not created_again and again.session_id == keyed.session_id and again.user == "bob"
    with refused("user_conflict"):
        await backend.create(key="seam-user-1", user="mallory")
    assert (await backend.find(keyed.session_id)).user == "bob"
    before = len(await backend.sessions())
    for bad in ["", "a\x00b", "x" * 129]:
        with refused("bad_request"):
            await backend.create(user=bad)
    assert len(await backend.sessions()) == before


async def test_a_sessions_working_directory_is_kept_and_recorded_on_its_casts(
    world: World,
) -> None:
    """A session made with a ``cwd`` (an editor's over ACP, or ``POST /sessions``'s) keeps
    it, shows it in the API's shape, and its casts record it as their ``cwd`` tag -- the
    loom's record of where it ran; a relative or control-character path is refused
    before anything is made."""
    backend = world.backend
    info, created = await backend.create(cwd="/work/project")
    assert created and info.cwd == "/work/project" and info.to_dict()["cwd"] == "/work/project"
    assert (await backend.find(info.session_id)).cwd == "/work/project"
    await cast(world, info.session_id, "Add one.")
    await cast(world, info.session_id, "Add two.")
    thread = await backend.thread(info.session_id)
    assert [t.extras.get("cwd") for t in thread if t.intent] == ["/work/project"] * 2
    plain, _ = await backend.create()
    assert plain.cwd is None and "cwd" not in plain.to_dict()
    before = len(await backend.sessions())
    for bad in ("relative/dir", "/tmp/a\nb", ""):
        with refused("bad_request"):
            await backend.create(cwd=bad)
    assert len(await backend.sessions()) == before


async def test_an_unknown_session_is_not_found_by_any_operation(world: World) -> None:
    backend = world.backend
    nobody = "session-00000000000000000000"
    with refused("not_found"):
        await backend.find(nobody)
    with refused("not_found"):
        await backend.submit(nobody, "hello")
    with refused("not_found"):
        await backend.steer(nobody, "hello")
    with refused("not_found"):
        await backend.pauses(nobody)


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
async def test_an_entity_of_the_runtimes_own_is_no_session(
    kind: str, tmp_path: Path, key_env: None, request: pytest.FixtureRequest
) -> None:
    """A memory consolidation or an eval run's record is a top-level entity in the loom,
    but the runtime's, not a conversation: no operation opens it as a session (a user's
    top-level entity beside it is found). The backends that hold a loom."""
    from cantrip.loom._model import EntityRecord
    from cantrip.protocols.sessions import session_id_for

    db = request.getfixturevalue("seam_db") if kind == "postgres" else None
    async with open_world(kind, tmp_path, db) as world:
        backend: Any = world.backend
        loom = Loom.open(db) if db is not None else backend.hub.spell.loom
        for runtime in ("cantrip.memory.consolidate", "cantrip.eval"):
            loom.register_entity(EntityRecord(entity_id=f"entity-{runtime}", cantrip_id=runtime))
        loom.register_entity(EntityRecord(entity_id="entity-theirs", cantrip_id="cantrip-0a1b"))
        if db is not None:
            loom.close()  # written (a PostgreSQL loom's writes are group-committed)
        for runtime in ("cantrip.memory.consolidate", "cantrip.eval"):
            with refused("not_found"):
                await backend.find(session_id_for(f"entity-{runtime}"))
            with refused("not_found"):
                await backend.submit(session_id_for(f"entity-{runtime}"), "hello")
        assert (await backend.find(session_id_for("entity-theirs"))).session_id


async def test_a_deleted_session_is_gone_from_every_operation(world: World) -> None:
    """``delete`` removes the session's whole tree by the retention rule: afterwards no
    operation finds it, the loom holds none of its turns, and a second delete is
    ``not_found``; a session nobody prompted yet goes too. A loom that cannot delete (in
    memory) says ``unsupported`` and keeps it."""
    backend = world.backend
    sid = await new_session(world)
    await cast(world, sid, "Add one.")
    empty = await new_session(world)
    other = await new_session(world)
    await cast(world, other, "Add two.")
    if world.kind in ("memory", "double"):
        with refused("unsupported"):
            await backend.delete(sid)
        assert (await backend.find(sid)).turns == 3
        return
    gone_entity = (await backend.find(sid)).entity_id
    await backend.delete(sid)
    await backend.delete(empty)
    for gone in (sid, empty):
        with refused("not_found"):
            await backend.find(gone)
        with refused("not_found"):
            await backend.thread(gone)
        with refused("not_found"):
            await backend.submit(gone, "Hello again.")
        with refused("not_found"):
            await backend.delete(gone)
    listed = {s.session_id for s in await backend.sessions()}
    assert sid not in listed and empty not in listed and other in listed

    def held(loom: Loom) -> tuple[bool, int]:
        return loom.has_entity(gone_entity), len(loom.entity_turns(gone_entity))

    assert await backend.read_loom(held) == (False, 0)
    assert text(await cast(world, other, "Add three.")) == "Add three. ok #2"  # others go on


async def test_a_deleted_sessions_tasks_go_with_it(world: World) -> None:
    """A protocol's task records (A2A's) are the session's: its delete removes them,
    where the backend can delete (on PostgreSQL ``cantrip_a2a_tasks`` rows outlived the
    session's tree before); another session's tasks stay."""
    if world.kind in ("memory", "double"):
        return  # cannot delete (the test above)
    backend = world.backend
    sid, other = await new_session(world), await new_session(world)
    mine = await backend.submit_task(sid, "One.", task_id="t-gone", message="m1")
    await finished(world, sid, mine.prompt_id)
    kept = await backend.submit_task(other, "Two.", task_id="t-kept", message="m2")
    await finished(world, other, kept.prompt_id)
    await backend.delete(sid)
    assert await backend.task("t-gone") is None
    assert [t.task_id for t in await backend.tasks(None) if t.task_id.startswith("t-")] == [
        "t-kept"
    ]
    kept_now = await backend.task("t-kept")
    assert kept_now is not None and kept_now.state == "ended"


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_session_with_a_prompt_open_is_not_deleted(
    kind: str, tmp_path: Path, key_env: None, request: pytest.FixtureRequest
) -> None:
    """A prompt running (or waiting its turn) keeps its session: ``busy``, nothing
    removed; once they ended the session can be deleted. The backends that delete."""
    db = request.getfixturevalue("seam_db") if kind == "postgres" else None
    async with open_world(kind, tmp_path, db) as world:
        backend = world.backend
        sid = await new_session(world)
        running = await backend.submit(sid, "hold:keep first")
        async with world.holds.holding("keep"):
            with refused("busy"):
                await backend.delete(sid)
            waiting = await backend.submit(sid, "second", on_busy="enqueue")
            with refused("busy"):
                await backend.delete(sid)
        assert text(await finished(world, sid, running.prompt_id)) == "hold:keep first ok #1"
        assert text(await finished(world, sid, waiting.prompt_id)) == "second ok #2"
        assert (await backend.find(sid)).turns == 6
        await backend.delete(sid)
        with refused("not_found"):
            await backend.find(sid)


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
async def test_an_entity_of_the_runtimes_own_is_not_deleted_as_a_session(
    kind: str, tmp_path: Path, key_env: None, request: pytest.FixtureRequest
) -> None:
    """``delete`` names sessions only: a consolidation's or an eval run's record is
    ``not_found`` and stays in the loom."""
    from cantrip.loom._model import EntityRecord
    from cantrip.protocols.sessions import session_id_for

    db = request.getfixturevalue("seam_db") if kind == "postgres" else None
    async with open_world(kind, tmp_path, db) as world:
        backend: Any = world.backend
        loom = Loom.open(db) if db is not None else backend.hub.spell.loom
        loom.register_entity(
            EntityRecord(entity_id="entity-cantrip.kept", cantrip_id="cantrip.eval")
        )
        if db is not None:
            loom.close()
        with refused("not_found"):
            await backend.delete(session_id_for("entity-cantrip.kept"))
        assert await backend.read_loom(lambda lm: lm.has_entity("entity-cantrip.kept"))


# -- prompts ----------------------------------------------------------------------------


async def test_a_prompt_runs_and_the_next_continues_the_conversation(world: World) -> None:
    sid = await new_session(world)
    first = await cast(world, sid, "Add one.")
    assert text(first) == "Add one. ok #1"
    assert first.cast is not None and first.cast.terminated and first.cast.reason == "done"
    second = await cast(world, sid, "Add two.")
    assert text(second) == "Add two. ok #2"  # the model saw both prompts
    thread = await world.backend.thread(sid)
    assert [t.sequence for t in thread] == [1, 2, 3, 4, 5, 6]
    assert [t.intent for t in thread if t.intent] == ["Add one.", "Add two."]
    info = await world.backend.find(sid)
    assert (info.turns, info.running) == (6, False)


async def test_a_result_of_a_prompt_the_session_never_had_is_not_found(world: World) -> None:
    sid, other = await new_session(world), await new_session(world)
    submitted = await world.backend.submit(other, "Elsewhere.")
    with refused("not_found"):
        await finished(world, sid, submitted.prompt_id)  # another session's prompt
    with refused("not_found"):
        await finished(world, sid, "prompt-nothing")
    assert text(await finished(world, other, submitted.prompt_id)) == "Elsewhere. ok #1"


async def test_a_repeated_key_replays_the_recorded_prompt(world: World) -> None:
    sid = await new_session(world)
    backend = world.backend
    first = await backend.submit(sid, "Count.", key="k-1")
    done = await finished(world, sid, first.prompt_id)
    again = await backend.submit(sid, "Count.", key="k-1")
    assert (first.replayed, again.replayed) == (False, True)
    assert again.prompt_id == first.prompt_id
    replayed = await finished(world, sid, again.prompt_id)
    assert text(replayed) == text(done) == "Count. ok #1"
    assert len(await backend.thread(sid)) == 3  # nothing was cast again
    with refused("key_reused"):
        await backend.submit(sid, "Something else.", key="k-1")


async def test_a_repeated_key_joins_the_running_prompt(world: World) -> None:
    sid = await new_session(world)
    backend = world.backend
    first = await backend.submit(sid, "hold:join once", key="k-join")
    async with world.holds.holding("join"):
        again = await backend.submit(sid, "hold:join once", key="k-join")
        assert again.replayed and again.prompt_id == first.prompt_id
        with refused("key_reused"):
            await backend.submit(sid, "another", key="k-join")
    one, two = (
        await finished(world, sid, first.prompt_id),
        await finished(world, sid, again.prompt_id),
    )
    assert text(one) == text(two) == "hold:join once ok #1"
    assert len(await backend.thread(sid)) == 3


@pytest.mark.parametrize("policy", BUSY_POLICIES)
async def test_a_second_prompt_while_one_runs_follows_its_busy_policy(
    world: World, policy: Any
) -> None:
    sid = await new_session(world)
    backend = world.backend
    running = await backend.submit(sid, "hold:busy first")
    async with world.holds.holding("busy"):
        if policy == "reject":
            with refused("busy"):
                await backend.submit(sid, "second", on_busy=policy)
            second = None
        else:
            second = await backend.submit(sid, "second", on_busy=policy)
            assert not second.replayed and second.prompt_id != running.prompt_id
        if policy in ("interrupt", "rollback"):  # cut off in its held call, as interrupted
            first = await finished(world, sid, running.prompt_id)
            assert first.cast is not None and first.cast.reason == "interrupted", first
    if policy in ("reject", "enqueue"):  # the held call answered: it ends as it would
        first = await finished(world, sid, running.prompt_id)
        assert text(first) == "hold:busy first ok #1"
    if second is not None:
        after = await finished(world, sid, second.prompt_id)
        # rollback: the second prompt continues from before the first
        assert text(after) == ("second ok #1" if policy == "rollback" else "second ok #2")


async def test_a_repeated_key_joins_the_prompt_waiting_its_turn(world: World) -> None:
    """A key repeated while its prompt waits its turn (``enqueue``) names that prompt:
    the repeat joins it, nothing more is queued (in process the hub used to look at the
    running prompt only, and cast the repeat again behind it)."""
    sid = await new_session(world)
    backend = world.backend
    running = await backend.submit(sid, "hold:line first")
    async with world.holds.holding("line"):
        queued = await backend.submit(sid, "second", key="k-line", on_busy="enqueue")
        again = await backend.submit(sid, "second", key="k-line", on_busy="enqueue")
        assert again.replayed and again.prompt_id == queued.prompt_id
        with refused("key_reused"):
            await backend.submit(sid, "other", key="k-line", on_busy="enqueue")
    await finished(world, sid, running.prompt_id)
    assert text(await finished(world, sid, again.prompt_id)) == "second ok #2"
    intents = [t.intent for t in await backend.thread(sid) if t.intent]
    assert intents == ["hold:line first", "second"]


async def test_prompts_waiting_their_turn_run_in_the_order_they_came(world: World) -> None:
    """Five prompts enqueued behind a held one run in the order they were submitted,
    each seeing those before it (a queue is FIFO; drift 3: in process the waiters raced
    for the session when it came free, the first to wake going first)."""
    sid = await new_session(world)
    backend = world.backend
    running = await backend.submit(sid, "hold:fifo first")
    names = ["two", "three", "four", "five", "six"]
    async with world.holds.holding("fifo"):
        waiting = [await backend.submit(sid, name, on_busy="enqueue") for name in names]
    assert text(await finished(world, sid, running.prompt_id)) == "hold:fifo first ok #1"
    results = [text(await finished(world, sid, w.prompt_id)) for w in waiting]
    assert results == [f"{name} ok #{n}" for n, name in enumerate(names, start=2)]
    intents = [t.intent for t in await backend.thread(sid) if t.intent]
    assert intents == ["hold:fifo first", *names]


# -- steering ---------------------------------------------------------------------------


async def test_a_message_to_a_running_prompt_joins_its_next_turn(world: World) -> None:
    sid = await new_session(world)
    backend = world.backend
    submitted = await backend.submit(sid, "until-told")
    await first_turn(world, sid)  # the cast runs: the message joins a later turn
    await backend.steer(sid, "  Use metric.  ")
    outcome = await finished(world, sid, submitted.prompt_id)  # fails if the message is lost
    assert text(outcome) == "Use metric. ok #2"  # the model answered the message
    assert outcome.undelivered == ()
    assert steering(await backend.thread(sid)) == ["Use metric."]


async def test_a_message_that_arrives_in_the_last_turn_comes_back_undelivered(
    world: World,
) -> None:
    sid = await new_session(world)
    backend = world.backend
    submitted = await backend.submit(sid, "hold:late work")
    async with world.holds.holding("late"):
        await backend.steer(sid, "too late")
    outcome = await finished(world, sid, submitted.prompt_id)
    assert text(outcome) == "hold:late work ok #1"
    assert outcome.undelivered == ("too late",)
    assert outcome.cast is not None and outcome.cast.undelivered == ("too late",)
    assert steering(await backend.thread(sid)) == []


async def test_a_message_with_nothing_running_is_refused(world: World) -> None:
    sid = await new_session(world)
    with refused("not_running"):
        await world.backend.steer(sid, "anyone?")
    await cast(world, sid, "Once.")
    with refused("not_running"):
        await world.backend.steer(sid, "after")


# -- cancel -----------------------------------------------------------------------------


async def test_a_cancel_names_the_running_prompt_by_id(world: World) -> None:
    sid = await new_session(world)
    backend = world.backend
    submitted = await backend.submit(sid, "hold:cut slow work", key="k-cut")
    async with world.holds.holding("cut"):
        wrong = await backend.cancel(sid, prompt_id="prompt-0123456789abcdef")
        assert (wrong.cancelled, wrong.target) == (False, "none")
        hit = await backend.cancel(sid, prompt_id=submitted.prompt_id)
        assert (hit.cancelled, hit.target, hit.prompt_id) == (True, "running", submitted.prompt_id)
        assert hit.idempotency_key == "k-cut" and hit.intent == "hold:cut slow work"
        outcome = await finished(world, sid, submitted.prompt_id)  # cut off in its held call
    assert outcome.cast is not None and outcome.cast.reason == "cancelled"
    assert not outcome.cast.terminated
    # the session stays: the next prompt runs
    assert text(await cast(world, sid, "Again.")).startswith("Again. ok")


async def test_a_cancel_by_key_before_its_prompt_cuts_it_off_as_it_comes(world: World) -> None:
    sid = await new_session(world)
    backend = world.backend
    armed = await backend.cancel(sid, key="k-early")
    assert (armed.cancelled, armed.target, armed.idempotency_key) == (False, "next", "k-early")
    assert armed.sticky_s is not None and armed.sticky_s > 0
    outcome = await cast(world, sid, "Never mind.", key="k-early")
    assert outcome.cast is None or outcome.cast.reason == "cancelled", outcome
    # an unrelated prompt is not touched
    assert text(await cast(world, sid, "Other.", key="k-other")).startswith("Other. ok")


async def test_a_cancel_with_nothing_running_cancels_nothing_unless_asked_for_next(
    world: World,
) -> None:
    sid = await new_session(world)
    backend = world.backend
    nothing = await backend.cancel(sid)
    assert (nothing.cancelled, nothing.target) == (False, "none")
    assert text(await cast(world, sid, "Still runs.")) == "Still runs. ok #1"
    armed = await backend.cancel(sid, next_prompt=True)
    assert (armed.cancelled, armed.target) == (False, "next")
    cut = await cast(world, sid, "Cut off.")
    assert cut.cast is None or cut.cast.reason == "cancelled", cut
    assert text(await cast(world, sid, "Runs again.")).startswith("Runs again. ok")


async def test_a_prompt_cut_off_before_it_starts_records_nothing(world: World) -> None:
    """A prompt a cancel cut off before it started -- armed for the next prompt, or for
    its key -- is cancelled with nothing recorded: its intent never reaches the loom,
    nor a later prompt's model (drift 7: in process it recorded a cancelled turn, and
    the next prompt's model saw the withdrawn intent)."""
    sid = await new_session(world)
    backend = world.backend
    armed = await backend.cancel(sid, next_prompt=True)
    assert (armed.cancelled, armed.target) == (False, "next")
    cut = await cast(world, sid, "Withdrawn.")
    assert cut.cast is None, cut
    armed = await backend.cancel(sid, key="k-cut")
    assert (armed.cancelled, armed.target) == (False, "next")
    submitted = await backend.submit(sid, "Withdrawn too.", key="k-cut")
    assert not submitted.replayed
    keyed = await finished(world, sid, submitted.prompt_id)
    assert keyed.cast is None, keyed
    again = await backend.cancel(sid, key="k-cut")  # its prompt ended: read its result
    assert (again.cancelled, again.target) == (False, "ended")
    repeat = await backend.submit(sid, "Withdrawn too.", key="k-cut")
    assert repeat.replayed and (await finished(world, sid, repeat.prompt_id)).cast is None
    assert await backend.thread(sid) == []
    assert text(await cast(world, sid, "Runs.")) == "Runs. ok #1"  # saw no cut intent


async def test_a_cancel_naming_an_ended_prompt_says_it_ended(world: World) -> None:
    """A prompt named by id once it has ended is ``ended`` -- the client reads its
    result -- not ``none``, which says no such prompt is known (drift 4: in process an
    ended prompt's id was forgotten)."""
    sid = await new_session(world)
    backend = world.backend
    submitted = await backend.submit(sid, "Quick.")
    await finished(world, sid, submitted.prompt_id)
    late = await backend.cancel(sid, prompt_id=submitted.prompt_id)
    assert (late.cancelled, late.target, late.prompt_id) == (False, "ended", submitted.prompt_id)
    keyed = await backend.submit(sid, "Keyed.", key="k-ended")
    await finished(world, sid, keyed.prompt_id)
    by_id = await backend.cancel(sid, prompt_id=keyed.prompt_id)
    by_key = await backend.cancel(sid, key="k-ended")
    assert (by_id.cancelled, by_id.target) == (by_key.cancelled, by_key.target) == (False, "ended")
    unknown = await backend.cancel(sid, prompt_id="prompt-0123456789abcdef")
    assert (unknown.cancelled, unknown.target) == (False, "none")
    # and nothing was cut off: the next prompt runs
    assert text(await cast(world, sid, "Again.")) == "Again. ok #3"


async def test_a_cancel_naming_a_prompt_that_waits_its_turn_cuts_off_that_one_only(
    world: World,
) -> None:
    """Two prompts queued behind a running one, the last named: it is cut off, the
    running one and the other waiting one run as if nothing had been asked (drift 1:
    ``serve --db`` cut off every open prompt of the session)."""
    sid = await new_session(world)
    backend = world.backend
    running = await backend.submit(sid, "hold:wait first")
    async with world.holds.holding("wait"):
        behind = await backend.submit(sid, "second", on_busy="enqueue")
        last = await backend.submit(sid, "third", on_busy="enqueue")
        named = await backend.cancel(sid, prompt_id=last.prompt_id)
        assert named.cancelled and named.prompt_id == last.prompt_id
        assert named.intent == "third"
        assert named.target == "queued"  # waiting its turn (drift 2: "starting" in process)
    assert text(await finished(world, sid, running.prompt_id)) == "hold:wait first ok #1"
    cut = await finished(world, sid, last.prompt_id)
    assert cut.cast is None or cut.cast.reason == "cancelled", cut
    other = await finished(world, sid, behind.prompt_id)
    assert text(other) == "second ok #2"  # the third's intent never reached it


# -- pauses -----------------------------------------------------------------------------


async def test_a_pause_is_listed_and_answered_once(world: World) -> None:
    sid = await new_session(world)
    backend = world.backend
    paused = await cast(world, sid, "ask: a colour")
    assert paused.cast is not None and paused.cast.reason == "paused"
    (pause,) = await backend.pauses(sid)
    assert (pause.gate, pause.question) == ("ask_user", "Which colour?")
    assert [p.pause_id for p in paused.cast.pending] == [pause.pause_id]
    with pytest.raises(PauseError):
        await backend.answer(sid, "pause-unknown", Decision.answer("red"))
    with pytest.raises(PauseError):  # a question takes an answer, not an approval
        await backend.answer(sid, pause.pause_id, Decision.approve())
    assert [p.pause_id for p in await backend.pauses(sid)] == [pause.pause_id]  # still waits
    submitted = await backend.answer(sid, pause.pause_id, Decision.answer("blue"))
    assert submitted is not None
    outcome = await finished(world, sid, submitted.prompt_id)
    assert text(outcome) == "ask: a colour ok #1 in blue"
    assert await backend.pauses(sid) == []
    with pytest.raises(PauseError):
        await backend.answer(sid, pause.pause_id, Decision.answer("green"))


async def test_a_pause_answered_twice_at_once_is_answered_once(world: World) -> None:
    """A second answer while the first one's continuation runs (held in its model
    call) is a :class:`PauseError` -- the pause was answered -- not ``busy``, which
    would tell the client to try again (drift 6: in process it was ``busy``)."""
    sid = await new_session(world)
    backend = world.backend
    await cast(world, sid, "ask: hold:twice both")
    (pause,) = await backend.pauses(sid)
    first = await backend.answer(sid, pause.pause_id, Decision.answer("blue"))
    assert first is not None
    async with world.holds.holding("twice"):
        with pytest.raises(PauseError):
            await backend.answer(sid, pause.pause_id, Decision.answer("red"))
    assert text(await finished(world, sid, first.prompt_id)) == "ask: hold:twice both ok #1 in blue"


async def test_an_answer_continuation_is_a_prompt_a_cancel_cuts_off(world: World) -> None:
    """An answer's continuation is a prompt like any other: a cancel naming its id cuts
    it off in its held call, and so does an unnamed cancel (drift 5: in process it ran
    with no current prompt, so neither found anything)."""
    backend = world.backend
    for named, hold in ((True, "named"), (False, "unnamed")):
        sid = await new_session(world)
        await cast(world, sid, f"ask: hold:{hold} cut")
        (pause,) = await backend.pauses(sid)
        submitted = await backend.answer(sid, pause.pause_id, Decision.answer("blue"))
        assert submitted is not None
        async with world.holds.holding(hold):
            by = {"prompt_id": submitted.prompt_id} if named else {}
            answer = await backend.cancel(sid, **by)
            assert (answer.cancelled, answer.target) == (True, "running")
            assert answer.prompt_id == submitted.prompt_id
            cut = await finished(world, sid, submitted.prompt_id)
        assert cut.cast is not None and cut.cast.reason == "cancelled"
        again = await backend.cancel(sid, prompt_id=submitted.prompt_id)
        assert (again.cancelled, again.target) == (False, "ended")


LOCATE = {
    "name": "locate",
    "description": "Where the user is (the client knows).",
    "parameters": {"type": "object", "properties": {"precision": {"type": "string"}}},
}


async def test_a_prompt_offers_the_clients_tools_and_a_call_of_one_waits_for_its_result(
    world: World,
) -> None:
    """A prompt submitted with the client's own tools (AG-UI's ``tools``) offers them
    to its cast: the model calls one, and the call waits like an ``ask_user``
    question -- the cast ends ``paused`` on it -- until the client's result answers
    it; the continuation observes the result. A later prompt without tools is offered
    none of them (in process an offer stayed on the entity, on PostgreSQL each work
    item carries its own)."""
    sid = await new_session(world)
    backend = world.backend
    paused = await cast(world, sid, "tool:locate where am I", tools=[LOCATE])
    assert paused.cast is not None and paused.cast.reason == "paused", paused
    (pause,) = await backend.pauses(sid)
    assert (pause.kind, pause.gate, pause.args) == ("question", "locate", {"precision": "city"})
    assert pause.tool_call_id is not None
    submitted = await backend.answer(sid, pause.pause_id, Decision.answer("Oslo"))
    assert submitted is not None
    outcome = await finished(world, sid, submitted.prompt_id)
    assert text(outcome) == "tool:locate where am I ok #1 in Oslo"  # it saw the result
    (record,) = [c for t in await backend.thread(sid) for c in t.gate_calls if c.gate == "locate"]
    assert record.tool_call_id == pause.tool_call_id and record.text == "Oslo"
    later = await cast(world, sid, "tool:locate again")
    assert text(later) == "tool:locate again ok #2", "the tool was not offered again"


async def test_client_tools_with_bad_names_are_refused_and_nothing_runs(world: World) -> None:
    sid = await new_session(world)
    for tools in (
        [{"name": "has space", "description": "x"}],
        [LOCATE, LOCATE],
    ):
        with refused("bad_tools"):
            await world.backend.submit(sid, "tool:locate x", tools=tools)
    assert await world.backend.thread(sid) == []
    assert not (await world.backend.find(sid)).running


# -- events -----------------------------------------------------------------------------


async def test_events_follow_a_session_from_a_position(world: World) -> None:
    sid = await new_session(world)
    backend = world.backend
    await cast(world, sid, "One.")
    told: list[SessionEvent] = []
    caught_up = trio.Event()

    async def watch(task_status: trio.TaskStatus[None]) -> None:
        events = backend.follow(sid, after=1)
        task_status.started()
        async with contextlib.aclosing(events):
            async for event in events:
                told.append(event)
                if event.position == 3:
                    caught_up.set()
                at = [e.position for e in told if e.position is not None][-1:]
                if event.type == "final_response" and at == [6]:
                    return

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(watch)
            await caught_up.wait()  # the recorded turns after position 1 came first
            await cast(world, sid, "Two.")
    turns = [e for e in told if e.position is not None]
    assert [e.position for e in turns] == [2, 3, 4, 5, 6]
    assert all(e.type == "step_complete" and e.turn is not None for e in turns)
    assert [e.turn.sequence for e in turns if e.turn is not None] == [2, 3, 4, 5, 6]
    assert [e.data["sequence"] for e in turns] == [2, 3, 4, 5, 6]
    finals = [e.data["result"] for e in told if e.type == "final_response"]
    assert finals == ["One. ok #1", "Two. ok #2"]


async def prompt_events(world: World, sid: str, prompt_id: str) -> list[SessionEvent]:
    """Every event of one prompt's follow, which must end by itself."""
    told: list[SessionEvent] = []
    with trio.fail_after(60):
        events = world.backend.follow(sid, prompt_id=prompt_id)
        async with contextlib.aclosing(events):
            async for event in events:
                told.append(event)
    return told


async def test_a_prompts_follow_tells_its_events_only_and_ends_with_it(world: World) -> None:
    """``follow(prompt_id=...)`` is a prompt's own stream (the HTTP prompt stream): its
    turns from its beginning -- called after ``submit``, when the cast may have begun
    -- not those of the prompt it waited behind, and it ends when the prompt ends."""
    sid = await new_session(world)
    backend = world.backend
    first = await backend.submit(sid, "hold:own first")
    async with world.holds.holding("own"):
        second = await backend.submit(sid, "second", on_busy="enqueue")
    told = await prompt_events(world, sid, second.prompt_id)
    steps = [e for e in told if e.type == "step_complete"]
    assert len(steps) == 3 and all(e.turn is not None for e in steps)
    assert [e.turn.intent for e in steps if e.turn is not None] == ["second", None, None]
    finals = [e.data["result"] for e in told if e.type == "final_response"]
    assert finals == ["second ok #2"]  # not the first prompt's
    assert text(await finished(world, sid, second.prompt_id)) == "second ok #2"
    again = await prompt_events(world, sid, first.prompt_id)  # an ended prompt: it ends
    assert [e.data["result"] for e in again if e.type == "final_response"] in (
        [],
        ["hold:own first ok #1"],
    )
    with refused("not_found"):
        await prompt_events(world, sid, "no-such-prompt")


async def test_a_shutdown_leaves_no_prompt_running_here_and_its_result_is_answered(
    world: World,
) -> None:
    """``shutdown(grace_s)`` returns once no prompt runs in this process: one still
    running after the grace is cut off (reason ``shutdown``) where it runs here, and
    goes on where it runs elsewhere (a worker); either way its result is answered."""
    sid = await new_session(world)
    backend = world.backend
    held = await backend.submit(sid, "hold:stop first")
    async with world.holds.holding("stop"):
        with trio.fail_after(30):
            await backend.shutdown(0.05)
    outcome = await finished(world, sid, held.prompt_id)
    assert outcome.cast is not None
    expected = "done" if world.backend.capabilities.shared else "shutdown"
    assert outcome.cast.reason == expected, outcome


async def test_capabilities_say_what_a_backend_offers(world: World) -> None:
    capabilities = world.backend.capabilities
    health = await world.backend.health()
    assert capabilities.mode == health.mode
    assert not capabilities.shared or capabilities.durable_prompt_ids  # replicas share ids


async def test_following_until_a_prompt_ends_tells_its_turns_then_ends(world: World) -> None:
    """``follow(until=...)`` ends once the prompt named has ended and its turns were
    told -- whether it was running when the following began or had ended already."""
    sid = await new_session(world)
    backend = world.backend
    submitted = await backend.submit(sid, "hold:until Go.")
    events = backend.follow(sid, until=submitted.prompt_id)
    with trio.fail_after(60):
        async with contextlib.aclosing(events):
            async with world.holds.holding("until"):  # running as the following begins
                told = [await anext(events)]
            told += [e async for e in events]
    assert [e.position for e in told if e.position is not None] == [1, 2, 3]
    assert [e.data["result"] for e in told if e.type == "final_response"] == [
        "hold:until Go. ok #1"
    ]
    again = backend.follow(sid, 1, until=submitted.prompt_id)  # ended: recorded ones only
    with trio.fail_after(60):
        async with contextlib.aclosing(again):
            assert [e.position async for e in again if e.position is not None] == [2, 3]
    with refused("not_found"):
        async with contextlib.aclosing(backend.follow(sid, until="prompt-nope")) as nope:
            await anext(nope)


# -- tasks: a protocol's record beside a prompt ------------------------------------------


async def test_a_task_is_recorded_with_its_prompt_and_read_with_its_state(world: World) -> None:
    sid = await new_session(world)
    backend = world.backend
    assert await backend.task("task-nope") is None
    first = await backend.submit_task(sid, "hold:task One.", task_id="t-one", message="m1")
    async with world.holds.holding("task"):
        assert (first.task_id, first.session_id, first.messages) == ("t-one", sid, ("m1",))
        assert first.state == "open" and first.result is None and not first.canceled
        with refused("busy"):  # refused: no task is made either
            await backend.submit_task(sid, "Two.", task_id="t-refused", message="m")
        assert await backend.task("t-refused") is None
    await finished(world, sid, first.prompt_id)
    ended = await backend.task("t-one")
    assert ended is not None and ended.state == "ended" and ended.prompt_id == first.prompt_id
    assert ended.result is not None and ended.result["result"] == "hold:task One. ok #1"
    second = await backend.submit_task(sid, "Two.", task_id="t-two", message="m2")
    await finished(world, sid, second.prompt_id)
    other = await new_session(world)
    await backend.submit_task(other, "Three.", task_id="t-three", message="m3")
    assert second.seq > first.seq
    assert [t.task_id for t in await backend.tasks(sid)] == ["t-two", "t-one"]
    assert [t.task_id for t in await backend.tasks(sid, before=second.seq)] == ["t-one"]
    assert [t.task_id for t in await backend.tasks(sid, limit=1)] == ["t-two"]
    mine = {"t-one", "t-two", "t-three"}
    assert [t.task_id for t in await backend.tasks(None) if t.task_id in mine][:1] == ["t-three"]


async def test_a_task_waiting_on_a_pause_is_answered_once_and_moves_on(world: World) -> None:
    sid = await new_session(world)
    backend = world.backend
    task = await backend.submit_task(sid, "ask: a colour", task_id="t-ask", message="m1")
    await finished(world, sid, task.prompt_id)
    waiting = await backend.task("t-ask")
    assert waiting is not None and waiting.result is not None
    assert waiting.result["reason"] == "paused"
    (pause,) = await backend.pauses(sid)
    with pytest.raises(PauseError):
        await backend.answer_task(
            "t-ask", task.prompt_id, "pause-unknown", Decision.answer("x"), "m"
        )
    moved = await backend.answer_task(
        "t-ask", task.prompt_id, pause.pause_id, Decision.answer("blue"), "m2"
    )
    assert moved is not None and moved.prompt_id != task.prompt_id
    assert moved.messages == ("m1", "m2")
    stale = await backend.answer_task(  # the task moved on: not answered again
        "t-ask", task.prompt_id, pause.pause_id, Decision.answer("red"), "m3"
    )
    assert stale is None
    assert text(await finished(world, sid, moved.prompt_id)) == "ask: a colour ok #1 in blue"
    done = await backend.task("t-ask")
    assert done is not None and done.state == "ended" and done.messages == ("m1", "m2")


async def test_a_task_waiting_for_input_is_cancelled_once(world: World) -> None:
    sid = await new_session(world)
    backend = world.backend
    task = await backend.submit_task(sid, "ask: a colour", task_id="t-cut", message="m1")
    await finished(world, sid, task.prompt_id)
    cancelled = await backend.cancel_waiting_task("t-cut", task.prompt_id)
    assert cancelled is not None and cancelled.canceled
    assert await backend.cancel_waiting_task("t-cut", task.prompt_id) is None
    (pause,) = await backend.pauses(sid)  # the pause stays in the loom
    answered = await backend.answer_task(
        "t-cut", task.prompt_id, pause.pause_id, Decision.answer("blue"), "m2"
    )
    assert answered is None, "a cancelled task takes no answer"
    assert [p.pause_id for p in await backend.pauses(sid)] == [pause.pause_id]


async def test_the_loom_the_sessions_are_recorded_in_is_read_through_the_backend(
    world: World,
) -> None:
    sid = await new_session(world)
    await cast(world, sid, "Add one.")
    thread = await world.backend.thread(sid)
    info = await world.backend.find(sid)

    def read(loom: Loom) -> tuple[list[str], bool]:
        return [t.id for t in loom.thread(thread[-1].id)], info.entity_id in loom.entities

    ids, known = await world.backend.read_loom(read)
    assert ids == [t.id for t in thread]
    assert known


async def test_a_released_session_is_resumed_by_the_next_operation(world: World) -> None:
    sid = await new_session(world)
    await cast(world, sid, "Add one.")
    before = await world.backend.thread(sid)
    await world.backend.release(sid)
    await world.backend.release("session-never-was")  # not held: nothing to do
    assert await world.backend.thread(sid) == before
    again = await cast(world, sid, "Add two.")
    assert text(again) == "Add two. ok #2"  # the conversation goes on from the loom


async def test_release_lets_go_of_an_idle_entity_in_process_only(key_env: None) -> None:
    """What ``release`` is for: in process the session's entity (and the providers it
    opened) is closed and dropped; a running session is left as it is."""
    loom = Loom()
    hub = SessionHub(build_spell({"spec": spec("http://127.0.0.1:9/v1")}, loom))
    async with ProcessBackend.open(hub) as backend:
        info, _ = await backend.create()
        entity = hub.sessions[info.session_id].entity
        hub.sessions[info.session_id].running = trio.CancelScope()  # a prompt open
        await backend.release(info.session_id)
        assert info.session_id in hub.sessions
        hub.sessions[info.session_id].running = None
        await backend.release(info.session_id)
        assert info.session_id not in hub.sessions and entity._closed
        assert (await backend.find(info.session_id)).session_id == info.session_id  # resumed


async def test_a_fork_continues_from_a_turn_where_the_backend_offers_it(world: World) -> None:
    sid = await new_session(world)
    await cast(world, sid, "Add one.")
    thread = await world.backend.thread(sid)
    if not world.backend.capabilities.viewer_fork:  # the one place that says so
        with pytest.raises(SessionError) as refused:
            await world.backend.fork(thread[0].id)
        assert refused.value.kind == "unsupported"
        assert "viewer_fork" in refused.value.message
        return
    with pytest.raises(SessionError) as unknown:
        await world.backend.fork("turn-nope")
    assert unknown.value.kind == "not_found"
    forked = await world.backend.fork(thread[1].id)
    assert forked.session_id != sid and (await world.backend.find(forked.session_id)) == forked
    assert (
        await world.backend.read_loom(lambda loom: loom.entity(forked.entity_id).forked_from)
        == thread[1].id
    )
    again = await cast(world, forked.session_id, "Add two.")
    assert text(again) == "Add two. ok #2"  # it saw the thread up to the fork point


# -- drift between the two real backends today (phase 2 removes each) --------------------


async def test_drift_live_token_events(both: tuple[World, World]) -> None:
    kinds = []
    for world in both:
        sid = await new_session(world)
        seen: set[str] = set()

        async def watch(
            task_status: trio.TaskStatus[None],
            w: World = world,
            s: str = sid,
            kinds: set[str] = seen,
        ) -> None:
            events = w.backend.follow(s)
            task_status.started()
            async with contextlib.aclosing(events):
                async for event in events:
                    kinds.add(event.type)
                    if event.type == "final_response":
                        return

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                await nursery.start(watch)
                await cast(world, sid, "Watch me.")
        kinds.append("tool_call" in seen)
        assert world.backend.capabilities.token_events == ("tool_call" in seen)
    assert kinds == [True, False]


# -- resumable events (issue 44) ---------------------------------------------------------


async def told_until(
    world: World, sid: str, prompt_id: str, after: int | EventId = 0, limit: int | None = None
) -> list[SessionEvent]:
    """The session's events after ``after`` until the prompt has ended (or ``limit``
    of them: the follow is let go there, as a client that drops)."""
    told: list[SessionEvent] = []
    events = world.backend.follow(sid, after, until=prompt_id)
    with trio.fail_after(60):
        async with contextlib.aclosing(events):
            async for event in events:
                told.append(event)
                if len(told) == limit:
                    break
    return told


def said(events: list[SessionEvent]) -> list[tuple[str, str, Any]]:
    return [(str(e.id), e.type, e.data) for e in events]


async def test_every_event_of_a_follow_has_an_id_that_orders_it_in_its_session(
    world: World,
) -> None:
    """``<turn>.<index>``: a turn's ``step_complete`` is ``<its position>.0``, its
    ``final_response`` ``.1``, and every event's id is later than the one before."""
    sid = await new_session(world)
    await cast(world, sid, "One.")
    second = await world.backend.submit(sid, "Two.")
    told = await told_until(world, sid, second.prompt_id)
    ids = [e.id for e in told]
    assert all(i is not None for i in ids), told
    assert ids == sorted(ids) and len(set(ids)) == len(ids)  # type: ignore[type-var]
    steps = [str(e.id) for e in told if e.type == "step_complete"]
    assert steps == [f"{n}.0" for n in range(1, 7)]
    finals = [str(e.id) for e in told if e.type == "final_response"]
    assert finals == ["3.1", "6.1"]


async def test_a_follow_resumed_after_any_event_tells_exactly_the_rest(world: World) -> None:
    """A client that let go after its k-th event, for every k, and resumes after that
    event's id, is told every later event once -- after the prompt ended."""
    sid = await new_session(world)
    first = await world.backend.submit(sid, "ask: Paint it.")
    await finished(world, sid, first.prompt_id)
    [pause] = await world.backend.pauses(sid)
    answered = await world.backend.answer(sid, pause.pause_id, Decision.answer("blue"))
    assert answered is not None
    whole = await told_until(world, sid, answered.prompt_id)
    assert "pause" in [e.type for e in whole]
    for k in range(1, len(whole) + 1):
        part = await told_until(world, sid, answered.prompt_id, limit=k)
        last = part[-1].id
        assert last is not None
        rest = await told_until(world, sid, answered.prompt_id, after=last)
        assert said(part + rest) == said(whole), k


async def test_a_follow_resumed_while_the_prompt_runs_tells_the_rest_then_the_live_ones(
    world: World,
) -> None:
    """Let go during the prompt, resumed during it: the rest of what was told, then
    what happens, with no gap and nothing twice; a watcher that never let go is told
    the same events with the same ids. (The cast is held in its third turn: the
    first event is one every backend has told by then, and the resumed follow's
    first event, the second turn's, comes while it is held.)"""
    for k in (1,):
        sid = await new_session(world)
        submitted = await world.backend.submit(sid, f"hold:during{k} Go.")
        whole: list[SessionEvent] = []
        async with trio.open_nursery() as nursery:

            async def watch(
                task_status: trio.TaskStatus[None],
                s: str = sid,
                p: str = submitted.prompt_id,
                into: list[SessionEvent] = whole,
            ) -> None:
                events = world.backend.follow(s, until=p)
                task_status.started()
                async with contextlib.aclosing(events):
                    into.extend([e async for e in events])

            await nursery.start(watch)
            async with world.holds.holding(f"during{k}"):  # two turns recorded, held
                part = await told_until(world, sid, submitted.prompt_id, limit=k)
                last = part[-1].id
                assert last is not None
                resumed = world.backend.follow(sid, last, until=submitted.prompt_id)
                early = await anext(resumed)  # following again while it is held
            async with contextlib.aclosing(resumed):
                rest = [early] + [e async for e in resumed]
        assert said(part + rest) == said(whole), k
        assert [e.type for e in whole].count("final_response") == 1


async def test_two_watchers_of_one_session_are_told_the_same_events_with_the_same_ids(
    world: World,
) -> None:
    sid = await new_session(world)
    submitted = await world.backend.submit(sid, "hold:two Go.")
    async with world.holds.holding("two"):
        early = world.backend.follow(sid, until=submitted.prompt_id)
        first = await anext(early)
    async with contextlib.aclosing(early):
        one = [first] + [e async for e in early]
    two = await told_until(world, sid, submitted.prompt_id)  # the second comes later
    assert said(one) == said(two)


async def test_an_event_id_past_the_sessions_present_is_a_bad_request(world: World) -> None:
    sid = await new_session(world)
    await cast(world, sid, "One.")
    for after in (EventId(4, 0), 4):
        with refused("bad_request"):
            async with contextlib.aclosing(world.backend.follow(sid, after)) as events:
                await anext(events)
