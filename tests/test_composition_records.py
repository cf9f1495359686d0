"""A delegation call's record names the children it ran (SPEC §5, AGUI-4b): a
``call_agent_batch``'s ``detail["children"]`` (one per request, in request order) and
``detail["failed"]``, a failed ``call_agent``'s ``detail["child"]`` -- so a reader of
the loom alone (a ``serve --db`` replica, an export) finds each child's own turns from
its parent's call. Kept by every store (memory, SQLite, JSONL, PostgreSQL) and by the
JSONL export."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from test_composition import finish, parent_spell

import cantrip
from cantrip.llm import Message, Response, ToolChoice, ToolDefinition
from cantrip.loom import Loom
from cantrip.loom._export import export_jsonl, load_jsonl
from cantrip.loom._model import GateCallRecord


class ByIntent:
    """A child LLM that answers ``done(<intent>)``, or refuses (a 400, not retried)
    when its intent asks it to fail."""

    name = "by-intent"

    async def query(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Response:
        intent = str(next(m.content for m in messages if m.role == "user"))
        if "fail" in intent:
            raise cantrip.ProviderError(f"refused {intent!r}", status=400)
        return Response(tool_calls=(cantrip.ToolCall(f"c-{intent}", "done", {"answer": intent}),))


BATCH = {
    "tool_calls": [
        {
            "gate": "call_agent_batch",
            "args": {
                "requests": [
                    {"intent": "part 0"},
                    {"intent": "part 1 fail"},
                    {"intent": "part 2", "colour": "red"},  # cannot be built: no child
                    {"intent": "part 3"},
                ]
            },
        }
    ]
}
FAILING = {"tool_calls": [{"gate": "call_agent", "args": {"intent": "please fail"}}]}


def call_record(loom: Loom, entity_id: str, gate: str) -> GateCallRecord:
    (record,) = [c for t in loom.entity_turns(entity_id) for c in t.gate_calls if c.gate == gate]
    return record


def first_intent(loom: Loom, entity_id: str) -> str | None:
    return loom.entity_turns(entity_id)[0].intent


async def test_a_batch_record_names_each_child_in_request_order() -> None:
    spell = parent_spell([BATCH, finish()], ByIntent())
    outcome = await spell.cast_async("four parts")
    loom = spell.loom
    record = call_record(loom, outcome.entity_id, "call_agent_batch")
    assert not record.is_error
    children = list(record.detail["children"])
    assert len(children) == 4 and children[2] is None, children
    for index in (0, 1, 3):
        child = children[index]
        assert loom.entities[child].parent_entity_id == outcome.entity_id
        assert str(first_intent(loom, child)).startswith(f"part {index}")
    assert list(record.detail["failed"]) == [children[1]]
    assert record.result[0] == "part 0" and record.result[3] == "part 3"
    assert children[1] in record.result[1]["error"]
    assert "cannot spawn child" in record.result[2]["error"]


async def test_a_batch_where_every_child_answers_names_none_failed() -> None:
    spell = parent_spell([_two_parts(), finish()], ByIntent())
    outcome = await spell.cast_async("two parts")
    record = call_record(spell.loom, outcome.entity_id, "call_agent_batch")
    assert set(record.detail) == {"children"} and len(record.detail["children"]) == 2


def _two_parts() -> dict[str, Any]:
    requests = [{"intent": "left"}, {"intent": "right"}]
    return {"tool_calls": [{"gate": "call_agent_batch", "args": {"requests": requests}}]}


async def test_a_failed_call_agent_record_names_its_child() -> None:
    spell = parent_spell([FAILING, finish()], ByIntent())
    outcome = await spell.cast_async("delegate")
    loom = spell.loom
    record = call_record(loom, outcome.entity_id, "call_agent")
    assert record.is_error and record.status == "error"
    child = record.detail["child"]
    assert dict(record.detail) == {"exception": "GateError", "child": child}
    assert loom.entities[child].parent_entity_id == outcome.entity_id
    assert first_intent(loom, child) == "please fail"
    assert child in record.result and "refused" in record.result


async def test_a_child_that_cannot_be_spawned_names_none() -> None:
    unknown = {"tool_calls": [{"gate": "call_agent", "args": {"intent": "x", "llm": "nope"}}]}
    spell = parent_spell([unknown, finish()], ByIntent())
    outcome = await spell.cast_async("delegate")
    record = call_record(spell.loom, outcome.entity_id, "call_agent")
    assert record.is_error and "child" not in record.detail


def named(loom: Loom, entity_id: str) -> dict[str, Any]:
    """What the parent's delegation records name, as plain data."""
    return {
        gate: dict(call_record(loom, entity_id, gate).detail)
        for gate in ("call_agent", "call_agent_batch")
    }


def as_lists(detail: dict[str, Any]) -> dict[str, Any]:
    return {
        gate: {k: list(v) if isinstance(v, list | tuple) else v for k, v in d.items()}
        for gate, d in detail.items()
    }


async def record_both(loom: Loom) -> tuple[str, dict[str, Any]]:
    """A cast on ``loom`` whose parent makes a failed call_agent and a batch; what
    their records name, read from the loom it ran on."""
    spell = parent_spell([FAILING, BATCH, finish()], ByIntent()).with_(loom=loom)
    outcome = await spell.cast_async("both")
    written = as_lists(named(loom, outcome.entity_id))
    assert written["call_agent"]["child"] in loom.entities
    assert len(written["call_agent_batch"]["children"]) == 4
    assert len(written["call_agent_batch"]["failed"]) == 1
    return outcome.entity_id, written


@pytest.mark.parametrize("suffix", [".db", ".jsonl"])
async def test_the_stores_keep_what_a_delegation_record_names(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"loom{suffix}"
    loom = Loom.open(path)
    entity, written = await record_both(loom)
    loom.close()
    again = Loom.open(path)
    assert as_lists(named(again, entity)) == written
    # the JSONL export (default redaction) keeps it, and reads it back the same
    exported = [e.turn for e in load_jsonl(export_jsonl(again))]
    again.close()
    read_back = {
        c.gate: dict(c.detail)
        for t in exported
        if t.entity_id == entity
        for c in t.gate_calls
        if c.gate in written
    }
    assert as_lists(read_back) == written


async def test_postgresql_keeps_what_a_delegation_record_names(pg_url: str) -> None:
    loom = Loom.open(pg_url)
    entity, written = await record_both(loom)
    loom.close()
    again = Loom.open(pg_url)
    assert as_lists(named(again, entity)) == written
    again.close()
