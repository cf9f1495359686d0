"""Memory over HTTP (issue 42, item 6): a session's user, and the memory routes.

``POST /sessions {"user": ...}`` makes every cast of the session carry the ``user`` tag,
so a ``[memory]`` namespace naming ``{user}`` is that user's over HTTP; the user is
fixed at creation. (Both backends carry it: tests/test_session_backend_contract.py.)
"""

from __future__ import annotations

import tomllib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

import cantrip
from cantrip.memory import memory_for
from cantrip.protocols.http._serve import serve_http
from cantrip.spec import build_cantrip, parse_spec

pytest.importorskip("hypercorn")


def remembering(loom: Path) -> cantrip.Cantrip:
    """A cantrip whose every cast remembers the intent under ``said`` in its user's
    namespace (a shared script: one remember, one done, per cast)."""
    call = {"gate": "remember", "args": {"key": "said", "value": "Alice likes tea"}}
    script = [{"tool_calls": [call]}, {"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]}]
    doc: dict[str, Any] = {
        "llm": {"provider": "scripted", "responses": script * 4, "script": "shared"},
        "circle": {
            "medium": "conversation",
            "gates": ["done", "remember", "recall"],
            "wards": [{"max_turns": 4}],
        },
        "loom": {"path": str(loom)},
        "memory": {"namespace": ["user", "{user}"]},
    }
    return build_cantrip(parse_spec(doc))


@asynccontextmanager
async def serving(spell: cantrip.Cantrip) -> AsyncIterator[httpx.AsyncClient]:
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(serve_http, spell, "127.0.0.1", 0)
        async with httpx.AsyncClient(base_url=binds[0], timeout=20) as client:
            yield client
        nursery.cancel_scope.cancel()


async def test_a_session_made_for_a_user_remembers_in_that_users_namespace(
    tmp_path: Path,
) -> None:
    spell = remembering(tmp_path / "loom.db")
    async with serving(spell) as client:
        made = await client.post("/sessions", json={"user": "alice"})
        assert made.status_code == 201, made.text
        assert made.json()["user"] == "alice"
        sid = made.json()["session_id"]
        answer = await client.post(f"/sessions/{sid}/prompt", json={"prompt": "I like tea."})
        assert answer.status_code == 200, answer.text
        assert answer.json()["result"] == "ok"
        assert (await client.get(f"/sessions/{sid}")).json()["user"] == "alice"

        # a session without a user cannot fill {user}: its cast says so, nothing is stored
        plain = (await client.post("/sessions", json={})).json()
        assert "user" not in plain
        refused = await client.post(
            f"/sessions/{plain['session_id']}/prompt", json={"prompt": "Hi."}
        )
        assert "needs a user" in refused.text

        # a key names one session, of one user: asked for another user it is refused
        first = await client.post(
            "/sessions", json={"user": "bob"}, headers={"Idempotency-Key": "k-bob"}
        )
        again = await client.post(
            "/sessions", json={"user": "mallory"}, headers={"Idempotency-Key": "k-bob"}
        )
        assert first.status_code == 201 and again.status_code == 409
        assert again.json()["error"]["code"] == "user_conflict"
        for bad in ["", "a\u0007b", "x" * 129, 7]:
            bad_user = await client.post("/sessions", json={"user": bad})
            assert bad_user.status_code == 400, (bad, bad_user.text)
    store = memory_for(spell.loom.store)
    try:
        item = store.get(("user", "alice"), "said")
        assert item is not None and item.value == "Alice likes tea"
        assert [ns for ns in store.list_namespaces(())] == [("user", "alice")]
    finally:
        store.close()
        spell.loom.close()


# -- the memory routes, on both serve modes ----------------------------------------------

MEMORY_SPEC = """
[llm]
provider = "scripted"
responses = [{tool_calls = [{gate = "done", args = {answer = "ok"}}]}]

[circle]
medium = "conversation"
gates = ["done", "remember"]
wards = [{max_turns = 3}]

[loom]
url = "URL"

[memory]
namespace = ["user", "{user}"]
"""


@asynccontextmanager
async def memory_server(kind: str, tmp_path: Path, request: Any) -> AsyncIterator[Any]:
    """A served cantrip with memory (in process on SQLite, or ``serve --db``), a client
    of it, and the store beside its loom, where a turn wrote Alice's fact."""
    from cantrip.loom import Loom

    if kind == "sqlite":
        spell = remembering(tmp_path / "loom.db")
        async with serving(spell) as client:
            sid = (await client.post("/sessions", json={"user": "alice"})).json()["session_id"]
            await client.post(f"/sessions/{sid}/prompt", json={"prompt": "I like tea."})
            store = memory_for(spell.loom.store)
            try:
                yield client, store
            finally:
                store.close()
        spell.loom.close()
        return
    from cantrip.distributed._spells import build_spell
    from cantrip.protocols.http._serve import serve_http_db

    url = request.getfixturevalue("pg_url")
    queued = {"spec": tomllib.loads(MEMORY_SPEC.replace("URL", url))}
    loom = Loom.open(url)
    cantrip_ = build_spell(queued, loom)
    store = memory_for(loom.store)
    # what a worker's turn writes: the item names the turn (here one the loom holds)
    entity = cantrip_.summon()
    async with entity:
        await entity.send("I like tea.", tags={"user": "alice"})
    turn = entity.turns[0]
    store.put(
        ("user", "alice"),
        "said",
        "Alice likes tea",
        {"source": {"entity_id": turn.entity_id, "turn_id": turn.id}},
    )
    try:
        async with trio.open_nursery() as nursery:
            (base,) = await nursery.start(
                lambda task_status: serve_http_db(
                    queued, cantrip_, url, "127.0.0.1", 0, task_status=task_status
                )
            )
            async with httpx.AsyncClient(base_url=base, timeout=20) as client:
                yield client, store
            nursery.cancel_scope.cancel()
    finally:
        store.close()
        loom.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_memory_routes_list_search_show_and_forget(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    async with memory_server(kind, tmp_path, request) as (client, store):
        store.put(("user", "bob"), "drink", "Bob likes coffee")
        listed = await client.get("/memory/namespaces")
        assert listed.status_code == 200, listed.text
        assert listed.json() == {"namespaces": ["user/alice", "user/bob"]}
        assert (await client.get("/memory/namespaces?prefix=user/bob")).json() == {
            "namespaces": ["user/bob"]
        }
        found = (await client.get("/memory/items", params={"q": "coffee"})).json()["items"]
        assert [(i["namespace"], i["key"]) for i in found] == [(["user", "bob"], "drink")]
        newest = (await client.get("/memory/items?namespace=user/alice")).json()["items"]
        assert newest[0]["source"] is not None  # the turn that wrote it
        assert [i["key"] for i in newest] == ["said"]

        store.put(
            ("user", "alice"),
            "said",
            "Alice likes green tea",
            {"source": newest[0]["source"]},  # a later revision by the same turn
        )
        shown = await client.get("/memory/item", params={"namespace": "user/alice", "key": "said"})
        assert shown.status_code == 200, shown.text
        item = shown.json()
        assert [r["value"] for r in item["revisions"]] == [
            "Alice likes green tea",
            "Alice likes tea",
        ]
        assert item["source_turn"]["turn_id"] == item["source"]["turn_id"]
        assert item["source_turn"]["intent"] == "I like tea."
        missing = await client.get("/memory/item", params={"namespace": "user/alice", "key": "x"})
        assert missing.status_code == 404

        dry = await client.delete("/memory/items", params={"namespace": "user", "dry_run": "1"})
        assert dry.status_code == 200 and dry.json()["dry_run"] is True
        assert len(dry.json()["forgotten"]) == 2
        assert len((await client.get("/memory/namespaces")).json()["namespaces"]) == 2
        gone = await client.delete("/memory/items", params={"namespace": "user/alice"})
        assert gone.json()["forgotten"] == [{"namespace": "user/alice", "key": "said"}]
        assert store.get(("user", "alice"), "said") is None
        assert (await client.get("/memory/namespaces")).json() == {"namespaces": ["user/bob"]}


async def test_memory_routes_refuse_bad_input_in_one_clear_error(tmp_path: Path) -> None:
    async with memory_server("sqlite", tmp_path, None) as (client, store):
        cases = [
            ("DELETE", "/memory/items", {"namespace": ""}, 400, "it will not forget everything"),
            ("GET", "/memory/items", {"q": "x" * 1025}, 400, "MAX_QUERY_CHARS"),
            ("GET", "/memory/items", {"namespace": "user/\x07"}, 400, "control characters"),
            ("GET", "/memory/items", {"limit": "0"}, 400, "a limit is from 1 to 1000"),
            ("GET", "/memory/items", {"limit": "ten"}, 400, "limit is a whole number"),
            ("GET", "/memory/items", {"q": "tea", "mode": "semantic"}, 409, "needs an embedder"),
            ("GET", "/memory/items", {"q": "tea", "mode": "fuzzy"}, 400, "a search mode is one of"),
            ("POST", "/memory/items", {}, 405, ""),
            ("GET", "/memory/items", {"namespace": "a/" * 3000}, 400, "at most 1200 characters"),
        ]
        for method, path, params, status, words in cases:
            answer = await client.request(method, path, params=params)
            assert answer.status_code == status, (params, answer.text)
            assert words in answer.json()["error"]["message"], answer.text
        assert store.get(("user", "alice"), "said") is not None  # nothing was forgotten


async def test_a_cantrip_without_memory_has_no_memory_routes(tmp_path: Path) -> None:
    doc: dict[str, Any] = {
        "llm": {"provider": "scripted", "responses": []},
        "circle": {"medium": "conversation", "gates": ["done"], "wards": [{"max_turns": 2}]},
    }
    async with serving(build_cantrip(parse_spec(doc))) as client:
        answer = await client.get("/memory/namespaces")
        assert answer.status_code == 404 and answer.json()["error"]["code"] == "no_memory"


def test_serve_db_loads_a_spec_with_memory(tmp_path: Path, pg_url: str) -> None:
    """``cantrip serve SPEC --db URL`` builds its cantrip to check and describe it; a
    spec with ``[memory]`` needs a database for that, and the replica's is the one."""
    import subprocess
    import sys

    spec = tmp_path / "helper.toml"
    spec.write_text(MEMORY_SPEC.replace('[loom]\nurl = "URL"\n', ""))
    cantrip_cli = str(Path(sys.executable).with_name("cantrip"))
    run = subprocess.run(
        [cantrip_cli, "serve", str(spec), "--db", pg_url, "--check"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "loads" in run.stderr


async def test_a_sessions_user_survives_a_restart_of_serve(tmp_path: Path) -> None:
    """In process the user lives with the session, and after a restart it is read back
    from the tags its casts recorded: the resumed session casts for the same user."""
    spell = remembering(tmp_path / "loom.db")
    async with serving(spell) as client:
        sid = (await client.post("/sessions", json={"user": "alice"})).json()["session_id"]
        await client.post(f"/sessions/{sid}/prompt", json={"prompt": "I like tea."})
    spell.loom.close()
    again = remembering(tmp_path / "loom.db")
    async with serving(again) as client:
        resumed = await client.get(f"/sessions/{sid}")
        assert resumed.status_code == 200 and resumed.json()["user"] == "alice"
        answer = await client.post(f"/sessions/{sid}/prompt", json={"prompt": "Still tea."})
        assert answer.status_code == 200, answer.text
        thread = (await client.get(f"/sessions/{sid}/thread")).json()["turns"]
        users = [t["extras"].get("user") for t in thread if t.get("intent")]
        assert users == ["alice", "alice"]
    again.loom.close()
