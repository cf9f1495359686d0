"""What the HTTP API waits on: a prompt's result, a prompt's event stream, a session's
``/events`` -- each read from the backend (``result``, ``follow``), the same in every mode.

A request that waits does not hold its cast: the cast runs in the backend (in process,
in its nursery; on ``--db``, at a worker), so a client that hangs up is let go at once
(hypercorn closes a connection only when its request's task ends) while the cast runs on
and is recorded -- unless the stream asked ``cancel_on_disconnect``. At shutdown the
drain ends what still waits (:meth:`HttpApp.shutdown`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import trio

from cantrip._outcome import result_dict
from cantrip._redact import get_logger
from cantrip.protocols.asgi._requests import last_event_id, until_disconnect
from cantrip.protocols.asgi._responses import (
    HttpError,
    Receive,
    Scope,
    Send,
    end_body,
    heartbeat_s,
    sse,
    sse_comment,
    sse_error,
    start_sse,
)
from cantrip.protocols.middleware._lifecycle import Drain
from cantrip.protocols.sessions import (
    EventId,
    PromptOutcome,
    SessionBackend,
    SessionError,
    SessionEvent,
    SessionInfo,
    Submitted,
    parse_event_id,
)
from cantrip.protocols.sessions._positions import check_reachable

HAND_OVER = 16
"""Events between a follow and the socket's writer (the watcher's buffer is the bound
that counts: :data:`~cantrip.protocols.sessions._positions.WATCHER_BUFFER`)."""

EVERYTHING = EventId(0, -1)
"""A prompt's stream from its beginning."""


def event_id(event: SessionEvent) -> str | None:
    """The SSE ``id`` of a session's event (None for a notice that is not one)."""
    return None if event.id is None else str(event.id)


class HttpApp(Protocol):
    """What the streams use of the app serving them (:class:`._app.HttpApp`)."""

    backend: SessionBackend
    drain: Drain

    def refusal(self, exc: BaseException) -> HttpError: ...


log = get_logger("cantrip.http")

GONE_ELSEWHERE = (
    "the server is shutting down; a cast that runs elsewhere goes on: send the request "
    "again (with the same Idempotency-Key) to get its result"
)


def result_of(info: SessionInfo, outcome: PromptOutcome) -> dict[str, Any]:
    """A prompt's result in the API's shape (``PromptResult``)."""
    data = result_dict(outcome.cast)
    if outcome.undelivered and outcome.cast is None:  # sent while it waited; never began
        data["undelivered"] = list(outcome.undelivered)
    data["session_id"] = info.session_id
    if data.get("entity_id") is None:
        data["entity_id"] = info.entity_id
    return data


async def _until_gone(receive: Receive, scope: trio.CancelScope) -> None:
    await until_disconnect(receive)
    scope.cancel()


async def outcome(
    app: HttpApp, info: SessionInfo, prompt_id: str, receive: Receive
) -> PromptOutcome | None:
    """The prompt's outcome; None if the client hung up first (the cast runs on)."""
    got: list[PromptOutcome] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_until_gone, receive, nursery.cancel_scope)
        with app.drain.stream() as closing:
            got.append(await app.backend.result(info, prompt_id))
        nursery.cancel_scope.cancel()
    if closing.cancelled_caught:
        raise SessionError("shutting_down", GONE_ELSEWHERE)
    return got[0] if got else None


async def start_prompt_stream(send: Send, prompt_id: str, session_id: str, key: str | None) -> None:
    """A prompt's event stream begins: its id in the ``Prompt-Id`` header and in the
    first event, so a client can name this prompt in a cancel from the start."""
    await start_sse(send, {"prompt-id": prompt_id})
    data = {"type": "prompt", "prompt_id": prompt_id, "session_id": session_id}
    await sse(send, "prompt", {**data, "idempotency_key": key})


async def prompt_stream(
    app: HttpApp,
    info: SessionInfo,
    submitted: Submitted,
    key: str | None,
    receive: Receive,
    send: Send,
    cancel_on_disconnect: bool,
    after: EventId | None = None,
) -> None:
    """The prompt's events (the backend's ``follow`` of it; after ``after`` for a
    client resuming, the prompt named again by its Idempotency-Key) and then its
    ``result`` -- or, for a client that hangs up, nothing more (its prompt cancelled
    if it asked). Each event carries its id; ``prompt`` and ``result`` are the
    stream's own (no id: a resumed stream sends them again)."""
    sid, prompt_id = info.session_id, submitted.prompt_id
    await start_prompt_stream(send, prompt_id, sid, key)

    async def tell() -> None:
        events = app.backend.follow(info, EVERYTHING if after is None else after,
                                    prompt_id=prompt_id)  # fmt: skip
        async with contextlib.aclosing(events):
            async for event in events:
                await sse(send, event.type, event.data, event_id=event_id(event))

    async def cancel() -> None:
        log.info("session %s: the client hung up; cancelling its prompt", sid)
        await app.backend.cancel(sid, prompt_id=prompt_id)

    gone, closing = await _while_connected(
        app, receive, tell, cancel if cancel_on_disconnect else None
    )
    if gone:
        return  # nobody to tell; the cast goes on unless cancelled
    try:
        if closing:
            raise SessionError("shutting_down", GONE_ELSEWHERE)
        final = {**result_of(info, await app.backend.result(info, prompt_id)),
                 "prompt_id": prompt_id}  # fmt: skip
    except SessionError as exc:
        await sse_error(send, app.refusal(exc))
    else:
        await sse(send, "result", final)
    await end_body(send)


async def _while_connected(
    app: HttpApp,
    receive: Receive,
    tell: Callable[[], Awaitable[None]],
    on_gone: Callable[[], Awaitable[None]] | None,
) -> tuple[bool, bool]:
    """Run ``tell`` until it returns, the client hangs up (then ``on_gone``, shielded)
    or the drain ends the stream; whether the client went, whether the drain did."""
    gone = False
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            nonlocal gone
            await until_disconnect(receive)
            gone = True
            if on_gone is not None:
                with trio.CancelScope(shield=True):
                    await on_gone()
            nursery.cancel_scope.cancel()  # stop streaming: the socket goes now

        nursery.start_soon(watch)
        with app.drain.stream() as closing:
            await tell()
        nursery.cancel_scope.cancel()
    return gone, closing.cancelled_caught and not gone


def resume_point(scope: Scope, query: Mapping[str, list[str]]) -> EventId | int | None:
    """Where a client resumes: the ``Last-Event-ID`` header (what an ``EventSource``
    sends when it reconnects) or ``?after=`` -- an event id ``<turn>.<index>`` (a
    stream's ``id:``) or a number of turns; None if it names none. Anything else is a
    400 before anything runs."""
    raw = last_event_id(scope)
    if raw is None and query.get("after"):
        raw = query["after"][-1]
    if raw is None:
        return None
    try:
        return parse_event_id(raw)
    except SessionError as exc:
        raise HttpError(400, "bad_event_id", exc.message) from None


def position(scope: Scope, query: Mapping[str, list[str]], info: SessionInfo) -> EventId | int:
    """Where ``/events`` starts: after the event (or turn) the client names, else
    from now (after the session's recorded turns)."""
    after = resume_point(scope, query)
    if after is None:
        return info.turns
    try:
        check_reachable(after, info.turns)  # a 400 before the stream begins
    except SessionError as exc:
        raise HttpError(400, "bad_event_id", exc.message) from None
    return after


async def events(
    app: HttpApp, info: SessionInfo, after: EventId | int, receive: Receive, send: Send
) -> None:
    """``GET /sessions/{id}/events``: the session's events after turn ``after`` until
    the client hangs up or the server shuts down (a ``shutdown`` event ends it then);
    each recorded turn carries its position as the SSE ``id`` (resume from it with
    ``Last-Event-ID``); an ``: idle`` comment after each quiet heartbeat. The follow
    has begun (in process: subscribed) before the client is told ``subscribed``."""
    followed = app.backend.follow(info, after)
    # a small hand-over: a client slower than the session fills its watcher's buffer
    # (the backend's bound), and is dropped there, never holding up the cast
    told, heard = trio.open_memory_channel[SessionEvent](HAND_OVER)

    async def listen(task_status: trio.TaskStatus[None]) -> None:
        async with told, contextlib.aclosing(followed):
            task_status.started()  # the caller goes on once this task first blocks
            async for event in followed:
                await told.send(event)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_until_gone, receive, nursery.cancel_scope)
        with app.drain.stream() as closing:
            async with trio.open_nursery() as following:
                await following.start(listen)
                await start_sse(send)
                await sse_comment(send, "subscribed")
                await _pump(heard, send)
                following.cancel_scope.cancel()
        if closing.cancelled_caught:  # the server shuts down: say so, end the stream
            await sse(send, "shutdown", {"type": "shutdown"})
            await end_body(send)
        nursery.cancel_scope.cancel()


async def _pump(heard: trio.MemoryReceiveChannel[SessionEvent], send: Send) -> None:
    """Send what the follow tells, a heartbeat comment whenever it is quiet."""
    async with heard:
        while True:
            with trio.move_on_after(heartbeat_s()) as idle:
                try:
                    event = await heard.receive()
                except trio.EndOfChannel:
                    return
            if idle.cancelled_caught:
                await sse_comment(send, "idle")
                continue
            await sse(send, event.type, event.data, event_id=event_id(event))
            if event.type == "dropped":
                return  # the backend let this watcher go: the client resumes
