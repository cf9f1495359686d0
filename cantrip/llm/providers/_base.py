"""The adapter base: what every HTTP adapter does around its three pure functions.

An adapter is three pure functions over JSON -- build the request body from
rendered canonical messages, parse a response payload, fold a stream of SSE
events into that same payload shape -- plus :class:`HTTPAdapter`, which does
one turn's I/O, in order:

* the transcript goes through the renderer first, remembered per conversation
  (:mod:`._render_memo`; pairing, adjacency, dedupe and id projection are the
  renderer's job, never the adapter's), then to the wire;
* failures become :class:`~cantrip.ProviderError` by one policy
  (:mod:`._faults`: status, code, ``retryable``, ``retry_after``);
* streaming emits :mod:`cantrip.llm._stream` events live and returns exactly what
  ``query`` would have returned for the same payload;
* ``tool_choice="required"`` on an endpoint that cannot force a call is
  simulated by re-prompting once with an instruction (LLM-5);
* a refused request (and, asked for, every request) has the renderer's
  diagnostics logged (:mod:`._debug_log`).

Beside it, the small pure helpers the adapters share: ``extra`` split into
hyperparameters and pass-through fields, the system texts, consecutive turns of
one role joined (:func:`append_turn`), an assistant message's reasoning artefacts
put back in their places (:func:`with_reasoning`),
the body's JSON bytes, a tool-call id for a provider that gives none, events
for an answer that arrived whole.

Requests go out on a pool of keep-alive connections per adapter and trio run
(:mod:`cantrip.llm.providers._clients`), closed when the run ends, speaking HTTP/1.1
themselves (:mod:`cantrip.llm.providers._wire`: the bytes httpx would send), or on
httpx where a proxy from the environment applies or the user gave a client.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import aclosing
from typing import Any, ClassVar, Protocol

import attrs
import httpx
import orjson
import trio

from cantrip._errors import ProviderError
from cantrip._redact import get_logger
from cantrip._version import __version__
from cantrip.llm._config import Compat, ModelInfo, ProviderConfig
from cantrip.llm._contract import (
    EMPTY,
    Message,
    ReasoningPart,
    Response,
    ToolChoice,
    ToolDefinition,
)
from cantrip.llm._sse import SSEEvent, aiter_sse
from cantrip.llm._stream import MessageStart, TextDelta, ThinkingDelta, ToolCallEvent
from cantrip.llm._transcript_model import ProviderFormat
from cantrip.llm.providers._clients import (
    ClientPool,
    GivenClient,
    Reply,
    default_connections,
    read_whole,
)
from cantrip.llm.providers._debug_log import (
    debug_from_environment,
    log_transcript,
    may_be_the_transcript,
)
from cantrip.llm.providers._faults import (
    HTTP_FAULTS,
    TRANSPORT_CODES,
    read_payload,
    status_error,
    transport_error,
)
from cantrip.llm.providers._render_memo import RenderCache, render

log = get_logger("cantrip.llm.providers")
EventSink = Callable[[Any], None]
HYPERPARAMETERS = frozenset({"temperature", "top_p", "max_tokens", "stop", "seed"})
REQUIRED_NUDGE = (
    "You must answer by calling one of the available tools now; a reply in plain text "
    "is not accepted."
)
_LOOPBACK = ("127.", "localhost", "[::1]")
DRAIN_S = 0.5
"""How long the rest of a stream is read after an error event before it is abandoned."""


class StreamState(Protocol):
    """Folds one response's SSE events; ``finish`` returns the normalized response."""

    def feed(self, event: SSEEvent) -> bool:
        """Take one event; ``True`` once the stream says it is complete."""
        ...

    def finish(self) -> Response: ...


def dumps(body: Any) -> bytes:
    """A request body as compact UTF-8 JSON.

    orjson writes it ~10x faster than the standard library (the body carries
    the whole conversation, so this is a turn's one O(history) step), the same
    bytes for the same values. NaN and infinities, which JSON has not (orjson
    writes ``null``), are refused before they get here: by the identity, and by
    strict parsing of a model's tool arguments (``strict_json``).
    What orjson refuses -- lone surrogates (sandbox output), integers beyond
    64 bits, non-string keys, very deep nesting -- the standard library
    writes, as before."""
    try:
        return orjson.dumps(body)
    except TypeError:
        pass
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (sandbox output): send it as a JSON escape
        return json.dumps(body, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def split_extra(
    extra: Mapping[str, Any], reserved: frozenset[str], provider: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(identity hyperparameters, pass-through fields) of a query's ``extra``."""
    hyper: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for key, value in extra.items():
        if value is None:
            continue
        if key in HYPERPARAMETERS:
            hyper[key] = value
        elif key in reserved:
            log.warning("%s: extra field %r is set by the adapter; ignored", provider, key)
        else:
            rest[key] = value
    if isinstance(hyper.get("stop"), str):
        hyper["stop"] = [hyper["stop"]]
    elif "stop" in hyper:
        hyper["stop"] = list(hyper["stop"])
        if not hyper["stop"]:
            del hyper["stop"]
    return hyper, rest


def system_texts(messages: Iterable[Message]) -> list[str]:
    """The texts of the system messages: every API takes them apart from the turns."""
    return [m.content for m in messages if m.role == "system" and m.content]


def append_turn(
    turns: list[dict[str, Any]], role: str, items: list[dict[str, Any]], key: str
) -> None:
    """Add ``items`` to ``turns`` as a ``role`` turn holding them under ``key``; nothing
    for no items. Consecutive turns of one role become one: Anthropic and Gemini
    want user and model turns to alternate, so the results of one round of tool
    calls share a turn (and so does a user message after them)."""
    if not items:
        return
    if turns and turns[-1]["role"] == role:
        turns[-1][key].extend(items)
    else:
        turns.append({"role": role, key: items})


def with_reasoning(
    canonical: list[dict[str, Any] | None], parts: Sequence[ReasoningPart]
) -> list[dict[str, Any]]:
    """An assistant message's wire items with its reasoning artefacts back in their places.

    ``canonical`` holds the item of each canonical part: ``[0]`` the text's (None
    when there is none), ``[1 + i]`` tool call i's. A ``fields`` artefact is set
    on the item at its position; a ``part`` artefact (a whole item the provider
    gave) goes before the item at its position, or after the last one when its
    position is past them -- where it stood in the provider's answer."""
    if not parts:
        return [item for item in canonical if item is not None]
    for part in parts:
        if part.kind == "fields" and 0 <= part.position < len(canonical):
            target = canonical[part.position]
            if target is not None:
                target.update(json.loads(part.payload))
    out: list[dict[str, Any]] = []
    for position, item in enumerate(canonical):
        out.extend(
            json.loads(p.payload) for p in parts if p.kind == "part" and p.position == position
        )
        if item is not None:
            out.append(item)
    out.extend(
        json.loads(p.payload) for p in parts if p.kind == "part" and p.position >= len(canonical)
    )
    return out


def synthetic_call_id(seed: str | None, index: int) -> str:
    """A tool-call id for a provider that gave none: deterministic given the response id."""
    if not seed:
        return f"call_{uuid.uuid4().hex[:24]}"
    return "call_" + hashlib.sha256(f"{seed}:{index}".encode()).hexdigest()[:24]


def replay(response: Response, on_event: EventSink) -> None:
    """Events for an answer that arrived whole (a server that did not stream)."""
    if response.thinking:
        on_event(ThinkingDelta(text=response.thinking))
    if response.content:
        on_event(TextDelta(text=response.content))
    for call in response.tool_calls:
        on_event(ToolCallEvent(call_id=call.id, name=call.name, arguments=call.arguments_json))


def _is_loopback(url: str) -> bool:
    host = url.split("://", 1)[-1]
    return host.startswith(_LOOPBACK)


class HTTPAdapter:
    """Base of the provider adapters; see the module docstring."""

    family: ClassVar[ProviderFormat] = "openai"
    """The transcript renderer's provider format."""
    reserved: ClassVar[frozenset[str]] = frozenset()
    """Body fields ``extra`` may not override."""
    reasoning_format: ClassVar[str | None] = None
    """The ``api_format`` whose reasoning artefacts this adapter replays (None: drops all)."""
    reports_cost: ClassVar[bool] = False
    """Whether every answer carries its cost (``Response.metadata["cost"]``): then a
    model the catalogue does not price can still keep a ``max_cost_usd`` budget."""

    @property
    def context_window(self) -> int | None:
        """The model's window from provider metadata: the default folding trigger (PROD-4)."""
        return self.info.context_window

    def __init__(
        self,
        config: ProviderConfig,
        model: str,
        *,
        api_key: str | None,
        base_url: str | None = None,
        timeout_s: float | None = None,
        compat: Compat | None = None,
        name: str | None = None,
        client: httpx.AsyncClient | None = None,
        debug: bool | None = None,
    ) -> None:
        self.config = config
        self.debug_transcript = debug if debug is not None else debug_from_environment()
        """Log every request's transcript diagnostics at DEBUG (``CANTRIP_DEBUG_TRANSCRIPT``)."""
        self.model = model
        self.base_url = (base_url or config.provider.base_url or "").rstrip("/")
        self.compat = compat or config.compat_for(model)
        self.info: ModelInfo = config.model_info(model)
        self.timeout = httpx.Timeout(
            timeout_s or config.provider.timeout_s, connect=config.provider.connect_timeout_s
        )
        self._name = name or f"{config.name}:{model}"
        self._api_key = api_key
        self._given = GivenClient(client) if client is not None else None
        self.max_connections = default_connections()
        """Requests in flight at once (one connection each) before the next waits: a
        quarter of the process's descriptor limit, within 16..4,096 (``default_connections``)."""
        self._pool: ClientPool | None = None
        """This trio run's connections (see ``_take``)."""
        self._pool_token: trio.lowlevel.TrioToken | None = None
        self._trust_env = not _is_loopback(self.base_url)
        self._renders = RenderCache(
            self.render_family, self.keep_thinking, reasoning_format=self.reasoning_format
        )
        headers = {
            "content-type": "application/json",
            "user-agent": f"cantrip/{__version__}",
            **config.provider.headers,
            **self.auth_headers(api_key),
        }
        self._headers = {**headers, "accept": "application/json"}
        self._stream_headers = {**headers, "accept": "text/event-stream"}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(provider={self.provider!r}, model={self.model!r})"

    # -- identity ---------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def provider(self) -> str:
        return self.config.name

    @property
    def rate_limit_key(self) -> str:
        """Requests sharing a key share a rate-limit bucket: the provider and its credentials."""
        return f"{self.provider}:{self.config.provider.api_key_env or self.base_url}"

    # -- what subclasses provide ---------------------------------------------------

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        return {"authorization": f"Bearer {api_key}"} if api_key else {}

    def build_request(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        tool_choice: ToolChoice | None,
        extra: Mapping[str, Any],
        stream: bool,
    ) -> tuple[str, dict[str, Any]]:
        """(URL, JSON body) of one request."""
        raise NotImplementedError

    def encode_request(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        tool_choice: ToolChoice | None,
        extra: Mapping[str, Any],
        stream: bool,
    ) -> tuple[str, bytes]:
        """(URL, the JSON body's bytes) of one request: :meth:`build_request`'s body,
        written by :func:`dumps` (an adapter may reuse bytes it wrote before)."""
        url, body = self.build_request(messages, tools, tool_choice, extra, stream)
        return url, dumps(body)

    def parse(self, payload: Mapping[str, Any], messages: Sequence[Message]) -> Response:
        raise NotImplementedError

    def new_stream(self, messages: Sequence[Message], on_event: EventSink) -> StreamState:
        raise NotImplementedError

    # -- the LLM protocol ------------------------------------------------------------

    async def query(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Response:
        return await self._answer(messages, tools, tool_choice, extra or EMPTY, None)

    async def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Mapping[str, Any] | None = None,
        *,
        on_event: EventSink,
    ) -> Response:
        return await self._answer(messages, tools, tool_choice, extra or EMPTY, on_event)

    async def aclose(self) -> None:
        pool, self._pool, self._pool_token = self._pool, None, None
        if pool is not None:
            await pool.aclose()

    # -- one turn ----------------------------------------------------------------------

    def _forces_tools(self) -> bool:
        return self.compat.tool_choice and self.compat.tool_choice_required

    async def _answer(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        tool_choice: ToolChoice | None,
        extra: Mapping[str, Any],
        on_event: EventSink | None,
    ) -> Response:
        simulate = tool_choice == "required" and bool(tools) and not self._forces_tools()
        first = await self._exchange(
            messages, tools, "auto" if simulate else tool_choice, extra, on_event
        )
        if not simulate or first.tool_calls:
            return first
        # LLM-5: the endpoint cannot force a tool call, so ask once more, explicitly.
        log.info("%s: no tool call under tool_choice=required; re-prompting once", self.name)
        follow = list(messages)
        if first.content:
            follow.append(Message(role="assistant", content=first.content))
        follow.append(Message(role="user", content=REQUIRED_NUDGE))
        if on_event is not None:
            on_event(MessageStart(attempt=2))
        second = await self._exchange(follow, tools, "auto", extra, on_event, memo=False)
        return attrs.evolve(
            second,
            usage=first.usage + second.usage,
            metadata={**second.metadata, "tool_choice_reprompted": True},
        )

    async def _exchange(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        tool_choice: ToolChoice | None,
        extra: Mapping[str, Any],
        on_event: EventSink | None,
        *,
        memo: bool = True,
    ) -> Response:
        if memo:
            rendered = self._renders.render(messages)
        else:
            rendered = render(
                messages, self.render_family, self.keep_thinking, self.reasoning_format
            )
        url, data = self.encode_request(
            rendered.messages, tools, tool_choice, extra, on_event is not None
        )
        if self.debug_transcript:
            self._log_transcript(logging.DEBUG, messages, rendered.messages, None)
        try:
            if on_event is None:
                payload = await self._post(url, data)
                response = self.parse(payload, rendered.messages)
            else:
                response = await self._stream(url, data, rendered.messages, on_event)
        except ProviderError as error:
            if may_be_the_transcript(error):
                self._log_transcript(logging.WARNING, messages, rendered.messages, error)
            raise
        response = self._finish(response, rendered.id_map, rendered.remapped)
        if on_event is not None:
            for call in response.tool_calls:
                on_event(
                    ToolCallEvent(
                        call_id=call.id,
                        name=call.name,
                        arguments=call.raw_arguments
                        if call.raw_arguments is not None and not call.arguments
                        else call.arguments,
                        final=True,
                    )
                )
        return response

    def _log_transcript(
        self,
        level: int,
        messages: Sequence[Message],
        sent: Sequence[Message],
        error: ProviderError | None,
    ) -> None:
        log_transcript(
            level,
            self.name,
            messages,
            sent,
            error,
            family=self.render_family,
            keep_thinking=self.keep_thinking,
            reasoning_format=self.reasoning_format,
        )

    @property
    def render_family(self) -> ProviderFormat:
        return self.family

    @property
    def keep_thinking(self) -> bool:
        """Whether earlier reasoning is sent back (it needs signatures we do not keep)."""
        return False

    def _finish(
        self, response: Response, id_map: Mapping[str, str], remapped: bool = True
    ) -> Response:
        """The response as this adapter answers it: its provider, the model asked for
        in its metadata (``requested_model``; the model, if the reply named none), and
        the tool-call ids the transcript used. A parser that made it so already
        (the OpenAI-compatible one) leaves nothing to do in the common case."""
        calls = response.tool_calls
        mapped = bool(calls) and remapped
        if (
            not mapped
            and response.provider == self.provider
            and response.model
            and response.metadata.get("requested_model") == self.model
        ):
            return response
        if mapped:
            # A provider that echoes a projected id gets the canonical one back; keys of
            # reused ids ("id#2") name no call and are not mapped back.
            back = {wire: key for key, wire in id_map.items() if key != wire and "#" not in key}
            calls = tuple(
                attrs.evolve(c, id=back[c.id]) if c.id in back else c for c in response.tool_calls
            )
        # Made directly, not with attrs.evolve (which looks up the fields each call):
        # every turn passes here.
        return Response(
            content=response.content,
            tool_calls=calls,
            usage=response.usage,
            thinking=response.thinking,
            stop_reason=response.stop_reason,
            model=response.model or self.model,
            provider=self.provider,
            metadata={**response.metadata, "requested_model": self.model},
            reasoning=response.reasoning,
        )

    # -- HTTP ---------------------------------------------------------------------------

    def _connections(self) -> ClientPool | GivenClient:
        """Where this request goes: the client given to the adapter, or this run's pool.

        A client given to the adapter serves every request; otherwise each
        request takes one connection of this run's :class:`ClientPool`
        (O(1) whatever the concurrency; see :mod:`._clients`)."""
        if self._given is not None:
            return self._given
        token = trio.lowlevel.current_trio_token()
        if self._pool is None or self._pool_token is not token:
            self._pool = ClientPool(
                timeout=self.timeout,
                trust_env=self._trust_env,
                provider=self.provider,
                limit=self.max_connections,
            )
            self._pool_token = token
        return self._pool

    async def _post(self, url: str, data: bytes) -> Mapping[str, Any]:
        try:
            status, headers, body = await self._connections().post(url, data, self._headers)
        except HTTP_FAULTS as exc:
            raise transport_error(self.provider, self.base_url, exc) from exc
        if status >= 400:
            raise status_error(self.provider, status, headers, body)
        return read_payload(self.provider, body, status)

    async def _stream(
        self, url: str, data: bytes, messages: Sequence[Message], on_event: EventSink
    ) -> Response:
        state = self.new_stream(messages, on_event)
        try:
            async with self._connections().stream(url, data, self._stream_headers) as response:
                if response.status_code >= 400:
                    body = await read_whole(response)
                    raise status_error(self.provider, response.status_code, response.headers, body)
                kind = response.headers.get("content-type", "")
                if "event-stream" not in kind and "json" in kind:
                    # A server that answered whole although asked to stream.
                    payload = read_payload(
                        self.provider, await read_whole(response), response.status_code
                    )
                    whole = self.parse(payload, messages)
                    replay(whole, on_event)
                    return whole
                await self._read_events(response, state)
        except HTTP_FAULTS as exc:
            raise transport_error(self.provider, self.base_url, exc) from exc
        return state.finish()

    async def _read_events(self, response: Reply, state: StreamState) -> None:
        """Feed every event to ``state``, then read the stream to its end.

        Reading on after the final event (or after an error event, for at most
        :data:`DRAIN_S`) returns the connection to the pool and leaves no
        half-read response behind. An error event is raised once read; a
        connection lost after the final event changes nothing.
        """
        complete = False
        failure: ProviderError | None = None
        with trio.CancelScope() as drain:
            try:
                async with aclosing(aiter_sse(response, self.provider)) as events:
                    async for event in events:
                        if complete or failure is not None:
                            continue
                        try:
                            complete = state.feed(event)
                        except ProviderError as error:
                            failure = error
                            drain.deadline = trio.current_time() + DRAIN_S
            except ProviderError as error:
                if failure is None and not (complete and error.code in TRANSPORT_CODES):
                    raise
                log.debug("%s: connection lost after the final event: %s", self.name, error)
        if failure is not None:
            raise failure
