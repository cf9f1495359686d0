"""``cantrip memory TARGET list|search|show|forget`` (issue 42, item 6), on SQLite and
PostgreSQL: what an entity remembered is listed, found, shown with its revisions and the
turn that wrote it, and forgotten (after a dry run); bad input is one line, exit 1."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cantrip import Cantrip, Circle, Identity, Loom, MemorySettings, ScriptedLLM, max_turns
from cantrip.cli import main
from cantrip.memory import memory_for
from gates import done, remember


def call(gate: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"gate": gate, "args": args}]}


@pytest.fixture(params=["sqlite", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A loom in which Alice's entity remembered a fact twice (two revisions) and code
    put one for Bob."""
    where = (
        str(tmp_path / "loom.db")
        if request.param == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    yield where


async def remembered(where: str) -> None:
    loom = Loom.open(where)
    script = [
        call("remember", key="drink", value="Alice likes green tea"),
        call("done", answer="ok"),
        call("remember", key="drink", value="Alice likes black tea now"),
        call("done", answer="ok"),
    ]
    spell = Cantrip(
        llm=ScriptedLLM(script),
        identity=Identity(system_prompt="You remember things."),
        circle=Circle([done, remember], [max_turns(4)]),
        loom=loom,
        memory=MemorySettings(namespace=("user", "{user}")),
    )
    async with spell.summon() as entity:
        await entity.send("I like green tea.", tags={"user": "alice"})
        await entity.send("I drink black tea now.", tags={"user": "alice"})
    store = memory_for(loom.store)
    store.put(("user", "bob"), "drink", "Bob likes coffee")
    store.close()
    loom.close()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["memory", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def test_list_search_show_and_forget(target: str, capsys: pytest.CaptureFixture[str]) -> None:
    await remembered(target)
    code, out, _ = run(capsys, target, "list", "--json")
    assert code == 0 and json.loads(out) == {"namespaces": ["user/alice", "user/bob"]}
    code, out, _ = run(capsys, target, "list", "user/alice", "--items", "--json")
    [item] = json.loads(out)["items"]
    assert (item["key"], item["value"], item["revision"]) == (
        "drink",
        "Alice likes black tea now",
        2,
    )

    code, out, _ = run(capsys, target, "search", "coffee", "--json")
    assert code == 0 and [i["namespace"] for i in json.loads(out)["items"]] == [["user", "bob"]]
    code, out, _ = run(capsys, target, "search", "tea")
    assert code == 0 and out.startswith("user/alice drink r2 (")

    code, out, _ = run(capsys, target, "show", "user/alice", "drink", "--json")
    shown = json.loads(out)
    assert code == 0 and [r["value"] for r in shown["revisions"]] == [
        "Alice likes black tea now",
        "Alice likes green tea",
    ]
    turn = shown["source_turn"]
    assert (
        turn["intent"] == "I drink black tea now." and turn["turn_id"] == shown["source"]["turn_id"]
    )
    code, out, _ = run(capsys, target, "show", "user/alice", "drink")
    assert "written by turn-" in out and "intent: I drink black tea now." in out
    assert "revision 1 (" in out

    code, out, _ = run(capsys, target, "forget", "user", "--dry-run", "--json")
    planned = json.loads(out)
    assert planned["dry_run"] is True
    assert sorted(f["namespace"] for f in planned["forgotten"]) == ["user/alice", "user/bob"]
    code, out, _ = run(capsys, target, "list", "--json")
    assert json.loads(out) == {"namespaces": ["user/alice", "user/bob"]}  # nothing forgotten
    code, out, _ = run(capsys, target, "forget", "user/alice")
    assert code == 0 and out.splitlines() == ["forgot 1 item(s)", "  user/alice drink"]
    code, out, _ = run(capsys, target, "list", "--json")
    assert json.loads(out) == {"namespaces": ["user/bob"]}
    code, out, _ = run(capsys, target, "forget", "user/bob", "drink", "--json")
    assert json.loads(out)["forgotten"] == [{"namespace": "user/bob", "key": "drink"}]
    code, out, _ = run(capsys, target, "list", "--json")
    assert json.loads(out) == {"namespaces": []}


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["forget", ""], "forget needs a namespace: it will not forget everything"),
        (["forget", "[]"], "forget needs a namespace: it will not forget everything"),
        (["search", "x" * 1025], "a query has at most 1024 characters (MAX_QUERY_CHARS)"),
        (["list", "user/\x07"], "may not hold NUL or other control characters"),
        (["list", "[1]"], "a namespace in brackets is a JSON list of strings"),
        (["list", "a/" * 3000], "a namespace is at most 1200 characters as typed"),
        (["search", "tea", "--limit", "0"], "a limit is from 1 to 1000"),
        (["search", "tea", "--mode", "semantic"], "semantic"),
        (["show", "user/alice", "nothing"], "no memory 'nothing' in user/alice"),
    ],
)
async def test_bad_input_is_one_line_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    where = str(tmp_path / "loom.db")
    await remembered(where)
    code, out, err = run(capsys, where, *argv)
    assert code == 1 and out == ""
    assert expected in err and err.count("\n") == 1, err
    code, out, _ = run(capsys, where, "list", "--json")
    assert json.loads(out) == {"namespaces": ["user/alice", "user/bob"]}


def test_a_target_that_is_not_there_or_has_no_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, str(tmp_path / "none.db"), "list")
    assert code == 1 and "no loom file at" in err
    spec = tmp_path / "plain.toml"
    spec.write_text(
        '[llm]\nprovider = "scripted"\nresponses = []\n[circle]\nmedium = "conversation"\n'
        'gates = ["done"]\nwards = [{max_turns = 2}]\n[loom]\npath = "loom.db"\n'
    )
    code, _, err = run(capsys, str(spec), "list")
    assert code == 1 and "has no [memory] table" in err


async def test_a_spec_target_reads_its_loom(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await remembered(str(tmp_path / "loom.db"))
    spec = tmp_path / "helper.toml"
    spec.write_text(
        '[llm]\nprovider = "scripted"\nresponses = []\n[circle]\nmedium = "conversation"\n'
        'gates = ["done", "remember"]\nwards = [{max_turns = 2}]\n[loom]\npath = "loom.db"\n'
        '[memory]\nnamespace = ["user", "{user}"]\n'
    )
    code, out, err = run(capsys, str(spec), "search", "tea", "--json")
    assert code == 0, err
    assert [i["key"] for i in json.loads(out)["items"]] == ["drink"]


async def test_a_spec_with_an_embedder_searches_by_meaning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import trio
    from fake_embeddings import FakeOpenAIEmbeddings
    from fake_providers import isolate, serve

    isolate(monkeypatch, tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-cli-embed-0123456789")
    fake = FakeOpenAIEmbeddings([], key="sk-cli-embed-0123456789")
    async with serve(fake, "/v1") as url:
        spec = tmp_path / "helper.toml"
        spec.write_text(
            '[llm]\nprovider = "scripted"\nresponses = []\n[circle]\nmedium = "conversation"\n'
            'gates = ["done"]\nwards = [{max_turns = 2}]\n[loom]\npath = "loom.db"\n'
            '[memory]\nnamespace = ["user", "{user}"]\n'
            f'embedder = {{ provider = "openai", base_url = "{url}" }}\n'
        )
        loom = Loom.open(tmp_path / "loom.db")
        store = memory_for(loom.store)
        store.put(("user", "alice"), "family", "My spouse is Bob")
        store.put(("user", "alice"), "pet", "A kitten called Tom")
        store.close()
        loom.close()

        def cli(*argv: str) -> tuple[int, str]:
            code = main(["memory", str(spec), *argv])
            return code, capsys.readouterr().out

        # items put without an embedder have no vectors yet: found by words only
        code, out = await trio.to_thread.run_sync(cli, "search", "husband", "--json")
        assert code == 0 and json.loads(out)["items"] == []
        from cantrip.spec import build_cantrip, load_spec_file

        spell = build_cantrip(load_spec_file(spec), base_dir=tmp_path)
        assert spell.memory is not None
        store = memory_for(spell.loom.store, embedder=spell.memory.embedder)
        assert await trio.to_thread.run_sync(store.reindex) == 2
        store.close()
        spell.loom.close()
        code, out = await trio.to_thread.run_sync(
            cli, "search", "husband", "--mode", "semantic", "--limit", "1", "--json"
        )
        assert code == 0 and [i["key"] for i in json.loads(out)["items"]] == ["family"]
