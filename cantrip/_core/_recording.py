"""Turn recording: building each turn and writing it to the loom (LOOM-1).

Every turn an entity takes is built here -- from an answered utterance, a
delegation checkpoint, a cut-off or an LLM failure -- and recorded: capped to
the circle's record cap, appended to the loom, added to the working context,
and made the entity's new leaf, before the next turn begins. The gate journal
of the turn about to be taken is opened here too (:mod:`cantrip._journal`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from cantrip._core._cast import Cast, Inflight
from cantrip._core._state import EntityState
from cantrip._errors import LLMError
from cantrip._events import StepComplete
from cantrip._journal import TurnJournal
from cantrip._record_cap import capped_turn, record_cap
from cantrip._redact import get_logger
from cantrip.llm._contract import LLM, ZERO_USAGE, Response
from cantrip.llm._cost import PriceMemo, response_cost
from cantrip.loom._model import Turn, TurnMetadata, spoken

log = get_logger("cantrip.entity")


def new_turn(entity: EntityState, intent: str | None, **fields: Any) -> Turn:
    """The next turn of ``entity``'s thread, with the given contents."""
    cast = entity._cast
    if intent is not None and cast is not None and cast.tags:
        fields["extras"] = {**cast.tags, **fields.get("extras", {})}
    inflight = entity._inflight
    if inflight is not None and inflight.steering:
        fields["extras"] = {**fields.get("extras", {}), "steering": list(inflight.steering)}
        inflight.steering = ()  # the turn's first piece carries them
    if inflight is not None and inflight.notice:
        fields["extras"] = {**fields.get("extras", {}), "budget_notice": inflight.notice[0]}
        inflight.notice = ()
    turn_id, entity._reserved_turn_id = entity._reserved_turn_id, None
    return Turn(
        id=turn_id or entity.loom.new_turn_id(),
        parent_id=entity._leaf,
        entity_id=entity.id,
        sequence=entity._sequence + 1,
        cantrip_id=entity.cantrip.id,
        intent=intent,
        **fields,
    )


def record(entity: EntityState, turn: Turn) -> Turn:
    """Write ``turn`` to the loom and move the entity's thread on to it."""
    turn = capped_turn(turn, record_cap(entity.circle.resolved))
    entity.loom.append(turn)
    if log.isEnabledFor(logging.DEBUG):
        log.debug(
            "%s turn %d: %s -> %s", entity.id, turn.sequence, turn.utterance, turn.observation
        )
    entity._context.add_turn(turn)
    entity._leaf = turn.id
    entity._sequence = turn.sequence
    metadata = turn.metadata
    if metadata.tokens_prompt or metadata.tokens_completion:
        entity._usage.add(metadata)
    return turn


def checkpoint(entity: EntityState, marks: Mapping[str, Any] | None = None) -> str:
    """Commit the turn in flight up to this moment; return its id (see
    :meth:`Entity.checkpoint`: delegations and pauses call it)."""
    inflight, cast = entity._inflight, entity._cast
    if inflight is None or cast is None or inflight.response is None or inflight.host is None:
        raise RuntimeError("checkpoint() is only meaningful while a turn executes")
    fresh = tuple(inflight.host.records[inflight.recorded_upto :])
    if inflight.checkpoint_id is not None and not fresh and not marks:
        return inflight.checkpoint_id
    response = inflight.response
    first = inflight.checkpoint_id is None
    turn = record(
        entity,
        new_turn(
            entity,
            cast.intent_for_turn(),
            utterance=utterance(response) if first else "",
            content=response.content if first else None,
            thinking=response.thinking if first else None,
            tool_calls=response.tool_calls if first else (),
            reasoning=response.reasoning if first else (),
            gate_calls=fresh,
            metadata=turn_metadata(
                response, inflight.started, inflight.timestamp, llm=entity.llm, prices=cast.prices
            )
            if first
            else TurnMetadata(timestamp=now()),
            reason="paused" if marks and "pending" in marks else "delegating",
            extras={
                "phase": "checkpoint" if first else "continuation+checkpoint",
                **(marks or {}),
            },
        ),
    )
    cast.add(turn)
    inflight.checkpoint_id = turn.id
    inflight.recorded_upto = len(inflight.host.records)
    return turn.id


def record_cut(
    entity: EntityState,
    cast: Cast,
    reason: str,
    *,
    observation: str | None = None,
    extras: Mapping[str, Any] | None = None,
) -> Turn:
    """Record the turn a timeout or cancellation interrupted, losing nothing.

    Gate calls that completed keep their results; the rest of the
    utterance's calls are completed as ``cancelled`` (seed 001). ``extras`` are
    added to the turn's. The usage is what is known (issue 47.7): an answer that
    had arrived keeps its usage (the model was paid for it; a checkpoint of the turn
    already carries it); a cut while the model was being asked records the usage as
    missing -- the call may have run and been billed, and its cost is unknown, never
    $0; a cut before the model was asked cost nothing.
    """
    inflight = entity._inflight
    response = inflight.response if inflight else None
    records = list(inflight.host.records) if inflight and inflight.host else []
    done_ids = {r.tool_call_id for r in records}
    calls = response.tool_calls if response else ()
    continuation = inflight is not None and inflight.checkpoint_id is not None
    if continuation:
        assert inflight is not None
        records = records[inflight.recorded_upto :]
    for call in calls:
        if call.id not in done_ids:
            records.append(
                entity.circle.unexecuted(
                    call.name,
                    call.arguments,
                    call.id,
                    "crashed" if reason == "crashed" else "cancelled",
                    f"{reason}: the call did not complete",
                )
            )
    started = inflight.started if inflight else time.perf_counter()
    if inflight is not None and response is not None:
        metadata = turn_metadata(
            response,
            inflight.started,
            inflight.timestamp,
            count_usage=not continuation,
            llm=entity.llm,
            prices=cast.prices,
        )
    else:
        metadata = TurnMetadata(
            usage_missing=inflight is not None and inflight.asked,
            duration_ms=(time.perf_counter() - started) * 1000.0,
            timestamp=inflight.timestamp if inflight else now(),
        )
    turn = record(
        entity,
        new_turn(
            entity,
            cast.intent_for_turn(),
            utterance=utterance(response) if response and not continuation else "",
            content=response.content if response and not continuation else None,
            thinking=response.thinking if response and not continuation else None,
            tool_calls=() if continuation else calls,
            reasoning=response.reasoning if response and not continuation else (),
            observation=observation or f"cut off: {reason}",
            gate_calls=tuple(records),
            extras={**_cut_extras(entity, continuation), **(extras or {})},
            metadata=metadata,
            truncated=True,
            reason=reason,
        ),
    )
    entity._inflight = None  # after new_turn: it records the turn's steering messages
    cast.add(turn)
    if entity.on_event is not None:
        entity._emit(StepComplete(turn=turn))  # a cut-off turn is recorded like any other
    return turn


def _cut_extras(entity: EntityState, continuation: bool) -> dict[str, Any]:
    """Extras of a cut turn: the phase, and whether the cut cost the sandbox its
    state (a Python worker killed mid-code), so a replay resets there (LOOM-13)."""
    extras: dict[str, Any] = {"phase": "continuation"} if continuation else {}
    if getattr(entity._session, "cut_lost_sandbox", False):
        extras["sandbox_lost"] = True
    return extras


def failed_turn(
    entity: EntityState,
    intent: str | None,
    error: LLMError,
    inflight: Inflight,
    transient: bool,
    last: bool,
) -> Turn:
    """The turn of an LLM call that failed (not yet recorded)."""
    if transient:
        observation = f"provider failure after retries, the loop goes on: {error}"
        truncated, reason = last, ("max_turns" if last else None)
    else:
        observation, truncated, reason = f"llm error: {error}", True, "llm_error"
    return new_turn(
        entity,
        intent,
        observation=observation,
        metadata=TurnMetadata(
            duration_ms=(time.perf_counter() - inflight.started) * 1000.0,
            timestamp=inflight.timestamp,
        ),
        truncated=truncated,
        reason=reason,
        extras={"error": str(error), "error_type": type(error).__name__},
    )


async def turn_journal(entity: EntityState) -> TurnJournal:
    """The journal of the turn about to be taken; what a crashed attempt of it
    left there is read only when continuing an interrupted cast."""
    sequence = entity._sequence + 1
    entries = []
    if entity._continuing:
        entity._continuing = False
        entries = await entity.loom.journal_read(entity.id, sequence)
    return TurnJournal(entity.loom, entity.id, sequence, entries)


_second: tuple[int, str] = (-1, "")
"""The last second :func:`now` formatted, and its text up to the seconds."""


def now() -> str:
    """UTC now in ISO 8601 with microseconds, as ``datetime.isoformat`` writes it.

    Every turn is stamped, so the date and time of day are formatted once per
    second and only the microseconds per call (a third of the cost)."""
    global _second
    seconds, micros = divmod(time.time_ns() // 1000, 1_000_000)
    if seconds != _second[0]:
        text = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        _second = (seconds, text)
    return f"{_second[1]}.{micros:06d}+00:00"


def utterance(response: Response) -> str:
    """The utterance as the loom records it: the text, then each call (one rule with
    the loom's stored form, which rebuilds it rather than store it twice)."""
    return spoken(response.content, response.tool_calls)


def turn_metadata(
    response: Response,
    started: float,
    timestamp: str,
    *,
    count_usage: bool = True,
    llm: LLM | None = None,
    prices: PriceMemo | None = None,
) -> TurnMetadata:
    """A turn's metadata from its LLM answer (its usage counted unless a checkpoint did)."""
    usage = response.usage if count_usage else ZERO_USAGE
    return TurnMetadata(
        tokens_prompt=usage.prompt_tokens,
        tokens_completion=usage.completion_tokens,
        tokens_cached=usage.cached_tokens,
        tokens_cache_write=usage.cache_write_tokens,
        tokens_reasoning=usage.reasoning_tokens,
        usage_missing=usage.missing,
        duration_ms=(time.perf_counter() - started) * 1000.0,
        timestamp=timestamp,
        attempts=int(response.metadata.get("attempts", 1)),
        model=response.model,
        provider=response.provider,
        cost_usd=response_cost(response, llm, prices) if count_usage else None,
    )
