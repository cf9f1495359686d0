"""Budgets over the whole entity tree (issue 43, item 2), in process.

Each budget -- tokens, dollars, wall time, gate calls, child entities -- is counted
over a cast and every cast it spawns (``call_agent`` and a batch's children): a
child tree scripted to overspend is stopped before it does, each budget with its
own reason. Children of a batch run one at a time (``max_concurrency 1``) where the
order matters to what is asserted, so which child is refused is exact; the
concurrent case is its own test. The same trees on ``--db`` workers are in
tests/test_tree_budgets_db.py.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

import cantrip
from cantrip._outcome import result_dict
from cantrip.cli import _main as _cli
from cantrip.testing import expect
from gates import call_agent, call_agent_batch, done, echo

PRICES = cantrip.Pricing(1.0, 1.0)  # $1 per 1M tokens
USAGE = {"prompt_tokens": 40, "completion_tokens": 10}  # 50 tokens a call


def call(gate: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"gate": gate, "args": args}], "usage": USAGE}


def batch(n: int) -> dict[str, Any]:
    return call("call_agent_batch", requests=[{"intent": f"part {i}"} for i in range(n)])


def finish(answer: str = "ok") -> dict[str, Any]:
    return call("done", answer=answer)


def tree(
    parent: list[dict[str, Any]],
    child: list[dict[str, Any]],
    *wards: cantrip.Ward,
    depth: int = 1,
) -> tuple[cantrip.Cantrip, cantrip.ScriptedLLM]:
    child_llm = cantrip.ScriptedLLM(child, name="child", pricing=PRICES)
    spell = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(parent, name="parent", pricing=PRICES),
        identity=cantrip.Identity(system_prompt="parent"),
        circle=cantrip.Circle(
            [done, echo, call_agent, call_agent_batch],
            [cantrip.max_turns(20), cantrip.max_depth(depth), *wards],
        ),
        llms={"child_llm": child_llm},
    )
    return spell, child_llm


def tokens(loom: cantrip.Loom) -> int:
    return sum(t.metadata.tokens_prompt + t.metadata.tokens_completion for t in loom.turns)


def entities(loom: cantrip.Loom, root: str) -> list[str]:
    return [e for e in loom.entities if e != root]


def last_turn(loom: cantrip.Loom, entity_id: str) -> cantrip.Turn:
    return loom.entity_turns(entity_id)[-1]


def ran(loom: cantrip.Loom, gate: str) -> int:
    """Gate calls of ``gate`` that really ran, over the whole tree."""
    return sum(1 for t in loom.turns for c in t.gate_calls if c.gate == gate and c.status == "ok")


# -- tokens (max_tokens_total) ----------------------------------------------------------------


async def test_a_child_cannot_spend_the_tokens_its_parent_has_left() -> None:
    # the parent's delegating call costs 50; the child would make 10 more calls
    spell, child = tree(
        [call("call_agent", intent="work"), finish()],
        [call("echo", text=f"{i}") for i in range(10)],
        cantrip.Ward("max_tokens_total", 200),
    )
    outcome = await spell.cast_async("delegate")
    loom = spell.loom
    assert len(child.invocations) == 3  # 50 + 3 x 50 = the budget: no fourth call
    assert tokens(loom) == 200
    (child_id,) = entities(loom, outcome.entity_id)
    assert last_turn(loom, child_id).reason == "max_tokens_total"
    # the parent's tree is spent too: it ends without another call
    assert (outcome.truncated, outcome.reason) == (True, "max_tokens_total")
    assert len(spell.llm.invocations) == 1  # type: ignore[attr-defined]
    assert result_dict(outcome)["reason"] == "max_tokens_total"
    expect(outcome, reason="max_tokens_total", ended="truncated")


async def test_a_batch_starts_no_child_once_the_trees_tokens_are_spent() -> None:
    spell, child = tree(
        [batch(3), finish()],
        [call("echo", text=f"{i}") for i in range(10)],
        cantrip.Ward("max_tokens_total", 200),
        cantrip.Ward("max_concurrency", 1),
    )
    outcome = await spell.cast_async("split")
    loom = spell.loom
    assert len(child.invocations) == 3 and tokens(loom) == 200
    assert len(entities(loom, outcome.entity_id)) == 1  # the other two never started
    record = next(c for t in outcome.turns for c in t.gate_calls if c.gate == "call_agent_batch")
    assert all("max_tokens_total" in entry["error"] for entry in record.result[1:])
    assert outcome.reason == "max_tokens_total"


async def test_a_childs_own_token_ward_can_be_lower_never_higher() -> None:
    spell, child = tree(
        [call("call_agent", intent="work", wards=[{"max_tokens_total": 100_000}]), finish()],
        [call("echo", text=f"{i}") for i in range(10)],
        cantrip.Ward("max_tokens_total", 150),
    )
    await spell.cast_async("delegate")
    assert len(child.invocations) == 2  # the parent's 150 holds: 50 + 2 x 50
    lower, child2 = tree(
        [call("call_agent", intent="work", wards=[{"max_tokens_total": 50}]), finish()],
        [call("echo", text=f"{i}") for i in range(10)] + [finish()],
        cantrip.Ward("max_tokens_total", 1000),
    )
    outcome = await lower.cast_async("delegate")
    assert len(child2.invocations) == 1 and outcome.result == "ok"


async def test_concurrent_children_draw_from_one_account() -> None:
    """Four children at once, each scripted for many calls: together they stop
    at the tree's budget, each at most one call past the moment it was spent."""
    spell, child = tree(
        [batch(4), finish()],
        [call("echo", text=f"{i}") for i in range(40)],
        cantrip.Ward("max_tokens_total", 450),
    )
    outcome = await spell.cast_async("split")
    loom = spell.loom
    # 50 (the parent's call) + 8 x 50 = 450: every call checked the shared account
    assert tokens(loom) == 450 and len(child.invocations) == 8
    reasons = {last_turn(loom, e).reason for e in entities(loom, outcome.entity_id)}
    assert reasons == {"max_tokens_total"}


# -- dollars (max_cost_usd) ---------------------------------------------------------------------


async def test_a_batch_starts_no_child_once_the_trees_dollars_are_spent() -> None:
    spell, _child = tree(
        [batch(3), finish()],
        [call("echo", text=f"{i}") for i in range(10)],
        cantrip.max_cost_usd(0.0002),  # 200 tokens at $1 / 1M
        cantrip.Ward("max_concurrency", 1),
    )
    outcome = await spell.cast_async("split")
    loom = spell.loom
    assert tokens(loom) <= 200
    assert len(entities(loom, outcome.entity_id)) == 1  # never started, not started-and-cut
    record = next(c for t in outcome.turns for c in t.gate_calls if c.gate == "call_agent_batch")
    assert all("max_cost_usd" in entry["error"] for entry in record.result[1:])
    assert outcome.reason == "max_cost_usd"


async def test_a_child_cannot_spend_the_dollars_its_parent_has_left() -> None:
    spell, _child = tree(
        [call("call_agent", intent="work"), call("call_agent", intent="more"), finish()],
        [call("echo", text=f"{i}") for i in range(10)],
        cantrip.max_cost_usd(0.0002),
    )
    outcome = await spell.cast_async("delegate")
    assert outcome.cost_usd is not None and outcome.cost_usd <= 0.0002 + 1e-12
    assert len(entities(spell.loom, outcome.entity_id)) == 1
    assert outcome.reason == "max_cost_usd"


# -- wall time (timeout_s) ----------------------------------------------------------------------


async def test_a_child_cannot_outlast_its_parents_wall_time(autojump_clock: Any) -> None:
    """The child's own ``timeout_s`` is higher: the parent's deadline still cuts
    the child off (it runs inside the parent's), and the tree ends at it."""
    slow = cantrip.ScriptedLLM([finish("late")], name="slow", latency_s=60.0, pricing=PRICES)
    spell = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(
            [call("call_agent", intent="work", wards=[{"timeout_s": 600}]), finish()],
            pricing=PRICES,
        ),
        identity=cantrip.Identity(),
        circle=cantrip.Circle(
            [done, call_agent],
            [cantrip.max_turns(5), cantrip.max_depth(1), cantrip.timeout(5)],
        ),
        llms={"child_llm": slow},
    )
    start = trio.current_time()
    outcome = await spell.cast_async("delegate")
    assert trio.current_time() - start == pytest.approx(5, abs=0.01)
    assert outcome.reason == "timeout"
    (child_id,) = entities(spell.loom, outcome.entity_id)
    assert last_turn(spell.loom, child_id).reason == "parent_terminated"


# -- gate calls (max_gate_calls) ----------------------------------------------------------------


async def test_a_child_cannot_make_the_gate_calls_its_parent_has_left() -> None:
    spell, _child = tree(
        [call("call_agent", intent="work"), call("echo", text="mine"), finish()],
        [call("echo", text=f"{i}") for i in range(10)],
        cantrip.Ward("max_gate_calls", 4),
    )
    outcome = await spell.cast_async("delegate")
    loom = spell.loom
    # call_agent is one; the child makes three; its fourth is refused, never run
    assert ran(loom, "echo") == 3 and ran(loom, "call_agent") == 1
    (child_id,) = entities(loom, outcome.entity_id)
    child_last = last_turn(loom, child_id)
    assert child_last.reason == "max_gate_calls" and child_last.truncated
    refused = child_last.gate_calls[-1]
    assert refused.is_error and refused.status == "error" and "max_gate_calls" in refused.result
    assert "max_gate_calls" in child_last.extras["budget"]
    # the parent's own next call is refused too
    assert (outcome.truncated, outcome.reason) == (True, "max_gate_calls")
    expect(outcome, reason="max_gate_calls")


async def test_a_batchs_children_share_the_gate_call_budget() -> None:
    spell, _child = tree(
        [batch(3), finish("parent")],
        [call("echo", text="a"), call("echo", text="b"), call("echo", text="c"), finish()] * 3,
        cantrip.Ward("max_gate_calls", 4),
        cantrip.Ward("max_concurrency", 1),
    )
    outcome = await spell.cast_async("split")
    loom = spell.loom
    assert ran(loom, "echo") == 3  # the batch call and the first child's three
    reasons = [last_turn(loom, e).reason for e in entities(loom, outcome.entity_id)]
    assert reasons == ["done", "max_gate_calls", "max_gate_calls"]
    assert outcome.result == "parent"  # done is never counted: the parent can still end


# -- child entities (max_children) ---------------------------------------------------------------


async def test_a_batch_over_the_child_budget_starts_only_what_fits() -> None:
    spell, child = tree(
        [batch(4), finish("never")],
        [finish(f"c{i}") for i in range(4)],
        cantrip.Ward("max_children", 2),
    )
    outcome = await spell.cast_async("split")
    loom = spell.loom
    assert len(entities(loom, outcome.entity_id)) == 2 and len(child.invocations) == 2
    record = next(c for t in outcome.turns for c in t.gate_calls if c.gate == "call_agent_batch")
    assert [isinstance(r, dict) and "max_children" in r["error"] for r in record.result] == [
        False,
        False,
        True,
        True,
    ]
    assert (outcome.truncated, outcome.reason) == (True, "max_children")
    assert len(spell.llm.invocations) == 1  # type: ignore[attr-defined]


async def test_grandchildren_count_toward_the_roots_child_budget() -> None:
    spell, _child = tree(
        [call("call_agent", intent="work"), finish("parent")],
        [call("call_agent", intent="deeper"), finish("child")],
        cantrip.Ward("max_children", 1),
        depth=2,
    )
    outcome = await spell.cast_async("delegate")
    loom = spell.loom
    assert len(entities(loom, outcome.entity_id)) == 1  # the grandchild was refused
    (child_id,) = entities(loom, outcome.entity_id)
    refused = next(c for t in loom.entity_turns(child_id) for c in t.gate_calls)
    assert refused.is_error and "max_children" in refused.result
    # the child that asked for one too many ends; its parent, over budget in
    # nothing, goes on
    assert last_turn(loom, child_id).reason == "max_children"
    assert outcome.result == "parent"


# -- the notice ----------------------------------------------------------------------------------


async def test_the_entity_is_told_once_at_the_notice_fraction() -> None:
    llm = cantrip.ScriptedLLM([call("echo", text=f"{i}") for i in range(12)], pricing=PRICES)
    spell = cantrip.Cantrip(
        llm=llm,
        identity=cantrip.Identity(),
        circle=cantrip.Circle(
            [done, echo], [cantrip.max_turns(20), cantrip.Ward("max_tokens_total", 500)]
        ),
    )
    outcome = await spell.cast_async("spend")
    assert outcome.reason == "max_tokens_total" and len(llm.invocations) == 10
    noticed = [i for i, t in enumerate(outcome.turns) if "budget_notice" in t.extras]
    assert noticed == [8]  # 400 of 500 used: told before the ninth call, once
    notice = outcome.turns[8].extras["budget_notice"]
    assert "max_tokens_total: 400 of 500 tokens used, 100 left" in notice
    # the model saw it where the loom says, and only once after
    ninth = llm.invocations[8].messages
    assert ninth[-1].role == "user" and ninth[-1].content == notice
    assert sum(m.content == notice for m in llm.invocations[9].messages) == 1
    assert all(notice not in str(m.content) for m in llm.invocations[7].messages)
    # a context rebuilt from the loom shows it in the same place
    resumed = spell.resume(outcome.entity_id)
    assert [m.content for m in resumed._context.snapshot()].count(notice) == 1


async def test_the_notice_fraction_is_a_ward_and_zero_turns_it_off() -> None:
    def spend(*wards: cantrip.Ward) -> cantrip.Cantrip:
        return cantrip.Cantrip(
            llm=cantrip.ScriptedLLM([call("echo", text=f"{i}") for i in range(6)], pricing=PRICES),
            identity=cantrip.Identity(),
            circle=cantrip.Circle([done, echo], [cantrip.max_turns(4), *wards]),
        )

    early = spend(cantrip.Ward("max_gate_calls", 10), cantrip.Ward("budget_notice", 0.2))
    outcome = await early.cast_async("spend")
    assert [i for i, t in enumerate(outcome.turns) if "budget_notice" in t.extras] == [2]
    assert "max_gate_calls: 2 of 10 gate calls used" in outcome.turns[2].extras["budget_notice"]
    off = spend(cantrip.Ward("max_gate_calls", 3), cantrip.Ward("budget_notice", 0))
    outcome = await off.cast_async("spend")
    assert not any("budget_notice" in t.extras for t in outcome.turns)
    with pytest.raises(cantrip.ConstructionError, match="from 0 to 1"):
        cantrip.Ward("budget_notice", 1.5)


# -- where the reasons are reported ---------------------------------------------------------------

SPEC = """
[llm]
provider = "scripted"
responses = [
  {{ tool_calls = [{{ gate = "echo", args = {{ text = "1" }} }}] }},
  {{ tool_calls = [{{ gate = "echo", args = {{ text = "2" }} }}] }},
  {{ tool_calls = [{{ gate = "echo", args = {{ text = "3" }} }}] }},
  {{ tool_calls = [{{ gate = "done", args = {{ answer = "ok" }} }}] }},
]

[circle]
medium = "conversation"
gates = ["done", "echo"]
wards = [{{ max_turns = 10 }}, {{ {ward} = {value} }}]
"""


def test_cast_json_reports_a_budgets_reason_and_exits_as_truncated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.format(ward="max_gate_calls", value=2))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))
    code = _cli.main(["cast", str(spec), "Echo", "--json", "--loom", str(tmp_path / "l.db")])
    outcome = json.loads(capsys.readouterr().out)
    assert code == 2  # truncated by a ward
    assert (outcome["reason"], outcome["truncated"], outcome["turns"]) == (
        "max_gate_calls",
        True,
        3,
    )


@pytest.mark.parametrize(("ward", "value"), [("max_children", 1.5), ("budget_notice", 2)])
def test_a_spec_with_a_bad_budget_is_refused_in_one_line(
    ward: str, value: float, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.format(ward=ward, value=value))
    code = _cli.main(["cast", str(spec), "Echo", "--loom", str(tmp_path / "l.db")])
    err = capsys.readouterr().err
    assert code == 1 and f"ward {ward} takes" in err and "Traceback" not in err


async def test_the_agent_span_carries_the_budgets_reason() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import StatusCode

    from cantrip.tracing._sink import TraceSink

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spell, _ = tree([batch(3), finish()], [finish("c")] * 3, cantrip.Ward("max_children", 1))
    sink = TraceSink(provider.get_tracer("test"), spell.loom)
    outcome = await spell.cast_async("split", on_event=sink)
    assert outcome.reason == "max_children"
    agents = [s for s in exporter.get_finished_spans() if s.name.startswith("invoke_agent")]
    (root,) = [s for s in agents if s.attributes["gen_ai.agent.id"] == outcome.entity_id]
    assert root.attributes["cantrip.reason"] == "max_children"
    assert root.status.status_code is StatusCode.UNSET  # a ward's truncation is no error


# -- sub-casts that report usage (a cantrip served by `cantrip mcp`) -----------------------------

SUB_SPEC = """
[llm]
provider = "scripted"
usage = { prompt_tokens = 40, completion_tokens = 10 }
responses = [
  { tool_calls = [{ gate = "echo", args = { text = "1" } }] },
  { tool_calls = [{ gate = "echo", args = { text = "2" } }] },
  { tool_calls = [{ gate = "done", args = { answer = "sub done" } }] },
]

[circle]
medium = "conversation"
gates = ["done", "echo"]
wards = [{ max_turns = 5 }]
"""


async def test_an_mcp_sub_cast_that_reports_its_usage_counts_toward_the_tree(
    tmp_path: Path,
) -> None:
    """A real ``cantrip mcp`` process answers a cast with its usage (150 tokens): the
    calling entity's tree is charged it, so with 200 tokens the caller's 50 and the
    sub-cast's 150 spend the budget and the caller stops -- where its own turns alone
    (50) would have let it go on."""
    from cantrip.mcp import MCPServer

    sub = tmp_path / "sub.toml"
    sub.write_text(SUB_SPEC)
    server = MCPServer(
        name="sub",
        command=sys.executable,
        args=("-m", "cantrip", "mcp", str(sub)),
    )
    llm = cantrip.ScriptedLLM(
        [call("sub_cast", intent="count"), finish("caller done")], pricing=PRICES
    )
    spell = cantrip.Cantrip(
        llm=llm,
        identity=cantrip.Identity(),
        circle=cantrip.Circle(
            [done],
            [cantrip.max_turns(5), cantrip.Ward("max_tokens_total", 200)],
            providers=[server],
        ),
    )
    outcome = await spell.cast_async("delegate over MCP")
    record = outcome.turns[0].gate_calls[0]
    assert not record.is_error and record.result["result"] == "sub done"
    assert record.detail["usage"] == {"prompt_tokens": 120, "completion_tokens": 30}
    assert (outcome.truncated, outcome.reason) == (True, "max_tokens_total")
    assert len(llm.invocations) == 1


async def test_the_notice_tells_the_time_left_before_the_deadline(autojump_clock: Any) -> None:
    llm = cantrip.ScriptedLLM([call("echo", text=f"{i}") for i in range(9)], latency_s=3.0)
    spell = cantrip.Cantrip(
        llm=llm,
        identity=cantrip.Identity(),
        circle=cantrip.Circle(
            [done, echo],
            [cantrip.max_turns(20), cantrip.timeout(20), cantrip.Ward("budget_notice", 0.5)],
        ),
    )
    outcome = await spell.cast_async("take your time")
    assert outcome.reason == "timeout"
    (turn,) = [t for t in outcome.turns if "budget_notice" in t.extras]
    # 12 of 20 s gone after four calls of 3 s: told once, before the fifth
    assert outcome.turns.index(turn) == 4
    assert "timeout_s: 8 of 20 s left" in turn.extras["budget_notice"]


async def test_a_notice_and_a_steering_message_join_one_turn_and_rebuild_once() -> None:
    from cantrip._running import CURRENT_ENTITY

    @cantrip.gate
    def nudge() -> str:
        """Ask the entity to hurry (as a user would, mid-cast)."""
        CURRENT_ENTITY.get().steer("hurry up")  # type: ignore[attr-defined]
        return "nudged"

    llm = cantrip.ScriptedLLM([call("nudge"), call("echo", text="x"), finish()], pricing=PRICES)
    spell = cantrip.Cantrip(
        llm=llm,
        identity=cantrip.Identity(),
        circle=cantrip.Circle(
            [done, echo, nudge],
            [
                cantrip.max_turns(5),
                cantrip.Ward("max_tokens_total", 1000),
                cantrip.Ward("budget_notice", 0.05),
            ],
        ),
    )
    outcome = await spell.cast_async("go")
    second = outcome.turns[1]
    notice = second.extras["budget_notice"]
    assert second.extras["steering"] == ["hurry up"]
    seen = [m.content for m in llm.invocations[1].messages][-2:]
    assert seen == ["hurry up", notice]  # the steering, then the notice
    later = [m.content for m in llm.invocations[2].messages]
    assert later.count("hurry up") == 1 and later.count(notice) == 1  # shown once, live
    rebuilt = [m.content for m in spell.resume(outcome.entity_id)._context.snapshot()]
    assert rebuilt.count("hurry up") == 1 and rebuilt.count(notice) == 1
    assert rebuilt.index(notice) == rebuilt.index("hurry up") + 1
