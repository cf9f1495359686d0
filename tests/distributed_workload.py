"""The workload the distributed tests and ``bench/distributed.py`` queue for workers.

``build()`` (named ``distributed_workload:build`` in queued spells) returns a
cantrip whose LLM is stateless like a real one: it tells which turn it is on
from the context, so an entity resumed on another worker after a crash asks
for exactly the turn it was on. Each of the first ``TURNS - 1`` turns calls
the effectful ``charge`` gate, which inserts a row into ``chaos_effects`` --
a second run of the same call would be a second row, so duplicated effects
are counted, not guessed. The last turn calls ``done``.

Settings come from the environment (workers are separate processes):
``CANTRIP_TEST_DB`` (where ``charge`` writes), ``WORKLOAD_TURNS`` (default 10),
``WORKLOAD_LATENCY_MS`` (default 0) and ``WORKLOAD_GATE_MS`` (default 0: how
long ``charge`` takes after its insert -- a window for a crash mid-call).
``holding()`` adds ``WORKLOAD_HOLD_STEP`` and ``WORKLOAD_HOLD_FILE``: ``charge`` at that
step waits, after its insert, until that file exists (a gate call that lasts as long as
the test wants: the test sees it began by its effect row); ``WORKLOAD_LLM_HOLD_TURN``
makes that turn's model call wait for the file the same way (a long model call).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

import cantrip
from cantrip.llm import Message, Response, ToolChoice, ToolDefinition, simulate_latency
from gates import done

EFFECTS_TABLE = """
CREATE TABLE IF NOT EXISTS chaos_effects (
    id BIGSERIAL PRIMARY KEY, job TEXT NOT NULL, step INTEGER NOT NULL, pid INTEGER NOT NULL
)
"""
TAKEN_OVER = "SELECT count(*) FROM cantrip_work WHERE attempts > 1 OR crashes > 0"
"""Work items claimed again after a run that ended without an outcome: one that cost an
attempt (a released lease, a worker that died holding it alone) or a crash (a worker
that died holding it beside others: free)."""


class CountingLLM:
    """Calls ``charge`` once per turn until the last, then ``done``."""

    name = "counting"

    def __init__(self, latency_s: float, turns: int, hold_turn: int = 0) -> None:
        self.latency_s = latency_s
        self.turns = turns
        self.hold_turn = hold_turn
        """The turn whose model call lasts until ``WORKLOAD_HOLD_FILE`` exists (0: none);
        it creates that file's ``.asked`` sibling as it begins."""

    async def query(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Response:
        await simulate_latency(self.latency_s)
        intent = next(m.content for m in messages if m.role == "user")
        answered = sum(1 for m in messages if m.role == "assistant")
        if answered + 1 == self.hold_turn:  # a long model call
            hold = Path(os.environ["WORKLOAD_HOLD_FILE"])
            hold.with_suffix(".asked").touch()
            while not hold.exists():
                await trio.sleep(0.01)
        if answered + 1 >= self.turns:
            call = cantrip.ToolCall(f"d{answered}", "done", {"answer": f"{intent} ok"})
        else:
            call = cantrip.ToolCall(
                f"c{answered}", "charge", {"job": str(intent), "step": answered + 1}
            )
        return Response(tool_calls=(call,))


_connection: Any = None


def _db() -> Any:
    global _connection
    if _connection is None or _connection.closed:  # first use, or lost (a restart)
        import psycopg

        _connection = psycopg.connect(os.environ["CANTRIP_TEST_DB"], autocommit=True)
    return _connection


@cantrip.gate(blocking=True)
def charge(job: str, step: int) -> str:
    """Charge the customer for one step of a job (a side effect: one row per call)."""
    import psycopg

    insert = "INSERT INTO chaos_effects (job, step, pid) VALUES (%s, %s, %s)"
    try:
        _db().execute(insert, (job, step, os.getpid()))
    except psycopg.OperationalError:  # the connection was lost (a database restart): again
        _db().execute(insert, (job, step, os.getpid()))
    pause = float(os.environ.get("WORKLOAD_GATE_MS", "0")) / 1000.0
    if pause:
        time.sleep(pause)
    return f"charged {job} step {step}"


def build() -> cantrip.Cantrip:
    return _workload(charge)


def _workload(charging: cantrip.Gate) -> cantrip.Cantrip:
    turns = int(os.environ.get("WORKLOAD_TURNS", "10"))
    latency = float(os.environ.get("WORKLOAD_LATENCY_MS", "0")) / 1000.0
    return cantrip.Cantrip(
        llm=CountingLLM(latency, turns, int(os.environ.get("WORKLOAD_LLM_HOLD_TURN", "0"))),
        identity=cantrip.Identity(system_prompt="distributed workload"),
        circle=cantrip.Circle([done, charging], [cantrip.max_turns(turns + 5)]),
    )


@cantrip.gate(name="charge", blocking=True)
def charge_or_die(job: str, step: int) -> str:
    """``charge``, except that its second step kills the worker's process (like a
    segfault in a native library, or the OOM killer, would), every time it is run."""
    import signal

    if step >= 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return str(charge.fn(job, step))


@cantrip.gate(name="charge", blocking=True)
def charge_and_hold(job: str, step: int) -> str:
    """``charge``, except that its ``WORKLOAD_HOLD_STEP``-th step, once its effect is
    recorded, waits until the file ``WORKLOAD_HOLD_FILE`` exists (a long gate call)."""
    charged = str(charge.fn(job, step))
    if step == int(os.environ["WORKLOAD_HOLD_STEP"]):
        hold = Path(os.environ["WORKLOAD_HOLD_FILE"])
        while not hold.exists():
            time.sleep(0.01)
    return charged


def holding() -> cantrip.Cantrip:
    """The workload, whose ``WORKLOAD_HOLD_STEP``-th gate call lasts until the test
    creates ``WORKLOAD_HOLD_FILE``."""
    return _workload(charge_and_hold)


def killer() -> cantrip.Cantrip:
    """The workload, whose cast kills its worker at its second turn: a poison cast that
    runs like the others until then (its spell builds, its first turn lands)."""
    return _workload(charge_or_die)


def poison() -> cantrip.Cantrip:
    """A queued spell that cannot be built here (its error carries a key-shaped secret,
    which the recorded error must not)."""
    raise RuntimeError("cannot build: the provider refused api_key=sk-poison-0123456789abcdef")


def crasher() -> cantrip.Cantrip:
    """A queued spell that kills the worker that builds it (like a segfault or the OOM
    killer would): only the attempt limit stops it from killing the next one."""
    import signal

    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")
