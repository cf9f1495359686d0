"""Prune under faults (issue 39, items 1-3): an archive cut short, an archive that is
the loom itself, a session prompted while the prune runs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from test_retention import build, greeter, loom_cli

import cantrip
from cantrip import Loom
from cantrip.loom._retention import prune, retention_of
from cantrip.loom._stores import JSONLStore


def turn_ids(path: Path) -> dict[str, set[str]]:
    """Every turn id of the loom at ``path``, by entity (nothing when there is no file)."""
    if not path.exists():
        return {}
    loom = Loom.open(path)
    try:
        return {e: {t.id for t in loom.entity_turns(e)} for e in loom.entities}
    finally:
        loom.close()


def every_turn(by_entity: dict[str, set[str]]) -> set[str]:
    return {t for ids in by_entity.values() for t in ids}


class DiskFull(OSError):
    pass


@pytest.fixture
def fail_after(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Set ``[n]``: the archive's store refuses the turn after ``n`` it wrote (a full
    disk, a kill); ``[]``: no fault."""
    budget: list[int] = []
    real = JSONLStore.append_turn

    def append_turn(self: JSONLStore, turn: cantrip.loom.Turn) -> None:
        if budget:
            if budget[0] == 0:
                raise DiskFull(28, "No space left on device")
            budget[0] -= 1
        real(self, turn)

    monkeypatch.setattr(JSONLStore, "append_turn", append_turn)
    yield budget


async def test_an_archive_cut_short_then_rerun_loses_no_turn(
    tmp_path: Path, fail_after: list[int]
) -> None:
    """Item 1: the archiving fails after N turns (every N from 0 to all of them); the
    re-run archives the missing turns and only then deletes. Every turn the loom had is
    afterwards in the loom or in the archive, and the archive is a whole loom."""
    source = tmp_path / "source.db"
    await build(source)
    everything = every_turn(turn_ids(source))
    removable = len(everything) - 2  # the newest tree (2 turns) is kept by --keep-last 1
    lost_at: dict[int, int] = {}
    for n in range(removable):
        loom_path, archive = tmp_path / f"loom{n}.db", tmp_path / f"archive{n}.jsonl"
        loom_path.write_bytes(source.read_bytes())
        fail_after[:] = [n]
        loom = Loom.open(loom_path)
        try:
            with pytest.raises(DiskFull):
                prune(loom, keep_last=1, archive=str(archive), busy_s=0)
        finally:
            loom.close()
        assert every_turn(turn_ids(loom_path)) == everything  # nothing deleted yet
        fail_after[:] = []
        loom = Loom.open(loom_path)
        try:
            prune(loom, keep_last=1, archive=str(archive), busy_s=0)
        finally:
            loom.close()
        kept, archived = every_turn(turn_ids(loom_path)), every_turn(turn_ids(archive))
        lost_at[n] = len(everything - kept - archived)
        assert len(kept) == 2
    assert lost_at == dict.fromkeys(range(removable), 0)


async def test_a_killed_archiving_process_then_rerun_loses_no_turn(tmp_path: Path) -> None:
    """Item 1 with a real kill: ``prune`` in a subprocess, SIGKILLed when its archive
    holds N turns; the re-run (the CLI) leaves every turn in the loom or the archive."""
    import signal
    import subprocess
    import sys

    source = tmp_path / "source.db"
    await build(source)
    everything = every_turn(turn_ids(source))
    stopper = tmp_path / "stop.py"
    stopper.write_text(
        "import os, signal, sys\n"
        "from cantrip.loom._stores import JSONLStore\n"
        "from cantrip.cli import main\n"
        "real, left = JSONLStore.append_turn, [int(os.environ['KILL_AT'])]\n"
        "def append_turn(self, turn):\n"
        "    if left[0] == 0:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    left[0] -= 1\n"
        "    real(self, turn)\n"
        "JSONLStore.append_turn = append_turn\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    for kill_at in (0, 1, 3, 5):
        loom_path, archive = tmp_path / f"loom{kill_at}.db", tmp_path / f"archive{kill_at}.jsonl"
        loom_path.write_bytes(source.read_bytes())
        args = ["loom", str(loom_path), "prune", "--keep-last", "1", "--idle-s", "0"]
        killed = subprocess.run(
            [sys.executable, str(stopper), *args, "--archive", str(archive)],
            env={**os.environ, "KILL_AT": str(kill_at)},
            capture_output=True,
            timeout=120,
        )
        assert killed.returncode == -signal.SIGKILL
        rerun = loom_cli(loom_path, *args[2:], "--archive", str(archive))
        assert rerun.returncode == 0, rerun.stderr
        kept, archived = every_turn(turn_ids(loom_path)), every_turn(turn_ids(archive))
        assert everything - kept - archived == set(), kill_at
        assert loom_cli(loom_path, "check").returncode == 0


@pytest.mark.parametrize("how", ["same path", "another path", "symlink", "symlink.jsonl"])
async def test_an_archive_that_is_the_loom_itself_is_refused(tmp_path: Path, how: str) -> None:
    """Item 2: nothing is deleted, nothing archived, and the error says why."""
    path = tmp_path / "loom.db"
    await build(path)
    before = turn_ids(path)
    if how == "same path":
        archive = str(path)
    elif how == "another path":
        (tmp_path / "sub").mkdir()
        archive = str(tmp_path / "sub" / ".." / "loom.db")
    else:
        link = tmp_path / ("link.jsonl" if how == "symlink.jsonl" else "link.db")
        link.symlink_to(path)
        archive = str(link)
    out = loom_cli(path, "prune", "--keep-last", "0", "--idle-s", "0", "--archive", archive)
    assert out.returncode == 1
    assert "is this loom" in out.stderr and "archived" not in out.stdout
    assert turn_ids(path) == before


async def test_an_archive_name_opened_as_sqlite_must_be_another_existing_loom(
    tmp_path: Path,
) -> None:
    """Item 2: ``--archive old.db`` that does not exist (a typo for .jsonl) is refused;
    an existing loom other than this one is appended to."""
    path = tmp_path / "loom.db"
    ids = await build(path)
    before = turn_ids(path)
    out = loom_cli(path, "prune", "--keep-last", "0", "--idle-s", "0", "--archive", "old.db")
    assert out.returncode == 1 and ".jsonl" in out.stderr, out.stderr
    assert turn_ids(path) == before and not (tmp_path / "old.db").exists()
    other = tmp_path / "other.db"
    Loom.open(other).close()
    out = loom_cli(path, "prune", "--entity", ids["old"], "--idle-s", "0", "--archive", str(other))
    assert out.returncode == 0, out.stderr
    assert turn_ids(other) == {ids["old"]: before[ids["old"]]}


def session(loom: Loom) -> cantrip.Cantrip:
    """A greeter that can be prompted twice (each cast: echo, then done)."""
    from cantrip import Cantrip, Circle, Identity, ScriptedLLM, max_turns
    from gates import done, echo

    cast = [
        {"tool_calls": [{"gate": "echo", "args": {"text": "hi"}}]},
        {"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]},
    ]
    return Cantrip(
        llm=ScriptedLLM(cast * 2),
        identity=Identity(system_prompt="Session."),
        circle=Circle([done, echo], [max_turns(5)]),
        loom=loom,
    )


@pytest.mark.parametrize(
    ("archived", "idle_s", "why"),
    [
        (False, 0.5, "written in the last 0.5 s"),
        (True, 0.0, "written to since it was archived"),  # no idle window: the archive's guard
    ],
)
async def test_a_session_prompted_during_the_prune_keeps_every_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, archived: bool, idle_s: float, why: str
) -> None:
    """Item 3: a session idle when the prune plans is prompted before the prune deletes
    (a real writer on its own connection, ordered by a hook in the deleting call, not
    by timing). The deleting transaction sees it live: its tree stays whole, the rest
    goes, and the loom passes ``check``."""
    path = tmp_path / "loom.db"
    writer = Loom.open(path)
    idle = session(writer).summon()
    idle_id = (await idle.send("first")).entity_id
    other = await greeter(writer).cast_async("old and done")
    await trio.sleep(0.6)  # both are idle for longer than the window below
    prompted: list[cantrip.CastResult] = []
    side = type(retention_of(writer))  # the SQLite store's retention side
    real = side.delete_entities

    def delete_entities(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not prompted:  # the session is prompted after the plan, before the delete
            prompted.append(trio.from_thread.run(idle.send, "again"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(side, "delete_entities", delete_entities)
    archive = str(tmp_path / "archive.jsonl") if archived else None

    def run() -> object:
        loom = Loom.open(path)
        try:
            return prune(loom, keep_last=0, busy_s=idle_s, archive=archive)
        finally:
            loom.close()

    done_ = await trio.to_thread.run_sync(run)
    await idle.aclose()
    writer.close()
    assert prompted and prompted[0].terminated
    assert done_.plan.roots == (other.entity_id,)  # type: ignore[attr-defined]
    kept = dict(done_.plan.kept)  # type: ignore[attr-defined]
    assert kept[idle_id].startswith(why), kept
    turns = turn_ids(path)
    assert set(turns) == {idle_id} and len(turns[idle_id]) == 4
    assert loom_cli(path, "check").returncode == 0


async def test_a_session_prompted_after_its_tree_was_pruned_leaves_the_loom_valid(
    tmp_path: Path,
) -> None:
    """Item 3, the other order: the prune committed first (the session was idle), then the
    session is prompted. Its turns are refused by the file (the entity is gone), with
    an error that says so, instead of written as orphans that make ``check`` fail."""
    path = tmp_path / "loom.db"
    writer = Loom.open(path)
    idle = session(writer).summon()
    first = await idle.send("first")
    pruner = Loom.open(path)
    try:
        assert prune(pruner, keep_last=0, busy_s=0).plan.roots == (first.entity_id,)
    finally:
        pruner.close()
    with pytest.raises(cantrip.LoomError, match=r"no longer in .* pruned"):
        await idle.send("again")
    await idle.aclose()
    writer.close()
    assert turn_ids(path) == {}
    assert loom_cli(path, "check").returncode == 0
