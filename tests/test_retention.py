"""Retention: ``cantrip loom FILE prune`` and ``stats`` keep a loom bounded and valid."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import trio

import cantrip
from cantrip import Cantrip, Circle, Identity, Loom, ScriptedLLM, max_turns
from cantrip.loom._model import EntityRecord
from cantrip.loom._retention import Activity, plan, prune, stats
from gates import call_agent, done, echo

CLI = [sys.executable, "-m", "cantrip"]


def greeter(loom: Loom, answer: str = "ok") -> Cantrip:
    return Cantrip(
        llm=ScriptedLLM(
            [
                {"tool_calls": [{"gate": "echo", "args": {"text": "hi"}}]},
                {"tool_calls": [{"gate": "done", "args": {"answer": answer}}]},
            ]
        ),
        identity=Identity(system_prompt="Greeter."),
        circle=Circle([done, echo], [max_turns(5)]),
        loom=loom,
    )


def delegator(loom: Loom) -> Cantrip:
    """A parent whose one turn spawns a child (the child answers through the same script)."""
    return Cantrip(
        llm=ScriptedLLM(
            [
                {"tool_calls": [{"gate": "call_agent", "args": {"intent": "sub task"}}]},
                {"tool_calls": [{"gate": "done", "args": {"answer": "child done"}}]},
                {"tool_calls": [{"gate": "done", "args": {"answer": "parent done"}}]},
            ]
        ),
        identity=Identity(system_prompt="Boss."),
        circle=Circle([done, call_agent], [max_turns(5)]),
        loom=loom,
    )


def loom_cli(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "loom", str(path), *args], capture_output=True, text=True, timeout=120
    )


async def build(path: Path) -> dict[str, str]:
    """Three trees: an old greeter, a delegating parent with its child, a newest greeter,
    and a fork of the first one."""
    loom = Loom.open(path)
    ids: dict[str, str] = {}
    ids["old"] = (await greeter(loom).cast_async("first")).entity_id
    ids["parent"] = (await delegator(loom).cast_async("delegate")).entity_id
    ids["new"] = (await greeter(loom).cast_async("newest")).entity_id
    loom.close()
    return ids


def entity_ids(path: Path) -> set[str]:
    loom = Loom.open(path)
    try:
        return set(loom.entities)
    finally:
        loom.close()


async def test_keep_last_removes_whole_older_trees_and_the_loom_stays_valid(
    tmp_path: Path,
) -> None:
    path = tmp_path / "loom.db"
    ids = await build(path)
    before = entity_ids(path)
    assert len(before) == 4  # three roots and the child
    out = loom_cli(
        path,
        "prune",
        "--keep-last",
        "1",
        "--idle-s",
        "0",
        "--archive",
        str(tmp_path / "archive.jsonl"),
        "--json",
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert (report["roots"], report["entities"]) == (2, 3)
    assert entity_ids(path) == {ids["new"]}
    check = loom_cli(path, "check", "--json")
    assert check.returncode == 0, check.stdout + check.stderr
    loom = Loom.open(path)
    thread = loom.thread(loom.last_turn(ids["new"]).id)  # type: ignore[union-attr]
    assert [t.sequence for t in thread] == [1, 2]
    loom.close()
    # the archive is a loom: everything removed, readable by the loom command
    archive = Loom.open(tmp_path / "archive.jsonl")
    assert set(archive.entities) == before - {ids["new"]}
    assert len(archive.entity_turns(ids["parent"])) >= 2
    archive.close()
    listed = loom_cli(tmp_path / "archive.jsonl", "list")
    assert listed.returncode == 0 and "entities (3)" in listed.stdout


async def test_prune_reclaims_space(tmp_path: Path) -> None:
    path = tmp_path / "loom.db"
    loom = Loom.open(path)
    big = "x" * 200_000
    for _ in range(20):
        await greeter(loom, answer=big).cast_async("big")
    keep = (await greeter(loom).cast_async("small")).entity_id
    loom.close()
    size = path.stat().st_size
    done_ = prune(Loom.open(path), keep_last=1, busy_s=0)
    assert done_.bytes_after < done_.bytes_before / 5
    assert path.stat().st_size < size / 5
    assert entity_ids(path) == {keep}


async def test_a_tree_a_fork_stands_on_stays(tmp_path: Path) -> None:
    path = tmp_path / "loom.db"
    loom = Loom.open(path)
    source = await greeter(loom).cast_async("source")
    first_turn = loom.entity_turns(source.entity_id)[0]
    forked = await greeter(loom).fork_async(first_turn.id, "forked")
    loom.close()
    out = loom_cli(path, "prune", "--entity", source.entity_id, "--idle-s", "0")
    assert out.returncode == 0, out.stderr
    assert "removed 0 root entities" in out.stdout
    assert f"kept {source.entity_id}: entity {forked.entity_id} was forked from it" in out.stdout
    assert source.entity_id in entity_ids(path)
    # removing the fork first, then its source, works
    assert loom_cli(path, "prune", "--entity", forked.entity_id, "--idle-s", "0").returncode == 0
    assert loom_cli(path, "prune", "--entity", source.entity_id, "--idle-s", "0").returncode == 0
    assert entity_ids(path) == set()


async def test_a_child_cannot_be_pruned_alone_and_recent_trees_stay(tmp_path: Path) -> None:
    path = tmp_path / "loom.db"
    ids = await build(path)
    loom = Loom.open(path)
    child = next(e for e, r in loom.entities.items() if r.parent_entity_id == ids["parent"])
    loom.close()
    out = loom_cli(path, "prune", "--entity", child, "--idle-s", "0")
    assert out.returncode == 1
    assert f"entity {child} was spawned by {ids['parent']}: prune its root" in out.stderr
    fresh = loom_cli(path, "prune", "--keep-last", "0")  # the default idle window: 60 s
    assert "removed 0 root entities" in fresh.stdout
    # a finished cast written a minute ago is not "running": the line says what keeps it
    assert "running" not in fresh.stdout
    assert f"kept {ids['old']}: written in the last 60 s; --idle-s" in fresh.stdout
    assert len(entity_ids(path)) == 4


async def test_before_a_date_and_bad_dates(tmp_path: Path) -> None:
    path = tmp_path / "loom.db"
    await build(path)
    none = loom_cli(path, "prune", "--before", "2000-01-01", "--idle-s", "0")
    assert "removed 0 root entities" in none.stdout
    every = loom_cli(path, "prune", "--before", "2999-01-01", "--idle-s", "0")
    assert "removed 3 root entities (4 with children)" in every.stdout
    bad = loom_cli(path, "prune", "--before", "last tuesday")
    assert bad.returncode == 1 and "give a date (2026-01-31)" in bad.stderr
    neither = loom_cli(path, "prune")
    assert neither.returncode == 2 and "one of the arguments" in neither.stderr


async def test_stats_and_history_stays_append_only(tmp_path: Path) -> None:
    path = tmp_path / "loom.db"
    await build(path)
    out = loom_cli(path, "stats", "--json")
    figures = json.loads(out.stdout)
    assert (figures["entities"], figures["roots"]) == (4, 3)
    assert figures["turns"] >= 6 and figures["tables"]["turns"] > 0
    assert figures["oldest"] <= figures["newest"]
    # the loom's own parts, each with its indexes; never SQLite's internals
    assert set(figures["tables"]) == {"entities", "turns", "blobs", "blob_refs", "journal"}
    assert figures["bytes"] == sum(figures["tables"].values())
    assert "sqlite_" not in loom_cli(path, "stats").stdout
    db = sqlite3.connect(path)
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        db.execute("DELETE FROM turns")
    db.close()


def test_a_jsonl_loom_is_refused_with_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "loom.jsonl"
    Loom.open(path).close()
    out = loom_cli(path, "stats")
    assert out.returncode == 1 and "work on SQLite and PostgreSQL looms" in out.stderr


def test_the_plan_keeps_running_trees() -> None:
    def act(entity_id: str, last: str, parent: str | None = None) -> Activity:
        return Activity(EntityRecord(entity_id, "c", parent_entity_id=parent), last, 2)

    activity = [act("a", "2026-01-01"), act("a1", "2026-01-02", "a"), act("b", "2026-02-01")]
    chosen = plan(activity, keep_last=0, busy={"a1": "running (queued work)"})
    assert chosen.roots == ("b",) and chosen.kept == (("a", "a1 running (queued work)"),)
    with pytest.raises(cantrip.CantripError, match="exactly one of"):
        plan(activity)


async def test_pruning_while_casts_run_on_other_entities_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "loom.db"
    writer = Loom.open(path)
    for _ in range(30):
        await greeter(writer).cast_async("old")
    await trio.sleep(3.0)  # the old trees are idle longer than the window below
    results: list[cantrip.CastResult] = []

    async def keep_casting() -> None:
        for i in range(40):
            results.append(await greeter(writer).cast_async(f"live {i}"))
            await trio.sleep(0)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(keep_casting)
        pruned = await trio.to_thread.run_sync(
            lambda: prune(Loom.open(path), keep_last=0, busy_s=2.0)
        )
    writer.close()
    assert pruned.plan.roots  # it removed something while the casts went on
    loom = Loom.open(path)
    for result in results:
        assert result.terminated
        if loom.has_entity(result.entity_id):
            turns = loom.entity_turns(result.entity_id)
            assert [t.sequence for t in turns] == [1, 2]
    loom.close()
    assert loom_cli(path, "check").returncode == 0


# -- PostgreSQL ---------------------------------------------------------------------


async def test_postgres_prune_removes_trees_keeps_open_work_and_stays_append_only(
    pg_url: str,
) -> None:
    import psycopg

    loom = Loom.open(pg_url)
    old = await greeter(loom).cast_async("old")
    parent = await delegator(loom).cast_async("delegate")
    queued = await greeter(loom).cast_async("has queued work")
    loom.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO cantrip_work (entity_id, intent, spell) VALUES (%s, 'again', '{}')",
            (queued.entity_id,),
        )
        rows = conn.execute("SELECT count(*) FROM cantrip_journal").fetchone()
        assert rows is not None and rows[0] > 0  # the casts journaled their gate calls
    loom = Loom.open(pg_url)
    figures = stats(loom)
    assert figures["entities"] == 4 and figures["tables"]["cantrip_turns"] > 0
    done_ = await trio.to_thread.run_sync(lambda: prune(loom, keep_last=0, busy_s=0, archive=None))
    assert set(done_.plan.roots) == {old.entity_id, parent.entity_id}
    assert dict(done_.plan.kept)[queued.entity_id].startswith("running")
    assert done_.journal_rows > 0  # the kept entity's ended cast: its journal collected
    assert set(loom.entities) == {queued.entity_id}
    assert [t.sequence for t in loom.entity_turns(queued.entity_id)] == [1, 2]
    loom.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        left = conn.execute("SELECT count(*) FROM cantrip_journal").fetchone()
        assert left is not None and left[0] == 0
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
            conn.execute("DELETE FROM cantrip_turns")


async def test_journal_rows_of_ended_casts_are_collected(tmp_path: Path) -> None:
    path = tmp_path / "loom.db"
    loom = Loom.open(path, journal=True)
    await greeter(loom).cast_async("journaled")
    loom.close()
    db = sqlite3.connect(path)
    (before,) = db.execute("SELECT count(*) FROM journal").fetchone()
    db.close()
    assert before > 0
    out = loom_cli(path, "prune", "--keep-last", "5", "--json")
    assert json.loads(out.stdout)["journal_rows_collected"] == before
    db = sqlite3.connect(path)
    assert db.execute("SELECT count(*) FROM journal").fetchone() == (0,)
    db.close()


def old_entity(loom: Loom, entity_id: str, when: str) -> None:
    """An entity whose only cast ended long ago (turns written as they were then)."""
    from cantrip.loom import Turn, TurnMetadata

    loom.register_entity(EntityRecord(entity_id, "old", {"system_prompt": "x"}, created_at=when))
    loom.append(
        Turn(
            id=f"{entity_id}-1",
            parent_id=None,
            entity_id=entity_id,
            sequence=1,
            intent="long ago",
            content="done",
            metadata=TurnMetadata(timestamp=when),
            terminated=True,
            reason="done",
            result="ok",
        )
    )


async def test_serve_retain_days_prunes_idle_trees_and_keeps_serving(tmp_path: Path) -> None:
    import re

    import httpx

    loom_path = tmp_path / "served.db"
    loom = Loom.open(loom_path)
    old_entity(loom, "entity-ancient", "2020-01-01T00:00:00+00:00")
    fresh = (await greeter(loom).cast_async("recent")).entity_id
    loom.close()
    spec = tmp_path / "spec.toml"
    spec.write_text(
        '[llm]\nprovider = "scripted"\nresponses = [{ content = "hi" }]\n'
        '[circle]\nmedium = "conversation"\ngates = ["done"]\nwards = [{ max_turns = 2 }]\n'
        f'[loom]\npath = "{loom_path.name}"\n',
        encoding="utf-8",
    )
    server = await trio.lowlevel.open_process(
        [*CLI, "serve", str(spec), "--port", "0", "--retain-days", "30"],
        stderr=subprocess.PIPE,
    )
    try:
        assert server.stderr is not None
        seen = b""
        with trio.fail_after(60):
            while b"serving" not in seen or b"\n" not in seen.split(b"serving", 1)[1]:
                seen += await server.stderr.receive_some(4096)
        url = re.search(rb"on (http://\S+)", seen).group(1).decode()  # type: ignore[union-attr]
        with trio.fail_after(60):
            while "entity-ancient" in entity_ids(loom_path):
                await trio.sleep(0.2)
        assert fresh in entity_ids(loom_path)
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"{url}/health")).status_code == 200
    finally:
        server.terminate()
        with trio.fail_after(60):
            await server.wait()


def test_retain_days_needs_a_loom_on_disk(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(
        '[llm]\nprovider = "scripted"\nresponses = [{ content = "hi" }]\n'
        '[circle]\nmedium = "conversation"\ngates = ["done"]\nwards = [{ max_turns = 2 }]\n',
        encoding="utf-8",
    )
    out = subprocess.run(
        [*CLI, "serve", str(spec), "--retain-days", "7"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and "--retain-days needs a loom file" in out.stderr
