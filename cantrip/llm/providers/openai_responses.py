"""OpenAI Responses API over HTTP (``POST {base_url}/responses``), stateless.

Why a second OpenAI adapter: current OpenAI reasoning models keep their
reasoning across a tool loop only through ``reasoning`` output items, which
Chat Completions cannot carry. Every request here is self-contained -- the
whole rendered transcript as ``input`` items, ``store: false`` (nothing kept
at OpenAI) and ``include: ["reasoning.encrypted_content"]`` so each reasoning
item comes back encrypted and can be replayed on the next request.

Wire shape: system text as ``instructions``; user text as ``{"role": "user",
"content": ...}``; an assistant message as its items in their original order
-- ``reasoning`` items (opaque :class:`~cantrip.llm.ReasoningPart` values,
format ``openai-responses``, replayed byte for byte), the ``message`` item
with its text, and one ``function_call`` item per tool call (its item id
kept as a ``fields`` artefact); a tool result as a ``function_call_output``
item with the call's ``call_id``. Tools are ``{"type": "function", "name",
"description", "parameters"}`` at the top level; ``tool_choice`` is
``auto``/``required``/``none``; the output limit is ``max_output_tokens``;
``reasoning_effort`` becomes ``reasoning: {"effort", "summary": "auto"}``.

Output: ``message`` items give the text (a ``refusal`` part too),
``function_call`` items the tool calls (id = ``call_id``), ``reasoning``
items the artefacts and their summaries the thinking. ``status``
``incomplete`` because of ``max_output_tokens`` is a ``max_tokens`` stop;
``failed`` raises the response's error. Usage counts cached input and
reasoning tokens. A stream (``response.output_text.delta``,
``response.reasoning_summary_text.delta``,
``response.function_call_arguments.delta``, ``response.output_item.done``,
``response.completed`` / ``response.incomplete`` / ``response.failed``,
``error``) is folded into the final response object and parsed by the same
function, so both paths return equal responses.

With compat ``prompt_cache`` a ``prompt_cache_key`` derived from the
instructions and tool names is sent, so turns of the same identity share a
cache routing key (prompt caching guide).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import orjson

from cantrip._errors import ProviderError
from cantrip.llm._contract import (
    NO_USAGE,
    Message,
    ReasoningPart,
    Response,
    StopReason,
    ToolCall,
    ToolChoice,
    ToolDefinition,
    Usage,
    reasoning_part,
)
from cantrip.llm._openai_chat import error_from_payload, parse_arguments
from cantrip.llm._prompt_cache import cache_key
from cantrip.llm._sse import SSEEvent
from cantrip.llm._stream import TextDelta, ThinkingDelta, ToolCallEvent
from cantrip.llm.providers._base import (
    EventSink,
    HTTPAdapter,
    StreamState,
    log,
    split_extra,
    system_texts,
    with_reasoning,
)
from cantrip.llm.providers._faults import incomplete_stream

FORMAT = "openai-responses"
EFFORTS = frozenset({"none", "minimal", "low", "medium", "high", "xhigh"})
INCOMPLETE_REASONS: dict[str, StopReason] = {
    "max_output_tokens": "max_tokens",
    "content_filter": "error",
}
_FINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


class ResponsesAdapter(HTTPAdapter):
    """``POST /responses`` with ``store: false``: see the module docstring."""

    family = "openai"
    reasoning_format = FORMAT
    reserved = frozenset(
        {"model", "input", "instructions", "stream", "tools", "tool_choice", "store", "include"}
    )

    def build_request(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        tool_choice: ToolChoice | None,
        extra: Mapping[str, Any],
        stream: bool,
    ) -> tuple[str, dict[str, Any]]:
        hyper, rest = split_extra(extra, self.reserved, self.provider)
        system = "\n\n".join(system_texts(messages))
        body: dict[str, Any] = {
            "model": self.model,
            "input": wire_items(messages),
            "store": False,
            "include": ["reasoning.encrypted_content"],
        }
        if system:
            body["instructions"] = system
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.plain_parameters,
                    "strict": False,
                }
                for t in tools
            ]
            if tool_choice is not None:
                body["tool_choice"] = tool_choice
        for key in ("temperature", "top_p"):
            if key in hyper:
                body[key] = hyper[key]
        if "max_tokens" in hyper:
            body["max_output_tokens"] = hyper["max_tokens"]
        if "stop" in hyper or "seed" in hyper:
            log.debug("%s: the Responses API has no stop or seed; not sent", self.provider)
        effort = rest.pop("reasoning_effort", None)
        if effort is not None and "reasoning" not in rest:
            if str(effort) in EFFORTS:
                body["reasoning"] = {"effort": str(effort), "summary": "auto"}
            else:
                log.warning("%s: unknown reasoning_effort %r; ignored", self.provider, effort)
        if self.compat.prompt_cache:
            body["prompt_cache_key"] = cache_key(system, tools)
        body.update(rest)
        if stream:
            body["stream"] = True
        return f"{self.base_url}/responses", body

    def parse(self, payload: Mapping[str, Any], messages: Sequence[Message]) -> Response:
        return parse_response(payload, self.provider)

    def new_stream(self, messages: Sequence[Message], on_event: EventSink) -> StreamState:
        return ResponseStream(self, on_event)


def wire_items(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The rendered transcript as ``input`` items (system text goes to ``instructions``)."""
    items: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "system":
            continue
        if m.role == "user":
            items.append({"role": "user", "content": m.content or ""})
        elif m.role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": m.tool_call_id or "",
                    "output": m.content or "",
                }
            )
        else:
            items.extend(assistant_items(m))
    return items


def assistant_items(message: Message) -> list[dict[str, Any]]:
    """One assistant message as output items, reasoning items back in their places."""
    canonical: list[dict[str, Any] | None] = [None]
    if message.content:
        canonical[0] = {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": message.content, "annotations": []}],
        }
    canonical.extend(
        {
            "type": "function_call",
            "call_id": call.id,
            "name": call.name,
            "arguments": call.arguments_json,
        }
        for call in message.tool_calls
    )
    return with_reasoning(canonical, message.reasoning)


def parse_usage(data: Any) -> Usage:
    if not isinstance(data, Mapping) or not data:
        return NO_USAGE  # no usage is unknown usage, never zero tokens
    input_details = data.get("input_tokens_details") or {}
    output_details = data.get("output_tokens_details") or {}
    return Usage(
        prompt_tokens=int(data.get("input_tokens") or 0),
        completion_tokens=int(data.get("output_tokens") or 0),
        cached_tokens=int(input_details.get("cached_tokens") or 0),
        reasoning_tokens=int(output_details.get("reasoning_tokens") or 0),
    )


def _summary_text(item: Mapping[str, Any]) -> str | None:
    texts = [
        str(s.get("text") or "")
        for s in item.get("summary") or ()
        if isinstance(s, Mapping) and s.get("type") == "summary_text"
    ]
    return "\n\n".join(t for t in texts if t) or None


def parse_response(payload: Mapping[str, Any], provider: str = "openai_responses") -> Response:
    """A Responses API ``response`` object as a :class:`Response`."""
    if payload.get("error"):
        raise error_from_payload(payload["error"], default_code="response_failed")
    status = payload.get("status")
    if status == "failed":
        raise ProviderError(
            f"{provider}: the response failed without an error object",
            retryable=True,
            code="response_failed",
        )
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[ToolCall] = []
    reasoning: list[ReasoningPart] = []
    refusal: list[str] = []
    message_id: Any = None
    for item in payload.get("output") or ():
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type")
        position = 1 + len(calls) if texts or calls else 0
        if kind == "reasoning":
            summary = _summary_text(item)
            if summary:
                thinking.append(summary)
            reasoning.append(
                reasoning_part(
                    FORMAT,
                    position,
                    dict(item),
                    text=summary,
                    redacted=summary is None,
                )
            )
        elif kind == "message":
            for piece in item.get("content") or ():
                if not isinstance(piece, Mapping):
                    continue
                if piece.get("type") == "output_text":
                    texts.append(str(piece.get("text") or ""))
                elif piece.get("type") == "refusal":
                    refusal.append(str(piece.get("refusal") or ""))
            if message_id is None and item.get("id"):
                message_id = item["id"]
        elif kind == "function_call":
            arguments, raw = parse_arguments(item.get("arguments"))
            if item.get("id"):
                reasoning.append(
                    reasoning_part(
                        FORMAT, 1 + len(calls), {"id": item["id"]}, kind="fields", redacted=True
                    )
                )
            calls.append(
                ToolCall(
                    id=str(item.get("call_id") or item.get("id") or ""),
                    name=str(item.get("name") or ""),
                    arguments=arguments,
                    raw_arguments=raw,
                )
            )
    content = "".join(texts) or None
    if content is not None and message_id is not None:
        reasoning.append(
            reasoning_part(FORMAT, 0, {"id": message_id}, kind="fields", redacted=True)
        )
    metadata: dict[str, Any] = {}
    if payload.get("id"):
        metadata["id"] = payload["id"]
    stop: StopReason | None
    if status == "incomplete":
        details = payload.get("incomplete_details") or {}
        reason = str(details.get("reason") or "") if isinstance(details, Mapping) else ""
        stop = INCOMPLETE_REASONS.get(reason, "error")
        metadata["incomplete_reason"] = reason or None
    else:
        stop = "tool_use" if calls else "end_turn"
    if refusal:
        metadata["refusal"] = "".join(refusal)
        if content is None and not calls:
            stop = "error"
    return Response(
        content=content,
        tool_calls=tuple(calls),
        usage=parse_usage(payload.get("usage")),
        thinking="\n\n".join(thinking) or None,
        stop_reason=stop,
        model=payload.get("model"),
        provider=provider,
        metadata=metadata,
        reasoning=tuple(reasoning),
    )


@attrs.define
class _Call:
    call_id: str = ""
    name: str = ""
    arguments: list[str] = attrs.field(factory=list)


class ResponseStream:
    """Responses streaming events folded into the final ``response`` object.

    The final event carries the whole response; items finished on the way
    (``response.output_item.done``) stand in for its ``output`` when a server
    sends a final response without one.
    """

    def __init__(self, adapter: ResponsesAdapter, on_event: EventSink) -> None:
        self.adapter = adapter
        self.on_event = on_event
        self.items: dict[int, Mapping[str, Any]] = {}
        self.calls: dict[int, _Call] = {}
        self.response: dict[str, Any] | None = None

    def feed(self, event: SSEEvent) -> bool:
        try:
            # orjson: these events carry whole items (encrypted reasoning included) more than once.
            data = orjson.loads(event.data)
        except ValueError:
            log.warning("%s: skipped a stream event that is not JSON", self.adapter.provider)
            return False
        if not isinstance(data, dict):
            return False
        kind = data.get("type") or event.event
        if kind == "response.output_text.delta":
            delta = data.get("delta")
            if isinstance(delta, str) and delta:
                self.on_event(TextDelta(text=delta))
        elif kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            delta = data.get("delta")
            if isinstance(delta, str) and delta:
                self.on_event(ThinkingDelta(text=delta))
        elif kind == "response.function_call_arguments.delta":
            slot = self.calls.setdefault(int(data.get("output_index", -1)), _Call())
            slot.arguments.append(str(data.get("delta") or ""))
        elif kind == "response.output_item.added":
            item = data.get("item") or {}
            if isinstance(item, Mapping) and item.get("type") == "function_call":
                slot = self.calls.setdefault(int(data.get("output_index", -1)), _Call())
                slot.call_id = str(item.get("call_id") or "")
                slot.name = str(item.get("name") or "")
                self.on_event(
                    ToolCallEvent(
                        call_id=slot.call_id,
                        name=slot.name,
                        arguments=str(item.get("arguments") or ""),
                    )
                )
        elif kind == "response.output_item.done":
            item = data.get("item")
            if isinstance(item, Mapping):
                self.items[int(data.get("output_index", len(self.items)))] = item
        elif kind in _FINAL_EVENTS:
            response = data.get("response")
            self.response = dict(response) if isinstance(response, Mapping) else {}
            return True
        elif kind == "error":
            # The explicit error event (seed 000): its code decides whether a retry can help.
            raise error_from_payload(data.get("error") or data, default_code="stream_error")
        return False

    def finish(self) -> Response:
        if self.response is None:
            raise incomplete_stream(self.adapter.provider, "before response.completed")
        payload = self.response
        if not payload.get("output") and self.items:
            payload = {**payload, "output": [item for _, item in sorted(self.items.items())]}
        return parse_response(payload, self.adapter.provider)


ADAPTER = ResponsesAdapter
