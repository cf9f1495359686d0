"""A recorded loom as OTLP/JSON traces (``cantrip loom FILE export --format otlp``).

Past runs go into any OpenTelemetry backend (Jaeger, Phoenix, Logfire,
Langfuse) with the same GenAI mapping live tracing uses (:mod:`cantrip.tracing._genai`):
one trace per root entity, an ``invoke_agent`` span per cast, ``chat`` per turn
that queried the LLM and ``execute_tool`` per gate call; a child entity's
``invoke_agent`` sits under the parent's delegation span.

Times come from the records: a turn starts at its timestamp and lasts its
``duration_ms``; its gate calls take their own durations at the end of the
turn, and the LLM request the time before them. Ids are derived from the turn
and entity ids, so exporting the same loom twice gives the same trace. Needs no
OpenTelemetry package: OTLP/JSON is plain JSON.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from cantrip._redact import redact
from cantrip.llm._contract import ZERO_USAGE, Usage
from cantrip.loom._loom import Loom
from cantrip.loom._model import EntityRecord, Turn
from cantrip.tracing import _genai
from cantrip.tracing._redacted import clean_attributes, clean_status

_KIND_INTERNAL, _KIND_CLIENT = 1, 3
_STATUS_ERROR = 2
_CHECKPOINTS = ("checkpoint", "continuation+checkpoint")


def export_otlp(loom: Loom, *, capture_content: bool = False) -> str:
    """Every entity tree of ``loom`` as one OTLP/JSON ``ExportTraceServiceRequest``."""
    children: dict[str, list[EntityRecord]] = {}
    roots: list[EntityRecord] = []
    for record in loom.entities.values():
        if record.parent_entity_id and record.parent_entity_id in loom.entities:
            children.setdefault(record.parent_entity_id, []).append(record)
        else:
            roots.append(record)
    builder = _Builder(loom, children, capture_content)
    for record in roots:
        builder.entity(record, _trace_id(record.entity_id), None)
    payload = {
        "resourceSpans": [
            {
                "resource": {"attributes": _attributes({"service.name": "cantrip"})},
                "scopeSpans": [{"scope": {"name": "cantrip"}, "spans": builder.spans}],
            }
        ]
    }
    return json.dumps(payload) + "\n"


class _Builder:
    def __init__(
        self, loom: Loom, children: Mapping[str, list[EntityRecord]], capture: bool
    ) -> None:
        self.loom = loom
        self.children = children
        self.capture = capture
        self.spans: list[dict[str, Any]] = []

    def entity(self, record: EntityRecord, trace_id: str, parent_span: str | None) -> None:
        turns = [t for t in self.loom.entity_turns(record.entity_id)]
        for cast in _casts(turns):
            self.cast(record, cast, trace_id, parent_span)

    def cast(
        self, record: EntityRecord, turns: Sequence[Turn], trace_id: str, parent: str | None
    ) -> None:
        agent_id = _span_id("agent", turns[0].id)
        start = _start_ns(turns[0])
        end = max(_end_ns(t) for t in turns)
        last = turns[-1]
        usage = ZERO_USAGE
        cost: float | None = 0.0
        for turn in turns:
            meta = turn.metadata
            usage = usage + Usage(meta.tokens_prompt, meta.tokens_completion, meta.tokens_cached)
            if cost is not None and (meta.tokens_prompt or meta.tokens_completion):
                cost = None if meta.cost_usd is None else cost + meta.cost_usd
            self.turn(record, turn, trace_id, agent_id)
        attributes = {
            **_genai.agent_attributes(record.entity_id, record.cantrip_id),
            **_genai.agent_end_attributes(last.reason, last.terminated, len(turns), usage, cost),
            **_genai.guardrail_attributes(last.reason, last.extras),
        }
        error = _genai.reason_is_error(last.reason)
        if error:
            attributes["error.type"] = last.reason or "error"
        self.spans.append(
            _span(
                trace_id,
                agent_id,
                parent,
                f"invoke_agent {record.cantrip_id}",
                _KIND_INTERNAL,
                start,
                end,
                attributes,
                (last.reason or "error") if error else None,
            )
        )

    def turn(self, record: EntityRecord, turn: Turn, trace_id: str, agent_id: str) -> None:
        start, end = _start_ns(turn), _end_ns(turn)
        calls_ns = sum(int(r.duration_ms * 1e6) for r in turn.gate_calls)
        meta = turn.metadata
        phase = turn.extras.get("phase")
        if not str(phase or "").startswith("continuation"):  # its LLM call is the checkpoint's
            chat_end = max(start, end - calls_ns)
            attributes = _genai.chat_attributes(
                provider=meta.provider,
                request_model=meta.model,
                response_model=meta.model,
                usage=meta.usage,
                stop_reason=_genai.turn_stop_reason(turn.extras, bool(turn.tool_calls)),
                attempts=meta.attempts,
                cost=meta.cost_usd,
            )
            failed = turn.extras.get("error_type")
            if failed:
                attributes["error.type"] = str(failed)
            if self.capture and (turn.content or turn.tool_calls):
                attributes["gen_ai.output.messages"] = _genai.output_messages(
                    turn.content, turn.tool_calls
                )
            self.spans.append(
                _span(
                    trace_id,
                    _span_id("chat", turn.id),
                    agent_id,
                    _genai.chat_name(meta.model),
                    _KIND_CLIENT,
                    start,
                    chat_end,
                    attributes,
                    str(failed) if failed else None,
                )
            )
        cursor = max(start, end - calls_ns)
        spawned = self._spawned_by(turn)
        for index, call in enumerate(turn.gate_calls):
            call_end = cursor + int(call.duration_ms * 1e6)
            span_id = _span_id(f"tool{index}", turn.id)
            self.spans.append(
                _span(
                    trace_id,
                    span_id,
                    agent_id,
                    _genai.tool_name(call.gate),
                    _KIND_INTERNAL,
                    cursor,
                    call_end,
                    _genai.tool_attributes(call, self.capture),
                    _genai.tool_error(call) if call.is_error else None,
                )
            )
            if call.gate in _genai.DELEGATION_GATES:
                for child in spawned:
                    self.entity(child, trace_id, span_id)
                spawned = []
            cursor = call_end

    def _spawned_by(self, turn: Turn) -> list[EntityRecord]:
        """Children whose delegation completes in ``turn`` (spawned at its checkpoint)."""
        if turn.extras.get("phase") not in ("continuation", "continuation+checkpoint"):
            return []
        return [
            child
            for child in self.children.get(turn.entity_id, ())
            if child.spawned_from == turn.parent_id
        ]


def _casts(turns: Iterable[Turn]) -> list[list[Turn]]:
    """An entity's turns split into casts: each cast ends with a terminated or truncated turn."""
    casts: list[list[Turn]] = []
    current: list[Turn] = []
    for turn in turns:
        if turn.intent is not None and current:
            casts.append(current)
            current = []
        current.append(turn)
        if turn.terminated or turn.truncated:
            casts.append(current)
            current = []
    if current:
        casts.append(current)
    return casts


def _start_ns(turn: Turn) -> int:
    stamp = turn.metadata.timestamp
    if not stamp:
        return 0
    return int(datetime.fromisoformat(stamp).timestamp() * 1e9)


def _end_ns(turn: Turn) -> int:
    return _start_ns(turn) + int(turn.metadata.duration_ms * 1e6)


def _trace_id(seed: str) -> str:
    return hashlib.sha256(("trace:" + seed).encode()).hexdigest()[:32]


def _span_id(kind: str, seed: str) -> str:
    return hashlib.sha256(f"{kind}:{seed}".encode()).hexdigest()[:16]


def _span(
    trace_id: str,
    span_id: str,
    parent: str | None,
    name: str,
    kind: int,
    start: int,
    end: int,
    attributes: Mapping[str, Any],
    error: str | None,
) -> dict[str, Any]:
    # Everything a span carries passes the redactor, whole, before any cut (issue 28.1).
    span: dict[str, Any] = {
        "traceId": trace_id,
        "spanId": span_id,
        "name": redact(name),
        "kind": kind,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(max(start, end)),
        "attributes": _attributes(clean_attributes(attributes)),
        "status": {"code": _STATUS_ERROR, "message": clean_status(error)} if error else {},
    }
    if parent:
        span["parentSpanId"] = parent
    return span


def _attributes(values: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"key": key, "value": _any_value(value)} for key, value in values.items()]


def _any_value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, list | tuple):
        return {"arrayValue": {"values": [_any_value(v) for v in value]}}
    return {"stringValue": str(value)}
