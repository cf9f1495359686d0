"""``POST /agui``, written once over the session seam (SPEC.md "AG-UI"): one AG-UI run
against any :class:`~cantrip.protocols.sessions.SessionBackend` -- in process, on
PostgreSQL, or a third one -- with :mod:`._input`'s meaning of the input (and
:mod:`._reconnect`'s of a request's reconnecting), :mod:`._translate`'s one event mapping
(:mod:`._loop_events` reading the seam's events back) and :mod:`._protocol`'s run on
the wire.

* ``threadId`` names a session: a session (or entity) id the backend finds is itself,
  any other id the session it created on that thread's first run (``create`` by key);
* a run is one prompt, submitted with its ``runId`` as the idempotency key and the
  client's ``tools``: a repeated ``runId`` joins the running prompt or replays the
  ended one, and never casts again;
* ``resume`` entries, and the results of the client's own tools, answer the paused
  calls (:meth:`SessionBackend.answer`), each continuation followed like a prompt;
* what the run tells is its prompt's own stream, ``follow(prompt_id=...)``, from the
  prompt's beginning: in process the entity's events as they happen (token deltas,
  tool calls), on PostgreSQL the turns as a worker records them. A turn whose events
  were not heard live is told from its record (:func:`._recorded.recorded_events`),
  so the one :class:`._translate.Translator` takes both, and no backend is asked what
  it is. A run told again (joined, replayed, or a client reconnecting with
  ``Last-Event-ID``) is told the same way, event for event, so an event's id -- its
  place in the run -- names the same event each time (:class:`._protocol.RunStream`);
* the run ends when its prompt's :meth:`~SessionBackend.result` is in and the follow
  has told the cast's end (its last turn, or its pauses): ``RUN_FINISHED`` (an
  interrupt for a pause, ``cancelled`` for a cancel from elsewhere) or ``RUN_ERROR``;
* a client that hangs up cancels the run's prompt -- at once, or after
  ``?reconnect_s=`` if no run follows the prompt by then; the server's shutdown ends
  the stream with ``RUN_ERROR`` ``shutting_down`` (the same ``runId`` replays it later).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager

import attrs
import trio
from ag_ui.core import RunAgentInput

from cantrip._approval import Decision, Pause, PauseError
from cantrip._events import FinalResponse, StepComplete
from cantrip._outcome import CastResult
from cantrip._redact import get_logger
from cantrip.loom._model import Turn
from cantrip.protocols.agui._input import (
    check_tools,
    client_answers,
    decision_for,
    intent_of,
    parse_input,
    run_key,
    thread_key,
    tool_definitions,
    tool_results,
)
from cantrip.protocols.agui._loop_events import loop_event
from cantrip.protocols.agui._protocol import RunFailed, RunStream, Where
from cantrip.protocols.agui._reconnect import reconnection
from cantrip.protocols.agui._recorded import ends_its_step, recorded_tree
from cantrip.protocols.agui._waiting import Waiting, remember, take
from cantrip.protocols.asgi._requests import read_body, until_disconnect
from cantrip.protocols.asgi._responses import HttpError, Receive, Scope, Send, heartbeat_s
from cantrip.protocols.middleware._lifecycle import Drain
from cantrip.protocols.sessions import (
    ENTITY_PREFIX,
    SESSION_PREFIX,
    EventId,
    SessionBackend,
    SessionError,
    SessionEvent,
    SessionInfo,
    Submitted,
    follow_through,
)

log = get_logger("cantrip.agui")

CATCH_UP_S = 30.0
"""How long, once a prompt's result is in, the run waits for the follow to tell the
cast's end; past it the turns not told yet are told from the cast's record (a
follower that fell behind -- a database slow to answer -- never holds a run open)."""

Admission = Callable[[], AbstractAsyncContextManager[object]]


async def serve_agui(
    backend: SessionBackend,
    receive: Receive,
    send: Send,
    *,
    gate_names: Iterable[str] = (),
    admitted: Admission | None = None,
    drain: Drain | None = None,
    scope: Scope | None = None,
) -> None:
    """``POST /agui``: read the run's input (a 400 before anything runs if it is not
    one, or a tool takes a name of ``gate_names``, the circle's), find its thread's
    session and stream the run.

    ``admitted``: the server's own admission around the run -- a refusal
    (:class:`HttpError`) is the answer before any event (in process: room for one
    more session; on a replica: ``overloaded``), and it holds while the run does (a
    replica counts it among the prompts it waits on). ``drain``: the server's shutdown
    ends the run's stream. ``scope``: the request's, for a reconnect's
    ``Last-Event-ID`` and ``?reconnect_s=`` (:func:`reconnection`)."""
    after, reconnect_s = reconnection(scope)
    body = await read_body(receive)
    # untrusted and up to a megabyte (30,000 messages: ~0.2 s of validation): off the loop
    run = await trio.to_thread.run_sync(parse_input, body, limiter=PARSING)
    check_tools(run, gate_names)
    async with admitted() if admitted is not None else contextlib.nullcontext():
        info = await thread_session(backend, run.thread_id)
        thread = await backend.thread(info)  # the run's one read of its session (issue 46)
        where = Where(info.session_id, info.entity_id, thread[-1].sequence if thread else 0)
        async with RunStream(run, send, after=after).running(where) as stream:
            agui_run = AguiRun(backend, info, run, stream, drain, reconnect_s=reconnect_s)
            await agui_run.serve(receive)


PARSING = trio.CapacityLimiter(2)
"""Threads that may check ``RunAgentInput`` bodies at once (:func:`parse_input`)."""


async def thread_session(backend: SessionBackend, thread_id: str) -> SessionInfo:
    """The session a thread names: a session (or entity) id the backend knows is
    itself; any other id the session this thread id created (made on first use)."""
    try:
        if thread_id.startswith((SESSION_PREFIX, ENTITY_PREFIX)):
            try:
                return await backend.find(thread_id)
            except SessionError as exc:
                if exc.kind != "not_found":
                    raise
                # not one of ours: a client's own id, mapped like any other
        info, _ = await backend.create(thread_key(thread_id))
        return info
    except SessionError as exc:  # e.g. an entity the loom holds that cannot be resumed
        raise HttpError(409, exc.kind, exc.message) from None


class _Followed:
    """The prompt's follow has ended (the prompt did, or it is not known here)."""


@attrs.define
class _Ended:
    """A prompt's result is in (or why there is none)."""

    cast: CastResult | None = None
    failure: RunFailed | None = None


class AguiRun:
    """One ``POST /agui``: the run's prompt (or its answers to paused calls), each
    followed on the seam and told as it goes."""

    def __init__(
        self,
        backend: SessionBackend,
        info: SessionInfo,
        run: RunAgentInput,
        stream: RunStream,
        drain: Drain | None = None,
        *,
        reconnect_s: float = 0.0,
    ) -> None:
        self.backend = backend
        self.reconnect_s = reconnect_s
        self.info = info
        """The session as this request read it: handed down, not read again."""
        self.session_id = info.session_id
        self.run = run
        self.stream = stream
        self.drain = drain
        self.gone = False
        """The client hung up."""
        self.ours: Submitted | None = None
        """The prompt this run started and follows now (a hang-up cancels it)."""
        self.dropped: Submitted | None = None
        """The prompt this run followed when its client hung up."""
        self.reconnected = stream.after is not None
        """A client resuming its own run: the prompt it joins is its own to cancel."""
        self.watcher = os.urandom(8).hex()
        """This run's name among the runs following its prompt (``backend.watches``)."""

    async def serve(self, receive: Receive) -> None:
        """The run to its end; nothing more is said once the client has hung up. A
        run that ends at a sub-agent's pause its prompt waits on in place leaves the
        prompt running (no hang-up after it cancels anything: the run has ended) and
        is remembered for the run that resumes it."""
        outcome: CastResult | Waiting | None = None
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                await until_disconnect(receive)
                self.gone, self.dropped = True, self.ours
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            with self.drain.stream() if self.drain is not None else trio.CancelScope() as ending:
                outcome = await self._serve()
            nursery.cancel_scope.cancel()  # the watcher: the run has ended
        if self.gone:
            await self._let_go(self.dropped)
            return
        if ending.cancelled_caught:
            raise RunFailed(
                "shutting_down",
                "the server is shutting down before the run ended: run it again with the "
                "same runId for its outcome",
            )
        thread = await self.backend.thread(self.info)
        here = Where(self.session_id, self.stream.entity_id, thread[-1].sequence if thread else 0)
        if isinstance(outcome, Waiting):  # remembered already (:meth:`_follow`)
            await self.stream.finish(None, here, thread, waiting=outcome.pauses)
            return
        await self.stream.finish(outcome, here, thread)

    async def _let_go(self, ours: Submitted | None) -> None:
        """The client hung up: cancel its prompt -- at once, or, when it asked for time
        to reconnect (``?reconnect_s=``), after that long if no run follows the prompt
        by then, at any replica (``backend.watches``: a reconnect follows it until it
        ends, and its own hang-up grants its own grace). A run that joined another
        client's prompt cancels nothing."""
        if ours is None:
            return
        watches, prompt_id = self.backend.watches, ours.prompt_id
        owned = not ours.replayed or self.reconnected
        grace_s = self.reconnect_s if owned else 0.0
        with trio.CancelScope(shield=True):
            await watches.unwatch(self.session_id, prompt_id, self.watcher, grace_s=grace_s)
        if not owned:
            return
        if grace_s > 0:
            # the server's shutdown ends the wait (it does not wait on a gone client)
            with self.drain.stream() if self.drain is not None else trio.CancelScope():
                await trio.sleep(grace_s)
            with trio.CancelScope(shield=True):
                if await watches.watched(self.session_id, prompt_id, self.watcher):
                    return  # its client came back: the run following it has it now
        log.info("session %s: the AG-UI client hung up; cancelling", self.session_id)
        with trio.CancelScope(shield=True):
            await self.backend.cancel(self.session_id, prompt_id=prompt_id)

    async def _serve(self) -> CastResult | Waiting | None:
        if self.run.resume:
            return await self._resume()
        answered = await self._client_results()
        if answered is not None:
            return answered[0]
        return await self._follow(
            lambda: self.backend.submit(
                self.info,
                intent_of(self.run),
                key=run_key(self.run),
                tools=tool_definitions(self.run),
            )
        )

    async def _client_results(self) -> tuple[CastResult | Waiting | None] | None:
        """Answer the open calls of the client's own tools with the results this run
        carries, each continuing the paused cast (the last continuation's outcome is
        the run's); None if the run carries no result for an open call."""
        results = tool_results(self.run)
        if not results:
            return None
        calls = client_answers(results, await self.backend.pauses(self.info))
        if not calls:
            return None
        outcome: CastResult | Waiting | None = None
        for pause, decision in calls:
            outcome = await self._answer(pause.pause_id, decision)
        return (outcome,)

    async def _resume(self) -> CastResult | Waiting | None:
        """Answer the interrupts in the order given; each answer continues the paused
        cast (or the prompt that waits on it in place), and the last continuation's
        outcome is the run's. An interrupt answered already with this very answer (a
        client that lost the stream of the run that answered it, sending it again)
        follows the continuation that answer started; any other answer to it is
        ``bad_resume``."""
        outcome: CastResult | Waiting | None = None
        for entry in self.run.resume or ():
            pending = {p.pause_id: p for p in await self.backend.pauses(self.info)}
            pause = pending.get(entry.interrupt_id)
            try:
                decision = decision_for(pause, entry)
            except PauseError as exc:
                raise RunFailed("bad_resume", str(exc)) from None
            closed = None
            if pause is None:
                take(self.session_id, entry.interrupt_id)  # closed: forgotten
                closed = (
                    f"interrupt {entry.interrupt_id!r} is not open on thread "
                    f"{self.run.thread_id!r} (open: {', '.join(pending) or 'none'}), "
                    "and was not answered so"
                )
            outcome = await self._answer(entry.interrupt_id, decision, closed)
        return outcome

    async def _answer(
        self, pause_id: str, decision: Decision, closed: str | None = None
    ) -> CastResult | Waiting | None:
        """Answer ``pause_id`` and tell what follows: the paused cast's continuation, or
        -- for a pause a running prompt waits on in place that an AG-UI run of this
        process ended at (:class:`Waiting`) -- that prompt from the pause on.
        ``closed``: why the answer is refused if the pause is not open (then it may be
        this very answer sent again)."""
        waited = take(self.session_id, pause_id) if closed is None else None

        async def answer() -> Submitted:
            try:
                submitted = await self.backend.answer(
                    self.session_id, pause_id, decision, repeat=closed is not None
                )
            except PauseError:
                if closed is None:
                    raise
                raise RunFailed("bad_resume", closed) from None
            if submitted is None and waited is not None:  # the prompt goes on: follow it
                return Submitted(waited.prompt_id, self.session_id)
            if submitted is None:  # a running prompt waited on it in place: that run tells it
                raise RunFailed(
                    "answered_live",
                    f"interrupt {pause_id} was handed to the run that waits on it",
                )
            return submitted

        if waited is None:
            return await self._follow(answer)
        self.stream.translator.resume(waited.suspension)
        return await self._follow(answer, after=waited)

    async def _follow(
        self, start: Callable[[], Awaitable[Submitted]], *, after: Waiting | None = None
    ) -> CastResult | Waiting | None:
        """Start a prompt (``start``: a submit or an answer) and tell its cast until it
        has ended (or waits on a sub-agent's pause in place); how it ended. The
        prompt's own events are followed from its beginning (``follow(prompt_id=...)``:
        what it told before the follow began is read back first), so a run told again
        -- joined, replayed, or a client reconnecting -- is told the same way, event
        for event; ``after``: from where a run before this one left the prompt."""
        failure: RunFailed | None = None
        outcome: CastResult | Waiting | None = None
        try:
            with trio.CancelScope(shield=True):  # started, it is ours to cancel
                self.ours = submitted = await start()
        except SessionError as exc:
            failure = RunFailed(exc.kind, exc.message)
        except PauseError as exc:
            failure = RunFailed("bad_resume", str(exc))
        except RunFailed as exc:
            failure = exc
        else:
            if self.gone:  # hung up while it was being started
                self.dropped = submitted
            watches, prompt_id = self.backend.watches, submitted.prompt_id
            with trio.CancelScope(shield=True):  # a hang-up's grace must see this run
                await watches.watch(self.session_id, prompt_id, self.watcher)
            try:
                outcome, failure = await self._tell_prompt(submitted, after)
            finally:
                if not self.gone:  # else its hang-up lets go of it (``_let_go``)
                    with trio.CancelScope(shield=True):
                        await watches.unwatch(self.session_id, prompt_id, self.watcher)
            if isinstance(outcome, Waiting):
                # before the interrupt goes out (a client resumes it at once), and
                # before a later resume entry of this run may answer it
                outcome = attrs.evolve(outcome, suspension=self.stream.translator.suspension())
                remember(self.session_id, outcome)
        self.ours = None
        if failure is not None:
            raise failure
        return outcome

    async def _tell_prompt(
        self, submitted: Submitted, after: Waiting | None = None
    ) -> tuple[CastResult | Waiting | None, RunFailed | None]:
        backend, session_id, info = self.backend, self.session_id, self.info
        told, heard = trio.open_memory_channel[SessionEvent | _Ended | _Followed](math.inf)
        async with told, heard, trio.open_nursery() as nursery:

            async def pump() -> None:
                since = after.after if after is not None else 0
                events = follow_through(backend, info, since, prompt_id=submitted.prompt_id)
                try:
                    async with contextlib.aclosing(events):
                        async for event in events:
                            told.send_nowait(event)
                except SessionError as exc:  # a prompt this process no longer knows
                    log.info("session %s: %s; told from its record", session_id, exc.message)
                told.send_nowait(_Followed())

            async def result() -> None:
                try:
                    ended = await backend.result(info, submitted.prompt_id)
                except SessionError as exc:
                    told.send_nowait(_Ended(failure=RunFailed(exc.kind, exc.message)))
                else:
                    told.send_nowait(_Ended(ended.cast))

            nursery.start_soon(pump)
            nursery.start_soon(result)
            told_end = await self._tell(heard, submitted.prompt_id, after)
            nursery.cancel_scope.cancel()
        return told_end

    async def _next(
        self, heard: trio.MemoryReceiveChannel[SessionEvent | _Ended | _Followed], deadline: float
    ) -> SessionEvent | _Ended | _Followed | None:
        """What comes next, or None if nothing did for a heartbeat (an ``: idle`` went
        out) or by ``deadline``."""
        with trio.move_on_at(min(deadline, trio.current_time() + heartbeat_s())):
            return await heard.receive()
        if trio.current_time() < deadline:
            await self.stream.idle()
        return None

    async def _tell(
        self,
        heard: trio.MemoryReceiveChannel[SessionEvent | _Ended | _Followed],
        prompt_id: str,
        after: Waiting | None = None,
    ) -> tuple[CastResult | Waiting | None, RunFailed | None]:
        """Tell the prompt's events until it has ended and its end is told (or its
        follow ended: what it did not tell is told from the cast's record). A prompt
        that failed is followed to its follow's end too (within :data:`CATCH_UP_S`):
        the turns it recorded before it failed are told, and their tokens said. A
        pause of one of the run's sub-agents ends the telling there (:class:`Waiting`):
        the child waits in place, its prompt goes on, and the run ends with it."""
        live = False
        """Events of the turn being told were heard as they happened."""
        told: set[str] = set(after.told) if after is not None else set()
        """Turns told (by id), and pauses heard (by the runs before this one too)."""
        ended: _Ended | None = None
        failure: RunFailed | None = None
        followed = False
        """The follow has ended: nothing more will come from it."""
        deadline = math.inf
        while ended is None or not (
            followed or (failure is None and _told_its_end(ended.cast, told))
        ):
            item = await self._next(heard, deadline)
            if item is None:
                if trio.current_time() >= deadline:
                    break  # the follow fell behind: the rest is told from the record
                continue
            if isinstance(item, _Followed):
                followed = True
                continue
            if isinstance(item, _Ended):
                failure = failure or item.failure
                ended, deadline = item, trio.current_time() + CATCH_UP_S
                continue
            if item.type == "reset":  # the prompt's first events are gone (AGUI-17)
                return None, RunFailed("not_resumable", _NOT_RESUMABLE)
            if item.type == "pause":
                told.add(str(item.data.get("pause", {}).get("pause_id")))
                waits = self._waits_in_place(item)
                if waits is not None:
                    return Waiting((waits[0],), prompt_id, waits[1], frozenset(told)), None
            elif item.turn is not None:
                told.add(item.turn.id)
                if live:
                    turn = item.turn
                    if ends_its_step(turn):  # a checkpoint's turn goes on (its results)
                        await self.stream.event(StepComplete(turn=turn, entity_id=turn.entity_id))
                    # and the rest of that turn is still heard live (taken for a turn not
                    # heard, an approved call's result was told again from its record)
                    live = not ends_its_step(turn)
                else:  # a turn whose events this run did not hear: told from its record
                    await self._tell_recorded(item.turn)
            else:
                said = loop_event(item)
                if said is not None:
                    live = live or not isinstance(said, FinalResponse)
                    await self.stream.event(said)
        assert ended is not None
        if failure is not None:
            return None, failure
        cast = ended.cast
        if not _told_its_end(cast, told) and not live:  # fell behind: tell it from the record
            for turn in cast.turns if cast is not None else ():
                if turn.id not in told:
                    await self._tell_recorded(turn)
        return cast, None

    async def _tell_recorded(self, turn: Turn) -> None:
        """A turn whose events this run did not hear, told from its record -- with the
        children its delegation calls ran, from theirs, as sub-agents before each
        call's result (:func:`._recorded.recorded_tree`: a replica follows only its
        session entity's turns, so a child is told from the loom)."""
        translator = self.stream.translator
        read = functools.partial(recorded_tree, turn, tells=translator.tells)
        for event in await self.backend.read_loom(read):
            await self.stream.event(event)

    def _waits_in_place(self, item: SessionEvent) -> tuple[Pause, EventId] | None:
        """The pause ``item`` tells, and its place in the prompt's stream, if one of
        this run's sub-agents waits on it in place (a ``call_agent`` child at any
        depth, heard in this run or left in flight by the run it resumes; on ``serve
        --db`` a child is told only once its parent's turn is recorded, AGUI-9, so none
        is); None for the run's own
        entity's pauses (a cast that pauses returns ``paused``) and anything else."""
        data = item.data.get("pause")
        if not isinstance(data, Mapping) or item.id is None:
            return None
        pause = Pause.from_dict(data)
        if not self.stream.translator.tells(pause.entity_id):
            return None
        return pause, item.id


_NOT_RESUMABLE = (
    "this run's prompt told more events than the server holds for a session, and its "
    "first ones are gone: the run cannot be told again with the same event ids. Its "
    "turns are in the thread (the next run's MESSAGES_SNAPSHOT, or "
    "GET /sessions/{id}/thread); send a new run for more"
)


def _told_its_end(cast: CastResult | None, told: set[str]) -> bool:
    """Whether the follow has told how ``cast`` ended: its pauses if it paused, else
    its last turn (a cast cut off before it recorded one has nothing to tell)."""
    if cast is None or not cast.turns:
        return True
    if cast.pending:
        return all(p.pause_id in told for p in cast.pending)
    return cast.turns[-1].id in told
