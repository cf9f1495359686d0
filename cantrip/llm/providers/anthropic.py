"""Anthropic Messages over HTTP (``POST {base_url}/messages``).

Wire shape: ``x-api-key`` and ``anthropic-version`` headers; system text
hoisted to the top-level ``system``; tool calls are ``tool_use`` blocks in
assistant messages and results ``tool_result`` blocks in the following user
message (consecutive results share one message); ``max_tokens`` is required
(the identity's, else the provider's ``default_max_tokens``); ``tool_choice``
is ``{"type": "auto" | "any" | "none"}``.

Usage is normalized so ``prompt_tokens`` counts every input token: Anthropic
reports cache reads and writes apart from ``input_tokens``, and they are
added back (and kept in ``cached_tokens`` / ``cache_write_tokens``).
Streams are folded into the same message object a non-streamed call returns
and parsed by the same function.

Reasoning: ``thinking`` and ``redacted_thinking`` blocks become opaque
:class:`~cantrip.llm.ReasoningPart` values (format ``anthropic-messages``),
each at its place among the text and ``tool_use`` blocks, and are sent back
unchanged, signature included, in that place -- the API refuses a tool-use
follow-up whose thinking was dropped or altered (extended thinking docs,
"Preserving thinking blocks"). ``reasoning_effort`` in ``extra`` turns
thinking on with a token budget (``thinking = {...}`` in ``extra`` is sent as
given instead).

Prompt caching (compat ``prompt_cache``, on in the shipped config): a
``cache_control`` breakpoint on the last tool definition, on the system text
and on the last block of the conversation, so each turn reads the prefix the
previous one wrote (prompt caching docs: at most 4 breakpoints).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cantrip.llm._contract import (
    NO_USAGE,
    Message,
    ReasoningPart,
    Response,
    ToolCall,
    ToolChoice,
    ToolDefinition,
    Usage,
    plain_json,
    reasoning_part,
)
from cantrip.llm._finish import (
    TOKEN_LIMIT,
    Finish,
    answer,
    failure,
    mark_cut_off,
    refusal,
    resolve_finish,
)
from cantrip.llm._openai_chat import error_from_payload, parse_arguments, strict_json
from cantrip.llm._sse import SSEEvent
from cantrip.llm._stream import TextDelta, ThinkingDelta, ToolCallEvent
from cantrip.llm.providers._base import (
    EventSink,
    HTTPAdapter,
    StreamState,
    append_turn,
    log,
    split_extra,
    system_texts,
    with_reasoning,
)
from cantrip.llm.providers._faults import event_object, incomplete_stream

STOP_REASONS: dict[str, Finish] = {
    # Every stop_reason of the Messages API
    # (https://docs.anthropic.com/en/api/messages, "stop_reason";
    # https://docs.anthropic.com/en/docs/build-with-claude/handling-stop-reasons):
    "end_turn": answer("end_turn"),
    "tool_use": answer("tool_use"),
    "stop_sequence": answer("stop_sequence"),
    "max_tokens": TOKEN_LIMIT,
    # The answer filled the model's context window: cut off, like max_tokens.
    "model_context_window_exceeded": TOKEN_LIMIT,
    "refusal": refusal("the model declined to answer"),
    # Only server tools (web search, code execution) pause a turn; cantrip sends
    # none (``tools`` is reserved), so a pause cannot be continued here.
    "pause_turn": failure("a server-tool turn was paused; cantrip sends no server tools"),
}
FALLBACK_MAX_TOKENS = 4096
FORMAT = "anthropic-messages"
ADAPTIVE_EFFORTS = {
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "max",
    "max": "max",
}
"""``reasoning_effort`` as ``output_config.effort`` (low, medium, high, max)."""
THINKING_BUDGETS = {"low": 1024, "medium": 4096, "high": 16384, "max": 32000}
"""``reasoning_effort`` as a thinking budget for models without adaptive thinking
(the API's minimum is 1024 tokens)."""
EPHEMERAL = {"type": "ephemeral"}


class AnthropicAdapter(HTTPAdapter):
    family = "anthropic"
    reasoning_format = FORMAT
    reserved = frozenset(
        {"model", "messages", "system", "stream", "tools", "tool_choice", "max_tokens"}
    )

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        headers = {"x-api-key": api_key} if api_key else {}
        if not any(k.lower() == "anthropic-version" for k in self.config.provider.headers):
            headers["anthropic-version"] = "2023-06-01"
        return headers

    def build_request(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        tool_choice: ToolChoice | None,
        extra: Mapping[str, Any],
        stream: bool,
    ) -> tuple[str, dict[str, Any]]:
        hyper, rest = split_extra(extra, self.reserved, self.provider)
        system = system_texts(messages)
        cache = self.compat.prompt_cache
        max_tokens = int(
            hyper.get("max_tokens")
            or self.config.provider.default_max_tokens
            or FALLBACK_MAX_TOKENS
        )
        effort = rest.pop("reasoning_effort", None)
        if effort is not None and effort != "none" and "thinking" not in rest:
            level = ADAPTIVE_EFFORTS.get(str(effort))
            if level is None:
                log.warning("%s: unknown reasoning_effort %r; ignored", self.provider, effort)
            elif self.compat.thinking_mode == "adaptive":
                # Adaptive thinking docs: the effort steers how much the model thinks.
                rest["thinking"] = {"type": "adaptive"}
                rest["output_config"] = {**rest.get("output_config", {}), "effort": level}
            else:
                budget = THINKING_BUDGETS[level]
                rest["thinking"] = {"type": "enabled", "budget_tokens": budget}
                if max_tokens <= budget:
                    # budget_tokens must stay below max_tokens (extended thinking docs)
                    max_tokens += budget
        thinking = rest.get("thinking")
        thinking_on = isinstance(thinking, Mapping) and thinking.get("type") in (
            "enabled",
            "adaptive",
        )
        if thinking_on:
            # Extended thinking docs, "Feature compatibility": with thinking on, tool_choice
            # may only be auto or none (a forced call is asked for as auto), and temperature
            # and top_p may not be changed (left out, with a warning).
            if tool_choice == "required":
                tool_choice = "auto"
            for key in ("temperature", "top_p"):
                if hyper.pop(key, None) is not None:
                    log.warning("%s: %s is not sent while thinking is on", self.provider, key)
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens,
            "messages": self.wire_messages(messages),
        }
        if system:
            text = "\n\n".join(system)
            body["system"] = (
                [{"type": "text", "text": text, "cache_control": EPHEMERAL}] if cache else text
            )
        if tools:
            body["tools"] = [
                {
                    "name": t.name,
                    "description": t.description,
                    "input_schema": t.plain_parameters,
                }
                for t in tools
            ]
            if cache:
                body["tools"][-1]["cache_control"] = EPHEMERAL
            if tool_choice is not None:
                body["tool_choice"] = {
                    "type": {"auto": "auto", "required": "any", "none": "none"}[tool_choice]
                }
        if "temperature" in hyper:
            body["temperature"] = hyper["temperature"]
        if "top_p" in hyper:
            body["top_p"] = hyper["top_p"]
        if "stop" in hyper:
            body["stop_sequences"] = hyper["stop"]
        if "seed" in hyper:
            log.debug("%s: the Messages API has no seed; not sent", self.provider)
        body.update(rest)
        if cache:
            _mark_conversation_end(body["messages"])
        if stream:
            body["stream"] = True
        return f"{self.base_url}/messages", body

    def wire_messages(self, messages: Sequence[Message]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for m in messages:
            if m.role == "system":
                continue
            if m.role == "user":
                text = {"type": "text", "text": m.content or "(empty)"}
                append_turn(out, "user", [text], "content")
            elif m.role == "tool":
                block: dict[str, Any] = {
                    "type": "tool_result",
                    "tool_use_id": m.tool_call_id or "",
                    "content": m.content or "",
                }
                if m.is_error:
                    block["is_error"] = True
                append_turn(out, "user", [block], "content")
            else:
                append_turn(out, "assistant", assistant_blocks(m), "content")
        return out

    def parse(self, payload: Mapping[str, Any], messages: Sequence[Message]) -> Response:
        return parse_message(payload, self.provider)

    def new_stream(self, messages: Sequence[Message], on_event: EventSink) -> StreamState:
        return MessageStream(self, on_event)


def assistant_blocks(message: Message) -> list[dict[str, Any]]:
    """An assistant message's content blocks, its reasoning artefacts back in their places."""
    canonical: list[dict[str, Any] | None] = [
        {"type": "text", "text": message.content} if message.content else None
    ]
    for call in message.tool_calls:
        canonical.append(
            {
                "type": "tool_use",
                "id": call.id,
                "name": call.name,
                # The API takes an object; unparsable text cannot be replayed as one.
                "input": plain_json(call.arguments),
            }
        )
    reasoning = message.reasoning
    if not reasoning:
        return [block for block in canonical if block is not None]
    # The Messages API's artefacts are whole blocks (thinking, redacted_thinking).
    return with_reasoning(canonical, [p for p in reasoning if p.kind == "part"])


def _mark_conversation_end(messages: list[dict[str, Any]]) -> None:
    """A cache breakpoint on the last block that may carry one (not thinking, not empty)."""
    for message in reversed(messages):
        for block in reversed(message["content"]):
            if block.get("type") in ("thinking", "redacted_thinking"):
                continue
            block["cache_control"] = EPHEMERAL
            return


def parse_usage(data: Any) -> Usage:
    if not isinstance(data, Mapping) or not data:
        return NO_USAGE  # no usage is unknown usage, never zero tokens
    read = int(data.get("cache_read_input_tokens") or 0)
    write = int(data.get("cache_creation_input_tokens") or 0)
    return Usage(
        prompt_tokens=int(data.get("input_tokens") or 0) + read + write,
        completion_tokens=int(data.get("output_tokens") or 0),
        cached_tokens=read,
        cache_write_tokens=write,
    )


def parse_message(
    payload: Mapping[str, Any], provider: str = "anthropic", *, streamed: bool = False
) -> Response:
    """A Messages API ``message`` object as a :class:`Response`.

    ``streamed``: the tool inputs were assembled from JSON text, so a cut one
    shows as text that does not parse (see :func:`cantrip.llm._finish.mark_cut_off`).
    """
    if payload.get("type") == "error" or payload.get("error"):
        raise error_from_payload(payload.get("error") or payload)
    texts: list[str] = []
    thinking: list[str] = []
    signatures: list[str] = []
    calls: list[ToolCall] = []
    reasoning: list[ReasoningPart] = []
    for block in payload.get("content") or ():
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        # Where the block stands among the canonical parts (0: text, 1 + i: call i).
        position = 1 + len(calls) if texts or calls else 0
        if kind == "text":
            texts.append(str(block.get("text") or ""))
        elif kind == "thinking":
            text = str(block.get("thinking") or "")
            thinking.append(text)
            if block.get("signature"):
                signatures.append(str(block["signature"]))
            reasoning.append(reasoning_part(FORMAT, position, dict(block), text=text))
        elif kind == "redacted_thinking":
            reasoning.append(reasoning_part(FORMAT, position, dict(block), redacted=True))
        elif kind == "tool_use":
            arguments, raw = parse_arguments(block.get("input"))
            calls.append(
                ToolCall(
                    id=str(block.get("id") or ""),
                    name=str(block.get("name") or ""),
                    arguments=arguments,
                    raw_arguments=raw,
                )
            )
    metadata: dict[str, Any] = {}
    if payload.get("id"):
        metadata["id"] = payload["id"]
    if payload.get("stop_sequence"):
        metadata["stop_sequence"] = payload["stop_sequence"]
    if signatures:
        metadata["thinking_signatures"] = tuple(signatures)
    reason = payload.get("stop_reason")
    text = "".join(texts)
    stop = resolve_finish(
        provider,
        str(reason) if reason is not None else None,
        STOP_REASONS,
        has_calls=bool(calls),
        # A refusal is explained by stop_details (newer API versions), else by what
        # the model wrote when it declined.
        detail=_details_text(payload.get("stop_details")) or text[:500],
    )
    if reason is not None:
        metadata["finish_reason"] = str(reason)
    return Response(
        content=text or None,
        tool_calls=mark_cut_off(calls, stop, arguments_as_text=streamed),
        usage=parse_usage(payload.get("usage")),
        thinking="".join(thinking) or None,
        stop_reason=stop,
        model=payload.get("model"),
        provider=provider,
        metadata=metadata,
        reasoning=tuple(reasoning),
    )


def _details_text(details: Any) -> str:
    """A refusal's ``stop_details`` (newer API versions) as text."""
    if not details:
        return ""
    if isinstance(details, Mapping):
        return "; ".join(f"{k}: {v}" for k, v in details.items() if v)[:500]
    return str(details)[:500]


class MessageStream:
    """``message_start`` ... ``message_stop`` folded into one ``message`` object."""

    def __init__(self, adapter: AnthropicAdapter, on_event: EventSink) -> None:
        self.adapter = adapter
        self.on_event = on_event
        self.message: dict[str, Any] = {}
        self.blocks: dict[int, dict[str, Any]] = {}
        self.json_parts: dict[int, list[str]] = {}
        self.usage: dict[str, Any] = {}
        self.done = False

    def feed(self, event: SSEEvent) -> bool:
        data = event_object(self.adapter.provider, event.data)
        kind = data.get("type") or event.event
        if kind == "error":
            raise error_from_payload(data.get("error") or data, default_code="stream_error")
        if kind == "message_start":
            self.message = dict(data.get("message") or {})
            self.usage.update(self.message.get("usage") or {})
        elif kind == "content_block_start":
            index = int(data.get("index", len(self.blocks)))
            block = dict(data.get("content_block") or {})
            self.blocks[index] = block
            if block.get("type") == "tool_use":
                self.json_parts[index] = []
                self.on_event(
                    ToolCallEvent(
                        call_id=str(block.get("id") or ""),
                        name=str(block.get("name") or ""),
                        arguments="",
                    )
                )
            elif block.get("type") == "text" and block.get("text"):
                self.on_event(TextDelta(text=block["text"]))
        elif kind == "content_block_delta":
            self._delta(int(data.get("index", 0)), data.get("delta") or {})
        elif kind == "content_block_stop":
            index = int(data.get("index", 0))
            stopped = self.blocks.get(index)
            if stopped is not None and stopped.get("type") == "tool_use":
                text = "".join(self.json_parts.get(index, ()))
                stopped["input"] = _json_or_text(text) if text else stopped.get("input") or {}
        elif kind == "message_delta":
            delta = data.get("delta") or {}
            for key in ("stop_reason", "stop_sequence"):
                if delta.get(key) is not None:
                    self.message[key] = delta[key]
            usage = data.get("usage") or {}
            self.usage.update({k: v for k, v in usage.items() if v is not None})
        elif kind == "message_stop":
            self.done = True
            return True
        return False

    def _delta(self, index: int, delta: Mapping[str, Any]) -> None:
        block = self.blocks.setdefault(index, {"type": "text", "text": ""})
        kind = delta.get("type")
        if kind == "text_delta":
            text = str(delta.get("text") or "")
            block["text"] = block.get("text", "") + text
            if text:
                self.on_event(TextDelta(text=text))
        elif kind == "thinking_delta":
            text = str(delta.get("thinking") or "")
            block["thinking"] = block.get("thinking", "") + text
            if text:
                self.on_event(ThinkingDelta(text=text))
        elif kind == "signature_delta":
            block["signature"] = block.get("signature", "") + str(delta.get("signature") or "")
        elif kind == "input_json_delta":
            self.json_parts.setdefault(index, []).append(str(delta.get("partial_json") or ""))

    def finish(self) -> Response:
        if not self.done:
            raise incomplete_stream(self.adapter.provider, "before message_stop")
        for index, block in self.blocks.items():
            if block.get("type") == "tool_use" and "input" not in block:
                text = "".join(self.json_parts.get(index, ()))
                block["input"] = _json_or_text(text) if text else {}
        message = {
            **self.message,
            "content": [block for _, block in sorted(self.blocks.items())],
            "usage": self.usage,
        }
        return parse_message(message, self.adapter.provider, streamed=True)


def _json_or_text(text: str) -> Any:
    """Streamed tool input: the object if it parses, else the text (kept as raw_arguments)."""
    try:
        return strict_json(text)
    except ValueError:
        return text


ADAPTER = AnthropicAdapter
