"""Budgets over the whole entity tree on ``--db`` workers (issue 43, item 2).

The trees of tests/test_tree_budgets.py, queued for a worker on a real PostgreSQL
(tests/conftest.py starts it): each is stopped before it overspends, with its
budget's reason, and the loom in the database shows it. Then the handoff: a cast
handed back by one worker after its child spent most of the tree's tokens is
continued by another, which charges what the child recorded -- the account
survives the handoff -- and stops the tree at the budget, where a count of the
continued cast's own turns alone would have let it go on to ``done``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from cantrip.distributed._dispatcher import Dispatcher
from cantrip.distributed._spells import spell_from_factory
from cantrip.distributed._worker import Worker
from cantrip.loom import Loom

TREE = spell_from_factory("budget_trees:build")


def _tree_of(url: str, root: str) -> tuple[list[Any], dict[str, list[Any]]]:
    loom = Loom.open(url)
    try:
        turns = list(loom.turns)
        by_entity = {e: list(loom.entity_turns(e)) for e in loom.entities if e != root}
    finally:
        loom.close()
    return turns, by_entity


def _tokens(turns: list[Any]) -> int:
    return sum(t.metadata.tokens_prompt + t.metadata.tokens_completion for t in turns)


def _ran(turns: list[Any], gate: str) -> int:
    return sum(1 for t in turns for c in t.gate_calls if c.gate == gate and c.status == "ok")


@pytest.mark.parametrize(
    ("tree", "reason"),
    [
        ("tokens", "max_tokens_total"),
        ("cost", "max_cost_usd"),
        ("gate_calls", "max_gate_calls"),
        ("children", "max_children"),
    ],
)
async def test_a_child_tree_that_would_overspend_is_stopped_on_a_worker(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, tree: str, reason: str
) -> None:
    monkeypatch.setenv("BUDGET_TREE", tree)
    dispatcher = await trio.to_thread.run_sync(Dispatcher, pg_url)
    async with trio.open_nursery() as nursery:
        await nursery.start(Worker(pg_url).run)
        work, root = await trio.to_thread.run_sync(lambda: dispatcher.submit(TREE, "go"))
        state, outcome = await trio.to_thread.run_sync(lambda: dispatcher.wait(work, timeout=60))
        nursery.cancel_scope.cancel()
    dispatcher.close()
    assert state == "done" and outcome["reason"] == reason and outcome["truncated"]
    turns, children = _tree_of(pg_url, root)
    if tree == "tokens":
        assert _tokens(turns) == 200 and len(children) == 1
    elif tree == "cost":
        assert _tokens(turns) <= 200 and len(children) == 1
        assert outcome["cost_usd"] <= 0.0002 + 1e-12
    elif tree == "gate_calls":
        assert _ran(turns, "echo") == 3 and _ran(turns, "call_agent") == 1
        (child,) = children.values()
        assert child[-1].reason == "max_gate_calls"
    else:
        assert len(children) == 2


async def test_the_trees_account_survives_a_handoff_between_workers(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hold = tmp_path / "hold"
    monkeypatch.setenv("BUDGET_TREE", "handoff")
    monkeypatch.setenv("BUDGET_HOLD_FILE", str(hold))
    dispatcher = await trio.to_thread.run_sync(Dispatcher, pg_url)
    async with trio.open_nursery() as nursery:
        first = Worker(pg_url)
        await nursery.start(first.run)
        work, root = await trio.to_thread.run_sync(lambda: dispatcher.submit(TREE, "go"))
        # the root's second call begins: its first turn and the child's four are recorded
        while not hold.with_suffix(".asked").exists():
            await trio.sleep(0.01)
        first.hand_back()  # cut off at once, nothing more recorded, lease handed back
        hold.touch()
        await nursery.start(Worker(pg_url).run)
        state, outcome = await trio.to_thread.run_sync(lambda: dispatcher.wait(work, timeout=60))
        nursery.cancel_scope.cancel()
    dispatcher.close()
    turns, children = _tree_of(pg_url, root)
    (child,) = children.values()
    assert _tokens(child) == 200 and child[-1].reason == "done"
    # 50 + 200 before the handoff; the continued cast's first call reaches 300
    assert (state, outcome["reason"]) == ("done", "max_tokens_total")
    assert _tokens(turns) == 300
    roots = [t for t in turns if t.entity_id == root]
    assert [t.reason for t in roots] == ["delegating", None, "max_tokens_total"]
