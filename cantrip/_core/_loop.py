"""The turn loop: one cast, turn by turn, until done or a ward (ENTITY-5).

Each turn queries the LLM, lets the medium execute the utterance through the
turn's gate host, records the turn in the loom *before* the next turn begins
(LOOM-1, :mod:`._recording`), and has :mod:`._conclude` decide whether the cast
goes on: the ``done`` gate, a text-only answer (when ``done`` is not required) or a
ward ends it. Around the loop: the gate providers a cast opens, the timeout ward,
and how a cast that is cut off, cancelled, paused or crashed is recorded.

Failures inside the loop are observations. An LLM that cannot answer (after
the retries inside the turn) ends the cast: the turn is recorded as truncated
with reason ``llm_error`` and the :class:`~cantrip.LLMError` propagates. Any
other exception is a runtime bug and is deliberately not caught here.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio
import trio.lowlevel

from cantrip._approval import Decision, Pause
from cantrip._core._budget import TOKENS, TreeBudget, budget_notice
from cantrip._core._cast import Cast, Inflight
from cantrip._core._cast_context import show_cast_context
from cantrip._core._conclude import conclude, conclude_guarded
from cantrip._core._guard import check_inputs, record_failure, trip_cast
from cantrip._core._host import TurnHost
from cantrip._core._pauses import PauseExit, Pauses, rest_of_utterance
from cantrip._core._recording import (
    failed_turn,
    now,
    record,
    record_cut,
    turn_journal,
)
from cantrip._core._state import EntityState
from cantrip._cost import CostMeter
from cantrip._errors import CastSuspended, IntentError, LLMError, ProviderError
from cantrip._events import (
    MessageComplete,
    StepComplete,
    StepStart,
    ToolResultEvent,
    UsageEvent,
)
from cantrip._journal import TurnJournal
from cantrip._outcome import CastResult
from cantrip._providers import ProviderScope
from cantrip._replay import restore_session
from cantrip._running import CURRENT_ENTITY
from cantrip._values import OBSERVATION_CAP_CHARS
from cantrip._wards import cost_refusal
from cantrip.guardrails._model import GuardrailError
from cantrip.llm._contract import Response, can_stream
from cantrip.llm._cost import response_cost
from cantrip.llm._retry import UNREACHABLE
from cantrip.llm._stream import Event
from cantrip.loom._fence import LeaseLostError
from cantrip.loom._model import Turn
from cantrip.medium import MediumSession, capped_execution

FirstStep = Callable[[], Awaitable[CastResult | None]]
"""A step run before the loop: it continues a paused turn (None: the loop goes on)."""


# -- a cast ---------------------------------------------------------------------------


async def run_cast(
    entity: EntityState,
    pauses: Pauses,
    cast: Cast,
    *,
    fresh: bool,
    first: FirstStep | None = None,
) -> CastResult:
    """Run a cast's loop (after ``first``, a step that continues a paused turn),
    with the timeout ward, and record how it ends whatever ends it."""
    if entity._closed:
        raise IntentError(f"entity {entity.id} is closed; summon a new one")
    steering = entity._steering
    try:
        if entity.cantrip.circle.providers and not entity._provided:
            per_cast = await _open_providers(entity)
            if per_cast is not None:
                try:
                    result = await _run_cast_here(entity, pauses, cast, fresh=fresh, first=first)
                finally:
                    entity._provided = False
                    entity._providers = None
                    await per_cast.aclose()
                return steering.undelivered(result)
        result = await _run_cast_here(entity, pauses, cast, fresh=fresh, first=first)
        return steering.undelivered(result)
    finally:
        steering.clear()  # a message never outlives the cast it was sent to


async def _open_providers(entity: EntityState) -> ProviderScope | None:
    """Open the circle's gate providers and add their gates to the entity's
    circle. Returns the scope when it lives for this cast only (no entity
    nursery and none lent); a provider that fails to open raises
    :class:`~cantrip.ProviderStartError` before any turn is taken."""
    base = entity.cantrip.circle
    scope = entity._providers
    per_cast: ProviderScope | None = None
    if scope is None:
        if entity.provider_nursery is not None:
            scope = ProviderScope.lent(entity.provider_nursery)
        else:
            scope = per_cast = await ProviderScope.enter()
        entity._providers = scope
    try:
        gates = await scope.open_all(base.providers, base.gates)
    except BaseException:
        # open_all closed what it had opened; the entity's own nursery stays
        # for __aexit__, a per-cast one is left now, a lent one is forgotten.
        if not scope.owns_nursery or per_cast is not None:
            entity._providers = None
        if per_cast is not None:
            await per_cast.aclose()
        raise
    entity.circle = base.with_provided((*gates, *entity._offered))
    entity._setup = attrs.evolve(entity._setup, tools=entity.circle.tools())
    entity._provided = True
    return per_cast


async def _run_cast_here(
    entity: EntityState,
    pauses: Pauses,
    cast: Cast,
    *,
    fresh: bool,
    first: FirstStep | None,
) -> CastResult:
    if entity._session is None:
        entity._session = await _open_session(entity)
    if fresh:
        guard = entity.circle.guard
        if guard is not None and guard.has("input"):
            cast.unchecked_intent = True  # joins the context once checked (_guard)
        else:
            entity._context.add_intent(cast.intent)
            show_cast_context(entity, cast)
    entity._cast = cast
    timeout = entity.circle.resolved.get("timeout_s")
    deadline = math.inf if timeout is None else trio.current_time() + float(timeout)
    scope = entity._scope = trio.CancelScope(deadline=deadline)
    if entity._cancel_next is not None:  # a cancel that arrived just before (sticky)
        entity._cancel_requested, entity._cancel_reason = True, entity._cancel_next
        entity._cancel_next = None
        scope.cancel()
    try:
        with scope:
            outcome = None
            if first is not None:
                outcome = await first()
            if outcome is None:
                outcome = await _loop(entity, pauses, cast)
            await entity.loom.sync(entity.id)
            return outcome
        turn = record_cut(
            entity, cast, entity._cancel_reason if entity._cancel_requested else "timeout"
        )
        await entity.loom.sync(entity.id)
        return cast.result(entity.id, turn, None)
    except PauseExit as paused:
        await _sync_shielded(entity)
        return cast.paused(entity.id, paused.pause)
    except LLMError:
        await _sync_shielded(entity)
        raise  # already recorded as an llm_error turn
    except LeaseLostError:
        raise  # nothing more can be recorded: another worker owns the entity now
    except CastSuspended:
        raise  # stopped between turns on purpose: nothing to record
    except GuardrailError as error:
        record_failure(entity, cast, error)  # a failing check never passes
        await _sync_shielded(entity)
        raise
    except Exception:
        # A runtime bug: record what happened, then crash to the supervisor.
        record_cut(entity, cast, "crashed")
        await _sync_shielded(entity)
        raise
    except BaseException as exc:
        # Cancellation, possibly grouped by a nursery (a batch of children).
        if _is_cancellation(exc):
            record_cut(entity, cast, cancel_reason(entity))
            await _sync_shielded(entity)
        raise
    finally:
        entity._inflight = None
        entity._cast = None
        entity._scope = None
        entity._cancel_requested = False
        entity._continuing = False
        entity._cancel_reason = "cancelled"


def cancel_reason(entity: EntityState) -> str:
    """How a cancellation from outside is recorded (COMP-9)."""
    return "parent_terminated" if entity.parent_entity_id else "cancelled"


async def _sync_shielded(entity: EntityState) -> None:
    """Make a cut-off turn durable even while the cast is being cancelled (LOOM-1)."""
    with trio.CancelScope(shield=True):
        await entity.loom.sync(entity.id)


async def _open_session(entity: EntityState) -> MediumSession:
    """The medium session, with a fork's or resumed entity's sandbox replayed into it."""
    session = await entity.circle.medium.open(entity.circle.resolved)
    if entity._restore:
        try:
            entity.restore_report = await restore_session(
                session, entity.circle, entity.loom, entity._restore
            )
        except BaseException:
            with trio.CancelScope(shield=True):
                await session.aclose()
            raise
        entity._restore = ()
    return session


# -- turn by turn ---------------------------------------------------------------------


async def _loop(entity: EntityState, pauses: Pauses, cast: Cast) -> CastResult:
    session = entity._session
    assert session is not None
    setup = entity._setup
    llm = setup.query_llm
    loom = entity.loom
    steering = entity._steering
    while True:
        await loom.sync(entity.id)  # LOOM-1 on a deferred store (a no-op on the others)
        await trio.lowlevel.checkpoint_if_cancelled()
        if entity._suspend:  # a turn boundary: every turn so far is durable
            entity._suspend = False
            raise CastSuspended(f"entity {entity.id}: the cast was suspended between turns")
        if cast.meter.bounded:
            refusal = cost_refusal(cast.meter, entity.llm, cast.turns, entity._context.snapshot)
            if refusal is not None:
                turn = record_cut(entity, cast, "max_cost_usd", observation=refusal)
                return cast.result(entity.id, turn, None)
        if cast.budget.bounded and (refusal := cast.budget.refusal(TOKENS)) is not None:
            turn = record_cut(entity, cast, TOKENS, observation=refusal)
            return cast.result(entity.id, turn, None)
        context = entity._context
        if context.fold_pending:
            await context.complete_fold()  # an async folder (LLMFolder) folds here
        emit = entity._emit if entity.on_event is not None else None
        inflight = entity._inflight = Inflight(time.perf_counter(), now())
        guard = entity.circle.guard
        checks_input = guard is not None and guard.has("input")
        if steering.waiting:
            inflight.steering = steering.take()
            if not checks_input:
                context.add_steering(inflight.steering)
        watched: list[str] | tuple[()] = ()
        if checks_input:
            assert guard is not None
            watched, ended = await check_inputs(entity, guard, cast, inflight)
            if ended is not None:
                return ended
        inflight.notice = budget_notice(
            entity.circle.resolved, cast.budget, cast.meter, entity._scope
        )
        if inflight.notice:
            context.add_notice(inflight.notice[0])
        if emit is not None:
            emit(StepStart(sequence=entity._sequence + 1))
        journal: TurnJournal | None = None
        replayed: Response | None = None
        if loom.journaled:
            journal = await turn_journal(entity)
            replayed = journal.utterance
        inflight.asked = replayed is None  # a replayed answer asks nothing
        try:
            if watched:
                assert guard is not None
                got, tripped = await guard.beside(
                    watched,
                    functools.partial(_ask, llm, context, setup, emit, replayed),
                    expected=LLMError,
                    entity_id=entity.id,
                )
                if tripped is not None:
                    inflight.response = got
                    return trip_cast(entity, cast, tripped)
                assert got is not None
                response = got
            elif replayed is not None:
                response = replayed  # the answer a crashed attempt of this turn got
            elif emit is not None and can_stream(llm):
                response = await llm.stream(
                    context.snapshot(), setup.tools, setup.tool_choice, setup.extra, on_event=emit
                )
            else:
                response = await llm.query(
                    context.snapshot(), setup.tools, setup.tool_choice, setup.extra
                )
            response.validate()
        except LLMError as error:
            ended = _llm_failed(entity, cast, inflight, error)
            if ended is not None:
                return ended
            continue  # an operational failure stays in the loop (D-011)
        if journal is not None and replayed is None:
            await journal.record_utterance(response)
        if emit is not None:
            emit(MessageComplete(response=response))
            cost = response_cost(response, entity.llm, cast.prices)
            emit(UsageEvent(usage=response.usage, cost_usd=cost))
        inflight.response = response
        circle = entity.circle
        host = inflight.host = TurnHost(
            circle, emit, journal, pauses.gatekeeper(entity) if circle.needs_humans else None
        )
        host.budget = cast.budget if cast.budget.bounded else None
        cast.utterances += 1
        token = CURRENT_ENTITY.set(entity)
        try:
            execution = await session.execute(response, host)
        finally:
            CURRENT_ENTITY.reset(token)
        cap = circle.resolved.get("max_observation_chars")
        execution = capped_execution(execution, int(cap or OBSERVATION_CAP_CHARS))
        if entity.circle.guard is None:
            ended = conclude(entity, cast, inflight, execution, emit)
        else:
            ended = await conclude_guarded(entity, cast, inflight, execution, emit)
        if ended is not None:
            return ended
        # Nothing of a finished turn should wait through the next LLM call but
        # what the loom and the context keep.
        del response, execution, host, token


def _llm_failed(
    entity: EntityState, cast: Cast, inflight: Inflight, error: LLMError
) -> CastResult | None:
    """Record a turn whose LLM call failed; the cast's result if it ends here.

    A transient failure that outlasted the retries stays in the loop as an
    ``is_error`` observation (D-011); anything else is re-raised."""
    transient = _transient(entity, error)
    cast.utterances += 1
    max_turns = entity.circle.resolved.max_turns
    last = max_turns is not None and cast.utterances >= max_turns
    failed = failed_turn(entity, cast.intent_for_turn(), error, inflight, transient, last)
    record(entity, failed)
    entity._inflight = None
    cast.add(failed)
    if entity.on_event is not None:
        entity._emit(StepComplete(turn=failed))
    if not transient:
        raise error
    return cast.result(entity.id, failed, None) if last else None


def _transient(entity: EntityState, error: LLMError) -> bool:
    """A provider failure that may pass (rate limit, overload, network) even
    after the retries inside the turn: it becomes an ``is_error`` observation and
    the loop goes on, bounded by the wards (D-011, SPEC.md "Supervision model"). Anything
    else -- an invalid answer, a rejected request, a spent script, a provider that
    nothing answers for (refused, no such host: retried inside the turn, briefly)
    -- ends the cast."""
    if isinstance(error, ProviderError) and error.code == UNREACHABLE:
        return False
    return isinstance(error, ProviderError) and entity.cantrip.retry.is_retryable(error)


async def _ask(
    llm: Any,
    context: Any,
    setup: Any,
    emit: Callable[[Event], None] | None,
    replayed: Response | None,
) -> Response:
    """The model's answer, for input guardrails to watch beside (the loop asks inline
    when there are none)."""
    if replayed is not None:
        return replayed
    if emit is not None and can_stream(llm):
        return await llm.stream(
            context.snapshot(), setup.tools, setup.tool_choice, setup.extra, on_event=emit
        )
    response: Response = await llm.query(
        context.snapshot(), setup.tools, setup.tool_choice, setup.extra
    )
    return response


# -- going on from a pause ------------------------------------------------------------


async def continue_paused(
    entity: EntityState,
    pauses: Pauses,
    meter: CostMeter,
    pause: Pause,
    decision: Decision,
    *,
    answered: Turn | None = None,
    budget: TreeBudget | None = None,
) -> CastResult:
    """Go on with an utterance that a pause recorded in the loom interrupted
    (``answered``: the answer's checkpoint, already recorded by a process that died)."""
    if entity._closed:
        raise IntentError(f"entity {entity.id} is closed; resume it to answer its pause")
    assert pause.checkpoint_id is not None
    loom = entity.loom
    pieces = [loom.get(pause.checkpoint_id)]
    while pieces[0].extras.get("phase") == "continuation+checkpoint":
        pieces.insert(0, loom.get(str(pieces[0].parent_id)))
    first = pieces[0]
    response = Response(
        content=first.content,
        thinking=first.thinking,
        tool_calls=first.tool_calls,
        model=first.metadata.model,
        provider=first.metadata.provider,
    )
    cast = entity._cast = Cast("", meter, budget=budget or TreeBudget(), resumed=True)

    async def resume_step() -> CastResult | None:
        if entity._session is None:
            entity._session = await _open_session(entity)
        emit = entity._emit if entity.on_event is not None else None
        inflight = entity._inflight = Inflight(
            time.perf_counter(),
            now(),
            response=response,
            checkpoint_id=pause.checkpoint_id if answered is None else answered.id,
        )
        journal: TurnJournal | None = None
        if loom.journaled and answered is None:
            journal = await turn_journal(entity)
        elif loom.journaled and answered is not None:
            # the journal the first attempt kept: it was opened before the answer
            # was recorded, at the answer checkpoint's sequence
            entries = await loom.journal_read(entity.id, answered.sequence)
            journal = TurnJournal(loom, entity.id, answered.sequence, entries)
        host = inflight.host = TurnHost(entity.circle, emit, journal, pauses.gatekeeper(entity))
        host.budget = cast.budget if cast.budget.bounded else None
        cast.utterances += 1
        token = CURRENT_ENTITY.set(entity)
        try:
            done = await pauses.apply_decision(
                entity, pause, decision, recorded=answered is not None
            )
            host.records.append(done)
            if emit is not None:
                emit(ToolResultEvent(record=done))
            done_before = sum(len(p.gate_calls) for p in pieces)
            execution = await rest_of_utterance(entity, pause, done, response, host, done_before)
        finally:
            CURRENT_ENTITY.reset(token)
        cap = entity.circle.resolved.get("max_observation_chars")
        execution = capped_execution(execution, int(cap or OBSERVATION_CAP_CHARS))
        if entity.circle.guard is None:
            return conclude(entity, cast, inflight, execution, emit)
        return await conclude_guarded(entity, cast, inflight, execution, emit)

    return await run_cast(entity, pauses, cast, fresh=False, first=resume_step)


def _is_cancellation(exc: BaseException) -> bool:
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup):
        cancelled, _rest = exc.split(trio.Cancelled)
        return cancelled is not None
    return False
