"""The conformance runner's virtual clock: idle waiting costs no real time, a worker
thread's work does (cantrip/conformance/_runner.py).

The runner jumps its clock to the next deadline once every task has waited 50 ms
of real time. A task waiting on a worker thread is not idle: on a loaded machine a
read gate's file read took longer than 50 ms, the clock jumped to the gate's 10 s
timeout, and ``tests/test_docs.py``'s run of ``cantrip conformance tests.yaml`` failed a
CIRCLE-10 case with "took longer than 10 s". Here the read is made slow on purpose.
"""

from __future__ import annotations

import importlib
import time
from typing import Any

import pytest
import yaml

from cantrip.conformance import Runner

_READ_CASE = """
rule: CIRCLE-10
name: the read gate reads its file, however long the thread takes
setup:
  llm:
    responses:
      - tool_calls: [{ gate: read, args: { path: "todo.md" } }]
      - tool_calls: [{ gate: done, args: { answer: "two chores" } }]
  circle:
    gates: [done, { name: read, dependencies: { root: "/srv/notes" } }]
    wards: [{ max_turns: 4 }]
  filesystem:
    "/srv/notes/todo.md": "- sweep\\n- mop"
action:
  cast: { intent: "What is on my todo list?" }
expect:
  result: "two chores"
  turn_1_observation: { is_error: false, content: "- sweep\\n- mop" }
"""

_AN_HOUR_CASE = """
rule: TEST-1
name: an hour's wait in a gate costs no real time
setup:
  llm:
    responses:
      - tool_calls: [{ gate: tortoise, args: {} }]
      - tool_calls: [{ gate: done, args: { answer: "arrived" } }]
  circle:
    gates: [done, { name: tortoise, behavior: delay, delay_ms: 3600000, result: "at last" }]
    wards: [{ max_turns: 4 }]
action:
  cast: { intent: "Wait for the tortoise" }
expect:
  result: "arrived"
  turn_1_observation: { is_error: false, content: "at last" }
"""


def test_a_worker_threads_real_time_is_not_idle_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The read's thread takes 0.3 s of real time (a loaded machine, made certain):
    the clock waits for it instead of jumping to the read's 10 s timeout."""
    read_module = importlib.import_module("gates.read")
    read_file = read_module._read_file

    def slow_read_file(*args: Any, **kwargs: Any) -> str:
        time.sleep(0.3)
        return str(read_file(*args, **kwargs))

    monkeypatch.setattr(read_module, "_read_file", slow_read_file)
    result = Runner().run_case(yaml.safe_load(_READ_CASE))
    assert result.passed, result.message


@pytest.mark.timeout(120)
def test_an_hour_of_idle_waiting_is_jumped_over() -> None:
    """With no thread at work the clock still jumps: a gate that waits an hour
    answers at once (without the jump the test would time out)."""
    result = Runner().run_case(yaml.safe_load(_AN_HOUR_CASE))
    assert result.passed, result.message
