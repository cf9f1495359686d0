"""Looms with a known shape for the viewer's tests: a thread, a fork, a child.

The top-level entity ``entity-a`` has ``turns`` turns (``turn-a1`` ...). Its
turn 3 delegates: ``turn-a3`` is a checkpoint, the child ``entity-c`` (two
turns) hangs below it, and ``turn-a4`` continues. ``entity-f`` is a fork from
``turn-a2`` (two turns). The first intent carries a secret, which every view
must show redacted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from cantrip.llm._contract import ToolCall
from cantrip.loom import EntityRecord, GateCallRecord, Loom, Turn, TurnMetadata
from cantrip.loom._stores import open_store

SECRET = "sk-proj-abcdefghijklmnop1234"
CODE = "# add them\nfor n in range(2):\n    total = 40 + n\nprint('sum', total)"


def _meta(n: int, cost: float | None, tokens: tuple[int, int] = (10, 2)) -> TurnMetadata:
    return TurnMetadata(
        tokens_prompt=tokens[0],
        tokens_completion=tokens[1],
        duration_ms=12.5,
        timestamp=f"2026-01-01T00:{n // 60 % 60:02d}:{n % 60:02d}+00:00",
        model="scripted",
        cost_usd=cost,
    )


def build(path: Path | None = None, turns: int = 6, *, cut: bool = False) -> Loom:
    """``cut``: turn 1's call stored only in part (``detail.result_cut``, max_record_chars)."""
    loom = Loom(open_store(path)) if path is not None else Loom()
    loom.register_entity(EntityRecord("entity-a", "spell", medium="conversation", llm="main"))
    parent: str | None = None
    for n in range(1, turns + 1):
        extras: dict[str, Any] = {}
        if n == 3:
            extras = {"phase": "checkpoint"}
        elif n == 4:
            extras = {"phase": "continuation"}
        calls = [GateCallRecord("echo", {"text": f"step {n}"}, f"step {n}", status="ok")]
        if cut and n == 1:
            stored = {"chars": 30_000_000, "kept": 1_048_576, "sha256": "ab" * 32}
            calls = [attrs.evolve(calls[0], detail={"result_cut": stored})]
        if n == 2:
            calls.append(
                GateCallRecord("nosuch", {}, "unknown gate 'nosuch'", is_error=True, status="error")
            )
        if n == 3:
            calls = [GateCallRecord("call_agent", {"intent": "sum it"}, "42")]
        last = n == turns
        if last:
            calls = [GateCallRecord("done", {"answer": "all done"}, "all done")]
        turn = Turn(
            id=f"turn-a{n}",
            parent_id=parent,
            entity_id="entity-a",
            sequence=n,
            intent=f"Book a flight with key {SECRET}" if n == 1 else None,
            utterance=f"Working on step {n}.",
            content=f"Working on step {n}.",
            thinking="Let me consider." if n == 1 else None,
            gate_calls=tuple(calls),
            observation="\n".join(str(c.result) for c in calls),
            metadata=_meta(n, 0.001),
            terminated=last,
            reason="done" if last else None,
            result="all done" if last else None,
            extras=extras,
        )
        loom.append(turn)
        parent = turn.id
        if n == 2:
            loom.register_entity(
                EntityRecord("entity-f", "spell", medium="conversation", forked_from="turn-a2")
            )
            loom.append(
                Turn(
                    "turn-f1",
                    "turn-a2",
                    "entity-f",
                    3,
                    intent="Book a train instead",
                    utterance="A train.",
                    metadata=_meta(n, 0.002),
                )
            )
            loom.append(
                Turn(
                    "turn-f2",
                    "turn-f1",
                    "entity-f",
                    4,
                    utterance="Booked.",
                    terminated=True,
                    reason="done",
                    result="train",
                    metadata=_meta(n, 0.002),
                )
            )
        if n == 3:
            loom.register_entity(
                EntityRecord(
                    "entity-c",
                    "spell",
                    medium="python",
                    parent_entity_id="entity-a",
                    spawned_from="turn-a3",
                )
            )
            loom.append(
                Turn(
                    "turn-c1",
                    "turn-a3",
                    "entity-c",
                    1,
                    intent="sum it",
                    utterance="print(40 + 2)",
                    metadata=_meta(n, None),
                    tool_calls=(ToolCall("c1", "python", {"code": CODE}),),
                )
            )
            loom.append(
                Turn(
                    "turn-c2",
                    "turn-c1",
                    "entity-c",
                    2,
                    utterance="done(42)",
                    terminated=True,
                    reason="done",
                    result=42,
                    metadata=_meta(n, None),
                )
            )
    return loom
