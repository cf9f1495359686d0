"""AG-UI 1.0 for ``cantrip serve``, both modes: what a run's input means and how the
loop's events become AG-UI events -- the one mapping, with two sources (SPEC.md "AG-UI").

``POST /agui`` takes a ``RunAgentInput`` and answers the run as AG-UI events over
server-sent events (protocol 1.0, the version of the official ``ag-ui-protocol``
package whose models build every event here). Web front ends built on AG-UI clients
(CopilotKit and the like) speak it; cantrip's sessions, streamed casts, pauses and
cancels already hold every piece of it, so this is translation only:

* ``threadId`` names a session, a run is one prompt (the text of the last user
  message) keyed by its ``runId`` -- a repeated ``runId`` joins or replays that
  prompt, never casts again;
* the loop's events become AG-UI's (:class:`Translator`), whether they come live
  from an entity in this process or are read back from the turns a worker recorded
  in the PostgreSQL loom (:func:`recorded_events`) -- the one run over the session
  seam, :mod:`._run`, takes what the backend's ``follow`` gives;
* :class:`RunStream` is one run on the wire: ``RUN_STARTED``, a state snapshot, the
  events, a ``STATE_DELTA`` per recorded turn, and the ending -- snapshots and
  ``RUN_FINISHED`` (success, ``interrupt`` for a pause, ``cancelled``) or ``RUN_ERROR``.

A body that is not a usable ``RunAgentInput`` is a 400 before any event is sent;
anything that goes wrong once the run has started ends it with ``RUN_ERROR``.
Every event passes the redactor on its way out, like every other answer.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

import attrs
from ag_ui.core import (
    PROTOCOL_VERSION,
    AssistantMessage,
    BaseEvent,
    CustomEvent,
    FunctionCall,
    Interrupt,
    Message,
    MessagesSnapshotEvent,
    ReasoningEndEvent,
    ReasoningMessage,
    ReasoningMessageContentEvent,
    ReasoningMessageEndEvent,
    ReasoningMessageStartEvent,
    ReasoningStartEvent,
    ResumeEntry,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunStartedEvent,
    StateDeltaEvent,
    StateSnapshotEvent,
    StepFinishedEvent,
    StepStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    TokenUsage,
    ToolCall,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    ToolMessage,
    UserMessage,
)

from cantrip._approval import Decision, Pause, PauseError
from cantrip._client_gates import client_gates
from cantrip._errors import ConstructionError
from cantrip._events import (
    FinalResponse,
    GateProgress,
    MessageComplete,
    StepComplete,
    StepStart,
    ToolResultEvent,
)
from cantrip._gate import Gate
from cantrip._outcome import STOP_REASONS, CastResult, refused
from cantrip._redact import get_logger, redact, redact_value
from cantrip.llm._contract import Response, plain_json
from cantrip.llm._stream import Event, MessageStart, TextDelta, ThinkingDelta, ToolCallEvent
from cantrip.loom._model import GateCallRecord, Turn
from cantrip.protocols.asgi._body import nests_deeper
from cantrip.protocols.asgi._requests import request_id, validated
from cantrip.protocols.asgi._responses import HttpError, Send, end_body, sse_comment, start_sse

log = get_logger("cantrip.agui")

MAX_DEPTH = 64
"""How deep each member of a ``RunAgentInput`` (``state``, ``forwardedProps``,
``context``, ``messages``, ``tools``...) may nest objects and arrays. The state comes
back in every ``STATE_SNAPSHOT`` and the events are built by pydantic models, whose
serializer refuses values nested about 250 deep -- after ``RUN_STARTED`` had gone out,
which cut the stream. 64 is far beyond any application's state and far within what
every step of a run (validation, the redactor, serialization) handles."""

APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "decision": {"enum": ["approve", "deny", "edit"]},
        "reason": {"type": "string"},
        "args": {"type": "object"},
        "always": {"type": "boolean"},
    },
    "required": ["decision"],
}
"""What an approval's resume payload holds (``true``/``false`` are short for approve/deny)."""

QUESTION_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "string"},
        {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
    ]
}
"""What an ``ask_user`` question's resume payload holds: the answer's text."""


def _new_id(kind: str) -> str:
    return f"{kind}-{os.urandom(8).hex()}"


def _text(value: Any) -> str:
    """A gate result or final answer as the text a chat shows."""
    if isinstance(value, str):
        return value
    return json.dumps(plain_json(value), default=str)


# -- the input -------------------------------------------------------------------------


def parse_input(body: Any) -> RunAgentInput:
    """The request as AG-UI's ``RunAgentInput`` (400 with one line if it is not one)."""
    if not isinstance(body, Mapping):
        raise HttpError(400, "bad_request", "the body must be an AG-UI RunAgentInput object")
    for name, value in body.items():
        if nests_deeper(value, MAX_DEPTH):
            what = name if len(name) <= 40 else name[:40] + "..."
            raise HttpError(
                400,
                "bad_request",
                f"{what} nests deeper than {MAX_DEPTH} levels of objects and arrays",
            )
    run: RunAgentInput = validated(RunAgentInput, body)
    request_id(run.thread_id, "threadId")
    request_id(run.run_id, "runId")
    for entry in run.resume or ():
        request_id(entry.interrupt_id, "resume.interruptId")
    if not run.resume and not intent_of(run) and not tool_results(run):
        raise HttpError(
            400,
            "bad_request",
            "the run needs a user message with text (or resume entries, or tool results)",
        )
    offered_gates(run)  # the tools' names are checked before anything runs
    return run


def intent_of(run: RunAgentInput) -> str:
    """The text of the input's last user message ("" if there is none), followed by the
    input's ``context`` -- what the application tells the agent beside the message
    (CopilotKit's readables: the page, a selection): the model sees it with the prompt,
    and the loom records it with the intent."""
    for message in reversed(run.messages):
        if isinstance(message, UserMessage):
            text = _content_text(message.content)
            if text and run.context:
                facts = "\n".join(f"- {item.description}: {item.value}" for item in run.context)
                text = f"{text}\n\nContext from the application:\n{facts}"
            return text
    return ""


def _content_text(content: Any) -> str:
    """A message's text: the string, or its text parts joined."""
    if isinstance(content, str):
        return content
    return "\n".join(
        getattr(part, "text", "") for part in content or () if getattr(part, "text", "")
    )


def tool_results(run: RunAgentInput) -> dict[str, str]:
    """The results of front-end tools the input carries: tool call id -> the text the
    client's tool answered (after the last user message: older ones were answered)."""
    results: dict[str, str] = {}
    for message in reversed(run.messages):
        if isinstance(message, UserMessage):
            break
        if isinstance(message, ToolMessage):
            text = _content_text(message.content)
            if message.error:
                text = f"{text}\n{message.error}".strip() if text else f"error: {message.error}"
            results.setdefault(message.tool_call_id, text)
    return results


def client_answers(
    results: Mapping[str, str], pending: Iterable[Pause]
) -> list[tuple[Pause, Decision]]:
    """The open calls of the client's own tools that ``results`` (:func:`tool_results`)
    answer, in the order they wait, each with its answer."""
    return [
        (p, Decision.answer(results[p.tool_call_id])) for p in pending
        if p.kind == "question" and p.tool_call_id is not None and p.tool_call_id in results
    ]  # fmt: skip


def check_tools(run: RunAgentInput, gate_names: Iterable[str]) -> None:
    """A ``400`` if a tool the input offers has the name of one of the circle's gates."""
    taken = sorted({t.name for t in run.tools or ()} & set(gate_names))
    if taken:
        raise HttpError(
            400, "bad_request", f"the circle already has a gate named {', '.join(taken)}"
        )


def tool_definitions(run: RunAgentInput) -> list[dict[str, Any]]:
    """The input's ``tools`` (front-end tools: the client runs them) as plain
    definitions -- what a queued cast carries to its worker."""
    return [
        {"name": t.name, "description": t.description, "parameters": t.parameters}
        for t in run.tools or ()
    ]


def offered_gates(run: RunAgentInput) -> tuple[Gate, ...]:
    """The input's ``tools`` as gates the run's casts may call
    (:mod:`cantrip._client_gates`): a call pauses like an ``ask_user`` question, the run
    ends with the call, and the result the client sends with its next run is the
    call's observation. A name no provider takes, or given twice, is a 400."""
    try:
        return client_gates(tool_definitions(run))
    except ConstructionError as exc:
        raise HttpError(400, "bad_request", str(exc)) from None


def decision_for(pause: Pause, entry: ResumeEntry) -> Decision:
    """What a resume entry says about a pause (:data:`APPROVAL_SCHEMA`,
    :data:`QUESTION_SCHEMA`); a cancelled entry denies the call."""
    if entry.status == "cancelled":
        return Decision.deny("cancelled by the user")
    payload = entry.payload
    if isinstance(payload, Mapping) and "decision" in payload:
        return Decision.parse(payload)
    if pause.kind == "question":
        if isinstance(payload, Mapping) and isinstance(payload.get("answer"), str):
            return Decision.answer(payload["answer"])
        if isinstance(payload, str):
            return Decision.answer(payload)
        raise PauseError(f"interrupt {pause.pause_id} asks a question: answer it with text")
    if payload is True:
        return Decision.approve()
    if payload is False:
        return Decision.deny()
    raise PauseError(
        f"interrupt {pause.pause_id} asks for approval: resume it with true, false "
        'or {"decision": "approve" | "deny" | "edit", ...}'
    )


def interrupt_for(pause: Pause) -> Interrupt:
    if pause.kind == "question":
        return Interrupt(
            id=pause.pause_id,
            reason="question",
            message=pause.question or "",
            tool_call_id=pause.tool_call_id,
            response_schema=QUESTION_SCHEMA,
        )
    return Interrupt(
        id=pause.pause_id,
        reason="approval",
        message=f"{pause.gate} wants to run with {json.dumps(plain_json(pause.args))}",
        tool_call_id=pause.tool_call_id,
        response_schema=APPROVAL_SCHEMA,
        metadata={"gate": pause.gate, "args": plain_json(pause.args)},
    )


# -- the events ------------------------------------------------------------------------


class Translator:
    """Turns one run's cantrip events into AG-UI events, keeping AG-UI's nesting:
    a text message, a reasoning message and a tool call are each opened, filled and
    closed, and never overlap a different one."""

    def __init__(self) -> None:
        self.text_id: str | None = None
        """The open assistant text message."""
        self.last_text_id: str | None = None
        self.streamed = False
        """This LLM answer's text already went out as deltas."""
        self.reasoning_id: str | None = None
        self.step: str | None = None
        self.calls: dict[str, bool] = {}
        """Tool call id -> whether it is closed (its arguments sent and ended)."""
        self.results: set[str] = set()
        self.texts: list[str] = []
        """Every text message sent in this run (a final answer is not repeated)."""
        self.quiet: set[str] = set()
        """Tool calls whose results the client sent (its own tools): not told back."""
        self._buffer: list[str] = []

    def events(self, event: Event) -> list[BaseEvent]:
        out: list[BaseEvent] = []
        if isinstance(event, StepStart):
            self._close_all(out)
            self.step = f"turn-{event.sequence}"
            out.append(StepStartedEvent(step_name=self.step))
        elif isinstance(event, MessageStart):
            self._close_text(out)
            self._close_reasoning(out)
            self.streamed = False
        elif isinstance(event, TextDelta) and event.text:
            self._close_reasoning(out)
            self._text(out, event.text)
            self.streamed = True
        elif isinstance(event, ThinkingDelta) and event.text:
            self._close_text(out)
            if self.reasoning_id is None:
                self.reasoning_id = _new_id("reasoning")
                out.append(ReasoningStartEvent(message_id=self.reasoning_id))
                out.append(ReasoningMessageStartEvent(message_id=self.reasoning_id))
            out.append(ReasoningMessageContentEvent(message_id=self.reasoning_id, delta=event.text))
        elif isinstance(event, ToolCallEvent) and event.call_id:
            self._close_text(out)
            self._close_reasoning(out)
            self._start_call(out, event.call_id, event.name)
            if event.final:
                self._end_call(out, event.call_id, event.arguments)
        elif isinstance(event, MessageComplete):
            self._close_reasoning(out)
            if not self.streamed and event.response.content:
                self._text(out, event.response.content)
            self._close_text(out)
            for call in event.response.tool_calls:
                self._start_call(out, call.id, call.name)
                self._end_call(out, call.id, call.arguments)
        elif isinstance(event, ToolResultEvent):
            self._result(out, event.record)
        elif isinstance(event, GateProgress):
            out.append(
                CustomEvent(
                    name="cantrip.gate_progress",
                    value={
                        "gate": event.gate,
                        "progress": event.progress,
                        "total": event.total,
                        "message": event.message,
                    },
                )
            )
        elif isinstance(event, StepComplete):
            self._close_all(out)
            if self.step is not None:
                out.append(StepFinishedEvent(step_name=self.step))
                self.step = None
        elif isinstance(event, FinalResponse):
            self._close_all(out)
        return out

    def finish(self, result: Any) -> list[BaseEvent]:
        """Close what is open; a final answer no text message carried becomes one."""
        out: list[BaseEvent] = []
        self._close_all(out)
        if self.step is not None:
            out.append(StepFinishedEvent(step_name=self.step))
            self.step = None
        if result is not None:
            text = _text(result)
            if text and text not in self.texts:
                self._text(out, text)
                self._close_text(out)
        return out

    # -- nesting -------------------------------------------------------------------

    def _text(self, out: list[BaseEvent], delta: str) -> None:
        if self.text_id is None:
            self.text_id = self.last_text_id = _new_id("msg")
            out.append(TextMessageStartEvent(message_id=self.text_id, role="assistant"))
        out.append(TextMessageContentEvent(message_id=self.text_id, delta=delta))
        self._buffer.append(delta)

    def _close_text(self, out: list[BaseEvent]) -> None:
        if self.text_id is not None:
            out.append(TextMessageEndEvent(message_id=self.text_id))
            self.texts.append("".join(self._buffer))
            self._buffer = []
            self.text_id = None

    def _close_reasoning(self, out: list[BaseEvent]) -> None:
        if self.reasoning_id is not None:
            out.append(ReasoningMessageEndEvent(message_id=self.reasoning_id))
            out.append(ReasoningEndEvent(message_id=self.reasoning_id))
            self.reasoning_id = None

    def _close_all(self, out: list[BaseEvent]) -> None:
        self._close_text(out)
        self._close_reasoning(out)
        for call_id, closed in list(self.calls.items()):
            if not closed:
                self._end_call(out, call_id, None)

    def _start_call(self, out: list[BaseEvent], call_id: str, name: str) -> None:
        if call_id not in self.calls:
            self.calls[call_id] = False
            out.append(
                ToolCallStartEvent(
                    tool_call_id=call_id, tool_call_name=name, parent_message_id=self.last_text_id
                )
            )

    def _end_call(
        self, out: list[BaseEvent], call_id: str, arguments: Mapping[str, Any] | str | None
    ) -> None:
        if self.calls.get(call_id, True):
            return  # unknown, or already closed
        self.calls[call_id] = True
        if arguments is not None:
            delta = arguments if isinstance(arguments, str) else json.dumps(plain_json(arguments))
            if delta:
                out.append(ToolCallArgsEvent(tool_call_id=call_id, delta=delta))
        out.append(ToolCallEndEvent(tool_call_id=call_id))

    def _result(self, out: list[BaseEvent], record: GateCallRecord) -> None:
        """A gate call's result. A call made from code (no tool call of its own) is
        announced here as a whole tool call first, so every gate call shows."""
        self._close_text(out)
        self._close_reasoning(out)
        call_id = record.tool_call_id
        if call_id is not None and call_id in self.quiet:
            return
        if call_id is None or call_id in self.results:
            call_id = _new_id("gate")
        if call_id not in self.calls:
            self._start_call(out, call_id, record.gate)
            self._end_call(out, call_id, plain_json(record.args))
        elif not self.calls[call_id]:
            self._end_call(out, call_id, plain_json(record.args))
        self.results.add(call_id)
        out.append(
            ToolCallResultEvent(
                message_id=_new_id("result"),
                tool_call_id=call_id,
                content=record.text,
                role="tool",
            )
        )


def recorded_events(turn: Turn) -> list[Event]:
    """A turn as the loom recorded it, told as the loop's events -- what a live
    cast would have sent, minus token deltas (:class:`Translator` takes both).

    A turn is recorded in pieces around a pause or a delegation: the first piece
    holds the utterance (the step starts there), a continuation only the gate calls
    made after it, and a checkpoint piece leaves the step open (its turn goes on)."""
    phase = turn.extras.get("phase")
    events: list[Event] = []
    if phase not in ("continuation", "continuation+checkpoint"):
        events.append(StepStart(sequence=turn.sequence, entity_id=turn.entity_id))
        if turn.thinking:
            events.append(ThinkingDelta(text=turn.thinking, entity_id=turn.entity_id))
        response = Response(content=turn.content, tool_calls=turn.tool_calls)
        events.append(MessageComplete(response=response, entity_id=turn.entity_id))
    events.extend(ToolResultEvent(record=r, entity_id=turn.entity_id) for r in turn.gate_calls)
    if phase not in ("checkpoint", "continuation+checkpoint"):
        events.append(StepComplete(turn=turn, entity_id=turn.entity_id))
        if turn.terminated:
            events.append(FinalResponse(result=turn.result, entity_id=turn.entity_id))
    return events


def messages_of(thread: Sequence[Turn]) -> list[Message]:
    """A session's thread from the loom as AG-UI messages (MESSAGES_SNAPSHOT)."""
    messages: list[Message] = []
    waiting: set[str] = set()
    """Tool calls announced and not answered yet (a pause answers one a piece later)."""
    for turn in thread:
        if turn.intent is not None:
            messages.append(UserMessage(id=f"{turn.id}-user", content=turn.intent))
        if turn.thinking:
            messages.append(ReasoningMessage(id=f"{turn.id}-reasoning", content=turn.thinking))
        calls = [
            ToolCall(
                id=call.id,
                function=FunctionCall(
                    name=call.name, arguments=json.dumps(plain_json(call.arguments))
                ),
            )
            for call in turn.tool_calls
        ]
        if turn.content or calls:
            messages.append(
                AssistantMessage(
                    id=f"{turn.id}-assistant",
                    content=turn.content or None,
                    tool_calls=calls or None,
                )
            )
        waiting.update(call.id for call in turn.tool_calls)
        for index, record in enumerate(turn.gate_calls):
            if record.tool_call_id in waiting:
                messages.append(
                    ToolMessage(
                        id=f"{turn.id}-tool-{index}",
                        tool_call_id=record.tool_call_id,
                        content=record.text,
                        error=record.text if record.is_error else None,
                    )
                )
                waiting.discard(record.tool_call_id)
        if turn.terminated and turn.result is not None and not turn.content:
            messages.append(AssistantMessage(id=f"{turn.id}-answer", content=_text(turn.result)))
    return messages


@attrs.frozen
class Where:
    """The session a run runs on, as its state names it."""

    session_id: str
    entity_id: str
    turns: int
    """The sequence number of the session's latest turn: how many turns its entity has
    taken (the pieces of one turn around a pause share it)."""


def state_of(
    run: RunAgentInput, where: Where, outcome: CastResult | None, *, running: bool = False
) -> dict[str, Any]:
    """STATE_SNAPSHOT: the client's own state, with the session under ``cantrip``
    (``running`` for the snapshot a run opens with: no reason, nothing pending yet)."""
    state = dict(run.state) if isinstance(run.state, Mapping) else {}
    state["cantrip"] = {
        "session_id": where.session_id,
        "entity_id": where.entity_id,
        "turns": where.turns,
        "running": running,
        "reason": None if outcome is None else outcome.reason,
        "pending": [p.to_dict() for p in outcome.pending] if outcome is not None else [],
    }
    return state


def usage_of(outcome: CastResult) -> list[TokenUsage] | None:
    usage = outcome.usage
    if usage.missing or not usage.total_tokens:
        return None
    return [
        TokenUsage(
            input_tokens=usage.prompt_tokens,
            output_tokens=usage.completion_tokens,
            total_tokens=usage.total_tokens,
            reasoning_tokens=usage.reasoning_tokens or None,
            cached_input_tokens=usage.cached_tokens or None,
        )
    ]


def run_key(run: RunAgentInput) -> str:
    """The idempotency key a run's prompt carries: one ``runId``, one cast."""
    return "agui-run:" + run.run_id


def thread_key(thread_id: str) -> str:
    """The idempotency key of the session a client's own thread id created."""
    return "agui-thread:" + thread_id


class RunFailed(Exception):
    """Why a run that has started cannot go on (it ends with ``RUN_ERROR``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _leaf(exc: BaseException) -> BaseException:
    """The exception inside a group of one (trio's nurseries wrap what they raise)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _failure_in(exc: BaseException) -> RunFailed | None:
    """The :class:`RunFailed` an exception is (a refusal, :class:`HttpError`, becomes
    one with its code); None for anything else -- a fault of the server's own."""
    exc = _leaf(exc)
    if isinstance(exc, RunFailed):
        return exc
    if isinstance(exc, HttpError):
        return RunFailed(exc.code, exc.message)
    return None


# -- the run on the wire ---------------------------------------------------------------


async def send_event(send: Send, event: BaseEvent) -> None:
    """One AG-UI event as an SSE ``data:`` line (the wire form of the official
    encoder), through the redactor like every other answer. Each is stamped with the
    time it left (milliseconds since the epoch, as every AG-UI SDK does)."""
    if event.timestamp is None:
        event.timestamp = int(time.time() * 1000)
    data = redact_value(event.model_dump(mode="json", by_alias=True))
    payload = f"data: {json.dumps(data, default=str)}\n\n".encode()
    await send({"type": "http.response.body", "body": payload, "more_body": True})


class RunStream:
    """One run's answer on the wire, whatever its events' source: ``RUN_STARTED`` and
    the state it starts from; each event translated as it comes, and a
    ``STATE_DELTA`` (JSON Patch) as each turn is recorded; then the ending."""

    def __init__(self, run: RunAgentInput, send: Send) -> None:
        self.run = run
        self.send = send
        self.translator = Translator()
        self.translator.quiet = set(tool_results(run))  # the client has these results
        self.turns = 0
        """The latest turn's sequence the client's state holds."""
        self.entity_id = ""
        self.ended = False
        """The run's last event went out (``RUN_FINISHED`` or ``RUN_ERROR``)."""

    @contextlib.asynccontextmanager
    async def running(self, where: Where) -> AsyncIterator[RunStream]:
        """The run on the wire from its start to its end. On entry: the response's
        head, ``RUN_STARTED`` and the state the run starts from. Whatever fails inside
        once the stream has started ends the run with ``RUN_ERROR`` and one log line --
        never a stream cut without a word, and never a traceback the server keeps to
        itself: a :class:`RunFailed` (or a refusal, :class:`HttpError`) with its own
        code, logged at INFO; anything else with ``internal_error``, its traceback
        logged at ERROR. The body ends the run with :meth:`finish`."""
        await start_sse(self.send)
        try:
            await self._begin(where)
            yield self
        except Exception as exc:  # the boundary of a started run (SPEC.md AGUI-16)
            failure = _failure_in(exc)
            if failure is None or self.ended:
                log.exception(
                    "AG-UI run %s on thread %s failed after it started",
                    self.run.run_id,
                    self.run.thread_id,
                )
                if self.ended:  # its last event went out: nothing more can be said
                    return
                failure = RunFailed(
                    "internal_error",
                    f"the run failed on the server ({type(_leaf(exc)).__name__}); its log says why",
                )
            else:
                log.info(
                    "AG-UI run %s on thread %s ended with RUN_ERROR %s: %s",
                    self.run.run_id,
                    self.run.thread_id,
                    failure.code,
                    failure.message,
                )
            await self.fail(failure)

    async def _begin(self, where: Where) -> None:
        run = self.run
        await send_event(
            self.send,
            RunStartedEvent(
                thread_id=run.thread_id, run_id=run.run_id, protocol_version=PROTOCOL_VERSION
            ),
        )
        self.turns, self.entity_id = where.turns, where.entity_id
        await send_event(
            self.send, StateSnapshotEvent(snapshot=state_of(run, where, None, running=True))
        )

    async def event(self, event: Event) -> None:
        """One of the loop's events (live, or :func:`recorded_events`)."""
        for out in self.translator.events(event):
            await send_event(self.send, out)
        turn = event.turn if isinstance(event, StepComplete) else None
        if turn is not None and turn.entity_id == self.entity_id and turn.sequence > self.turns:
            self.turns = turn.sequence
            patch = [{"op": "replace", "path": "/cantrip/turns", "value": self.turns}]
            await send_event(self.send, StateDeltaEvent.model_validate({"delta": patch}))

    async def idle(self) -> None:
        """A comment line while nothing happens (a long gate call, a slow model): no
        event for the client -- SSE readers skip comments -- but bytes that keep
        proxies and load balancers from closing the stream as idle."""
        await sse_comment(self.send, "idle")

    async def fail(self, failure: RunFailed) -> None:
        """End the run with ``RUN_ERROR`` (what was open is closed first)."""
        for out in self.translator.finish(None):
            await send_event(self.send, out)
        self.ended = True
        await send_event(self.send, RunErrorEvent(message=failure.message, code=failure.code))
        await end_body(self.send)

    async def finish(
        self, outcome: CastResult | None, where: Where, thread: Sequence[Turn]
    ) -> None:
        """End the run: the final answer if no message carried it, the state and the
        thread as they are now, and ``RUN_FINISHED`` -- ``interrupt`` when the cast
        paused, ``cancelled`` when it was cancelled (or never began)."""
        run = self.run
        paused = outcome is not None and outcome.reason == "paused" and bool(outcome.pending)
        tools = {t.name for t in run.tools or ()}
        if (
            paused
            and outcome is not None
            and all(p.kind == "question" and p.gate in tools for p in outcome.pending)
        ):
            paused = False  # a call of the client's own tool: the client runs it and goes on
        result = outcome.result if outcome is not None and outcome.terminated else None
        out = self.translator.finish(result)
        out.append(StateSnapshotEvent(snapshot=state_of(run, where, outcome)))
        out.append(MessagesSnapshotEvent(messages=messages_of(thread)))
        finished: RunFinishedEvent | RunErrorEvent
        if refused(outcome):
            # A guardrail refused the run: an error, with its own code (the state and
            # messages above say what was recorded).
            assert outcome is not None
            finished = RunErrorEvent(message=redact(outcome.summary or "refused"), code="guardrail")
        elif outcome is None or STOP_REASONS.get(outcome.reason or "") == "cancelled":
            finished = RunFinishedEvent(
                thread_id=run.thread_id, run_id=run.run_id, outcome=RunFinishedCancelledOutcome()
            )
        elif paused:
            interrupts = [interrupt_for(p) for p in outcome.pending]
            finished = RunFinishedEvent(
                thread_id=run.thread_id,
                run_id=run.run_id,
                outcome=RunFinishedInterruptOutcome(interrupts=interrupts),
                usage=usage_of(outcome),
            )
        else:
            finished = RunFinishedEvent(
                thread_id=run.thread_id,
                run_id=run.run_id,
                result=plain_json(outcome.result) if outcome.terminated else None,
                usage=usage_of(outcome),
            )
        out.append(finished)
        for event in out[:-1]:
            await send_event(self.send, event)
        self.ended = True
        await send_event(self.send, finished)
        await end_body(self.send)
