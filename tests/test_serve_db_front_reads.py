"""What one prompt costs in session reads on PostgreSQL through each front end (issue
46's leftover): AG-UI, ACP, A2A and ``cantrip mcp``'s ``cast`` read their prompt's
session once and hand what they read (a :data:`~cantrip.protocols.sessions.SessionRef`)
to ``submit``, ``follow`` and ``result``, as the HTTP route does
(tests/test_serve_db_reads.py, whose counting store this module reuses).

Each front end runs in this process over a PostgreSQL backend whose connections count
what is run on them, beside a worker (the loopback model of tests/seam_llm.py); a read
of the session is :data:`~test_serve_db_reads.SESSION_READ` (``DbSessions.get``).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx
import pytest
import trio
from fake_providers import serve
from pg_cluster import fresh_database
from seam_llm import KEY, Holds, SeamOpenAI, spec
from test_serve_db_reads import SESSION_READ, Counted, counting_store

from cantrip._cantrip import Cantrip
from cantrip.distributed._spells import build_spell
from cantrip.distributed._worker import Worker
from cantrip.loom import Loom
from cantrip.loom._model import Turn
from cantrip.protocols.acp._server import AcpServer
from cantrip.protocols.http._serve import serve_http_db
from cantrip.protocols.mcp_server._held import HeldPauses
from cantrip.protocols.mcp_server._server import _run as mcp_cast
from cantrip.protocols.sessions import PostgresBackend, _postgres

pytestmark = pytest.mark.loop_watch  # nothing here may block the trio loop


@pytest.fixture
def reads_db(pg_server: str) -> str:
    return fresh_database(pg_server, "front_reads")


@attrs.define
class Fronts:
    """A ``serve --db`` replica (HTTP, AG-UI, A2A) and a backend of its own (ACP and
    MCP's cast run over it), both counting into ``counted``, beside a worker."""

    http: httpx.AsyncClient
    backend: PostgresBackend
    cantrip: Cantrip
    counted: Counted


@contextlib.asynccontextmanager
async def fronts(url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Fronts]:
    counted = Counted()
    monkeypatch.setenv("SEAM_TEST_KEY", KEY)
    monkeypatch.setattr(_postgres, "PostgresStore", counting_store(counted))
    async with serve(SeamOpenAI(Holds()), "/v1") as base_url, trio.open_nursery() as nursery:
        spell = {"spec": spec(base_url)}
        cantrip = build_spell(spell, Loom())
        await nursery.start(Worker(url, concurrency=2, poll_s=0.2).run)
        (base,) = await nursery.start(
            lambda task_status: serve_http_db(
                spell, cantrip, url, "127.0.0.1", 0, task_status=task_status
            )
        )
        async with (
            PostgresBackend.open(url, spell) as backend,
            httpx.AsyncClient(base_url=base, timeout=60) as http,
        ):
            yield Fronts(http, backend, cantrip, counted)
        nursery.cancel_scope.cancel()


def reads_since(counted: Counted, start: int) -> int:
    return counted.statements(SESSION_READ, start)


async def test_an_agui_run_reads_its_session_once(
    reads_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``POST /agui`` naming a session: its thread's session is found once, and that
    read is what the run's thread, prompt, follow and result take. Before, the run
    read the session five times (find, thread, follow, result, the thread at its end)."""
    async with fronts(reads_db, monkeypatch) as on:
        sid = (await on.http.post("/sessions")).json()["session_id"]
        start = len(on.counted.runs)
        body = {
            "threadId": sid,
            "runId": "run-" + uuid.uuid4().hex[:8],
            "messages": [{"id": "u1", "role": "user", "content": "hi"}],
            "state": {},
            "tools": [],
            "context": [],
            "forwardedProps": {},
        }
        answer = await on.http.post("/agui", json=body)
        assert answer.status_code == 200, answer.text
        assert "RUN_FINISHED" in answer.text and "hi ok #1" in answer.text, answer.text
        assert reads_since(on.counted, start) == 1


async def test_an_a2a_message_to_a_context_reads_its_session_once(
    reads_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SendMessage`` to a known context: the context's session is found once, and
    the task's result is awaited on that read. Before, twice (find, result)."""
    async with fronts(reads_db, monkeypatch) as on:
        sid = (await on.http.post("/sessions")).json()["session_id"]
        start = len(on.counted.runs)
        message = {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}
        request = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "SendMessage",
            "params": {"message": {**message, "contextId": sid}},
        }
        answer = (await on.http.post("/a2a", json=request, headers={"a2a-version": "1.0"})).json()
        task = answer["result"]["task"]
        assert task["status"]["state"] == "TASK_STATE_COMPLETED", answer
        assert task["artifacts"][0]["parts"][0]["text"] == "hi ok #1"
        assert reads_since(on.counted, start) == 1


async def test_an_acp_prompt_reads_its_session_once(
    reads_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``session/prompt``: the session is found once (the request's check that it
    exists), and that read is what the translator, the submit, the follow, the result
    and the answer take. Before, five reads."""
    async with fronts(reads_db, monkeypatch) as on:
        updates: list[Any] = []

        async def notify(message: Any) -> None:
            updates.append(message)

        server = AcpServer(on.cantrip, notify, backend=on.backend)
        async with server.running():
            await server.handle({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                 "params": {"protocolVersion": 1}})  # fmt: skip
            made = await server.handle({"jsonrpc": "2.0", "id": 2, "method": "session/new",
                                        "params": {"cwd": "/tmp", "mcpServers": []}})  # fmt: skip
            assert made is not None and "result" in made, made
            sid = made["result"]["sessionId"]
            start = len(on.counted.runs)
            params = {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]}
            answer = await server.handle(
                {"jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": params}
            )
            assert answer is not None and "result" in answer, answer
            assert answer["result"]["_meta"]["cantrip"]["result"] == "hi ok #1"
            assert any(u["params"]["update"]["sessionUpdate"] == "tool_call" for u in updates)
            assert reads_since(on.counted, start) == 1


async def test_an_mcp_cast_reads_its_session_once(
    reads_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cantrip mcp``'s ``cast`` over a PostgreSQL backend: the session it creates is
    the one read (the create's), handed to the submit, the drive, its follow and its
    result. Before, four (create, find, follow, result)."""
    async with fronts(reads_db, monkeypatch) as on:
        turns: list[Turn] = []
        start = len(on.counted.runs)
        driven = await mcp_cast(on.backend, HeldPauses(), "hi", None, turns.append,
                                False, False, False)  # fmt: skip
        assert driven.cast is not None and driven.cast.result == "hi ok #1"
        assert len(turns) == 3, "each recorded turn reported"
        assert reads_since(on.counted, start) == 1
