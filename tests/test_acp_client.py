"""End to end: ``cantrip acp`` as a subprocess, driven by the real ACP client.

The client is the ``agent-client-protocol`` package's asyncio
``ClientSideConnection`` (spawned with its own ``spawn_agent_process``), run
in a worker thread of the trio test. It goes through initialize, a new
session, two prompts (the second uses a variable the first left in the
entity's JavaScript sandbox: same entity, state carried, ENTITY-5/PROD-7), a
cancel in the middle of a slow prompt, a prompt after it (the session
survived), and -- in a second process -- ``session/load`` of that session
from the loom file and one more prompt on it.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path
from typing import Any, cast

import pytest
import trio

pytest.importorskip("acp")

from acp import Client, RequestError, schema
from acp.stdio import spawn_agent_process
from acp_support import text_block

from cantrip import Loom

CANTRIP = str(Path(sys.executable).with_name("cantrip"))

FIRST_PROCESS = """
[llm]
provider = "scripted"
script = "shared"  # one script for the session's four prompts, in order
responses = [
    # prompt 1: leave state in the sandbox
    {{ content = "Noting it.", code = "var colour = 'blue'; done('noted: ' + colour)" }},
    # prompt 2: read the state prompt 1 left (a fresh entity would throw here)
    {{ code = "done('your colour is ' + colour)" }},
    # prompt 3: one quick gate call, then a reply that takes far too long
    {{ code = "echo('working on it')" }},
    {{ code = "done('too late')", delay_ms = 60000 }},
    # prompt 4: after the cancel, the same sandbox still answers
    {{ code = "done('still ' + colour)" }},
]

[circle]
medium = "js"
gates = ["done", "echo"]
wards = [{{ max_turns = 5 }}]

[loom]
path = "{loom}"
"""

SECOND_PROCESS = """
[llm]
provider = "scripted"
responses = [{{ tool_calls = [{{ gate = "done", args = {{ answer = "welcome back" }} }}] }}]

[circle]
medium = "conversation"
gates = ["done", "echo"]
wards = [{{ max_turns = 5 }}]

[loom]
path = "{loom}"
"""


class Recorder:
    """An ACP client that records every session/update it receives."""

    def __init__(self) -> None:
        self.updates: list[tuple[str, Any]] = []
        self.seen = asyncio.Event()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append((session_id, update))
        self.seen.set()

    async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def kinds(self) -> list[str]:
        return [u.session_update for _, u in self.updates]

    def text(self, kind: str = "agent_message_chunk") -> str:
        return "".join(
            u.content.text
            for _, u in self.updates
            if u.session_update == kind and getattr(u.content, "type", "") == "text"
        )


def as_client(recorder: Recorder) -> Client:
    """The recorder implements the part of the Client protocol an agent uses here."""
    return cast(Client, recorder)


async def wait_for(predicate: Any, recorder: Recorder, timeout: float = 20.0) -> None:
    async def loop() -> None:
        while not predicate():
            recorder.seen.clear()
            await recorder.seen.wait()

    await asyncio.wait_for(loop(), timeout)


async def first_process(spec: Path, log: Path) -> dict[str, Any]:
    client = Recorder()
    out: dict[str, Any] = {}
    async with spawn_agent_process(
        as_client(client), CANTRIP, "acp", str(spec), "--log", str(log), cwd=spec.parent
    ) as (conn, _process):
        init = await conn.initialize(protocol_version=1)
        out["init"] = init
        session = await conn.new_session(cwd=str(spec.parent), mcp_servers=[])
        sid = session.session_id
        out["sid"] = sid

        first = await conn.prompt(session_id=sid, prompt=[text_block("My colour is blue.")])
        out["first"] = (first, client.text(), client.kinds())
        client.updates.clear()

        second = await conn.prompt(session_id=sid, prompt=[text_block("What is my colour?")])
        out["second"] = (second, client.text())
        client.updates.clear()

        # A prompt that gets stuck: cancel it once its first turn (a quick code call)
        # is complete, so the cast is waiting for the slow reply.
        running = asyncio.ensure_future(
            conn.prompt(session_id=sid, prompt=[text_block("Take your time.")])
        )

        def first_turn_done() -> bool:
            code_calls = {
                u.tool_call_id
                for _, u in client.updates
                if u.session_update == "tool_call" and u.title == "js"
            }
            return any(
                u.session_update == "tool_call_update"
                and u.tool_call_id in code_calls
                and u.status == "completed"
                for _, u in client.updates
            )

        await wait_for(first_turn_done, client)
        await conn.cancel(session_id=sid)
        cancelled = await asyncio.wait_for(running, 20)
        out["cancelled"] = (cancelled, list(client.updates))
        client.updates.clear()

        fourth = await conn.prompt(session_id=sid, prompt=[text_block("Still there?")])
        out["fourth"] = (fourth, client.text())
    return out


async def second_process(spec: Path, sid: str) -> dict[str, Any]:
    client = Recorder()
    out: dict[str, Any] = {}
    async with spawn_agent_process(
        as_client(client), CANTRIP, "acp", str(spec), cwd=spec.parent
    ) as (
        conn,
        _process,
    ):
        await conn.initialize(protocol_version=1)
        loaded = await conn.load_session(cwd=str(spec.parent), session_id=sid, mcp_servers=[])
        out["loaded"] = (loaded, client.text("user_message_chunk"), client.text())
        client.updates.clear()
        again = await conn.prompt(session_id=sid, prompt=[text_block("I am back.")])
        out["again"] = (again, client.text())
        try:
            await conn.load_session(cwd=str(spec.parent), session_id="session-nope", mcp_servers=[])
        except RequestError as exc:
            out["unknown"] = exc
    return out


async def test_the_real_acp_client_drives_cantrip_acp(tmp_path: Path) -> None:
    loom = tmp_path / "sessions.db"
    first_spec = tmp_path / "first.toml"
    first_spec.write_text(textwrap.dedent(FIRST_PROCESS.format(loom=loom)))
    second_spec = tmp_path / "second.toml"
    second_spec.write_text(textwrap.dedent(SECOND_PROCESS.format(loom=loom)))
    log = tmp_path / "acp.log"

    one = await trio.to_thread.run_sync(asyncio.run, first_process(first_spec, log))

    init: schema.InitializeResponse = one["init"]
    assert init.protocol_version == 1
    assert init.agent_capabilities is not None and init.agent_capabilities.load_session is True
    assert init.agent_info is not None and init.agent_info.name == "cantrip"

    response, text, kinds = one["first"]
    assert response.stop_reason == "end_turn"
    assert text.startswith("Noting it.") and text.endswith("noted: blue")
    # streamed while the cast ran: the text, then the code tool call announced and completed
    assert kinds[0] == "agent_message_chunk"
    assert "tool_call" in kinds and "tool_call_update" in kinds

    response, text = one["second"]
    assert response.stop_reason == "end_turn"
    assert text == "your colour is blue", "the second prompt did not see the first's state"

    response, updates = one["cancelled"]
    assert response.stop_reason == "cancelled"
    assert response.field_meta["cantrip"]["reason"] == "cancelled"
    echo_calls = [u for _, u in updates if getattr(u, "title", None) == "echo"]
    assert [u.status for u in echo_calls] == ["completed"]  # streamed before the cancel

    response, text = one["fourth"]
    assert response.stop_reason == "end_turn" and text == "still blue"
    assert response.field_meta["cantrip"]["entityId"] == "entity-" + one["sid"].removeprefix(
        "session-"
    )

    sid = one["sid"]
    two = await trio.to_thread.run_sync(asyncio.run, second_process(second_spec, sid))
    _loaded, intents, replayed = two["loaded"]
    # the history is replayed before session/load answers
    assert intents.index("My colour is blue.") < intents.index("What is my colour?")
    assert "Take your time." in intents and "Still there?" in intents
    assert "your colour is blue" in replayed
    response, text = two["again"]
    assert response.stop_reason == "end_turn" and text == "welcome back"
    assert two["unknown"].code == -32002

    # The loom holds one thread: every prompt of both processes, in order.
    record = Loom.open(loom)
    try:
        entity = "entity-" + sid.removeprefix("session-")
        turns = record.entity_turns(entity)
        intents_in_loom = [t.intent for t in turns if t.intent]
        assert intents_in_loom == [
            "My colour is blue.",
            "What is my colour?",
            "Take your time.",
            "Still there?",
            "I am back.",
        ]
        assert [t.reason for t in turns if t.truncated] == ["cancelled"]
        assert record.thread(turns[-1].id)[0].intent == "My colour is blue."
    finally:
        record.close()
    assert "session/prompt" in log.read_text(), "the debug log records the exchange"
