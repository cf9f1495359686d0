"""Two threads side by side: aligned from their common ancestor, what differs marked.

Two forks of one turn, a replay and its recording, two runs of one eval case: each
side is a thread (root to a leaf; an entity stands for its latest turn). A fork's
thread holds the prefix it was forked from (LOOM-4), so two forks share turns up to the
turn they branched from -- the *common ancestor* -- and are aligned after it, turn by
turn; threads that share nothing (two separate casts) are aligned from their roots.

What differs within a pair is named, never shown here (the page fetches both turns,
redacted, and marks the named sections): ``request`` (the cast's intent or the messages
sent during it -- the new input the turn saw besides the thread before it),
``utterance`` (text, code or tool calls), ``gate_calls[i].gate|args|result|status``,
``observation``, ``outcome`` (how the turn ended, and its result), or ``missing`` (one
thread is longer). The first pair that differs is the *first difference*.

Both threads are read with ``Loom.thread`` (one recursive query on SQLite and
PostgreSQL), never the whole loom, and the pairs are paged like every list.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import zip_longest
from typing import Any

from cantrip._errors import LoomError
from cantrip.loom._loom import Loom
from cantrip.loom._model import Turn
from cantrip.protocols.viewer._errors import ViewerError
from cantrip.protocols.viewer._timeline import turn_status

PREVIEW = 120


def resolve(loom: Loom, ref: str) -> Turn:
    """A turn id, or an entity id for its latest turn."""
    if loom.has_turn(ref):
        return loom.get(ref)
    try:
        loom.entity(ref)
    except LoomError:
        raise ViewerError(404, "unknown_ref", f"no turn or entity {ref!r}") from None
    last = loom.last_turn(ref)
    if last is None:
        raise ViewerError(404, "unknown_ref", f"entity {ref!r} has no turns yet")
    return last


def differences(a: Turn | None, b: Turn | None) -> list[str]:
    """The names of what differs between two aligned turns (empty: the same)."""
    if a is None or b is None:
        return [] if a is b else ["missing"]
    out: list[str] = []
    if (a.intent, a.extras.get("steering")) != (b.intent, b.extras.get("steering")):
        out.append("request")
    said_a = (a.content, a.utterance, [(c.name, c.arguments) for c in a.tool_calls])
    said_b = (b.content, b.utterance, [(c.name, c.arguments) for c in b.tool_calls])
    if said_a != said_b:
        out.append("utterance")
    for index, (x, y) in enumerate(zip_longest(a.gate_calls, b.gate_calls)):
        if x is None or y is None:
            out.append(f"gate_calls[{index}]")
            continue
        for field in ("gate", "args", "result", "status"):
            if getattr(x, field) != getattr(y, field):
                out.append(f"gate_calls[{index}].{field}")
    if a.observation != b.observation:
        out.append("observation")
    ending_a = (a.terminated, a.truncated, a.reason, a.result)
    if ending_a != (b.terminated, b.truncated, b.reason, b.result):
        out.append("outcome")
    return out


def _side(turn: Turn | None) -> dict[str, Any] | None:
    if turn is None:
        return None
    text = " ".join((turn.content or turn.utterance or "").split())
    return {
        "id": turn.id,
        "entity_id": turn.entity_id,
        "sequence": turn.sequence,
        "status": turn_status(turn),
        "preview": text if len(text) <= PREVIEW else text[: PREVIEW - 1] + "…",
        "gates": [r.gate for r in turn.gate_calls],
    }


def _common(left: Sequence[Turn], right: Sequence[Turn]) -> int:
    shared = 0
    for x, y in zip(left, right, strict=False):
        if x.id != y.id:
            break
        shared += 1
    return shared


def compare(loom: Loom, a: str, b: str, offset: int, limit: int) -> dict[str, Any]:
    """A page of the aligned pairs of the threads ending at ``a`` and ``b``."""
    leaf_a, leaf_b = resolve(loom, a), resolve(loom, b)
    left, right = loom.thread(leaf_a.id), loom.thread(leaf_b.id)
    shared = _common(left, right)
    pairs = list(zip_longest(left[shared:], right[shared:]))
    differs = [differences(x, y) for x, y in pairs]
    first = next((i for i, d in enumerate(differs) if d), None)
    ancestor = left[shared - 1] if shared else None
    return {
        "a": {"ref": a, "leaf": leaf_a.id, "entity_id": leaf_a.entity_id, "turns": len(left)},
        "b": {"ref": b, "leaf": leaf_b.id, "entity_id": leaf_b.entity_id, "turns": len(right)},
        "common": shared,
        "ancestor": _side(ancestor),
        "first_difference": first,
        "different": sum(1 for d in differs if d),
        "total": len(pairs),
        "offset": offset,
        "limit": limit,
        "items": [
            {"index": i, "a": _side(x), "b": _side(y), "differs": differs[i]}
            for i, (x, y) in enumerate(pairs[offset : offset + limit], start=offset)
        ],
    }
