"""AG-UI over ``cantrip serve``: ``POST /agui`` takes a ``RunAgentInput`` and answers
the run as AG-UI events over server-sent events (protocol 1.0, the version of the
official ``ag-ui-protocol`` package whose models build every event here).

Web front ends built on AG-UI clients (CopilotKit and the like) speak this protocol;
cantrip's own HTTP API already has every piece of it -- sessions, streamed casts,
pauses, cancellation -- so this module only translates (SPEC.md "AG-UI"):

* ``threadId`` names a session: an existing session id is that session (resumed
  from the loom if need be); any other id names the session it created the first
  time (the same mapping an ``Idempotency-Key`` on ``POST /sessions`` uses);
* a run is one prompt: the text of the last user message is the intent (the rest
  of ``messages`` is the client's copy of the thread; the loom holds the real one);
* the loop's events become AG-UI's (:class:`Translator`); a cast that pauses for
  an approval or an ``ask_user`` question ends the run with an ``interrupt``
  outcome, and a run whose ``resume`` answers those interrupts continues the
  paused cast through the session hub's answer path;
* a client that hangs up cancels the run's cast (recorded ``cancelled``).

A body that is not a usable ``RunAgentInput`` is a 400 before any event is sent;
anything that goes wrong once the run has started ends it with ``RUN_ERROR``.
Every event passes the redactor on its way out, like every other answer.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio
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
from cantrip._errors import CantripError
from cantrip._events import (
    Event,
    FinalResponse,
    GateProgress,
    MessageComplete,
    MessageStart,
    StepComplete,
    StepStart,
    TextDelta,
    ThinkingDelta,
    ToolCallEvent,
    ToolResultEvent,
)
from cantrip._outcome import STOP_REASONS, CastResult
from cantrip._redact import get_logger, redact_value
from cantrip.llm._contract import plain_json
from cantrip.loom._model import GateCallRecord
from cantrip.protocols._asgi import HttpError, Receive, Send, end_body, start_sse
from cantrip.protocols._request import read_body, until_disconnect, validated
from cantrip.protocols._sessions import (
    ENTITY_PREFIX,
    SESSION_PREFIX,
    Session,
    SessionError,
    SessionHub,
)

log = get_logger("cantrip.agui")

MAX_ID = 256
"""The longest threadId / runId taken (they name sessions and appear in every event)."""

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
    run: RunAgentInput = validated(RunAgentInput, body)
    for name, value in (("threadId", run.thread_id), ("runId", run.run_id)):
        if not value or len(value) > MAX_ID:
            raise HttpError(400, "bad_request", f"{name} must be 1 to {MAX_ID} characters")
    if not run.resume and not intent_of(run):
        raise HttpError(
            400, "bad_request", "the run needs a user message with text (or resume entries)"
        )
    return run


def intent_of(run: RunAgentInput) -> str:
    """The text of the input's last user message ("" if there is none)."""
    for message in reversed(run.messages):
        if isinstance(message, UserMessage):
            content = message.content
            if isinstance(content, str):
                return content
            return "\n".join(
                getattr(part, "text", "") for part in content if getattr(part, "text", "")
            )
    return ""


def session_for(hub: SessionHub, thread_id: str) -> Session:
    """The session a thread names: a session (or entity) id as itself, else the
    session this thread id created (made on first use)."""
    if thread_id.startswith((SESSION_PREFIX, ENTITY_PREFIX)):
        try:
            return hub.get(thread_id)
        except SessionError:
            pass  # not one of ours: a client's own id, mapped like any other
    session, _ = hub.create("agui-thread:" + thread_id)
    return session


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


def messages_of(hub: SessionHub, session: Session) -> list[Message]:
    """The session's thread from the loom as AG-UI messages (MESSAGES_SNAPSHOT)."""
    messages: list[Message] = []
    for turn in hub.history(session):
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
        answered = {call.id for call in turn.tool_calls}
        for index, record in enumerate(turn.gate_calls):
            if record.tool_call_id in answered:
                messages.append(
                    ToolMessage(
                        id=f"{turn.id}-tool-{index}",
                        tool_call_id=record.tool_call_id,
                        content=record.text,
                        error=record.text if record.is_error else None,
                    )
                )
                answered.discard(record.tool_call_id)
        if turn.terminated and turn.result is not None and not turn.content:
            messages.append(AssistantMessage(id=f"{turn.id}-answer", content=_text(turn.result)))
    return messages


def state_of(run: RunAgentInput, session: Session, outcome: CastResult | None) -> dict[str, Any]:
    """STATE_SNAPSHOT: the client's own state, with the session under ``cantrip``."""
    state = dict(run.state) if isinstance(run.state, Mapping) else {}
    state["cantrip"] = {
        "session_id": session.id,
        "entity_id": session.entity_id,
        "turns": len(session.entity.turns),
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


# -- the run ---------------------------------------------------------------------------


async def send_event(send: Send, event: BaseEvent) -> None:
    """One AG-UI event as an SSE ``data:`` line (the wire form of the official
    encoder), through the redactor like every other answer. Each is stamped with the
    time it left (milliseconds since the epoch, as every AG-UI SDK does)."""
    if event.timestamp is None:
        event.timestamp = int(time.time() * 1000)
    data = redact_value(event.model_dump(mode="json", by_alias=True))
    payload = f"data: {json.dumps(data, default=str)}\n\n".encode()
    await send({"type": "http.response.body", "body": payload, "more_body": True})


class AguiRun:
    """One ``POST /agui``: the run's cast (a prompt, or answers to its interrupts)
    with its events translated as they happen."""

    def __init__(self, hub: SessionHub, session: Session, run: RunAgentInput) -> None:
        self.hub = hub
        self.session = session
        self.run = run
        self.translator = Translator()

    async def serve(self, receive: Receive, send: Send) -> None:
        run = self.run
        await start_sse(send)
        await send_event(
            send,
            RunStartedEvent(
                thread_id=run.thread_id, run_id=run.run_id, protocol_version=PROTOCOL_VERSION
            ),
        )
        events_send, events = trio.open_memory_channel[Event](float("inf"))
        final: dict[str, Any] = {}

        sink = events_send.send_nowait
        gone = trio.Event()

        async def cast() -> None:
            async with events_send:
                if gone.is_set():  # hung up before the cast began: cast nothing
                    final["error"] = ("client_gone", "the client hung up")
                    return
                try:
                    final["outcome"] = await self._cast(sink)
                except _RunFailed as exc:
                    final["error"] = (exc.code, exc.message)

        async def watch() -> None:
            await until_disconnect(receive)
            gone.set()
            if self.session.sink == sink:  # our cast is running (not another client's)
                log.info("session %s: the AG-UI client hung up; cancelling", self.session.id)
                self.hub.cancel(self.session)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cast)
            nursery.start_soon(watch)
            async with events:
                async for event in events:
                    for out in self.translator.events(event):
                        await send_event(send, out)
            nursery.cancel_scope.cancel()  # the watcher: the cast has ended
        for out in self._ending(final):
            await send_event(send, out)
        await end_body(send)

    async def _cast(self, sink: Callable[[Event], None]) -> CastResult | None:
        try:
            if self.run.resume:
                return await self._resume(sink)
            return await self.hub.prompt(self.session, intent_of(self.run), on_event=sink)
        except SessionError as exc:
            raise _RunFailed(exc.kind, exc.message) from None
        except PauseError as exc:
            raise _RunFailed("bad_resume", str(exc)) from None
        except CantripError as exc:
            raise _RunFailed("cast_failed", f"the cast failed: {exc}") from None
        except Exception as exc:  # the entity crashed: the hub resumed it from the loom
            log.exception("session %s: the entity crashed", self.session.id)
            raise _RunFailed("crashed", f"the entity crashed: {exc!r}") from None

    async def _resume(self, sink: Callable[[Event], None]) -> CastResult | None:
        """Answer the interrupts in the order given; each answer continues the paused
        cast, and the last continuation's outcome is the run's."""
        outcome: CastResult | None = None
        for entry in self.run.resume or ():
            pending = {p.pause_id: p for p in self.session.entity.pending}
            pause = pending.get(entry.interrupt_id)
            if pause is None:
                raise PauseError(
                    f"interrupt {entry.interrupt_id!r} is not open on thread "
                    f"{self.run.thread_id!r} (open: {', '.join(pending) or 'none'})"
                )
            decision = decision_for(pause, entry)
            outcome = await self.hub.answer(self.session, pause.pause_id, decision, on_event=sink)
        return outcome

    def _ending(self, final: Mapping[str, Any]) -> list[BaseEvent]:
        run, session = self.run, self.session
        if "error" in final:
            code, message = final["error"]
            return [*self.translator.finish(None), RunErrorEvent(message=message, code=code)]
        outcome: CastResult | None = final.get("outcome")
        paused = outcome is not None and outcome.reason == "paused" and bool(outcome.pending)
        result = outcome.result if outcome is not None and outcome.terminated else None
        out = self.translator.finish(result)
        out.append(StateSnapshotEvent(snapshot=state_of(run, session, outcome)))
        out.append(MessagesSnapshotEvent(messages=messages_of(self.hub, session)))
        if outcome is None or STOP_REASONS.get(outcome.reason or "") == "cancelled":
            out.append(
                RunFinishedEvent(
                    thread_id=run.thread_id,
                    run_id=run.run_id,
                    outcome=RunFinishedCancelledOutcome(),
                )
            )
        elif paused:
            interrupts = [interrupt_for(p) for p in outcome.pending]
            out.append(
                RunFinishedEvent(
                    thread_id=run.thread_id,
                    run_id=run.run_id,
                    outcome=RunFinishedInterruptOutcome(interrupts=interrupts),
                    usage=usage_of(outcome),
                )
            )
        else:
            out.append(
                RunFinishedEvent(
                    thread_id=run.thread_id,
                    run_id=run.run_id,
                    result=plain_json(outcome.result) if outcome.terminated else None,
                    usage=usage_of(outcome),
                )
            )
        return out


class _RunFailed(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


async def serve_agui(
    hub: SessionHub, receive: Receive, send: Send, make_room: Callable[[], Awaitable[None]]
) -> None:
    """``POST /agui``: read the run's input, find its thread's session (``make_room``
    first, as for any session a request names), and stream the run."""
    run = parse_input(await read_body(receive))
    await make_room()
    try:
        session = session_for(hub, run.thread_id)
    except SessionError as exc:  # e.g. a resumed entity that cannot be loaded
        raise HttpError(409, exc.kind, exc.message) from None
    session.last_used = trio.current_time()
    try:
        await AguiRun(hub, session, run).serve(receive, send)
    finally:
        session.last_used = trio.current_time()
