"""The values the loom stores: turns, gate-call records, entity records (spec 6.1).

All frozen. A turn is written once; the only later change the loom allows is a
reward annotation, which the loom keeps beside the turn rather than in it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import attrs

from cantrip.llm._contract import (
    ReasoningPart,
    ToolCall,
    Usage,
    _calls,
    _encode_arguments,
    _frozen_dict,
    _parts,
    plain_json,
)

CallStatus = Literal["ok", "error", "skipped", "cancelled", "crashed"]
"""How a gate call completed. Every call an utterance makes has exactly one
completion (seed 001): a real result, an error, ``skipped`` (a call after
``done`` in the same utterance, LOOP-3), ``cancelled`` (cut off by a
cancellation, COMP-9) or ``crashed`` (the entity's task crashed)."""


def _frozen(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return _frozen_dict(value)


_plain = plain_json
"""(The fast path for the types turns are made of is :func:`plain_json`'s own.)"""


def result_text(value: Any) -> str:
    """How a gate result reads in an observation: strings as they are, the rest as JSON."""
    if isinstance(value, str):
        return value
    if value is None:
        return "null"
    return json.dumps(plain_json(value), ensure_ascii=False, default=str)


@attrs.frozen
class GateCallRecord:
    """One gate invocation and its completion (D-005 plus seed 001's status).

    ``args`` are the arguments as the entity gave them, ``result`` the gate's
    return value (or the error message when ``is_error``).
    """

    gate: str
    args: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen)
    result: Any = None
    is_error: bool = False
    tool_call_id: str | None = None
    status: CallStatus = "ok"
    duration_ms: float = 0.0
    detail: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen)
    """Medium- or gate-specific facts, e.g. ``{"truncated": true}`` for a child
    entity cut off by a ward, or ``{"ephemeral": true}``."""

    @property
    def gate_name(self) -> str:
        """Spec 4.3's name for :attr:`gate`."""
        return self.gate

    @property
    def arguments(self) -> str:
        """Spec 4.3's JSON-encoded arguments."""
        return _encode_arguments(plain_json(self.args))

    @property
    def executed(self) -> bool:
        return self.status in ("ok", "error")

    @property
    def text(self) -> str:
        return result_text(self.result)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "gate": self.gate,
            "args": _plain(self.args),
            "result": _plain(self.result),
            "is_error": self.is_error,
            "tool_call_id": self.tool_call_id,
            "status": self.status,
            "duration_ms": self.duration_ms,
        }
        if self.detail:
            data["detail"] = _plain(self.detail)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GateCallRecord:
        return cls(
            gate=data["gate"],
            args=data.get("args") or {},
            result=data.get("result"),
            is_error=bool(data.get("is_error", False)),
            tool_call_id=data.get("tool_call_id"),
            status=data.get("status", "ok"),
            duration_ms=float(data.get("duration_ms", 0.0)),
            detail=data.get("detail") or {},
        )


def _records(value: Iterable[GateCallRecord]) -> tuple[GateCallRecord, ...]:
    return tuple(value)


@attrs.frozen
class TurnMetadata:
    """Usage and timing of one turn (LOOM-9)."""

    tokens_prompt: int = 0
    tokens_completion: int = 0
    tokens_cached: int = 0
    duration_ms: float = 0.0
    timestamp: str = ""
    attempts: int = 1
    """Provider attempts this turn needed; retries never make extra turns (PROD-2)."""
    model: str | None = None
    provider: str | None = None
    cost_usd: float | None = None
    """What the turn's LLM call cost; ``None`` when its price is unknown (or no call)."""
    tokens_cache_write: int = 0
    """Prompt tokens written to the provider's cache (priced apart from reads)."""
    tokens_reasoning: int = 0
    """Completion tokens the model spent reasoning."""
    usage_missing: bool = False
    """The provider's answer carried no usage: the token counts are unknown (not zero),
    and so is the cost unless the provider reported it (issue 28, item 11)."""

    @property
    def usage(self) -> Usage:
        return Usage(
            self.tokens_prompt,
            self.tokens_completion,
            self.tokens_cached,
            self.tokens_cache_write,
            self.tokens_reasoning,
            missing=self.usage_missing,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "tokens_prompt": self.tokens_prompt,
            "tokens_completion": self.tokens_completion,
            "tokens_cached": self.tokens_cached,
            "duration_ms": self.duration_ms,
            "timestamp": self.timestamp,
            "attempts": self.attempts,
            "model": self.model,
            "provider": self.provider,
            **({"cost_usd": self.cost_usd} if self.cost_usd is not None else {}),
        }
        # Only when there are any, so turns without them read exactly as before.
        if self.tokens_cache_write:
            out["tokens_cache_write"] = self.tokens_cache_write
        if self.tokens_reasoning:
            out["tokens_reasoning"] = self.tokens_reasoning
        if self.usage_missing:
            out["usage_missing"] = True
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TurnMetadata:
        return cls(**dict(data))


@attrs.frozen
class Turn:
    """One cycle of the loop: the entity's utterance and the circle's observation."""

    id: str
    parent_id: str | None
    entity_id: str
    sequence: int
    cantrip_id: str = ""
    role: Literal["turn"] = "turn"
    intent: str | None = None
    """Set on the first turn of each cast: the intent that cast pursued."""
    utterance: str = ""
    content: str | None = None
    thinking: str | None = None
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=_calls)
    reasoning: tuple[ReasoningPart, ...] = attrs.field(default=(), converter=_parts)
    """The utterance's opaque reasoning artefacts, replayed only to their own wire format."""
    observation: str = ""
    gate_calls: tuple[GateCallRecord, ...] = attrs.field(default=(), converter=_records)
    metadata: TurnMetadata = attrs.field(factory=TurnMetadata)
    terminated: bool = False
    truncated: bool = False
    reason: str | None = None
    """Why the thread ended here: ``done``, ``text``, a ward name, ``llm_error``,
    ``parent_terminated``, ``cancelled`` or ``crashed``."""
    result: Any = None
    extras: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen)
    """Medium output beyond gate calls (console output, last value, errors)."""

    @property
    def is_error(self) -> bool:
        """Whether any gate call in the observation failed."""
        return any(record.is_error for record in self.gate_calls) or bool(self.extras.get("error"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "parent_id": self.parent_id,
            "entity_id": self.entity_id,
            "cantrip_id": self.cantrip_id,
            "role": self.role,
            "sequence": self.sequence,
            "intent": self.intent,
            "utterance": self.utterance,
            "content": self.content,
            "thinking": self.thinking,
            "tool_calls": [
                {
                    "id": c.id,
                    "name": c.name,
                    "arguments": _plain(c.arguments),
                    "raw_arguments": c.raw_arguments,
                    **({"cut_off": True} if c.cut_off else {}),
                }
                for c in self.tool_calls
            ],
            **({"reasoning": [r.to_dict() for r in self.reasoning]} if self.reasoning else {}),
            "observation": self.observation,
            "gate_calls": [r.to_dict() for r in self.gate_calls],
            "metadata": self.metadata.to_dict(),
            "terminated": self.terminated,
            "truncated": self.truncated,
            "reason": self.reason,
            "result": _plain(self.result),
            "extras": _plain(self.extras),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Turn:
        return cls(
            id=data["id"],
            parent_id=data.get("parent_id"),
            entity_id=data["entity_id"],
            sequence=int(data["sequence"]),
            cantrip_id=data.get("cantrip_id", ""),
            intent=data.get("intent"),
            utterance=data.get("utterance", ""),
            content=data.get("content"),
            thinking=data.get("thinking"),
            tool_calls=tuple(
                ToolCall(
                    c["id"],
                    c["name"],
                    c.get("arguments") or {},
                    c.get("raw_arguments"),
                    bool(c.get("cut_off", False)),
                )
                for c in data.get("tool_calls", ())
            ),
            reasoning=tuple(ReasoningPart.from_dict(r) for r in data.get("reasoning") or ()),
            observation=data.get("observation", ""),
            gate_calls=tuple(GateCallRecord.from_dict(r) for r in data.get("gate_calls", ())),
            metadata=TurnMetadata.from_dict(data.get("metadata") or {}),
            terminated=bool(data.get("terminated", False)),
            truncated=bool(data.get("truncated", False)),
            reason=data.get("reason"),
            result=data.get("result"),
            extras=data.get("extras") or {},
        )


def new_entity_id() -> str:
    """A fresh entity id (the key of an :class:`EntityRecord`)."""
    return "entity-" + os.urandom(10).hex()


RUNTIME_CANTRIPS = "cantrip."
"""The prefix of the cantrip ids the runtime gives entities of its own (an eval run's
record ``cantrip.eval``, a memory consolidation ``cantrip.memory.consolidate``); a
user's cantrip ids are ``cantrip-<hex>`` or their own names."""


def is_runtime_entity(cantrip_id: str) -> bool:
    """Whether an entity is the runtime's own, never a user's session: a front end
    must not open one (a consolidation would otherwise resume as a conversation, and
    an eval run's record as an empty one)."""
    return cantrip_id.startswith(RUNTIME_CANTRIPS)


@attrs.frozen
class EntityRecord:
    """Who an entity is: written to the loom when the entity first appears.

    The identity is the root context every thread of the entity starts from
    (IDENTITY-4); ``spawned_from`` links a child to the parent turn that
    delegated to it (COMP-5).
    """

    entity_id: str
    cantrip_id: str
    identity: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen)
    medium: str = "conversation"
    llm: str | None = None
    parent_entity_id: str | None = None
    spawned_from: str | None = None
    created_at: str = ""
    forked_from: str | None = None
    fork_strategy: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        data["identity"] = plain_json(self.identity)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EntityRecord:
        return cls(**dict(data))
