"""OpenAI Chat Completions: normalizing a response payload to the contract (LLM-6).

This is the parsing half of the OpenAI-compatible adapters (OpenAI, OpenRouter,
local servers); the scripted LLM feeds raw payloads through it so tests
exercise the same code a real provider does, and a streamed answer is
reassembled into the same payload shape and parsed here too, so streaming and
not streaming give equal responses.

Tool-call arguments are parsed exactly once: a dict stays a dict, a string is
decoded, and text that is not a JSON object is kept as ``raw_arguments`` so
the call becomes an error observation naming it -- never a crash, never
re-encoded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from cantrip._errors import InvalidResponseError, ProviderError
from cantrip.llm._contract import NO_USAGE, Message, Response, ToolCall, Usage
from cantrip.llm._finish import (
    TOKEN_LIMIT,
    Finish,
    answer,
    failure,
    mark_cut_off,
    refusal,
    resolve_finish,
    transient,
)

FINISH_REASONS: dict[str, Finish] = {
    # OpenAI Chat Completions, choices[].finish_reason
    # (https://platform.openai.com/docs/api-reference/chat/object):
    "stop": answer("end_turn"),  # a natural stop or a stop sequence (not told apart)
    "length": TOKEN_LIMIT,  # max_tokens / max_completion_tokens, or the context
    "tool_calls": answer("tool_use"),
    "function_call": answer("tool_use"),  # deprecated functions API
    "content_filter": refusal("content was withheld by the provider's content filter"),
    # OpenRouter normalizes every upstream to stop/length/tool_calls/content_filter/error
    # (https://openrouter.ai/docs/api-reference/overview#finish-reason); "error"
    # arrives with an error object, raised before this table is read.
    "error": failure("the provider ended the response with an error"),
    # vLLM ends a request its engine gave up on with "abort" (its FinishReason:
    # stop, length, abort -- vllm/v1/engine/__init__.py).
    "abort": transient("the server aborted the request"),
    # DeepSeek (https://api-docs.deepseek.com/api/create-chat-completion):
    "insufficient_system_resource": transient(
        "the provider interrupted the request for lack of resources"
    ),
    # Some OpenAI-compatible proxies pass Anthropic's names through unchanged.
    "end_turn": answer("end_turn"),
    "tool_use": answer("tool_use"),
    "max_tokens": TOKEN_LIMIT,
}
_THINK = re.compile(r"^\s*<think>(.*?)(?:</think>\s*|$)(.*)$", re.DOTALL)


def parse_usage(data: Mapping[str, Any] | None) -> Usage:
    if not data or not isinstance(data, Mapping):
        return NO_USAGE  # no usage is unknown usage, never zero tokens
    prompt_details = data.get("prompt_tokens_details") or {}
    completion_details = data.get("completion_tokens_details") or {}
    cached = prompt_details.get("cached_tokens") or data.get("prompt_cache_hit_tokens") or 0
    return Usage(
        prompt_tokens=int(data.get("prompt_tokens") or 0),
        completion_tokens=int(data.get("completion_tokens") or 0),
        cached_tokens=int(cached),
        cache_write_tokens=int(prompt_details.get("cache_write_tokens") or 0),
        reasoning_tokens=int(completion_details.get("reasoning_tokens") or 0),
    )


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def strict_json(text: str) -> Any:
    """``json.loads`` without Python's extensions: ``NaN`` and ``Infinity`` are refused.

    Arguments a model wrote with them are not JSON; taken as floats they would be
    replayed to the provider as ``null`` (orjson) or as invalid JSON. Refused, the
    call keeps its raw text and becomes an ``is_error`` observation saying so.

    orjson reads it first (~4x faster; it refuses NaN and Infinity itself), unless
    the text holds a run of 19 digits -- an integer orjson may read as a float,
    losing digits -- or orjson refuses it (a lone surrogate, a number too large
    for a float): then the standard library's decoder, as before, which reads
    those. One decoder serves every call (``json.loads`` with a hook builds a new
    one each time)."""
    if _LONG_NUMBER.search(text) is None:
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return _STRICT.decode(text)


_LONG_NUMBER = re.compile(r"\d{19}")


_STRICT = json.JSONDecoder(parse_constant=_no_constant)


def parse_arguments(raw: Any) -> tuple[dict[str, Any], str | None]:
    """(arguments, raw text if it could not be parsed as strict JSON)."""
    if raw is None or raw == "":
        return {}, None
    if isinstance(raw, Mapping):
        return dict(raw), None
    if isinstance(raw, str):
        try:
            value = strict_json(raw)
        except ValueError:  # JSONDecodeError, or a NaN/Infinity constant
            return {}, raw
        if isinstance(value, dict):
            return value, None
        return {}, raw
    return {}, json.dumps(raw)


def split_think_tags(content: str | None) -> tuple[str | None, str | None]:
    """(content, thinking) of text that may open with a ``<think>`` block."""
    if not content:
        return content, None
    match = _THINK.match(content)
    if match is None:
        return content, None
    return match.group(2) or None, match.group(1) or None


def error_from_payload(
    error: Any, *, status: int | None = None, default_code: str | None = None
) -> ProviderError:
    """A provider's error object (OpenAI, Anthropic or Google shape) as a ProviderError."""
    code: Any = None
    if isinstance(error, Mapping):
        message = error.get("message") or error.get("detail") or json.dumps(error)[:500]
        code = error.get("code")
        if code is None or isinstance(code, int):
            if isinstance(code, int) and status is None and 100 <= code < 600:
                status = code
            code = error.get("status") or error.get("type") or code
        metadata = error.get("metadata")
        if isinstance(metadata, Mapping) and metadata.get("raw"):
            message = f"{message} ({str(metadata['raw'])[:300]})"
    else:
        message = str(error)
    code_text = str(code) if code is not None else default_code
    return ProviderError(
        str(message)[:2000],
        status=status,
        code=code_text,
        retryable=is_retryable(status, code_text),
    )


_RETRYABLE_CODES = frozenset(
    {
        "overloaded_error",
        "api_error",
        "rate_limit_error",
        "rate_limit_exceeded",
        "server_error",
        "timeout",
        "timeout_error",
        "internal_error",
        "service_unavailable",
        "RESOURCE_EXHAUSTED",
        "UNAVAILABLE",
        "INTERNAL",
        "DEADLINE_EXCEEDED",
    }
)


def is_retryable(status: int | None, code: str | None) -> bool:
    """429, 5xx (529 included) and transient error codes; any other 4xx is final."""
    if status is not None:
        return status == 429 or status >= 500
    return code in _RETRYABLE_CODES


def parse_chat_completion(
    payload: Mapping[str, Any],
    request: Sequence[Message] = (),
    *,
    provider: str = "openai",
    think_tags: bool = False,
    requested_model: str | None = None,
) -> Response:
    """A chat.completion object as a :class:`Response`.

    ``request`` is the transcript that was sent; it is needed to judge a reply
    that tries to carry a tool result (LLM-7). With ``think_tags`` a leading
    ``<think>...</think>`` block of the text becomes the thinking. With
    ``requested_model`` (the model the adapter asked for) the response is final:
    it names that model in its metadata, and as its model when the reply names none.
    """
    if payload.get("error"):
        raise error_from_payload(payload["error"])
    choices = payload.get("choices") or []
    if not choices or not isinstance(choices[0], Mapping):
        raise InvalidResponseError("llm returned neither content nor tool_calls (no choices)")
    choice = choices[0]
    finish = choice.get("finish_reason")
    if finish == "error":
        raise error_from_payload(
            choice.get("error") or f"the provider ended the response with an error ({finish})",
            default_code="error",
        )
    message = choice.get("message") or {}
    refused = message.get("refusal")
    if isinstance(refused, str) and refused:
        # A refusal message (structured outputs) is never an answer.
        raise ProviderError(
            f"{provider}: the model refused to answer: {refused[:1000]}",
            retryable=False,
            code="refusal",
        )
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
    thinking = thinking if isinstance(thinking, str) and thinking else None
    content = message.get("content")
    if not isinstance(content, str):
        content = _text_parts(content)
    if think_tags and content:
        content, tagged = split_think_tags(content)
        thinking = "".join(t for t in (thinking, tagged) if t) or None
    metadata: dict[str, Any] = {}
    if "id" in payload:
        metadata["id"] = payload["id"]
    usage = payload.get("usage")
    if isinstance(usage, Mapping) and isinstance(usage.get("cost"), int | float):
        metadata["cost"] = float(usage["cost"])
    native = choice.get("native_finish_reason")  # OpenRouter: the upstream's own reason
    stop = resolve_finish(
        provider,
        str(finish) if finish is not None else None,
        FINISH_REASONS,
        has_calls=bool(calls),
        detail=f"upstream reason {native}" if native and native != finish else "",
    )
    if finish is not None:
        metadata["finish_reason"] = str(finish)
    model = payload.get("model")
    if requested_model is not None:
        metadata["requested_model"] = requested_model
        model = model or requested_model
    return Response(
        content=content,
        tool_calls=mark_cut_off(calls, stop, arguments_as_text=True),
        usage=parse_usage(usage),
        thinking=thinking,
        stop_reason=stop,
        model=model,
        provider=provider,
        metadata=metadata,
    )


def _text_parts(content: Any) -> str | None:
    """Content given as a list of parts (some servers do): its text, joined."""
    if not isinstance(content, list):
        return None
    texts = [
        str(part.get("text", ""))
        for part in content
        if isinstance(part, Mapping) and part.get("type") == "text"
    ]
    return "".join(texts) or None


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
