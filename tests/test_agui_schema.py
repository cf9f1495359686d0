"""The AG-UI 1.0 JSON Schema check every AG-UI test goes through (issue 44, item 2):
it refuses what the 1.0 schema refuses, and a server in the test process cannot send
an event past it (tests/agui_schema_check.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from agui_schema_check import SCHEMA, SchemaViolation, check_event

pytest_plugins = ["pytester"]

TESTS = Path(__file__).parent


def test_the_schema_is_the_1_0_schema() -> None:
    assert SCHEMA["$id"] == "https://ag-ui.com/spec/1.0/schema.json"
    assert "@ag-ui/core 1.0.0" in SCHEMA["title"]
    kinds = {branch["properties"]["type"]["const"] for branch in SCHEMA["anyOf"]}
    assert {"RUN_FINISHED", "REASONING_START", "SUBAGENT_STARTED", "ACTIVITY_DELTA"} <= kinds


GOOD: list[dict[str, Any]] = [
    {"type": "RUN_STARTED", "threadId": "t", "runId": "r", "protocolVersion": "1.0"},
    {"type": "RUN_FINISHED", "threadId": "t", "runId": "r", "outcome": {"type": "cancelled"}},
    {
        "type": "RUN_FINISHED",
        "threadId": "t",
        "runId": "r",
        "outcome": {"type": "interrupt", "interrupts": [{"id": "p1", "reason": "approval"}]},
        "usage": [{"inputTokens": 10, "outputTokens": 2, "cachedInputTokens": 8}],
    },
    {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "hi", "subagentRunId": "s1"},
    {"type": "STATE_DELTA", "delta": [{"op": "replace", "path": "/a", "value": 1}]},
    {"type": "CUSTOM", "name": "x", "value": None, "metadata": {"anything": [1]}},
]

BAD: list[tuple[dict[str, Any], str]] = [
    ({"type": "RUN_STARTED", "threadId": "t"}, "runId"),
    ({"type": "RUN_STARTED", "threadId": "t", "runId": "r", "runID": "typo"}, "runID"),
    (
        {"type": "RUN_FINISHED", "threadId": "t", "runId": "r", "outcome": {"type": "paused"}},
        "outcome",
    ),
    (
        {
            "type": "RUN_FINISHED",
            "threadId": "t",
            "runId": "r",
            "outcome": {"type": "interrupt", "interrupts": []},
        },
        "interrupts",
    ),
    ({"type": "TOOL_CALL_START", "toolCallId": "c"}, "toolCallName"),
    ({"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "tool"}, "role"),
    ({"type": "STATE_DELTA", "delta": [{"op": "frobnicate", "path": "/a"}]}, "delta"),
    ({"type": "THINKING_START"}, "type"),
    ({"type": "RUN_STARTED", "threadId": "t", "runId": "r", "timestamp": 1.5}, "timestamp"),
]


@pytest.mark.parametrize("event", GOOD, ids=lambda e: str(e["type"]))
def test_the_check_takes_1_0_events(event: dict[str, Any]) -> None:
    check_event(event)


@pytest.mark.parametrize(("event", "named"), BAD, ids=lambda e: str(e))
def test_the_check_refuses_what_the_1_0_schema_refuses(event: dict[str, Any], named: str) -> None:
    with pytest.raises(SchemaViolation, match=r"not an AG-UI 1\.0 event") as refused:
        check_event(event)
    assert named in str(refused.value)


def test_a_server_in_the_test_process_cannot_send_an_event_past_the_check(
    pytester: pytest.Pytester,
) -> None:
    """A test that never reads the stream still fails when its server sends an event
    the schema refuses: the autouse fixture checks every event on its way out."""
    pytester.makeconftest(
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n"
        "from agui_schema_check import agui_events_follow_the_schema  # noqa: F401\n"
    )
    pytester.makepyfile(
        test_inner="""
import httpx, trio, cantrip
from ag_ui.core import CustomEvent
from cantrip.protocols.agui._translate import Translator
from test_agui import run_input, serving, spell

def test_sends_a_bad_event(monkeypatch):
    events = Translator.events
    def extra(self, event):
        return [*events(self, event), CustomEvent(name="x", value=1, notInTheSchema=True)]
    monkeypatch.setattr(Translator, "events", extra)
    s = spell([{"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]}])

    async def main():
        async with serving(s) as base, httpx.AsyncClient(base_url=base) as http:
            answer = await http.post("/agui", json=run_input("t-bad"))
        assert answer.status_code == 200  # the stream itself is not read

    trio.run(main)

def test_sends_good_events():
    s = spell([{"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]}])

    async def main():
        async with serving(s) as base, httpx.AsyncClient(base_url=base) as http:
            answer = await http.post("/agui", json=run_input("t-good"))
        assert answer.status_code == 200

    trio.run(main)
"""
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "-p", "no:cacheprovider", "-n", "0", "-o", "addopts="
    )
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        ["*AG-UI event(s) the server sent fail the 1.0 JSON Schema*notInTheSchema*"]
    )
