"""Memory in casts (issue 42.3, 42.4): the memory gates across sessions on both loom kinds,
pinned blocks, automatic recall recorded in the loom, provenance and "as of" reads."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cantrip import (
    Cantrip,
    Circle,
    ConstructionError,
    Identity,
    Loom,
    MemoryBlock,
    MemorySettings,
    Message,
    ScriptedLLM,
    max_turns,
)
from cantrip.memory import (
    MemoryBackend,
    MemoryStoreError,
    SearchItem,
    forget_namespace,
    get_as_of,
    memory_for,
    source_turn,
    turn_time,
)
from gates import done, echo, edit_block, forget, recall, remember

ALICE = ("user", "alice")


def call(gate: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"gate": gate, "args": args}]}


class Place:
    """Where a test's loom lives: an SQLite file or a PostgreSQL database; opened as
    often as the test likes (each open is a new session on the same database)."""

    def __init__(self, kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
        self.kind = kind
        self.target = (
            str(tmp_path / "loom.db") if kind == "sqlite" else request.getfixturevalue("pg_url")
        )
        self.looms: list[Loom] = []

    def loom(self) -> Loom:
        loom = Loom.open(self.target)
        self.looms.append(loom)
        return loom

    def close(self) -> None:
        for loom in self.looms:
            loom.close()


@pytest.fixture(params=["sqlite", "postgres"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    where = Place(request.param, tmp_path, request)
    yield where
    where.close()


@pytest.fixture
def sqlite_place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    where = Place("sqlite", tmp_path, request)
    yield where
    where.close()


def spell(loom: Loom, script: list[dict[str, Any]], memory: MemorySettings, *gates: Any) -> Cantrip:
    return Cantrip(
        llm=ScriptedLLM(script),
        identity=Identity(system_prompt="You remember things."),
        circle=Circle([done, echo, remember, recall, forget, edit_block, *gates], [max_turns(8)]),
        loom=loom,
        memory=memory,
    )


def texts(messages: Any) -> list[str]:
    return [m.text() for m in messages]


# -- remember / recall / forget across sessions -----------------------------------------


async def test_what_one_session_remembers_another_recalls(place: Place) -> None:
    settings = MemorySettings(namespace=("user", "{user}"), name="helper")
    first = spell(
        place.loom(),
        [
            call("remember", key="favourite_colour", value="Alice's favourite colour is blue"),
            call("done", answer="ok"),
        ],
        settings,
    )
    async with first.summon() as entity:
        result = await entity.send("My favourite colour is blue.", tags={"user": "alice"})
    assert result.turns[0].gate_calls[0].is_error is False
    place.close()

    # another session: a new loom object on the same database, a new cantrip
    later = MemorySettings(namespace=("user", "{user}"), name="helper")
    script = [call("recall", query="which colour"), call("done", answer="ok")]
    second = spell(place.loom(), script, later)
    async with second.summon() as entity:
        alice = await entity.send("What is my favourite colour?", tags={"user": "alice"})
    found = alice.turns[0].gate_calls[0]
    assert not found.is_error
    assert [(i["key"], i["value"]) for i in found.result] == [
        ("favourite_colour", "Alice's favourite colour is blue")
    ]

    third = spell(second.loom, script, later)
    async with third.summon() as entity:
        bob = await entity.send("What is my favourite colour?", tags={"user": "bob"})
    assert bob.turns[0].gate_calls[0].result == []  # another user's namespace


async def test_forget_gate_forgets_every_revision(sqlite_place: Place) -> None:
    loom = sqlite_place.loom()
    settings = MemorySettings(namespace=("user", "{user}"))
    script = [
        call("remember", key="k", value="one"),
        call("remember", key="k", value="two"),
        call("forget", key="k"),
        call("forget", key="k"),
        call("done", answer="ok"),
    ]
    async with spell(loom, script, settings).summon() as entity:
        result = await entity.send("go", tags={"user": "alice"})
    said = [t.gate_calls[0].result for t in result.turns[2:4]]
    assert said == ["forgot 'k'", "nothing was remembered under 'k'"]
    store = memory_for(loom.store)
    assert store.get(ALICE, "k") is None and store.get(ALICE, "k", 1) is None


async def test_a_namespace_that_needs_a_user_refuses_a_cast_without_one(
    sqlite_place: Place,
) -> None:
    loom = sqlite_place.loom()
    s = spell(loom, [call("done", answer="ok")], MemorySettings(namespace=("user", "{user}")))
    async with s.summon() as entity:
        with pytest.raises(MemoryStoreError, match="needs a user"):
            await entity.send("hello")
        assert loom.entity_turns(entity.id) == ()  # refused before any turn


async def test_memory_gates_without_memory_are_error_observations() -> None:
    s = Cantrip(
        llm=ScriptedLLM([call("remember", key="k", value="v"), call("done", answer="ok")]),
        identity=Identity(),
        circle=Circle([done, remember], [max_turns(3)]),
    )
    result = await s.cast_async("go")
    record = result.turns[0].gate_calls[0]
    assert record.is_error and "has no memory" in str(record.result)


def test_memory_settings_refuse_bad_input_one_line_each() -> None:
    with pytest.raises(ConstructionError) as caught:
        MemorySettings(
            namespace=("user", "{whom}"),
            blocks=(MemoryBlock("a"), MemoryBlock("a")),
            recall_k=0,
        )
    problems = caught.value.problems
    assert any("{whom}" in p for p in problems)
    assert any("declared twice" in p for p in problems)
    assert any("recall_k" in p for p in problems)
    with pytest.raises(ConstructionError, match="over its limit of 3"):
        MemoryBlock("human", "four", limit=3)


# -- provenance and "as of" -------------------------------------------------------------


async def test_an_item_names_the_turn_that_wrote_it(sqlite_place: Place) -> None:
    loom = sqlite_place.loom()
    script = [
        call("echo", text="first"),
        call("remember", key="city", value="Lyon"),
        call("done", answer="ok"),
    ]
    s = spell(loom, script, MemorySettings(namespace=("user", "{user}")))
    async with s.summon() as entity:
        result = await entity.send("I live in Lyon.", tags={"user": "alice"})
    item = memory_for(loom.store).get(ALICE, "city")
    assert item is not None
    writer = result.turns[1]
    assert item.metadata["source"] == {"entity_id": entity.id, "turn_id": writer.id}
    turn = source_turn(loom, item)
    assert turn is not None and turn.id == writer.id
    assert [c.gate_name for c in turn.gate_calls] == ["remember"]


async def test_a_fork_of_an_old_turn_recalls_what_was_known_then(place: Place) -> None:
    loom = place.loom()
    settings = MemorySettings(namespace=("user", "{user}"), recall=True)
    script = [
        call("remember", key="colour", value="Her colour is blue"),
        call("done", answer="ok"),
        call("remember", key="colour", value="Her colour is green"),
        call("done", answer="ok"),
        call("done", answer="ok"),  # the fork's cast
    ]
    s = spell(loom, script, settings)
    async with s.summon() as entity:
        first = await entity.send("Remember blue.", tags={"user": "alice"})
        await entity.send("Now green.", tags={"user": "alice"})
    store = memory_for(loom.store)
    then = turn_time(first.turns[-1])
    old = get_as_of(store, ALICE, "colour", then)
    assert old is not None and (old.value, old.revision) == ("Her colour is blue", 1)
    latest = store.get(ALICE, "colour")
    assert latest is not None and latest.value == "Her colour is green"

    llm = s.llm
    assert isinstance(llm, ScriptedLLM)
    fork = s.fork(first.turns[-1].id)
    async with fork:
        await fork.send("What colour?", tags={"user": "alice"})
    shown = texts(llm.invocations[-1].messages)
    memory_note = shown[-1]
    assert "colour: Her colour is blue" in memory_note and "green" not in memory_note
    recorded = loom.entity_turns(fork.id)[0].extras["memory"]
    assert recorded["recalled"] == [{"namespace": list(ALICE), "key": "colour", "revision": 1}]
    assert recorded["as_of"] == then.isoformat()


def test_forget_a_users_namespace_with_a_dry_run(tmp_path: Path) -> None:
    loom = Loom.open(tmp_path / "loom.db")
    store = memory_for(loom.store)
    for key in ("a", "b"):
        store.put(ALICE, key, key)
    store.put((*ALICE, "_blocks"), "human", "Alice")
    store.put(("user", "bob"), "a", "kept")
    would = forget_namespace(store, ALICE, dry_run=True)
    assert sorted(would) == [(ALICE, "a"), (ALICE, "b"), ((*ALICE, "_blocks"), "human")]
    assert store.get(ALICE, "a") is not None  # a dry run forgets nothing
    gone = forget_namespace(store, ALICE, dry_run=False)
    assert sorted(gone) == sorted(would)
    assert store.search(ALICE) == [] and store.get(("user", "bob"), "a") is not None
    with pytest.raises(MemoryStoreError, match="needs a namespace"):
        forget_namespace(store, (), dry_run=True)
    loom.close()


# -- pinned blocks ----------------------------------------------------------------------


async def test_a_pinned_block_is_in_every_request_and_edited_through_its_gate(
    place: Place,
) -> None:
    loom = place.loom()
    settings = MemorySettings(
        namespace=("user", "{user}"), blocks=(MemoryBlock("human", "Name: unknown", limit=40),)
    )
    script = [
        call("echo", text="hi"),
        call("edit_block", label="human", old_text="unknown", new_text="Alice"),
        call("edit_block", label="human", new_text="x" * 40),
        call("done", answer="ok"),
        call("done", answer="ok"),  # the next cast
    ]
    s = spell(loom, script, settings)
    llm = s.llm
    assert isinstance(llm, ScriptedLLM)
    async with s.summon() as entity:
        result = await entity.send("I am Alice.", tags={"user": "alice"})
        block = '<block label="human" limit="40">\nName: unknown\n</block>'
        for query in llm.invocations:  # every request of the cast shows the block
            assert any(block in text for text in texts(query.messages))
        edited, refused = result.turns[1].gate_calls[0], result.turns[2].gate_calls[0]
        assert not edited.is_error and "Name: Alice" in str(edited.result)
        assert refused.is_error
        assert "limited to 40 characters" in str(refused.result)
        assert "would make it 52" in str(refused.result)
        await entity.send("Who am I?", tags={"user": "alice"})
    latest = texts(llm.invocations[-1].messages)
    assert '<block label="human" limit="40">\nName: Alice\n</block>' in latest[-1]
    stored = memory_for(loom.store).get((*ALICE, "_blocks"), "human")
    assert stored is not None and (stored.value, stored.revision) == ("Name: Alice", 1)


# -- automatic recall, recorded ---------------------------------------------------------


class CountingStore:
    """A memory store that counts the reads it is asked for (a replay must ask none)."""

    def __init__(self, inner: MemoryBackend) -> None:
        self.inner = inner
        self.limiter = inner.limiter
        self.reads = 0

    def search(self, *args: Any, **kwargs: Any) -> list[SearchItem]:
        self.reads += 1
        return self.inner.search(*args, **kwargs)

    def get(self, *args: Any, **kwargs: Any) -> Any:
        self.reads += 1
        return self.inner.get(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_automatic_recall_is_recorded_and_a_fork_replays_it_without_the_store(
    place: Place,
) -> None:
    loom = place.loom()
    store = CountingStore(memory_for(loom.store))
    store.inner.put(ALICE, "favourite_colour", "Alice's favourite colour is blue")
    store.inner.put(ALICE, "pet", "Alice has a cat called Tom")
    nested_block = (*ALICE, "helper", "_blocks")  # another cantrip's block under Alice's
    store.inner.put(nested_block, "human", "Her favourite colour is a secret")
    settings = MemorySettings(namespace=("user", "{user}"), recall=True, recall_k=3, store=store)
    script = [call("echo", text="thinking"), call("done", answer="blue"), call("done", answer="ok")]
    s = spell(loom, script, settings)
    llm = s.llm
    assert isinstance(llm, ScriptedLLM)
    async with s.summon() as entity:
        result = await entity.send("What is my favourite colour?", tags={"user": "alice"})
    assert store.reads > 0
    first_request = list(llm.invocations[0].messages)
    memory_note = first_request[-1].text()
    assert first_request[-2] == Message(role="user", content="What is my favourite colour?")
    assert "favourite_colour: Alice's favourite colour is blue" in memory_note
    assert "pet" not in memory_note  # the intent's words do not match it
    recorded = result.turns[0].extras["memory"]
    assert recorded["text"] == memory_note
    assert [r["key"] for r in recorded["recalled"]] == ["favourite_colour"]  # no block
    assert "memory" not in result.turns[1].extras  # recorded once, on the cast's first turn

    # the store changes; a fork rebuilt from the loom still sees the prompt the model saw
    store.inner.delete(ALICE, "favourite_colour")
    store.reads = 0
    replaying = s.with_(memory=MemorySettings(namespace=("user", "{user}"), store=store))
    fork = replaying.fork(result.turns[0].id)
    async with fork:
        await fork.send("Thanks.", tags={"user": "alice"})
    assert store.reads == 0
    forked_request = list(llm.invocations[-1].messages)
    assert forked_request[: len(first_request)] == first_request


# -- the [memory] spec table ------------------------------------------------------------


SPEC = """
[llm]
provider = "scripted"
responses = [
  {tool_calls = [{gate = "edit_block", args = {label = "me", old_text = "?", new_text = "Alice"}}]},
  {tool_calls = [{gate = "done", args = {answer = "ok"}}]},
]

[circle]
medium = "conversation"
gates = ["done", "remember", "recall", "forget", "edit_block"]
wards = [{max_turns = 5}]

[loom]
path = "loom.db"

[memory]
namespace = ["user", "{user}", "{cantrip}"]
recall = true
recall_k = 3

[[memory.blocks]]
label = "me"
text = "Name: ?"
limit = 100
"""


async def test_a_spec_memory_table_builds_memory_for_its_casts(tmp_path: Path) -> None:
    from cantrip.spec import build_cantrip, load_spec_file

    path = tmp_path / "helper.toml"
    path.write_text(SPEC)
    s = build_cantrip(load_spec_file(path), base_dir=tmp_path)
    assert s.memory is not None and s.memory.name == "helper"  # {cantrip}: the file's name
    async with s.summon() as entity:
        result = await entity.send("I am Alice.", tags={"user": "alice"})
    assert result.result == "ok"
    assert result.turns[0].extras["memory"]["namespace"] == ["user", "alice", "helper"]
    block = memory_for(s.loom.store).get(("user", "alice", "helper", "_blocks"), "me")
    assert block is not None and block.value == "Name: Alice"
    s.loom.close()


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ('namespace = ["user", "{user}", "{cantrip}"]', None),
        ('namespace = ["user", "{whom}"]', "memory namespace part '{whom}' names {whom}"),
        ("recall_k = 0", "memory recall_k is an integer from 1 to 50; got 0"),
        ("limit = 100", None),
        ("limit = 5", "memory.blocks[0]: memory block 'me': its text has 7 characters"),
        ('path = "loom.db"', "memory lives in the loom's database"),
        ("[memory]", "circle.gates: 'remember' works on memory; add a [memory] table"),
        ("recal = true", "unknown key 'memory.recal'"),
    ],
)
def test_spec_memory_mistakes_are_one_line_each(
    tmp_path: Path, change: str, expected: str | None
) -> None:
    from cantrip.spec import build_cantrip, load_spec_file

    text = SPEC
    if change == 'path = "loom.db"':
        text = text.replace('[loom]\npath = "loom.db"\n', "")
    elif change == "[memory]":
        text = text.split("[memory]")[0]
    elif change == "recal = true":
        text = text.replace("recall = true", change)
    elif change.startswith("namespace"):
        text = text.replace('namespace = ["user", "{user}", "{cantrip}"]', change)
    elif change.startswith("recall_k"):
        text = text.replace("recall_k = 3", change)
    else:
        text = text.replace("limit = 100", change)
    path = tmp_path / "helper.toml"
    path.write_text(text)
    if expected is None:
        build_cantrip(load_spec_file(path), base_dir=tmp_path).loom.close()
        return
    with pytest.raises(ConstructionError) as caught:
        build_cantrip(load_spec_file(path), base_dir=tmp_path)
    problems = caught.value.problems
    assert len(problems) == 1, problems
    assert expected in problems[0]
    assert "\n" not in problems[0]


async def test_a_fold_keeps_what_memory_added_with_the_intent(sqlite_place: Place) -> None:
    from cantrip import FoldingPolicy

    loom = sqlite_place.loom()
    settings = MemorySettings(blocks=(MemoryBlock("human", "Name: Alice"),))
    script = [call("echo", text=str(n)) for n in range(4)] + [call("done", answer="ok")]
    s = spell(loom, script, settings).with_(
        folding=FoldingPolicy(trigger_after_turns=2, keep_recent=1)
    )
    llm = s.llm
    assert isinstance(llm, ScriptedLLM)
    async with s.summon() as entity:
        await entity.send("Count.")
    last = texts(llm.invocations[-1].messages)
    assert any("Summary of earlier turns" in text for text in last)  # it did fold
    block = '<block label="human" limit="2000">\nName: Alice\n</block>'
    assert last[1:3] == ["Count.", f"[memory: {s.id}]\n{block}"]


async def test_prune_memories_forgets_what_the_removed_sessions_wrote(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    path = tmp_path / "loom.db"
    loom = Loom.open(path)
    settings = MemorySettings(namespace=("user", "{user}"))
    ids = []
    for key in ("old", "new"):
        script = [call("remember", key=key, value=f"the {key} fact"), call("done", answer="ok")]
        async with spell(loom, script, settings).summon() as entity:
            await entity.send(f"Remember the {key} fact.", tags={"user": "alice"})
        ids.append(entity.id)
    memory_for(loom.store).put(ALICE, "by_hand", "written by no session")
    loom.close()

    def prune(*extra: str) -> dict[str, Any]:
        command = [sys.executable, "-m", "cantrip", "loom", str(path), "prune"]
        args = ["--entity", ids[0], "--idle-s", "0", "--memories", "--json", *extra]
        out = subprocess.run([*command, *args], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        report: dict[str, Any] = json.loads(out.stdout)
        return report

    would = prune("--dry-run")
    assert would["memories"] == [{"namespace": list(ALICE), "key": "old"}]
    loom = Loom.open(path)
    assert memory_for(loom.store).get(ALICE, "old") is not None  # a dry run forgets nothing
    loom.close()
    assert prune()["memories"] == would["memories"]
    loom = Loom.open(path)
    store = memory_for(loom.store)
    assert store.get(ALICE, "old") is None
    assert store.get(ALICE, "new") is not None and store.get(ALICE, "by_hand") is not None
    loom.close()


class ThreadNotingStore:
    """A memory store that notes the thread of every call made to it."""

    def __init__(self, inner: MemoryBackend) -> None:
        self.inner = inner
        self.limiter = inner.limiter
        self.threads: list[tuple[str, int]] = []

    def __getattr__(self, name: str) -> Any:
        import threading

        method = getattr(self.inner, name)

        def noted(*args: Any, **kwargs: Any) -> Any:
            self.threads.append((name, threading.get_ident()))
            return method(*args, **kwargs)

        return noted


async def test_every_store_call_runs_off_the_trio_thread(sqlite_place: Place) -> None:
    import threading

    loom = sqlite_place.loom()
    store = ThreadNotingStore(memory_for(loom.store))
    settings = MemorySettings(
        namespace=("user", "{user}"),
        blocks=(MemoryBlock("human", "Name: ?"),),
        recall=True,
        store=store,
    )
    script = [
        call("remember", key="k", value="a fact"),
        call("recall", query="fact"),
        call("edit_block", label="human", old_text="?", new_text="Alice"),
        call("forget", key="k"),
        call("done", answer="ok"),
    ]
    async with spell(loom, script, settings).summon() as entity:
        result = await entity.send("Any fact?", tags={"user": "alice"})
    assert not any(c.is_error for t in result.turns for c in t.gate_calls)
    called = {name for name, _ in store.threads}
    assert {"search", "get", "put", "delete"} <= called
    here = threading.get_ident()
    assert [name for name, thread in store.threads if thread == here] == []


async def test_an_eval_replay_is_keyed_by_the_prompt_memory_made(sqlite_place: Place) -> None:
    """A replay answers from the recorded conversation, memory's message included: the
    same memory replays; memory that changed since is a divergence, not a silent pass."""
    from cantrip.evals import ReplayDivergence, replay_llm

    loom = sqlite_place.loom()
    memory_for(loom.store).put(ALICE, "pet", "Alice has a cat called Tom")
    settings = MemorySettings(namespace=("user", "{user}"), recall=True)
    script = [call("done", answer="Tom is fine.")]
    async with spell(loom, script, settings).summon() as entity:
        await entity.send("How is my cat?", tags={"user": "alice"})

    replaying = spell(loom, [], settings).with_(llm=replay_llm(loom))
    async with replaying.summon() as entity:
        again = await entity.send("How is my cat?", tags={"user": "alice"})
    assert again.result == "Tom is fine."

    memory_for(loom.store).put(ALICE, "pet", "Alice has a cat called Felix")
    async with replaying.summon() as entity:
        with pytest.raises(ReplayDivergence):
            await entity.send("How is my cat?", tags={"user": "alice"})


async def test_a_child_does_not_inherit_memory(sqlite_place: Place) -> None:
    from gates import call_agent

    loom = sqlite_place.loom()
    script = [
        call("call_agent", intent="note it", gates=["remember"]),
        call("remember", key="k", value="from the child"),  # the child's turns
        call("done", answer="tried"),
        call("done", answer="ok"),
    ]
    s = spell(loom, script, MemorySettings(namespace=("user", "{user}")), call_agent)
    async with s.summon() as entity:
        result = await entity.send("Delegate.", tags={"user": "alice"})
    assert result.result == "ok"
    delegated = [c for t in result.turns for c in t.gate_calls if c.gate_name == "call_agent"]
    child = delegated[0].detail["child"]
    attempt = loom.entity_turns(child)[0].gate_calls[0]
    assert attempt.is_error and "has no memory" in str(attempt.result)
    assert memory_for(loom.store).search(ALICE) == []


async def test_a_cast_taken_up_before_its_first_turn_gets_its_memory(sqlite_place: Place) -> None:
    """A worker that takes up a cast no turn of which reached the loom (its first worker
    died before) opens it as a sent cast: memory's message is shown and recorded."""
    loom = sqlite_place.loom()
    settings = MemorySettings(blocks=(MemoryBlock("human", "Name: Alice"),))
    s = spell(loom, [call("done", answer="ok")], settings)
    async with s.summon() as entity:
        result = await entity.resume_cast("Hello.", [])
    assert "Name: Alice" in result.turns[0].extras["memory"]["text"]
