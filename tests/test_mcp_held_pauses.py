"""What ``cantrip mcp`` does with a pause nobody comes back for (issue 44 leftovers).

Two ways a served cast can wait on its client with no request open: a task waiting for
input (``tasks/cancel`` must end it, whether the cast ended paused or a child waits in
place inside a running call), and a pause left for the next request at 2026-07-28
(``InputRequiredResult``): held for ``--input-ttl`` seconds, then its running prompt is
cut off (recorded ``cancelled``) and its session let go of -- not held in memory for
ever. Against a real ``cantrip mcp`` process and the official SDK client.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mcp_types
import pytest
import trio
from mcp import Client, StdioServerParameters
from mcp_support import BIN
from test_mcp_client_tasks import served_spec
from test_mcp_server_elicitation import Person, accept, write_spec
from test_mcp_tasks import CancelTask, CreatedTask, GetTask, TaskParams, Tasks, TaskState

from cantrip.loom import Loom

CANTRIP = str(BIN / "cantrip")


def _reasons(folder: Path) -> list[tuple[str, str | None]]:
    """(entity, reason) of every truncated turn the served loom holds."""
    loom = Loom.open(folder / "served.db")
    try:
        return [(t.entity_id, t.reason) for t in loom.turns if t.truncated]
    finally:
        loom.close()


async def _state(session: Any, task_id: str) -> TaskState:
    return await session.send_request(GetTask(params=TaskParams(taskId=task_id)), TaskState)


@pytest.mark.parametrize("where", ["root", "child"])
async def test_tasks_cancel_ends_a_task_that_waits_for_input(tmp_path: Path, where: str) -> None:
    """``root``: the cast ended paused on its own approval (no prompt runs: cancelling
    the prompt cut nothing off, and the task stayed ``input_required`` for ever);
    ``child``: a child waits in place inside the parent's running call (the prompt was
    cancelled but the task stayed stuck asking)."""
    spec = write_spec(tmp_path) if where == "root" else served_spec(tmp_path)
    nobody = Person()  # declares elicitation; a task's questions are polled, not sent
    async with Client(
        StdioServerParameters(command=CANTRIP, args=["mcp", str(spec)]),
        elicitation_callback=nobody,
        extensions=[Tasks()],
    ) as mcp:
        session = mcp.session
        created = await session.call_tool("cast", {"intent": "paint"}, allow_claimed=True)
        assert isinstance(created, CreatedTask)
        with trio.fail_after(30):
            while (state := await _state(session, created.task_id)).status != "input_required":
                await trio.sleep(0.05)
        assert state.input_requests
        await session.send_request(
            CancelTask(params=TaskParams(taskId=created.task_id)), mcp_types.EmptyResult
        )
        with trio.fail_after(15):
            while (state := await _state(session, created.task_id)).status != "cancelled":
                assert state.status in ("input_required", "working"), state
                await trio.sleep(0.05)
        assert not state.input_requests
    assert not nobody.asked
    reasons = _reasons(tmp_path)
    if where == "child":  # the running call was cut off, and the loom says so
        assert "cancelled" in {reason for _, reason in reasons}, reasons
    else:  # nothing ran or was cut off: the cast stays as it ended, paused on its approval
        assert reasons == []
        loom = Loom.open(tmp_path / "served.db")
        try:
            phases = [t.extras.get("phase") for t in loom.turns]
            echoes = [r for t in loom.turns for r in t.gate_calls if r.gate == "echo"]
        finally:
            loom.close()
        assert phases[-1] is not None, phases  # its last turn is the pause's checkpoint
        assert all("approval" not in r.detail for r in echoes), echoes


async def test_a_pause_left_for_the_next_request_is_let_go_of_after_its_ttl(
    tmp_path: Path,
) -> None:
    """2026-07-28 without tasks: a child's approval waits in place in the server while
    the call answers ``InputRequiredResult``. The client never answers in time: after
    ``--input-ttl`` the waiting call is cut off and recorded ``cancelled``; the late
    answer is refused as no longer pending (a tool error), nothing runs."""
    spec = served_spec(tmp_path)
    asked: list[Any] = []

    async def late(context: Any, params: Any) -> mcp_types.ElicitResult:
        asked.append(params)
        with trio.fail_after(30):  # before the fix the call waited for ever
            while "cancelled" not in {reason for _, reason in _reasons(tmp_path)}:
                await trio.sleep(0.1)
        return accept(approve=True)

    async with Client(
        StdioServerParameters(command=CANTRIP, args=["mcp", str(spec), "--input-ttl", "1"]),
        elicitation_callback=late,
        mode="auto",
    ) as mcp:
        assert mcp.protocol_version == "2026-07-28"
        result = await mcp.call_tool("cast", {"intent": "delegate"})
    assert len(asked) == 1
    assert result.is_error, result
    text = result.content[0].text  # type: ignore[union-attr]
    assert "not pending" in text, text
    loom = Loom.open(tmp_path / "served.db")
    try:
        echoes = [r for t in loom.turns for r in t.gate_calls if r.gate == "echo"]
    finally:
        loom.close()
    assert all(r.detail.get("approval", {}).get("decision") != "approve" for r in echoes)


def test_the_input_ttl_must_be_positive(tmp_path: Path) -> None:
    import subprocess

    spec = write_spec(tmp_path)
    done = subprocess.run(
        [CANTRIP, "mcp", str(spec), "--input-ttl", "0"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "--input-ttl" in done.stderr
