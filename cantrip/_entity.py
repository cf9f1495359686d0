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

import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import attrs

from cantrip._context import NUDGE_DONE_REQUIRED, Context
from cantrip._errors import IntentError, LLMError
from cantrip.llm._contract import LLM, Response, Usage
from cantrip.loom._model import EntityRecord, Turn, TurnMetadata, result_text
from mediums.base import Execution, MediumSession

if TYPE_CHECKING:
    from cantrip._cantrip import Cantrip


def new_entity_id() -> str:
    return "entity-" + uuid.uuid4().hex[:20]


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


class Entity:
    """A running (or resting, between casts) instance of a cantrip."""

    def __init__(
        self,
        cantrip: Cantrip,
        *,
        llm: LLM,
        entity_id: str | None = None,
        parent_entity_id: str | None = None,
        spawned_from: str | None = None,
    ) -> None:
        self.id = entity_id or new_entity_id()
        self.cantrip = cantrip
        self.llm = llm
        self.loom = cantrip.loom
        self.circle = cantrip.circle
        self.usage = Usage()
        self._query_llm = cantrip.stack(llm)
        self._context = Context(cantrip.identity.system_prompt, self.circle.medium)
        self._leaf: str | None = spawned_from
        self._sequence = 0
        self._session: MediumSession | None = None
        self._closed = False
        self._tools = self.circle.tools()
        self._tool_choice = self.circle.tool_choice(cantrip.identity.tool_choice)
        self._extra = {**cantrip.identity.hyperparameters(), **cantrip.identity.extra}
        self.loom.register_entity(
            EntityRecord(
                entity_id=self.id,
                cantrip_id=cantrip.id,
                identity=cantrip.identity.to_dict(),
                medium=self.circle.medium.name,
                llm=getattr(llm, "name", None),
                parent_entity_id=parent_entity_id,
                spawned_from=spawned_from,
                created_at=_now(),
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
        """One cast on this entity: run ``intent`` until done or a ward (ENTITY-5)."""
        if intent is None or not isinstance(intent, str) or not intent.strip():
            raise IntentError("intent is required: a cantrip cannot be cast without one (INTENT-1)")
        if self._closed:
            raise IntentError(f"entity {self.id} is closed; summon a new one")
        if self._session is None:
            self._session = await self.circle.medium.open()
        wards = self.circle.resolved
        max_turns = wards.max_turns
        self._context.add_intent(intent)
        cast_turns: list[Turn] = []
        cast_usage = Usage()
        while True:
            started = time.perf_counter()
            timestamp = _now()
            messages = self._context.snapshot()
            try:
                response = (
                    await self._query_llm.query(
                        messages, self._tools, self._tool_choice, self._extra
                    )
                ).validate()
            except LLMError as error:
                self._record(
                    self._failed_turn(intent if not cast_turns else None, error, started, timestamp)
                )
                raise
            execution = await self._session.execute(response, self.circle)
            terminated, result, observation = self._outcome(response, execution, wards.require_done_tool)
            truncated = (
                not terminated and max_turns is not None and len(cast_turns) + 1 >= max_turns
            )
            reason = _reason(terminated, truncated, execution)
            turn = self._record(
                Turn(
                    id=self.loom.new_turn_id(),
                    parent_id=self._leaf,
                    entity_id=self.id,
                    sequence=self._sequence + 1,
                    cantrip_id=self.cantrip.id,
                    intent=intent if not cast_turns else None,
                    utterance=_utterance(response),
                    content=response.content,
                    thinking=response.thinking,
                    tool_calls=response.tool_calls,
                    observation=observation,
                    gate_calls=execution.gate_calls,
                    metadata=_metadata(response, started, timestamp),
                    terminated=terminated,
                    truncated=truncated,
                    reason=reason,
                    result=result if terminated else None,
                    extras=execution.extras,
                )
            )
            cast_turns.append(turn)
            cast_usage = cast_usage + response.usage
            if terminated or truncated:
                return CastResult(
                    result=result if terminated else None,
                    terminated=terminated,
                    truncated=truncated,
                    reason=reason,
                    entity_id=self.id,
                    turns=tuple(cast_turns),
                    usage=cast_usage,
                    summary=None if terminated else _truncation_summary(cast_turns, reason),
                )

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
        self._context.add_turn(turn)
        self._leaf = turn.id
        self._sequence = turn.sequence
        self.usage = self.usage + turn.metadata.usage
        return turn

    def _failed_turn(
        self, intent: str | None, error: LLMError, started: float, timestamp: str
    ) -> Turn:
        return Turn(
            id=self.loom.new_turn_id(),
            parent_id=self._leaf,
            entity_id=self.id,
            sequence=self._sequence + 1,
            cantrip_id=self.cantrip.id,
            intent=intent,
            observation=f"llm error: {error}",
            metadata=TurnMetadata(
                duration_ms=(time.perf_counter() - started) * 1000.0, timestamp=timestamp
            ),
            truncated=True,
            reason="llm_error",
            extras={"error": str(error), "error_type": type(error).__name__},
        )


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _utterance(response: Response) -> str:
    parts = [response.content or ""]
    parts.extend(f"{call.name}({call.arguments_json})" for call in response.tool_calls)
    return "\n".join(p for p in parts if p)


def _metadata(response: Response, started: float, timestamp: str) -> TurnMetadata:
    usage = response.usage
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


def _reason(terminated: bool, truncated: bool, execution: Execution) -> str | None:
    if terminated:
        return "text" if execution.text_only else "done"
    if truncated:
        return "max_turns"
    return None


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
