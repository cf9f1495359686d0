"""How a cast ended: the one builder of a :class:`CastResult`, and its one JSON shape.

A cast's result is built in three settings -- live, as the entity's loop ends it
(:class:`~cantrip.Entity`); from the loom, for an idempotent replay or a
``serve --db`` prompt whose worker ran it (:func:`recorded_cast`); and by a worker,
for the outcome it stores in ``cantrip_work`` -- and reported by the CLI's ``--json``,
both HTTP servers, ``cast --db --json`` and the workers' table. Each setting used to
build and serialise it its own way, and they drifted (issue 28.12): here is the one
builder (:func:`cast_result`) and the one serialiser (:func:`result_dict`, redacted).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs

from cantrip._approval import Pause
from cantrip._redact import redact_value
from cantrip.llm._contract import ZERO_USAGE, Usage, plain_json
from cantrip.loom._model import Turn, result_text
from cantrip.loom._summary import TurnTree, cast_cost


@attrs.frozen
class CastResult:
    """How one cast ended, with what it cost."""

    result: Any
    terminated: bool
    truncated: bool
    reason: str | None
    entity_id: str
    turns: tuple[Turn, ...]
    usage: Usage
    partial: str | None = None
    """For a cast cut off by the output-token limit (reason ``max_tokens``): the
    text the model had written, never a final answer (issue 22)."""
    summary: str | None = None
    """For a truncated cast: what happened before the ward cut in (LOOP-4)."""
    cost_usd: float | None = None
    """USD this cast and the casts it spawned spent; ``None`` if a price is unknown."""
    pending: tuple[Pause, ...] = ()
    """Calls waiting for a human: the cast is paused (``reason == "paused"``); answer
    them with :meth:`Entity.answer` to continue it."""
    undelivered: tuple[str, ...] = ()
    """Steering messages (:meth:`Entity.steer`) that arrived too late to join a turn:
    the cast ended first."""

    @property
    def paused(self) -> bool:
        return bool(self.pending)

    @property
    def text(self) -> str:
        return result_text(self.result)


_RECORDED: Any = object()
"""``value`` not given: the result is what the last turn recorded."""


def cast_result(
    turns: Sequence[Turn],
    *,
    entity_id: str | None = None,
    value: Any = _RECORDED,
    cost_usd: float | None,
    usage: Usage | None = None,
    pending: Sequence[Pause] = (),
) -> CastResult:
    """The result of the cast made of ``turns``, ending on the last (a paused cast may
    have none yet: then ``entity_id`` is needed).

    ``pending``: the calls it waits on (a paused cast). A last turn that neither
    terminated nor truncated the cast and is no pause means the process running it
    died: truncated, reason ``interrupted``. ``value``: the result a live cast parsed
    (an output model); by default what the last turn recorded. ``usage``: by default
    the sum of the turns' usage."""
    if usage is None:
        usage = ZERO_USAGE
        for turn in turns:
            usage = usage + turn.metadata.usage
    result, terminated, truncated = None, False, False
    reason: str | None = "paused"
    summary = partial = None
    if not pending:
        last = turns[-1]
        terminated = last.terminated
        truncated = not terminated
        if terminated:
            result = last.result if value is _RECORDED else value
            reason = last.reason
        else:
            reason = last.reason if last.truncated else "interrupted"
            summary = truncation_summary(turns, reason)
            partial = cut_text(turns)
    return CastResult(
        result=result,
        terminated=terminated,
        truncated=truncated,
        reason=reason,
        entity_id=entity_id or turns[-1].entity_id,
        turns=tuple(turns),
        usage=usage,
        partial=partial,
        summary=summary,
        cost_usd=cost_usd,
        pending=tuple(pending),
    )


def recorded_cast(turns: Sequence[Turn], start: int, tree: TurnTree) -> CastResult:
    """The cast whose first turn is ``turns[start]``, as the loom recorded it (it runs
    to the turn before the next cast's first); its cost counts the entities it spawned,
    read from ``tree`` (the loom or the store), as the live result's does. A cast that
    ends on a pause is reported ``paused`` with its pending call (the cast waits for a
    human to answer)."""
    cast = [turns[start]]
    for turn in turns[start + 1 :]:
        if turn.intent is not None:  # the next cast begins
            break
        cast.append(turn)
    last = cast[-1]
    marker = last.extras.get("pending")
    finished = last.terminated or last.truncated
    paused = not finished and isinstance(marker, Mapping)
    pending = (Pause.from_dict(marker, checkpoint_id=last.id),) if paused else ()  # type: ignore[arg-type]
    return cast_result(cast, cost_usd=cast_cost(cast, tree), pending=pending)


def cut_text(turns: Sequence[Turn]) -> str | None:
    """The text of the answers at the end of ``turns`` that the token limit cut off
    (one cut-off answer and the continuations before it), from the loom's turns."""
    pieces: list[str] = []
    for turn in reversed(turns):
        if turn.extras.get("cut_off") != "max_tokens":
            break
        pieces.append(turn.content or "")
    return "".join(reversed(pieces)) or None


def guardrail_note(turns: Sequence[Turn]) -> dict[str, Any] | None:
    """Which guardrail ended a cast (reason ``guardrail``), on what and why, as the
    front ends tell it: the last turn's ``extras.guardrail`` without what it withheld
    (that stays in the loom)."""
    note = turns[-1].extras.get("guardrail") if turns else None
    if not isinstance(note, Mapping) or turns[-1].reason != "guardrail":
        return None
    return {key: note[key] for key in ("check", "on", "why", "gate") if key in note}


def truncation_summary(turns: Sequence[Turn], reason: str | None) -> str:
    if reason == "guardrail" and (note := guardrail_note(turns)) is not None:
        gate = f" (gate {note['gate']})" if "gate" in note else ""
        return (
            f"Stopped by guardrail {note.get('check')!r} on {note.get('on')}{gate} after "
            f"{len(turns)} turn(s): {note.get('why')}"
        )
    if reason == "max_tokens":
        partial = cut_text(turns)
        return (
            f"Cut off by the output token limit (max_tokens) after {len(turns)} turn(s); "
            "this is not a finished answer. "
            + (f"Partial answer:\n{partial}" if partial else "Nothing was written before the cut.")
        )
    calls = [r for t in turns for r in t.gate_calls]
    errors = sum(1 for r in calls if r.is_error)
    gates = sorted({r.gate for r in calls})
    last = turns[-1].observation if turns else ""
    preview = (last[:150] + "...") if len(last) > 150 else last
    return (
        f"Truncated by {reason} after {len(turns)} turn(s) without calling done; "
        f"{len(calls)} gate call(s) ({errors} failed) to {', '.join(gates) or 'no gates'}. "
        f"Last observation: {preview!r}"
    )


# -- the one JSON shape ----------------------------------------------------------------

STOP_REASONS = {
    "guardrail": "refusal",  # a guardrail tripped: ACP's refusal, each protocol's own
    "max_tokens_total": "max_tokens",
    "max_tokens": "max_tokens",  # the answer was cut off by the output-token limit
    "cancelled": "cancelled",
    "shutdown": "cancelled",
    "interrupted": "cancelled",
}


def refused(outcome: CastResult | None) -> bool:
    """Whether a guardrail ended the cast (stop reason ``refusal``): the one test every
    front end makes to give it its distinct answer (CLI exit code, AG-UI ``RUN_ERROR``
    code ``guardrail``, A2A ``rejected``, MCP ``isError``, ACP ``refusal``)."""
    return outcome is not None and stop_reason(outcome) == "refusal"


def stop_reason(outcome: CastResult | None) -> str:
    """ACP's ``stopReason`` for a cast (HTTP reports the same)."""
    if outcome is None:
        return "cancelled"
    return stop_reason_for(outcome.terminated, outcome.reason)


def stop_reason_for(terminated: bool, reason: str | None) -> str:
    """:func:`stop_reason` from what a queued cast's outcome records."""
    if terminated:
        return "end_turn"
    return STOP_REASONS.get(reason or "", "max_turn_requests")


class SessionIds(Protocol):
    """What :func:`result_dict` reads of a session (``id``, ``entity_id``)."""

    @property
    def id(self) -> str: ...
    @property
    def entity_id(self) -> str: ...


def result_dict(outcome: CastResult | None, session: SessionIds | None = None) -> dict[str, Any]:
    """A cast's outcome as every front end reports it and the workers store it
    (``--json``, the HTTP API, ``cast --db --json``, ``cantrip_work.result``): plain JSON,
    every string redacted. ``None``: a cast cancelled before its first turn."""
    data: dict[str, Any]
    if outcome is None:
        data = {
            "result": None,
            "terminated": False,
            "truncated": True,
            "reason": "cancelled",
            "turns": 0,
            "entity_id": session.entity_id if session else None,
            "usage": None,
            "cost_usd": None,
            "summary": "cancelled before the first turn",
        }
    else:
        data = {
            "result": plain_json(outcome.result),
            "terminated": outcome.terminated,
            "truncated": outcome.truncated,
            "reason": outcome.reason,
            "turns": len(outcome.turns),
            "entity_id": outcome.entity_id,
            "usage": outcome.usage.to_dict(),
            "cost_usd": outcome.cost_usd,
            **({"pending": [p.to_dict() for p in outcome.pending]} if outcome.pending else {}),
            "summary": outcome.summary,
        }
        if outcome.partial is not None:
            data["partial"] = outcome.partial  # cut off: never under "result"
        if outcome.undelivered:
            data["undelivered"] = list(outcome.undelivered)
        if outcome.reason == "guardrail" and (note := guardrail_note(outcome.turns)):
            data["guardrail"] = note
    data["stop_reason"] = stop_reason(outcome)
    if session is not None:
        data["session_id"] = session.id
    return redact_value(data)  # type: ignore[no-any-return]
