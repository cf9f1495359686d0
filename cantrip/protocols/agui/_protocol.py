"""AG-UI 1.0 for ``cantrip serve``, both modes: a run on the wire (SPEC.md "AG-UI").
What a run's input means is :mod:`._input`'s; how the loop's events become AG-UI
events, the one mapping with two sources, is :mod:`._translate`'s.

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
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import attrs
from ag_ui.core import (
    PROTOCOL_VERSION,
    BaseEvent,
    MessagesSnapshotEvent,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunFinishedSuccessOutcome,
    RunStartedEvent,
    StateDeltaEvent,
    StateSnapshotEvent,
    TokenUsage,
)

from cantrip._approval import Pause
from cantrip._events import StepComplete
from cantrip._outcome import STOP_REASONS, CastResult, refused
from cantrip._redact import get_logger, redact, redact_value
from cantrip.llm._contract import ZERO_USAGE, Usage, plain_json
from cantrip.llm._stream import Event
from cantrip.loom._model import Turn
from cantrip.protocols.agui._input import interrupt_for, tool_results
from cantrip.protocols.agui._translate import Translator, messages_of
from cantrip.protocols.asgi._responses import HttpError, Send, end_body, sse_comment, start_sse

log = get_logger("cantrip.agui")


@attrs.frozen
class Where:
    """The session a run runs on, as its state names it."""

    session_id: str
    entity_id: str
    turns: int
    """The sequence number of the session's latest turn: how many turns its entity has
    taken (the pieces of one turn around a pause share it)."""


def state_of(
    run: RunAgentInput,
    where: Where,
    outcome: CastResult | None,
    *,
    running: bool = False,
    waiting: Sequence[Pause] = (),
) -> dict[str, Any]:
    """STATE_SNAPSHOT: the client's own state, with the session under ``cantrip``
    (``running`` for the snapshot a run opens with: no reason, nothing pending yet --
    or one that ends while its prompt goes on, ``waiting`` on pauses in place)."""
    state = dict(run.state) if isinstance(run.state, Mapping) else {}
    pending = outcome.pending if outcome is not None else waiting
    state["cantrip"] = {
        "session_id": where.session_id,
        "entity_id": where.entity_id,
        "turns": where.turns,
        "running": running,
        "reason": None if outcome is None else outcome.reason,
        "pending": [p.to_dict() for p in pending],
    }
    return state


def usage_of(usage: Usage) -> list[TokenUsage] | None:
    """Tokens as 1.0's ``usage`` (``RUN_FINISHED`` and ``RUN_ERROR`` both carry it);
    None when unknown (a provider that did not say) or none were spent."""
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


def wire_data(event: BaseEvent) -> Any:
    """One AG-UI event as the JSON object the wire carries (the official encoder's
    form), through the redactor like every other answer, stamped with the time it
    left (milliseconds since the epoch, as every AG-UI SDK does). The one place an
    event takes its wire form: the tests hold what it gives to the 1.0 JSON Schema
    (tests/agui_schema_check.py)."""
    if event.timestamp is None:
        event.timestamp = int(time.time() * 1000)
    return redact_value(event.model_dump(mode="json", by_alias=True))


async def send_event(send: Send, event: BaseEvent, event_id: str | None = None) -> None:
    """One AG-UI event as an SSE ``data:`` line (:func:`wire_data`), after its ``id:``."""
    data = wire_data(event)
    head = f"id: {event_id}\n" if event_id is not None else ""
    payload = f"{head}data: {json.dumps(data, default=str)}\n\n".encode()
    await send({"type": "http.response.body", "body": payload, "more_body": True})


class RunStream:
    """One run's answer on the wire, whatever its events' source: ``RUN_STARTED`` and
    the state it starts from; each event translated as it comes, and a
    ``STATE_DELTA`` (JSON Patch) as each turn is recorded; then the ending."""

    def __init__(self, run: RunAgentInput, send: Send, *, after: int | None = None) -> None:
        self.run = run
        self.send = send
        self.translator = Translator(run_id=run.run_id)
        self.translator.quiet = set(tool_results(run))  # the client has these results
        self.turns = 0
        """The latest turn's sequence a ``STATE_DELTA`` of this run told (counted from 0,
        not from the opening snapshot's, so a run told again tells the same deltas)."""
        self.after = after
        """The id of the last event the client has (a reconnect's ``Last-Event-ID``):
        only later ones are sent, after ``RUN_STARTED`` (None: a new stream)."""
        self.told = 0
        """How many events of the run were told (sent, or skipped as the client's)."""
        self.entity_id = ""
        self.ended = False
        """The run's last event went out (``RUN_FINISHED`` or ``RUN_ERROR``)."""
        self.spent: dict[str, Usage] = {}
        """The tokens of each of the run entity's turns told (by turn id): what a run
        that fails before its cast's result is in says it spent (``RUN_ERROR``)."""

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
        await self._send(
            RunStartedEvent(
                thread_id=run.thread_id, run_id=run.run_id, protocol_version=PROTOCOL_VERSION
            )
        )
        self.entity_id = where.entity_id
        self.translator.entity_id = where.entity_id  # every other entity's is a sub-agent's
        await self._send(StateSnapshotEvent(snapshot=state_of(run, where, None, running=True)))

    async def _send(self, event: BaseEvent) -> None:
        """The run's next event, with its id: its place in the run (0 for
        ``RUN_STARTED``). The run is told the same way each time it is told -- its
        prompt's events followed from the prompt's beginning (:mod:`._run`), ids minted
        in order (:class:`~._translate.Ids`) -- so a place names the same event to a
        client that reconnects; one it already has is not sent again. ``RUN_STARTED``
        always is: an AG-UI response opens with it."""
        place = self.told
        self.told += 1
        if self.after is None or place == 0 or place > self.after:
            await send_event(self.send, event, str(place))

    async def event(self, event: Event) -> None:
        """One of the loop's events (live, or :func:`recorded_events`)."""
        for out in self.translator.events(event):
            await self._send(out)
        turn = event.turn if isinstance(event, StepComplete) else None
        if turn is not None and turn.entity_id == self.entity_id:
            self.spent[turn.id] = turn.metadata.usage
        if turn is not None and turn.entity_id == self.entity_id and turn.sequence > self.turns:
            self.turns = turn.sequence
            patch = [{"op": "replace", "path": "/cantrip/turns", "value": self.turns}]
            await self._send(StateDeltaEvent.model_validate({"delta": patch}))

    async def idle(self) -> None:
        """A comment line while nothing happens (a long gate call, a slow model): no
        event for the client -- SSE readers skip comments -- but bytes that keep
        proxies and load balancers from closing the stream as idle."""
        await sse_comment(self.send, "idle")

    async def fail(self, failure: RunFailed) -> None:
        """End the run with ``RUN_ERROR`` (what was open is closed first), with the
        tokens of the turns it told: a failed cast has no result to sum them, but its
        recorded turns were paid for."""
        for out in self.translator.finish(None):
            await self._send(out)
        if self.after is not None and self.told <= self.after:
            self.told = self.after + 1  # the run ends after what the client has: it is told
        self.ended = True
        spent = sum(self.spent.values(), ZERO_USAGE)
        await self._send(
            RunErrorEvent(message=failure.message, code=failure.code, usage=usage_of(spent))
        )
        await end_body(self.send)

    async def finish(
        self,
        outcome: CastResult | None,
        where: Where,
        thread: Sequence[Turn],
        *,
        waiting: Sequence[Pause] = (),
    ) -> None:
        """End the run: the final answer if no message carried it, the state and the
        thread as they are now, and ``RUN_FINISHED`` -- ``interrupt`` when the cast
        paused, ``cancelled`` when it was cancelled (or never began). ``waiting``: the
        pauses of sub-agents the prompt waits on in place (it goes on running): the
        run ends with them as its interrupts, each naming its sub-agent."""
        if waiting:
            await self._suspend(waiting, where, thread)
            return
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
            finished = RunErrorEvent(
                message=redact(outcome.summary or "refused"),
                code="guardrail",
                usage=usage_of(outcome.usage),
            )
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
                usage=usage_of(outcome.usage),
            )
        else:  # success -- with the calls of the client's own tools it is to run, if any
            calls = [p.tool_call_id for p in outcome.pending if p.tool_call_id is not None]
            finished = RunFinishedEvent(
                thread_id=run.thread_id,
                run_id=run.run_id,
                result=plain_json(outcome.result) if outcome.terminated else None,
                outcome=RunFinishedSuccessOutcome(pending_tool_call_ids=calls or None),
                usage=usage_of(outcome.usage),
            )
        out.append(finished)
        await self._end(out)

    async def _suspend(
        self, waiting: Sequence[Pause], where: Where, thread: Sequence[Turn]
    ) -> None:
        """End a run whose prompt waits on sub-agents' pauses in place (SPEC AGUI-6):
        every sub-agent in flight closes ``suspended`` (the one waiting naming its
        interrupts), the state says the prompt runs with those pauses pending, and
        ``RUN_FINISHED`` is ``interrupt``, each interrupt with its ``subagentRunId``,
        with the tokens of the turns this run told (the cast has no result yet)."""
        owned: dict[str, list[str]] = {}
        for pause in waiting:
            owned.setdefault(pause.entity_id, []).append(pause.pause_id)
        out = self.translator.finish(None, suspended=owned)
        state = state_of(self.run, where, None, running=True, waiting=waiting)
        out.append(StateSnapshotEvent(snapshot=state))
        out.append(MessagesSnapshotEvent(messages=messages_of(thread)))
        interrupts = [
            interrupt_for(p, None if p.entity_id == self.entity_id else p.entity_id)
            for p in waiting
        ]
        out.append(
            RunFinishedEvent(
                thread_id=self.run.thread_id,
                run_id=self.run.run_id,
                outcome=RunFinishedInterruptOutcome(interrupts=interrupts),
                usage=usage_of(sum(self.spent.values(), ZERO_USAGE)),
            )
        )
        await self._end(out)

    async def _end(self, out: Sequence[BaseEvent]) -> None:
        """Send the run's last events, the last of them ending it."""
        for event in out[:-1]:
            await self._send(event)
        self.ended = True
        await self._send(out[-1])
        await end_body(self.send)
