"""The OpenTelemetry GenAI semantic conventions, as cantrip maps its records to them.

One mapping for both ways a trace is made: live, from the event stream
(:mod:`cantrip.tracing._sink`), and afterwards, from a recorded loom
(:mod:`cantrip.tracing._otlp`). Everything here is plain data -- attribute names and
values -- so this module needs no OpenTelemetry package.

Names follow the GenAI conventions (``gen_ai.*``, development status in 2026):
``invoke_agent {name}`` per cast, ``chat {model}`` per LLM request,
``execute_tool {gate}`` per gate call. Message content is added only when the
convention's switch ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` is on
(or the caller asks for it), and always through the secret redaction.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from cantrip._redact import redact, redact_value
from cantrip.llm._contract import Usage, plain_json
from cantrip.loom._model import GateCallRecord

CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"

ERROR_REASONS = frozenset(
    {"cancelled", "parent_terminated", "crashed", "llm_error", "shutdown", "guardrail_error"}
)
"""How a cast ends that makes its ``invoke_agent`` span an error (not a ward's truncation)."""

DELEGATION_GATES = frozenset({"call_agent", "call_agent_batch", "call_entity", "call_entity_batch"})

_FINISH = {"end_turn": "stop", "tool_use": "tool_calls", "max_tokens": "length"}
"""cantrip's normalized stop reasons in the convention's (OpenAI-style) vocabulary."""

AttributeValue = str | bool | int | float | list[str]


def capture_content_default() -> bool:
    return os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() in ("1", "true", "yes")


def agent_attributes(entity_id: str, name: str) -> dict[str, AttributeValue]:
    return {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.id": entity_id,
        "gen_ai.agent.name": name,
        "gen_ai.conversation.id": entity_id,
    }


def agent_end_attributes(
    reason: str | None, terminated: bool, turns: int, usage: Usage, cost: float | None
) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {
        "cantrip.reason": reason or "",
        "cantrip.terminated": terminated,
        "cantrip.turns": turns,
        "gen_ai.usage.input_tokens": usage.prompt_tokens,
        "gen_ai.usage.output_tokens": usage.completion_tokens,
    }
    if cost is not None:
        attributes["cantrip.cost_usd"] = cost
    return attributes


def guardrail_attributes(
    reason: str | None, extras: Mapping[str, Any]
) -> dict[str, AttributeValue]:
    """A cast a guardrail ended (reason ``guardrail``): which check, on what, why (the
    why redacted: it may quote what the check refused)."""
    note = extras.get("guardrail")
    if reason != "guardrail" or not isinstance(note, Mapping):
        return {}
    attributes: dict[str, AttributeValue] = {
        "cantrip.guardrail.check": str(note.get("check", "")),
        "cantrip.guardrail.on": str(note.get("on", "")),
        "cantrip.guardrail.why": redact(str(note.get("why", ""))),
    }
    if note.get("gate"):
        attributes["cantrip.guardrail.gate"] = str(note["gate"])
    return attributes


def chat_attributes(
    *,
    provider: str | None,
    request_model: str | None,
    response_model: str | None,
    usage: Usage,
    stop_reason: str | None,
    attempts: int = 1,
    response_id: str | None = None,
    cost: float | None = None,
) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.usage.input_tokens": usage.prompt_tokens,
        "gen_ai.usage.output_tokens": usage.completion_tokens,
    }
    if provider:
        attributes["gen_ai.provider.name"] = provider
    if request_model:
        attributes["gen_ai.request.model"] = request_model
    if response_model:
        attributes["gen_ai.response.model"] = response_model
    if response_id:
        attributes["gen_ai.response.id"] = response_id
    if usage.cached_tokens:
        attributes["gen_ai.usage.cache_read.input_tokens"] = usage.cached_tokens
    if usage.cache_write_tokens:
        attributes["gen_ai.usage.cache_creation.input_tokens"] = usage.cache_write_tokens
    if usage.reasoning_tokens:
        attributes["gen_ai.usage.reasoning.output_tokens"] = usage.reasoning_tokens
    if stop_reason:
        attributes["gen_ai.response.finish_reasons"] = [_FINISH.get(stop_reason, stop_reason)]
    if attempts > 1:
        attributes["cantrip.attempts"] = attempts
    if cost is not None:
        attributes["cantrip.cost_usd"] = cost
    return attributes


def chat_name(request_model: str | None) -> str:
    return f"chat {request_model}" if request_model else "chat"


def output_messages(content: str | None, tool_calls: Any) -> str:
    """``gen_ai.output.messages``: the reply as the convention's JSON parts (redacted)."""
    parts: list[dict[str, Any]] = []
    if content:
        parts.append({"type": "text", "content": content})
    for call in tool_calls:
        parts.append(
            {
                "type": "tool_call",
                "id": call.id,
                "name": call.name,
                "arguments": plain_json(call.arguments),
            }
        )
    return _json([{"role": "assistant", "parts": parts}])


def tool_attributes(record: GateCallRecord, capture: bool) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": record.gate,
        "gen_ai.tool.type": "function",
        "cantrip.gate.status": record.status,
    }
    if record.tool_call_id:
        attributes["gen_ai.tool.call.id"] = record.tool_call_id
    if record.is_error:
        attributes["error.type"] = _error_type(record)
    if record.detail.get("truncated"):
        attributes["cantrip.truncated"] = True
    if capture:
        attributes["gen_ai.tool.call.arguments"] = redact(record.arguments)
        attributes["gen_ai.tool.call.result"] = _json(record.result)
    return attributes


def tool_name(gate: str) -> str:
    return f"execute_tool {gate}"


def _error_type(record: GateCallRecord) -> str:
    declared = record.detail.get("error_type")
    if isinstance(declared, str) and declared:
        return declared
    return str(record.status)


def _json(value: Any) -> str:
    plain = redact_value(plain_json(value))
    return plain if isinstance(plain, str) else json.dumps(plain, default=str)


def reason_is_error(reason: str | None) -> bool:
    return reason in ERROR_REASONS


def turn_stop_reason(turn_extras: Mapping[str, Any], has_calls: bool) -> str:
    """A recorded turn's stop reason: as recorded, else what its shape says."""
    recorded = turn_extras.get("stop_reason")
    if isinstance(recorded, str) and recorded:
        return recorded
    return "tool_use" if has_calls else "end_turn"


def tool_error(record: GateCallRecord) -> str:
    """A failed call's status description: its message (redacted whole and cut to length
    by whoever sets the status, :mod:`cantrip.tracing._redacted`)."""
    return str(record.result)
