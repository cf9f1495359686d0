"""The timeline of a cast: a waterfall of an entity and every entity it spawned.

One row per entity (the entity, then its ``call_agent`` children depth first, each
under the parent that spawned it), one bar per turn, each bar split into the time
the turn waited for a human (after a pause), the model's time and the gates' time.

Where the time went is read from what every turn records, the same way the OTLP
export reads it (:mod:`cantrip.tracing._otlp`): a turn starts at
``metadata.timestamp`` and lasts ``metadata.duration_ms``; its gate calls take their
own ``duration_ms`` at its end, the model the rest. A delegation is recorded in pieces
(a checkpoint, then a continuation stamped with the *same* start): a continuation's
bar starts where the piece before it ended and is all gate time (the children run in
there); its model call is the checkpoint's. The gap between a paused checkpoint and
the piece that goes on after the answer is time spent waiting for a human.

Scale: the rows and bars are derived once per loom size from the turns of the
entities in the cast's tree only (``Loom.entity_turns``: a query each on SQLite and
PostgreSQL, never the whole loom), then every request is a page of rows and, in each,
the bars inside a time window (``from``, ``to``) at a resolution (``px``, the
milliseconds one screen pixel stands for, or ``width``, the pixels the window is
drawn on: 1,000 unless said): turns narrower than a pixel that sit within
a pixel of each other are sent as one *group* bar (their count, summed times and
totals, the worst status), so a 10,000-turn row is at most a few thousand items
whatever the window, and zooming in splits the groups into turns.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

from cantrip.loom._loom import Loom
from cantrip.loom._model import EntityRecord, Turn
from cantrip.loom._summary import turn_cost
from cantrip.loom._view import CHECKPOINT_PHASES
from cantrip.protocols.viewer._errors import ViewerError

ANSWERS_KEPT = 32
MAX_ITEMS_PER_ROW = 4000
"""The finest resolution a request may ask for is the window over this many pixels."""

SEVERITY = (
    "ok",
    "terminated",
    "delegating",
    "paused",
    "truncated",
    "cancelled",
    "error",
    "failed",
)
"""Statuses from least to most notable: a group bar shows its worst."""

CANCELLED_REASONS = frozenset({"cancelled", "interrupted", "parent_terminated"})
FAILED_REASONS = frozenset({"llm_error", "crashed"})


def turn_status(turn: Turn) -> str:
    """One word for a turn's outcome, as the tree, the entity list and the timeline show it:
    ``terminated`` (finished), ``truncated`` (cut off by a ward), ``cancelled``, ``failed``
    (the LLM call failed for good, or the entity crashed), ``paused`` (waiting for a human),
    ``delegating`` (children run), ``error`` (a gate call failed; the loop went on), ``ok``."""
    if turn.terminated:
        return "terminated"
    if turn.truncated:
        if turn.reason in CANCELLED_REASONS:
            return "cancelled"
        if turn.reason in FAILED_REASONS:
            return "failed"
        return "truncated"
    if turn.extras.get("phase") in CHECKPOINT_PHASES:
        return "paused" if "pending" in turn.extras else "delegating"
    if turn.is_error:
        return "error"
    return "ok"


def _epoch_ms(stamp: str) -> float | None:
    if not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp).timestamp() * 1000.0
    except ValueError:
        return None


class Bar(NamedTuple):
    """One turn on the timeline, in milliseconds since the cast's first turn began."""

    turn: Turn
    start: float
    wait: float
    model: float
    gate: float
    status: str
    tokens: int
    cost: float | None

    @property
    def end(self) -> float:
        return self.start + self.wait + self.model + self.gate


class Row(NamedTuple):
    record: EntityRecord
    depth: int
    bars: list[Bar]
    starts: list[float]
    ends: list[float]
    """Running maximum of the bars' ends: where a window's first bar is (bisect)."""
    tokens: int
    cost: float | None


_Raw = tuple[float, Turn, float, float, float]
"""(absolute start ms, turn, wait, model, gate)."""


def _bars(turns: Sequence[Turn]) -> list[_Raw]:
    """One entity's turns on the clock, in recording order."""
    out: list[_Raw] = []
    previous_end: float | None = None
    paused = False
    for turn in turns:
        meta = turn.metadata
        stamp = _epoch_ms(meta.timestamp)
        start = stamp if stamp is not None else (previous_end or 0.0)
        end = start + max(0.0, meta.duration_ms)
        calls = sum(max(0.0, r.duration_ms) for r in turn.gate_calls)
        if str(turn.extras.get("phase") or "").startswith("continuation"):
            if previous_end is not None:
                start = max(start, previous_end)
            model, gate = 0.0, max(0.0, end - start)
        else:
            gate = min(calls, end - start)
            model = end - start - gate
        wait = 0.0
        if paused and previous_end is not None and start > previous_end:
            wait, start = start - previous_end, previous_end
        out.append((start, turn, wait, model, gate))
        previous_end = max(previous_end or start, start + wait + model + gate)
        paused = "pending" in turn.extras
    return out


class CastTimeline:
    """The rows and bars of one entity's cast tree (built once per loom size)."""

    def __init__(self, loom: Loom, entity_id: str, entities: Mapping[str, EntityRecord]) -> None:
        spawned: dict[str, list[EntityRecord]] = {}
        for record in entities.values():
            if record.parent_entity_id:
                spawned.setdefault(record.parent_entity_id, []).append(record)
        raw: list[tuple[EntityRecord, int, list[_Raw]]] = []
        root = entities[entity_id]
        pending: list[tuple[EntityRecord, int, list[_Raw]]] = [
            (root, 0, _bars(loom.entity_turns(entity_id)))
        ]
        while pending:
            record, depth, bars = pending.pop()
            raw.append((record, depth, bars))
            children = [
                (child, depth + 1, _bars(loom.entity_turns(child.entity_id)))
                for child in spawned.get(record.entity_id, ())
            ]
            children.sort(key=lambda c: c[2][0][0] if c[2] else float("inf"))  # by when it began
            pending.extend(reversed(children))
        starts = [b[0] for _, _, bars in raw for b in bars]
        self.origin = min(starts) if starts else 0.0
        """The cast's first turn's start (epoch ms): every time below is relative to it."""
        self.rows: list[Row] = []
        for record, depth, bars in raw:
            made = [
                Bar(
                    turn,
                    start - self.origin,
                    wait,
                    model,
                    gate,
                    turn_status(turn),
                    turn.metadata.tokens_prompt + turn.metadata.tokens_completion,
                    turn_cost(turn),
                )
                for start, turn, wait, model, gate in bars
            ]
            made.sort(key=lambda b: b.start)
            ends: list[float] = []
            for bar in made:
                ends.append(max(ends[-1], bar.end) if ends else bar.end)
            starts = [b.start for b in made]
            tokens = sum(b.tokens for b in made)
            self.rows.append(Row(record, depth, made, starts, ends, tokens, _total(made)))
        self.span = max((row.ends[-1] for row in self.rows if row.ends), default=0.0)
        self._answers: dict[tuple[int, int, float, float, float], dict[str, Any]] = {}
        """Pages already answered (the same window asked again: a reload, a zoom back)."""
        self._singles: dict[str, dict[str, Any]] = {}
        """A lone bar's item, made once (a warm request only groups the narrow ones)."""

    def page(self, offset: int, limit: int, query: Mapping[str, Sequence[str]]) -> dict[str, Any]:
        low = _number(query, "from", 0.0)
        high = _number(query, "to", self.span)
        if high < low:
            low, high = high, low
        width = max(high - low, 1e-3)
        pixels = _number(query, "width", 1000.0)  # the track's width on screen
        px = max(_number(query, "px", width / max(pixels, 1.0)), width / MAX_ITEMS_PER_ROW)
        key = (offset, limit, low, high, px)
        answer = self._answers.get(key)
        if answer is None:
            if len(self._answers) >= ANSWERS_KEPT:
                del self._answers[next(iter(self._answers))]
            answer = self._answers[key] = self._page(offset, limit, low, high, px)
        return answer

    def _page(self, offset: int, limit: int, low: float, high: float, px: float) -> dict[str, Any]:
        rows = self.rows[offset : offset + limit]
        return {
            "origin": (
                datetime.fromtimestamp(self.origin / 1000.0, UTC).isoformat()
                if any(row.bars for row in self.rows)
                else None  # no turn yet: no clock
            ),
            "span_ms": self.span,
            "from": low,
            "to": high,
            "px": px,
            "total": len(self.rows),
            "offset": offset,
            "limit": limit,
            "items": [self._row(row, low, high, px) for row in rows],
        }

    def _row(self, row: Row, low: float, high: float, px: float) -> dict[str, Any]:
        record, bars = row.record, row.bars
        first = bisect.bisect_left(row.ends, low)
        last = bisect.bisect_right(row.starts, high)
        return {
            "entity_id": record.entity_id,
            "depth": row.depth,
            "parent_entity_id": record.parent_entity_id,
            "spawned_from": record.spawned_from,
            "medium": record.medium,
            "turns": len(bars),
            "status": bars[-1].status if bars else "new",
            "tokens": row.tokens,
            "cost_usd": row.cost,
            "start_ms": bars[0].start if bars else None,
            "end_ms": row.ends[-1] if bars else None,
            "bars": self._grouped(bars[first:last], px),
        }

    def _grouped(self, bars: Sequence[Bar], px: float) -> list[dict[str, Any]]:
        """The bars as sent: a bar at least a pixel wide alone; narrower ones within a
        pixel of each other as one group at most a pixel wide (see the module docstring)."""
        out: list[dict[str, Any]] = []
        group: list[Bar] = []
        singles = self._singles

        def flush() -> None:
            if len(group) == 1:
                alone(group[0])
            elif group:
                out.append(_item(group))
            group.clear()

        def alone(bar: Bar) -> None:
            item = singles.get(bar.turn.id)
            if item is None:
                item = singles[bar.turn.id] = _item([bar])
            out.append(item)

        for bar in bars:
            if bar.end - bar.start >= px:
                flush()
                alone(bar)
                continue
            if group and (bar.start > group[-1].end + px or bar.end - group[0].start > px):
                flush()
            group.append(bar)
        flush()
        return out


def _total(bars: Sequence[Bar]) -> float | None:
    """The bars' cost: unknown if any is (never counted as 0)."""
    total = 0.0
    for bar in bars:
        if bar.cost is None:
            return None
        total += bar.cost
    return round(total, 9)


def _item(bars: Sequence[Bar]) -> dict[str, Any]:
    first, last = bars[0], bars[-1]
    item: dict[str, Any] = {
        "id": first.turn.id,
        "sequence": first.turn.sequence,
        "turns": len(bars),
        "start_ms": round(first.start, 3),
        "end_ms": round(max(b.end for b in bars), 3),
        "wait_ms": round(sum(b.wait for b in bars), 3),
        "model_ms": round(sum(b.model for b in bars), 3),
        "gate_ms": round(sum(b.gate for b in bars), 3),
        "tokens": sum(b.tokens for b in bars),
        "cost_usd": _total(bars),
        "status": max((b.status for b in bars), key=SEVERITY.index),
    }
    if len(bars) == 1:
        turn = first.turn
        item.update(
            reason=turn.reason,
            phase=turn.extras.get("phase"),
            gates=[r.gate for r in turn.gate_calls],
        )
    else:
        counts: dict[str, int] = {}
        for bar in bars:
            counts[bar.status] = counts.get(bar.status, 0) + 1
        item.update(last_id=last.turn.id, last_sequence=last.turn.sequence, statuses=counts)
    return item


def _number(query: Mapping[str, Sequence[str]], name: str, default: float) -> float:
    values = query.get(name)
    if not values:
        return default
    try:
        value = float(values[-1])
    except ValueError:
        raise ViewerError(400, "bad_request", f"{name} must be a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ViewerError(400, "bad_request", f"{name} must be a finite number")
    if name in ("px", "width") and value <= 0:
        raise ViewerError(400, "bad_request", f"{name} must be above 0")
    return value
