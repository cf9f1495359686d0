"""``cantrip acp --db URL``: ACP over PostgreSQL sessions, prompts run by a worker.

Everything is real and started here: a PostgreSQL cluster (tests/conftest.py), the
loopback OpenAI server of tests/serve_db_llm.py (echo, echo, then ``done`` with
``"<prompt> ok #<n>"``), one ``cantrip worker --db`` process, and ``cantrip acp --db``
processes driven by the official ``agent-client-protocol`` client: a session made by
one editor is listed, resumed, loaded, prompted and cancelled by the next, then deleted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from acp import RequestError
from acp.stdio import spawn_agent_process
from acp_support import as_client, text_block
from pg_cluster import fresh_database
from test_acp_stable import CANTRIP, Editor, run
from test_serve_db import Stack, open_stack


@pytest.fixture(scope="module")
def stack(pg_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("acp-db")
    holds = root / "holds"
    holds.mkdir()
    url = fresh_database(pg_server, "acp_db")
    with open_stack(url, root, replicas=0, SERVE_DB_LLM_HOLD_DIR=str(holds)) as built:
        yield built


def agent(stack: Stack, editor: Editor) -> Any:
    return spawn_agent_process(
        as_client(editor), CANTRIP, "acp", str(stack.spec), "--db", stack.url, env=stack.env
    )


async def wait_for_file(path: Path) -> None:
    async def loop() -> None:
        while not path.exists():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(loop(), 60)


async def test_a_session_on_postgresql_is_listed_resumed_loaded_cancelled_and_deleted(
    stack: Stack, tmp_path: Path
) -> None:
    holds = Path(stack.env["SERVE_DB_LLM_HOLD_DIR"])

    async def first() -> dict[str, Any]:
        editor = Editor()
        async with agent(stack, editor) as (conn, _):
            init = await conn.initialize(protocol_version=1)
            sid = (await conn.new_session(cwd=str(tmp_path))).session_id
            answer = await conn.prompt(session_id=sid, prompt=[text_block("Paint it blue.")])
            return {"init": init, "sid": sid, "answer": answer, "updates": list(editor.updates)}

    made = await run(first())
    caps = made["init"].agent_capabilities
    assert caps.load_session and caps.session_capabilities.delete is not None
    assert made["answer"].stop_reason == "end_turn"
    assert made["answer"].field_meta["cantrip"]["result"] == "Paint it blue. ok #1"
    kinds = [u.session_update for u in made["updates"]]
    # the worker's recorded turns, each shown as it lands: two echo calls, the answer
    assert kinds.count("tool_call") == 3 and "agent_message_chunk" in kinds
    # each turn's usage as it lands, with the session's cost so far (gpt-5-mini is priced)
    usage = [u for u in made["updates"] if u.session_update == "usage_update"]
    amounts = [u.cost.amount for u in usage]
    assert len(usage) == 3 and all(u.cost.currency == "USD" for u in usage)
    assert 0 < amounts[0] < amounts[1] < amounts[2]
    assert amounts[2] == pytest.approx(made["answer"].field_meta["cantrip"]["costUsd"])
    sid = made["sid"]

    async def second() -> dict[str, Any]:
        editor = Editor()
        out: dict[str, Any] = {}
        async with agent(stack, editor) as (conn, _):
            await conn.initialize(protocol_version=1)
            out["listed"] = await conn.list_sessions()
            await conn.load_session(session_id=sid, cwd=str(tmp_path))
            out["loaded"] = list(editor.updates)
            out["resumed"] = await conn.resume_session(session_id=sid, cwd=str(tmp_path))
            held = asyncio.ensure_future(
                conn.prompt(session_id=sid, prompt=[text_block("hold:cut Paint it red.")])
            )
            await wait_for_file(holds / "cut.held")  # in its last model call, at the worker
            await conn.cancel(session_id=sid)
            out["cancelled"] = await asyncio.wait_for(held, 60)
            (holds / "cut.release").touch()
            editor.updates.clear()
            out["again"] = await conn.prompt(session_id=sid, prompt=[text_block("Green?")])
            out["again_usage"] = [u for u in editor.updates if u.session_update == "usage_update"]
            await conn.delete_session(session_id=sid)
            out["listed_after"] = await conn.list_sessions()
            try:
                await conn.resume_session(session_id=sid, cwd=str(tmp_path))
            except RequestError as exc:
                out["gone"] = exc
        return out

    out = await run(second())
    # listed with the cwd it was created in: the worker recorded it on its casts
    assert {s.session_id: s.cwd for s in out["listed"].sessions}[sid] == str(tmp_path)
    replayed = [u.content.text for u in out["loaded"] if u.session_update == "user_message_chunk"]
    assert replayed == ["Paint it blue."]
    assert out["resumed"].field_meta["cantrip"]["turns"] == 3
    assert out["cancelled"].stop_reason == "cancelled"
    assert out["again"].field_meta["cantrip"]["result"] == "Green? ok #3"
    # the call cut off by the cancel has no known cost (the runtime's rule: never $0),
    # so neither has the session from then on: its usage comes without a cost
    assert out["again_usage"] and all(u.cost is None for u in out["again_usage"])
    assert sid not in [s.session_id for s in out["listed_after"].sessions]
    assert out["gone"].code == -32002
