"""Memory in the viewer (issue 42.6): the loom's memory items listed and searched by
namespace, one item with its revisions, each linked to the turn that wrote it and a
consolidated item to the turns it was drawn from -- on SQLite and PostgreSQL looms
(``cantrip loom X view``) and under ``cantrip serve``; hostile input is a clear 4xx;
a loom the viewer only shows never gains memory tables; and in a real browser."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import trio
from playwright.sync_api import Browser, expect
from test_http_memory import remembering, serving
from test_viewer_api import viewing
from test_viewer_browser import CANTRIP, browser, new_page, started  # noqa: F401
from test_viewer_timeline import loom_url  # noqa: F401 -- the fixture
from test_viewer_timeline_browser import _screenshot

from cantrip import Cantrip, Circle, Identity, Loom, MemorySettings, ScriptedLLM, max_turns
from cantrip.memory import memory_for
from cantrip.memory._provenance import SOURCE, provenance
from cantrip.protocols.viewer._api import LoomViews
from cantrip.protocols.viewer._app import Viewer
from cantrip.protocols.viewer._memory import LoomMemory
from gates import done, remember

GONE = "turn-pruned-long-ago"


def call(gate: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"gate": gate, "args": args}]}


async def remembered(where: str) -> dict[str, Any]:
    """Alice's entity remembers her drink twice (two revisions, two casts) and her city;
    a consolidating entity then writes a summary drawn from those turns (and one turn
    the loom no longer holds); code puts a note for Bob. Returns the turns' ids."""
    loom = Loom.open(where)
    script = [
        call("remember", key="drink", value="Alice likes green tea"),
        call("done", answer="ok"),
        call("remember", key="drink", value="Alice likes black tea now"),
        call("remember", key="city", value={"city": "Lyon", "since": 2021}),
        call("done", answer="ok"),
    ]
    spell = Cantrip(
        llm=ScriptedLLM(script),
        identity=Identity(system_prompt="You remember things."),
        circle=Circle([done, remember], [max_turns(4)]),
        loom=loom,
        memory=MemorySettings(namespace=("user", "{user}"), recall=True),
    )
    async with spell.summon() as entity:
        await entity.send("I like green tea.", tags={"user": "alice"})
        await entity.send("I drink black tea now, in Lyon.", tags={"user": "alice"})
        entity_id = entity.id
    writes = [
        t for t in loom.turns if t.entity_id == entity_id and t.gate_calls[0].gate == "remember"
    ]
    first, second = writes[0], writes[1]
    store = memory_for(loom.store)
    # as a consolidation writes it: the turn that wrote it, and the cast it was drawn from
    # (a turn the loom no longer holds among them, and what names no turn: left out)
    source = provenance(entity_id, second.id)
    source["drawn_from"] = {"entity_id": entity_id, "turn_ids": [first.id, second.id, GONE, 7, ""]}
    store.put(
        ("user", "alice", "profile"),
        "summary",
        "Alice drinks black tea (green before) and lives in Lyon",
        {SOURCE: source},
    )
    store.put(("user", "bob"), "drink", "Bob likes coffee")
    store.put(("user", "a/b"), "k/1", "a part and a key holding a slash")
    store.close()
    loom.close()
    return {"entity": entity_id, "first": first.id, "second": second.id}


@pytest.fixture
def memories(loom_url: str) -> Iterator[tuple[str, dict[str, Any]]]:  # noqa: F811
    yield loom_url, trio.run(remembered, loom_url)


def test_the_viewer_lists_searches_and_shows_memory_with_its_turns(
    memories: tuple[str, dict[str, Any]],
) -> None:
    where, ids = memories
    with viewing(where) as url, httpx.Client(base_url=url, timeout=20) as http:
        spaces = http.get("/api/memory/namespaces").json()
        assert spaces["namespaces"] == ["user/a/b", "user/alice", "user/alice/profile", "user/bob"]
        assert spaces["semantic"] is False
        under = http.get("/api/memory/namespaces", params={"prefix": "user/alice"}).json()
        assert under["namespaces"] == ["user/alice", "user/alice/profile"]

        listed = http.get("/api/memory/items", params={"namespace": "user/alice"}).json()
        assert [(i["key"], i["revision"]) for i in listed["items"]] == [
            ("summary", 1),
            ("city", 1),
            ("drink", 2),
        ]
        city = listed["items"][1]
        assert city["value"] == '{"city": "Lyon", "since": 2021}'  # a preview, as text
        drink = listed["items"][2]
        assert drink["source"] == {"entity_id": ids["entity"], "turn_id": ids["second"]}
        assert len(listed["items"][0]["drawn_from"]) == 3  # the malformed entries left out
        paged = http.get("/api/memory/items", params={"namespace": "user", "limit": 2}).json()
        assert len(paged["items"]) == 2 and paged["more"] is True
        rest = http.get(
            "/api/memory/items", params={"namespace": "user", "limit": 2, "offset": 4}
        ).json()
        assert len(rest["items"]) == 1 and rest["more"] is False

        found = http.get("/api/memory/items", params={"q": "tea"}).json()
        assert {(tuple(i["namespace"]), i["key"]) for i in found["items"]} == {
            (("user", "alice", "profile"), "summary"),
            (("user", "alice"), "drink"),
        }
        assert all(i["score"] is not None for i in found["items"])
        coffee = http.get("/api/memory/items", params={"q": "coffee", "namespace": "user/bob"})
        assert [i["value"] for i in coffee.json()["items"]] == ["Bob likes coffee"]

        shown = http.get(
            "/api/memory/item", params={"namespace": "user/alice", "key": "drink"}
        ).json()
        assert shown["value"] == "Alice likes black tea now"
        assert shown["source_turn"]["turn_id"] == ids["second"]
        assert shown["source_turn"]["intent"] == "I drink black tea now, in Lyon."
        assert [(r["revision"], r["value"]) for r in shown["revisions"]] == [
            (2, "Alice likes black tea now"),
            (1, "Alice likes green tea"),
        ]
        assert [r["source_turn"]["turn_id"] for r in shown["revisions"]] == [
            ids["second"],
            ids["first"],
        ]
        assert shown["revisions"][1]["source_turn"]["intent"] == "I like green tea."
        assert shown["drawn_from"] == [] and shown["drawn_from_total"] == 0

        profile = '["user", "alice", "profile"]'
        summary = http.get(
            "/api/memory/item", params={"namespace": profile, "key": "summary"}
        ).json()
        drawn = summary["drawn_from"]
        assert [d["turn_id"] for d in drawn] == [ids["first"], ids["second"], GONE]
        assert drawn[0]["turn"]["intent"] == "I like green tea."
        assert drawn[1]["turn"]["sequence"] > drawn[0]["turn"]["sequence"]
        assert drawn[2]["turn"] is None  # named, but the loom no longer holds it
        assert summary["drawn_from_total"] == 3

        slash = http.get(
            "/api/memory/item", params={"namespace": '["user", "a/b"]', "key": "k/1"}
        ).json()
        assert slash["source"] is None and slash["source_turn"] is None  # written by code

        # each link's target is the viewer's turn view
        turn = http.get(f"/api/turns/{ids['first']}").json()
        assert turn["entity_id"] == ids["entity"] and turn["intent"] == "I like green tea."


HOSTILE: list[tuple[str, dict[str, str], int, str]] = [
    ("items", {"namespace": "user//alice"}, 400, "a namespace part may not be empty"),
    ("items", {"namespace": "/".join("x" * 9)}, 400, "at most 8 parts (MAX_DEPTH)"),
    ("items", {"namespace": "user/\x00"}, 400, "may not hold NUL"),
    ("items", {"namespace": "[1, 2]"}, 400, "a JSON list of strings"),
    ("items", {"namespace": "u" * 1201}, 400, "at most 1200 characters as typed"),
    ("items", {"q": "tea " * 300}, 400, "at most 1024 characters (MAX_QUERY_CHARS)"),
    ("items", {"q": "tea", "mode": "psychic"}, 400, "a search mode is one of"),
    ("items", {"q": "tea", "mode": "semantic"}, 400, "embedder"),
    ("items", {"limit": "x"}, 400, "limit must be a whole number"),
    ("item", {"namespace": "user/alice", "key": "nope"}, 404, "no memory 'nope'"),
    ("item", {"namespace": "user/alice", "key": "k" * 513}, 400, "MAX_KEY_CHARS"),
    ("item", {"namespace": "", "key": "drink"}, 400, "at least one part"),
    ("nothing", {}, 404, "no route"),
]


def test_hostile_input_gets_a_clear_error_and_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "loom.db"
    trio.run(remembered, str(path))
    with viewing(path) as url, httpx.Client(base_url=url, timeout=20) as http:
        for route, params, status, message in HOSTILE:
            answer = http.get(f"/api/memory/{route}", params=params)
            assert answer.status_code == status, (route, params, answer.text)
            assert message in answer.json()["error"]["message"], (route, params, answer.text)
        assert len(http.get("/api/memory/items").json()["items"]) == 5  # nothing lost


async def test_an_oversized_query_string_is_refused_unread(tmp_path: Path) -> None:
    """Past what the server reads (hypercorn refuses long request lines first, so the
    viewer's own bound is shown on the app itself)."""
    path = tmp_path / "loom.db"
    await remembered(str(path))
    loom = Loom.open(path)
    memory = LoomMemory(lambda: loom)
    viewer = Viewer(LoomViews(lambda: loom), memory=memory)
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        return {"type": "http.request", "body": b""}

    query = ("q=" + "a" * 40_000).encode()
    scope = {"path": "/api/memory/items", "method": "GET", "query_string": query}
    try:
        assert await viewer.dispatch(scope, receive, send)
    finally:
        memory.close()
        loom.close()
    assert sent[0]["status"] == 414
    body = json.loads(sent[1]["body"])
    assert "at most 32768 bytes of query (MAX_QUERY_STRING)" in body["error"]["message"]


def _tables(path: Path) -> set[str]:
    db = sqlite3.connect(path)
    try:
        return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        db.close()


def test_a_loom_without_memory_says_so_and_gains_no_tables(tmp_path: Path) -> None:
    path = tmp_path / "plain.db"
    Loom.open(path).close()
    before = _tables(path)
    assert not [t for t in before if t.startswith("memory")]
    with viewing(path) as url, httpx.Client(base_url=url, timeout=20) as http:
        for route in ("namespaces", "items", "item?namespace=a&key=b"):
            answer = http.get(f"/api/memory/{route}")
            assert answer.status_code == 404
            assert answer.json()["error"]["code"] == "no_memory"
    assert _tables(path) == before
    jsonl = tmp_path / "loom.jsonl"
    Loom.open(jsonl).close()
    with viewing(jsonl) as url, httpx.Client(base_url=url, timeout=20) as http:
        assert http.get("/api/memory/items").json()["error"]["code"] == "no_memory"


def test_the_memory_routes_are_behind_the_token(tmp_path: Path) -> None:
    path = tmp_path / "loom.db"
    trio.run(remembered, str(path))
    token = "memory-view-token-42"
    with viewing(path, "--token", token) as url, httpx.Client(base_url=url, timeout=20) as http:
        assert http.get("/api/memory/items").status_code == 401
        auth = {"Authorization": f"Bearer {token}"}
        assert len(http.get("/api/memory/items", headers=auth).json()["items"]) == 5
        assert http.get("/ui/memory.js").status_code == 200


async def test_under_serve_the_viewer_shows_the_servers_memory(tmp_path: Path) -> None:
    """``cantrip serve``: the viewer's memory is the store the memory routes opened, and
    its item links to the served session's turn."""
    spell = remembering(tmp_path / "loom.db")
    async with serving(spell) as client:
        sid = (await client.post("/sessions", json={"user": "alice"})).json()["session_id"]
        answer = await client.post(f"/sessions/{sid}/prompt", json={"prompt": "I like tea."})
        assert answer.status_code == 200, answer.text
        listed = (await client.get("/api/memory/items", params={"namespace": "user/alice"})).json()
        [item] = listed["items"]
        shown = (
            await client.get("/api/memory/item", params={"namespace": "user/alice", "key": "said"})
        ).json()
        assert shown["source_turn"]["intent"] == "I like tea."
        turn = (await client.get(f"/api/turns/{shown['source']['turn_id']}")).json()
        assert turn["gate_calls"][0]["gate"] == "remember"
        assert item["source"] == shown["source"]
    spell.loom.close()


def test_the_memory_page_lists_searches_and_links_items_to_their_turns(
    browser: Browser,  # noqa: F811
    tmp_path: Path,
) -> None:
    path = tmp_path / "loom.db"
    ids = trio.run(remembered, str(path))
    errors: list[str] = []
    with started([CANTRIP, "loom", str(path), "view"], tmp_path, "viewing") as url:
        page = new_page(browser, errors)
        page.goto(url + "/")
        page.click("#nav-memory")
        items = page.locator("tr.memory-item")
        expect(items).to_have_count(5)
        expect(page.locator("a.memory-ns")).to_have_count(4)
        page.locator("a.memory-ns", has_text="user/alice").first.click()
        expect(page.locator("#memory-namespace")).to_have_value("user/alice")
        expect(items).to_have_count(3)
        expect(items.nth(0).locator(".badge.consolidated")).to_have_text("drawn from 3 turns")
        page.fill("#memory-query", "green")
        expect(items).to_have_count(1)
        expect(items.first).to_have_attribute("data-key", "summary")
        page.fill("#memory-query", "tea")
        expect(items).to_have_count(2)
        assert "q=tea" in page.url and "namespace=user%2Falice" in page.url  # kept on reload
        page.reload()
        expect(items).to_have_count(2)
        _screenshot(page, "viewer-memory.png")

        # an item: its revisions, each linked to the turn that wrote it
        page.locator('tr.memory-item[data-key="drink"] td').nth(1).click()  # the key
        expect(page.locator("#memory-item h2")).to_contain_text("drink")
        expect(page.locator("#memory-source .intent")).to_contain_text("I drink black tea now")
        revisions = page.locator("tr.memory-revision")
        expect(revisions).to_have_count(2)
        expect(revisions.nth(1)).to_contain_text("Alice likes green tea")
        revisions.nth(1).locator("a.memory-source").click()
        expect(page).to_have_url(f"{url}/#/e/{ids['entity']}/t/{ids['first']}")
        expect(page.locator("#turn")).to_have_attribute("data-turn", ids["first"])
        expect(page.locator("#turn .call[data-gate=remember]")).to_contain_text("green tea")

        # and back: the turn that recalled the first revision links to the item
        page.goto(f"{url}/#/e/{ids['entity']}/t/{ids['second']}")
        recalled = page.locator("#turn-memory a.recalled")
        expect(recalled).to_have_text("user/alice drink (r1)")
        expect(page.locator("#turn-memory pre")).to_contain_text("- drink: Alice likes green tea")
        recalled.click()
        expect(page.locator("#memory-item h2")).to_contain_text("drink")

        # a consolidated item: the turns it was drawn from, one no longer in the loom
        page.goto(url + "/#/memory?namespace=user/alice/profile")
        page.locator("tr.memory-item td").nth(1).click()
        drawn = page.locator("#memory-drawn .memory-turn")
        expect(drawn).to_have_count(3)
        expect(drawn.nth(0)).to_contain_text("I like green tea.")
        expect(drawn.nth(2)).to_have_class("memory-turn gone")
        expect(drawn.nth(2).locator(".badge.gone")).to_have_text("not in this loom")
        _screenshot(page, "viewer-memory-item.png")
        drawn.nth(1).locator("a.turn-link").click()
        expect(page.locator("#turn")).to_have_attribute("data-turn", ids["second"])

        # a namespace part and a key holding "/" open their item
        page.goto(url + "/#/memory?namespace=" + quote("user"))
        page.locator('tr.memory-item[data-key="k/1"] td').nth(1).click()
        expect(page.locator("#memory-source")).to_contain_text("written by code")

        # hostile input: the bound is named, the page stays usable
        page.goto(url + "/#/memory")
        page.fill("#memory-namespace", "a/b/c/d/e/f/g/h/i")
        expect(page.locator("#error")).to_contain_text("MAX_DEPTH")
        page.fill("#memory-namespace", "")
        page.fill("#memory-query", "x" * 1100)
        expect(page.locator("#error")).to_contain_text("MAX_QUERY_CHARS")
        page.fill("#memory-query", "coffee")
        expect(items).to_have_count(1)
        expect(page.locator("#error")).to_have_text("")
        page.close()
    # the console saw the two refused requests, and nothing else went wrong
    assert errors and all("status of 400" in e for e in errors), errors
