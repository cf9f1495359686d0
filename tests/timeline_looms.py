"""A cast with a known clock for the viewer's timeline: children, a pause, cut-offs, a fork.

``entity-root`` takes ``turns`` turns (``turn-r1``...; a piece after a delegation or a
pause is ``turn-rNc``, with the next sequence number, as the runtime records it), one
after another, each 400 ms of model and
100 ms of an ``echo`` call. ``children`` times it delegates, evenly spread: the
checkpoint turn (400 ms of model) spawns ``entity-kid{i}`` (two turns of 300 ms
model + 50 ms gate), then the continuation (stamped with the checkpoint's start,
as the runtime records it) completes the ``call_agent`` call. Kid 1 finishes; kid 2
is cut off by a ward after its first turn while its model call was in flight
(its usage recorded as missing, as the runtime records it: its cost is unknown);
kid 3 fails (``llm_error``); kid 4 is cancelled with its parent (``parent_terminated``);
the rest finish. At the turn after the first delegation the root pauses for a human (a
checkpoint with a ``pending`` marker) and goes on 5 s later. ``entity-fork`` forks from
turn 2 after the cast. The last root turn terminates (``done``).
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

from cantrip.loom import EntityRecord, GateCallRecord, Loom, Turn, TurnMetadata

START = datetime(2026, 3, 1, 10, 0, 0, tzinfo=UTC)
WAIT_MS = 5000.0
KID_TURN_MS = 350.0


class Clock:
    def __init__(self) -> None:
        self.ms = 0.0

    def stamp(self, at: float | None = None) -> str:
        return (START + timedelta(milliseconds=self.ms if at is None else at)).isoformat()


def _meta(clock: Clock, duration: float, *, at: float | None = None, **usage: Any) -> TurnMetadata:
    fields: dict[str, Any] = {"tokens_prompt": 100, "tokens_completion": 20, "cost_usd": 0.002}
    fields.update(usage)
    return TurnMetadata(duration_ms=duration, timestamp=clock.stamp(at), model="m", **fields)


def kid_outcome(number: int) -> str:
    return {1: "terminated", 2: "truncated", 3: "failed", 4: "cancelled"}.get(number, "terminated")


def _kid(loom: Loom, clock: Clock, number: int, checkpoint: str) -> None:
    kid = f"entity-kid{number}"
    loom.register_entity(
        EntityRecord(
            kid, "spell", medium="conversation", parent_entity_id="entity-root",
            spawned_from=checkpoint,
        )
    )  # fmt: skip
    outcome = kid_outcome(number)
    parent = checkpoint
    for seq in (1, 2):
        last = seq == 2 or outcome != "terminated"
        call = GateCallRecord("echo", {"text": f"kid {number}"}, "ok", duration_ms=50.0)
        fields: dict[str, Any] = {}
        meta = _meta(clock, KID_TURN_MS, tokens_prompt=40, tokens_completion=10, cost_usd=0.001)
        if last and outcome == "terminated":
            fields = {"terminated": True, "reason": "done", "result": f"kid {number} done"}
        elif last and outcome == "truncated":
            fields = {"truncated": True, "reason": "max_turns"}
            # cut while the model was asked: the usage is missing (cost unknown)
            meta = TurnMetadata(
                duration_ms=KID_TURN_MS, timestamp=clock.stamp(), usage_missing=True
            )
        elif last and outcome == "failed":
            fields = {"truncated": True, "reason": "llm_error", "extras": {"error": "boom"}}
            meta = TurnMetadata(duration_ms=KID_TURN_MS, timestamp=clock.stamp())
            call = GateCallRecord("echo", {}, None, status="cancelled")
        elif last and outcome == "cancelled":
            fields = {"truncated": True, "reason": "parent_terminated"}
            meta = TurnMetadata(duration_ms=KID_TURN_MS, timestamp=clock.stamp())
            call = GateCallRecord("echo", {}, None, status="cancelled")
        turn = Turn(
            f"turn-kid{number}-{seq}", parent, kid, seq,
            intent=f"sub task {number}" if seq == 1 else None,
            utterance=f"kid {number} step {seq}", gate_calls=(call,), metadata=meta, **fields,
        )  # fmt: skip
        loom.append(turn)
        parent = turn.id
        clock.ms += KID_TURN_MS
        if last:
            break


def build_cast(loom: Loom, turns: int = 12, children: int = 4) -> Loom:
    """Write the cast into ``loom`` (any store) and return it."""
    clock = Clock()
    loom.register_entity(EntityRecord("entity-root", "spell", medium="conversation", llm="main"))
    every = max(1, turns // (children + 1))
    delegate_at = {every * (i + 1): i + 1 for i in range(children)}
    pause_at = min(every + 1, turns - 1) if every + 1 in range(2, turns) else None
    parent: str | None = None
    fork_parent, fork_sequence = "", 0
    seq = itertools.count(1)  # a continuation piece is a turn of its own, as recorded
    for n in range(1, turns + 1):
        echo = GateCallRecord("echo", {"text": f"step {n}"}, f"step {n}", duration_ms=100.0)
        common: dict[str, Any] = {"utterance": f"Working on step {n}."}
        if n == 1:
            common["intent"] = "Plan the trip"
        if n in delegate_at:
            number = delegate_at[n]
            began = clock.ms
            checkpoint = Turn(
                f"turn-r{n}", parent, "entity-root", next(seq), gate_calls=(),
                metadata=_meta(clock, 400.0), reason="delegating",
                extras={"phase": "checkpoint"}, **common,
            )  # fmt: skip
            loom.append(checkpoint)
            clock.ms += 400.0
            kid_began = clock.ms
            _kid(loom, clock, number, checkpoint.id)
            call = GateCallRecord(
                "call_agent", {"intent": f"sub task {number}"}, f"kid {number}",
                duration_ms=clock.ms - kid_began,
            )  # fmt: skip
            turn = Turn(
                f"turn-r{n}c", checkpoint.id, "entity-root", next(seq), gate_calls=(call,),
                metadata=_meta(clock, clock.ms - began, at=began, tokens_prompt=0,
                               tokens_completion=0, cost_usd=None),
                extras={"phase": "continuation"},
            )  # fmt: skip
        elif n == pause_at:
            began = clock.ms
            pending = {"pause_id": "pause-1", "kind": "approval", "gate": "echo"}
            checkpoint = Turn(
                f"turn-r{n}", parent, "entity-root", next(seq), gate_calls=(),
                metadata=_meta(clock, 400.0), reason="paused",
                extras={"phase": "checkpoint", "pending": pending}, **common,
            )  # fmt: skip
            loom.append(checkpoint)
            clock.ms += 400.0 + WAIT_MS
            turn = Turn(
                f"turn-r{n}c", checkpoint.id, "entity-root", next(seq), gate_calls=(echo,),
                metadata=_meta(clock, 100.0, tokens_prompt=0, tokens_completion=0, cost_usd=None),
                extras={"phase": "continuation"},
            )  # fmt: skip
            clock.ms += 100.0
        else:
            last = n == turns
            done = GateCallRecord("done", {"answer": "ok"}, "ok", duration_ms=100.0)
            calls = (done,) if last else (echo,)
            turn = Turn(
                f"turn-r{n}", parent, "entity-root", next(seq), gate_calls=calls,
                metadata=_meta(clock, 500.0), terminated=last, reason="done" if last else None,
                result="trip planned" if last else None, **common,
            )  # fmt: skip
            clock.ms += 500.0
        loom.append(turn)
        parent = turn.id
        if n == 2:
            fork_parent, fork_sequence = turn.id, turn.sequence
    loom.register_entity(
        EntityRecord("entity-fork", "spell", medium="conversation", forked_from=fork_parent)
    )
    clock.ms += 1000.0
    loom.append(
        Turn(
            "turn-fork1", fork_parent, "entity-fork", fork_sequence + 1, intent="Plan it by train",
            utterance="By train.", metadata=_meta(clock, 500.0), terminated=True, reason="done",
        )
    )  # fmt: skip
    return loom
