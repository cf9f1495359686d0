"""What `cantrip serve` does per prompt stays O(what is new) (issue 24's load bar).

Timing belongs in bench/serve_load.py; these tests pin the behaviour an
optimisation must keep, and that the history is not re-read per prompt.
"""

from __future__ import annotations

import gc
import signal
from pathlib import Path
from typing import Any

import pytest

import cantrip
from cantrip.protocols.sessions._hub import SessionHub
from gates import done

pytestmark = pytest.mark.loop_watch  # nothing here may block the trio loop (issue 28)


def spell(path: Path, script: list[Any]) -> cantrip.Cantrip:
    return cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(script),
        identity=cantrip.Identity(system_prompt="cost"),
        circle=cantrip.Circle([done], [cantrip.max_turns(3)]),
        loom=cantrip.Loom.open(path),
    )


def answer(text: str) -> Any:
    return {"tool_calls": [{"gate": "done", "args": {"answer": text}}]}


async def test_an_unkeyed_prompt_does_not_read_the_entitys_recorded_turns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading an entity's turns from a loom store is O(its history): a prompt
    without an Idempotency-Key never does; a keyed one still finds its cast."""
    hub = SessionHub(spell(tmp_path / "cost.db", [answer(f"a{i}") for i in range(6)]))
    session, _ = hub.create()
    loom = hub.spell.loom
    reads: list[str] = []
    real = type(loom).entity_turns

    def counted(self: Any, entity_id: str) -> Any:
        reads.append(entity_id)
        return real(self, entity_id)

    monkeypatch.setattr(type(loom), "entity_turns", counted)
    for i in range(3):
        outcome = await hub.prompt(session, f"task {i}")
        assert outcome is not None and outcome.result == f"a{i}"
    assert reads == []
    keyed = await hub.prompt(session, "keyed", key="k-1")
    assert keyed is not None and keyed.result == "a3" and reads  # the key index reads them
    await hub.prompt(session, "plain again")
    again = await hub.prompt(session, "keyed", key="k-1")  # a retry: no new cast
    assert again is not None and again.result == "a3"
    assert [t.intent for t in loom.entity_turns(session.entity.id) if t.intent] == [
        "task 0",
        "task 1",
        "task 2",
        "keyed",
        "plain again",
    ]
    await hub.aclose()
    loom.close()


def test_serve_collects_garbage_in_larger_batches_and_restores_the_setting() -> None:
    from cantrip.cli._process import command_gc

    before = gc.get_threshold()
    setting = command_gc(None)  # the default of `cantrip serve` and `cantrip worker`
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0  # not before entered
    with setting:
        assert gc.get_threshold() == (50_000, *before[1:])
        # what the server holds from its start is out of the collector's sight
        assert gc.get_freeze_count() > 1000
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    with command_gc(1234):
        assert gc.get_threshold()[0] == 1234 and gc.get_freeze_count() > 1000
    with command_gc(0):  # --gc-young 0: Python's own thresholds, nothing frozen
        assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


DB_SPEC = """
[llm]
provider = "openai"
model = "gpt-5-mini"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "CANTRIP_GC_TEST_KEY"

[identity]
system_prompt = "cost"

[circle]
medium = "conversation"
gates = ["done"]
wards = [{ max_turns = 3 }]
"""


@pytest.mark.parametrize(("flag", "young"), [([], 50_000), (["--gc-young", "777"], 777)])
def test_worker_runs_under_the_collector_setting_of_serve_and_restores_it(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, flag: list[str], young: int
) -> None:
    """``cantrip worker`` runs many entities in a process of its own, as serve does:
    larger collections, its start-up heap frozen (the one helper, ``command_gc``)."""
    from cantrip.cli import _main as _cli
    from cantrip.distributed._worker import Worker

    before = gc.get_threshold()
    seen: list[tuple[tuple[int, ...], int]] = []
    real_run = Worker.run

    async def observed(self: Worker, **kwargs: Any) -> None:
        seen.append((gc.get_threshold(), gc.get_freeze_count()))
        signal.raise_signal(signal.SIGINT)  # as Ctrl-C: the worker stops once it is ready
        await real_run(self, **kwargs)

    monkeypatch.setattr(Worker, "run", observed)
    assert _cli.main(["worker", "--db", pg_url, *flag]) == 0
    assert seen and seen[0][0] == (young, *before[1:]) and seen[0][1] > 1000
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_worker_with_gc_young_0_keeps_pythons_collector(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from cantrip.cli import _main as _cli
    from cantrip.distributed._worker import Worker

    before = gc.get_threshold()
    seen: list[tuple[tuple[int, ...], int]] = []
    real_run = Worker.run

    async def observed(self: Worker, **kwargs: Any) -> None:
        seen.append((gc.get_threshold(), gc.get_freeze_count()))
        signal.raise_signal(signal.SIGINT)
        await real_run(self, **kwargs)

    monkeypatch.setattr(Worker, "run", observed)
    assert _cli.main(["worker", "--db", pg_url, "--gc-young", "0"]) == 0
    assert seen == [(before, 0)]
    code = _cli.main(["worker", "--db", pg_url, "--gc-young", "-1"])
    assert code == 1 and len(seen) == 1 and gc.get_threshold() == before
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "cantrip: --gc-young -1: give 0 (Python's own) or a positive threshold"
    )


def test_serve_db_runs_under_the_same_collector_setting_once_its_spec_is_loaded(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``serve --db`` is a server process too: the same setting as in-process serve."""
    from cantrip.cli import _main as _cli
    from cantrip.cli import _serve

    before = gc.get_threshold()
    spec = tmp_path / "spec.toml"
    spec.write_text(DB_SPEC)
    monkeypatch.setenv("CANTRIP_GC_TEST_KEY", "not-called")
    seen: list[tuple[tuple[int, ...], int]] = []

    def serving(*args: Any, **kwargs: Any) -> None:
        seen.append((gc.get_threshold(), gc.get_freeze_count()))

    monkeypatch.setattr(_serve, "serve_until_signal", serving)
    assert _cli.main(["serve", str(spec), "--db", pg_url, "--port", "0"]) == 0
    assert seen and seen[0][0] == (50_000, *before[1:]) and seen[0][1] > 1000
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_a_negative_gc_threshold_is_one_line_and_serves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cantrip.cli import _main as _cli

    before = gc.get_threshold()
    code = _cli.main(["serve", str(tmp_path / "none.toml"), "--gc-young", "-1"])
    err = capsys.readouterr().err
    assert code == 1 and gc.get_threshold() == before
    assert err.strip().splitlines() == [
        "cantrip: --gc-young -1: give 0 (Python's own) or a positive threshold"
    ]


async def test_after_the_key_index_a_keyed_prompt_reads_only_its_own_cast(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key index is built from the session's turns once; after that, neither a new
    keyed prompt nor a keyed retry reads the session's whole history (O(its cast))."""
    hub = SessionHub(spell(tmp_path / "keys.db", [answer(f"a{i}") for i in range(8)]))
    session, _ = hub.create()
    loom = hub.spell.loom
    for i in range(3):
        await hub.prompt(session, f"task {i}")
    first = await hub.prompt(session, "keyed", key="k-1")  # builds the index (one read)
    assert first is not None and first.result == "a3"
    whole: list[str] = []
    ranges: list[tuple[str, str]] = []
    real_all, real_from = type(loom).entity_turns, type(loom).entity_turns_from

    def counted_all(self: Any, entity_id: str) -> Any:
        whole.append(entity_id)
        return real_all(self, entity_id)

    def counted_from(self: Any, entity_id: str, turn_id: str) -> Any:
        ranges.append((entity_id, turn_id))
        return real_from(self, entity_id, turn_id)

    monkeypatch.setattr(type(loom), "entity_turns", counted_all)
    monkeypatch.setattr(type(loom), "entity_turns_from", counted_from)
    second = await hub.prompt(session, "keyed two", key="k-2")
    assert second is not None and second.result == "a4"
    await hub.prompt(session, "plain")
    again = await hub.prompt(session, "keyed", key="k-1")  # a retry of an older cast
    again_two = await hub.prompt(session, "keyed two", key="k-2")
    assert whole == []
    assert again is not None and again.result == "a3" and again.turns == first.turns
    assert again_two is not None and again_two.result == "a4"
    assert [turn.intent for turn in again_two.turns] == ["keyed two"]
    assert len(ranges) == 2  # one range read per retry
    with pytest.raises(cantrip.protocols.sessions._hub.SessionError, match="different prompt"):
        await hub.prompt(session, "another prompt", key="k-2")
    await hub.aclose()
    loom.close()


@pytest.mark.parametrize("store", ["memory", "sqlite", "jsonl", "postgres"])
def test_entity_turns_from_a_turn_on(
    tmp_path: Path, store: str, request: pytest.FixtureRequest
) -> None:
    """``Loom.entity_turns_from``: the entity's turns from one of its turns on, in order
    (a range query on SQLite and PostgreSQL -- the latter a real server, started by
    the fixture -- a slice in memory)."""
    import trio

    if store == "memory":
        loom = cantrip.Loom()
    elif store == "postgres":
        loom = cantrip.Loom.open(request.getfixturevalue("pg_url"))
    else:
        loom = cantrip.Loom.open(tmp_path / ("l.db" if store == "sqlite" else "l.jsonl"))
    c = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM([answer(f"a{i}") for i in range(3)]),
        identity=cantrip.Identity(system_prompt="range"),
        circle=cantrip.Circle([done], [cantrip.max_turns(3)]),
        loom=loom,
    )
    entity = c.summon()

    async def run() -> None:
        for i in range(3):
            await entity.send(f"task {i}")
        await loom.sync(entity.id)

    trio.run(run)
    turns = list(loom.entity_turns(entity.id))
    assert [t.intent for t in turns] == ["task 0", "task 1", "task 2"]
    for position, turn in enumerate(turns):
        assert list(loom.entity_turns_from(entity.id, turn.id)) == turns[position:]
    assert list(loom.entity_turns_from(entity.id, "no-such-turn")) == []
    assert list(loom.entity_turns_from("no-such-entity", turns[0].id)) == []
    loom.close()
