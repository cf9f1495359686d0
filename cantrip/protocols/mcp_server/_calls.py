"""One ``cast`` of ``cantrip mcp`` over the session seam: a prompt a backend runs, its
turns reported, its pauses asked of the client and answered through the backend.

``cantrip mcp`` summoned entities itself once (a third session model beside HTTP's and
``serve --db``'s); now a call is a session of the in-process backend
(:class:`~cantrip.protocols.sessions.ProcessBackend`): the intent is submitted as a
prompt, its recorded turns come from ``follow`` (progress), its outcome from ``result``,
a pause is answered with ``answer`` (the continued cast is a prompt of its own, awaited
in turn), and a call or task the client cancels is cut off with ``cancel`` naming its
prompt. The synchronous call (:mod:`._server`) and a task (:mod:`._tasks`) both drive a
prompt with :func:`drive`; they differ in how a pause is asked (:data:`Ask`).

Two kinds of pause: one that ends the cast (the root entity's approval or ``ask_user``
question: the prompt returns ``paused``, and ``answer`` continues it as a new prompt),
and one that waits in place -- a question one of the circle's MCP servers asks during a
call (``Pause.origin``), or any pause of a child entity (``call_agent``: children always
wait in place, inside the parent's running call): the prompt still runs, the pause is
asked of the client as the parent's own would be (the same :data:`Ask`), and ``answer``
hands the waiting task the decision. Before issue 44 a child's approval or question was
never asked of the client: the call waited with nobody to ask.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Awaitable, Callable

import attrs
import trio

from cantrip._approval import Decision, Pause, PauseError
from cantrip._outcome import CastResult
from cantrip.loom._model import Turn
from cantrip.loom._view import CHECKPOINT_PHASES
from cantrip.protocols.sessions import (
    SessionBackend,
    SessionError,
    SessionInfo,
    SessionRef,
    follow_through,
    session_id_of,
)

Ask = Callable[[Pause], Awaitable[Decision | None]]
"""How a pause is asked of the client: its decision, or None to leave the pause open
(the client answers in a later request: ``InputRequiredResult``, or a task's
``tasks/update``)."""


@attrs.frozen
class Driven:
    """Where a driven prompt stopped: it ended (``cast``), or waits on ``left``."""

    session_id: str
    prompt_id: str
    """The prompt last driven: the one that ended, or the one that waits in place."""
    cast: CastResult | None
    """How it ended (None: cut off before it recorded a turn, or waiting in place)."""
    left: Pause | None = None
    """A pause :data:`Ask` left open: the prompt ended ``paused`` on it, or (a question
    during a call) still runs, waiting for it."""


def is_checkpoint(turn: Turn) -> bool:
    """A turn a pause records (not one of the cast's steps: progress does not count it)."""
    return turn.extras.get("phase") in CHECKPOINT_PHASES


async def drive(
    backend: SessionBackend,
    session: SessionRef,
    prompt_id: str,
    *,
    after: int,
    on_turn: Callable[[Turn], None],
    ask: Ask | None,
    on_prompt: Callable[[str], None] | None = None,
) -> Driven:
    """Await the prompt, reporting each step it records after position ``after``; a
    pause is asked (``ask``; None: a pause that ends the cast is the answer, one during
    a call is denied) and answered through the backend, the continued cast driven in
    turn (``on_prompt`` is told its id). A call cancelled meanwhile cuts its prompt off
    (``cancel``, by id). A prompt that ended for good releases its session (its entity
    and the providers it opened close; the loom keeps it): each call makes its own.

    ``session``: its id, or the session as the call read it (its ``create`` or ``find``),
    handed down to every follow and result -- not read again (issue 46)."""
    position = after
    session_id = session_id_of(session)
    info = session if isinstance(session, SessionInfo) else await backend.find(session_id)
    root = info.entity_id
    while True:
        left: list[Pause] = []

        async def watch(scope: trio.CancelScope, left: list[Pause], until: str) -> None:
            nonlocal position
            nudge, nudged = trio.open_memory_channel[None](math.inf)

            async def follow() -> None:
                nonlocal position
                # until the prompt has ended and its turns were told: none is missed
                # when the result comes first
                async with nudge:  # its close ends the asking below
                    events = follow_through(backend, info, position, until=until)
                    async with contextlib.aclosing(events):
                        async for event in events:
                            if event.turn is not None and event.position is not None:
                                position = event.position
                                if not is_checkpoint(event.turn):
                                    on_turn(event.turn)
                            elif event.type == "pause":
                                nudge.send_nowait(None)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(follow)
                if not await _ask_waiting(backend, info, root, nudged, ask, left):
                    scope.cancel()  # a pause left open: the prompt goes on waiting

        ended = False
        failed: SessionError | None = None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch, nursery.cancel_scope, left, prompt_id)
                try:
                    outcome = await backend.result(info, prompt_id)
                except SessionError as exc:  # raised out of the nursery, not in a group
                    failed = exc
                ended = True  # the watch ends once it has told the prompt's turns
        finally:
            if not ended and not left:  # the call was cancelled: so is its prompt
                with trio.CancelScope(shield=True):
                    await backend.cancel(session_id, prompt_id=prompt_id)
        if failed is not None:
            raise failed
        if left:
            return Driven(session_id, prompt_id, None, left[0])
        cast = outcome.cast
        if cast is None or cast.reason != "paused" or not cast.pending or ask is None:
            await backend.release(session_id)  # a call's session is its own: it ended
            return Driven(session_id, prompt_id, cast)
        pause = cast.pending[0]
        decision = await ask(pause)
        if decision is None:
            return Driven(session_id, prompt_id, cast, pause)
        continued = await backend.answer(session_id, pause.pause_id, decision)
        if continued is None:  # not a pause the loom holds: nothing more to await
            return Driven(session_id, prompt_id, cast)
        prompt_id = continued.prompt_id
        if on_prompt is not None:
            on_prompt(prompt_id)


def waits_in_place(pause: Pause, root: str) -> bool:
    """Whether a pause waits in place while its prompt runs (so the prompt's end will
    not bring it): a question asked during a call, or any pause of a child entity."""
    return pause.origin is not None or pause.entity_id != root


SWEEP_S = 1.0
"""How often the pauses waiting in place are looked at again, events or not: a pause
posted before the session's event stream was followed has no event to tell it."""


async def _ask_waiting(
    backend: SessionBackend,
    session: SessionInfo,
    root: str,
    nudged: trio.MemoryReceiveChannel[None],
    ask: Ask | None,
    left: list[Pause],
) -> bool:
    """Ask the client each pause that waits in place, one at a time, as the parent's
    own would be asked, and answer it through the backend -- until the prompt ends
    (``nudged`` closes: True) or ``ask`` leaves a pause open (it goes in ``left``:
    False). Looked for at once, on each pause event, and every :data:`SWEEP_S`."""
    asked: set[str] = set()
    session_id = session.session_id
    while True:
        try:
            waiting = await backend.pauses(session)  # (each sweep: no read of the session)
        except SessionError:  # the session went (released, evicted): nothing to ask
            waiting = []
        for pause in waiting:
            if pause.pause_id in asked or not waits_in_place(pause, root):
                continue
            asked.add(pause.pause_id)
            decision = (
                await ask(pause)
                if ask is not None
                else Decision.deny("the MCP client takes no elicitation")
            )
            if decision is None:
                left.append(pause)
                return False
            with contextlib.suppress(PauseError):  # answered meanwhile
                await backend.answer(session_id, pause.pause_id, decision)
        with trio.move_on_after(SWEEP_S):
            try:
                await nudged.receive()
            except trio.EndOfChannel:
                return True


def failure_text(exc: SessionError) -> str:
    """A failed cast as the tool's error says it: the error that failed it, by name."""
    cause = exc.__cause__
    return f"{type(cause).__name__}: {cause}" if cause is not None else exc.message
