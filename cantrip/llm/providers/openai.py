"""OpenAI Chat Completions over HTTP (``POST {base_url}/chat/completions``).

Also the base of every OpenAI-compatible adapter (OpenRouter, local servers):
their differences are compatibility flags (:class:`~cantrip.llm._config.Compat`),
not code. Responses are parsed by :func:`cantrip.llm._openai_chat.parse_chat_completion`;
a stream is folded back into a ``chat.completion`` payload and parsed by the
same function, so both paths return the same :class:`~cantrip.llm.Response`.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import orjson

from cantrip.llm._contract import Message, Response, ToolChoice, ToolDefinition
from cantrip.llm._openai_chat import error_from_payload, parse_chat_completion
from cantrip.llm._prompt_cache import cache_key
from cantrip.llm._sse import SSEEvent
from cantrip.llm._stream import TextDelta, ThinkingDelta, ToolCallEvent
from cantrip.llm._transcript_incremental import RenderedView
from cantrip.llm._transcript_model import ProviderFormat
from cantrip.llm.providers._base import (
    EventSink,
    HTTPAdapter,
    StreamState,
    dumps,
    split_extra,
    synthetic_call_id,
    system_texts,
)
from cantrip.llm.providers._faults import event_object, incomplete_stream
from cantrip.llm.providers._render_memo import RENDER_MEMOS, remember

_OPEN, _CLOSE = "<think>", "</think>"

SPLICE_FROM = 16
"""Messages a conversation has sent before its body is spliced from their kept JSON
(:meth:`OpenAIAdapter.encode_request`): below ~20, writing the small body whole costs
less than splicing it (0.5-1.7 vs 1.5-1.9 us; at 130 messages 12.3 vs 3.0 us)."""


class _WireMemo:
    """One conversation's wire forms: of the first items of its rendered list."""

    __slots__ = ("encoded", "items", "systems", "wire")

    def __init__(self, items: list[Message]) -> None:
        self.items = items
        self.wire: list[dict[str, Any]] = []
        self.systems: list[tuple[int, str]] = []
        """(position, text) of the system messages among them."""
        self.encoded: list[bytes] = []
        """The first items of :attr:`wire` as JSON (orjson), written once each."""


def _spliced(body: dict[str, Any], memo: _WireMemo, n: int) -> bytes | None:
    """``body`` as JSON, its first ``n`` messages from ``memo``'s kept bytes (the rest
    written now); None where orjson refuses a value or the body does not open with
    its model and messages."""
    wire = body["messages"]
    encoded = memo.encoded
    try:
        while len(encoded) < n:
            encoded.append(orjson.dumps(memo.wire[len(encoded)]))
        pieces = encoded[:n]
        pieces.extend(orjson.dumps(item) for item in wire[n:])
        body["messages"] = []
        shell = orjson.dumps(body)
    except TypeError:  # orjson refuses it (JSONEncodeError is a TypeError)
        return None
    finally:
        body["messages"] = wire
    opening = b'{"model":%s,"messages":[' % orjson.dumps(body["model"])
    if not shell.startswith(opening + b"]"):
        return None
    return b"".join((opening, b",".join(pieces), shell[len(opening) :]))


class OpenAIAdapter(HTTPAdapter):
    """Chat Completions: Bearer auth, ``tools``/``tool_choice``, SSE with ``[DONE]``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._wire_memo: OrderedDict[int, _WireMemo] = OrderedDict()
        """By ``id`` of a rendered list (kept alive by its memo), least recently used first."""

    family = "openai"
    reserved = frozenset(
        {"model", "messages", "stream", "stream_options", "tools", "tool_choice", "functions"}
    )

    @property
    def render_family(self) -> ProviderFormat:
        return self.compat.tool_ids

    @property
    def keep_thinking(self) -> bool:
        return self.compat.send_thinking

    def build_request(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        tool_choice: ToolChoice | None,
        extra: Mapping[str, Any],
        stream: bool,
    ) -> tuple[str, dict[str, Any]]:
        hyper, rest = split_extra(extra, self.reserved, self.provider)
        wire, systems = self._wire_messages(messages)
        body: dict[str, Any] = {"model": self.model, "messages": wire}
        # An endpoint that ignores tool_choice cannot be told "none": offer no tools instead.
        if tools and not (tool_choice == "none" and not self.compat.tool_choice):
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.plain_parameters,
                    },
                }
                for t in tools
            ]
            if tool_choice is not None and self.compat.tool_choice:
                body["tool_choice"] = tool_choice
        for key in ("temperature", "top_p", "seed", "stop"):
            if key in hyper:
                body[key] = hyper[key]
        if "max_tokens" in hyper:
            body[self.compat.max_tokens_field] = hyper["max_tokens"]
        if self.compat.prompt_cache:
            # One routing key per identity (instructions + tools): the prompt caching guide.
            body["prompt_cache_key"] = cache_key("\n\n".join(systems), tools)
        body.update(rest)
        if stream:
            body["stream"] = True
            if self.compat.stream_usage:
                body["stream_options"] = {"include_usage": True}
        return f"{self.base_url}/chat/completions", body

    def encode_request(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        tool_choice: ToolChoice | None,
        extra: Mapping[str, Any],
        stream: bool,
    ) -> tuple[str, bytes]:
        """The body's bytes, its conversation's messages written once each.

        The body carries the whole history, so writing it all each turn cost
        O(history) (~45 us a turn at 200 turns). The JSON of a message the
        conversation sent before is kept with its wire form and the body is
        spliced from those bytes: byte for byte what :func:`dumps` writes
        (orjson's compact form composes), and :func:`dumps` itself where orjson
        refuses a value (a lone surrogate: the standard library writes the whole
        body, as before)."""
        url, body = self.build_request(messages, tools, tool_choice, extra, stream)
        if not isinstance(messages, RenderedView):
            return url, dumps(body)
        items, n, _tail = messages.parts()
        memo = self._wire_memo.get(id(items))
        if memo is None or memo.items is not items or len(memo.wire) < n or n < SPLICE_FROM:
            return url, dumps(body)
        spliced = _spliced(body, memo, n)
        return url, dumps(body) if spliced is None else spliced

    def _wire_messages(self, messages: Sequence[Message]) -> tuple[list[Any], list[str]]:
        """(the messages' wire forms, the texts of the system messages among them).

        A conversation's rendered history is an append-only list plus a short tail
        (:class:`RenderedView`); the wire forms of the list's items are made once and
        kept, by the list, for the next turn, which adds a few messages: making
        them all anew each turn made a turn's cost grow with its history."""
        if not isinstance(messages, RenderedView):
            return [self.wire_message(m) for m in messages], system_texts(messages)
        items, n, tail = messages.parts()
        memo = self._wire_memo.get(id(items))
        if memo is None or memo.items is not items:
            memo = _WireMemo(items)
            remember(self._wire_memo, id(items), memo, RENDER_MEMOS)
        else:
            self._wire_memo.move_to_end(id(items))
        done = memo.wire
        if len(done) < n:
            start = len(done)
            new = items[start:n]
            done.extend(self.wire_message(m) for m in new)
            memo.systems.extend(
                (start + i, m.content)
                for i, m in enumerate(new)
                if m.role == "system" and m.content
            )
        wire = done[:n]
        wire.extend(self.wire_message(m) for m in tail)
        systems = [text for i, text in memo.systems if i < n]
        systems.extend(system_texts(tail))
        return wire, systems

    def wire_message(self, message: Message) -> dict[str, Any]:
        role = message.role
        if role == "system":
            return {"role": self.compat.system_role, "content": message.content or ""}
        if role == "user":
            return {"role": "user", "content": message.content or ""}
        if role == "tool":
            out: dict[str, Any] = {
                "role": "tool",
                "tool_call_id": message.tool_call_id or "",
                "content": message.content or "",
            }
            if self.compat.tool_message_name and message.name:
                out["name"] = message.name
            return out
        out = {
            "role": "assistant",
            "content": message.content or (None if message.tool_calls else ""),
        }
        if message.tool_calls:
            out["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments_json},
                }
                for call in message.tool_calls
            ]
        if self.compat.send_thinking and message.thinking:
            out["reasoning_content"] = message.thinking
        return out

    def parse(self, payload: Mapping[str, Any], messages: Sequence[Message]) -> Response:
        response = parse_chat_completion(
            payload,
            messages,
            provider=self.provider,
            think_tags=self.compat.thinking_format == "think_tags",
            requested_model=self.model,
        )
        if self.compat.synthesize_tool_ids and any(not c.id for c in response.tool_calls):
            seed = str(payload.get("id") or "")
            response = attrs.evolve(
                response,
                tool_calls=tuple(
                    c if c.id else attrs.evolve(c, id=synthetic_call_id(seed, i))
                    for i, c in enumerate(response.tool_calls)
                ),
            )
        return response

    def new_stream(self, messages: Sequence[Message], on_event: EventSink) -> StreamState:
        return ChatStream(self, messages, on_event)


@attrs.define
class _Slot:
    id: str = ""
    name: str = ""
    arguments: list[str] = attrs.field(factory=list)
    whole: Any = None
    announced: bool = False


class ChatStream:
    """``chat.completion.chunk`` events folded into one ``chat.completion`` payload."""

    def __init__(self, adapter: OpenAIAdapter, messages: Sequence[Message], on_event: EventSink):
        self.adapter = adapter
        self.messages = messages
        self.on_event = on_event
        self.id: str | None = None
        self.model: str | None = None
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, _Slot] = {}
        self.finish_reason: str | None = None
        self.choice_error: Any = None
        self.usage: Any = None
        self.done = False
        self.splitter = ThinkSplitter() if adapter.compat.thinking_format == "think_tags" else None

    def feed(self, event: SSEEvent) -> bool:
        data = event.data.strip()
        if not data:
            return False
        if data == "[DONE]":
            self.done = True
            return True
        chunk = event_object(self.adapter.provider, data)
        if event.event == "error" or chunk.get("error"):
            # The explicit error event wins over anything the stream said before (seed 000).
            raise error_from_payload(chunk.get("error") or chunk, default_code="stream_error")
        self.id = self.id or chunk.get("id")
        self.model = chunk.get("model") or self.model
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                self.reasoning.append(reasoning)
                self.on_event(ThinkingDelta(text=reasoning))
            text = delta.get("content")
            if isinstance(text, str) and text:
                self.content.append(text)
                self._emit_text(text)
            for raw in delta.get("tool_calls") or ():
                if isinstance(raw, dict):
                    self._tool_delta(raw)
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
            if choice.get("error"):
                self.choice_error = choice["error"]
        return False

    def _emit_text(self, text: str) -> None:
        if self.splitter is None:
            self.on_event(TextDelta(text=text))
            return
        for kind, piece in self.splitter.feed(text):
            self.on_event(
                ThinkingDelta(text=piece) if kind == "thinking" else TextDelta(text=piece)
            )

    def _tool_delta(self, raw: Mapping[str, Any]) -> None:
        index = raw.get("index")
        call_id = raw.get("id")
        if not isinstance(index, int):
            # Some servers leave out the index: a new id opens a new call.
            known = [i for i, s in self.calls.items() if call_id and s.id == call_id]
            if known:
                index = known[0]
            elif call_id or not self.calls:
                index = len(self.calls)
            else:
                index = max(self.calls)
        slot = self.calls.setdefault(index, _Slot())
        if call_id and not slot.id:
            slot.id = str(call_id)
        function = raw.get("function") or {}
        if function.get("name") and not slot.name:
            slot.name = str(function["name"])
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            slot.arguments.append(arguments)
        elif isinstance(arguments, Mapping):
            slot.whole = dict(arguments)
        if not slot.announced and slot.name:
            slot.announced = True
            position = sorted(self.calls).index(index)
            self.on_event(
                ToolCallEvent(
                    call_id=slot.id
                    or (
                        synthetic_call_id(self.id, position)
                        if self.adapter.compat.synthesize_tool_ids
                        else ""
                    ),
                    name=slot.name,
                    arguments=json.dumps(slot.whole)
                    if slot.whole is not None
                    else "".join(slot.arguments),
                )
            )

    def finish(self) -> Response:
        if not self.done:
            # The terminal event of a Chat Completions stream is ``data: [DONE]``
            # (https://platform.openai.com/docs/api-reference/chat-streaming); a
            # stream that ends without it was cut, even after a finish_reason (the
            # usage chunk, or more choices, may be missing).
            raise incomplete_stream(
                self.adapter.provider,
                "before the response was complete"
                f" (no [DONE]{'' if self.finish_reason is None else ' after the finish reason'})",
            )
        if self.splitter is not None:
            for kind, piece in self.splitter.close():
                self.on_event(
                    ThinkingDelta(text=piece) if kind == "thinking" else TextDelta(text=piece)
                )
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.calls:
            message["tool_calls"] = [
                {
                    "id": slot.id,
                    "type": "function",
                    "function": {
                        "name": slot.name,
                        "arguments": slot.whole
                        if slot.whole is not None
                        else "".join(slot.arguments),
                    },
                }
                for _, slot in sorted(self.calls.items())
            ]
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "finish_reason": self.finish_reason,
        }
        if self.choice_error is not None:
            choice["error"] = self.choice_error
        payload: dict[str, Any] = {"object": "chat.completion", "choices": [choice]}
        if self.id is not None:
            payload["id"] = self.id
        if self.model is not None:
            payload["model"] = self.model
        if self.usage is not None:
            payload["usage"] = self.usage
        return self.adapter.parse(payload, self.messages)


class ThinkSplitter:
    """Routes streamed text inside a leading ``<think>...</think>`` block to thinking.

    Matches :func:`cantrip.llm._openai_chat.split_think_tags` on the whole text.
    """

    def __init__(self) -> None:
        self.state = "start"
        self.buffer = ""

    def feed(self, text: str) -> list[tuple[str, str]]:
        self.buffer += text
        out: list[tuple[str, str]] = []
        while True:
            if self.state == "start":
                stripped = self.buffer.lstrip()
                if not stripped or (_OPEN.startswith(stripped) and stripped != _OPEN):
                    return out  # undecided: whitespace or part of the opening tag so far
                if stripped.startswith(_OPEN):
                    self.buffer, self.state = stripped[len(_OPEN) :], "think"
                else:
                    self.state = "text"
            elif self.state == "think":
                end = self.buffer.find(_CLOSE)
                if end >= 0:
                    if end:
                        out.append(("thinking", self.buffer[:end]))
                    self.buffer, self.state = self.buffer[end + len(_CLOSE) :], "after"
                    continue
                keep = _partial_suffix(self.buffer, _CLOSE)
                ready = self.buffer[: len(self.buffer) - keep]
                if ready:
                    out.append(("thinking", ready))
                self.buffer = self.buffer[len(ready) :]
                return out
            elif self.state == "after":
                self.buffer = self.buffer.lstrip()
                if not self.buffer:
                    return out
                self.state = "text"
            else:
                if self.buffer:
                    out.append(("text", self.buffer))
                    self.buffer = ""
                return out

    def close(self) -> list[tuple[str, str]]:
        rest, self.buffer = self.buffer, ""
        if not rest or self.state == "after":
            return []
        return [("thinking" if self.state == "think" else "text", rest)]


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that could begin ``tag``."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


ADAPTER = OpenAIAdapter
