"""AG-UI on the in-process ``cantrip serve``: a run's events come live from the
session's entity (SPEC.md "AG-UI"; the mapping is :mod:`._agui`'s).

A run is a prompt through :meth:`SessionHub.prompt` keyed by its ``runId`` (a
repeated ``runId`` joins the running cast or replays the recorded one: its turns
are told from the loom), or -- with ``resume`` -- answers through
:meth:`SessionHub.answer`. A client that hangs up cancels the run's cast.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio
from ag_ui.core import RunAgentInput

from cantrip._approval import PauseError
from cantrip._errors import CantripError, ConstructionError
from cantrip._outcome import CastResult
from cantrip._redact import get_logger
from cantrip.llm._stream import Event
from cantrip.protocols.agui._protocol import (
    RunFailed,
    RunStream,
    Where,
    check_tools,
    client_answers,
    decision_for,
    intent_of,
    offered_gates,
    parse_input,
    recorded_events,
    run_key,
    thread_key,
    tool_results,
)
from cantrip.protocols.asgi._requests import read_body, until_disconnect
from cantrip.protocols.asgi._responses import HttpError, Receive, Send, heartbeat_s
from cantrip.protocols.sessions._hub import (
    ENTITY_PREFIX,
    SESSION_PREFIX,
    Session,
    SessionError,
    SessionHub,
)

log = get_logger("cantrip.agui")


def session_for(hub: SessionHub, thread_id: str) -> Session:
    """The session a thread names: a session (or entity) id as itself, else the
    session this thread id created (made on first use)."""
    if thread_id.startswith((SESSION_PREFIX, ENTITY_PREFIX)):
        try:
            return hub.get(thread_id)
        except SessionError:
            pass  # not one of ours: a client's own id, mapped like any other
    session, _ = hub.create(thread_key(thread_id))
    return session


def where(hub: SessionHub, session: Session) -> Where:
    leaf = session.entity.leaf
    turns = hub.spell.loom.get(leaf).sequence if leaf is not None else 0
    return Where(session.id, session.entity_id, turns)


class AguiRun:
    """One ``POST /agui``: the run's cast (a prompt, or answers to its interrupts)
    with its events translated as they happen."""

    def __init__(self, hub: SessionHub, session: Session, run: RunAgentInput) -> None:
        self.hub = hub
        self.session = session
        self.run = run

    async def serve(self, receive: Receive, send: Send) -> None:
        async with RunStream(self.run, send).running(where(self.hub, self.session)) as stream:
            await self._serve(stream, receive)

    async def _serve(self, stream: RunStream, receive: Receive) -> None:
        events_send, events = trio.open_memory_channel[Event](float("inf"))
        final: dict[str, CastResult | RunFailed | None] = {}
        sink = events_send.send_nowait
        gone = trio.Event()

        async def cast() -> None:
            async with events_send:
                if gone.is_set():  # hung up before the cast began: cast nothing
                    final["error"] = RunFailed("client_gone", "the client hung up")
                    return
                try:
                    final["outcome"] = await self._cast(sink)
                except RunFailed as exc:
                    final["error"] = exc

        async def watch() -> None:
            await until_disconnect(receive)
            gone.set()
            if self.session.sink == sink:  # our cast is running (not another client's)
                log.info("session %s: the AG-UI client hung up; cancelling", self.session.id)
                self.hub.cancel(self.session)

        heard = False
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cast)
            nursery.start_soon(watch)
            async with events:
                while True:
                    with trio.move_on_after(heartbeat_s()) as quiet:
                        try:
                            event = await events.receive()
                        except trio.EndOfChannel:
                            break
                    if quiet.cancelled_caught:
                        await stream.idle()
                        continue
                    heard = True
                    await stream.event(event)
            nursery.cancel_scope.cancel()  # the watcher: the cast has ended
        failure = final.get("error")
        if isinstance(failure, RunFailed):
            raise failure
        outcome = final.get("outcome")
        assert not isinstance(outcome, RunFailed)
        if outcome is not None and not heard:
            # a repeated runId: the cast ran for another request; tell it from the loom
            for turn in outcome.turns:
                for event in recorded_events(turn):
                    await stream.event(event)
        here = where(self.hub, self.session)
        await stream.finish(outcome, here, self.hub.history(self.session))

    async def _cast(self, sink: Callable[[Event], None]) -> CastResult | None:
        try:
            if self.session.running is None:  # (a busy thread refuses below)
                try:
                    self.session.entity.offer(offered_gates(self.run))
                except ConstructionError as exc:  # a name an MCP server's gate has
                    raise RunFailed("bad_tools", str(exc)) from None
            if self.run.resume:
                return await self._resume(sink)
            answered = await self._client_results(sink)
            if answered is not None:
                return answered[0]
            return await self.hub.prompt(
                self.session, intent_of(self.run), on_event=sink, key=run_key(self.run)
            )
        except SessionError as exc:
            raise RunFailed(exc.kind, exc.message) from None
        except PauseError as exc:
            raise RunFailed("bad_resume", str(exc)) from None
        except CantripError as exc:
            raise RunFailed("cast_failed", f"the cast failed: {exc}") from None
        except Exception as exc:  # the entity crashed: the hub resumed it from the loom
            log.exception("session %s: the entity crashed", self.session.id)
            raise RunFailed("crashed", f"the entity crashed: {exc!r}") from None

    async def _client_results(
        self, sink: Callable[[Event], None]
    ) -> tuple[CastResult | None] | None:
        """Answer the open calls of the client's own tools with the results this run
        carries, each continuing the paused cast (the last continuation's outcome is
        the run's); None if the run carries no result for an open call."""
        calls = client_answers(tool_results(self.run), self.session.entity.pending)
        if not calls:
            return None
        outcome: CastResult | None = None
        for pause, decision in calls:
            outcome = await self.hub.answer(self.session, pause.pause_id, decision, on_event=sink)
        return (outcome,)

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


async def serve_agui(
    hub: SessionHub, receive: Receive, send: Send, make_room: Callable[[], Awaitable[None]]
) -> None:
    """``POST /agui``: read the run's input, find its thread's session (``make_room``
    first, as for any session a request names), and stream the run."""
    run = parse_input(await read_body(receive))
    await make_room()
    check_tools(run, hub.spell.circle.gate_names)
    try:
        session = session_for(hub, run.thread_id)
    except SessionError as exc:  # e.g. a resumed entity that cannot be loaded
        raise HttpError(409, exc.kind, exc.message) from None
    session.last_used = trio.current_time()
    try:
        await AguiRun(hub, session, run).serve(receive, send)
    finally:
        session.last_used = trio.current_time()
