"""A workload that pauses for a human, queued for workers by the pause tests.

``build()`` (``pause_workload:build`` in queued spells) returns a cantrip whose
LLM is stateless like a real one: on its first turn it calls ``pay`` -- a gate
that requires approval, so the cast pauses -- and on the next it calls
``done`` with the text of the observation it got (``paid ...``, ``denied by the
user: ...``), so a test sees what the model saw. ``pay`` inserts a row into
``pause_effects``: a second run of the same approved call would be a second
row, so effects are counted, not guessed.

Settings come from the environment (workers are separate processes):
``CANTRIP_TEST_DB`` (where ``pay`` writes) and ``PAY_GATE_MS`` (default 0: how
long ``pay`` takes after its insert -- a window to kill its worker mid-call).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import cantrip
from cantrip.llm import Message, Response, ToolChoice, ToolDefinition
from gates import done

EFFECTS_TABLE = """
CREATE TABLE IF NOT EXISTS pause_effects (
    id BIGSERIAL PRIMARY KEY, job TEXT NOT NULL, pid INTEGER NOT NULL
)
"""


class PayThenReportLLM:
    """Turn 1: ``pay(job=<intent>)``; then ``done`` with what the last call returned."""

    name = "pay-then-report"

    async def query(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Response:
        intent = next(m.content for m in messages if m.role == "user")
        answered = sum(1 for m in messages if m.role == "assistant")
        if answered == 0:
            return Response(tool_calls=(cantrip.ToolCall("p0", "pay", {"job": str(intent)}),))
        seen = [m for m in messages if m.role == "tool"]
        last = seen[-1].content if seen else "nothing"
        return Response(tool_calls=(cantrip.ToolCall(f"d{answered}", "done", {"answer": last}),))


_connections: dict[str, Any] = {}


def _db() -> Any:
    """One connection per database (each test has a database of its own)."""
    url = os.environ["CANTRIP_TEST_DB"]
    if url not in _connections:
        import psycopg

        _connections[url] = psycopg.connect(url, autocommit=True)
    return _connections[url]


def _pay(job: str) -> str:
    _db().execute("INSERT INTO pause_effects (job, pid) VALUES (%s, %s)", (job, os.getpid()))
    wait = float(os.environ.get("PAY_GATE_MS", "0")) / 1000.0
    if wait:
        time.sleep(wait)
    return f"paid {job}"


@cantrip.gate(blocking=True, requires_approval=True)
def pay(job: str) -> str:
    """Pay for a job (a side effect a human approves first: one row per call)."""
    return _pay(job)


@cantrip.gate(name="pay", blocking=True)
def pay_freely(job: str) -> str:
    """Pay for a job (no approval needed)."""
    return _pay(job)


def build() -> cantrip.Cantrip:
    return cantrip.Cantrip(
        llm=PayThenReportLLM(),
        identity=cantrip.Identity(system_prompt="pause workload"),
        circle=cantrip.Circle([done, pay], [cantrip.max_turns(6)]),
    )


def build_unguarded() -> cantrip.Cantrip:
    """The same two turns with nothing to approve (``bench/pause_answer.py``'s baseline)."""
    return cantrip.Cantrip(
        llm=PayThenReportLLM(),
        identity=cantrip.Identity(system_prompt="pause workload, unguarded"),
        circle=cantrip.Circle([done, pay_freely], [cantrip.max_turns(6)]),
    )


_CODE = {
    "js": ("var r = pay('job-js'); done(r + '!')", "done('after: ' + 'the block was cut')"),
    "python": ("r = pay('job-python')\ndone(r + '!')", "done('after: ' + 'the block was cut')"),
}


def _build_code(medium_name: str) -> cantrip.Cantrip:
    """The same ``pay`` gate, called from inside a block of code: the block stops at
    the call (it needs approval), the work ends paused, and the answer continues the
    turn from the loom on a fresh sandbox."""
    if medium_name == "js":
        from mediums.js import js as medium
    else:
        from mediums.python import python as medium
    first, second = _CODE[medium_name]
    return cantrip.Cantrip(
        llm=cantrip.ScriptedLLM([{"code": first}, {"code": second}]),
        identity=cantrip.Identity(system_prompt="pause workload, in code"),
        circle=cantrip.Circle([done, pay], [cantrip.max_turns(6)], medium=medium),
    )


def build_js() -> cantrip.Cantrip:
    return _build_code("js")


def build_python() -> cantrip.Cantrip:
    return _build_code("python")


def build_delegating() -> cantrip.Cantrip:
    """A parent that hands the paying to a child (``call_agent_batch``): the child's
    ``pay`` pauses in place -- a child cannot leave its parent's cast."""
    from gates import call_agent_batch

    def scripted(*replies: dict[str, Any]) -> cantrip.ScriptedLLM:
        return cantrip.ScriptedLLM([{"tool_calls": [r]} for r in replies])

    return cantrip.Cantrip(
        llm=scripted(
            {"gate": "call_agent_batch", "args": {"requests": [{"intent": "child-job"}]}},
            {"gate": "done", "args": {"answer": "parent"}},
        ),
        identity=cantrip.Identity(system_prompt="pause workload, delegating"),
        circle=cantrip.Circle(
            [done, pay, call_agent_batch], [cantrip.max_turns(6), cantrip.max_depth(1)]
        ),
        llms={
            "child_llm": scripted(
                {"gate": "pay", "args": {"job": "child-job"}},
                {"gate": "done", "args": {"answer": "child"}},
            )
        },
    )
