"""ACP's ``session/list`` on PostgreSQL reads every session in one statement, not one per
session (the N+1 of issue 46's leftover), and says what the in-process walk says.

The loom is written here directly (a PostgreSQL store of the cluster tests/conftest.py
starts): top-level entities with their turns -- a first turn with no intent, intents,
``cwd`` tags, timestamps -- and a child entity, which is no session. The ACP server
lists them over a :class:`~cantrip.protocols.sessions.PostgresBackend` whose
connections count what they run (tests/test_serve_db_reads.py).
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
from pg_cluster import fresh_database
from test_acp import make_spell
from test_serve_db_reads import Counted, counting_store

from cantrip.distributed._work import CWD_TAG
from cantrip.llm._contract import ToolCall
from cantrip.loom import Loom
from cantrip.loom._model import EntityRecord, Turn, TurnMetadata
from cantrip.loom._postgres import PostgresStore
from cantrip.protocols.acp._server import AcpServer
from cantrip.protocols.sessions import PostgresBackend, _postgres
from cantrip.protocols.sessions._summaries import summaries_in

pytestmark = pytest.mark.loop_watch  # nothing here may block the trio loop

NUL = "\x00"
"""In a turn's text: PostgreSQL's ``jsonb`` and ``->>`` refuse its escape (``json`` and
``->`` keep it), so the listing's statement must not use them."""
DECOYED = 50
SPELL = {"factory": "tests.nowhere:build"}  # nothing is cast: the loom is written here


def seed(url: str, first: int, count: int) -> None:
    """Sessions ``first`` .. ``first + count - 1``: each a top-level entity with three
    turns (a checkpoint-like first turn without an intent, a cast's first turn with
    its intent and, for even ones, a ``cwd`` tag, and its answer, with a NUL) and a
    child entity with a turn of its own; session :data:`DECOYED`'s first turn calls a
    tool with arguments named ``intent`` and ``cwd``."""
    # a call whose arguments hold the keys looked for: the statement's candidate, not
    # the session's intent or cwd (the session is walked alone)
    decoy = (ToolCall("call-1", "echo", {"intent": "not mine", CWD_TAG: "/not/mine"}),)
    store = PostgresStore(url)
    try:
        loom = Loom(store)
        for n in range(first, first + count):
            entity = f"entity-{n:032x}"
            loom.register_entity(EntityRecord(entity, "c", created_at=f"2026-01-01T00:{n:02d}"))
            tags = {CWD_TAG: f"/work/{n}"} if n % 2 == 0 else {}
            stamp = f"2026-02-01T{n:05d}"
            turns = [
                Turn(id=f"t{n}-1", parent_id=None, entity_id=entity, sequence=1,
                     tool_calls=decoy if n == DECOYED else ()),
                Turn(id=f"t{n}-2", parent_id=f"t{n}-1", entity_id=entity, sequence=2,
                     intent=f"paint {n} {NUL if n == 5 else ''}" + "x" * 100, extras=tags),
                Turn(id=f"t{n}-3", parent_id=f"t{n}-2", entity_id=entity, sequence=3,
                     utterance=f"done{NUL}", metadata=TurnMetadata(timestamp=stamp)),
            ]  # fmt: skip
            for turn in turns:
                loom.append(turn)
            child = f"entity-c{n:031x}"
            loom.register_entity(EntityRecord(child, "c", parent_entity_id=entity))
            loom.append(Turn(id=f"c{n}", parent_id=None, entity_id=child, sequence=1, intent="x"))
        loom.close()
    finally:
        store.close()


async def listed(server: AcpServer, counted: Counted, cursor: str | None = None) -> Any:
    """A ``session/list`` answer, and the statements it ran."""
    start = len(counted.runs)
    params = {} if cursor is None else {"cursor": cursor}
    answer = await server.handle(
        {"jsonrpc": "2.0", "id": 1, "method": "session/list", "params": params}
    )
    assert answer is not None and "result" in answer, answer
    return answer["result"], len(counted.runs) - start


async def test_session_list_reads_one_session_or_fifty_in_as_many_statements(
    pg_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1 session and 50 sessions are listed in the same number of statements (before,
    one more per session: 2 against 51), and the list is the walk's: titles, times,
    ``cwd`` s (the agent's own for a session that recorded none), newest first, no
    child entity."""
    url = fresh_database(pg_server, "acp_list")
    counted = Counted()
    monkeypatch.setattr(_postgres, "PostgresStore", counting_store(counted))
    await trio.to_thread.run_sync(seed, url, 0, 1)
    async with PostgresBackend.open(url, SPELL) as backend:
        server = AcpServer(make_spell([]), backend=backend)
        async with server.running():
            one, for_one = await listed(server, counted)
            await trio.to_thread.run_sync(seed, url, 1, 49)
            fifty, for_fifty = await listed(server, counted)
            walked = await backend.read_loom(summaries_in)
            await trio.to_thread.run_sync(seed, url, DECOYED, 1)
            decoys, for_decoy = await listed(server, counted)
            walked_decoy = await backend.read_loom(summaries_in)
    assert [s["sessionId"] for s in one["sessions"]] == ["session-" + "0" * 32]
    assert for_one == for_fifty, (for_one, for_fifty)
    assert for_fifty == 1
    sessions = fifty["sessions"]
    assert len(sessions) == 50 and "nextCursor" not in fifty
    assert sessions == [
        {
            "sessionId": s.session_id,
            "cwd": s.cwd if s.cwd is not None else server.cwd,
            "title": s.title,
            "updatedAt": s.updated_at,
        }
        for s in walked
    ]
    newest = sessions[0]
    assert newest["sessionId"] == f"session-{49:032x}"
    assert newest["title"] == ("paint 49 " + "x" * 100)[:80]
    assert newest["updatedAt"] == "2026-02-01T00049" and newest["cwd"] == server.cwd
    assert sessions[1]["cwd"] == "/work/48"
    # a candidate that is not what was looked for: that session alone is walked
    assert for_decoy == 2
    decoyed = decoys["sessions"][0]
    assert decoyed["sessionId"] == f"session-{DECOYED:032x}"
    assert decoyed["title"].startswith("paint 50 ") and decoyed["cwd"] == "/work/50"
    assert [(s["sessionId"], s["title"], s["cwd"]) for s in decoys["sessions"]] == [
        (s.session_id, s.title, s.cwd if s.cwd is not None else server.cwd) for s in walked_decoy
    ]
