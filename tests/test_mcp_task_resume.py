"""An MCP task outlives the process that started it: the resumed call follows it.

A call of a server that offers tasks returns a task id at once and the work runs on
in the server. The id is saved in the gate journal as the call's checkpoint the
moment it arrives (:mod:`cantrip._checkpoint`), so when the calling process dies
mid-task the resumed cast follows that task to its end -- the tool is never called a
second time, and the call is not given up as "outcome unknown".

The server is a real ``cantrip mcp --http`` process (it outlives the client); the
client that dies is a real process killed with SIGKILL while its task waits.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio
from mcp_support import call, finish
from test_mcp_client_tasks import inner_spec, inner_turns
from test_mcp_server import http_server

import cantrip
from cantrip._journal import CHECKPOINTS, OUTCOME_UNKNOWN, _dumps, encode_response
from cantrip.llm import Response, ToolCall
from cantrip.loom import Loom
from cantrip.mcp import MCPServer
from gates import done

ROOT = Path(__file__).resolve().parents[1]

CLIENT = """
import sys, trio, cantrip
from cantrip.loom import Loom
from cantrip.mcp import MCPServer
from gates import done

url, path = sys.argv[1], sys.argv[2]
spell = cantrip.Cantrip(
    llm=cantrip.ScriptedLLM([{"tool_calls": [{"gate": "inner_cast", "args": {"intent": "go"}}]}]),
    identity=cantrip.Identity(),
    circle=cantrip.Circle(
        [done], [cantrip.max_turns(6)],
        providers=[MCPServer(name="inner", url=url, elicitation=True)],
    ),
    loom=Loom.open(path, journal=True),
)

async def nobody(pause):  # the question waits: the process dies before it is answered
    await trio.sleep_forever()

async def main():
    async with spell.summon(entity_id="entity-outer", on_pause=nobody) as entity:
        await entity.send("delegate")

trio.run(main)
"""


def outer(path: Path, script: list[dict[str, Any]], url: str) -> cantrip.Cantrip:
    return cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(script),
        identity=cantrip.Identity(),
        circle=cantrip.Circle(
            [done],
            [cantrip.max_turns(6)],
            providers=[MCPServer(name="inner", url=url, elicitation=True)],
        ),
        loom=Loom.open(path, journal=True),
    )


def checkpoints(path: Path) -> list[str]:
    """The checkpoints the outer loom's journal holds (read by a second connection)."""
    if not path.exists():
        return []
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT record FROM journal WHERE ordinal >= ? AND record IS NOT NULL", (CHECKPOINTS,)
        ).fetchall()
    except sqlite3.OperationalError:  # the table is not made yet
        return []
    finally:
        db.close()
    return [row[0] for row in rows]


async def test_a_task_started_before_a_crash_is_followed_not_called_again(
    tmp_path: Path,
) -> None:
    spec = inner_spec(tmp_path, [call("echo", text="rm -rf"), finish("approved")], approve=True)
    path = tmp_path / "outer.db"
    async with http_server(spec) as url:
        client = subprocess.Popen(
            [sys.executable, "-c", CLIENT, url, str(path)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        try:
            with trio.fail_after(60):  # the task waits on its approval: nobody answers
                while not (saved := checkpoints(path)):
                    assert client.poll() is None, "the client ended before its task began"
                    await trio.sleep(0.05)
        finally:
            client.send_signal(signal.SIGKILL)
            client.wait()
        (checkpoint,) = saved
        assert '"mcp_task":"task-' in checkpoint

        asked: list[cantrip.Pause] = []

        async def human(pause: cantrip.Pause) -> cantrip.Decision:
            asked.append(pause)
            return cantrip.Decision.answer('{"approve": true}')

        spell = outer(path, [finish("outer")], url)
        async with spell.resume("entity-outer", on_pause=human) as entity:
            with trio.fail_after(60):
                outcome = await entity.resume_cast("delegate", [])
        spell.loom.close()
    assert outcome.result == "outer"
    (record,) = [r for t in outcome.turns for r in t.gate_calls if r.gate == "inner_cast"]
    assert not record.is_error, record.result
    assert record.result["result"] == "approved"
    assert f'"{record.detail["mcp_task"]["task_id"]}"' in checkpoint  # the same task
    (pause,) = asked  # the task's question, asked again of the resumed entity
    assert pause.origin == "mcp:inner"
    # the server ran one cast, and its gate once: the tool was not called a second time
    echoes = [r for t in inner_turns(tmp_path) for r in t.gate_calls if r.gate == "echo"]
    assert [e.result for e in echoes] == ["rm -rf"]


async def test_a_task_the_server_no_longer_knows_is_an_error_not_a_second_call(
    tmp_path: Path,
) -> None:
    """The checkpoint names a task the server forgot (it was restarted): the call is an
    ``is_error`` observation naming the task, and the tool is not called again."""
    spec = inner_spec(tmp_path, [finish("never")])
    path = tmp_path / "outer.db"
    intent = ToolCall("c1", "inner_cast", {"intent": "go"})
    data = _dumps({"args": dict(intent.arguments), "tool_call_id": intent.id})
    async with http_server(spec) as url:
        spell = outer(path, [finish("outer")], url)
        store: Any = spell.loom.store
        utterance = encode_response(Response(tool_calls=(intent,)))
        gone = _dumps({"mcp_task": "task-gone"})
        store.journal_write("entity-outer", 1, -1, "", utterance, None)
        store.journal_write("entity-outer", 1, 0, "inner_cast", data, None)
        store.journal_write("entity-outer", 1, CHECKPOINTS, "inner_cast", data, gone)
        async with spell.summon(entity_id="entity-outer") as entity:
            with trio.fail_after(60):
                outcome = await entity.resume_cast("delegate", [])
        spell.loom.close()
    (record,) = [r for t in outcome.turns for r in t.gate_calls if r.gate == "inner_cast"]
    assert record.is_error and "task-gone" in str(record.result)
    assert record.result != OUTCOME_UNKNOWN
    if (tmp_path / "inner.db").exists():  # the server made its loom, and cast nothing
        served = Loom.open(tmp_path / "inner.db")
        assert list(served.entities) == []
        served.close()
