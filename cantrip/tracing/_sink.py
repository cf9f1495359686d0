"""OpenTelemetry traces as a view of the event stream (SPEC.md "Traces").

When the ``opentelemetry-api`` package is installed *and* the program has set a
tracer provider, every entity's events also go to a :class:`TraceSink`, which
builds the GenAI spans (:mod:`cantrip.tracing._genai`):

* ``invoke_agent`` from an entity's first step of a cast to the turn that ends
  it -- an error status when the cast was cancelled, crashed or its LLM failed;
* ``chat`` per LLM request, with provider, models, tokens, finish reasons, and
  one ``gen_ai.retry`` span event per extra attempt;
* ``execute_tool`` per gate call. A delegation's span is opened when its first
  child starts, so every child's ``invoke_agent`` nests under the parent's
  ``call_agent`` span.

Nothing in the loop calls this module: the entity hands its events to the sink
the way it hands them to a progress display. Without OpenTelemetry (or with no
tracer provider set) :func:`with_tracing` returns the sink it was given and the
loop pays one cached check per entity.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from cantrip._events import EventSink, MessageComplete, StepComplete, StepStart, ToolResultEvent
from cantrip.llm._contract import ZERO_USAGE, Usage
from cantrip.llm._stream import Event, MessageStart
from cantrip.tracing import _genai
from cantrip.tracing._redacted import RedactedSpan

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Tracer

    from cantrip.loom._loom import Loom

_installed: bool | None = None


def otel_installed() -> bool:
    """Whether ``opentelemetry-api`` can be imported (looked up once per process)."""
    global _installed
    if _installed is None:
        _installed = importlib.util.find_spec("opentelemetry") is not None
    return _installed


def configured_tracer() -> Tracer | None:
    """cantrip's tracer, if the program set a tracer provider; ``None`` otherwise."""
    if not otel_installed():
        return None
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    from cantrip._version import __version__

    return provider.get_tracer("cantrip", __version__)


def with_tracing(on_event: EventSink | None, loom: Loom) -> EventSink | None:
    """``on_event`` plus a trace sink when tracing is on (once per entity tree)."""
    if isinstance(on_event, TraceSink):
        return on_event  # a child: its parent's sink already traces the tree
    tracer = configured_tracer()
    if tracer is None:
        return on_event
    return TraceSink(tracer, loom, on_event)


_now_ns = time.time_ns


@attrs.define(eq=False)
class _PendingChat:
    """An LLM request under way. Its ``chat`` span is made when the request ends, with
    this start time, its name and all its attributes in one call: started at once, the
    span was renamed and given its attributes later, two more calls into the SDK and
    two more looks at the environment for the redactor, every turn (issue 39.24). The
    span is never the current one, so nothing could nest under it meanwhile."""

    started: int
    retries: list[tuple[int, int]] | None = None
    """``(attempt, time_ns)`` of each extra attempt: the span's ``gen_ai.retry`` events
    (``None`` until there is one: most requests are answered the first time)."""


@attrs.define(eq=False)
class _EntityTrace:
    agent: RedactedSpan
    under_agent: Context
    """The context of a span under ``agent``: made once, not once per child span."""
    chat: _PendingChat | None = None
    delegation: RedactedSpan | None = None
    turns: int = 0
    usage: Usage = ZERO_USAGE
    cost: float | None = 0.0


class TraceSink:
    """Builds GenAI spans from one entity tree's events; passes every event on."""

    def __init__(
        self,
        tracer: Tracer,
        loom: Loom,
        inner: EventSink | None = None,
        *,
        capture_content: bool | None = None,
    ) -> None:
        from opentelemetry import trace

        self.tracer = tracer
        self.trace = trace
        """The OpenTelemetry API, imported once (OpenTelemetry is optional, so not at the
        top of this module): an import statement in a handler cost every turn a lookup."""
        self.loom = loom
        self.inner = inner
        self.capture_content = (
            _genai.capture_content_default() if capture_content is None else capture_content
        )
        self._entities: dict[str, _EntityTrace] = {}
        self._handlers: dict[type[Event], Callable[[Any], None]] = {
            StepStart: self._step_start,
            MessageStart: self._message_start,
            MessageComplete: self._message_complete,
            ToolResultEvent: self._tool_result,
            StepComplete: self._step_complete,
        }

    def __call__(self, event: Event) -> None:
        if self.inner is not None:
            self.inner(event)
        handler = self._handlers.get(type(event))
        if handler is not None and event.entity_id:
            handler(event)

    # -- spans ---------------------------------------------------------------------

    def _under(self, parent: RedactedSpan) -> Context:
        return self.trace.set_span_in_context(parent.inner)

    def _entity(self, entity_id: str) -> _EntityTrace:
        state = self._entities.get(entity_id)
        if state is not None:
            return state
        trace = self.trace
        under = None  # None: the caller's current span, for a root entity
        name = "cantrip"
        record = self.loom.entities.get(entity_id)
        if record is not None:
            name = record.cantrip_id
            parent = self._entities.get(record.parent_entity_id or "")
            if parent is not None:
                if parent.delegation is None:
                    parent.delegation = RedactedSpan.start(
                        self.tracer,
                        _genai.tool_name("call_agent"),
                        parent.under_agent,
                        trace.SpanKind.INTERNAL,
                    )
                under = self._under(parent.delegation)
        agent = RedactedSpan.start(
            self.tracer,
            f"invoke_agent {name}",
            under,
            trace.SpanKind.INTERNAL,
            _genai.agent_attributes(entity_id, name),
        )
        state = self._entities[entity_id] = _EntityTrace(agent, self._under(agent))
        return state

    def _step_start(self, event: StepStart) -> None:
        state = self._entities.get(event.entity_id) or self._entity(event.entity_id)
        state.chat = _PendingChat(_now_ns())

    def _message_start(self, event: MessageStart) -> None:
        state = self._entities.get(event.entity_id)
        if state is not None and state.chat is not None and event.attempt > 1:
            retry = (event.attempt, _now_ns())
            if state.chat.retries is None:
                state.chat.retries = [retry]
            else:
                state.chat.retries.append(retry)

    def _message_complete(self, event: MessageComplete) -> None:
        from cantrip.llm._cost import response_cost

        state = self._entities.get(event.entity_id)
        if state is None or state.chat is None:
            return
        response = event.response
        requested = response.metadata.get("requested_model")
        request_model = requested if isinstance(requested, str) else response.model
        attempts = int(response.metadata.get("attempts", 1))
        chat, state.chat = state.chat, None
        cost = response_cost(response)
        attributes = _genai.chat_attributes(
            provider=response.provider,
            request_model=request_model,
            response_model=response.model,
            usage=response.usage,
            stop_reason=response.stop_reason
            or _genai.turn_stop_reason({}, bool(response.tool_calls)),
            attempts=attempts,
            response_id=_text(response.metadata.get("id")),
            cost=cost,
        )
        if self.capture_content:
            attributes["gen_ai.output.messages"] = _genai.output_messages(
                response.content, response.tool_calls
            )
        self._chat_span(state, chat, _genai.chat_name(request_model), attributes).end()
        state.usage = state.usage + response.usage
        if state.cost is not None:
            state.cost = None if cost is None else state.cost + cost

    def _chat_span(
        self,
        state: _EntityTrace,
        chat: _PendingChat,
        name: str,
        attributes: dict[str, _genai.AttributeValue],
    ) -> RedactedSpan:
        span = RedactedSpan.start(
            self.tracer,
            name,
            state.under_agent,
            self.trace.SpanKind.CLIENT,
            attributes,
            chat.started,
        )
        for attempt, at in chat.retries or ():
            span.add_event("gen_ai.retry", {"cantrip.attempt": attempt}, at)
        return span

    def _tool_result(self, event: ToolResultEvent) -> None:
        state = self._entities.get(event.entity_id)
        if state is None:
            return
        record = event.record
        attributes = _genai.tool_attributes(record, self.capture_content)
        if state.delegation is not None:
            span, state.delegation = state.delegation, None
            span.update_name(_genai.tool_name(record.gate))
            span.set_attributes(attributes)
        else:  # started and given its attributes in one call, now that it is over
            span = RedactedSpan.start(
                self.tracer,
                _genai.tool_name(record.gate),
                state.under_agent,
                self.trace.SpanKind.INTERNAL,
                attributes,
                _now_ns() - int(record.duration_ms * 1_000_000),
            )
        if record.is_error:
            trace = self.trace
            span.set_status(trace.Status(trace.StatusCode.ERROR, _genai.tool_error(record)))
        span.end()

    def _step_complete(self, event: StepComplete) -> None:
        trace = self.trace
        turn = event.turn
        state = self._entities.get(event.entity_id)
        if turn is None or state is None:
            return
        state.turns += 1
        if state.chat is not None:  # the LLM call failed: no MessageComplete came
            chat, state.chat = state.chat, None
            error = str(turn.extras.get("error_type") or turn.reason or "error")
            attributes: dict[str, _genai.AttributeValue] = {
                "gen_ai.operation.name": "chat",
                "error.type": error,
            }
            span = self._chat_span(state, chat, "chat", attributes)
            # redacted whole, then cut (RedactedSpan): a cut never leaves part of a key
            span.set_status(trace.Status(trace.StatusCode.ERROR, turn.observation))
            span.end()
        if not (turn.terminated or turn.truncated):
            return
        if state.delegation is not None:  # cut off while children ran
            span, state.delegation = state.delegation, None
            span.set_status(trace.Status(trace.StatusCode.ERROR, turn.reason or "cut off"))
            span.end()
        del self._entities[event.entity_id]
        agent = state.agent
        agent.set_attributes(
            {
                **_genai.agent_end_attributes(
                    turn.reason, turn.terminated, state.turns, state.usage, state.cost
                ),
                **_genai.guardrail_attributes(turn.reason, turn.extras),
            }
        )
        if _genai.reason_is_error(turn.reason):
            agent.set_attribute("error.type", turn.reason or "error")
            agent.set_status(trace.Status(trace.StatusCode.ERROR, turn.reason or "error"))
        agent.end()


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
