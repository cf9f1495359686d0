"""How the loop's events become AG-UI 1.0 events (SPEC.md "AG-UI"): the one
:class:`Translator`, fed live events (in process) or a turn as the loom recorded it
(:func:`recorded_events`, on PostgreSQL or when a run is replayed), and a session's
thread as AG-UI messages (:func:`messages_of`)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ag_ui.core import (
    AssistantMessage,
    BaseEvent,
    CustomEvent,
    FunctionCall,
    Message,
    ReasoningEndEvent,
    ReasoningMessage,
    ReasoningMessageContentEvent,
    ReasoningMessageEndEvent,
    ReasoningMessageStartEvent,
    ReasoningStartEvent,
    StepFinishedEvent,
    StepStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCall,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    ToolMessage,
    UserMessage,
)

from cantrip._events import (
    FinalResponse,
    GateProgress,
    MessageComplete,
    StepComplete,
    StepStart,
    ToolResultEvent,
)
from cantrip._redact import get_logger
from cantrip.llm._contract import Response, plain_json
from cantrip.llm._stream import Event, MessageStart, TextDelta, ThinkingDelta, ToolCallEvent
from cantrip.loom._model import GateCallRecord, Turn

log = get_logger("cantrip.agui")


def _new_id(kind: str) -> str:
    return f"{kind}-{os.urandom(8).hex()}"


def _text(value: Any) -> str:
    """A gate result or final answer as the text a chat shows."""
    if isinstance(value, str):
        return value
    return json.dumps(plain_json(value), default=str)


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
