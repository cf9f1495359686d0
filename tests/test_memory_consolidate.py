"""Memory consolidation (issue 42.5): after a cast ends, a cantrip of its own extracts and
merges facts into a namespace in the background -- supervised, under its own wards,
recorded in the loom, every item naming the turns it was drawn from."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from cantrip import (
    Cantrip,
    Circle,
    Consolidate,
    ConstructionError,
    Identity,
    Loom,
    MemorySettings,
    ScriptedLLM,
    gate,
    max_turns,
)
from cantrip.memory import CONSOLIDATES_TAG, CONSOLIDATOR_ID, forget_derived, memory_for
from gates import done, forget, recall, remember

ALICE = ("user", "alice")


def call(gate_name: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"gate": gate_name, "args": args}]}


@pytest.fixture(params=["sqlite", "postgres"])
def loom_target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "loom.db")
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def loom(tmp_path: Path) -> Iterator[Loom]:
    opened = Loom.open(str(tmp_path / "loom.db"))
    yield opened
    opened.close()


def consolidator(script: list[dict[str, Any]], *wards: Any, extra: tuple[Any, ...] = ()) -> Cantrip:
    return Cantrip(
        llm=ScriptedLLM(script),
        identity=Identity(system_prompt="Extract durable facts."),
        circle=Circle([done, remember, recall, forget, *extra], list(wards) or [max_turns(6)]),
    )


def user_spell(
    loom: Loom,
    script: list[dict[str, Any]],
    consolidate: Consolidate | None,
    *,
    recall_on: bool = False,
) -> Cantrip:
    return Cantrip(
        llm=ScriptedLLM(script),
        identity=Identity(system_prompt="You help."),
        circle=Circle([done], [max_turns(4)]),
        loom=loom,
        memory=MemorySettings(
            namespace=("user", "{user}"), name="helper", recall=recall_on, consolidate=consolidate
        ),
    )


def consolidations(loom: Loom) -> list[str]:
    return [e for e, record in loom.entities.items() if record.cantrip_id == CONSOLIDATOR_ID]


EXTRACT = [
    call("recall", query="colour"),
    call("remember", key="favourite_colour", value="Alice's favourite colour is blue"),
    call("done", answer="1 fact"),
]


async def test_consolidation_writes_facts_drawn_from_the_cast(loom_target: str) -> None:
    loom = Loom.open(loom_target)
    try:
        spell = user_spell(
            loom, [call("done", answer="Noted!")], Consolidate(consolidator(list(EXTRACT)))
        )
        async with spell.summon() as entity:
            result = await entity.send("My favourite colour is blue.", tags={"user": "alice"})
        # leaving `async with` waited for the consolidation: it has ended
        assert result.result == "Noted!"
        [run] = consolidations(loom)
        turns = loom.entity_turns(run)
        assert turns[-1].terminated and turns[-1].result == "1 fact"
        source_turns = [t.id for t in result.turns]
        assert turns[0].extras[CONSOLIDATES_TAG] == {
            "entity_id": entity.id,
            "turn_ids": source_turns,
        }
        assert "User: My favourite colour is blue." in (turns[0].intent or "")
        assert "Assistant" in (turns[0].intent or "")
        item = memory_for(loom.store).get(ALICE, "favourite_colour")
        assert item is not None and item.value == "Alice's favourite colour is blue"
        assert item.metadata["source"] == {
            "entity_id": run,
            "turn_id": turns[1].id,  # the turn that wrote it
            "drawn_from": {"entity_id": entity.id, "turn_ids": source_turns},
        }
        # the source cast's thread is untouched: the consolidation is an entity of its own
        assert [t.id for t in loom.entity_turns(entity.id)] == source_turns
        assert loom.entity(run).parent_entity_id is None
    finally:
        loom.close()


async def test_consolidation_is_off_by_default(loom: Loom) -> None:
    spell = user_spell(loom, [call("done", answer="ok")], None)
    async with spell.summon() as entity:
        result = await entity.send("My favourite colour is blue.", tags={"user": "alice"})
    assert result.result == "ok"
    assert consolidations(loom) == []
    assert list(loom.entities) == [entity.id]


async def test_a_failing_consolidator_leaves_the_cast_and_its_loom_intact(
    loom: Loom, caplog: pytest.LogCaptureFixture
) -> None:
    refusal = {"error": {"status": 400, "message": "the model refused"}}
    failing = consolidator([refusal, refusal])
    spell = user_spell(
        loom, [call("done", answer="Noted!"), call("done", answer="ok")], Consolidate(failing)
    )
    async with spell.summon() as entity:
        result = await entity.send("I live in Lyon.", tags={"user": "alice"})
    assert result.result == "Noted!" and result.terminated
    assert [t.id for t in loom.entity_turns(entity.id)] == [t.id for t in result.turns]
    [run] = consolidations(loom)
    [failed] = loom.entity_turns(run)
    assert failed.reason == "llm_error" and not failed.terminated  # recorded, in its thread
    assert any("consolidation" in r.getMessage() and run in r.getMessage() for r in caplog.records)
    assert memory_for(loom.store).search(ALICE) == []

    # the entity goes on: its next cast runs and is consolidated again
    async with spell.resume(entity.id) as again:
        second = await again.send("And I like tea.", tags={"user": "alice"})
    assert second.terminated and len(consolidations(loom)) == 2


async def test_the_consolidators_wards_bound_it(loom: Loom) -> None:
    endless = [call("recall", query=f"fact {n}") for n in range(10)]
    bounded = consolidator(endless, max_turns(2))
    spell = user_spell(loom, [call("done", answer="ok")], Consolidate(bounded))
    async with spell.summon() as entity:
        await entity.send("hello", tags={"user": "alice"})
    [run] = consolidations(loom)
    turns = loom.entity_turns(run)
    assert len(turns) == 2 and turns[-1].truncated and turns[-1].reason == "max_turns"
    assert isinstance(bounded.llm, ScriptedLLM)
    assert len(bounded.llm.invocations) == 2  # no call beyond its ward


async def test_a_later_sessions_automatic_recall_sees_the_consolidated_fact(
    loom_target: str,
) -> None:
    loom = Loom.open(loom_target)
    try:
        spell = user_spell(
            loom, [call("done", answer="Noted!")], Consolidate(consolidator(list(EXTRACT)))
        )
        async with spell.summon() as entity:
            await entity.send("My favourite colour is blue.", tags={"user": "alice"})
    finally:
        loom.close()

    later_loom = Loom.open(loom_target)  # another process, another session
    try:
        later = user_spell(later_loom, [call("done", answer="blue")], None, recall_on=True)
        async with later.summon() as session:
            answer = await session.send("What is my favourite colour?", tags={"user": "alice"})
        assert isinstance(later.llm, ScriptedLLM)
        prompt = list(later.llm.invocations[0].messages)[-1].text()
        assert "favourite_colour: Alice's favourite colour is blue" in prompt
        assert answer.turns[0].extras["memory"]["recalled"][0]["key"] == "favourite_colour"
    finally:
        later_loom.close()


async def test_prune_takes_what_was_consolidated_from_a_removed_session(loom: Loom) -> None:
    spell = user_spell(
        loom, [call("done", answer="Noted!")], Consolidate(consolidator(list(EXTRACT)))
    )
    async with spell.summon() as entity:
        await entity.send("My favourite colour is blue.", tags={"user": "alice"})
    store = memory_for(loom.store)
    assert forget_derived(store, [entity.id]) == [(ALICE, "favourite_colour")]  # dry run
    assert forget_derived(store, ["entity-someone-else"]) == []


async def test_cast_async_returns_once_its_consolidation_has_ended(loom: Loom) -> None:
    settings = MemorySettings(
        namespace=("shared",), consolidate=Consolidate(consolidator(list(EXTRACT)))
    )
    spell = Cantrip(
        llm=ScriptedLLM([call("done", answer="ok")]),
        identity=Identity(),
        circle=Circle([done], [max_turns(2)]),
        loom=loom,
        memory=settings,
    )
    await spell.cast_async("My favourite colour is blue.")
    assert memory_for(loom.store).get(("shared",), "favourite_colour") is not None


def test_consolidate_refuses_bad_settings_one_line_each() -> None:
    with pytest.raises(ConstructionError) as caught:
        Consolidate("not a cantrip", namespace=("user", "{whom}"), after="session")
    problems = caught.value.problems
    assert any("consolidate namespace part '{whom}'" in p for p in problems)
    assert any("consolidate after is 'cast'" in p for p in problems)
    assert any("consolidate cantrip must be a Cantrip" in p for p in problems)


async def test_a_consolidation_in_a_nursery_of_the_entitys_own_is_cancelled_with_it(
    loom: Loom,
) -> None:
    started = trio.Event()

    @gate
    async def ponder() -> str:
        """Think for a long while."""
        started.set()
        await trio.sleep_forever()
        return "never"

    slow = consolidator([call("ponder")], extra=(ponder,))
    spell = user_spell(loom, [call("done", answer="ok")], Consolidate(slow))
    with trio.CancelScope() as outside:
        async with spell.summon() as entity:
            result = await entity.send("hello", tags={"user": "alice"})
            await started.wait()
            outside.cancel()
    assert result.terminated
    [run] = consolidations(loom)
    [cut] = loom.entity_turns(run)
    assert cut.truncated and cut.reason == "cancelled"


# -- the [memory.consolidate] spec table ------------------------------------------------


SPEC = """
[llm]
provider = "scripted"
responses = [{tool_calls = [{gate = "done", args = {answer = "Noted!"}}]}]

[llms.extractor]
provider = "scripted"
script = "shared"
responses = [
  {tool_calls = [{gate = "remember", args = {key = "city", value = "Alice lives in Lyon"}}]},
  {tool_calls = [{gate = "done", args = {answer = "1 fact"}}]},
]

[circle]
medium = "conversation"
gates = ["done"]
wards = [{max_turns = 3}]

[loom]
path = "loom.db"

[memory]
namespace = ["user", "{user}"]

[memory.consolidate]
llm = "extractor"
prompt = "Keep what matters."
namespace = ["user", "{user}", "facts"]
wards = [{max_turns = 4}, {max_tokens_total = 50000}]
"""


async def test_a_spec_consolidate_table_consolidates_after_each_cast(tmp_path: Path) -> None:
    from cantrip.spec import build_cantrip, load_spec_file

    path = tmp_path / "helper.toml"
    path.write_text(SPEC)
    spell = build_cantrip(load_spec_file(path), base_dir=tmp_path)
    try:
        consolidate = spell.memory.consolidate if spell.memory is not None else None
        assert consolidate is not None
        assert consolidate.cantrip.identity.system_prompt == "Keep what matters."
        assert consolidate.cantrip.circle.resolved.get("max_tokens_total") == 50000
        async with spell.summon() as entity:
            await entity.send("I live in Lyon.", tags={"user": "alice"})
        item = memory_for(spell.loom.store).get(("user", "alice", "facts"), "city")
        assert item is not None and item.value == "Alice lives in Lyon"
        assert item.metadata["source"]["drawn_from"]["entity_id"] == entity.id
    finally:
        spell.loom.close()


def test_a_spec_without_the_table_does_not_consolidate(tmp_path: Path) -> None:
    from cantrip.spec import build_cantrip, load_spec_file

    path = tmp_path / "helper.toml"
    path.write_text(SPEC.split("[memory.consolidate]")[0])
    spell = build_cantrip(load_spec_file(path), base_dir=tmp_path)
    assert spell.memory is not None and spell.memory.consolidate is None
    spell.loom.close()


def test_spec_consolidate_mistakes_are_reported_at_load_with_the_others(tmp_path: Path) -> None:
    from cantrip.spec import build_cantrip, load_spec_file

    text = (
        SPEC.replace('llm = "extractor"', 'llm = "nobody"')
        .replace('namespace = ["user", "{user}", "facts"]', 'namespace = ["user", "{whom}"]')
        .replace("{max_turns = 4}, {max_tokens_total = 50000}", "{max_turn = 4}")
        .replace('gates = ["done"]', 'gates = ["done", "nosuchgate"]')
    )
    path = tmp_path / "helper.toml"
    path.write_text(text)
    with pytest.raises(ConstructionError) as caught:
        build_cantrip(load_spec_file(path), base_dir=tmp_path)
    problems = caught.value.problems
    assert any("nosuchgate" in p for p in problems)  # the rest of the spec's, beside them
    assert any("memory.consolidate: llm 'nobody' is not a named llm" in p for p in problems)
    assert any("memory.consolidate.wards: unknown ward 'max_turn'" in p for p in problems)
    assert any("at least one truncation ward" in p for p in problems)
    assert all("\n" not in p for p in problems)

    path.write_text(SPEC.replace('llm = "extractor"', 'llm = "extractor"\nnamespace_ = 1'))
    with pytest.raises(ConstructionError, match=r"memory\.consolidate\.namespace_"):
        build_cantrip(load_spec_file(path), base_dir=tmp_path)
    path.write_text(SPEC.replace('["user", "{user}", "facts"]', '["{whom}"]'))
    with pytest.raises(ConstructionError, match=r"consolidate namespace part '\{whom\}'"):
        build_cantrip(load_spec_file(path), base_dir=tmp_path)


# -- serve: the hub supervises consolidations, and shutdown cuts them off -----------------


async def test_serve_runs_consolidation_in_its_nursery_and_shutdown_cuts_it_off(
    loom: Loom,
) -> None:
    from cantrip.protocols.sessions import ProcessBackend
    from cantrip.protocols.sessions._hub import SessionHub

    started = trio.Event()

    @gate
    async def ponder() -> str:
        """Think for a long while."""
        started.set()
        await trio.sleep_forever()
        return "never"

    slow = consolidator([call("ponder")], extra=(ponder,))
    spell = user_spell(loom, [call("done", answer="Noted!")], Consolidate(slow))
    hub = SessionHub(spell)
    with trio.fail_after(30):  # (inline, the prompt would wait for it for ever)
        async with ProcessBackend.open(hub) as backend:
            session, _ = hub.create(user="alice")
            result = await hub.prompt(session, "I live in Lyon.")
            # the prompt returned while its consolidation runs on, in the hub's nursery
            assert result is not None and result.result == "Noted!"
            await started.wait()
            [run] = consolidations(loom)
            assert loom.entity_turns(run) == ()
            await backend.shutdown(0.0)
    [cut] = loom.entity_turns(run)
    assert cut.truncated and cut.reason == "shutdown"
    assert cut.extras[CONSOLIDATES_TAG]["entity_id"] == session.entity.id
    assert [t.result for t in loom.entity_turns(session.entity.id)] == ["Noted!"]


# -- --db: the consolidation is queued for the workers ------------------------------------


def _queued_spec() -> dict[str, Any]:
    import tomllib

    data = tomllib.loads(SPEC)
    del data["loom"]  # the workers' loom is the database
    del data["llms"]["extractor"]["script"]  # per entity: each cast plays it from the start
    return {"spec": data}


async def test_on_db_a_worker_runs_the_queued_consolidation(pg_url: str) -> None:
    from cantrip.distributed._dispatcher import Dispatcher
    from cantrip.distributed._worker import Worker

    spell = _queued_spec()
    dispatcher = await trio.to_thread.run_sync(Dispatcher, pg_url)
    loom = Loom.open(pg_url)
    try:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                worker = Worker(pg_url, poll_s=0.1)
                await nursery.start(worker.run)
                work, source = await trio.to_thread.run_sync(
                    lambda: dispatcher.submit({**spell, "user": "alice"}, "I live in Lyon.")
                )
                state, outcome = await trio.to_thread.run_sync(
                    lambda: dispatcher.wait(work, timeout=30)
                )
                assert (state, outcome["result"]) == ("done", "Noted!")
                # the source's work queued its consolidation as work of its own
                queued = await trio.to_thread.run_sync(_consolidation_work, pg_url)
                assert len(queued) == 1
                [(consolidation_work, run, marked)] = queued
                state, outcome = await trio.to_thread.run_sync(
                    lambda: dispatcher.wait(consolidation_work, timeout=30)
                )
                assert (state, outcome["result"]) == ("done", "1 fact")
                nursery.cancel_scope.cancel()
        source_turns = [t.id for t in loom.entity_turns(source)]
        assert marked == {"entity_id": source, "turn_ids": source_turns}
        assert loom.entity(run).cantrip_id == CONSOLIDATOR_ID
        turns = loom.entity_turns(run)
        assert turns[0].extras[CONSOLIDATES_TAG] == marked
        item = memory_for(loom.store).get(("user", "alice", "facts"), "city")
        assert item is not None and item.value == "Alice lives in Lyon"
        assert item.metadata["source"] == {
            "entity_id": run,
            "turn_id": turns[0].id,
            "drawn_from": marked,
        }
    finally:
        loom.close()
        await trio.to_thread.run_sync(dispatcher.close)


def _consolidation_work(url: str) -> list[tuple[int, str, Any]]:
    import json

    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id, entity_id, spell FROM cantrip_work ORDER BY id").fetchall()
    found = [(int(i), str(e), json.loads(s)) for i, e, s in rows]
    return [(i, e, s["consolidates"]) for i, e, s in found if "consolidates" in s]


async def test_a_cast_without_the_user_the_namespace_needs_is_not_consolidated(
    loom: Loom, caplog: pytest.LogCaptureFixture
) -> None:
    spell = user_spell(
        loom, [call("done", answer="ok")], Consolidate(consolidator(list(EXTRACT)))
    ).with_(
        memory=MemorySettings(
            namespace=("shared",),
            consolidate=Consolidate(consolidator(list(EXTRACT)), namespace=("user", "{user}")),
        )
    )
    async with spell.summon() as entity:
        result = await entity.send("hello")  # no user tag
    assert result.result == "ok"
    assert consolidations(loom) == []
    assert any("needs a user" in r.getMessage() for r in caplog.records)


async def test_a_paused_cast_is_consolidated_once_its_answer_ends_it(loom: Loom) -> None:
    from cantrip import Decision
    from gates import ask_user

    spell = Cantrip(
        llm=ScriptedLLM(
            [call("ask_user", question="Which city?"), call("done", answer="Lyon, noted.")]
        ),
        identity=Identity(system_prompt="You help."),
        circle=Circle([done, ask_user], [max_turns(4)]),
        loom=loom,
        memory=MemorySettings(
            namespace=("user", "{user}"), consolidate=Consolidate(consolidator(list(EXTRACT)))
        ),
    )
    async with spell.summon() as entity:
        paused = await entity.send("Where do I live?", tags={"user": "alice"})
        assert paused.paused
        assert consolidations(loom) == []  # a pause has not ended the cast
        ended = await entity.answer(paused.pending[0].pause_id, Decision.answer("Lyon"))
    assert ended is not None and ended.result == "Lyon, noted."
    [run] = consolidations(loom)
    first = loom.entity_turns(run)[0]
    thread = [t.id for t in loom.entity_turns(entity.id)]
    # drawn from the whole cast: the turns before the pause and the answer's
    assert first.extras[CONSOLIDATES_TAG] == {"entity_id": entity.id, "turn_ids": thread}
    assert "User: Where do I live?" in (first.intent or "")
    assert memory_for(loom.store).get(ALICE, "favourite_colour") is not None


async def test_a_consolidation_taken_up_after_its_first_turn_keeps_its_namespace_and_source(
    loom: Loom,
) -> None:
    """A worker that dies mid-consolidation: the next one resumes the cast from its
    recorded turns; the memory gates still work in the source's namespace and name the
    cast it was drawn from (what the first turn recorded), not "no memory"."""
    from cantrip import CastSuspended
    from cantrip._core import CURRENT_ENTITY

    @gate
    async def stop_here() -> str:
        """Stand for a worker that dies after this turn."""
        CURRENT_ENTITY.get().suspend()
        return "ok"

    memory = MemorySettings(namespace=("user", "{user}", "{entity}"))
    source = {"entity_id": "entity-source", "turn_ids": ["turn-a", "turn-b"]}
    tags = {"user": "alice", CONSOLIDATES_TAG: source}

    def spell_with(script: list[dict[str, Any]]) -> Cantrip:
        return consolidator(script, extra=(stop_here,)).with_(loom=loom, memory=memory)

    first = spell_with([call("stop_here")])
    entity = first.summon()
    with pytest.raises(CastSuspended):
        await entity.send("the transcript", tags=tags)
    await entity.aclose()
    recorded = list(loom.entity_turns(entity.id))
    assert len(recorded) == 1

    again = spell_with(
        [call("remember", key="city", value="Alice lives in Lyon"), call("done", answer="ok")]
    )
    taken_up = again.resume(entity.id)
    async with taken_up:
        result = await taken_up.resume_cast("the transcript", recorded)
    [written] = [r for t in result.turns for r in t.gate_calls if r.gate == "remember"]
    assert not written.is_error, written.result
    item = memory_for(loom.store).get(("user", "alice", "entity-source"), "city")
    assert item is not None
    assert item.metadata["source"]["drawn_from"] == source


async def test_the_consolidators_token_budget_bounds_it(loom: Loom) -> None:
    from cantrip import Ward

    spent = {"usage": {"prompt_tokens": 60, "completion_tokens": 20}}
    script = [{**call("recall", query=f"fact {n}"), **spent} for n in range(5)]
    bounded = consolidator(script, max_turns(10), Ward("max_tokens_total", 100))
    spell = user_spell(loom, [call("done", answer="ok")], Consolidate(bounded))
    async with spell.summon() as entity:
        result = await entity.send("hello", tags={"user": "alice"})
    assert result.result == "ok"
    [run] = consolidations(loom)
    turns = loom.entity_turns(run)
    assert turns[-1].truncated and turns[-1].reason == "max_tokens_total"
    assert isinstance(bounded.llm, ScriptedLLM)
    assert len(bounded.llm.invocations) == 2  # the third call would pass its 100 tokens


async def test_a_host_whose_nursery_has_closed_loses_the_consolidation_not_the_result(
    loom: Loom, caplog: pytest.LogCaptureFixture
) -> None:
    from cantrip._core._followups import Followups

    spell = user_spell(
        loom, [call("done", answer="Noted!")], Consolidate(consolidator(list(EXTRACT)))
    )
    async with trio.open_nursery() as gone:
        lent = Followups.lent(gone)
    entity = spell.summon()
    entity.followups = lent  # a host's, lent before it closed
    result = await entity.send("I live in Lyon.", tags={"user": "alice"})
    assert result.result == "Noted!"
    assert consolidations(loom) == []
    assert any("could not be started" in r.getMessage() for r in caplog.records)
    await entity.aclose()


DIES_BEFORE_QUEUEING = """
import os, signal, sys
from cantrip.distributed import _followups

async def die(self, followup):  # the process dies between the cast's end and the queue
    os.kill(os.getpid(), signal.SIGKILL)

_followups.QueuedFollowups.start = die
from cantrip.cli._main import main
sys.exit(main(["worker", "--db", sys.argv[1], "--worker-id", "w-dies"]))
"""


async def test_a_worker_that_dies_before_queueing_leaves_it_to_the_next(
    pg_url: str, tmp_path: Path
) -> None:
    """A worker killed after the source cast's last turn but before it queued the
    consolidation: the worker that takes the work over finds the cast ended and queues
    the consolidation -- once, under the id the cast's last turn names."""
    import subprocess
    import sys

    from cantrip.distributed._dispatcher import Dispatcher
    from cantrip.distributed._followups import consolidation_entity_id
    from cantrip.distributed._worker import Worker

    spell = _queued_spec()
    dispatcher = await trio.to_thread.run_sync(Dispatcher, pg_url)
    loom = Loom.open(pg_url)
    try:
        work, source = await trio.to_thread.run_sync(
            lambda: dispatcher.submit({**spell, "user": "alice"}, "I live in Lyon.")
        )
        dying = subprocess.Popen(
            [sys.executable, "-c", DIES_BEFORE_QUEUEING, pg_url],
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent)},
            stdout=subprocess.DEVNULL,
            stderr=(tmp_path / "dies.log").open("wb"),
        )
        assert await trio.to_thread.run_sync(lambda: dying.wait(60)) == -signal.SIGKILL
        assert await trio.to_thread.run_sync(_consolidation_work, pg_url) == []
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                # the same identity: its leases are taken back at once
                await nursery.start(Worker(pg_url, poll_s=0.1, worker_id="w-dies").run)
                state, outcome = await trio.to_thread.run_sync(
                    lambda: dispatcher.wait(work, timeout=30)
                )
                assert (state, outcome["result"]) == ("done", "Noted!")
                queued = await trio.to_thread.run_sync(_consolidation_work, pg_url)
                [(consolidation_work, run, marked)] = queued
                state, outcome = await trio.to_thread.run_sync(
                    lambda: dispatcher.wait(consolidation_work, timeout=30)
                )
                assert (state, outcome["result"]) == ("done", "1 fact")
                nursery.cancel_scope.cancel()
        source_turns = [t.id for t in loom.entity_turns(source)]
        assert marked == {"entity_id": source, "turn_ids": source_turns}
        assert run == consolidation_entity_id(source_turns[-1])
        item = memory_for(loom.store).get(("user", "alice", "facts"), "city")
        assert item is not None and item.value == "Alice lives in Lyon"
    finally:
        loom.close()
        await trio.to_thread.run_sync(dispatcher.close)
