"""Loopback HTTP servers that speak each provider's real wire format.

A test starts one with ``async with serve(FakeOpenAI([...])) as base_url`` --
a trio server on 127.0.0.1 with an ephemeral port, stopped when the block
ends -- and points an adapter at it. Nothing here assumes a server is
already running, and nothing ever leaves the loopback interface.

Each fake answers from a script of neutral :class:`Answer` values, rendered
in its provider's own JSON (``generateContent``/``messages``/``chat.completion``)
or SSE framing (depending on what the request asked for), and validates each
request the way the real service does (auth header, required fields, tool
call/result pairing) -- a request the real provider would reject gets the
provider's 400. Every request is recorded for assertions.

Fault injection, as script entries: :class:`Fault` (a status with the
provider's error body and headers such as ``Retry-After``), :class:`Stall`
(no answer within the client's timeout), :class:`Drop` (the connection dies
after some events), :class:`Garbage` (comments, keep-alives, unknown fields
and broken lines mixed into a stream), :class:`Malformed` (a body that is not
JSON), :class:`StreamError` (an error event mid-stream), :class:`Corrupt` (a
``data:`` event that is not JSON, mid-stream), :class:`Blank` (events whose data is
empty, which the SSE rules say are not dispatched), :class:`CutBody` (a 200 whose
body or stream ends early but cleanly: half a JSON object, or a stream without
its terminal event) and :class:`Raw`.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import h11
import trio

CHUNK = 7
"""Characters of text per streamed delta."""
_OPENAI_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
"""Function/tool names OpenAI and Anthropic accept (their API references)."""
_GEMINI_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_.:-]{0,63}")
"""Function declaration names Gemini accepts (its API reference)."""


@attrs.frozen
class Call:
    name: str
    arguments: Any = attrs.field(factory=dict)
    """A dict, or a string that is sent as-is (possibly not JSON)."""
    id: str | None = None


@attrs.frozen
class Answer:
    """One model answer, in no provider's format."""

    text: str | None = None
    calls: tuple[Call, ...] = ()
    thinking: str | None = None
    prompt_tokens: int = 11
    completion_tokens: int = 7
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    stop: str = "end"
    """``end``, ``length`` (the output-token limit), or ``filtered`` (the
    provider's content filter / refusal / safety stop)."""
    finish: str | None = None
    """A raw finish reason sent verbatim instead (to test unknown ones)."""
    usage: bool = True
    """False: the answer carries no usage at all, as some servers send (OpenAI format)."""


@attrs.frozen
class Fault:
    status: int
    message: str = "fault injected"
    code: str | None = None
    headers: Mapping[str, str] = attrs.field(factory=dict)


@attrs.frozen
class Stall:
    seconds: float = 30.0


@attrs.frozen
class Drop:
    answer: Answer
    after_events: int = 2


@attrs.frozen
class Garbage:
    answer: Answer


@attrs.frozen
class Corrupt:
    """The answer's stream with event number ``at_event`` replaced by data that is
    not JSON (a proxy that mangled a chunk): the rest of the stream is intact."""

    answer: Answer
    at_event: int = 2


@attrs.frozen
class Blank:
    """The answer's stream with events whose data buffer is empty (``data:``, ``data: ``,
    ``event: ping`` + ``data:``) before each event: by the SSE rules they are never
    dispatched, so a reader sees the plain answer (issue 29)."""

    answer: Answer


BLANK_EVENTS = ("data:\n\n", "data: \n\n", "event: ping\ndata:\n\n", "id: 3\ndata:\r\n\r\n")


@attrs.frozen
class CutBody:
    """A 200 whose body ends early without a transport error: a whole answer's
    JSON cut at ``keep`` of its length, or (streaming) every event but the
    terminal one, after which the server ends the response cleanly."""

    answer: Answer
    keep: float = 0.5


@attrs.frozen
class Malformed:
    body: bytes = b"{not json"


@attrs.frozen
class StreamError:
    answer: Answer
    after_events: int = 1
    message: str = "the model is overloaded"
    code: str = "overloaded_error"
    finish_error: bool = False
    """OpenAI/OpenRouter style: an error object on the final chunk (finish_reason error)."""
    explicit: bool = True
    """Whether an explicit error event is sent too (it takes precedence)."""


@attrs.frozen
class Raw:
    status: int
    body: bytes
    headers: Mapping[str, str] = attrs.field(factory=dict)


Reply = (
    Answer
    | Fault
    | Stall
    | Drop
    | Garbage
    | Malformed
    | StreamError
    | Raw
    | Corrupt
    | CutBody
    | Blank
)


@attrs.define
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Rejected(Exception):
    """A request the real provider would refuse (becomes its 400)."""


class FakeProvider:
    """Shared machinery; subclasses render answers and validate requests."""

    auth_header = "authorization"
    ids = "call"

    def __init__(self, script: Sequence[Reply], *, key: str = "test-key") -> None:
        self.script = list(script)
        self.key = key
        self.requests: list[Request] = []
        self.served = 0
        self.connections = 0
        self.received = bytearray()
        """Every byte the clients sent, in arrival order (tests that send one request at a time)."""
        """TCP connections accepted so far (how many a client opened)."""

    # -- what a provider defines --------------------------------------------------

    def check_auth(self, request: Request) -> bool:
        return request.headers.get(self.auth_header) == f"Bearer {self.key}"

    def validate(self, request: Request, body: Any) -> None:
        raise NotImplementedError

    def wants_stream(self, request: Request, body: Any) -> bool:
        return bool(body.get("stream"))

    def whole(self, answer: Answer, body: Any, n: int) -> dict[str, Any]:
        raise NotImplementedError

    def events(self, answer: Answer, body: Any, n: int) -> list[str]:
        raise NotImplementedError

    def error_body(self, status: int, message: str, code: str | None) -> dict[str, Any]:
        kind = {429: "requests", 401: "invalid_request_error"}.get(status, "server_error")
        if 400 <= status < 500 and status not in (401, 429):
            kind = "invalid_request_error"
        default = {429: "rate_limit_exceeded", 401: "invalid_api_key"}.get(status)
        return {"error": {"message": message, "type": kind, "param": None, "code": code or default}}

    def stream_error(self, fault: StreamError) -> list[str]:
        return [sse({"error": {"message": fault.message, "code": fault.code}})]

    # -- the exchange ------------------------------------------------------------------

    async def respond(self, request: Request, send: Sender) -> None:
        self.requests.append(request)
        if not self.check_auth(request):
            await send.json(401, self.error_body(401, "invalid api key", "invalid_api_key"))
            return
        try:
            body = request.json()
        except ValueError:
            await send.json(400, self.error_body(400, "body is not JSON", "invalid_request"))
            return
        try:
            self.validate(request, body)
        except Rejected as exc:
            await send.json(400, self.error_body(400, str(exc), "invalid_request_error"))
            return
        if not self.script:
            await send.json(500, self.error_body(500, "fake script exhausted", "server_error"))
            return
        reply = self.script.pop(0)
        self.served += 1
        n = self.served
        stream = self.wants_stream(request, body)
        if isinstance(reply, Fault):
            await send.json(
                reply.status,
                self.error_body(reply.status, reply.message, reply.code),
                reply.headers,
            )
        elif isinstance(reply, Stall):
            await trio.sleep(reply.seconds)
        elif isinstance(reply, Malformed):
            await send.raw(200, reply.body, {"content-type": "application/json"})
        elif isinstance(reply, Raw):
            await send.raw(reply.status, reply.body, reply.headers)
        elif isinstance(reply, Drop):
            await send.events(self.events(reply.answer, body, n)[: reply.after_events], drop=True)
        elif isinstance(reply, Garbage):
            await send.events(garble(self.events(reply.answer, body, n)))
        elif isinstance(reply, Blank):
            events = self.events(reply.answer, body, n)
            await send.events(
                [part for i, e in enumerate(events) for part in (BLANK_EVENTS[i % 4], e)]
            )
        elif isinstance(reply, Corrupt):
            events = self.events(reply.answer, body, n)
            events[reply.at_event] = 'data: {"id": "x", "choices": [{"delta": {"content": "ov\n\n'
            await send.events(events)
        elif isinstance(reply, CutBody):
            if stream:
                await send.events(self.unterminated(reply.answer, body, n))
            else:
                whole = json.dumps(self.whole(reply.answer, body, n)).encode()
                cut = whole[: int(len(whole) * reply.keep)]
                await send.raw(200, cut, {"content-type": "application/json"})
        elif isinstance(reply, StreamError):
            await send.events(self.failing_stream(reply, body, n))
        elif stream:
            await send.events(self.events(reply, body, n))
        else:
            await send.json(200, self.whole(reply, body, n))

    def failing_stream(self, fault: StreamError, body: Any, n: int) -> list[str]:
        events = self.events(fault.answer, body, n)[: fault.after_events]
        return events + (self.stream_error(fault) if fault.explicit else [])

    def unterminated(self, answer: Answer, body: Any, n: int) -> list[str]:
        """The stream without its terminal event (each provider says which)."""
        return self.events(answer, body, n)[:-1]


def sse(data: Any, event: str | None = None) -> str:
    text = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return head + "".join(f"data: {line}\n" for line in text.split("\n")) + "\n"


def garble(events: list[str]) -> list[str]:
    """The same events with everything a tolerant reader must skip mixed in.

    Only what the SSE rules say to ignore: comments, unknown fields, lines that
    are not fields, empty events. A ``data:`` line that is not JSON is not
    noise but a corrupted stream (see :class:`Corrupt`)."""
    noise = [
        ": keep-alive\n\n",
        "retry: 1000\n\n",
        "this line is not a field at all\n\n",
        "id: 7\nfoo: bar\n\n",
        "\n\n",
    ]
    out: list[str] = []
    for i, event in enumerate(events):
        out.append(noise[i % len(noise)])
        out.append(event.replace("\n", "\r\n") if i % 2 else event)
    return out


def pieces(text: str | None, size: int = CHUNK) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text or ""), size)] if text else []


def arguments_text(call: Call) -> str:
    return call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)


# -- OpenAI Chat Completions (and OpenRouter, local servers) ------------------------------


class FakeOpenAI(FakeProvider):
    path = "/v1/chat/completions"
    reasoning_field = "reasoning_content"
    supports_tool_choice = True

    def validate(self, request: Request, body: Any) -> None:
        if request.path != self.path:
            raise Rejected(f"unknown path {request.path}")
        if not isinstance(body.get("model"), str) or not isinstance(body.get("messages"), list):
            raise Rejected("model and messages are required")
        if "tool_choice" in body and not body.get("tools"):
            raise Rejected("tool_choice is only allowed when tools are specified")
        for i, tool in enumerate(body.get("tools") or ()):
            if not _OPENAI_NAME.fullmatch(tool["function"]["name"]):
                raise Rejected(
                    f"Invalid 'tools[{i}].function.name': string does not match pattern. "
                    "Expected a string that matches the pattern '^[a-zA-Z0-9_-]{1,64}$'."
                )
        pending: list[str] = []
        for message in body["messages"]:
            role = message.get("role")
            if role == "tool":
                if message.get("tool_call_id") not in pending:
                    raise Rejected(
                        "messages with role 'tool' must be a response to a preceding "
                        "message with 'tool_calls'"
                    )
                pending.remove(message["tool_call_id"])
                continue
            if pending:
                raise Rejected(
                    f"an assistant message with 'tool_calls' must be followed by tool "
                    f"messages responding to each 'tool_call_id': {pending}"
                )
            if role == "assistant":
                for call in message.get("tool_calls") or ():
                    if not isinstance(call["function"]["arguments"], str):
                        raise Rejected("function.arguments must be a string")
                    pending.append(call["id"])
            elif role not in ("system", "developer", "user"):
                raise Rejected(f"invalid role {role!r}")
        if pending:
            raise Rejected(f"tool_calls without responses: {pending}")

    def usage(self, answer: Answer) -> dict[str, Any]:
        return {
            "prompt_tokens": answer.prompt_tokens,
            "completion_tokens": answer.completion_tokens,
            "total_tokens": answer.prompt_tokens + answer.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": answer.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": answer.reasoning_tokens},
        }

    def finish(self, answer: Answer) -> str:
        # https://platform.openai.com/docs/api-reference/chat/object (finish_reason)
        if answer.finish is not None:
            return answer.finish
        if answer.stop == "length":
            return "length"
        if answer.stop == "filtered":
            return "content_filter"
        return "tool_calls" if answer.calls else "stop"

    def call_id(self, call: Call, n: int, i: int) -> str:
        return call.id or f"call_{n}_{i}"

    def whole(self, answer: Answer, body: Any, n: int) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": answer.text}
        if answer.thinking:
            message[self.reasoning_field] = answer.thinking
        if answer.calls:
            message["tool_calls"] = [
                {
                    "id": self.call_id(call, n, i),
                    "type": "function",
                    "function": {"name": call.name, "arguments": arguments_text(call)},
                }
                for i, call in enumerate(answer.calls)
            ]
        return {
            "id": f"chatcmpl-{n}",
            "object": "chat.completion",
            "created": 1700000000,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": self.finish(answer),
                }
            ],
            **({"usage": self.usage(answer)} if answer.usage else {}),
        }

    def chunk(self, body: Any, n: int, delta: Any, finish: str | None = None) -> str:
        return sse(
            {
                "id": f"chatcmpl-{n}",
                "object": "chat.completion.chunk",
                "created": 1700000000,
                "model": body["model"],
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
        )

    def events(self, answer: Answer, body: Any, n: int) -> list[str]:
        out = [self.chunk(body, n, {"role": "assistant", "content": ""})]
        out += [self.chunk(body, n, {self.reasoning_field: p}) for p in pieces(answer.thinking)]
        out += [self.chunk(body, n, {"content": p}) for p in pieces(answer.text)]
        for i, call in enumerate(answer.calls):
            out.append(
                self.chunk(
                    body,
                    n,
                    {
                        "tool_calls": [
                            {
                                "index": i,
                                "id": self.call_id(call, n, i),
                                "type": "function",
                                "function": {"name": call.name, "arguments": ""},
                            }
                        ]
                    },
                )
            )
            for p in pieces(arguments_text(call), 5):
                out.append(
                    self.chunk(
                        body, n, {"tool_calls": [{"index": i, "function": {"arguments": p}}]}
                    )
                )
        out.append(self.chunk(body, n, {}, self.finish(answer)))
        if (body.get("stream_options") or {}).get("include_usage") and answer.usage:
            out.append(
                sse(
                    {
                        "id": f"chatcmpl-{n}",
                        "object": "chat.completion.chunk",
                        "model": body["model"],
                        "choices": [],
                        "usage": self.usage(answer),
                    }
                )
            )
        out.append("data: [DONE]\n\n")
        return out

    def failing_stream(self, fault: StreamError, body: Any, n: int) -> list[str]:
        events = self.events(fault.answer, body, n)[: fault.after_events]
        if fault.explicit:
            events.append(sse({"error": {"message": fault.message, "code": fault.code}}))
        if fault.finish_error:
            events.append(
                sse(
                    {
                        "id": f"chatcmpl-{n}",
                        "object": "chat.completion.chunk",
                        "choices": [
                            {
                                "index": 0,
                                "delta": {},
                                "finish_reason": "error",
                                "error": {"message": "done-level error", "code": "done_error"},
                            }
                        ],
                    }
                )
            )
            events.append("data: [DONE]\n\n")
        return events


class FakeOpenRouter(FakeOpenAI):
    """OpenAI's format plus keep-alive comments, ``reasoning`` and a reported cost."""

    path = "/api/v1/chat/completions"
    reasoning_field = "reasoning"

    def usage(self, answer: Answer) -> dict[str, Any]:
        return {**super().usage(answer), "cost": 0.000123}

    def events(self, answer: Answer, body: Any, n: int) -> list[str]:
        return [": OPENROUTER PROCESSING\n\n", *super().events(answer, body, n)]


class FakeOllama(FakeOpenAI):
    """An Ollama-like local server: no key, and tool_choice is ignored."""

    supports_tool_choice = False

    def check_auth(self, request: Request) -> bool:
        return True


# -- Anthropic Messages ------------------------------------------------------------------------


class FakeAnthropic(FakeProvider):
    auth_header = "x-api-key"

    def check_auth(self, request: Request) -> bool:
        return request.headers.get("x-api-key") == self.key

    def error_body(self, status: int, message: str, code: str | None) -> dict[str, Any]:
        kind = code or {429: "rate_limit_error", 529: "overloaded_error"}.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}

    def validate(self, request: Request, body: Any) -> None:
        if request.path != "/v1/messages":
            raise Rejected(f"unknown path {request.path}")
        if request.headers.get("anthropic-version") != "2023-06-01":
            raise Rejected("anthropic-version header is required")
        if not isinstance(body.get("max_tokens"), int):
            raise Rejected("max_tokens: field required")
        messages = body.get("messages") or []
        if not messages or messages[0]["role"] != "user":
            raise Rejected("messages: the first message must use the user role")
        expected: list[str] = []
        for i, message in enumerate(messages):
            if i and message["role"] == messages[i - 1]["role"]:
                raise Rejected("messages: roles must alternate between user and assistant")
            blocks = message["content"]
            if isinstance(blocks, str):
                blocks = [{"type": "text", "text": blocks}]
            results = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
            if expected:
                if sorted(results) != sorted(expected):
                    raise Rejected(
                        f"messages.{i}: tool_use ids were found without tool_result blocks "
                        f"immediately after: {expected}"
                    )
                leading = [b["type"] for b in blocks[: len(results)]]
                if any(kind != "tool_result" for kind in leading):
                    raise Rejected(f"messages.{i}: tool_result blocks must come first")
            elif results:
                raise Rejected(f"messages.{i}: unexpected tool_use_id in tool_result blocks")
            for block in blocks:
                if block["type"] == "text" and not block["text"]:
                    raise Rejected("text content blocks must be non-empty")
                if block["type"] == "tool_use" and not isinstance(block["input"], dict):
                    raise Rejected("tool_use.input: must be an object")
            expected = [b["id"] for b in blocks if b["type"] == "tool_use"]
        if expected:
            raise Rejected("the conversation ends with unanswered tool_use blocks")
        if "tool_choice" in body and not body.get("tools"):
            raise Rejected("tool_choice may only be specified while providing tools")
        for i, tool in enumerate(body.get("tools") or ()):
            if "name" in tool and not _OPENAI_NAME.fullmatch(tool["name"]):
                raise Rejected(
                    f"tools.{i}.custom.name: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
                )

    def usage(self, answer: Answer) -> dict[str, Any]:
        return {
            "input_tokens": answer.prompt_tokens - answer.cached_tokens - answer.cache_write_tokens,
            "cache_creation_input_tokens": answer.cache_write_tokens,
            "cache_read_input_tokens": answer.cached_tokens,
            "output_tokens": answer.completion_tokens,
        }

    def stop(self, answer: Answer) -> str:
        # https://docs.anthropic.com/en/api/messages (stop_reason)
        if answer.finish is not None:
            return answer.finish
        if answer.stop == "length":
            return "max_tokens"
        if answer.stop == "filtered":
            return "refusal"
        return "tool_use" if answer.calls else "end_turn"

    def call_id(self, call: Call, n: int, i: int) -> str:
        return call.id or f"toolu_{n:02d}{i:02d}"

    def whole(self, answer: Answer, body: Any, n: int) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if answer.thinking:
            content.append({"type": "thinking", "thinking": answer.thinking, "signature": "sig"})
        if answer.text:
            content.append({"type": "text", "text": answer.text})
        for i, call in enumerate(answer.calls):
            content.append(
                {
                    "type": "tool_use",
                    "id": self.call_id(call, n, i),
                    "name": call.name,
                    "input": call.arguments if isinstance(call.arguments, dict) else {},
                }
            )
        return {
            "id": f"msg_{n:04d}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": content,
            "stop_reason": self.stop(answer),
            "stop_sequence": None,
            "usage": self.usage(answer),
        }

    def events(self, answer: Answer, body: Any, n: int) -> list[str]:
        usage = self.usage(answer)
        start_usage = {**usage, "output_tokens": 1}
        out = [
            sse(
                {
                    "type": "message_start",
                    "message": {
                        "id": f"msg_{n:04d}",
                        "type": "message",
                        "role": "assistant",
                        "model": body["model"],
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": start_usage,
                    },
                },
                "message_start",
            ),
            sse({"type": "ping"}, "ping"),
        ]
        index = 0

        def block(start: dict[str, Any], deltas: list[dict[str, Any]]) -> None:
            nonlocal index
            out.append(
                sse(
                    {"type": "content_block_start", "index": index, "content_block": start},
                    "content_block_start",
                )
            )
            for delta in deltas:
                out.append(
                    sse(
                        {"type": "content_block_delta", "index": index, "delta": delta},
                        "content_block_delta",
                    )
                )
            out.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
            index += 1

        if answer.thinking:
            block(
                {"type": "thinking", "thinking": "", "signature": ""},
                [{"type": "thinking_delta", "thinking": p} for p in pieces(answer.thinking)]
                + [{"type": "signature_delta", "signature": "sig"}],
            )
        if answer.text:
            block(
                {"type": "text", "text": ""},
                [{"type": "text_delta", "text": p} for p in pieces(answer.text)],
            )
        for i, call in enumerate(answer.calls):
            block(
                {
                    "type": "tool_use",
                    "id": self.call_id(call, n, i),
                    "name": call.name,
                    "input": {},
                },
                [
                    {"type": "input_json_delta", "partial_json": p}
                    for p in ["", *pieces(arguments_text(call), 5)]
                ],
            )
        out.append(
            sse(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": self.stop(answer), "stop_sequence": None},
                    "usage": {"output_tokens": usage["output_tokens"]},
                },
                "message_delta",
            )
        )
        out.append(sse({"type": "message_stop"}, "message_stop"))
        return out

    def stream_error(self, fault: StreamError) -> list[str]:
        return [
            sse(
                {"type": "error", "error": {"type": fault.code, "message": fault.message}},
                "error",
            )
        ]


# -- Google Gemini -------------------------------------------------------------------------------


class FakeGemini(FakeProvider):
    auth_header = "x-goog-api-key"
    _PATH = re.compile(r"^/v1beta/models/([^/:]+):(generateContent|streamGenerateContent)$")

    def check_auth(self, request: Request) -> bool:
        return request.headers.get("x-goog-api-key") == self.key

    def error_body(self, status: int, message: str, code: str | None) -> dict[str, Any]:
        names = {
            400: "INVALID_ARGUMENT",
            401: "UNAUTHENTICATED",
            429: "RESOURCE_EXHAUSTED",
            500: "INTERNAL",
            503: "UNAVAILABLE",
        }
        return {
            "error": {"code": status, "message": message, "status": names.get(status, "UNKNOWN")}
        }

    def wants_stream(self, request: Request, body: Any) -> bool:
        return request.path.split("?")[0].endswith(":streamGenerateContent")

    def validate(self, request: Request, body: Any) -> None:
        path, _, query = request.path.partition("?")
        match = self._PATH.match(path)
        if match is None:
            raise Rejected(f"unknown path {path}")
        if match.group(2) == "streamGenerateContent" and query != "alt=sse":
            raise Rejected("streaming needs alt=sse for server-sent events")
        contents = body.get("contents") or []
        if not contents:
            raise Rejected("contents is not specified")
        calls: list[str] = []
        for i, content in enumerate(contents):
            if content.get("role") not in ("user", "model"):
                raise Rejected(f"contents[{i}].role must be user or model")
            parts = content.get("parts") or []
            if not parts:
                raise Rejected(f"contents[{i}].parts must not be empty")
            responses = [p["functionResponse"]["name"] for p in parts if "functionResponse" in p]
            if calls:
                if content["role"] != "user" or sorted(responses) != sorted(calls):
                    raise Rejected(
                        "please ensure that the number of function response parts is equal to "
                        "the number of function call parts of the function call turn"
                    )
            elif responses:
                raise Rejected(f"contents[{i}]: function response without a function call")
            calls = [p["functionCall"]["name"] for p in parts if "functionCall" in p]
            for p in parts:
                if "functionResponse" in p and not isinstance(
                    p["functionResponse"].get("response"), dict
                ):
                    raise Rejected("functionResponse.response must be an object")
        for tool in body.get("tools") or ():
            for decl in tool.get("functionDeclarations") or ():
                if not _GEMINI_NAME.fullmatch(decl.get("name", "")):
                    raise Rejected(
                        "Invalid function name. Must start with a letter or an underscore. "
                        "Must be alphameric (a-z, A-Z, 0-9), underscores (_), dots (.), colons "
                        "(:), or dashes (-), with a maximum length of 64."
                    )
                schema = decl.get("parameters")
                if schema is not None and "additionalProperties" in json.dumps(schema):
                    raise Rejected("Unknown name \"additionalProperties\" at 'tools[0]'")

    def usage(self, answer: Answer) -> dict[str, Any]:
        out = {
            "promptTokenCount": answer.prompt_tokens,
            "candidatesTokenCount": answer.completion_tokens - answer.reasoning_tokens,
            "totalTokenCount": answer.prompt_tokens + answer.completion_tokens,
        }
        if answer.cached_tokens:
            out["cachedContentTokenCount"] = answer.cached_tokens
        if answer.reasoning_tokens:
            out["thoughtsTokenCount"] = answer.reasoning_tokens
        return out

    def parts(self, answer: Answer) -> list[dict[str, Any]]:
        parts: list[dict[str, Any]] = []
        if answer.thinking:
            parts.append({"text": answer.thinking, "thought": True})
        if answer.text:
            parts.append({"text": answer.text})
        for call in answer.calls:
            parts.append({"functionCall": {"name": call.name, "args": call.arguments}})
        return parts

    def finish(self, answer: Answer) -> str:
        # https://ai.google.dev/api/generate-content#FinishReason
        if answer.finish is not None:
            return answer.finish
        return {"length": "MAX_TOKENS", "filtered": "SAFETY"}.get(answer.stop, "STOP")

    def candidate_extra(self, answer: Answer) -> dict[str, Any]:
        """A SAFETY stop names the categories that fired (Candidate.safetyRatings)."""
        if answer.stop != "filtered":
            return {}
        return {
            "safetyRatings": [
                {
                    "category": "HARM_CATEGORY_DANGEROUS_CONTENT",
                    "probability": "HIGH",
                    "blocked": True,
                },
                {"category": "HARM_CATEGORY_HARASSMENT", "probability": "NEGLIGIBLE"},
            ]
        }

    def model(self, request: Request) -> str:
        match = self._PATH.match(request.path.split("?")[0])
        return match.group(1) if match else "unknown"

    def whole(self, answer: Answer, body: Any, n: int) -> dict[str, Any]:
        return {
            "candidates": [
                {
                    "content": {"role": "model", "parts": self.parts(answer)},
                    "finishReason": self.finish(answer),
                    "index": 0,
                    **self.candidate_extra(answer),
                }
            ],
            "usageMetadata": self.usage(answer),
            "modelVersion": self.current_model,
            "responseId": f"resp-{n}",
        }

    def events(self, answer: Answer, body: Any, n: int) -> list[str]:
        out: list[str] = []

        def chunk(parts: list[dict[str, Any]], final: bool = False) -> None:
            candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
            data: dict[str, Any] = {
                "candidates": [candidate],
                "modelVersion": self.current_model,
                "responseId": f"resp-{n}",
            }
            if final:
                candidate["finishReason"] = self.finish(answer)
                candidate.update(self.candidate_extra(answer))
                data["usageMetadata"] = self.usage(answer)
            out.append(sse(data))

        for p in pieces(answer.thinking):
            chunk([{"text": p, "thought": True}])
        for p in pieces(answer.text):
            chunk([{"text": p}])
        calls = [{"functionCall": {"name": c.name, "args": c.arguments}} for c in answer.calls]
        chunk(calls, final=True)
        return out

    current_model = "gemini-test"

    async def respond(self, request: Request, send: Sender) -> None:
        self.current_model = self.model(request)
        await super().respond(request, send)


# -- the server --------------------------------------------------------------------------------


class Sender:
    """Writes one HTTP response on a connection (or abandons it)."""

    def __init__(self, stream: trio.SocketStream, conn: h11.Connection) -> None:
        self.stream = stream
        self.conn = conn
        self.dropped = False

    async def _send(self, event: Any) -> None:
        data = self.conn.send(event)
        if data:
            await self.stream.send_all(data)

    async def json(
        self, status: int, payload: Any, headers: Mapping[str, str] | None = None
    ) -> None:
        await self.raw(
            status,
            json.dumps(payload).encode(),
            {"content-type": "application/json", **(headers or {})},
        )

    async def raw(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        pairs = [(k, v) for k, v in headers.items()] + [("content-length", str(len(body)))]
        await self._send(h11.Response(status_code=status, headers=pairs))
        await self._send(h11.Data(data=body))
        await self._send(h11.EndOfMessage())

    async def events(self, events: list[str], *, drop: bool = False) -> None:
        await self._send(
            h11.Response(
                status_code=200,
                headers=[
                    ("content-type", "text/event-stream; charset=utf-8"),
                    ("transfer-encoding", "chunked"),
                    ("cache-control", "no-cache"),
                ],
            )
        )
        for event in events:
            await self._send(h11.Data(data=event.encode()))
        if drop:
            self.dropped = True
            await self.stream.aclose()  # mid-body: the client sees an incomplete chunked read
            return
        await self._send(h11.EndOfMessage())


async def _connection(provider: FakeProvider, stream: trio.SocketStream) -> None:
    conn = h11.Connection(h11.SERVER)
    try:
        while True:
            request: h11.Request | None = None
            body = bytearray()
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(65536)
                    provider.received += data
                    conn.receive_data(data)
                    continue
                if isinstance(event, h11.Request):
                    request = event
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    break
                else:  # ConnectionClosed, PAUSED
                    return
            assert request is not None
            recorded = Request(
                method=request.method.decode(),
                path=request.target.decode(),
                headers={k.decode().lower(): v.decode() for k, v in request.headers},
                body=bytes(body),
            )
            sender = Sender(stream, conn)
            await provider.respond(recorded, sender)
            if sender.dropped or conn.our_state is not h11.DONE:
                return
            conn.start_next_cycle()
    except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
        return
    finally:
        await stream.aclose()


@asynccontextmanager
async def serve(provider: FakeProvider, prefix: str = "") -> AsyncIterator[str]:
    """Run ``provider`` on 127.0.0.1 (ephemeral port); yield its base URL."""

    async def handler(stream: trio.SocketStream) -> None:
        provider.connections += 1
        await _connection(provider, stream)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        try:
            yield f"http://127.0.0.1:{port}{prefix}"
        finally:
            nursery.cancel_scope.cancel()


# -- helpers for tests -------------------------------------------------------------------------

FAKES: dict[str, type[FakeProvider]] = {
    "openai": FakeOpenAI,
    "anthropic": FakeAnthropic,
    "gemini": FakeGemini,
    "openrouter": FakeOpenRouter,
    "ollama": FakeOllama,
}
PREFIXES = {
    "openai": "/v1",
    "anthropic": "/v1",
    "gemini": "/v1beta",
    "openrouter": "/api/v1",
    "ollama": "/v1",
}
KEY_VARS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "OPENROUTER_API_KEY")
PROVIDERS = tuple(FAKES)


def isolate(monkeypatch: Any, tmp_path: Any) -> None:
    """Test keys in the environment, an empty user config folder, fresh caches."""
    from cantrip.llm import clear_cache

    for var in KEY_VARS:
        monkeypatch.setenv(var, "test-key")
    monkeypatch.delenv("OLLAMA_API_KEY", raising=False)
    monkeypatch.setenv("CANTRIP_PROVIDERS_DIR", str(tmp_path / "user-providers"))
    clear_cache()


@asynccontextmanager
async def running(
    provider: str, script: Sequence[Reply], *, key: str = "test-key", **options: Any
) -> AsyncIterator[tuple[FakeProvider, Any]]:
    """A fake ``provider`` serving ``script`` (accepting ``key``) and an adapter pointed at it."""
    from cantrip.llm import load_llm

    fake = FAKES[provider](script, key=key)
    async with serve(fake, PREFIXES[provider]) as url:
        llm = load_llm(provider, base_url=url, **options)
        try:
            yield fake, llm
        finally:
            await llm.aclose()
