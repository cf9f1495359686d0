"""Entity trees that would overspend a budget, for ``--db`` workers (tests/test_tree_budgets_db.py).

Workers build a queued spell by calling a factory, so each tree is a factory here:
``BUDGET_TREE`` (an environment variable, read when the worker builds the spell)
names which. The models are stateless like real ones: each answer depends only on
the context (how many answers it holds), so a cast continued on another worker asks
for exactly the turn it was on. Every answer costs 50 tokens ($0.00005).

``BUDGET_HOLD_FILE``: the root's second model call waits until that file exists, and
creates its ``.asked`` sibling as it begins (a worker can be made to hand the cast
back there, with the first turn and the child's turns recorded).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

import cantrip
from cantrip.llm import Message, Response, ToolChoice, ToolDefinition, Usage
from gates import call_agent, call_agent_batch, done, echo

PRICES = cantrip.Pricing(1.0, 1.0)
USAGE = Usage(40, 10)


class Stateless:
    """Answers ``plan[n]`` when the context holds ``n`` answers (the last entry after)."""

    def __init__(self, name: str, plan: Sequence[tuple[str, dict[str, Any]]], hold: int = 0):
        self.name = name
        self.plan = plan
        self.pricing = PRICES
        self.hold = hold

    async def query(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Response:
        answered = sum(1 for m in messages if m.role == "assistant")
        if self.hold and answered + 1 == self.hold:
            file = Path(os.environ["BUDGET_HOLD_FILE"])
            file.with_suffix(".asked").touch()
            while not file.exists():
                await trio.sleep(0.01)
        gate, args = self.plan[min(answered, len(self.plan) - 1)]
        call = cantrip.ToolCall(f"{self.name}-{answered}", gate, args)
        return Response(tool_calls=(call,), usage=USAGE, model=self.name)


def _batch(n: int) -> tuple[str, dict[str, Any]]:
    return ("call_agent_batch", {"requests": [{"intent": f"part {i}"} for i in range(n)]})


ECHOES = [("echo", {"text": f"{i}"}) for i in range(12)]
TREES: dict[str, tuple[list[tuple[str, dict[str, Any]]], list[Any], list[cantrip.Ward]]] = {
    # name: (the root's plan, the child's plan, the root's wards)
    "tokens": (
        [_batch(3), ("done", {"answer": "root"})],
        ECHOES,
        [cantrip.Ward("max_tokens_total", 200), cantrip.Ward("max_concurrency", 1)],
    ),
    "cost": (
        [_batch(3), ("done", {"answer": "root"})],
        ECHOES,
        [cantrip.max_cost_usd(0.0002), cantrip.Ward("max_concurrency", 1)],
    ),
    "gate_calls": (
        [("call_agent", {"intent": "work"}), ("echo", {"text": "mine"}), ("done", {"answer": "x"})],
        ECHOES,
        [cantrip.Ward("max_gate_calls", 4)],
    ),
    "children": (
        [_batch(4), ("done", {"answer": "never"})],
        [("done", {"answer": "child"})],
        [cantrip.Ward("max_children", 2)],
    ),
    # the root delegates once (50 + 4 x 50 tokens), then echoes until its fifth answer
    "handoff": (
        [("call_agent", {"intent": "work"}), *ECHOES[:4], ("done", {"answer": "root"})],
        [*ECHOES[:3], ("done", {"answer": "child"})],
        [cantrip.Ward("max_tokens_total", 300)],
    ),
}


def build() -> cantrip.Cantrip:
    root, child, wards = TREES[os.environ["BUDGET_TREE"]]
    hold = 2 if os.environ.get("BUDGET_HOLD_FILE") else 0
    return cantrip.Cantrip(
        llm=Stateless("root", root, hold),
        identity=cantrip.Identity(system_prompt="root"),
        circle=cantrip.Circle(
            [done, echo, call_agent, call_agent_batch],
            [cantrip.max_turns(20), cantrip.max_depth(1), *wards],
        ),
        llms={"child_llm": Stateless("child", child)},
    )
