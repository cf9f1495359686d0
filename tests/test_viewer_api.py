"""The loom viewer's JSON API: paged, read-only, redacted like exports, the same
figures as ``cantrip loom list``; mounted by ``cantrip serve`` and served by
``cantrip loom FILE view``. (The page itself is tested in a real browser in
test_viewer_browser.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from seam_llm import Holds
from session_double import DoubleBackend
from test_http import SCRIPT, make_spell, serving
from viewer_looms import SECRET, build

from cantrip._redact import REDACTED
from cantrip.cli._loom import main as loom_main
from cantrip.loom import Turn, TurnMetadata, export_jsonl
from cantrip.protocols.middleware._guard import BindError
from cantrip.protocols.viewer._api import LoomViews, ViewerError
from cantrip.protocols.viewer._app import LoomFile, Viewer, ViewerApp, viewer_guard

CANTRIP = str(Path(sys.executable).with_name("cantrip"))

JSON_TYPE = {"content-type": "application/json"}


def views(turns: int = 6) -> LoomViews:
    loom = build(turns=turns)
    return LoomViews(lambda: loom)


def q(**params: Any) -> dict[str, list[str]]:
    return {k: [str(v)] for k, v in params.items()}


def test_the_tree_nests_forks_and_children_and_keeps_a_thread_flat() -> None:
    page = views().tree("entity-a", {})
    rows = [(r["id"], r["depth"], r["branch"]) for r in page["items"]]
    assert rows == [
        ("turn-a1", 0, None),
        ("turn-a2", 0, None),
        ("turn-f1", 1, "fork"),
        ("turn-f2", 1, None),
        ("turn-a3", 0, None),
        ("turn-c1", 1, "child"),
        ("turn-c2", 1, None),
        ("turn-a4", 0, None),
        ("turn-a5", 0, None),
        ("turn-a6", 0, None),
    ]
    marks = {r["id"]: r for r in page["items"]}
    assert marks["turn-a2"]["status"] == "error" and marks["turn-a2"]["gates"] == ["echo", "nosuch"]
    assert marks["turn-a3"]["status"] == "delegating"
    assert marks["turn-a6"]["status"] == "terminated"
    # A fork's own tree starts at its first turn and says where it came from.
    fork = views().tree("entity-f", {})
    assert [r["id"] for r in fork["items"]] == ["turn-f1", "turn-f2"]
    assert fork["forked_from"] == "turn-a2"


def test_every_list_is_paged_and_a_turn_can_be_found_by_page() -> None:
    v = views(turns=1000)
    first = v.tree("entity-a", q(limit=100))
    assert first["total"] == 1004 and len(first["items"]) == 100 and first["offset"] == 0
    later = v.tree("entity-a", q(offset=1000, limit=100))
    assert [r["id"] for r in later["items"]] == [f"turn-a{n}" for n in range(997, 1001)]
    found = v.tree("entity-a", q(turn="turn-a500", limit=100))
    assert found["offset"] == 500 and found["index"] == 503
    assert found["items"][found["index"] - found["offset"]]["id"] == "turn-a500"
    # The server never sends more than a page, whatever is asked for.
    assert len(v.tree("entity-a", q(limit=100000))["items"]) == 500
    thread = v.thread("turn-a1000", q(offset=990, limit=5))
    assert thread["total"] == 1000
    assert {m["sequence"] for m in thread["messages"]} == {991, 992, 993, 994, 995}


def test_bad_paging_and_unknown_ids_are_clear_errors() -> None:
    v = views()
    for params, status in (
        (q(offset=-1), 400),
        (q(limit="ten"), 400),
        (q(turn="turn-nope"), 404),
    ):
        with pytest.raises(ViewerError) as caught:
            v.tree("entity-a", params)
        assert caught.value.status == status, params
    with pytest.raises(ViewerError, match="no entity 'entity-zz'"):
        v.tree("entity-zz", {})
    with pytest.raises(ViewerError, match="no turn"):
        v.turn("turn-zz")


def test_entities_carry_the_loom_list_figures_and_can_be_searched(tmp_path: Path) -> None:
    path = tmp_path / "loom.jsonl"
    build(path).close()
    listed = subprocess.run(
        [CANTRIP, "loom", str(path), "list", "--json"], capture_output=True, text=True, check=True
    )
    expected = {e["entity_id"]: e for e in json.loads(listed.stdout)["entities"]}
    source = LoomFile(path)
    v = LoomViews(source)
    page = v.entities({})
    assert [e["entity_id"] for e in page["items"]] == ["entity-a", "entity-c", "entity-f"]
    for item in page["items"]:
        cli = expected[item["entity_id"]]
        for key in ("turns", "tokens", "cost_usd", "tree_cost_usd", "medium", "outcome"):
            assert item[key] == cli[key], (item["entity_id"], key)
    a = page["items"][0]
    assert a["tree_cost_usd"] is None  # the child's price is unknown: never counted as 0
    assert a["cost_usd"] == pytest.approx(0.006)
    assert a["session_id"] == "session-a" and page["items"][1]["session_id"] is None
    assert [e["entity_id"] for e in v.entities(q(q="TRAIN"))["items"]] == ["entity-f"]
    assert [e["entity_id"] for e in v.entities(q(q="entity-c"))["items"]] == ["entity-c"]
    assert v.entities(q(q="nothing like it"))["total"] == 0
    assert v.entities(q(limit=1, offset=1))["items"][0]["entity_id"] == "entity-c"
    source.close()


async def asgi_get(app: Any, path: str, query: bytes = b"") -> tuple[int, Any]:
    """One ``GET`` through the ASGI app itself: what goes out on the wire."""
    sent: list[Any] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "query_string": query}
    await app(scope, receive, send)
    return sent[0]["status"], json.loads(sent[1]["body"])


async def test_secrets_are_redacted_exactly_as_in_exports_by_whatever_sends_them() -> None:
    """Issue 28.12: the viewer's sender redacts everything it sends (no route redacts
    for itself, so a new route cannot forget): the JSON on the wire matches the export."""
    loom = build()
    app = ViewerApp(lambda: loom)
    exported = {row["id"]: row for row in map(json.loads, export_jsonl(loom).splitlines())}
    _, detail = await asgi_get(app, "/api/turns/turn-a1")
    for key, value in exported["turn-a1"].items():
        if key != "reward":
            assert detail[key] == value, key
    answers = [
        await asgi_get(app, path)
        for path in ("/api/entities", "/api/entities/entity-a/tree", "/api/threads/turn-a6")
    ]
    everything = json.dumps([detail, *answers])
    assert SECRET not in everything
    assert f"Book a flight with key {REDACTED}" in everything


def test_a_turn_and_a_thread_read_like_the_loom_show_them() -> None:
    v = views()
    detail = v.turn("turn-a2")
    assert detail["medium"] == "conversation" and detail["session_id"] == "session-a"
    assert [c["status"] for c in detail["gate_calls"]] == ["ok", "error"]
    assert {(b["id"], b["branch"]) for b in detail["branches"]} == {
        ("turn-a3", "next"),
        ("turn-f1", "fork"),
    }
    assert {(b["id"], b["branch"]) for b in v.turn("turn-a3")["branches"]} == {
        ("turn-a4", "next"),
        ("turn-c1", "child"),
    }
    child = v.turn("turn-c1")
    assert child["medium"] == "python" and child["session_id"] is None
    messages = v.thread("turn-f2", {})["messages"]
    roles = [(m["role"], m["turn_id"]) for m in messages]
    assert roles[:3] == [("user", "turn-a1"), ("assistant", "turn-a1"), ("tool", "turn-a1")]
    assert ("user", "turn-f1") in roles and roles[-1] == ("outcome", "turn-f2")
    error = next(m for m in messages if m["role"] == "tool" and m["gate"] == "nosuch")
    assert error["is_error"] and error["status"] == "error"
    assert messages[1]["thinking"] == "Let me consider."


def test_the_views_follow_a_growing_loom() -> None:
    loom = build()
    v = LoomViews(lambda: loom)
    assert v.tree("entity-a", {})["total"] == 10
    later = TurnMetadata(timestamp="2026-01-02T00:00:00+00:00")
    loom.append(Turn("turn-a7", "turn-a6", "entity-a", 7, utterance="again", metadata=later))
    assert v.tree("entity-a", {})["total"] == 11
    assert v.entities({})["items"][0]["turns"] == 7


# -- over HTTP ------------------------------------------------------------------------


async def test_cantrip_serve_mounts_the_page_the_api_and_fork() -> None:
    fork_answer = {"tool_calls": [{"gate": "done", "args": {"answer": "fork"}}]}
    spell = make_spell([*SCRIPT[:2], fork_answer])
    async with serving(spell) as http:
        page = await http.get("/")
        assert page.status_code == 200 and "<title>cantrip loom</title>" in page.text
        assert "script-src 'self'" in page.headers["content-security-policy"]
        script = await http.get("/ui/app.js")
        assert script.headers["content-type"].startswith("text/javascript")
        assert (await http.get("/ui/../_app.py")).status_code == 404
        assert (await http.post("/")).status_code == 405
        assert (await http.get("/api/loom")).json()["live"] is True
        # /health and the session routes are untouched by the mount.
        assert (await http.get("/health")).json()["ok"]
        sid = (await http.post("/sessions")).json()["session_id"]
        await http.post(f"/sessions/{sid}/prompt", json={"prompt": "Book a flight"})
        entities = (await http.get("/api/entities")).json()["items"]
        assert [e["session_id"] for e in entities] == [sid]
        entity_id = entities[0]["entity_id"]
        tree = (await http.get(f"/api/entities/{entity_id}/tree")).json()
        first = tree["items"][0]["id"]
        # Fork from the first turn: a new session that continues from there.
        bad = await http.post("/api/fork", json={"turn": first})
        assert bad.status_code == 400 and "turn_id" in bad.json()["error"]["message"]
        assert (await http.post("/api/fork", json={"turn_id": "turn-nope"})).status_code == 404
        assert (await http.post("/api/fork", content=b"{nope", headers=JSON_TYPE)).json()["error"][
            "code"
        ] == "bad_json"
        # nested too deeply to parse: a 400 like any other non-JSON body, never a 500
        deep = await http.post("/api/fork", content=b"[" * 100_000, headers=JSON_TYPE)
        assert deep.status_code == 400 and deep.json()["error"]["code"] == "bad_json"
        forked = await http.post("/api/fork", json={"turn_id": first})
        assert forked.status_code == 201 and forked.json()["forked_from"] == first
        fork_session = forked.json()["session_id"]
        answer = await http.post(f"/sessions/{fork_session}/prompt", json={"prompt": "again"})
        assert answer.json()["result"] == "fork"
        fork_tree = (await http.get(f"/api/entities/{forked.json()['entity_id']}/tree")).json()
        assert fork_tree["forked_from"] == first
        assert fork_tree["items"][0]["parent_id"] == first
        original = (await http.get(f"/api/entities/{entity_id}/tree")).json()["items"]
        assert [(r["id"], r["branch"]) for r in original][:2] == [
            (first, None),
            (fork_tree["items"][0]["id"], "fork"),
        ]
        assert (await http.get("/api/nothing")).status_code == 404
        assert (await http.delete("/api/loom")).status_code == 405


async def test_a_viewer_over_a_backend_reads_through_it_and_forks_only_where_it_may() -> None:
    """The served viewer asks the seam, never a mode: the loom through ``read_loom``,
    which entities run through ``sessions``, and a fork only where
    ``capabilities.viewer_fork`` says so -- else a 501 that names the capability."""
    async with DoubleBackend.open(Holds()) as backend:
        info, _ = await backend.create()
        done = await backend.submit(info.session_id, "Add one.")
        await backend.result(info.session_id, done.prompt_id)
        viewer = Viewer.over(backend, "double")

        async def app(scope: Any, receive: Any, send: Any) -> None:
            assert await viewer.dispatch(scope, receive, send)

        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            overview = (await http.get("/api/loom")).json()
            assert overview == {"turns": 3, "entities": 1, "live": False, "source": "double"}
            entities = (await http.get("/api/entities")).json()["items"]
            assert [(e["entity_id"], e["running"]) for e in entities] == [(info.entity_id, False)]
            tree = (await http.get(f"/api/entities/{info.entity_id}/tree")).json()["items"]
            refused = await http.post("/api/fork", json={"turn_id": tree[0]["id"]})
            assert refused.status_code == 501
            assert refused.json()["error"]["code"] == "unsupported"
            assert "capabilities.viewer_fork" in refused.json()["error"]["message"]
            assert await backend.sessions() == [await backend.find(info.session_id)]  # none made


@contextmanager
def viewing(path: Path | str, *extra: str, env: dict[str, str] | None = None) -> Iterator[str]:
    process = subprocess.Popen(
        [CANTRIP, "loom", str(path), "view", "--port", "0", *extra],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        assert "viewing" in line, line
        yield line.strip().rsplit(" ", 1)[-1].rstrip("/")
        process.terminate()
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_loom_view_serves_a_file_read_only_and_follows_it(tmp_path: Path) -> None:
    path = tmp_path / "loom.jsonl"
    build(path).close()
    before = path.read_bytes()
    with viewing(path) as url, httpx.Client(base_url=url, timeout=10) as http:
        assert "cantrip loom" in http.get("/").text
        overview = http.get("/api/loom").json()
        assert overview == {"turns": 10, "entities": 3, "live": False, "source": "loom.jsonl"}
        refused = http.post("/api/fork", json={"turn_id": "turn-a1"})
        assert refused.status_code == 405 and "read-only" in refused.json()["error"]["message"]
        assert http.post("/sessions").status_code == 404  # no session routes here
        assert path.read_bytes() == before
        # Another process appends: the next request sees it.
        from cantrip.loom import Loom

        writer = Loom.open(path)
        writer.append(Turn("turn-a7", "turn-a6", "entity-a", 7, utterance="again"))
        writer.close()
        assert http.get("/api/entities/entity-a/tree").json()["total"] == 11


def test_loom_view_needs_a_token_beyond_loopback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CANTRIP_TOKEN", raising=False)
    path = tmp_path / "loom.jsonl"
    build(path).close()
    refused = subprocess.run(
        [CANTRIP, "loom", str(path), "view", "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        "cantrip: cantrip loom view on 0.0.0.0 (not loopback) needs a token: pass --token "
        "or set CANTRIP_TOKEN, and send it as 'Authorization: Bearer <token>'"
    )
    with pytest.raises(BindError, match="needs a token"):
        viewer_guard("192.168.1.2", None)
    assert viewer_guard("127.0.0.1", None).token is None
    assert viewer_guard("0.0.0.0", "given").token == "given"
    with (
        viewing(path, env={"CANTRIP_TOKEN": "s3cret-token"}) as url,
        httpx.Client(base_url=url, timeout=10) as http,
    ):
        assert http.get("/").status_code == 200  # the page and its files: code, no loom data
        assert http.get("/ui/app.js").status_code == 200
        refused = http.get("/api/loom")
        assert refused.status_code == 401 and "?token=" in refused.json()["error"]["message"]
        assert http.get("/api/loom?token=s3cret-token").status_code == 401  # header only
        wrong = http.get("/api/loom", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        ok = http.get("/api/loom", headers={"Authorization": "Bearer s3cret-token"})
        assert ok.status_code == 200


def test_loom_view_refuses_other_hosts_and_origins_and_sends_no_referrer(tmp_path: Path) -> None:
    """Issue 28.4: ``cantrip loom FILE view`` had no Host/Origin guard, so a page on
    another site could read the loom through DNS rebinding. The guard ``serve`` has, and
    ``Referrer-Policy: no-referrer`` on every answer (a page address never leaks on)."""
    path = tmp_path / "loom.jsonl"
    build(path).close()
    with viewing(path) as url, httpx.Client(base_url=url, timeout=10) as http:
        rebound = http.get("/api/loom", headers={"host": "evil.example"})
        assert rebound.status_code == 403
        assert rebound.json()["error"] == {
            "code": "bad_host",
            "message": "the Host header 'evil.example' does not name this server",
        }
        page = http.get("/api/loom", headers={"origin": "http://evil.example"})
        assert page.status_code == 403 and page.json()["error"]["code"] == "bad_origin"
        answers = [
            rebound,
            page,
            http.get("/"),
            http.get("/ui/app.js"),
            http.get("/api/loom"),
            http.get("/api/nowhere"),
            http.get("/elsewhere"),
        ]
        assert [a.headers.get("referrer-policy") for a in answers] == ["no-referrer"] * 7
        assert answers[4].json()["turns"] == 10


def test_loom_view_of_a_missing_file_is_an_error(tmp_path: Path) -> None:
    assert loom_main([str(tmp_path / "none.jsonl"), "view"]) == 1


async def test_the_viewer_app_answers_unknown_routes_with_json() -> None:
    sent: list[Any] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        sent.append(message)

    loom = build()
    app = ViewerApp(lambda: loom)
    await app({"type": "http", "method": "GET", "path": "/elsewhere"}, receive, send)
    assert sent[0]["status"] == 404
    assert json.loads(sent[1]["body"])["error"]["code"] == "not_found"
