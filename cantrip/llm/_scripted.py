"""A scripted LLM: replays a list of responses, records every query.

For tests, examples and offline demos. It is stateless in the LLM-1 sense (it
answers from its script, not from memory of the conversation) and it never
invents an answer: once the script is spent it raises
:class:`~cantrip.ScriptExhaustedError`.

A script entry is a mapping with any of:

* ``content`` -- text; ``thinking`` -- a reasoning trace;
* ``tool_calls`` -- ``[{gate, args, id?}]`` (``name``/``arguments`` also accepted);
* ``code`` -- source for a code medium: a call of the single code tool offered;
* ``usage`` -- ``{prompt_tokens, completion_tokens, cached_tokens}``;
* ``error`` -- ``{status, message, retry_after?}``: raise a provider error;
* ``raw_response`` -- a provider payload, parsed by that provider's real code;
* ``tool_result`` -- ``{tool_call_id, content}``: a reply that tries to be a
  tool result (only meaningful with a provider format; it is refused, LLM-7);
* ``delay_ms`` -- latency before answering, added to the LLM's ``latency_s``;
* ``stop_reason`` -- why the answer ended (``end_turn``, ``tool_use``,
  ``max_tokens``, ``stop_sequence``): ``max_tokens`` scripts an answer cut off
  by the output-token limit (``finish_reason: length`` in the OpenAI format).

With ``provider="openai"`` every entry is turned into a Chat Completions
payload and normalized by :mod:`cantrip.llm._openai_chat` (LLM-6).

Two ways to pick the entry (``per_entity``):

* ``False`` (the Python default, what the conformance runner needs): one
  process-wide cursor; every query takes the next entry, whoever asks.
* ``True`` (a spec file's default): the script is each cast's own. The entry
  is read from the conversation the query carries -- the number of assistant
  messages since the latest intent -- so every entity (a serve session, an
  ``invoke`` line, a worker's cast, a child) starts the script at its first
  entry, and an entity rebuilt from its loom after a restart continues where
  its conversation stands. Nothing is kept between queries except which error
  entries a conversation has already been given (so a retry moves past them).
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from cantrip._errors import (
    ConstructionError,
    InvalidResponseError,
    ProviderError,
    ScriptExhaustedError,
)
from cantrip.llm._contract import (
    ZERO_USAGE,
    Message,
    Query,
    Response,
    ToolCall,
    ToolChoice,
    ToolDefinition,
    Usage,
    plain_json,
)
from cantrip.llm._finish import mark_cut_off
from cantrip.llm._latency import simulate_latency
from cantrip.llm._openai_chat import parse_chat_completion
from cantrip.llm._stream import TextDelta, ThinkingDelta, ToolCallEvent
from cantrip.llm._telemetry import Pricing

_ENTRY_KEYS = frozenset(
    {
        "content",
        "thinking",
        "tool_calls",
        "code",
        "usage",
        "error",
        "raw_response",
        "tool_result",
        "delay_ms",
        "stop_reason",
    }
)
_FINISH_FOR = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
}
_FORMATS = ("openai",)
_ids = itertools.count(1)
STREAM_CHUNK = 8


def _usage(data: Mapping[str, Any] | None) -> Usage:
    data = data or {}
    unknown = set(data) - {"prompt_tokens", "completion_tokens", "cached_tokens"}
    if unknown:
        raise ConstructionError(f"unknown usage fields: {sorted(unknown)}")
    return Usage(
        int(data.get("prompt_tokens", 0)),
        int(data.get("completion_tokens", 0)),
        int(data.get("cached_tokens", 0)),
    )


def _entries(value: Iterable[Mapping[str, Any]]) -> tuple[Mapping[str, Any], ...]:
    return tuple(value)


@attrs.define(eq=False)
class ScriptedLLM:
    """Replays ``responses`` in order; shared safely by concurrent entities.

    Each query takes the next entry when it arrives (one script slot per
    query, in arrival order), so entities sharing one scripted LLM get the
    entries in the order they asked, whatever their latency."""

    responses: Sequence[Mapping[str, Any]] = attrs.field(converter=_entries)
    name: str = "scripted"
    usage: Usage | None = None
    """Usage reported by entries that give none of their own."""
    provider: str | None = None
    """Wire format to normalize through (``"openai"``), or ``None`` for direct."""
    latency_s: float = 0.0
    """Simulated provider latency before every answer (query and stream), in
    seconds; an entry's ``delay_ms`` adds to it. Waited with
    :func:`~cantrip.llm.simulate_latency`: the run's clock, cancellable, and cheap
    with thousands of concurrent entities."""
    pricing: Pricing | None = None
    """Prices to bill this LLM's usage at (the cost ward and ``cost_usd``); unpriced
    by default, so its cost is unknown unless it reports no tokens."""
    medium_hint: str | None = None
    """The medium the script is written for; inferred from the script when unset."""
    invocations: list[Query] = attrs.field(factory=list)
    _ready: dict[int, Response] = attrs.field(factory=dict, repr=False)
    """Responses built once at construction: entries that need no query context."""
    per_entity: bool = False
    """Answer from the conversation's own progress, not a shared cursor (module doc)."""
    _cursor: int = 0
    _errors_given: dict[tuple[str, int], int] = attrs.field(factory=dict, repr=False)
    """Per-entity mode: error entries already raised, by (conversation key, position)."""

    def __attrs_post_init__(self) -> None:
        if self.provider is not None and self.provider not in _FORMATS:
            raise ConstructionError(
                f"scripted LLM cannot speak provider format {self.provider!r} "
                f"(known: {', '.join(_FORMATS)})"
            )
        for index, entry in enumerate(self.responses):
            unknown = set(entry) - _ENTRY_KEYS
            if unknown:
                raise ConstructionError(
                    f"scripted response #{index + 1} has unknown fields: {sorted(unknown)}"
                )
            stop = entry.get("stop_reason")
            if stop is not None and stop not in _FINISH_FOR:
                raise ConstructionError(
                    f"scripted response #{index + 1}: stop_reason {stop!r} is not one of "
                    f"{', '.join(_FINISH_FOR)}"
                )
        if self.provider is None:
            for index, entry in enumerate(self.responses):
                plain = not set(entry) & {"code", "error", "raw_response", "tool_result"}
                if plain:
                    self._ready[index] = self._response(entry, ())

    @property
    def speaks(self) -> str | None:
        """``code`` if the script writes code, ``conversation`` if it calls tools."""
        if self.medium_hint is not None:
            return self.medium_hint
        if any(entry.get("code") is not None for entry in self.responses):
            return "code"
        if any(entry.get("tool_calls") for entry in self.responses):
            return "conversation"
        return None

    @property
    def remaining(self) -> int:
        return len(self.responses) - self._cursor

    async def query(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Response:
        self.invocations.append(Query(messages, tuple(tools), tool_choice, extra or {}))
        slot = self._entity_slot(messages) if self.per_entity else self._shared_slot()
        entry = self.responses[slot]
        delay = float(entry.get("delay_ms", 0)) / 1000.0 + self.latency_s
        if delay:
            await simulate_latency(delay)
        if entry.get("error"):
            error = entry["error"]
            raise ProviderError(
                str(error.get("message", "scripted provider error")),
                status=error.get("status"),
                retry_after=error.get("retry_after"),
            )
        if self.provider == "openai":
            payload = entry.get("raw_response") or self._openai_payload(entry, tools)
            response = parse_chat_completion(plain_json(payload), messages)
            if "usage" not in payload and self.usage is not None:
                response = attrs.evolve(response, usage=self.usage)
            return response
        if entry.get("raw_response") or entry.get("tool_result"):
            raise InvalidResponseError(
                "a raw provider payload needs a provider format to be normalized through"
            )
        ready = self._ready.get(slot)
        if ready is not None:
            return ready
        return self._response(entry, tools)

    def _shared_slot(self) -> int:
        if self._cursor >= len(self.responses):
            raise ScriptExhaustedError(
                f"scripted LLM {self.name!r} has no response left for query "
                f"#{len(self.invocations)} (its script has {len(self.responses)})"
            )
        # The slot is taken now, on arrival: concurrent queries (entities sharing
        # this LLM) each own one entry, in the order they asked, whatever order
        # their latency waits end in.
        slot = self._cursor
        self._cursor += 1
        return slot

    def _entity_slot(self, messages: Sequence[Message]) -> int:
        """The entry for this conversation: the answer after the ones it already has.

        Error entries give no answer, so they are not counted among the answers
        before; those just ahead of the next answer are raised once each per
        conversation, so a retry of the same request moves on to the answer."""
        answers = sum(1 for entry in self.responses if not entry.get("error"))
        start, answered = script_position(messages, answers)
        key = _conversation_key(messages[: start + 1])
        seen = 0
        for slot, entry in enumerate(self.responses):
            if entry.get("error"):
                if seen == answered and (key, slot) not in self._errors_given:
                    self._errors_given[(key, slot)] = 1
                    return slot
                continue
            if seen == answered:
                return slot
            seen += 1
        raise ScriptExhaustedError(
            f"scripted LLM {self.name!r} has no response left for turn {answered + 1} "
            f"of this cast (its script has {len(self.responses)}; every cast plays it "
            "from its first entry)"
        )

    def _response(self, entry: Mapping[str, Any], tools: Sequence[ToolDefinition]) -> Response:
        stop = entry.get("stop_reason")
        return Response(
            content=entry.get("content"),
            # Arguments given as objects: a cut shows only by position (see _finish).
            tool_calls=mark_cut_off(self._calls(entry, tools), stop, arguments_as_text=False),
            usage=_usage(entry["usage"]) if "usage" in entry else (self.usage or ZERO_USAGE),
            thinking=entry.get("thinking"),
            stop_reason=stop,
            model=self.name,
            provider="scripted",
        )

    async def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Mapping[str, Any] | None = None,
        *,
        on_event: Callable[[Any], None],
    ) -> Response:
        """The same answer as :meth:`query`, emitted the way a provider streams it:
        thinking and text in chunks, each tool call announced with partial
        arguments, then finalized."""
        response = await self.query(messages, tools, tool_choice, extra)
        for text, kind in ((response.thinking, ThinkingDelta), (response.content, TextDelta)):
            for start in range(0, len(text or ""), STREAM_CHUNK):
                on_event(kind(text=(text or "")[start : start + STREAM_CHUNK]))
        for call in response.tool_calls:
            raw = call.arguments_json
            on_event(ToolCallEvent(call_id=call.id, name=call.name, arguments=raw[: len(raw) // 2]))
            on_event(
                ToolCallEvent(call_id=call.id, name=call.name, arguments=call.arguments, final=True)
            )
        return response

    def _calls(
        self, entry: Mapping[str, Any], tools: Sequence[ToolDefinition]
    ) -> tuple[ToolCall, ...]:
        calls: list[ToolCall] = []
        if entry.get("code") is not None:
            calls.append(ToolCall(self._next_id(), _code_tool(tools), {"code": entry["code"]}))
        for raw in entry.get("tool_calls") or ():
            name = raw.get("gate", raw.get("name"))
            args = raw.get("args", raw.get("arguments", {}))
            raw_text = None
            if isinstance(args, str):
                raw_text, args = args, {}
            calls.append(ToolCall(str(raw.get("id") or self._next_id()), str(name), args, raw_text))
        return tuple(calls)

    def _openai_payload(
        self, entry: Mapping[str, Any], tools: Sequence[ToolDefinition]
    ) -> dict[str, Any]:
        if entry.get("tool_result"):
            result = entry["tool_result"]
            message: dict[str, Any] = {
                "role": "tool",
                "tool_call_id": result.get("tool_call_id"),
                "content": result.get("content"),
            }
        else:
            message = {"role": "assistant", "content": entry.get("content")}
            calls = self._calls(entry, tools)
            if calls:
                message["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments_json},
                    }
                    for c in calls
                ]
        payload: dict[str, Any] = {
            "object": "chat.completion",
            "model": self.name,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": _FINISH_FOR[entry.get("stop_reason") or "end_turn"],
                }
            ],
        }
        if "usage" in entry:
            payload["usage"] = _usage(entry["usage"]).to_dict()
        return payload

    def _next_id(self) -> str:
        return f"call_{next(_ids)}"


def script_position(messages: Sequence[Message], answers: int) -> tuple[int, int]:
    """Where the latest intent is in ``messages`` and how many answers followed it.

    A user message surely opens a cast when it is the first one, or follows the
    result of a ``done`` call that succeeded (the cast before it terminated). One
    after any other tool result or after a text-only answer may open a cast (one
    that ended truncated, in text, or by ``done`` inside code) or may be said inside
    one (a message steering the running cast, a ``require_done`` nudge): such a
    message is taken as the intent only when counting from the earlier candidates
    would run past the script's ``answers`` -- the earliest candidate whose count
    still fits is the intent. Consecutive user messages (an intent and a fold
    summary) are one. Returns ``(index of the intent, answers after it)``.
    """
    candidates: list[int] = []
    for index, message in enumerate(messages):
        if message.role != "user":
            continue
        previous = messages[index - 1] if index else None
        if previous is not None and previous.role == "user":
            continue  # the same opening, continued
        finished = (
            previous is not None
            and previous.role == "tool"
            and previous.name == "done"
            and not previous.is_error
        )
        if previous is None or previous.role == "system" or finished:
            candidates = [index]  # sure: nothing before it is this cast's
        else:
            candidates.append(index)
    if not candidates:
        return 0, _answers_after(messages, -1)
    for index in candidates:
        answered = _answers_after(messages, index)
        if answered < answers:
            return index, answered
    last = candidates[-1]
    return last, _answers_after(messages, last)


_FOLDED = re.compile(r"\[Folded: turns (\d+)-(\d+)\]")
"""The marker a fold puts where it took turns out (``FoldingPolicy.marker``)."""


def _answers_after(messages: Sequence[Message], start: int) -> int:
    """Assistant messages after ``start``, plus the turns a fold took out there (a
    fold within one cast keeps the position; see SPEC.md on per-entity scripts)."""
    count = 0
    for message in messages[start + 1 :]:
        if message.role == "assistant":
            count += 1
        elif message.role == "user" and message.content:
            folded = _FOLDED.match(message.content)
            if folded is not None:
                count += int(folded.group(2)) - int(folded.group(1)) + 1
    return count


def _conversation_key(messages: Sequence[Message]) -> str:
    """A short fingerprint of a conversation up to its intent (which errors it was given)."""
    digest = hashlib.sha256()
    for message in messages:
        digest.update(f"{message.role}\0{message.text()}\0".encode())
    return digest.hexdigest()[:32]


def _code_tool(tools: Sequence[ToolDefinition]) -> str:
    """The code medium's tool: the one offered tool that takes ``code``."""
    candidates = [t.name for t in tools if "code" in (t.parameters.get("properties") or {})]
    if len(candidates) != 1:
        raise InvalidResponseError(
            "a scripted code response needs exactly one offered tool that takes 'code' "
            f"(offered: {', '.join(t.name for t in tools) or 'none'})"
        )
    return candidates[0]
