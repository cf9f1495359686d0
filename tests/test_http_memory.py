"""Memory over HTTP (issue 42, item 6): a session's user, and the memory routes.

``POST /sessions {"user": ...}`` makes every cast of the session carry the ``user`` tag,
so a ``[memory]`` namespace naming ``{user}`` is that user's over HTTP; the user is
fixed at creation. (Both backends carry it: tests/test_session_backend_contract.py.)
"""

from __future__ import annotations

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
