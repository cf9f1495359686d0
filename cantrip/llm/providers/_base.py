"""What every HTTP adapter shares: the client, errors, streaming, LLM-5, the renderer.

An adapter is three pure functions over JSON -- build the request body from
rendered canonical messages, parse a response payload, fold a stream of SSE
events into that same payload shape -- plus this class, which does the I/O:

* the transcript goes through the renderer first (pairing, adjacency, dedupe
  and id projection are its job, never the adapter's), then to the wire;
* HTTP failures become :class:`~cantrip.ProviderError` with ``status``,
  ``code``, ``retryable`` (429, 5xx, connection errors and timeouts) and
  ``retry_after`` (``Retry-After``, ``retry-after-ms`` or Google's RetryInfo);
  a 200 that is not a whole answer (a body that is not JSON, a stream event
  that is not JSON, a stream without its terminal event) is retryable too;
* streaming emits :mod:`cantrip._events` live and returns exactly what
  ``query`` would have returned for the same payload;
* ``tool_choice="required"`` on an endpoint that cannot force a call is
  simulated by re-prompting once with an instruction (LLM-5);
* the renderer's diagnostics (seed 001, section 10) go to the
  ``cantrip.llm.transcript`` logger: at WARNING when the provider refuses a
  request as a client error (400, 409, 413, 422, ...: not auth, not a missing
  model, nothing retryable), and at DEBUG for every request when the adapter
  was made with ``debug=True`` or ``CANTRIP_DEBUG_TRANSCRIPT=1`` was set.

Requests go out on a pool of keep-alive connections per adapter and trio run
(:mod:`cantrip.llm.providers._clients`), closed when the run ends, speaking HTTP/1.1
themselves (:mod:`cantrip.llm.providers._wire`: the bytes httpx would send), or on
httpx where a proxy from the environment applies or the user gave a client.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import logging
import operator
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
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
    Response,
    ToolChoice,
    ToolDefinition,
)
from cantrip.llm._openai_chat import error_from_payload
from cantrip.llm._sse import SSEEvent, aiter_sse
from cantrip.llm._stream import MessageStart, TextDelta, ThinkingDelta, ToolCallEvent
from cantrip.llm._transcript import (
    IncrementalRenderer,
    ProviderFormat,
    render_transcript,
    validate_transcript,
)
from cantrip.llm.providers._clients import (
    ClientPool,
    GivenClient,
    Reply,
    default_connections,
    read_whole,
)
from cantrip.llm.providers._decode import ResponseTooLarge

log = get_logger("cantrip.llm.providers")
transcript_log = get_logger("cantrip.llm.transcript")
DEBUG_TRANSCRIPT_ENV = "CANTRIP_DEBUG_TRANSCRIPT"
"""Set to ``1`` to log every request's transcript diagnostics at DEBUG."""
_NOT_THE_TRANSCRIPT = frozenset({401, 403, 404})
"""Client errors a transcript cannot cause: credentials, permissions, an unknown model."""

EventSink = Callable[[Any], None]
HYPERPARAMETERS = frozenset({"temperature", "top_p", "max_tokens", "stop", "seed"})
REQUIRED_NUDGE = (
    "You must answer by calling one of the available tools now; a reply in plain text "
    "is not accepted."
)
_CONTEXT_HINTS = (
    "context length",
    "context_length",
    "context window",
    "prompt is too long",
    "maximum number of tokens",
    "too many tokens",
    "maximum context",
    "context size",  # llama.cpp's llama-server: "exceeds the available context size"
)
_LOOPBACK = ("127.", "localhost", "[::1]")
_TRANSPORT_CODES = frozenset({"stream_interrupted", "timeout"})
_HTTP_FAULTS = (httpx.TransportError, httpx.DecodingError)
"""What a request's HTTP exchange may raise: a transport fault, or a body that does not
decode (``DecodingError`` is no ``TransportError``: it escaped the adapters before)."""
DRAIN_S = 0.5
"""How long the rest of a stream is read after an error event before it is abandoned."""


def corrupt_event(provider: str, data: str) -> ProviderError:
    """A stream event whose data is not the JSON object the API promises.

    A stream with a hole in it cannot be folded into a whole answer, so it is
    a transient provider fault: the retry layer asks again inside the turn
    (issue 23); nothing of the broken attempt is recorded.
    """
    snippet = data[:120]
    return ProviderError(
        f"{provider}: the stream carried an event that is not a JSON object: {snippet!r}",
        retryable=True,
        code="malformed_stream",
    )


class StreamState(Protocol):
    """Folds one response's SSE events; ``finish`` returns the normalized response."""

    def feed(self, event: SSEEvent) -> bool:
        """Take one event; ``True`` once the stream says it is complete."""
        ...

    def finish(self) -> Response: ...


@attrs.frozen
class Rendered:
    messages: Sequence[Message]
    id_map: Mapping[str, str]
    remapped: bool = True
    """Whether ``id_map`` maps some id to another (``False``: nothing to map back)."""


def render(
    messages: Sequence[Message],
    family: ProviderFormat,
    keep_thinking: bool,
    reasoning_format: str | None = None,
) -> Rendered:
    """The transcript made provider-valid by :func:`cantrip.llm._transcript.render_transcript`.

    Interaction repair (pairing, adjacency, dedupe, synthetic completions, id
    projection) belongs to the renderer alone; adapters only translate shape.
    """
    result = render_transcript(
        messages, family, keep_thinking=keep_thinking, reasoning_format=reasoning_format
    )
    diagnostics = result.diagnostics
    if log.isEnabledFor(logging.DEBUG) and (
        diagnostics.synthetic_completions
        or diagnostics.dropped_orphan_results
        or diagnostics.dedupe_decisions
        or diagnostics.moved_results
    ):
        log.debug("transcript repaired for %s: %s", family, diagnostics.to_dict())
    id_map = result.id_map
    return Rendered(result.messages, id_map, any(key != wire for key, wire in id_map.items()))


@attrs.define
class _Memo:
    renderer: IncrementalRenderer
    seen: list[Message]
    """The messages rendered: a copy, or an append-only list the caller shares
    (``backing()``), of which the first :attr:`rendered` were rendered."""
    rendered: int = -1
    """For a shared list: how many of its items were rendered (-1: ``seen`` is a copy)."""


RENDER_MEMOS = 1024
"""Conversations an adapter remembers having rendered (the least recently used is dropped)."""


class RenderCache:
    """Incremental rendering across calls, so a turn costs O(new messages).

    A pure memo: what it returns always equals ``render_transcript`` of the
    whole history (the renderer guarantees it); it only remembers how far each
    recent conversation was already rendered. A call whose messages begin
    with exactly the message objects seen before (a growing context) renders
    only the new ones; anything else (a folded context, a new entity) starts a
    fresh renderer, and the least recently used of ``size`` is dropped.

    One adapter serves every entity of a server at once, so ``size`` must
    cover the conversations in flight (200 sessions prompting at once missed
    a memo of 8 on every call and re-rendered every history), and finding a
    conversation must not cost a scan of all of them: memos are found by the
    identity of the last message they saw, looked up from the newest message
    backwards (a turn adds a few), then the whole prefix is checked object by
    object (a C loop over references; the request body is O(history) anyway).
    A memo holds only the messages its entity holds, plus their rendered view.
    """

    def __init__(
        self,
        family: ProviderFormat,
        keep_thinking: bool,
        size: int = RENDER_MEMOS,
        reasoning_format: str | None = None,
    ) -> None:
        self.family = family
        self.keep_thinking = keep_thinking
        self.reasoning_format = reasoning_format
        self.size = size
        self._memos: OrderedDict[int, _Memo] = OrderedDict()
        """By ``id`` of the last message each saw (kept alive by ``seen``), or of the
        shared list it reads (:meth:`_render_shared`); least recently used first."""

    def render(self, messages: Sequence[Message]) -> Rendered:
        backing = getattr(messages, "backing", None)
        if backing is not None:
            return self._render_shared(*backing())
        memos = self._memos
        for last in range(len(messages) - 1, -1, -1):
            memo = memos.get(id(messages[last]))
            if memo is None:
                continue
            seen = memo.seen
            if len(seen) == last + 1 and all(map(operator.is_, seen, messages)):
                new = messages[last + 1 :]
                view = memo.renderer.extend(new)
                if new:
                    del memos[id(seen[-1])]
                    seen.extend(new)
                    memos[id(seen[-1])] = memo
                else:
                    memos.move_to_end(id(seen[-1]))
                return _rendered(memo.renderer, view)
            break  # the conversation changed (folded, forked): render it afresh
        renderer = self._fresh()
        seen = list(messages)
        view = renderer.extend(seen)
        if seen:
            self._remember(id(seen[-1]), _Memo(renderer, seen))
        return _rendered(renderer, view)

    def _render_shared(self, items: list[Message], n: int) -> Rendered:
        """The first ``n`` of an append-only list (a context's :class:`Transcript`):
        its memo is found by the list and renders ``items[k:n]``, the messages
        added since it rendered ``k`` -- O(new messages), however long the history."""
        key = id(items)
        memo = self._memos.get(key)
        if memo is not None and memo.seen is items and 0 <= memo.rendered <= n:
            view = memo.renderer.extend(items[memo.rendered : n])
            memo.rendered = n
            self._memos.move_to_end(key)
            return _rendered(memo.renderer, view)
        renderer = self._fresh()
        view = renderer.extend(items[:n])
        self._remember(key, _Memo(renderer, items, n))  # replaces an earlier, longer view's
        return _rendered(renderer, view)

    def _fresh(self) -> IncrementalRenderer:
        return IncrementalRenderer(
            self.family, keep_thinking=self.keep_thinking, reasoning_format=self.reasoning_format
        )

    def _remember(self, key: int, memo: _Memo) -> None:
        """Keep ``memo`` as the newest under ``key``; drop the least recently used over
        :attr:`size`."""
        memos = self._memos
        memos.pop(key, None)
        memos[key] = memo
        while len(memos) > self.size:
            memos.popitem(last=False)


def _rendered(renderer: IncrementalRenderer, view: Sequence[Message]) -> Rendered:
    return Rendered(view, renderer.id_map, renderer.remapped)


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


def parse_retry_after(headers: Mapping[str, str], payload: Any = None) -> float | None:
    """Seconds a provider asked us to wait, from whichever form it used."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(float(ms) / 1000.0, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value:
        try:
            return max(float(value), 0.0)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError):
                when = None
            if when is not None:
                return max(when.timestamp() - time.time(), 0.0)
    error = payload.get("error") if isinstance(payload, Mapping) else None
    details = error.get("details") if isinstance(error, Mapping) else None
    for detail in details if isinstance(details, list) else ():
        if isinstance(detail, Mapping) and str(detail.get("@type", "")).endswith("RetryInfo"):
            delay = str(detail.get("retryDelay", "")).removesuffix("s")
            try:
                return max(float(delay), 0.0)
            except ValueError:
                return None
    return None


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
        self.debug_transcript = (
            debug
            if debug is not None
            else os.environ.get(DEBUG_TRANSCRIPT_ENV, "").strip().lower() in ("1", "true", "yes")
        )
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
            if (
                error.status is not None
                and 400 <= error.status < 500
                and error.status not in _NOT_THE_TRANSCRIPT
                and not error.retryable
            ):
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
        """The renderer's diagnostics of one request (seed 001, section 10).

        The diagnostics come from rendering ``messages`` again (pure, so equal to
        what was sent; this costs O(messages), only here). ``render_problems`` is
        :func:`validate_transcript` of what was sent: non-empty means a renderer
        fault, empty with a refused request points at the adapter's wire shape or
        at something other than the transcript. The report is also the record's
        ``transcript`` attribute; it holds ids, names and counts, never content.
        """
        if not transcript_log.isEnabledFor(level):
            return
        family = self.render_family
        again = render_transcript(
            messages,
            family,
            keep_thinking=self.keep_thinking,
            reasoning_format=self.reasoning_format,
        )
        report: dict[str, Any] = {
            "adapter": self.name,
            **again.diagnostics.to_dict(),
            "render_problems": validate_transcript(
                sent, family, reasoning_format=self.reasoning_format
            ),
        }
        if error is None:
            transcript_log.log(
                level, "%s: transcript sent: %s", self.name, report, extra={"transcript": report}
            )
            return
        report["status"] = error.status
        report["code"] = error.code
        transcript_log.log(
            level,
            "%s: the provider refused the request (%s); transcript diagnostics: %s",
            self.name,
            error,
            report,
            extra={"transcript": report},
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
        except _HTTP_FAULTS as exc:
            raise self._transport_error(exc) from exc
        if status >= 400:
            raise self._status_error(status, headers, body)
        return self._decode(body, status)

    async def _stream(
        self, url: str, data: bytes, messages: Sequence[Message], on_event: EventSink
    ) -> Response:
        state = self.new_stream(messages, on_event)
        try:
            async with self._connections().stream(url, data, self._stream_headers) as response:
                if response.status_code >= 400:
                    body = await read_whole(response)
                    raise self._status_error(response.status_code, response.headers, body)
                kind = response.headers.get("content-type", "")
                if "event-stream" not in kind and "json" in kind:
                    # A server that answered whole although asked to stream.
                    payload = self._decode(await read_whole(response), response.status_code)
                    whole = self.parse(payload, messages)
                    replay(whole, on_event)
                    return whole
                await self._read_events(response, state)
        except _HTTP_FAULTS as exc:
            raise self._transport_error(exc) from exc
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
                if failure is None and not (complete and error.code in _TRANSPORT_CODES):
                    raise
                log.debug("%s: connection lost after the final event: %s", self.name, error)
        if failure is not None:
            raise failure

    def _decode(self, body: bytes, status: int) -> Mapping[str, Any]:
        try:
            # orjson reads the bytes ~4x faster, into the same values (but integers
            # beyond 64 bits, which it reads as floats: no provider sends such counts);
            # what it refuses (NaN, lone surrogates, ...) the standard library still reads.
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            try:
                payload = json.loads(body)
            except (ValueError, UnicodeDecodeError):
                payload = None
        if not isinstance(payload, Mapping):
            snippet = body[:200].decode("utf-8", errors="replace")
            # A 200 whose body is cut or garbled is a transient fault, like a dropped
            # connection (issue 13): it carries no error status for a policy to judge.
            raise ProviderError(
                f"{self.provider}: the response is not a JSON object: {snippet!r}",
                status=status if status >= 400 else None,
                retryable=True,
                code="malformed_response",
            )
        return payload

    def _status_error(self, status: int, headers: Mapping[str, str], body: bytes) -> ProviderError:
        try:
            payload: Any = json.loads(body) if body else None
        except (ValueError, UnicodeDecodeError):
            payload = None
        if isinstance(payload, list) and payload and isinstance(payload[0], Mapping):
            payload = payload[0]  # Google sometimes wraps the error in a list
        error: Any = payload.get("error") if isinstance(payload, Mapping) else None
        if error is None:
            if isinstance(payload, Mapping) and ("message" in payload or "detail" in payload):
                error = payload
            else:
                error = body[:500].decode("utf-8", errors="replace").strip() or f"HTTP {status}"
        base = error_from_payload(error, status=status)
        code = base.code
        if status in (400, 413) and any(h in base.message.lower() for h in _CONTEXT_HINTS):
            code = "context_length_exceeded"
        return ProviderError(
            f"{self.provider}: {base.message}",
            status=status,
            retryable=base.retryable,
            retry_after=parse_retry_after(headers, payload),
            code=code,
        )

    def _transport_error(self, exc: httpx.TransportError | httpx.DecodingError) -> ProviderError:
        kind = type(exc).__name__
        if isinstance(exc, ResponseTooLarge):
            return ProviderError(
                f"{self.provider}: {exc}",
                retryable=False,
                code="response_too_large",
            )
        if isinstance(exc, httpx.DecodingError):
            # A 200 whose compressed body is corrupt: like one that is cut or garbled.
            return ProviderError(
                f"{self.provider}: the response body does not decode ({kind}: {exc})",
                retryable=True,
                code="malformed_response",
            )
        if isinstance(exc, httpx.TimeoutException):
            return ProviderError(
                f"{self.provider}: the request timed out ({kind})", retryable=True, code="timeout"
            )
        if isinstance(exc, httpx.UnsupportedProtocol | httpx.LocalProtocolError):
            return ProviderError(
                f"{self.provider}: invalid request ({kind}: {exc})",
                retryable=False,
                code="invalid_request",
            )
        if isinstance(exc, httpx.ConnectError):
            return ProviderError(
                f"{self.provider}: cannot connect to {self.base_url} ({exc}) -- "
                f"{_unreachable_hint(str(exc))}",
                retryable=True,
                code="connect_error",
            )
        return ProviderError(
            f"{self.provider}: the connection failed ({kind}: {exc})",
            retryable=True,
            code="connection_error",
        )


def _unreachable_hint(reason: str) -> str:
    """What to do when nothing answers at a provider's address."""
    lowered = reason.lower()
    if "name or service" in lowered or "nodename" in lowered or "getaddrinfo" in lowered:
        return "the host name does not resolve: check base_url (or the provider's config)"
    return "is the server running? Start it, or point base_url in [llm] at where it listens"
