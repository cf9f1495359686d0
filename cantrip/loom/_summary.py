"""Totals of a loom's turns: tokens, cost, outcome, an entity's whole tree.

What ``cantrip loom list``/``show`` print and the browser viewer shows are the
same figures, computed here once (cost per turn is ``TurnMetadata.cost_usd``;
``None`` -- unknown -- is never counted as zero).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from cantrip.loom._loom import Loom
from cantrip.loom._model import EntityRecord, Turn
from cantrip.loom._view import CHECKPOINT_PHASES


def outcome(turn: Turn) -> str:
    """How the thread stands at ``turn``: terminated, truncated, delegating or active."""
    if turn.terminated:
        return f"terminated ({turn.reason})"
    if turn.truncated:
        return f"truncated ({turn.reason})"
    if turn.extras.get("phase") in CHECKPOINT_PHASES:
        return "delegating"
    return "active"


def tokens(turns: Sequence[Turn]) -> dict[str, int]:
    return {
        "prompt": sum(t.metadata.tokens_prompt for t in turns),
        "completion": sum(t.metadata.tokens_completion for t in turns),
        "cached": sum(t.metadata.tokens_cached for t in turns),
    }


def cost(turns: Sequence[Turn]) -> float | None:
    """USD of these turns; ``None`` if any turn used tokens at an unknown price or
    made a call whose provider reported no usage."""
    total = 0.0
    for t in turns:
        usd = turn_cost(t)
        if usd is None:
            return None
        total += usd
    return total


def turn_cost(turn: Turn) -> float | None:
    """USD of one turn as recorded: ``None`` when it used tokens at an unknown price or
    its provider reported no usage; a turn that used no tokens cost nothing."""
    meta = turn.metadata
    if meta.cost_usd is not None:
        return meta.cost_usd
    if meta.tokens_prompt or meta.tokens_completion or meta.usage_missing:
        return None
    return 0.0


def cost_text(usd: float | None) -> str:
    """A cost as every display shows it (issue 47.7): the progress line, ``loom
    list``/``show`` and the viewer agree, and an unknown cost is "cost unknown"
    everywhere, never ``$0`` in one and "n/a" in another."""
    return "cost unknown" if usd is None else f"${usd:.6f}"


class TurnTree(Protocol):
    """What :func:`cast_cost` reads: a :class:`Loom`, or a store (PostgreSQL)."""

    def children(self, turn_id: str) -> Sequence[Turn]: ...

    def entity_turns(self, entity_id: str) -> Sequence[Turn]: ...


def cast_cost(turns: Sequence[Turn], tree: TurnTree) -> float | None:
    """USD of one cast: its own ``turns`` and every turn of the entities it spawned,
    at any depth -- what the live result's meter counted, so a result rebuilt from the
    loom reports the same cost (issue 28, item 11). ``None`` if any is unknown."""
    return cost([*turns, *spawned_turns(turns, tree)])


def spawned_turns(turns: Sequence[Turn], tree: TurnTree) -> list[Turn]:
    """The turns of every entity spawned from ``turns``, and from theirs. A child starts
    at a checkpoint of its parent (its first turn's parent), so only checkpoints are asked."""
    found: list[Turn] = []
    seen: set[str] = set()
    pending = [t for t in turns if t.extras.get("phase") in CHECKPOINT_PHASES]
    while pending:
        turn = pending.pop()
        for child in tree.children(turn.id):
            if child.entity_id == turn.entity_id or child.entity_id in seen:
                continue  # the parent's own continuation, or a child already counted
            seen.add(child.entity_id)
            theirs = tree.entity_turns(child.entity_id)
            found.extend(theirs)
            pending.extend(t for t in theirs if t.extras.get("phase") in CHECKPOINT_PHASES)
    return found


def tree_turns(
    loom: Loom,
    entity_id: str,
    *,
    entities: Iterable[EntityRecord] | None = None,
    turns_of: Callable[[str], Sequence[Turn]] | None = None,
) -> list[Turn]:
    """The turns of an entity and of every entity it spawned, at any depth.

    ``entities`` and ``turns_of`` let a caller that has already read the loom
    (the viewer: one scan for every entity) answer without asking it again."""
    children: dict[str, list[str]] = {}
    for record in loom.entities.values() if entities is None else entities:
        if record.parent_entity_id:
            children.setdefault(record.parent_entity_id, []).append(record.entity_id)
    read = loom.entity_turns if turns_of is None else turns_of
    turns: list[Turn] = []
    pending = [entity_id]
    while pending:
        current = pending.pop()
        turns.extend(read(current))
        pending.extend(children.get(current, ()))
    return turns
