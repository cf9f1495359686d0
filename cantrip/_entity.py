"""The entity: a cantrip's loop, running (1.4).

An entity is produced only by :meth:`Cantrip.summon` (and ``cast``, which is
summon + one intent + close; ENTITY-1). Each :meth:`Entity.send` is one cast:
the loop queries the LLM, lets the medium execute the utterance, records the
turn in the loom *before* the next turn begins (LOOM-1), and repeats until the
``done`` gate, a text-only answer (when ``done`` is not required) or a ward.

Failures inside the loop are observations. An LLM that cannot answer (after
the retries inside the turn) ends the cast: the turn is recorded as truncated
with reason ``llm_error`` and the :class:`~cantrip.LLMError` propagates. Any
other exception is a runtime bug and is deliberately not caught here.
"""

from __future__ import annotations

import contextvars
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol, cast

import attrs
import trio
import trio.lowlevel

from cantrip._circle import Circle
from cantrip._context import NUDGE_DONE_REQUIRED, Context
from cantrip._errors import IntentError, LLMError, LoomError, ProviderError
from cantrip._events import (
    Event,
    EventSink,
    FinalResponse,
    MessageComplete,
    StepComplete,
    StepStart,
    ToolResultEvent,
    UsageEvent,
)
from cantrip._folding import FoldingPolicy
from cantrip._gate import Gate
from cantrip._redact import get_logger
from cantrip._replay import ReplayReport, fork_strategy, restore_session
from cantrip._running import CURRENT_ENTITY as RUNNING
from cantrip.llm._contract import (
    LLM,
    ZERO_USAGE,
    Message,
    Response,
    StreamingLLM,
    ToolChoice,
    ToolDefinition,
    Usage,
)
from cantrip.llm._retry import RetryPolicy
from cantrip.loom._loom import Loom
from cantrip.loom._model import (
    CallStatus,
    EntityRecord,
    GateCallRecord,
    Turn,
    TurnMetadata,
    result_text,
)
from mediums.base import Execution, MediumSession

log = get_logger("cantrip.entity")

CURRENT_ENTITY = cast("contextvars.ContextVar[Entity]", RUNNING)
"""The entity on whose behalf a gate is running (for delegation gates): the variable
of :mod:`cantrip._running`, which mediums read as a ``RunningEntity``, typed here as the
entity it always holds (only entities set it)."""


def require_intent(intent: object) -> str:
    """The intent, or :class:`IntentError` (INTENT-1)."""
    if not isinstance(intent, str) or not intent.strip():
        raise IntentError("intent is required: a cantrip cannot be cast without one (INTENT-1)")
    return intent


def new_entity_id() -> str:
    return "entity-" + os.urandom(10).hex()


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
    summary: str | None = None
    """For a truncated cast: what happened before the ward cut in (LOOP-4)."""

    @property
    def text(self) -> str:
        return result_text(self.result)


class _TurnHost:
    """The circle as one turn's medium sees it, remembering every completion so a
    cut-off turn can be recorded with what had already happened."""

    __slots__ = ("circle", "emit", "records")

    def __init__(self, circle: Circle, emit: Callable[[Event], None] | None = None) -> None:
        self.circle = circle
        self.emit = emit
        self.records: list[GateCallRecord] = []

    @property
    def gates(self) -> Sequence[Gate]:
        return self.circle.gates

    def gate(self, name: str) -> Gate | None:
        return self.circle.gate(name)

    def terminates(self, name: str) -> bool:
        return self.circle.terminates(name)

    async def call(
        self, name: str, args: Mapping[str, Any], tool_call_id: str | None = None
    ) -> GateCallRecord:
        record = await self.circle.call(name, args, tool_call_id)
        self.records.append(record)
        if self.emit is not None:
            self.emit(ToolResultEvent(record=record))
        return record

    def unexecuted(
        self,
        name: str,
        args: Mapping[str, Any],
        tool_call_id: str | None,
        status: CallStatus,
        message: str,
    ) -> GateCallRecord:
        record = self.circle.unexecuted(name, args, tool_call_id, status, message)
        self.records.append(record)
        if self.emit is not None:
            self.emit(ToolResultEvent(record=record))
        return record


@attrs.define
class _Inflight:
    """The turn being taken: enough to record it if it is cut off."""

    started: float
    timestamp: str
    host: _TurnHost | None = None
    """Made once the LLM has answered: nothing of a turn waits on the provider
    that does not have to (every object alive across that wait is one more for
    the garbage collector to scan when thousands of entities wait at once)."""
    response: Response | None = None
    checkpoint_id: str | None = None
    """Set once a delegation committed part of this turn (see Entity.checkpoint)."""
    recorded_upto: int = 0
    """How many of ``host.records`` the checkpoints already hold."""


@attrs.define
class _Cast:
    """One cast's running totals."""

    intent: str
    turns: list[Turn] = attrs.field(factory=list)
    usage: Usage = attrs.field(factory=lambda: ZERO_USAGE)
    utterances: int = 0
    """LLM answers this cast; max_turns counts these (a split turn is one)."""

    @property
    def tokens(self) -> int:
        return self.usage.total_tokens

    def intent_for_turn(self) -> str | None:
        """The intent is recorded on the first turn of its cast."""
        return None if self.turns else self.intent

    def add(self, turn: Turn) -> None:
        self.turns.append(turn)
        if turn.metadata.tokens_prompt or turn.metadata.tokens_completion:
            self.usage = self.usage + turn.metadata.usage

    def result(self, entity_id: str, last: Turn, value: Any) -> CastResult:
        return CastResult(
            result=value,
            terminated=last.terminated,
            truncated=last.truncated,
            reason=last.reason,
            entity_id=entity_id,
            turns=tuple(self.turns),
            usage=self.usage,
            summary=None if last.terminated else _truncation_summary(self.turns, last.reason),
        )


@attrs.frozen
class EntitySetup:
    """What every entity of one cantrip and one LLM shares, worked out once.

    Summoning is on the path of every cast and every child. Recomputing these
    per entity cost more than a short cast's turns, and kept one more copy of
    each alive per entity; :meth:`Cantrip.setup_for` caches one per LLM.
    """

    query_llm: LLM
    """The LLM behind its provider stack (retries inside the turn)."""
    folding: FoldingPolicy | None
    tools: tuple[ToolDefinition, ...]
    tool_choice: ToolChoice
    extra: Mapping[str, Any]
    """Hyperparameters and provider extras, sent with every query (read-only)."""
    identity: Mapping[str, Any]
    """The identity as the loom's entity records store it (IDENTITY-4)."""
    system: Message | None
    llm_name: str | None


class Spell(Protocol):
    """What an entity reads from the cantrip that summoned it.

    The cantrip layer sits above the entity and passes itself in; the entity
    knows it only by this shape, so it never imports the layer above it.
    """

    @property
    def id(self) -> str: ...
    @property
    def loom(self) -> Loom: ...
    @property
    def circle(self) -> Circle: ...
    @property
    def retry(self) -> RetryPolicy: ...
    @property
    def llms(self) -> Mapping[str, LLM]: ...
    @property
    def folding(self) -> FoldingPolicy | None: ...
    def setup_for(self, llm: LLM) -> EntitySetup: ...
    def resolve_llm(self, llm: LLM | str | None) -> LLM: ...


class Entity:
    """A running (or resting, between casts) instance of a cantrip."""

    def __init__(
        self,
        cantrip: Spell,
        *,
        llm: LLM,
        entity_id: str | None = None,
        parent_entity_id: str | None = None,
        spawned_from: str | None = None,
        fork_point: Turn | None = None,
        depth: int = 0,
        resume: bool = False,
        on_event: EventSink | None = None,
    ) -> None:
        self.id = entity_id or new_entity_id()
        self.parent_entity_id = parent_entity_id
        self.depth = depth
        self.on_event = on_event
        """Receives streaming events of this entity (and its children); see cantrip._events."""
        self._inflight: _Inflight | None = None
        self._cast: _Cast | None = None
        self._scope: trio.CancelScope | None = None
        self._cancel_requested = False
        self.cantrip = cantrip
        self.llm = llm
        self.loom = cantrip.loom
        self.circle = cantrip.circle
        self.usage = ZERO_USAGE
        setup = self._setup = cantrip.setup_for(llm)
        self._context = Context(setup.system, self.circle.medium, setup.folding)
        self._restore: Sequence[Turn] = ()
        """Recorded turns to replay into the sandbox when it opens (forks, resumes)."""
        self.restore_report: ReplayReport | None = None
        self._leaf: str | None = spawned_from
        self._sequence = 0
        self._session: MediumSession | None = None
        self._closed = False
        if resume:
            # A restarted incarnation: state comes from the loom, not from memory.
            record = self.loom.entity(self.id)
            self.parent_entity_id = record.parent_entity_id
            last = self.loom.last_turn(self.id)
            if last is not None:
                self._restore = self.loom.lineage(last.id)
                self._context.replay(self._restore)
                self._leaf = last.id
                self._sequence = last.sequence
            return
        if fork_point is not None:
            # Fork by replay (LOOM-4/13): the context is rebuilt from the recorded
            # thread, the sandbox when it opens (cantrip._replay); gate results come
            # from the loom and no gate runs again.
            if fork_point.extras.get("phase") in ("checkpoint", "continuation+checkpoint"):
                raise LoomError(
                    f"turn {fork_point.id} is a delegation checkpoint, the middle of an "
                    "utterance; fork from the turn that completes it"
                )
            self._restore = self.loom.lineage(fork_point.id)
            self._context.replay(self._restore)
            self._leaf = fork_point.id
            self._sequence = fork_point.sequence
        self.loom.register_entity(
            EntityRecord(
                entity_id=self.id,
                cantrip_id=cantrip.id,
                identity=setup.identity,
                medium=self.circle.medium.name,
                llm=setup.llm_name,
                parent_entity_id=parent_entity_id,
                spawned_from=spawned_from,
                created_at=_now(),
                forked_from=fork_point.id if fork_point is not None else None,
                fork_strategy=fork_strategy(self.circle.medium) if fork_point else None,
            )
        )

    # -- lifecycle -------------------------------------------------------------

    @property
    def turns(self) -> Sequence[Turn]:
        return self.loom.entity_turns(self.id)

    @property
    def leaf(self) -> str | None:
        """The id of this entity's latest turn: where its thread continues."""
        return self._leaf

    async def aclose(self) -> None:
        """End the entity: its medium state is released; its record endures (ENTITY-4)."""
        self._closed = True
        if self._session is not None:
            session, self._session = self._session, None
            await session.aclose()

    async def __aenter__(self) -> Entity:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- the loop --------------------------------------------------------------

    async def send(self, intent: str | None) -> CastResult:
        """One cast on this entity: run ``intent`` until done or a ward (ENTITY-5).

        Wards: ``max_turns`` and ``max_tokens_total`` are checked after each turn;
        ``timeout_s`` cuts the cast off wherever it is. Cancellation from outside
        (a parent ending, an API call) is recorded as a truncated turn -- with the
        in-flight gate calls completed as ``cancelled`` -- and then re-raised.
        """
        intent = require_intent(intent)
        if self._closed:
            raise IntentError(f"entity {self.id} is closed; summon a new one")
        if self._session is None:
            self._session = await self._open_session()
        self._context.add_intent(intent)
        cast = self._cast = _Cast(intent)
        timeout = self.circle.resolved.get("timeout_s")
        deadline = math.inf if timeout is None else trio.current_time() + float(timeout)
        scope = self._scope = trio.CancelScope(deadline=deadline)
        try:
            with scope:
                return await self._loop(cast)
            turn = self._record_cut(cast, "cancelled" if self._cancel_requested else "timeout")
            return cast.result(self.id, turn, None)
        except LLMError:
            raise  # already recorded as an llm_error turn
        except Exception:
            # A runtime bug: record what happened, then crash to the supervisor.
            self._record_cut(cast, "crashed")
            raise
        except BaseException as exc:
            # Cancellation, possibly grouped by a nursery (a batch of children).
            if _is_cancellation(exc):
                self._record_cut(cast, self.cancel_reason)
            raise
        finally:
            self._inflight = None
            self._cast = None
            self._scope = None
            self._cancel_requested = False

    async def _open_session(self) -> MediumSession:
        """The medium session, with a fork's or resumed entity's sandbox replayed into it."""
        session = await self.circle.medium.open(self.circle.resolved)
        if self._restore:
            try:
                self.restore_report = await restore_session(
                    session, self.circle, self.loom, self._restore
                )
            except BaseException:
                with trio.CancelScope(shield=True):
                    await session.aclose()
                raise
            self._restore = ()
        return session

    async def _loop(self, cast: _Cast) -> CastResult:
        session = self._session
        assert session is not None
        setup = self._setup
        llm = setup.query_llm
        while True:
            await trio.lowlevel.checkpoint_if_cancelled()
            if self._context.fold_pending:
                await self._context.complete_fold()  # an async folder (LLMFolder) folds here
            emit = self._emit if self.on_event is not None else None
            inflight = self._inflight = _Inflight(time.perf_counter(), _now())
            if emit is not None:
                emit(StepStart(sequence=self._sequence + 1))
            try:
                if emit is not None and isinstance(llm, StreamingLLM):
                    response = await llm.stream(
                        self._context.snapshot(),
                        setup.tools,
                        setup.tool_choice,
                        setup.extra,
                        on_event=emit,
                    )
                else:
                    response = await llm.query(
                        self._context.snapshot(), setup.tools, setup.tool_choice, setup.extra
                    )
                response.validate()
            except LLMError as error:
                ended = self._llm_failed(cast, inflight, error)
                if ended is not None:
                    return ended
                continue  # an operational failure stays in the loop (D-011)
            if emit is not None:
                emit(MessageComplete(response=response))
                emit(UsageEvent(usage=response.usage))
            inflight.response = response
            host = inflight.host = _TurnHost(self.circle, emit)
            cast.utterances += 1
            token = CURRENT_ENTITY.set(self)
            try:
                execution = await session.execute(response, host)
            finally:
                CURRENT_ENTITY.reset(token)
            ended = self._conclude(cast, inflight, execution, emit)
            if ended is not None:
                return ended
            # Nothing of a finished turn should wait through the next LLM call but
            # what the loom and the context keep.
            del response, execution, host, token

    def _llm_failed(self, cast: _Cast, inflight: _Inflight, error: LLMError) -> CastResult | None:
        """Record a turn whose LLM call failed; the cast's result if it ends here.

        A transient failure that outlasted the retries stays in the loop as an
        ``is_error`` observation (D-011); anything else is re-raised."""
        transient = self._transient(error)
        cast.utterances += 1
        max_turns = self.circle.resolved.max_turns
        last = max_turns is not None and cast.utterances >= max_turns
        failed = self._failed_turn(cast.intent_for_turn(), error, inflight, transient, last)
        self._record(failed)
        self._inflight = None
        cast.add(failed)
        if not transient:
            raise error
        return cast.result(self.id, failed, None) if last else None

    def _conclude(
        self,
        cast: _Cast,
        inflight: _Inflight,
        execution: Execution,
        emit: Callable[[Event], None] | None,
    ) -> CastResult | None:
        """Record an executed utterance as a turn; the cast's result if it ends here."""
        response, host = inflight.response, inflight.host
        assert response is not None and host is not None
        wards = self.circle.resolved
        terminated, result, observation = self._outcome(
            response, execution, wards.require_done_tool
        )
        reason: str | None = None
        if terminated:
            reason = "text" if execution.text_only else "done"
        else:
            max_turns = wards.max_turns
            max_tokens = wards.get("max_tokens_total")
            if max_turns is not None and cast.utterances >= max_turns:
                reason = "max_turns"
            elif (
                max_tokens is not None
                and cast.tokens
                + (response.usage.total_tokens if inflight.checkpoint_id is None else 0)
                >= max_tokens
            ):
                reason = "max_tokens_total"
        truncated = not terminated and reason is not None
        utterance: dict[str, Any] = {
            "utterance": _utterance(response),
            "content": response.content,
            "thinking": response.thinking,
            "tool_calls": response.tool_calls,
        }
        extras = execution.extras
        gate_calls = execution.gate_calls
        if inflight.checkpoint_id is not None:
            # The utterance is in the checkpoint; this turn completes it.
            utterance = {}
            extras = {**extras, "phase": "continuation"}
            gate_calls = tuple(host.records[inflight.recorded_upto :])
        turn = self._record(
            self._new_turn(
                cast.intent_for_turn(),
                observation=observation,
                gate_calls=gate_calls,
                metadata=_metadata(
                    response,
                    inflight.started,
                    inflight.timestamp,
                    # a checkpoint already carries this reply's usage (PROD-3)
                    count_usage=inflight.checkpoint_id is None,
                ),
                terminated=terminated,
                truncated=truncated,
                reason=reason,
                result=result if terminated else None,
                extras=extras,
                **utterance,
            )
        )
        self._inflight = None
        cast.add(turn)
        if emit is not None:
            emit(StepComplete(turn=turn))
            if terminated:
                emit(FinalResponse(result=result))
        if terminated or truncated:
            return cast.result(self.id, turn, result if terminated else None)
        return None

    def cancel(self) -> bool:
        """Cancel the running cast, if any (COMP-9): it ends as truncated with reason
        ``cancelled`` (its children as ``parent_terminated``); the entity stays
        usable for the next intent. Returns whether a cast was running."""
        if self._scope is None:
            return False
        self._cancel_requested = True
        self._scope.cancel()
        return True

    def _emit(self, event: Event) -> None:
        """Deliver an event, stamped with this entity's id unless it carries one."""
        sink = self.on_event
        if sink is not None:
            sink(event if event.entity_id else attrs.evolve(event, entity_id=self.id))

    def checkpoint(self) -> str:
        """Commit the turn in flight up to this moment; return its id.

        Called by delegation gates before a child starts (LOOM-1 + COMP-5):
        the child's root turn points at the checkpoint, and the rest of the
        utterance is recorded later as a continuation turn whose parent is the
        checkpoint. Gate calls completed since the previous checkpoint of the
        same utterance get a checkpoint of their own, so nothing that happened
        before a child started is recorded after it.
        """
        inflight, cast = self._inflight, self._cast
        if inflight is None or cast is None or inflight.response is None or inflight.host is None:
            raise RuntimeError("checkpoint() is only meaningful while a turn executes")
        fresh = tuple(inflight.host.records[inflight.recorded_upto :])
        if inflight.checkpoint_id is not None and not fresh:
            return inflight.checkpoint_id
        response = inflight.response
        first = inflight.checkpoint_id is None
        turn = self._record(
            self._new_turn(
                cast.intent_for_turn(),
                utterance=_utterance(response) if first else "",
                content=response.content if first else None,
                thinking=response.thinking if first else None,
                tool_calls=response.tool_calls if first else (),
                gate_calls=fresh,
                metadata=_metadata(response, inflight.started, inflight.timestamp)
                if first
                else TurnMetadata(timestamp=_now()),
                reason="delegating",
                extras={"phase": "checkpoint" if first else "continuation+checkpoint"},
            )
        )
        cast.add(turn)
        inflight.checkpoint_id = turn.id
        inflight.recorded_upto = len(inflight.host.records)
        return turn.id

    @property
    def cancel_reason(self) -> str:
        """How a cancellation from outside is recorded (COMP-9)."""
        return "parent_terminated" if self.parent_entity_id else "cancelled"

    def _record_cut(self, cast: _Cast, reason: str) -> Turn:
        """Record the turn a timeout or cancellation interrupted, losing nothing.

        Gate calls that completed keep their results; the rest of the
        utterance's calls are completed as ``cancelled`` (seed 001).
        """
        inflight = self._inflight
        self._inflight = None
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
                    self.circle.unexecuted(
                        call.name,
                        call.arguments,
                        call.id,
                        "crashed" if reason == "crashed" else "cancelled",
                        f"{reason}: the call did not complete",
                    )
                )
        started = inflight.started if inflight else time.perf_counter()
        turn = self._record(
            self._new_turn(
                cast.intent_for_turn(),
                utterance=_utterance(response) if response and not continuation else "",
                content=response.content if response and not continuation else None,
                thinking=response.thinking if response and not continuation else None,
                tool_calls=() if continuation else calls,
                observation=f"cut off: {reason}",
                gate_calls=tuple(records),
                extras={"phase": "continuation"} if continuation else {},
                metadata=TurnMetadata(
                    duration_ms=(time.perf_counter() - started) * 1000.0,
                    timestamp=inflight.timestamp if inflight else _now(),
                ),
                truncated=True,
                reason=reason,
            )
        )
        cast.add(turn)
        return turn

    def _outcome(
        self, response: Response, execution: Execution, require_done: bool
    ) -> tuple[bool, Any, str]:
        """(terminated, result, observation text) of one executed utterance."""
        if execution.text_only:
            if require_done:
                return False, None, NUDGE_DONE_REQUIRED
            return True, response.content, ""
        return execution.terminated, execution.result, execution.observation

    def _record(self, turn: Turn) -> Turn:
        self.loom.append(turn)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "%s turn %d: %s -> %s", self.id, turn.sequence, turn.utterance, turn.observation
            )
        self._context.add_turn(turn)
        self._leaf = turn.id
        self._sequence = turn.sequence
        if turn.metadata.tokens_prompt or turn.metadata.tokens_completion:
            self.usage = self.usage + turn.metadata.usage
        return turn

    def _transient(self, error: LLMError) -> bool:
        """A provider failure that may pass (rate limit, overload, network) even
        after the retries inside the turn: it becomes an ``is_error`` observation and
        the loop goes on, bounded by the wards (D-011, DESIGN principle 3). Anything
        else -- an invalid answer, a rejected request, a spent script -- ends the cast."""
        return isinstance(error, ProviderError) and self.cantrip.retry.is_retryable(error)

    def _failed_turn(
        self,
        intent: str | None,
        error: LLMError,
        inflight: _Inflight,
        transient: bool,
        last: bool,
    ) -> Turn:
        if transient:
            observation = f"provider failure after retries, the loop goes on: {error}"
            truncated, reason = last, ("max_turns" if last else None)
        else:
            observation, truncated, reason = f"llm error: {error}", True, "llm_error"
        return self._new_turn(
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

    def _new_turn(self, intent: str | None, **fields: Any) -> Turn:
        """The next turn of this entity's thread, with the given contents."""
        return Turn(
            id=self.loom.new_turn_id(),
            parent_id=self._leaf,
            entity_id=self.id,
            sequence=self._sequence + 1,
            cantrip_id=self.cantrip.id,
            intent=intent,
            **fields,
        )


def _is_cancellation(exc: BaseException) -> bool:
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup):
        cancelled, _rest = exc.split(trio.Cancelled)
        return cancelled is not None
    return False


_second: tuple[int, str] = (-1, "")
"""The last second :func:`_now` formatted, and its text up to the seconds."""


def _now() -> str:
    """UTC now in ISO 8601 with microseconds, as ``datetime.isoformat`` writes it.

    Every turn is stamped, so the date and time of day are formatted once per
    second and only the microseconds per call (a third of the cost)."""
    global _second
    seconds, micros = divmod(time.time_ns() // 1000, 1_000_000)
    if seconds != _second[0]:
        text = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        _second = (seconds, text)
    return f"{_second[1]}.{micros:06d}+00:00"


def _utterance(response: Response) -> str:
    calls = response.tool_calls
    if not response.content and len(calls) == 1:  # the common shape: one call, no text
        return f"{calls[0].name}({calls[0].arguments_json})"
    parts = [response.content or ""]
    parts.extend(f"{call.name}({call.arguments_json})" for call in response.tool_calls)
    return "\n".join(p for p in parts if p)


def _metadata(
    response: Response, started: float, timestamp: str, *, count_usage: bool = True
) -> TurnMetadata:
    usage = response.usage if count_usage else ZERO_USAGE
    return TurnMetadata(
        tokens_prompt=usage.prompt_tokens,
        tokens_completion=usage.completion_tokens,
        tokens_cached=usage.cached_tokens,
        duration_ms=(time.perf_counter() - started) * 1000.0,
        timestamp=timestamp,
        attempts=int(response.metadata.get("attempts", 1)),
        model=response.model,
        provider=response.provider,
    )


def _truncation_summary(turns: Sequence[Turn], reason: str | None) -> str:
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
