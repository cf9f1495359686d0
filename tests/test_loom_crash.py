"""Stores after a crash (issue 13, item 5): torn lines, corruption, kill -9 mid-append.

A process killed while appending may leave a partial last line in a JSONL
loom. Opening it drops that line with a warning (every complete turn kept),
sets the fragment aside, and later appends start on a fresh line; a bad line
in the middle of the file is corruption, reported with its line number and
how to recover. Every store survives ``kill -9`` during a cast: it reopens
with a valid thread and the entity resumes.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

import gates
from cantrip import Cantrip, Circle, Identity, LoomError, ScriptedLLM, max_turns
from cantrip.loom import Loom


def write_loom(path: Path, turns: int = 3, text: str = "\ud800 é") -> list[str]:
    """A real loom: one cast of ``turns`` turns (the last calls done); the turn ids."""
    script = [
        {"tool_calls": [{"gate": "echo", "args": {"text": f"t{i} {text}"}}]}
        for i in range(turns - 1)
    ]
    script.append({"tool_calls": [{"gate": "done", "args": {"answer": 10**30}}]})
    loom = Loom.open(path)
    circle = Circle([gates.done, gates.echo], [max_turns(turns + 1)])
    spell = Cantrip(llm=ScriptedLLM(script), identity=Identity(), circle=circle, loom=loom)
    trio.run(spell.cast_async, "work")
    ids = [t.id for t in loom.turns]
    loom.close()
    return ids


def assert_thread(loom: Loom, ids: list[str]) -> None:
    assert [t.id for t in loom.turns] == ids
    if ids:
        assert [t.id for t in loom.thread(ids[-1])] == ids


@given(st.data())
@settings(max_examples=25, deadline=None, database=None)
def test_a_torn_final_line_is_dropped_and_every_complete_turn_kept(data: st.DataObject) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "loom.jsonl"
        ids = write_loom(path)
        whole = path.read_bytes()
        last_start = whole.rindex(b"\n", 0, len(whole) - 1) + 1
        span = len(whole) - 1 - (last_start + 1)  # cuts inside the last record
        cut = last_start + 1 + data.draw(st.integers(min_value=0, max_value=10**9)) % span
        path.write_bytes(whole[:cut])  # the last record, cut off mid-write
        records = logging.getLogger("cantrip.loom")
        seen: list[str] = []
        handler = logging.Handler()
        handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
        records.addHandler(handler)
        try:
            loom = Loom.open(path)
        finally:
            records.removeHandler(handler)
        assert_thread(loom, ids[:-1])
        assert len(seen) == 1 and "dropped a torn final line" in seen[0]
        assert f"({cut - last_start} bytes" in seen[0]
        assert (Path(str(path) + ".torn")).read_bytes() == whole[last_start:cut] + b"\n"
        # the entity resumes after the last complete turn, and the file stays readable
        entity_id = loom.turns[0].entity_id
        circle = Circle([gates.done, gates.echo], [max_turns(5)])
        spell = Cantrip(
            llm=ScriptedLLM([{"tool_calls": [{"gate": "done", "args": {"answer": "again"}}]}]),
            identity=Identity(),
            circle=circle,
            loom=loom,
        )

        async def resume() -> object:
            async with spell.resume(entity_id) as entity:
                return (await entity.send("go on")).result

        assert trio.run(resume) == "again"
        loom.close()
        reopened = Loom.open(path)
        assert [t.id for t in reopened.turns][: len(ids) - 1] == ids[:-1]
        assert len(reopened.turns) == len(ids)
        assert reopened.turns[-1].parent_id == ids[-2]
        reopened.close()


def test_a_complete_last_line_without_its_newline_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "loom.jsonl"
    ids = write_loom(path)
    path.write_bytes(path.read_bytes()[:-1])
    loom = Loom.open(path)
    assert_thread(loom, ids)
    loom.close()
    assert path.read_bytes().endswith(b"}\n")
    assert not Path(str(path) + ".torn").exists()


def test_corruption_in_the_middle_names_the_line_and_the_way_out(tmp_path: Path) -> None:
    path = tmp_path / "loom.jsonl"
    write_loom(path)
    lines = path.read_bytes().split(b"\n")
    lines[2] = lines[2][: len(lines[2]) // 2]
    path.write_bytes(b"\n".join(lines))
    before = path.read_bytes()
    with pytest.raises(LoomError) as caught:
        Loom.open(path)
    message = str(caught.value)
    assert f"{path}:3: not JSON" in message
    assert "corrupted in the middle" in message
    assert f"head -n 2 {path} > recovered.jsonl" in message
    assert path.read_bytes() == before  # nothing was changed


CHILD = textwrap.dedent(
    """
    import sys, trio, gates
    from cantrip import Cantrip, Circle, Identity, ScriptedLLM, max_turns
    from cantrip.loom import Loom

    loom = Loom.open(sys.argv[1])
    text = "x" * 20000 + "\\ud800"
    script = [{"tool_calls": [{"gate": "echo", "args": {"text": text}}]}] * 100000
    circle = Circle([gates.done, gates.echo], [max_turns(100001)])
    spell = Cantrip(llm=ScriptedLLM(script), identity=Identity(), circle=circle, loom=loom)

    def on_event(event):
        if len(loom) == 20:
            print(loom.turns[0].entity_id, flush=True)  # the parent kills us now

    async def main():
        entity = spell.summon(on_event=on_event)
        async with entity:
            await entity.send("work forever")

    trio.run(main)
    """
)


@pytest.mark.soak  # a crash loop: ~40 s each under load; CI runs it (pytest -m soak)
@pytest.mark.parametrize("name", ["loom.db", "loom.jsonl"])
def test_kill_9_during_appends_then_reopen_and_resume(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    entity_id = child.stdout.readline().strip()
    os.kill(child.pid, signal.SIGKILL)  # mid-cast: appends are going on
    child.wait()
    assert entity_id.startswith("entity-")
    loom = Loom.open(path)
    turns = list(loom.turns)
    assert len(turns) >= 20
    assert_thread(loom, [t.id for t in turns])
    assert [t.sequence for t in turns] == list(range(1, len(turns) + 1))
    circle = Circle([gates.done, gates.echo], [max_turns(5)])
    spell = Cantrip(
        llm=ScriptedLLM([{"tool_calls": [{"gate": "done", "args": {"answer": "resumed"}}]}]),
        identity=Identity(),
        circle=circle,
        loom=loom,
    )

    async def resume() -> object:
        async with spell.resume(entity_id) as entity:
            return (await entity.send("go on")).result

    assert trio.run(resume) == "resumed"
    loom.close()
    reopened = Loom.open(path)
    assert [t.id for t in reopened.turns][: len(turns)] == [t.id for t in turns]
    assert reopened.turns[-1].parent_id == turns[-1].id
    assert reopened.turns[-1].result == "resumed"
    reopened.close()


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file in ``folder`` and its bytes."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.parametrize("how", ["torn", "no newline"])
def test_read_only_commands_never_change_a_jsonl_loom(tmp_path: Path, how: str) -> None:
    """Issue 39 item 5: ``list``, ``show``, ``stats`` and ``export`` only read. A torn
    last line is skipped with a warning and left where it is (the next write sets it
    aside); a complete one without its newline is read as it is."""
    path = tmp_path / "loom.jsonl"
    ids = write_loom(path, text="é")
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"type": "turn", "id": "tu' if how == "torn" else whole[:-1])
    before = snapshot(tmp_path)
    for command in (["list"], ["show", ids[-1]], ["export"], ["list", "--json"], ["stats"]):
        out = subprocess.run(
            [sys.executable, "-m", "cantrip", "loom", str(path), *command],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if command != ["stats"]:  # stats needs SQLite or PostgreSQL: refused, still read-only
            assert out.returncode == 0, out.stderr
        assert snapshot(tmp_path) == before, command
    assert ids[-1] in out.stdout or command == ["stats"]
    loom = Loom.open(path)  # a loom opened to write still sets the fragment aside
    assert_thread(loom, ids)
    loom.close()
    assert path.read_bytes() == whole


def test_read_only_commands_never_change_an_sqlite_loom(tmp_path: Path) -> None:
    """An SQLite loom written by an older cantrip (without the indexes and journal
    added since) is read as it is: ``list`` does not add them."""
    import sqlite3

    path = tmp_path / "loom.db"
    ids = write_loom(path, text="é")
    db = sqlite3.connect(path)
    db.executescript(
        "DROP INDEX turns_by_entity; DROP INDEX turns_by_parent; DROP TABLE journal; VACUUM;"
    )
    db.close()
    before = snapshot(tmp_path)
    for command in (["list"], ["show", ids[-1]], ["export"], ["stats"]):
        out = subprocess.run(
            [sys.executable, "-m", "cantrip", "loom", str(path), *command],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert snapshot(tmp_path) == before, command
