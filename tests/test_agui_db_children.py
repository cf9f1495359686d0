"""AG-UI sub-agents on ``cantrip serve --db`` beyond one answering ``call_agent`` child
(SPEC AGUI-4b): each child of a ``call_agent_batch`` call, and the child of a
``call_agent`` call that failed, told from the loom at a replica -- the same events in
the same order as the in-process server tells for the same spec.

Everything is real and started here: PostgreSQL, one worker, a replica per spec (the
casts are scripted, so no LLM server is asked); every stream is checked by
``ag-ui-validate`` and compared with the in-process server's for the same cast.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import test_agui as in_process
from pg_cluster import fresh_database
from test_agui_client import TOKEN
from test_agui_db import _shape, agui, run_input
from test_mcp_server import _toml
from test_serve_db import Stack, open_stack

from cantrip.cli._spec_file import load_cantrip

pytestmark = pytest.mark.loop_watch  # nothing here may block the trio loop

KID = [{"content": "looking", "tool_calls": [{"gate": "done", "args": {"answer": "found"}}]}]
"""A child that says its line and answers."""


@pytest.fixture(scope="module")
def stack(pg_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One worker on a fresh database; the tests start a replica per spec."""
    url = fresh_database(pg_server, "agui_db_children")
    with open_stack(url, tmp_path_factory.mktemp("agui-db-children"), replicas=0) as built:
        yield built


def spec_file(
    folder: Path, name: str, parent: list[dict[str, Any]], kids: dict[str, Any], **circle: str
) -> Path:
    """A spec whose scripted parent delegates to children on the scripted LLMs
    ``kids`` names (each child of a batch has one of its own: a scripted LLM answers
    every cast with the same tool call ids, and two sub-agents' calls may not share one
    in an AG-UI stream -- a provider mints each call's)."""
    spec = folder / f"{name}.toml"
    gates = circle.get("gates", '["done", "call_agent", "call_agent_batch"]')
    wards = circle.get("wards", "")
    llms = "".join(
        f'\n[llms.{kid}]\nprovider = "scripted"\n' + _toml(script) for kid, script in kids.items()
    )
    spec.write_text(
        '[llm]\nprovider = "scripted"\n' + _toml(parent) + llms + "\n[circle]\n"
        'medium = "conversation"\n'
        f"gates = {gates}\n"
        f"wards = [{{ max_turns = 6 }}, {{ max_depth = 1 }}{wards}]\n"
    )
    return spec


async def both(stack: Stack, spec: Path, thread: str) -> tuple[list[Any], list[Any]]:
    """The run's events at a replica serving ``spec``, and in process for the same spec."""
    replica = stack.start_replica(spec, token=TOKEN)
    answer, events = await agui(replica, run_input(f"db-{thread}", "go"))
    assert answer.status_code == 200 and events[-1]["type"] == "RUN_FINISHED", events
    async with in_process.serving(load_cantrip(spec)) as base:
        _, live = await in_process.agui(base, run_input(thread, "go"))
    assert live[-1]["type"] == "RUN_FINISHED", live
    return events, live


def the_call(events: list[dict[str, Any]], gate: str) -> str:
    """The tool call id of the run's own (one) call of ``gate``."""
    (call,) = [
        e["toolCallId"]
        for e in events
        if e["type"] == "TOOL_CALL_START" and e["toolCallName"] == gate and "subagentRunId" not in e
    ]
    return str(call)


def place(events: list[dict[str, Any]], kind: str, sub: str | None, call: str | None = None) -> int:
    (where,) = [
        i
        for i, e in enumerate(events)
        if e["type"] == kind and e.get("subagentRunId") == sub and e.get("toolCallId") == call
    ]
    return where


BATCH = [
    {
        "content": "delegating",
        "tool_calls": [
            {
                "gate": "call_agent_batch",
                "args": {
                    "requests": [
                        {"intent": "look left", "llm": "kid"},
                        {"intent": "look right", "llm": "kid2"},
                    ]
                },
            }
        ],
    },
    {"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]},
]
"""The parent says a line and delegates two sub-tasks in one batch, then answers."""


async def test_each_child_of_a_batch_is_a_subagent_at_a_replica_as_in_process(
    stack: Stack, tmp_path: Path
) -> None:
    """On ``serve --db`` each child of a ``call_agent_batch`` call is told from the
    loom as a sub-agent of the batch call, in request order, before its result -- the
    same events in the same order as in process (children one at a time here,
    ``max_concurrency`` 1: in process concurrent children's events interleave as they
    happen, while a replica tells each child whole)."""
    kids = {"kid": KID, "kid2": KID}
    spec = spec_file(tmp_path, "batch", BATCH, kids, wards=", { max_concurrency = 1 }")
    events, live = await both(stack, spec, "batch")
    started = [e for e in events if e["type"] == "SUBAGENT_STARTED"]
    assert len(started) == 2, in_process.types(events)
    call = the_call(events, "call_agent_batch")
    assert all(e["parentToolCallId"] == call for e in started)
    first, second = (e["subagentRunId"] for e in started)
    result = place(events, "TOOL_CALL_RESULT", None, call)
    assert (
        place(events, "SUBAGENT_STARTED", first)
        < place(events, "SUBAGENT_FINISHED", first)
        < place(events, "SUBAGENT_STARTED", second)
        < place(events, "SUBAGENT_FINISHED", second)
        < result
    )
    for child in (first, second):
        finished = events[place(events, "SUBAGENT_FINISHED", child)]
        assert finished["outcome"] == {"type": "success"} and finished["result"] == "found"
        said = "".join(
            e["delta"]
            for e in events
            if e["type"] == "TEXT_MESSAGE_CONTENT" and e.get("subagentRunId") == child
        )
        assert said == "looking"
    assert events[result]["content"] == '["found", "found"]'
    assert _shape(events) == _shape(live)


FAILING = [
    {
        "content": "delegating",
        "tool_calls": [
            {"gate": "call_agent", "args": {"intent": "look", "llm": "kid", "gates": ["echo"]}}
        ],
    },
    {"tool_calls": [{"gate": "done", "args": {"answer": "the child failed"}}]},
]
BROKEN_KID = [
    {"content": "looking", "tool_calls": [{"gate": "echo", "args": {"text": "here"}}]},
    {"error": {"status": 400, "message": "the kid's request was refused"}},
]
"""The child says a line and calls a gate, then its LLM refuses its next request (a
400 is not retried): the child fails, and its ``call_agent`` call is an error."""


async def test_a_failed_call_agent_child_is_a_subagent_at_a_replica_as_in_process(
    stack: Stack, tmp_path: Path
) -> None:
    """On ``serve --db`` the child of a ``call_agent`` call that failed is told from
    the loom as a sub-agent -- its recorded turn, then ``SUBAGENT_ERROR`` with the
    call's error before the call's result -- as in process."""
    gates = '["done", "call_agent", "echo"]'
    spec = spec_file(tmp_path, "failing", FAILING, {"kid": BROKEN_KID}, gates=gates)
    events, live = await both(stack, spec, "failing")
    (started,) = [e for e in events if e["type"] == "SUBAGENT_STARTED"]
    child = started["subagentRunId"]
    call = the_call(events, "call_agent")
    assert started["parentToolCallId"] == call and started["description"] == "look"
    result = place(events, "TOOL_CALL_RESULT", None, call)
    error = place(events, "SUBAGENT_ERROR", child)
    assert place(events, "SUBAGENT_STARTED", child) < error < result
    assert child in events[error]["message"] and "refused" in events[error]["message"]
    assert events[error]["message"] == events[result]["content"]
    echoed = [e for e in events if e["type"] == "TOOL_CALL_RESULT" and e.get("content") == "here"]
    assert len(echoed) == 1, "the child's gate call is told"
    assert events[-1]["result"] == "the child failed"
    assert _shape(events) == _shape(live)


async def test_a_failed_child_of_a_batch_ends_in_error_at_a_replica_as_in_process(
    stack: Stack, tmp_path: Path
) -> None:
    """A batch whose second child fails still answers (that child's entry is an error);
    the failed child is told as a sub-agent that ends in ``SUBAGENT_ERROR`` with its
    entry's message (its record names it among the batch's ``failed``), the other as
    finished -- at a replica from the loom, and in process, in the same order."""
    batch = [
        {
            "content": "delegating",
            "tool_calls": [
                {
                    "gate": "call_agent_batch",
                    "args": {
                        "requests": [
                            {"intent": "look left", "llm": "kid"},
                            {"intent": "look right", "llm": "broken", "gates": ["echo"]},
                        ]
                    },
                }
            ],
        },
        {"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]},
    ]
    spec = spec_file(
        tmp_path,
        "batch-failing",
        batch,
        {"kid": KID, "broken": BROKEN_KID},
        gates='["done", "call_agent_batch", "echo"]',
        wards=", { max_concurrency = 1 }",
    )
    events, live = await both(stack, spec, "batch-failing")
    for told in (events, live):
        first, second = (e["subagentRunId"] for e in told if e["type"] == "SUBAGENT_STARTED")
        call = the_call(told, "call_agent_batch")
        result = place(told, "TOOL_CALL_RESULT", None, call)
        finished = told[place(told, "SUBAGENT_FINISHED", first)]
        assert finished["outcome"] == {"type": "success"} and finished["result"] == "found"
        error = place(told, "SUBAGENT_ERROR", second)
        assert place(told, "SUBAGENT_STARTED", second) < error < result
        message = told[error]["message"]
        assert second in message and "refused" in message
        entries = json.loads(told[result]["content"])
        assert entries == ["found", {"error": message}]
    assert _shape(events) == _shape(live)
