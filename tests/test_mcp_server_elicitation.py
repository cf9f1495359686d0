"""``cantrip mcp`` asks its client when a cast pauses: an approval or an ``ask_user``
question becomes an elicitation of the client that called ``cast``. Driven by the
official SDK's client against a real ``cantrip mcp`` process, at both protocol eras:
2026-07-28 (the call answers ``InputRequiredResult``; the SDK's client asks its
elicitation callback and retries with the answer) and 2025-11-25 (``cantrip mcp``
sends ``elicitation/create`` in the middle of the call)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mcp_types
import pytest
from mcp import Client, StdioServerParameters
from mcp_support import BIN, call, finish
from test_mcp_server import _toml, http_server

from cantrip.loom import Loom

CANTRIP = str(BIN / "cantrip")
SCRIPT = [
    call("echo", text="rm -rf build"),
    call("ask_user", question="Which colour?"),
    finish("painted"),
]
MODES = {"2026-07-28": "auto", "2025-11-25": "legacy"}


def write_spec(folder: Path, script: list[dict[str, Any]] = SCRIPT) -> Path:
    spec = folder / "served.toml"
    spec.write_text(
        "\n".join(
            [
                "[llm]",
                'provider = "scripted"',
                _toml(script),
                "[circle]",
                'medium = "conversation"',
                'gates = ["done", "echo", "ask_user"]',
                'approve = ["echo"]',
                "wards = [{ max_turns = 6 }]",
                "[loom]",
                'path = "served.db"',
            ]
        )
        + "\n"
    )
    return spec


class Person:
    """An elicitation callback that answers from a list and remembers what it saw."""

    def __init__(self, *answers: mcp_types.ElicitResult) -> None:
        self.answers = list(answers)
        self.asked: list[Any] = []

    async def __call__(self, context: Any, params: Any) -> mcp_types.ElicitResult:
        self.asked.append(params)
        return self.answers.pop(0)


def accept(**content: Any) -> mcp_types.ElicitResult:
    return mcp_types.ElicitResult(action="accept", content=content)


def client(spec: Path, person: Person | None, era: str) -> Client:
    return Client(
        StdioServerParameters(command=CANTRIP, args=["mcp", str(spec)]),
        elicitation_callback=person,
        mode=MODES[era],
    )


def loom_calls(folder: Path, entity_id: str) -> list[Any]:
    loom = Loom.open(folder / "served.db")
    try:
        last = loom.last_turn(entity_id)
        assert last is not None
        return [r for t in loom.thread(last.id) for r in t.gate_calls]
    finally:
        loom.close()


@pytest.mark.parametrize("era", sorted(MODES))
async def test_an_approval_and_a_question_are_asked_of_the_client(tmp_path: Path, era: str) -> None:
    spec = write_spec(tmp_path)
    person = Person(accept(approve=True), accept(answer="blue"))
    progress: list[tuple[float, float | None]] = []

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        progress.append((p, total))

    async with client(spec, person, era) as mcp:
        assert mcp.protocol_version == era
        result = await mcp.call_tool("cast", {"intent": "paint"}, progress_callback=on_progress)
    assert not result.is_error, result
    if era == "2025-11-25":  # one request: its turns counted 1, 2, 3 (pauses' checkpoints not)
        assert progress == [(1.0, 6.0), (2.0, 6.0), (3.0, 6.0)]
    else:  # each round is its own request, its turns counted from 1: the approved call's
        # turn; the answered question's turn; then that turn's end and the done turn
        assert [p for p, _ in progress] == [1.0, 1.0, 2.0]
    structured = result.structured_content
    assert structured is not None
    assert (structured["result"], structured["terminated"]) == ("painted", True)
    approval, question = person.asked
    assert approval.message == 'Approve echo({"text": "rm -rf build"})?'
    assert approval.requested_schema["required"] == ["approve"]
    assert question.message == "Which colour?"
    assert question.requested_schema["required"] == ["answer"]
    calls = {r.gate: r for r in loom_calls(tmp_path, structured["entity_id"])}
    assert calls["echo"].result == "rm -rf build"
    assert calls["echo"].detail["approval"]["decision"] == "approve"
    assert calls["ask_user"].result == "blue"


@pytest.mark.parametrize("era", sorted(MODES))
async def test_declined_and_denied_reach_the_entity(tmp_path: Path, era: str) -> None:
    spec = write_spec(tmp_path)
    person = Person(
        accept(approve=False, reason="not that folder"),
        mcp_types.ElicitResult(action="decline"),
    )
    async with client(spec, person, era) as mcp:
        result = await mcp.call_tool("cast", {"intent": "paint"})
    structured = result.structured_content
    assert structured is not None and structured["terminated"]
    calls = {r.gate: r for r in loom_calls(tmp_path, structured["entity_id"])}
    assert calls["echo"].is_error and calls["echo"].result == "denied by the user: not that folder"
    assert calls["ask_user"].is_error
    assert calls["ask_user"].result == "the user declined to answer: declined by the MCP client"


async def test_a_client_without_elicitation_gets_the_paused_result(tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    async with client(spec, None, "2026-07-28") as mcp:
        result = await mcp.call_tool("cast", {"intent": "paint"})
    structured = result.structured_content
    assert structured is not None
    assert structured["reason"] == "paused" and not structured["terminated"]


async def test_over_streamable_http_each_round_is_its_own_request(tmp_path: Path) -> None:
    """Stateless 2026-07-28 over HTTP: the retry is a new POST; the loom carries the
    paused cast between them."""
    from mcp.client.streamable_http import streamable_http_client

    spec = write_spec(tmp_path)
    person = Person(accept(approve=True), accept(answer="green"))
    async with (
        http_server(spec) as url,
        Client(streamable_http_client(url), elicitation_callback=person) as mcp,
    ):
        assert mcp.protocol_version == "2026-07-28"
        result = await mcp.call_tool("cast", {"intent": "paint"})
    structured = result.structured_content
    assert structured is not None and structured["result"] == "painted"
    calls = {r.gate: r for r in loom_calls(tmp_path, structured["entity_id"])}
    assert calls["ask_user"].result == "green"


async def test_an_answer_that_does_not_fill_the_form_is_refused(tmp_path: Path) -> None:
    """A retry whose answer does not fill the form asked is refused (the tool's error,
    naming the field); the cast stays paused in the loom, its pause unanswered."""
    spec = write_spec(tmp_path)
    person = Person(accept(approve="yes please"))
    async with client(spec, person, "2026-07-28") as mcp:
        result = await mcp.call_tool("cast", {"intent": "paint"})
    assert result.is_error
    text = result.content[0].text  # type: ignore[union-attr]
    assert "approve" in text and "yes please" in text
    loom = Loom.open(tmp_path / "served.db")
    try:
        (entity_id,) = list(loom.entities)
        last = loom.last_turn(entity_id)
        assert last is not None and last.extras["pending"]["gate"] == "echo"
    finally:
        loom.close()


async def test_a_forged_request_state_is_a_protocol_error(tmp_path: Path) -> None:
    """``requestState`` is sealed by the SDK: a client that makes one up gets JSON-RPC
    invalid params, and no cast runs."""
    from mcp import MCPError

    spec = write_spec(tmp_path)
    async with client(spec, None, "2026-07-28") as mcp:
        forged = '{"entity_id": "e-1", "pause_id": "pause-1"}'
        with pytest.raises(MCPError) as caught:
            await mcp.session.call_tool(
                "cast",
                {"intent": "paint"},
                input_responses={"pause-1": accept(approve=True)},
                request_state=forged,
                allow_input_required=True,
            )
    assert caught.value.code == mcp_types.INVALID_PARAMS
