"""A turn's ending: what an executed utterance amounts to, recorded as a turn.

Apart from the loop (:mod:`._loop`) because two paths end a turn the same way: a
turn the loop took, and a paused turn going on after its answer
(:func:`._loop.continue_paused`). Here it is decided whether the cast ends -- the
``done`` gate, a text-only answer, a ward (``max_turns``, budgets, cost, the loop
ward), an answer the output-token limit cut off (continued while
``max_continuations`` allows) or, in a circle with guardrails, a trip or an output
check (:mod:`._guard`) -- and the turn is recorded (LOOM-1, :mod:`._recording`) with
the extras that say why. Nothing here queries the LLM or runs the medium.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cantrip._context import NUDGE_DONE_REQUIRED
from cantrip._core._budget import TOKENS
from cantrip._core._cast import Cast, Inflight
from cantrip._core._guard import guarded_outcome, rewrites
from cantrip._core._recording import new_turn, record, turn_metadata, utterance
from cantrip._core._repeats import repeat_note
from cantrip._core._state import EntityState
from cantrip._events import FinalResponse, StepComplete
from cantrip._outcome import CastResult, cut_text
from cantrip._wards import WardSet, spent_after
from cantrip.llm._contract import Response
from cantrip.llm._stream import Event
from cantrip.loom._model import GateCallRecord
from cantrip.medium import Execution

CONTINUE_CUT_OFF = (
    "Your reply was cut off by the output token limit. Continue exactly where it "
    "stopped, without repeating anything you already wrote."
)


Final = tuple[bool, bool, Any, str, "str | None"]
"""What an executed utterance amounts to: (cut off, terminated, result, observation,
reason so far)."""


def _final(cast: Cast, response: Response, execution: Execution, wards: WardSet) -> Final:
    cut = execution.text_only and response.stop_reason == "max_tokens"
    if cut:
        # Cut off by the output-token limit: never a final answer (issue 22).
        observation, reason = _cut_off(cast, response, wards)
        return True, False, None, observation, reason
    terminated, result, observation = _outcome(response, execution, wards.require_done_tool)
    if terminated and execution.text_only and cast.continuations:
        result = (cut_text(cast.turns) or "") + (response.content or "")
    return False, terminated, result, observation, None


async def conclude_guarded(
    entity: EntityState,
    cast: Cast,
    inflight: Inflight,
    execution: Execution,
    emit: Callable[[Event], None] | None,
) -> CastResult | None:
    """:func:`conclude` in a circle with guardrails: a trip on a call or a result, or
    the output checks on a final answer, decide first (:mod:`._guard`)."""
    response, host, guard = inflight.response, inflight.host, entity.circle.guard
    assert response is not None and host is not None and guard is not None
    cut, terminated, result, observation, reason = _final(
        cast, response, execution, entity.circle.resolved
    )
    terminated, result, note = await guarded_outcome(
        entity, guard, host, inflight, terminated, result
    )
    final = (cut, terminated, result, observation, "guardrail" if note else reason)
    return conclude(entity, cast, inflight, execution, emit, final, note)


def conclude(
    entity: EntityState,
    cast: Cast,
    inflight: Inflight,
    execution: Execution,
    emit: Callable[[Event], None] | None,
    final: Final | None = None,
    guard_note: dict[str, Any] | None = None,
) -> CastResult | None:
    """Record an executed utterance as a turn; the cast's result if it ends here
    (``final``, ``guard_note``: as :func:`conclude_guarded` decided them)."""
    response, host = inflight.response, inflight.host
    assert response is not None and host is not None
    wards = entity.circle.resolved
    if final is None:
        final = _final(cast, response, execution, wards)
    cut, terminated, result, observation, reason = final
    if terminated:
        reason = "text" if execution.text_only else "done"
    elif reason is None:
        max_turns = wards.max_turns
        if max_turns is not None and cast.utterances >= max_turns:
            reason = "max_turns"
        elif cast.budget.stop is not None:
            reason = cast.budget.stop[0]  # a gate call or a child refused by its budget
        elif cast.budget.bounded and cast.budget.reached(
            TOKENS, response.usage.total_tokens if inflight.checkpoint_id is None else 0
        ):
            reason = TOKENS
        elif cast.meter.bounded and spent_after(
            cast.meter,
            response,
            entity.llm,
            cast.prices,
            checkpointed=inflight.checkpoint_id is not None,
        ):
            reason = "max_cost_usd"
    said_text = utterance(response) if inflight.checkpoint_id is None else None
    loop_note = None
    if reason is None and not terminated and (repeats := wards.get("max_repeats")):
        loop_note = repeat_note(
            int(repeats), cast.turns, _calls_of(inflight, execution), said_text, observation
        )
        reason = "loop" if loop_note is not None else None
    truncated = not terminated and reason is not None
    said: dict[str, Any] = {
        "utterance": said_text,
        "content": response.content,
        "thinking": response.thinking,
        "tool_calls": response.tool_calls,
        "reasoning": response.reasoning,
    }
    extras = {**execution.extras, "cut_off": "max_tokens"} if cut else execution.extras
    gate_calls = execution.gate_calls
    if inflight.checkpoint_id is not None:
        # The utterance is in the checkpoint; this turn completes it.
        said = {}
        extras = {**extras, "phase": "continuation"}
        gate_calls = _calls_of(inflight, execution)
    if loop_note is not None:
        extras = {**extras, "loop": loop_note}  # why the loop ward ended the cast
    if cast.budget.stop is not None and reason == cast.budget.stop[0]:
        extras = {**extras, "budget": cast.budget.stop[1]}  # which budget refused what
    if guard_note is not None:
        extras = {**extras, "guardrail": guard_note}  # which check, on what, why
    if inflight.rewrote:
        extras = {**extras, **rewrites(inflight)}
    turn = record(
        entity,
        new_turn(
            entity,
            cast.intent_for_turn(),
            observation=observation,
            gate_calls=gate_calls,
            metadata=turn_metadata(
                response,
                inflight.started,
                inflight.timestamp,
                # a checkpoint already carries this reply's usage (PROD-3)
                count_usage=inflight.checkpoint_id is None,
                llm=entity.llm,
                prices=cast.prices,
            ),
            terminated=terminated,
            truncated=truncated,
            reason=reason,
            result=result if terminated else None,
            extras=extras,
            **said,
        ),
    )
    entity._inflight = None
    cast.add(turn)
    if emit is not None:
        emit(StepComplete(turn=turn))
        if terminated:
            emit(FinalResponse(result=result))
    if terminated or truncated:
        output = entity.circle.output
        if terminated and reason == "done" and output is not None:
            result = output.load(result)  # the parsed value (a model)
        return cast.result(entity.id, turn, result if terminated else None)
    return None


def _calls_of(inflight: Inflight, execution: Execution) -> tuple[GateCallRecord, ...]:
    """The gate calls a turn records: a continuation's are those its checkpoints
    did not hold yet."""
    if inflight.checkpoint_id is None:
        return tuple(execution.gate_calls)
    assert inflight.host is not None
    return tuple(inflight.host.records[inflight.recorded_upto :])


def _outcome(response: Response, execution: Execution, require_done: bool) -> tuple[bool, Any, str]:
    """(terminated, result, observation text) of one executed utterance."""
    if execution.text_only:
        if require_done:
            return False, None, NUDGE_DONE_REQUIRED
        return True, response.content, ""
    return execution.terminated, execution.result, execution.observation


def _cut_off(cast: Cast, response: Response, wards: WardSet) -> tuple[str, str | None]:
    """(observation, reason) of a text answer the token limit cut off.

    With continuations left (the ``max_continuations`` ward, default 0) the
    model is asked to go on and the pieces are joined when it finishes;
    otherwise the cast ends truncated with reason ``max_tokens``. An answer
    cut off before it said anything is not continued: the same request
    would be cut again.
    """
    allowed = int(wards.get("max_continuations") or 0)
    if response.content and cast.continuations < allowed:
        cast.continuations += 1
        return CONTINUE_CUT_OFF, None
    return "cut off: the answer reached the output token limit (max_tokens)", "max_tokens"
