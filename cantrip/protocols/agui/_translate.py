"""How the loop's events become AG-UI 1.0 events (SPEC.md "AG-UI"): the one
:class:`Translator`, fed live events (in process) or a turn as the loom recorded it
(:func:`._recorded.recorded_events`, on PostgreSQL or when a run is replayed), and a session's
thread as AG-UI messages (:func:`messages_of`)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from ag_ui.core import (
    ActivityDeltaEvent,
    ActivitySnapshotEvent,
    AssistantMessage,
    BaseEvent,
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
    SubagentErrorEvent,
    SubagentFinishedEvent,
    SubagentFinishedSuccessOutcome,
    SubagentFinishedSuspendedOutcome,
    SubagentStartedEvent,
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
from cantrip.llm._contract import plain_json
from cantrip.llm._stream import Event, MessageStart, TextDelta, ThinkingDelta, ToolCallEvent
from cantrip.loom._model import GateCallRecord, Turn
from cantrip.protocols.agui._recorded import DELEGATES, failures

log = get_logger("cantrip.agui")

ACTIVITY_TYPE = "cantrip.gate_progress"
"""The ``activityType`` of a running gate's progress."""


class Ids:
    """The ids a run's translation mints (messages, results, activities), numbered in
    the order minted under the run's id: the same events translated again give the
    same ids, so a client resuming a run (``Last-Event-ID``) meets the ids it was told
    before (``run`` is the client's ``runId``; "" outside a run: random)."""

    def __init__(self, run: str = "") -> None:
        self.run = run or os.urandom(8).hex()
        self.minted = 0

    def __call__(self, kind: str) -> str:
        self.minted += 1
        return f"{kind}-{self.run}-{self.minted}"


def _text(value: Any) -> str:
    """A gate result or final answer as the text a chat shows."""
    if isinstance(value, str):
        return value
    return json.dumps(plain_json(value), default=str)


# -- the events ------------------------------------------------------------------------


class _Voice:
    """One entity's events as AG-UI events, keeping AG-UI's nesting: a text message,
    a reasoning message and a tool call are each opened, filled and closed, and never
    overlap a different one. The run's entity is one voice, each ``call_agent`` child
    another (:class:`Translator`)."""

    def __init__(self, new_id: Ids, step_prefix: str = "") -> None:
        self.new_id = new_id
        self.step_prefix = step_prefix
        """Before each step's name: a sub-agent's steps are named apart from the run's
        (AG-UI pairs a step's end with its start by name)."""
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
        self.activities: dict[str, tuple[str, dict[str, Any]]] = {}
        """Gate name -> the activity its running call reports progress on (its
        message id and content as last told)."""

    def events(self, event: Event) -> list[BaseEvent]:
        out: list[BaseEvent] = []
        if isinstance(event, StepStart):
            self._close_all(out)
            if self.step is not None:  # its end was not heard (a child's turn is not told)
                out.append(StepFinishedEvent(step_name=self.step))
            self.step = f"{self.step_prefix}turn-{event.sequence}"
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
                self.reasoning_id = self.new_id("reasoning")
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
            self._progress(out, event)
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
            self.text_id = self.last_text_id = self.new_id("msg")
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

    def _progress(self, out: list[BaseEvent], event: GateProgress) -> None:
        """A running gate's progress as an activity: ``ACTIVITY_SNAPSHOT`` at its first
        report, then an ``ACTIVITY_DELTA`` (JSON Patch) of what changed at each next one,
        until the call's result ends it."""
        content = {
            "gate": event.gate,
            "progress": event.progress,
            "total": event.total,
            "message": event.message,
        }
        known = self.activities.get(event.gate)
        if known is None:
            message_id = self.new_id("activity")
            out.append(
                ActivitySnapshotEvent(
                    message_id=message_id, activity_type=ACTIVITY_TYPE, content=content
                )
            )
        else:
            message_id, told = known
            patch = [
                {"op": "replace", "path": f"/{key}", "value": value}
                for key, value in content.items()
                if told.get(key) != value
            ]
            if patch:
                out.append(
                    ActivityDeltaEvent.model_validate(
                        {"messageId": message_id, "activityType": ACTIVITY_TYPE, "patch": patch}
                    )
                )
        self.activities[event.gate] = (message_id, content)

    def _result(self, out: list[BaseEvent], record: GateCallRecord) -> None:
        """A gate call's result. A call made from code (no tool call of its own) is
        announced here as a whole tool call first, so every gate call shows."""
        self._close_text(out)
        self._close_reasoning(out)
        self.activities.pop(record.gate, None)  # its progress, if it reported any, ends
        call_id = record.tool_call_id
        if call_id is not None and call_id in self.quiet:
            return
        if call_id is None or call_id in self.results:
            call_id = self.new_id("gate")
        if call_id not in self.calls:
            self._start_call(out, call_id, record.gate)
            self._end_call(out, call_id, plain_json(record.args))
        elif not self.calls[call_id]:
            self._end_call(out, call_id, plain_json(record.args))
        self.results.add(call_id)
        out.append(
            ToolCallResultEvent(
                message_id=self.new_id("result"),
                tool_call_id=call_id,
                content=record.text,
                role="tool",
            )
        )


def _attributed(events: list[BaseEvent], sub: str | None) -> list[BaseEvent]:
    """``events`` of a sub-agent's voice, each carrying its ``subagentRunId``."""
    if sub is not None:
        for event in events:
            if "subagent_run_id" in type(event).model_fields:
                setattr(event, "subagent_run_id", sub)  # noqa: B010 (not on BaseEvent)
    return events


@attrs.define
class _Child:
    """A ``call_agent`` child heard in this run: its voice, and the call it runs in."""

    voice: _Voice
    call_id: str | None
    done: bool = False


@attrs.frozen
class Suspension:
    """The sub-agents a run left in flight when it ended at a pause a child waits on in
    place (SPEC AGUI-6): each not finished, with the delegation call it runs in, and
    the delegation calls still open (tool call id -> the entity that made it, the
    child's intent). The run that resumes it (:meth:`Translator.resume`) announces each
    again as it was -- the same ``subagentRunId``, call and parent -- at its next event,
    and ends it at its call's result, as if the run had not been cut."""

    children: tuple[tuple[str, str | None], ...] = ()
    delegations: tuple[tuple[str, str, str], ...] = ()


class Translator:
    """Turns one run's cantrip events into AG-UI events. The run's entity speaks in
    its own voice; each child a ``call_agent`` call runs is a sub-agent: announced
    with ``SUBAGENT_STARTED`` at its first event (the delegation call it runs in, and
    the sub-agent that made that call, if any), every event of its own carrying its
    ``subagentRunId`` (the child's entity id: one per invocation), and ended with
    ``SUBAGENT_FINISHED`` at its final answer -- or at its call's result, with
    ``SUBAGENT_ERROR`` if the call failed, and at the run's end if it had not."""

    def __init__(self, entity_id: str = "", run_id: str = "") -> None:
        self.entity_id = entity_id
        """The run's own entity ("" until known: then every event is its)."""
        self.ids = Ids(run_id)
        self.main = _Voice(self.ids)
        self.children: dict[str, _Child] = {}
        self.delegations: dict[str, tuple[str, str]] = {}
        """Open delegation calls: tool call id -> (the entity that made it, the
        child's intent as the call gives it)."""
        self.resumed: dict[str, str | None] = {}
        """Sub-agents a run before this one left in flight (:class:`Suspension`), not
        heard in this run yet: entity id -> the delegation call it runs in."""

    @property
    def quiet(self) -> set[str]:
        return self.main.quiet

    @quiet.setter
    def quiet(self, calls: set[str]) -> None:
        self.main.quiet = calls

    def events(self, event: Event) -> list[BaseEvent]:
        entity = event.entity_id
        out: list[BaseEvent] = []
        if not entity or not self.entity_id or entity == self.entity_id:
            voice, sub = self.main, None
        else:
            if entity in self.resumed:
                self._restart(out, entity)
            elif entity not in self.children:
                self._start(out, entity)
            voice, sub = self.children[entity].voice, entity
        self._note_delegations(entity, event)
        if isinstance(event, ToolResultEvent) and event.record.tool_call_id in self.delegations:
            self.delegations.pop(event.record.tool_call_id)
            self._end_children(out, event.record)
        out.extend(_attributed(voice.events(event), sub))
        if sub is not None and isinstance(event, FinalResponse):
            child = self.children[sub]
            if not child.done:
                child.done = True
                out.extend(_attributed(child.voice.finish(None), sub))
                out.append(
                    SubagentFinishedEvent(
                        subagent_run_id=sub,
                        result=plain_json(event.result),
                        outcome=SubagentFinishedSuccessOutcome(),
                    )
                )
        return out

    def finish(
        self, result: Any, *, suspended: Mapping[str, Sequence[str]] | None = None
    ) -> list[BaseEvent]:
        """Close what is open (a sub-agent still running ends with ``SUBAGENT_ERROR``);
        a final answer no text message carried becomes one. ``suspended``: the run ends
        while its prompt goes on, waiting on a child's pause in place -- every
        sub-agent in flight closes its part of this run with ``SUBAGENT_FINISHED``
        ``suspended`` instead, the deepest first, naming the interrupts it owns (by
        entity id; an ancestor of the one that waits owns none), and goes on in the
        run that resumes it (:meth:`suspension`)."""
        out: list[BaseEvent] = []
        if suspended is not None:
            for sub in suspended:
                if sub in self.resumed:  # waits, not heard in this run: shown waiting
                    self._restart(out, sub)
            for sub, child in reversed(self.children.items()):
                if not child.done:
                    out.extend(_attributed(child.voice.finish(None), sub))
                    child.done = True
                    owned = list(suspended.get(sub, ()))
                    outcome = SubagentFinishedSuspendedOutcome(interrupt_ids=owned or None)
                    out.append(SubagentFinishedEvent(subagent_run_id=sub, outcome=outcome))
        for sub, child in self.children.items():
            if not child.done:
                self._end(out, sub, child, "the run ended before the sub-agent did")
        out.extend(self.main.finish(result))
        return out

    def suspension(self) -> Suspension:
        """The sub-agents in flight now, for the run that resumes this one (taken
        before :meth:`finish` closes them)."""
        children = dict(self.resumed)
        children.update(
            (sub, child.call_id) for sub, child in self.children.items() if not child.done
        )
        return Suspension(
            children=tuple(children.items()),
            delegations=tuple((c, e, i) for c, (e, i) in self.delegations.items()),
        )

    def resume(self, suspension: Suspension) -> None:
        """Go on from what a run before this one left in flight (:meth:`suspension`)."""
        for call_id, entity, intent in suspension.delegations:
            self.delegations.setdefault(call_id, (entity, intent))
        for sub, call in suspension.children:
            if sub not in self.children:
                self.resumed.setdefault(sub, call)

    def tells(self, entity: str) -> bool:
        """Whether ``entity`` is a sub-agent of this run: heard in it, or left in
        flight by the run it resumes."""
        return entity in self.children or entity in self.resumed

    def _start(self, out: list[BaseEvent], entity: str) -> None:
        """A child heard for the first time: it runs in the latest open delegation
        call (a child's own children run in calls it made, opened after its own)."""
        call_id = next(reversed(self.delegations)) if self.delegations else None
        self._announce(out, entity, call_id)

    def _restart(self, out: list[BaseEvent], entity: str) -> None:
        """A sub-agent a run before this one left in flight, heard again: announced as
        it was, after the sub-agent that made its call if that one is not yet (a
        sub-agent's parent is announced in the same run before it)."""
        call_id = self.resumed.pop(entity)
        parent = self.delegations.get(call_id, ("", ""))[0] if call_id is not None else ""
        if parent in self.resumed:
            self._restart(out, parent)
        self._announce(out, entity, call_id)

    def _announce(self, out: list[BaseEvent], entity: str, call_id: str | None) -> None:
        """``SUBAGENT_STARTED`` for a child running in delegation call ``call_id``."""
        parent: str | None = None
        intent = ""
        if call_id is not None and call_id in self.delegations:
            parent, intent = self.delegations[call_id]
        voice = _Voice(self.ids, step_prefix=f"{entity}/")
        self.children[entity] = _Child(voice, call_id)
        out.append(
            SubagentStartedEvent(
                subagent_run_id=entity,
                name="call_agent",
                description=intent[:200] or None,
                parent_subagent_run_id=parent if parent in self.children else None,
                parent_tool_call_id=call_id,
            )
        )

    def _note_delegations(self, entity: str, event: Event) -> None:
        calls: list[tuple[str, str, Any]] = []
        if isinstance(event, ToolCallEvent) and event.final and event.call_id:
            calls.append((event.call_id, event.name, event.arguments))
        elif isinstance(event, MessageComplete):
            calls.extend((c.id, c.name, c.arguments) for c in event.response.tool_calls)
        for call_id, name, args in calls:
            if name in DELEGATES and call_id not in self.delegations:
                intent = args.get("intent") if isinstance(args, Mapping) else None
                self.delegations[call_id] = (entity, str(intent or ""))

    def _end_children(self, out: list[BaseEvent], record: GateCallRecord) -> None:
        """A delegation call's result: the children it ran end first -- in error if
        the call failed, or if its record names the child among a batch's failed."""
        failed = failures(record)
        for sub, child in self.children.items():
            if child.call_id == record.tool_call_id and not child.done:
                if record.is_error or sub in failed:
                    self._end(out, sub, child, record.text if record.is_error else failed[sub])
                else:
                    out.extend(_attributed(child.voice.finish(None), sub))
                    child.done = True
                    out.append(
                        SubagentFinishedEvent(
                            subagent_run_id=sub, outcome=SubagentFinishedSuccessOutcome()
                        )
                    )

    def _end(self, out: list[BaseEvent], sub: str, child: _Child, why: str) -> None:
        out.extend(_attributed(child.voice.finish(None), sub))
        child.done = True
        out.append(SubagentErrorEvent(subagent_run_id=sub, message=why or "failed"))


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
