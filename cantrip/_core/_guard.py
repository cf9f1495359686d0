"""Guardrails in the turn loop: ``input`` before or beside the model call, ``output``
before an answer is recorded as final, and the trip that ends a cast.

The loop (:mod:`cantrip._core._loop`) and a turn's ending
(:mod:`cantrip._core._conclude`) call in here only when the circle has guardrails
(``circle.guard`` is not ``None``). What the loom records:

* a trip ends the cast truncated with reason ``guardrail``; the last turn's
  ``extras.guardrail`` says which check (``check``), on what (``on``: input, output,
  call or result; ``gate`` for the last two) and why (``why``);
* what the model had produced is kept, marked: an utterance answered beside a
  tripped input check is recorded with its calls ``cancelled`` (``kept:
  "utterance"``); a withheld final answer is kept as ``extras.guardrail.withheld``;
  a withheld gate result in its record's ``detail.guardrail.withheld``;
* a rewrite is recorded rewritten (the intent, a steering message, the answer, a
  call's arguments, a result), with the names of the checks that rewrote it
  (``extras.guardrails_rewrote`` on a turn, ``detail.rewritten_by`` on a call);
* a check that fails records the turn truncated with reason ``guardrail_error``
  and raises :class:`~cantrip.GuardrailError`, the check named.
"""

from __future__ import annotations

from typing import Any

from cantrip._core._cast import Cast, Inflight
from cantrip._core._cast_context import show_cast_context
from cantrip._core._host import TurnHost
from cantrip._core._recording import record_cut
from cantrip._core._state import EntityState
from cantrip._outcome import CastResult
from cantrip.guardrails._model import GuardrailError
from cantrip.guardrails._run import Guard, Tripped
from cantrip.llm._contract import plain_json


async def check_inputs(
    entity: EntityState, guard: Guard, cast: Cast, inflight: Inflight
) -> tuple[list[str], CastResult | None]:
    """Run the blocking input checks on the intent (first turn of a fresh cast) and
    on the steering messages this turn took, apply their rewrites, and put the
    texts in the context. Returns the texts the other input checks watch beside the
    model call, or the cast's result if a check tripped."""
    context = entity._context
    texts: list[str] = []
    rewrote: list[str] = []
    if cast.unchecked_intent:
        checked = await guard.check("input", cast.intent, entity_id=entity.id)
        if checked.tripped is not None:
            return texts, trip_cast(entity, cast, checked.tripped)
        cast.intent = checked.value
        cast.unchecked_intent = False
        rewrote.extend(checked.rewrote)
        context.add_intent(cast.intent)
        show_cast_context(entity, cast)  # what memory adds follows the intent
        texts.append(cast.intent)
    if inflight.steering:
        kept: list[str] = []
        for message in inflight.steering:
            checked = await guard.check("input", message, entity_id=entity.id)
            if checked.tripped is not None:
                return texts, trip_cast(entity, cast, checked.tripped)
            kept.append(checked.value)
            rewrote.extend(checked.rewrote)
        inflight.steering = tuple(kept)
        context.add_steering(inflight.steering)
        texts.extend(kept)
    if rewrote:
        inflight.rewrote = (*inflight.rewrote, *rewrote)
    return texts, None


def trip_cast(entity: EntityState, cast: Cast, tripped: Tripped) -> CastResult:
    """End the cast at a trip before (or instead of) the model's answer: the turn in
    flight is recorded truncated, reason ``guardrail``; an answer the model had given
    is kept with its calls not run."""
    inflight = entity._inflight
    note: dict[str, Any] = tripped.note()
    if inflight is not None and inflight.response is not None:
        note["kept"] = "utterance"  # what the model said, never acted on
    turn = record_cut(
        entity,
        cast,
        "guardrail",
        observation=f"stopped by guardrail {tripped.check!r} on {tripped.where}: {tripped.why}",
        extras=_with_rewrites(inflight, {"guardrail": note}),
    )
    return cast.result(entity.id, turn, None)


def _with_rewrites(inflight: Inflight | None, extras: dict[str, Any]) -> dict[str, Any]:
    if inflight is not None and inflight.rewrote:
        extras["guardrails_rewrote"] = list(inflight.rewrote)
    return extras


def rewrites(inflight: Inflight) -> dict[str, Any]:
    """``extras`` naming the checks that rewrote this turn's inputs or answer."""
    return _with_rewrites(inflight, {})


def record_failure(entity: EntityState, cast: Cast, error: GuardrailError) -> None:
    """Record the turn a failing check ended (reason ``guardrail_error``); the caller
    raises the error."""
    record_cut(
        entity,
        cast,
        "guardrail_error",
        observation=f"guardrail error: {error}",
        extras={
            "error": str(error),
            "error_type": type(error).__name__,
            "guardrail": {"check": error.check, "on": error.where},
        },
    )


async def guarded_outcome(
    entity: EntityState,
    guard: Guard,
    host: TurnHost,
    inflight: Inflight,
    terminated: bool,
    result: Any,
) -> tuple[bool, Any, dict[str, Any] | None]:
    """``(terminated, result, extras.guardrail)`` of an executed utterance: a trip on
    one of its calls or results ends the cast; a final answer is checked by the
    output guardrails before it is recorded as final (a rewrite replaces it, a trip
    withholds it: kept in the loom as ``withheld``)."""
    if host.failed is not None:
        raise host.failed
    if host.tripped is not None:
        return False, None, host.tripped.note()
    if terminated and guard.has("output"):
        checked = await guard.check("output", result, entity_id=entity.id)
        if checked.tripped is not None:
            return False, None, {**checked.tripped.note(), "withheld": plain_json(result)}
        if checked.rewrote:
            inflight.rewrote = (*inflight.rewrote, *checked.rewrote)
            return True, checked.value, None
    return terminated, result, None
