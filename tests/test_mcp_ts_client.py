"""A second, independent MCP client against a live ``cantrip mcp``: the official
TypeScript SDK (``@modelcontextprotocol/sdk``, pinned in
``tests/mcp_ts_client/package.json``), run under node by ``tests/mcp_ts_client/run.mjs``.
It speaks up to 2025-11-25, so it exercises the handshake era: ``initialize``,
progress on the call, and the server's ``elicitation/create`` when the cast pauses.
``npm ci`` runs once per checkout (tests/npm_packages.py) (the npm registry is
reachable; the install is bounded in time)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import trio
from mcp_support import BIN
from npm_packages import ensure_npm_packages
from test_mcp_server_elicitation import loom_calls, write_spec

CLIENT = Path(__file__).parent / "mcp_ts_client"


async def ensure_client() -> None:
    await ensure_npm_packages(CLIENT, "@modelcontextprotocol/sdk")


async def ts_client(spec: Path, intent: str, *answers: dict[str, Any]) -> dict[str, Any]:
    await ensure_client()
    node = shutil.which("node")
    assert node is not None
    with trio.fail_after(90):
        done = await trio.run_process(
            [node, "run.mjs", str(BIN / "cantrip"), str(spec), intent]
            + [json.dumps(a) for a in answers],
            cwd=CLIENT,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode()  # what node said, when it failed
    report: dict[str, Any] = json.loads(done.stdout)
    return report


async def test_the_typescript_client_casts_sees_progress_and_answers_the_pauses(
    tmp_path: Path,
) -> None:
    spec = write_spec(tmp_path)
    report = await ts_client(
        spec,
        "paint",
        {"action": "accept", "content": {"approve": True}},
        {"action": "accept", "content": {"answer": "blue"}},
    )
    assert report["version"] == "2025-11-25"
    assert report["server"]["name"] == "cantrip"
    assert report["tools"] == ["cast"]
    result = report["result"]
    assert not result["isError"] and result["structuredContent"]["result"] == "painted"
    approval, question = report["asked"]
    assert approval["message"] == 'Approve echo({"text": "rm -rf build"})?'
    assert question["requestedSchema"]["required"] == ["answer"]
    # One progress notification per recorded turn, counted from 1, never past max_turns.
    # (This client sometimes drops the last ones: it settles the call's response before
    # the notifications that arrived just ahead of it reach their handler -- seen on the
    # wire, where all three precede the result. The Python SDK's client gets all three,
    # tests/test_mcp_server.py.)
    steps = [p["progress"] for p in report["progress"]]
    assert steps and steps == sorted(set(steps)) and set(steps) <= {1, 2, 3}
    assert all(p["total"] == 6 for p in report["progress"])
    assert all(p["message"].startswith(f"turn {p['progress']}") for p in report["progress"])
    calls = {r.gate: r for r in loom_calls(tmp_path, result["structuredContent"]["entity_id"])}
    assert calls["ask_user"].result == "blue"
    assert calls["echo"].detail["approval"]["decision"] == "approve"
