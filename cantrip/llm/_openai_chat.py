"""OpenAI Chat Completions: normalizing a response payload to the contract (LLM-6).

This is the parsing half of the OpenAI adapter; the scripted LLM feeds raw
payloads through it so tests exercise the same code a real provider does.
Tool-call arguments are parsed exactly once: a dict stays a dict, a string is
decoded, and text that is not JSON is kept as ``raw_arguments`` so the call
becomes an error observation naming it -- never a crash, never re-encoded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from cantrip._errors import InvalidResponseError, ProviderError
from cantrip.llm._contract import Message, Response, StopReason, ToolCall, Usage

_STOP_REASONS: dict[str, StopReason] = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
    "content_filter": "error",
}


def parse_usage(data: Mapping[str, Any] | None) -> Usage:
    if not data:
        return Usage()
    prompt_details = data.get("prompt_tokens_details") or {}
    completion_details = data.get("completion_tokens_details") or {}
    return Usage(
        prompt_tokens=int(data.get("prompt_tokens") or 0),
        completion_tokens=int(data.get("completion_tokens") or 0),
        cached_tokens=int(prompt_details.get("cached_tokens") or 0),
        reasoning_tokens=int(completion_details.get("reasoning_tokens") or 0),
    )


def parse_arguments(raw: Any) -> tuple[dict[str, Any], str | None]:
    """(arguments, raw text if it could not be parsed)."""
    if raw is None or raw == "":
        return {}, None
    if isinstance(raw, Mapping):
        return dict(raw), None
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            return {}, raw
        if isinstance(value, dict):
            return value, None
        return {}, raw
    return {}, json.dumps(raw)


def parse_chat_completion(payload: Mapping[str, Any], request: Sequence[Message] = ()) -> Response:
    """A chat.completion object as a :class:`Response`.

    ``request`` is the transcript that was sent; it is needed to judge a reply
    that tries to carry a tool result (LLM-7).
    """
    if payload.get("error"):
        error = payload["error"]
        message = error.get("message", str(error)) if isinstance(error, Mapping) else str(error)
        code = error.get("code") if isinstance(error, Mapping) else None
        raise ProviderError(str(message), code=str(code) if code is not None else None)
    choices = payload.get("choices") or []
    if not choices:
        raise InvalidResponseError("llm returned neither content nor tool_calls (no choices)")
    choice = choices[0]
    message = choice.get("message") or {}
    role = message.get("role", "assistant")
    if role == "tool":
        _refuse_tool_result(message, request)
    if role != "assistant":
        raise InvalidResponseError(f"a response message must be from the assistant, not {role!r}")
    calls = []
    for raw_call in message.get("tool_calls") or []:
        function = raw_call.get("function") or {}
        arguments, raw_text = parse_arguments(function.get("arguments"))
        calls.append(
            ToolCall(
                id=str(raw_call.get("id") or ""),
                name=str(function.get("name") or ""),
                arguments=arguments,
                raw_arguments=raw_text,
            )
        )
    thinking = message.get("reasoning_content") or message.get("reasoning")
    return Response(
        content=message.get("content"),
        tool_calls=tuple(calls),
        usage=parse_usage(payload.get("usage")),
        thinking=thinking if isinstance(thinking, str) else None,
        stop_reason=_STOP_REASONS.get(str(choice.get("finish_reason"))),
        model=payload.get("model"),
        provider="openai",
        metadata={"id": payload["id"]} if "id" in payload else {},
    )


def _refuse_tool_result(message: Mapping[str, Any], request: Sequence[Message]) -> None:
    """A reply cannot be a tool result; say precisely why it is not acceptable."""
    call_id = message.get("tool_call_id")
    last_calls: set[str] = set()
    for sent in reversed(request):
        if sent.role == "assistant":
            last_calls = {c.id for c in sent.tool_calls}
            break
    if call_id not in last_calls:
        raise InvalidResponseError(
            f"tool result without matching tool call: {call_id!r} answers no call of the "
            f"preceding assistant message (LLM-7)"
        )
    raise InvalidResponseError(
        f"tool result for {call_id!r} came back as a model reply; "
        "only the circle completes tool calls (LLM-7)"
    )
