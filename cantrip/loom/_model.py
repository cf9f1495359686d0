"""The values the loom stores: turns, gate-call records, entity records (spec 6.1).

All frozen. A turn is written once; the only later change the loom allows is a
reward annotation, which the loom keeps beside the turn rather than in it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import attrs

from cantrip._errors import LoomError
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

    def to_stored(self) -> dict[str, Any]:
        """The turn as the database stores record it: each piece once (issue 46.2).

        :meth:`to_dict` less what a reader can rebuild exactly from the rest
        (:func:`stored_record`); :meth:`from_dict` reads both forms."""
        return stored_record(self.to_dict(), self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Turn:
        """A turn from :meth:`to_dict`'s record, or from the stored form
        (:meth:`to_stored`, marked ``"form": 3``, or 2 as written before) with what it
        left out rebuilt."""
        form = data.get(FORM_KEY)
        stored = form in STORED_FORMS
        tool_calls = tuple(
            ToolCall(
                c["id"],
                c["name"],
                c.get("arguments") or {},
                c.get("raw_arguments"),
                bool(c.get("cut_off", False)),
            )
            for c in data.get("tool_calls", ())
        )
        records = data.get("gate_calls", ())
        if stored:
            gate_calls = _stored_records(records, tool_calls, data.get("id"), form)
        else:
            gate_calls = tuple(GateCallRecord.from_dict(r) for r in records)
        content = data.get("content")
        if "utterance" in data or not stored:
            said = data.get("utterance", "")
        else:
            said = spoken(content, tool_calls)
        if "observation" in data or not stored:
            observation = data.get("observation", "")
        else:
            observation = heard(gate_calls)
        return cls(
            id=data["id"],
            parent_id=data.get("parent_id"),
            entity_id=data["entity_id"],
            sequence=int(data["sequence"]),
            cantrip_id=data.get("cantrip_id", ""),
            intent=data.get("intent"),
            utterance=said,
            content=content,
            thinking=data.get("thinking"),
            tool_calls=tool_calls,
            reasoning=tuple(ReasoningPart.from_dict(r) for r in data.get("reasoning") or ()),
            observation=observation,
            gate_calls=gate_calls,
            metadata=TurnMetadata.from_dict(data.get("metadata") or {}),
            terminated=bool(data.get("terminated", False)),
            truncated=bool(data.get("truncated", False)),
            reason=data.get("reason"),
            result=data.get("result"),
            extras=data.get("extras") or {},
        )


# -- the stored form (issue 46.2) ---------------------------------------------------------

FORM_KEY = "form"
STORED_FORM = 3
"""The stored form's mark: ``"form": 3`` (a record without it is :meth:`Turn.to_dict`'s).
Form 2 (written before) differs in one thing: a gate-call record without a
``tool_call_id`` has none; in form 3 it has the id of the turn's call at its own place
(:func:`stored_record`), and ``null`` is written when that is not so."""
STORED_FORMS = (2, STORED_FORM)
"""The stored forms a reader reads."""

_DEFAULTS: dict[str, Any] = {
    "parent_id": None,
    "cantrip_id": "",
    "role": "turn",
    "intent": None,
    "content": None,
    "thinking": None,
    "tool_calls": [],
    "gate_calls": [],
    "terminated": False,
    "truncated": False,
    "reason": None,
    "result": None,
    "extras": {},
}
"""Fields of a turn left out of its stored form when they hold these values (what
:meth:`Turn.from_dict` reads for a missing field)."""
_METADATA_DEFAULTS: dict[str, Any] = {
    "tokens_prompt": 0,
    "tokens_completion": 0,
    "tokens_cached": 0,
    "duration_ms": 0.0,
    "timestamp": "",
    "attempts": 1,
    "model": None,
    "provider": None,
}
_CALL_DEFAULTS: dict[str, Any] = {
    "is_error": False,
    "status": "ok",
    "duration_ms": 0.0,
}


_KEEP: Any = object()
"""No default: a field kept whatever its value."""


def _is(value: Any, default: Any) -> bool:
    """``value`` is ``default`` exactly (``0`` is not ``False``, nor ``0.0``): leaving it
    out reads back the same value of the same type."""
    return type(value) is type(default) and value == default


def _lossless(text: str) -> bool:
    """Whether a text rebuilt from the stored values is the text itself: the records'
    codec writes a NaN or an infinity as ``null``, which a rebuilt text would show."""
    return "NaN" not in text and "Infinity" not in text


def spoken(content: str | None, calls: Iterable[ToolCall]) -> str:
    """The utterance as the loom records it: the text, then each call."""
    calls = tuple(calls)
    if not content and len(calls) == 1:  # the common shape: one call, no text
        return f"{calls[0].name}({calls[0].arguments_json})"
    parts = [content or ""]
    parts.extend(f"{call.name}({call.arguments_json})" for call in calls)
    return "\n".join(p for p in parts if p)


def heard(records: Iterable[GateCallRecord]) -> str:
    """The observation a turn's executed calls make when nothing else is said: their
    results' texts, a line each."""
    return "\n".join(r.text for r in records if r.executed)


COLUMNS = ("id", "parent_id", "entity_id", "sequence")
"""A turn's fields its row holds as columns: the stored form leaves them out of the
record (:func:`with_columns` puts them back)."""


def with_columns(record: dict[str, Any], row: Sequence[Any]) -> dict[str, Any]:
    """A stored record with the fields its row keeps as columns: ``row`` is (data, id,
    parent_id, entity_id, sequence). A record in the stored form left them out; one
    written before it holds them itself, and keeps its own."""
    if record.get(FORM_KEY) in STORED_FORMS:
        record.update(zip(COLUMNS, row[1:5], strict=True))
    return record


def stored_record(full: dict[str, Any], turn: Turn) -> dict[str, Any]:
    """``full`` (``turn.to_dict()``) in the stored form: each piece once.

    A tool call's arguments were written three times (the utterance's text, the call,
    its gate-call record) and every default field in full. The stored form keeps the
    arguments in the call alone, and leaves out what :meth:`Turn.from_dict` rebuilds
    exactly from the rest: the utterance when it is the calls' text (:func:`spoken`),
    the observation when it is the results' (:func:`heard`), a gate-call record's
    arguments and gate when they are those of the call its ``tool_call_id`` names (the
    first of that id), its ``tool_call_id`` when it is the id of the turn's call at the
    record's own place and that call is the first of its id -- or, when the turn has no
    call there, when it has none (issue 46.2: a provider's call id is 20-40 characters,
    written twice) -- fields at their defaults, and the fields the row holds as
    columns (:data:`COLUMNS`; a reader puts them back: :func:`with_columns`). Each
    omission is checked against the value it stands for, so a turn that differs
    anywhere keeps that field whole."""
    out: dict[str, Any] = {FORM_KEY: STORED_FORM}
    for key, value in full.items():
        if key not in COLUMNS and not _is(value, _DEFAULTS.get(key, _KEEP)):
            out[key] = value
    utterance = turn.utterance
    if utterance == spoken(turn.content, turn.tool_calls) and _lossless(utterance):
        del out["utterance"]
    observation = turn.observation
    if observation == heard(turn.gate_calls) and _lossless(observation):
        del out["observation"]
    out["metadata"] = {
        k: v for k, v in full["metadata"].items() if not _is(v, _METADATA_DEFAULTS.get(k, _KEEP))
    }
    if not out["metadata"]:
        del out["metadata"]
    if "tool_calls" in out:
        out["tool_calls"] = [
            {k: v for k, v in c.items() if not (k == "raw_arguments" and v is None)}
            for c in out["tool_calls"]
        ]
    if "gate_calls" in out:
        calls: dict[str, ToolCall] = {}
        for call in turn.tool_calls:
            calls.setdefault(call.id, call)
        placed = turn.tool_calls
        out["gate_calls"] = [
            _stored_call(
                plain,
                record,
                calls.get(record.tool_call_id or ""),
                placed[i] if i < len(placed) else None,
            )
            for i, (plain, record) in enumerate(
                zip(out["gate_calls"], turn.gate_calls, strict=True)
            )
        ]
    return out


def _stored_call(
    plain: dict[str, Any], record: GateCallRecord, call: ToolCall | None, placed: ToolCall | None
) -> dict[str, Any]:
    """A gate-call record's stored form (see :func:`stored_record`): ``call`` is the
    first call of its id, ``placed`` the turn's call at the record's place, if any."""
    out = {k: v for k, v in plain.items() if not _is(v, _CALL_DEFAULTS.get(k, _KEEP))}
    # no id and no call at its place; or the first call of its id is the one there
    implied = (  # no id and no call at its place; or the first of its id is there
        placed is None if record.tool_call_id is None else call is not None and call is placed
    )
    if implied:
        out.pop("tool_call_id", None)  # a reader takes the placed call's id (or none)
    else:
        out["tool_call_id"] = record.tool_call_id  # (null written: none, not the placed one's)
    if call is not None:
        if record.gate == call.name:
            del out["gate"]
        if _same_arguments(record.args, call):
            del out["args"]
    return out


def _same_arguments(args: Mapping[str, Any], call: ToolCall) -> bool:
    """Whether a record's arguments read back as its call's (same keys in the same
    order, the same JSON): the loop hands the call's own mapping to the gate."""
    if args is call.arguments:
        return True
    if list(args) != list(call.arguments):
        return False
    try:
        return _encode_arguments(dict(args)) == call.arguments_json and _lossless(
            call.arguments_json
        )
    except (TypeError, ValueError):
        return False


def _stored_records(
    records: Iterable[Mapping[str, Any]], calls: tuple[ToolCall, ...], turn_id: Any, form: Any
) -> tuple[GateCallRecord, ...]:
    """The gate-call records of a stored turn, each one's arguments and gate taken
    from its call when it left them out, and in form 3 its call id from the call at its
    place when it left that out."""
    by_id: dict[str, ToolCall] = {}
    for call in calls:
        by_id.setdefault(call.id, call)
    out = []
    for i, data in enumerate(records):
        if "tool_call_id" not in data and form == STORED_FORM:
            data = {**data, "tool_call_id": calls[i].id if i < len(calls) else None}
        if "gate" in data and "args" in data:
            out.append(GateCallRecord.from_dict(data))
            continue
        linked = by_id.get(data.get("tool_call_id") or "")
        if linked is None:
            raise LoomError(
                f"stored turn {turn_id}: a gate call without its gate or arguments names "
                f"no tool call of the turn ({data.get('tool_call_id')!r}): the loom is damaged"
            )
        out.append(
            GateCallRecord(
                gate=data.get("gate", linked.name),
                args=data.get("args", linked.arguments),
                result=data.get("result"),
                is_error=bool(data.get("is_error", False)),
                tool_call_id=linked.id,
                status=data.get("status", "ok"),
                duration_ms=float(data.get("duration_ms", 0.0)),
                detail=data.get("detail") or {},
            )
        )
    return tuple(out)


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
