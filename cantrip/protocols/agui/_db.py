"""AG-UI on ``cantrip serve --db``: a run is work on the queue, its events are the
turns a worker records, read back from the PostgreSQL loom (SPEC.md "AG-UI").

The replica runs no entity, so nothing here sees a token as it is generated: the
replica tails the entity's turns (woken by the queue's notifications, polling every
``tail_s`` regardless, as ``?stream=1`` does) and tells each one as the loop's events
(:func:`._agui.recorded_events`), which the one :class:`._agui.Translator` turns into
AG-UI's. Text arrives a turn at a time; tool calls, their results, reasoning, the
state and the thread are the same as in process.

* a run is a prompt enqueued with its ``runId`` as the idempotency key, so a
  repeated ``runId`` (at any replica) joins the running work or replays the recorded
  cast, and never queues a second one;
* ``resume`` answers the interrupts through the queue, as ``POST
  /sessions/{id}/pending/{pause_id}`` does, and the run follows the continued cast;
* a client that hangs up cancels the run's work item (its worker cuts the cast off
  and records it ``cancelled``); a cancel from elsewhere ends the run ``cancelled``.

The replica's own pieces (its database calls behind the store's limiter, the
enqueue with its limits, the notifier, the drain) are reached through
:class:`cantrip.protocols.http._mounts.Replica`, so this module stands apart from the
replica's routes.
"""

from __future__ import annotations

import contextlib
import functools

import trio
from ag_ui.core import RunAgentInput

from cantrip._approval import Decision, Pause, PauseError
from cantrip._client_gates import CLIENT_TOOLS_KEY
from cantrip._outcome import CastResult
from cantrip._redact import get_logger
from cantrip.distributed._work import DEAD
from cantrip.loom._model import Turn
from cantrip.protocols.agui._protocol import (
    RunFailed,
    RunStream,
    Where,
    check_tools,
    client_answers,
    decision_for,
    intent_of,
    parse_input,
    recorded_events,
    run_key,
    thread_key,
    tool_definitions,
    tool_results,
)
from cantrip.protocols.asgi._requests import read_body
from cantrip.protocols.asgi._responses import HttpError, Receive, Send, heartbeat_s
from cantrip.protocols.http._mounts import Replica
from cantrip.protocols.sessions._hub import ENTITY_PREFIX, SESSION_PREFIX
from cantrip.protocols.sessions._rows import (
    Progress,
    Queued,
    SessionRow,
    failure_message,
    prompt_id_for,
)
from cantrip.protocols.sessions._tail import follow, while_connected

log = get_logger("cantrip.agui")


async def serve_db_agui(replica: Replica, receive: Receive, send: Send) -> None:
    """``POST /agui`` at a replica: read the run's input, find its thread's session
    (in the database: any replica finds the same one), and stream the run."""
    run = parse_input(await read_body(receive))
    check_tools(run, replica.cantrip.circle.gate_names)
    row = await _thread_session(replica, run.thread_id)
    async with RunStream(run, send).running(await _where(replica, row)) as stream:
        followed = await DbAguiRun(replica, row, run, stream).follow(receive)
        if followed is None:
            return  # the client hung up (its work was cancelled): nobody to tell
        outcome, thread = followed
        await stream.finish(outcome, await _where(replica, row), thread)


async def _thread_session(replica: Replica, thread_id: str) -> SessionRow:
    """The session a thread names: a session (or entity) id the database knows is
    itself, any other id the session it created on its first run."""
    if thread_id.startswith((SESSION_PREFIX, ENTITY_PREFIX)):
        known: SessionRow | None = await replica._db(replica.sessions.get, thread_id)
        if known is not None:
            return known
    row, _ = await replica._db(replica.sessions.create, thread_key(thread_id))
    return row  # type: ignore[no-any-return]


async def _where(replica: Replica, row: SessionRow) -> Where:
    last: Turn | None = await replica._db(replica.sessions.store.last_turn, row.entity_id)
    return Where(row.session_id, row.entity_id, last.sequence if last is not None else 0)


class _Gone(Exception):
    """The client hung up while the run went on."""


class DbAguiRun:
    """One run at a replica: queue its work (a prompt, or the answers to its
    interrupts) and tell the work's turns as they land."""

    def __init__(self, replica: Replica, row: SessionRow, run: RunAgentInput, stream: RunStream):
        self.replica = replica
        self.row = row
        self.run = run
        self.stream = stream

    async def follow(self, receive: Receive) -> tuple[CastResult | None, list[Turn]] | None:
        """The run's outcome and the session's thread once its work has ended; None
        if the client hung up first."""
        try:
            with self.replica._waits.held():
                outcome = await self._run(receive)
            thread: list[Turn] = await self.replica._db(
                self.replica.sessions.thread, self.row.entity_id
            )
        except _Gone:
            return None
        except HttpError as exc:  # the replica's refusals: busy, overloaded, the database
            raise RunFailed(exc.code, exc.message) from None
        return outcome, thread

    async def _run(self, receive: Receive) -> CastResult | None:
        replica, row = self.replica, self.row
        if not self.run.resume:
            answered = await self._client_results(receive)
            if answered is not None:
                return answered[0]
            tools = tool_definitions(self.run)
            spell = {**replica.spell, CLIENT_TOOLS_KEY: tools} if tools else None
            intent = intent_of(self.run)
            work_id = await replica._enqueue(row, intent, run_key(self.run), spell=spell)
            return await self._follow_work(work_id, receive)
        outcome: CastResult | None = None
        for entry in self.run.resume:
            pending = await replica._db(replica.sessions.pending, row.entity_id)
            open_ = {p["pause_id"]: p for p in pending}
            if entry.interrupt_id not in open_:
                raise RunFailed(
                    "bad_resume",
                    f"interrupt {entry.interrupt_id!r} is not open on thread "
                    f"{self.run.thread_id!r} (open: {', '.join(open_) or 'none'})",
                )
            pause = Pause.from_dict(open_[entry.interrupt_id])
            try:
                decision = decision_for(pause, entry)
            except PauseError as exc:
                raise RunFailed("bad_resume", str(exc)) from None
            outcome = await self._answer(pause, decision, receive)
        return outcome

    async def _client_results(self, receive: Receive) -> tuple[CastResult | None] | None:
        """Answer the open calls of the client's own tools with the results this run
        carries (through the queue, as any answer), following each continued cast;
        None if the run carries no result for an open call. The continuation runs with
        the tools its paused work was queued with."""
        replica, row = self.replica, self.row
        results = tool_results(self.run)
        if not results:
            return None
        pending = await replica._db(replica.sessions.pending, row.entity_id)
        calls = client_answers(results, [Pause.from_dict(p) for p in pending])
        if not calls:
            return None
        outcome: CastResult | None = None
        for pause, decision in calls:
            outcome = await self._answer(pause, decision, receive)
        return (outcome,)

    async def _answer(
        self, pause: Pause, decision: Decision, receive: Receive
    ) -> CastResult | None:
        """Queue the answer to one pause and follow the cast it continues."""
        replica, row = self.replica, self.row
        try:
            queued: Queued = await replica._db(
                replica.sessions.answer, row.entity_id, pause.pause_id, decision.to_dict()
            )
        except PauseError as exc:
            raise RunFailed("bad_resume", str(exc)) from None
        if queued.replayed:  # a running prompt waited on it in place: that run tells it
            raise RunFailed(
                "answered_live",
                f"interrupt {pause.pause_id} was handed to the run that waits on it",
            )
        return await self._follow_work(queued.work_id, receive)

    async def _follow_work(self, work_id: int, receive: Receive) -> CastResult | None:
        """Tell the work's turns until it ends (cancelling it if the client hangs up);
        the cast as the loom recorded it."""
        replica, row = self.replica, self.row

        async def cancel() -> None:
            log.info("session %s: the AG-UI client hung up; cancelling its run", row.session_id)
            await replica._db(replica.sessions.cancel, row.entity_id, prompt_id_for(work_id))

        tell = functools.partial(self._tell, work_id)
        followed = await while_connected(replica.drain, receive, tell, cancel)
        if followed.gone:
            raise _Gone
        ended = followed.ended
        if ended is None:
            raise RunFailed(
                "shutting_down", "this replica is shutting down; the cast goes on at its worker"
            )
        if ended.state == "failed":
            raise RunFailed("cast_failed", failure_message(ended.outcome))
        if ended.state == DEAD:
            raise RunFailed("cast_dead_lettered", failure_message(ended.outcome))
        cast: CastResult | None
        cast, _ = await replica._db(
            replica.sessions.outcome, row.entity_id, work_id, ended.base_pos
        )
        return cast

    async def _tell(self, work_id: int) -> Progress:
        """Tell the cast's turns as they land in the loom (after the position its work's
        first claim recorded), until its work ends; how it ended. A turn with an intent
        after the first begins the next cast: a replayed run tells its own cast only
        (:mod:`._db_follow`)."""
        replica = self.replica
        turns = follow(replica, self.row.entity_id, replica._db_waiting, work_id=work_id)
        quiet_since = trio.current_time()
        async with contextlib.aclosing(turns):
            async for item in turns:
                if isinstance(item, Turn):
                    quiet_since = trio.current_time()
                    for event in recorded_events(item):
                        await self.stream.event(event)
                elif item.last:
                    assert item.progress is not None
                    return item.progress
                elif trio.current_time() - quiet_since >= heartbeat_s():
                    quiet_since = trio.current_time()
                    await self.stream.idle()
        raise AssertionError("following a work item ends with its last beat")
