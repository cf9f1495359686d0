"""Google Gemini over HTTP: ``models/{model}:generateContent`` and
``:streamGenerateContent?alt=sse``.

Wire shape: the key in ``x-goog-api-key`` (never in the URL); system text in
``systemInstruction``; turns are ``contents`` with roles ``user``/``model``
and ``parts``; tool calls are ``functionCall`` parts and results
``functionResponse`` parts (``response: {"result": ...}`` or
``{"error": ...}``), consecutive ones sharing a turn; declarations go in
``tools[].functionDeclarations`` with their JSON Schema reduced to the subset
Gemini accepts; ``toolConfig.functionCallingConfig.mode`` is
``AUTO``/``ANY``/``NONE``; sampling parameters go in ``generationConfig``.

Gemini's function calls carry no ids. Each gets one derived from the
response id and its position, so it is stable, unique across responses, and
identical whether the answer was streamed or not. Thought parts
(``thought: true``) become the thinking; ``thoughtsTokenCount`` counts toward
completion and reasoning tokens.

Thought signatures (Gemini 2.5 and 3): a ``thoughtSignature`` on a text or
``functionCall`` part becomes an opaque :class:`~cantrip.llm.ReasoningPart`
(format ``gemini-generate-content``, kind ``fields``) of that part and is set
on the same part when the history goes back to Gemini; Gemini 3 refuses a
function call of the current turn without it (thought signatures docs). A
signed part cantrip has no canonical place for (a thought part, an empty text
part) is kept whole and replayed where it stood. ``reasoning_effort`` in
``extra`` becomes ``generationConfig.thinkingConfig`` (``thinkingLevel`` for
Gemini 3, a ``thinkingBudget`` before), with thought summaries included.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from cantrip._errors import ProviderError
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
    transient,
)
from cantrip.llm._openai_chat import error_from_payload, parse_arguments
from cantrip.llm._sse import SSEEvent
from cantrip.llm._stream import TextDelta, ThinkingDelta, ToolCallEvent
from cantrip.llm.providers._base import (
    EventSink,
    HTTPAdapter,
    StreamState,
    append_turn,
    split_extra,
    synthetic_call_id,
    system_texts,
    with_reasoning,
)
from cantrip.llm.providers._faults import corrupt_event, event_json, incomplete_stream

FINISH_REASONS: dict[str, Finish] = {
    # Every Candidate.FinishReason of the Gemini API
    # (https://ai.google.dev/api/generate-content#FinishReason):
    "STOP": answer("end_turn"),  # a natural stop or a stop sequence
    "MAX_TOKENS": TOKEN_LIMIT,
    "SAFETY": refusal("the answer was flagged for safety reasons"),
    "RECITATION": refusal("the answer was flagged for recitation"),
    "LANGUAGE": refusal("the answer was flagged for an unsupported language"),
    "BLOCKLIST": refusal("the answer contained forbidden terms"),
    "PROHIBITED_CONTENT": refusal("the answer may contain prohibited content"),
    "SPII": refusal("the answer may contain sensitive personal information"),
    "IMAGE_SAFETY": refusal("a generated image was flagged for safety reasons"),
    "IMAGE_PROHIBITED_CONTENT": refusal("a generated image may contain prohibited content"),
    "IMAGE_RECITATION": refusal("a generated image was flagged for recitation"),
    "MALFORMED_FUNCTION_CALL": transient("the model generated an invalid function call"),
    "UNEXPECTED_TOOL_CALL": transient("the model called a tool although none was enabled"),
    "TOO_MANY_TOOL_CALLS": transient("the model called too many tools in a row"),
    "MISSING_THOUGHT_SIGNATURE": failure("the request lacks a thought signature"),
    "IMAGE_OTHER": failure("image generation stopped for another reason"),
    "NO_IMAGE": failure("an image was expected and none was generated"),
    "OTHER": failure("the provider stopped for an unspecified reason"),
    "FINISH_REASON_UNSPECIFIED": failure("the provider gave no finish reason"),
}
FORMAT = "gemini-generate-content"
FOREIGN_SIGNATURE = "skip_thought_signature_validator"
"""Google's documented stand-in for a function call Gemini 3 did not produce."""
THINKING_BUDGETS = {"minimal": 512, "low": 1024, "medium": 8192, "high": 24576}
"""``reasoning_effort`` as a ``thinkingBudget`` for models before Gemini 3."""
TOP_LEVEL = frozenset({"safetySettings", "cachedContent", "labels"})
"""``extra`` fields that belong at the top of the request; the rest go in generationConfig."""
SCHEMA_KEYS = frozenset(
    {
        "type",
        "format",
        "title",
        "description",
        "nullable",
        "enum",
        "maxItems",
        "minItems",
        "properties",
        "required",
        "minProperties",
        "maxProperties",
        "minLength",
        "maxLength",
        "pattern",
        "example",
        "anyOf",
        "propertyOrdering",
        "default",
        "items",
        "minimum",
        "maximum",
    }
)


class GeminiAdapter(HTTPAdapter):
    family = "gemini"
    reasoning_format = FORMAT
    reserved = frozenset({"contents", "systemInstruction", "tools", "toolConfig"})

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        return {"x-goog-api-key": api_key} if api_key else {}

    def build_request(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        tool_choice: ToolChoice | None,
        extra: Mapping[str, Any],
        stream: bool,
    ) -> tuple[str, dict[str, Any]]:
        hyper, rest = split_extra(extra, self.reserved, self.provider)
        body: dict[str, Any] = {"contents": self.wire_contents(messages)}
        system = system_texts(messages)
        if system:
            body["systemInstruction"] = {"parts": [{"text": "\n\n".join(system)}]}
        if tools:
            body["tools"] = [{"functionDeclarations": [declaration(t) for t in tools]}]
            if tool_choice is not None:
                mode = {"auto": "AUTO", "required": "ANY", "none": "NONE"}[tool_choice]
                body["toolConfig"] = {"functionCallingConfig": {"mode": mode}}
        config: dict[str, Any] = {}
        effort = rest.pop("reasoning_effort", None)
        if effort is not None:
            config["thinkingConfig"] = self.thinking_config(str(effort))
        for ours, theirs in (
            ("temperature", "temperature"),
            ("top_p", "topP"),
            ("max_tokens", "maxOutputTokens"),
            ("stop", "stopSequences"),
            ("seed", "seed"),
        ):
            if ours in hyper:
                config[theirs] = hyper[ours]
        for key, value in rest.items():
            if key in TOP_LEVEL:
                body[key] = value
            elif key == "generationConfig" and isinstance(value, Mapping):
                config.update(value)
            else:
                config[key] = value
        if config:
            body["generationConfig"] = config
        model = quote(self.model.removeprefix("models/"), safe="-._~")
        if stream:
            return f"{self.base_url}/models/{model}:streamGenerateContent?alt=sse", body
        return f"{self.base_url}/models/{model}:generateContent", body

    def thinking_config(self, effort: str) -> dict[str, Any]:
        """``reasoning_effort`` in Gemini's terms: a level (Gemini 3) or a token budget."""
        model = self.model.removeprefix("models/")
        if model.startswith("gemini-3"):
            if "-pro" in model:
                # Gemini 3 Pro knows low and high only (Gemini 3 developer guide).
                level = "low" if effort in ("none", "minimal", "low") else "high"
            else:
                level = {"none": "minimal", "xhigh": "high", "max": "high"}.get(effort, effort)
            return {"thinkingLevel": level, "includeThoughts": True}
        if effort == "none":
            return {"thinkingBudget": 0}
        return {"thinkingBudget": THINKING_BUDGETS.get(effort, -1), "includeThoughts": True}

    def wire_contents(self, messages: Sequence[Message]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        names: dict[str, str] = {}
        for m in messages:
            if m.role == "system":
                continue
            if m.role == "user":
                append_turn(out, "user", [{"text": m.content or "(empty)"}], "parts")
            elif m.role == "tool":
                name = m.name or names.get(m.tool_call_id or "", "")
                key = "error" if m.is_error else "result"
                response = {"name": name, "response": {key: m.content or ""}}
                append_turn(out, "user", [{"functionResponse": response}], "parts")
            else:
                for call in m.tool_calls:
                    names[call.id] = call.name
                append_turn(out, "model", model_parts(m, foreign=self.strict_signatures), "parts")
        return out

    @property
    def strict_signatures(self) -> str | None:
        """The stand-in signature for function calls Gemini 3 did not make itself."""
        return (
            FOREIGN_SIGNATURE if self.model.removeprefix("models/").startswith("gemini-3") else None
        )

    def parse(self, payload: Mapping[str, Any], messages: Sequence[Message]) -> Response:
        return parse_generate_content(payload, self.provider)

    def new_stream(self, messages: Sequence[Message], on_event: EventSink) -> StreamState:
        return GenerateStream(self, on_event)


def model_parts(message: Message, foreign: str | None = None) -> list[dict[str, Any]]:
    """An assistant message as ``parts``, its signatures set back on the parts they came on.

    ``foreign``: the signature to put on the first function call of a message
    that carries no signature of its own (another provider's turn, a
    hand-built history), so Gemini 3 accepts it.
    """
    reasoning: Sequence[ReasoningPart] = message.reasoning
    canonical: list[dict[str, Any] | None] = [
        {"text": message.content} if message.content else None
    ]
    canonical.extend(
        {"functionCall": {"name": call.name, "args": plain_json(call.arguments)}}
        for call in message.tool_calls
    )
    if foreign is not None and message.tool_calls and not reasoning:
        # "If you are transferring a conversation trace from another model ... populate
        # the field with [a] dummy string" (thought signatures docs, FAQ).
        first = canonical[1]
        assert first is not None
        first["thoughtSignature"] = foreign
    return with_reasoning(canonical, reasoning)


def declaration(tool: ToolDefinition) -> dict[str, Any]:
    out: dict[str, Any] = {"name": tool.name, "description": tool.description}
    schema = gemini_schema(tool.plain_parameters)
    if schema.get("properties"):
        out["parameters"] = schema  # an OBJECT without properties is refused
    return out


def gemini_schema(schema: Any) -> dict[str, Any]:
    """The subset of JSON Schema Gemini's ``Schema`` accepts (unknown keys are refused)."""
    if not isinstance(schema, Mapping):
        return {}
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key not in SCHEMA_KEYS:
            continue
        if key == "type" and isinstance(value, list):
            kinds = [v for v in value if v != "null"]
            if len(kinds) < len(value):
                out["nullable"] = True
            if kinds:
                out["type"] = kinds[0]
        elif key == "properties" and isinstance(value, Mapping):
            out[key] = {name: gemini_schema(sub) for name, sub in value.items()}
        elif key == "items":
            out[key] = gemini_schema(value)
        elif key == "anyOf" and isinstance(value, list):
            out[key] = [gemini_schema(sub) for sub in value]
        elif key == "enum" and isinstance(value, list):
            out[key] = [str(v) for v in value]
        else:
            out[key] = value
    return out


def parse_usage(data: Any) -> Usage:
    if not isinstance(data, Mapping) or not data:
        return NO_USAGE  # no usage is unknown usage, never zero tokens
    thoughts = int(data.get("thoughtsTokenCount") or 0)
    return Usage(
        prompt_tokens=int(data.get("promptTokenCount") or 0),
        completion_tokens=int(data.get("candidatesTokenCount") or 0) + thoughts,
        cached_tokens=int(data.get("cachedContentTokenCount") or 0),
        reasoning_tokens=thoughts,
    )


def parse_generate_content(payload: Mapping[str, Any], provider: str = "gemini") -> Response:
    """A ``GenerateContentResponse`` as a :class:`Response`."""
    if payload.get("error"):
        raise error_from_payload(payload["error"])
    candidates = payload.get("candidates") or []
    response_id = payload.get("responseId")
    metadata: dict[str, Any] = {}
    if response_id:
        metadata["id"] = response_id
    if not candidates:
        feedback = payload.get("promptFeedback") or {}
        if isinstance(feedback, Mapping) and feedback.get("blockReason"):
            reason = str(feedback["blockReason"])
            raise ProviderError(
                f"{provider}: the prompt was blocked ({reason})",
                retryable=False,
                code=f"prompt_blocked:{reason}",
            )
        return Response(
            usage=parse_usage(payload.get("usageMetadata")),
            model=payload.get("modelVersion"),
            provider=provider,
            metadata=metadata,
        )
    candidate = candidates[0] if isinstance(candidates[0], Mapping) else {}
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    reasoning: list[ReasoningPart] = []
    for part in (candidate.get("content") or {}).get("parts") or ():
        if not isinstance(part, Mapping):
            continue
        signature = part.get("thoughtSignature")
        if signature is not None:
            reasoning.append(_signature(part, signature, texts, calls))
        if "functionCall" in part:
            function = part["functionCall"] or {}
            arguments, raw = parse_arguments(function.get("args"))
            calls.append(
                ToolCall(
                    id=str(function.get("id") or synthetic_call_id(response_id, len(calls))),
                    name=str(function.get("name") or ""),
                    arguments=arguments,
                    raw_arguments=raw,
                )
            )
        elif isinstance(part.get("text"), str):
            (thoughts if part.get("thought") else texts).append(part["text"])
    finish = candidate.get("finishReason")
    stop = resolve_finish(
        provider,
        str(finish) if finish else None,
        FINISH_REASONS,
        has_calls=bool(calls),
        detail=_safety_text(candidate),
    )
    if finish:
        metadata["finish_reason"] = str(finish)
    return Response(
        content="".join(texts) or None,
        tool_calls=mark_cut_off(calls, stop, arguments_as_text=False),
        usage=parse_usage(payload.get("usageMetadata")),
        thinking="".join(thoughts) or None,
        stop_reason=stop,
        model=payload.get("modelVersion"),
        provider=provider,
        metadata=metadata,
        reasoning=tuple(reasoning),
    )


def _safety_text(candidate: Mapping[str, Any]) -> str:
    """The safety categories that blocked a candidate, and its finishMessage."""
    ratings = candidate.get("safetyRatings") or ()
    blocked = [
        f"{r.get('category')} ({r.get('probability')})"
        for r in ratings
        if isinstance(r, Mapping) and r.get("blocked")
    ]
    parts = []
    if blocked:
        parts.append("blocked: " + ", ".join(blocked))
    message = candidate.get("finishMessage")
    if isinstance(message, str) and message:
        parts.append(message[:500])
    return "; ".join(parts)


def _signature(
    part: Mapping[str, Any], signature: Any, texts: list[str], calls: list[ToolCall]
) -> ReasoningPart:
    """The artefact of a signed part, placed by what came before it in the response."""
    if "functionCall" in part:
        return reasoning_part(
            FORMAT, 1 + len(calls), {"thoughtSignature": signature}, kind="fields", redacted=True
        )
    text = part.get("text")
    if isinstance(text, str) and text and not part.get("thought"):
        # The canonical text is one part: a signature on the (last) signed text part.
        return reasoning_part(
            FORMAT, 0, {"thoughtSignature": signature}, kind="fields", redacted=True
        )
    position = 1 + len(calls) if texts or calls else 0
    thought = part.get("text") if part.get("thought") else None
    return reasoning_part(FORMAT, position, dict(part), text=thought or None, redacted=not thought)


class GenerateStream:
    """Streamed ``GenerateContentResponse`` chunks merged into one."""

    def __init__(self, adapter: GeminiAdapter, on_event: EventSink) -> None:
        self.adapter = adapter
        self.on_event = on_event
        self.parts: list[dict[str, Any]] = []
        self.finish_reason: str | None = None
        self.usage: Any = None
        self.response_id: str | None = None
        self.model: str | None = None
        self.blocked: Any = None
        self.calls = 0
        self.chunks = 0
        self.candidate_extra: dict[str, Any] = {}
        """What a refusal is explained by (safety ratings, finishMessage)."""

    def feed(self, event: SSEEvent) -> bool:
        chunk = event_json(self.adapter.provider, event.data)
        if isinstance(chunk, list) and all(isinstance(c, dict) for c in chunk):
            return any([self._chunk(c) for c in chunk])  # a JSON-array stream rather than SSE
        if not isinstance(chunk, dict):
            raise corrupt_event(self.adapter.provider, event.data)
        return self._chunk(chunk)

    def _chunk(self, chunk: Mapping[str, Any]) -> bool:
        if chunk.get("error"):
            raise error_from_payload(chunk["error"], default_code="stream_error")
        self.chunks += 1
        self.response_id = self.response_id or chunk.get("responseId")
        self.model = chunk.get("modelVersion") or self.model
        if chunk.get("usageMetadata"):
            self.usage = chunk["usageMetadata"]
        feedback = chunk.get("promptFeedback")
        if isinstance(feedback, Mapping) and feedback.get("blockReason"):
            self.blocked = feedback
        candidates = chunk.get("candidates") or []
        if not candidates or not isinstance(candidates[0], Mapping):
            return False
        candidate = candidates[0]
        for part in (candidate.get("content") or {}).get("parts") or ():
            if isinstance(part, Mapping):
                self._part(part)
        if candidate.get("finishReason"):
            self.finish_reason = str(candidate["finishReason"])
        for key in ("safetyRatings", "finishMessage"):
            if candidate.get(key):
                self.candidate_extra[key] = candidate[key]
        return False  # usage may still follow; the stream ends when the server closes it

    def _part(self, part: Mapping[str, Any]) -> None:
        if "functionCall" in part:
            function = part["functionCall"] or {}
            self.parts.append(dict(part))
            self.on_event(
                ToolCallEvent(
                    call_id=str(
                        function.get("id") or synthetic_call_id(self.response_id, self.calls)
                    ),
                    name=str(function.get("name") or ""),
                    arguments=json.dumps(function.get("args") or {}),
                )
            )
            self.calls += 1
            return
        text = part.get("text")
        if not isinstance(text, str):
            return
        thought = bool(part.get("thought"))
        signature = part.get("thoughtSignature")
        last = self.parts[-1] if self.parts else None
        if (
            last is not None
            and "text" in last
            and "thoughtSignature" not in last
            and bool(last.get("thought")) == thought
        ):
            # Chunks of one part; a signature arrives with the part's last chunk.
            last["text"] += text
            if signature is not None:
                last["thoughtSignature"] = signature
        else:
            self.parts.append(
                {
                    "text": text,
                    **({"thought": True} if thought else {}),
                    **({"thoughtSignature": signature} if signature is not None else {}),
                }
            )
        if text:
            self.on_event(ThinkingDelta(text=text) if thought else TextDelta(text=text))

    def finish_payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = {}
        if self.parts or self.finish_reason:
            candidate: dict[str, Any] = {
                "content": {"role": "model", "parts": self.parts},
                **self.candidate_extra,
            }
            if self.finish_reason:
                candidate["finishReason"] = self.finish_reason
            payload["candidates"] = [candidate]
        if self.blocked is not None:
            payload["promptFeedback"] = self.blocked
        if self.usage is not None:
            payload["usageMetadata"] = self.usage
        if self.model:
            payload["modelVersion"] = self.model
        if self.response_id:
            payload["responseId"] = self.response_id
        return payload

    def finish(self) -> Response:
        if self.finish_reason is None and self.blocked is None:
            raise incomplete_stream(self.adapter.provider, "without a finish reason")
        return parse_generate_content(self.finish_payload(), self.adapter.provider)


ADAPTER = GeminiAdapter
