"""ACP: a call that needs approval becomes ``session/request_permission``, driven by the
official ``agent-client-protocol`` client against a real ``cantrip acp`` process."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any, cast

import trio
from acp import Client, schema
from acp.stdio import spawn_agent_process
from acp_support import text_block

from cantrip import Loom

CANTRIP = str(Path(sys.executable).with_name("cantrip"))

SPEC = """
[llm]
provider = "scripted"
responses = [
  {{ tool_calls = [{{ gate = "echo", args = {{ text = "rm -rf build" }} }}] }},
  {{ tool_calls = [{{ gate = "done", args = {{ answer = "finished" }} }}] }},
]

[circle]
medium = "conversation"
gates = ["done", "echo"]
wards = [{{ max_turns = 4 }}]
approve = ["echo"]

[loom]
path = "{loom}"
"""


class Editor:
    """An ACP client that answers permission requests with a fixed option."""

    def __init__(self, option: str) -> None:
        self.option = option
        self.asked: list[Any] = []

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        return None

    async def request_permission(
        self, session_id: str, tool_call: Any, options: list[Any], **kwargs: Any
    ) -> schema.RequestPermissionResponse:
        self.asked.append((tool_call, [o.option_id for o in options]))
        return schema.RequestPermissionResponse(
            outcome=schema.AllowedOutcome(option_id=self.option, outcome="selected")
        )


async def drive(spec: Path, option: str) -> tuple[Editor, Any]:
    editor = Editor(option)
    async with spawn_agent_process(
        cast(Client, editor), CANTRIP, "acp", str(spec), cwd=spec.parent
    ) as (conn, _process):
        await conn.initialize(protocol_version=1)
        session = await conn.new_session(cwd=str(spec.parent), mcp_servers=[])
        answer = await conn.prompt(session_id=session.session_id, prompt=[text_block("clean")])
    return editor, answer


def echo_record(loom_path: Path) -> Any:
    loom = Loom.open(loom_path)
    try:
        return next(r for t in loom.turns for r in t.gate_calls if r.gate == "echo")
    finally:
        loom.close()


async def test_an_approval_is_asked_of_the_editor_and_allowed(tmp_path: Path) -> None:
    loom = tmp_path / "loom.db"
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.format(loom=loom))
    editor, answer = await trio.to_thread.run_sync(asyncio.run, drive(spec, "allow_once"))
    assert answer.stop_reason == "end_turn"
    ((tool_call, options),) = editor.asked
    assert options == ["allow_once", "allow_always", "reject_once", "reject_always"]
    assert tool_call.raw_input == {"text": "rm -rf build"}
    assert tool_call.title.startswith("echo(")
    record = echo_record(loom)
    assert record.result == "rm -rf build" and record.detail["approval"]["decision"] == "approve"


async def test_a_rejection_is_an_error_observation_and_the_cast_goes_on(tmp_path: Path) -> None:
    loom = tmp_path / "loom.db"
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.format(loom=loom))
    editor, answer = await trio.to_thread.run_sync(asyncio.run, drive(spec, "reject_once"))
    assert answer.stop_reason == "end_turn" and len(editor.asked) == 1
    record = echo_record(loom)
    assert record.is_error and record.result == "denied by the user: rejected in the editor"
