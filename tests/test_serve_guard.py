"""``cantrip serve`` under hostile and careless requests (issues 20 and 21).

A real server (hypercorn's trio worker on 127.0.0.1, an ephemeral port) is
driven by httpx, except where virtual time is the point (idle eviction, slow
bodies), which drive the guard and the session limits directly under trio's
MockClock.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

import cantrip
from cantrip.protocols.http._serve import process_app, serve_http
from cantrip.protocols.middleware._guard import BindError, Guard
from cantrip.protocols.middleware._lifecycle import ServeOptions
from cantrip.protocols.sessions._hub import SessionError, SessionHub
from cantrip.protocols.sessions._limits import SessionLimits, make_room
from cantrip.spec import build_cantrip, parse_spec

pytestmark = pytest.mark.loop_watch  # nothing here may block the trio loop (issue 28)

CANTRIP = str(Path(sys.executable).with_name("cantrip"))


def make_spell(loom: Path | None = None) -> cantrip.Cantrip:
    answers = [
        {"tool_calls": [{"gate": "done", "args": {"answer": f"answer {i}"}}]} for i in range(20)
    ]
    doc: dict[str, Any] = {
        "llm": {"provider": "scripted", "responses": answers},
        "circle": {"medium": "conversation", "gates": ["done"], "wards": [{"max_turns": 3}]},
    }
    if loom is not None:
        doc["loom"] = {"path": str(loom)}
    return build_cantrip(parse_spec(doc))


@asynccontextmanager
async def serving(
    spell: cantrip.Cantrip, **options: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(lambda task_status: serve_http(
            spell, "127.0.0.1", 0, task_status=task_status, **options
        ))  # fmt: skip
        async with httpx.AsyncClient(base_url=binds[0], timeout=20) as http:
            yield http, binds[0]
        nursery.cancel_scope.cancel()


async def session_count(http: httpx.AsyncClient) -> int:
    return len((await http.get("/sessions")).json()["sessions"])


# -- issue 21.4: a web page cannot drive a local server ------------------------------------


async def test_a_foreign_host_or_origin_is_refused_and_nothing_happens() -> None:
    async with serving(make_spell()) as (http, _):
        rebinding = await http.post("/sessions", headers={"host": "attacker.example:8000"})
        assert rebinding.status_code == 403
        assert rebinding.json()["error"]["code"] == "bad_host"
        listing = await http.get("/sessions", headers={"host": "attacker.example"})
        assert listing.status_code == 403, "nor can it list the sessions"
        # a cross-site "simple" request: text/plain body, no preflight
        cross_site = await http.post(
            "/sessions",
            content=b'{"x": 1}',
            headers={"origin": "https://evil.example", "content-type": "text/plain"},
        )
        assert cross_site.status_code == 403
        assert cross_site.json()["error"]["code"] == "bad_origin"
        plain = await http.post("/sessions", content=b"{}", headers={"content-type": "text/plain"})
        assert plain.status_code == 400
        assert plain.json()["error"]["code"] == "bad_content_type"
        assert await session_count(http) == 0, "no request created a session"
        # the server's own origin, and loopback names, are fine
        port = http.base_url.port
        own = await http.post("/sessions", headers={"origin": f"http://127.0.0.1:{port}"})
        assert own.status_code == 201
        local = await http.get("/health", headers={"host": f"localhost:{port}"})
        assert local.status_code == 200


async def test_allowed_origins_and_hosts_can_be_configured() -> None:
    guard = Guard(
        allow_origins=frozenset({"http://localhost:3000"}), allow_hosts=frozenset({"box"})
    )
    async with serving(make_spell(), guard=guard) as (http, _):
        ok = await http.post("/sessions", headers={"origin": "http://localhost:3000"})
        assert ok.status_code == 201
        assert (await http.get("/health", headers={"host": "box:80"})).status_code == 200
        other = await http.post("/sessions", headers={"origin": "http://localhost:3001"})
        assert other.status_code == 403


async def test_a_token_is_required_when_configured() -> None:
    async with serving(make_spell(), guard=Guard(token="s3cret-token-123")) as (http, _):
        assert (await http.post("/sessions")).status_code == 401
        wrong = await http.post("/sessions", headers={"authorization": "Bearer s3cret-token-124"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "unauthorized"
        assert (await http.get("/sessions")).status_code == 401
        right = await http.post("/sessions", headers={"authorization": "Bearer s3cret-token-123"})
        assert right.status_code == 201


async def _answer_to(url: str, request: bytes) -> tuple[str, bytes]:
    """The status line and headers the server sends to ``request`` (raw bytes on a
    fresh connection, nothing more sent), and what the connection carries after it."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(request)
        received = b""
        with trio.fail_after(20):
            while b"\r\n\r\n" not in received:
                chunk = await stream.receive_some()
                assert chunk, f"closed before the answer: {received!r}"
                received += chunk
            head, _, rest = received.partition(b"\r\n\r\n")
            length = int(re.search(rb"(?im)^content-length: *(\d+)", head)[1])  # type: ignore[index]
            while len(rest) < length:
                rest += await stream.receive_some()
            with trio.move_on_after(2):  # a kept-alive connection stays open: no EOF
                while chunk := await stream.receive_some():
                    rest += chunk
                rest += b"<EOF>"
    return head.decode("latin-1").lower(), rest[length:]


async def test_a_refusal_before_the_body_is_read_says_the_connection_closes() -> None:
    """A request refused before its body was read (no token, a foreign origin, too
    large) leaves unread bytes on the connection, so the server closes it after the
    answer. The answer must say so (``Connection: close``): a client that took the
    connection for kept-alive sent its next request into the closing socket and
    failed with "Server disconnected" (seen under load at an AG-UI replica). A
    refusal of a request with no body keeps the connection alive."""
    async with serving(make_spell(), guard=Guard(token="s3cret-token-123")) as (_, url):
        no_token = (
            b"POST /sessions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
            b"content-type: application/json\r\ncontent-length: 2\r\n\r\n"
        )  # the body ({}) is not sent yet: the refusal comes before it
        head, after = await _answer_to(url, no_token)
        assert head.startswith("http/1.1 401") and "\r\nconnection: close" in head, head
        assert after == b"<EOF>", "and the server did close it"
        without_body = b"GET /sessions HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"
        head, after = await _answer_to(url, without_body)
        assert head.startswith("http/1.1 401") and "connection: close" not in head, head
        assert after == b"", "a request without a body leaves the connection reusable"


async def test_with_a_token_the_viewer_page_and_its_files_are_public_the_api_is_not() -> None:
    """The viewer's page and files are code shipped in the package, no loom data: they
    load without a token (the page's script takes ?token= into the tab and out of the
    address, issue 28.4). Every data route needs the header; a token in a URL is never
    accepted (URLs end up in history, logs and Referer)."""
    token = "s3cret-token-123"
    async with serving(make_spell(), guard=Guard(token=token)) as (http, _):
        page = await http.get("/")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert page.headers["referrer-policy"] == "no-referrer"
        assert (await http.get("/ui/app.js")).status_code == 200
        refused = await http.get("/api/entities")
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert refused.json()["error"] == {
            "code": "unauthorized",
            "message": "send 'Authorization: Bearer <token>' (in a browser: add ?token= and "
            "the token to the viewer's address)",
        }
        assert (await http.get(f"/api/entities?token={token}")).status_code == 401
        assert (await http.get(f"/sessions?token={token}")).status_code == 401
        timeline = "/api/entities/entity-x/timeline"  # issue 45: the cast's waterfall too
        assert (await http.get(timeline)).status_code == 401
        assert (await http.get(f"{timeline}?token={token}")).status_code == 401
        assert (await http.get("/ui/timeline.js")).status_code == 200
        assert (await http.get("/api/compare?a=x&b=y")).status_code == 401  # and Compare
        assert (await http.get("/ui/compare.js")).status_code == 200
        for evals in ("/api/evals", "/api/evals/eval-x?status=failed", "/api/evals/a/vs/b"):
            assert (await http.get(evals)).status_code == 401  # and the eval runs
            joiner = "&" if "?" in evals else "?"
            assert (await http.get(f"{evals}{joiner}token={token}")).status_code == 401
        assert (await http.get("/ui/evals.js")).status_code == 200
        authorized = {"authorization": f"Bearer {token}"}
        assert (await http.get("/api/entities", headers=authorized)).status_code == 200
        assert (await http.get("/api/evals", headers=authorized)).json()["total"] == 0
        missing = await http.get("/api/evals/eval-x", headers=authorized)  # past the guard
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "unknown_run"
        unknown = await http.get(timeline, headers=authorized)  # past the guard: the viewer's 404
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_entity"


def test_a_server_beyond_loopback_refuses_to_start_without_a_token(tmp_path: Path) -> None:
    with pytest.raises(BindError, match="needs a token"):
        Guard(bind_host="0.0.0.0").check_bind()
    Guard(bind_host="0.0.0.0", token="t0ken-value").check_bind()
    Guard(bind_host="::1").check_bind()
    spec = tmp_path / "spec.toml"
    spec.write_text(
        '[llm]\nprovider = "scripted"\nresponses = []\n'
        '[circle]\nmedium = "conversation"\ngates = ["done"]\nwards = [{max_turns = 2}]\n'
    )
    env = {"PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [CANTRIP, "serve", str(spec), "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "cantrip: serving on 0.0.0.0 (not loopback) needs a token: pass --token or set "
        "CANTRIP_TOKEN, and send it as 'Authorization: Bearer <token>'"
    ]


# -- issue 21.5 and issue 20: bodies ---------------------------------------------------------


async def test_deeply_nested_json_is_a_json_400_and_the_server_keeps_serving() -> None:
    async with serving(make_spell()) as (http, _):
        sid = (await http.post("/sessions")).json()["session_id"]
        for path in ("/sessions", f"/sessions/{sid}/prompt"):
            deep = await http.post(
                path, content=b"[" * 200_000, headers={"content-type": "application/json"}
            )
            assert deep.status_code == 400
            assert deep.json() == {
                "error": {"code": "bad_json", "message": "the body is not JSON: nested too deeply"}
            }
        ok = await http.post(f"/sessions/{sid}/prompt", json={"prompt": "go"})
        assert ok.status_code == 200 and ok.json()["result"] == "answer 0"


async def test_malformed_bodies_create_nothing() -> None:
    async with serving(make_spell()) as (http, _):
        for body in (b"{not json", b'{"prompt": "x"', b"\xff\xfe"):
            bad = await http.post(
                "/sessions", content=body, headers={"content-type": "application/json"}
            )
            assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_json"
        unknown = await http.post("/sessions", json={"model": "gpt-9"})
        assert unknown.status_code == 400 and unknown.json()["error"]["code"] == "bad_request"
        assert await session_count(http) == 0
        sid = (await http.post("/sessions", json={})).json()["session_id"]
        surrogate = await http.post(
            f"/sessions/{sid}/prompt",
            content=b'{"prompt": "bad \\ud800 text"}',
            headers={"content-type": "application/json"},
        )
        assert surrogate.status_code == 400
        assert "unicode" in surrogate.json()["error"]["message"].lower()
        both = await http.post(f"/sessions/{sid}/prompt", json={"prompt": "a", "intent": "b"})
        assert both.status_code == 400
        thread = (await http.get(f"/sessions/{sid}/thread")).json()
        assert thread["turns"] == [], "nothing was cast, nothing recorded"


async def test_bodies_over_the_limit_are_413_declared_or_streamed() -> None:
    async with serving(make_spell(), guard=Guard(max_body=1000)) as (http, _):
        sid = (await http.post("/sessions")).json()["session_id"]
        big = {"prompt": "x" * 2000}
        declared = await http.post(f"/sessions/{sid}/prompt", json=big)
        assert declared.status_code == 413 and declared.json()["error"]["code"] == "too_large"

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(20):
                yield b" " * 100

        # The server answers 413 and closes the connection while the client may
        # still be sending (RFC 9110 15.5.14 allows closing it); depending on the
        # timing the client reads the 413 or sees the connection closed.
        try:
            streamed = await http.post(
                f"/sessions/{sid}/prompt",
                content=chunks(),
                headers={"content-type": "application/json"},
            )
        except httpx.RemoteProtocolError:
            pass
        else:
            assert streamed.status_code == 413
        # the refused connections are closed; the server goes on serving new ones
        async with httpx.AsyncClient(base_url=str(http.base_url), timeout=20) as fresh:
            ok = await fresh.post(f"/sessions/{sid}/prompt", json={"prompt": "small"})
        assert ok.status_code == 200


async def test_the_default_body_limit_is_one_mebibyte() -> None:
    async with serving(make_spell()) as (http, _):
        sid = (await http.post("/sessions")).json()["session_id"]
        response = await http.post(f"/sessions/{sid}/prompt", json={"prompt": "x" * 10_000_000})
        assert response.status_code == 413
        assert "1048576" in response.json()["error"]["message"]


# -- issue 20: sessions are capped, idle ones leave memory and come back ---------------------


async def test_the_session_cap_evicts_the_least_recently_used_and_it_resumes(
    tmp_path: Path,
) -> None:
    spell = make_spell(tmp_path / "loom.db")
    try:
        async with serving(spell, limits=SessionLimits(max_sessions=2)) as (http, _):
            first = (await http.post("/sessions")).json()["session_id"]
            answer = await http.post(f"/sessions/{first}/prompt", json={"prompt": "remember"})
            assert answer.json()["result"] == "answer 0"
            second = (await http.post("/sessions")).json()["session_id"]
            third = (await http.post("/sessions")).json()["session_id"]
            live = [s["session_id"] for s in (await http.get("/sessions")).json()["sessions"]]
            assert live == [second, third], "the least recently used session left memory"
            back = await http.get(f"/sessions/{first}/thread")
            assert back.status_code == 200, "and resumes from the loom when named again"
            assert [t["intent"] for t in back.json()["turns"] if t["intent"]] == ["remember"]
            assert await session_count(http) == 2
    finally:
        spell.loom.close()


async def test_idle_sessions_are_evicted_in_virtual_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    hub = SessionHub(make_spell())
    limits = SessionLimits(max_sessions=3, idle_s=60)
    quiet, busy = hub.new(), hub.new()
    await trio.sleep(30)
    recent = hub.new()
    busy.running = trio.CancelScope()  # a prompt in progress is never dropped
    await trio.sleep(45)
    await make_room(hub, limits, adding=False)
    assert set(hub.sessions) == {busy.id, recent.id}
    assert hub.get(quiet.id).entity_id == quiet.entity_id, "named again, it is back"
    for session in hub.sessions.values():  # three live, all busy: a fourth is refused
        session.running = trio.CancelScope()
    with pytest.raises(SessionError, match="live and busy"):
        await make_room(hub, limits, adding=True)
    for session in hub.sessions.values():
        session.running = None
    await hub.aclose()


async def test_a_body_that_never_arrives_times_out(autojump_clock: trio.testing.MockClock) -> None:
    sent: list[Mapping[str, Any]] = []

    async def never() -> Mapping[str, Any]:
        await trio.sleep_forever()
        raise AssertionError

    async def send(message: Mapping[str, Any]) -> None:
        sent.append(message)

    app = Guard(body_timeout_s=30).wrap(process_app(make_spell()))
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/sessions",
        "headers": [
            (b"host", b"127.0.0.1:8000"),
            (b"content-type", b"application/json"),
            (b"content-length", b"100"),
        ],
    }
    start = trio.current_time()
    await app(scope, never, send)
    assert trio.current_time() - start == pytest.approx(30)
    assert sent[0]["status"] == 408
    assert b'"timeout"' in sent[1]["body"]


def test_slow_clients_are_dropped_by_the_read_timeout() -> None:
    """A client that opens a connection and sends nothing is disconnected.

    hypercorn closes such a connection once both its read timeout and its
    keep-alive timer have run out, so the test sets both short."""

    async def main() -> bytes:
        options = ServeOptions(keep_alive_s=1)
        async with serving(make_spell(), read_timeout_s=1, options=options) as (_, url):
            port = int(url.rsplit(":", 1)[1])
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(b"POST /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                sock.settimeout(20)
                return await trio.to_thread.run_sync(sock.recv, 100)

    assert trio.run(main) == b"", "the server closed the silent connection"


def slow_spell(delay_ms: int) -> cantrip.Cantrip:
    """A spell whose one answer takes ``delay_ms`` of its model's time."""
    answer = {"tool_calls": [{"gate": "done", "args": {"answer": "late"}}], "delay_ms": delay_ms}
    doc: dict[str, Any] = {
        "llm": {"provider": "scripted", "responses": [answer]},
        "circle": {"medium": "conversation", "gates": ["done"], "wards": [{"max_turns": 3}]},
    }
    return build_cantrip(parse_spec(doc))


async def test_a_prompt_that_runs_longer_than_the_read_timeout_gets_its_answer() -> None:
    """The read timeout drops a client that stops sending its request, not one that waits
    for the answer: before, a prompt that ran past ``--client-timeout`` (30 s) had its
    connection cut ("server disconnected without sending a response")."""
    async with serving(slow_spell(2500), read_timeout_s=1) as (http, _):
        sid = (await http.post("/sessions")).json()["session_id"]
        response = await http.post(f"/sessions/{sid}/prompt", json={"prompt": "slow"})
    assert response.status_code == 200, response.text
    assert response.json()["result"] == "late"


async def test_a_stream_outlives_the_read_timeout() -> None:
    """A prompt's event stream that lasts past the read timeout is told to its end."""
    async with serving(slow_spell(2500), read_timeout_s=1) as (http, _):
        sid = (await http.post("/sessions")).json()["session_id"]
        async with http.stream(
            "POST",
            f"/sessions/{sid}/prompt",
            json={"prompt": "slow"},
            headers={"accept": "text/event-stream"},
        ) as response:
            lines = [line async for line in response.aiter_lines()]
    events = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    assert events[0] == "prompt" and events[-1] == "result", events


def test_a_silent_client_is_still_dropped_after_an_answered_request() -> None:
    """Once a request is answered, the read timeout (with the keep-alive timer) counts
    again: a client that then starts a request and stops sending is disconnected."""

    async def main() -> bytes:
        options = ServeOptions(keep_alive_s=1)
        async with serving(make_spell(), read_timeout_s=1, options=options) as (_, url):
            port = int(url.rsplit(":", 1)[1])
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.settimeout(20)
                sock.sendall(
                    b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                    b"POST /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                )
                received = b""
                while chunk := await trio.to_thread.run_sync(sock.recv, 4096):
                    received += chunk
                return received

    received = trio.run(main)
    assert received.startswith(b"HTTP/1.1 200"), received[:100]
    assert received.count(b"HTTP/1.1 ") == 1, "the half-sent request got no answer"


def test_a_token_given_as_a_flag_is_redacted_like_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cantrip._redact import redact
    from cantrip.cli import _protocols as _cli

    monkeypatch.setenv("CANTRIP_TOKEN", "")  # restored after the test
    assert _cli._token(None) is None
    assert _cli._token("flag-token-value-77") == "flag-token-value-77"
    assert redact("Bearer-less flag-token-value-77 echoed") == "Bearer-less [REDACTED] echoed"


async def test_the_memory_routes_are_behind_the_guard_and_token(tmp_path: Path) -> None:
    """``/memory/...`` (issue 42) answer only with the token, like every data route, and a
    foreign origin cannot forget anything."""
    doc: dict[str, Any] = {
        "llm": {"provider": "scripted", "responses": []},
        "circle": {"medium": "conversation", "gates": ["done"], "wards": [{"max_turns": 2}]},
        "loom": {"path": str(tmp_path / "loom.db")},
        "memory": {"namespace": ["user", "{user}"]},
    }
    spell = build_cantrip(parse_spec(doc))
    from cantrip.memory import memory_for

    store = memory_for(spell.loom.store)
    store.put(("user", "alice"), "drink", "Alice likes tea")
    token = "s3cret-token-123"
    authorized = {"authorization": f"Bearer {token}"}
    routes = [
        ("GET", "/memory/namespaces", {}),
        ("GET", "/memory/items", {"q": "tea"}),
        ("GET", "/memory/item", {"namespace": "user/alice", "key": "drink"}),
        ("DELETE", "/memory/items", {"namespace": "user/alice"}),
    ]
    try:
        async with serving(spell, guard=Guard(token=token)) as (http, _):
            for method, path, params in routes:
                refused = await http.request(method, path, params=params)
                assert refused.status_code == 401, (path, refused.text)
                with_query = await http.request(method, path, params={**params, "token": token})
                assert with_query.status_code == 401  # never a token in a URL
                foreign = await http.request(
                    method, path, params=params,
                    headers={**authorized, "origin": "http://evil.example"},
                )  # fmt: skip
                assert foreign.status_code == 403
            assert store.get(("user", "alice"), "drink") is not None  # nothing forgotten
            for method, path, params in routes:
                answered = await http.request(method, path, params=params, headers=authorized)
                assert answered.status_code == 200, (path, answered.text)
            assert store.get(("user", "alice"), "drink") is None
    finally:
        store.close()
        spell.loom.close()
