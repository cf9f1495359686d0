"""The LLM contract of spec 2.1 as typed values.

``llm.query(messages, tools, tool_choice, extra) -> Response``. Everything a
provider sends back is normalized into these values (LLM-6) before the loop
sees it; provider-specific fields travel in ``Response.metadata`` and nothing
requires them.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Literal, Protocol, TypeGuard, runtime_checkable

import attrs
import orjson
import pydantic

from cantrip._errors import InvalidResponseError

Role = Literal["system", "user", "assistant", "tool"]
ToolChoice = Literal["auto", "required", "none"]


EMPTY: Mapping[str, Any] = MappingProxyType({})


def _frozen_dict(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if not value:
        return EMPTY
    if isinstance(value, MappingProxyType):
        return value
    return MappingProxyType(dict(value))


_encode_arguments_stdlib = json.JSONEncoder(ensure_ascii=False, sort_keys=True).encode
"""One encoder for every call (``json.dumps`` with options builds a new one each time)."""


def _orjson_exact(value: Any) -> bool:
    """Whether orjson's compact text of ``value`` becomes the standard library's by putting
    back the separators' spaces (``", "``, ``": "``): plain data only -- exact ``str``,
    ``int``, ``bool``, None, ``dict`` with text keys, ``list`` -- and no text holding a
    ``,`` or ``:`` (which the spacing would change). Floats are left out: the two
    libraries write some differently (``1e+16`` / ``1e16``). (Loops, not ``all()``: a
    flat mapping is the usual case, checked in about a microsecond.)"""
    kind = type(value)
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or "," in key or ":" in key:
                return False
            kind = type(item)
            if kind is str:
                if "," in item or ":" in item:
                    return False
            elif not (kind is int or kind is bool or item is None or _orjson_exact(item)):
                return False
        return True
    if kind is list:
        return all(_orjson_exact(item) for item in value)
    if kind is str:
        return "," not in value and ":" not in value
    return kind is int or kind is bool or value is None


def _encode_arguments(arguments: dict[str, Any]) -> str:
    """A call's arguments as LLM-4's wire text: exactly ``json.dumps(arguments,
    ensure_ascii=False, sort_keys=True)`` (the text is stored and compared), made with
    orjson when that is the same text -- several times cheaper, once per call of every
    turn (issue 46.4) -- and with the standard library otherwise (what orjson refuses,
    or writes differently: :func:`_orjson_exact`). tests/test_arguments_json.py holds
    the two equal on generated arguments."""
    if _orjson_exact(arguments):
        try:
            text = orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS).decode()
        except TypeError:  # an integer past 64 bits, a lone surrogate
            return _encode_arguments_stdlib(arguments)
        return text.replace(",", ", ").replace(":", ": ")
    return _encode_arguments_stdlib(arguments)


def _calls(value: Iterable[ToolCall]) -> tuple[ToolCall, ...]:
    return tuple(value)


def _parts(value: Iterable[ReasoningPart]) -> tuple[ReasoningPart, ...]:
    return tuple(value)


ReasoningKind = Literal["part", "fields"]


@attrs.frozen
class ReasoningPart:
    """An opaque reasoning artefact of one utterance, tagged with the wire format that made it.

    Anthropic ``thinking``/``redacted_thinking`` blocks, OpenAI Responses
    ``reasoning`` items, Gemini ``thoughtSignature`` fields: each provider needs
    them back, unchanged and in place, on the next request of a tool loop, and
    no other provider may see them. ``payload`` is the JSON text exactly as the
    provider sent it; nothing in cantrip reads it except the adapter of
    ``format`` when it replays it.

    ``position`` places it among the utterance's canonical parts, numbered
    0 for the text (whether or not there is any) and ``1 + i`` for tool call
    ``i``. A ``part`` artefact is a part of its own, sent right before
    canonical part ``position`` (``1 + len(tool_calls)``: after everything); a
    ``fields`` artefact is a JSON object whose fields are set on canonical
    part ``position`` itself (Gemini's ``thoughtSignature`` on a function call,
    the item id of a Responses function call).
    """

    format: str
    """The ``api_format`` of the adapter that produced it (``anthropic-messages``, ...)."""
    position: int
    payload: str
    kind: ReasoningKind = "part"
    text: str | None = None
    """Readable reasoning it carries (a thinking text, a summary), for display only."""
    redacted: bool = False
    """Encrypted or redacted by the provider: nothing in it can be shown."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": self.format,
            "position": self.position,
            "kind": self.kind,
            "payload": self.payload,
        }
        if self.text is not None:
            out["text"] = self.text
        if self.redacted:
            out["redacted"] = True
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReasoningPart:
        kind = data.get("kind", "part")
        if kind not in ("part", "fields"):
            raise ValueError(f"unknown reasoning part kind {kind!r}")
        return cls(
            format=str(data["format"]),
            position=int(data["position"]),
            payload=str(data["payload"]),
            kind=kind,
            text=data.get("text"),
            redacted=bool(data.get("redacted", False)),
        )


_encode_payload = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def reasoning_part(
    format: str,
    position: int,
    value: Any,
    *,
    kind: ReasoningKind = "part",
    text: str | None = None,
    redacted: bool = False,
) -> ReasoningPart:
    """A :class:`ReasoningPart` whose payload is ``value`` as compact JSON (key order kept)."""
    return ReasoningPart(format, position, _encode_payload(value), kind, text, redacted)


@attrs.frozen
class ToolCall:
    """One gate invocation the LLM asked for.

    ``arguments`` is the parsed JSON object; ``raw_arguments`` keeps the text a
    provider sent when it could not be parsed (the call then becomes an
    ``is_error`` observation naming that text, never a crash).
    """

    id: str
    name: str
    arguments: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen_dict)
    raw_arguments: str | None = None
    cut_off: bool = False
    """The output-token limit ended the answer inside this call: its arguments
    may be incomplete, so it is never run (see :mod:`cantrip.llm._finish`)."""
    arguments_json: str = attrs.field(init=False, eq=False, repr=False)
    """The arguments as a JSON string (LLM-4's wire form), encoded once."""

    def __attrs_post_init__(self) -> None:
        if self.raw_arguments is not None and not self.arguments:
            text = self.raw_arguments
        else:
            text = _encode_arguments(dict(self.arguments))
        object.__setattr__(self, "arguments_json", text)


@attrs.frozen
class Message:
    """One message of the context sent to an LLM."""

    role: Role
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=_calls)
    tool_call_id: str | None = None
    name: str | None = None
    """For ``tool`` messages: the gate that produced the result."""
    thinking: str | None = None
    is_error: bool = False
    reasoning: tuple[ReasoningPart, ...] = attrs.field(default=(), converter=_parts)
    """Opaque reasoning artefacts of an assistant message (see :class:`ReasoningPart`)."""

    def text(self) -> str:
        """Everything a reader of the transcript sees in this message."""
        parts = [self.content or ""]
        parts.extend(f"{c.name}({c.arguments_json})" for c in self.tool_calls)
        return "\n".join(p for p in parts if p)

    def text_length(self) -> int:
        """``len(self.text())``, counted without building the text (every turn of a
        folding context counts what it adds)."""
        content = len(self.content) if self.content else 0
        parts = 1 if content else 0
        for call in self.tool_calls:
            content += len(call.name) + len(call.arguments_json) + 2
            parts += 1
        return content + parts - 1 if parts else 0


@attrs.frozen
class ToolDefinition:
    """A gate as the LLM sees it: name, description, JSON Schema parameters."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = attrs.field(
        factory=lambda: {"type": "object", "properties": {}}, converter=_frozen_dict
    )

    @functools.cached_property
    def plain_parameters(self) -> dict[str, Any]:
        """``parameters`` as plain JSON data, made once: every request of every turn sends
        it (turning it back each time cost ~20 us a request). Shared: never change it."""
        plain: dict[str, Any] = _plain(self.parameters)
        return plain

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "parameters": _plain(self.parameters),
        }


@attrs.frozen
class Usage:
    """Token counts of one query (or a sum of them)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    missing: bool = attrs.field(default=False, kw_only=True)
    """The provider's answer carried no usage at all (:data:`NO_USAGE`): the counts
    are not zero but unknown, and so is what the call cost (issue 28, item 11)."""

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cached_tokens + other.cached_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
            self.reasoning_tokens + other.reasoning_tokens,
            missing=self.missing or other.missing,
        )

    def to_dict(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "total_tokens": self.total_tokens,
        }


ZERO_USAGE = Usage()
"""Zero tokens: what a response built without usage states (frozen, so sharing is safe)."""

NO_USAGE = Usage(missing=True)
"""What an adapter returns when the provider's answer held no usage: unknown, not zero."""

StopReason = Literal["end_turn", "tool_use", "max_tokens", "stop_sequence", "error"]
"""Why an answer ended. ``max_tokens`` means it was cut off by the output-token
limit and is not a final answer; adapters map every provider reason through
:func:`cantrip.llm._finish.resolve_finish` (refusals and faults raise instead)."""


@attrs.frozen
class Response:
    """What one query returns, normalized (spec 2.1)."""

    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=_calls)
    usage: Usage = attrs.field(factory=lambda: ZERO_USAGE)
    thinking: str | None = None
    stop_reason: StopReason | None = None
    model: str | None = None
    provider: str | None = None
    metadata: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen_dict)
    reasoning: tuple[ReasoningPart, ...] = attrs.field(default=(), converter=_parts)
    """Opaque reasoning artefacts to replay to the same wire format (:class:`ReasoningPart`)."""

    def validate(self) -> Response:
        """Check LLM-3 and LLM-4; return self so callers can chain."""
        if not self.content and not self.tool_calls and self.stop_reason != "max_tokens":
            # A cut-off answer may be empty (the limit spent on reasoning): the
            # loop reports it as cut off rather than as a broken response.
            raise InvalidResponseError("llm returned neither content nor tool_calls (LLM-3)")
        seen: set[str] = set()
        for call in self.tool_calls:
            if not call.id:
                raise InvalidResponseError(f"tool call to {call.name!r} has no ID (LLM-4)")
            if call.id in seen:
                raise InvalidResponseError(f"duplicate tool call ID {call.id!r} (LLM-4)")
            seen.add(call.id)
        return self


@attrs.frozen
class Query:
    """Everything one ``llm.query`` call receives, as recorded by test LLMs."""

    messages: Sequence[Message]
    tools: tuple[ToolDefinition, ...] = ()
    tool_choice: ToolChoice | None = None
    extra: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen_dict)


@runtime_checkable
class LLM(Protocol):
    """The one interface every model, provider and wrapper implements (LLM-1).

    Implementations hold no conversation state between queries.
    """

    @property
    def name(self) -> str: ...

    async def query(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Response: ...


@runtime_checkable
class StreamingLLM(LLM, Protocol):
    """An LLM that can also stream: same answer as ``query``, with events on the way.

    ``on_event`` receives :mod:`cantrip.llm._stream` events (text and thinking
    deltas, tool calls announced then finalized, ``MessageStart`` again when a
    retry starts over). The returned response is authoritative.
    """

    async def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Mapping[str, Any] | None = None,
        *,
        on_event: Callable[[Any], None],
    ) -> Response: ...


_STREAMING_TYPES: set[type] = set()
"""Types whose every instance streams: checked once per type (see :func:`can_stream`)."""


def can_stream(llm: object) -> TypeGuard[StreamingLLM]:
    """``isinstance(llm, StreamingLLM)``, without its cost on every turn.

    A runtime protocol check looks up every member of the protocol on each
    call (~18 us on CPython 3.11, twice per turn). A type that defines
    ``name``, ``query`` and ``stream`` itself satisfies it for its instances
    (none of cantrip's hides a method behind an instance attribute), so that is
    remembered per type; any other object (members set on the instance, a
    ``stream`` that is not callable) gets the full check each time.
    """
    kind = type(llm)
    if kind in _STREAMING_TYPES:
        return True
    if (
        hasattr(kind, "name")
        and callable(getattr(kind, "query", None))
        and callable(getattr(kind, "stream", None))
        and isinstance(llm, StreamingLLM)
    ):
        _STREAMING_TYPES.add(kind)
        return True
    return isinstance(llm, StreamingLLM)


_SCALARS = frozenset((str, int, float, bool, type(None)))


def _plain(value: Any) -> Any:
    """Turn read-only mappings back into plain JSON-ready data.

    On every turn's path (the loom's records, the gate journal's data: issue 46 saw
    ~60 us a turn here with ``isinstance`` against the ``Mapping`` ABC first), so the
    exact types turns are made of are checked first; anything else takes the
    general route, to the same result."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is dict or kind is MappingProxyType:
        return {k if type(k) is str else str(k): _plain(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, pydantic.BaseModel):  # a structured answer (cantrip._output)
        return value.model_dump(mode="json")
    return value


def plain_leaf(value: Any) -> Any:
    """What :func:`plain_json` makes of one value orjson does not serialise itself (its
    ``default``), for the encoders that let orjson walk the data instead (the gate
    journal); anything else as text, as the loom's encoder does. A non-text key makes
    orjson refuse the whole: the caller then takes :func:`plain_json`'s route."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, list | tuple):
        return list(value)
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="json")
    return str(value)


def plain_json(value: Any) -> Any:
    return _plain(value)
