"""An HTTP session API: the same sessions as ACP, over HTTP with server-sent events.

A small ASGI application (no framework: seven routes) served by hypercorn's
trio worker, so the server runs in the same trio world as the entities it
serves -- cancellation, nurseries and the loom behave exactly as under ACP and
the CLI (PROD-1). Sessions come from the same :class:`SessionHub` as ACP's.

Routes (JSON in and out; errors are ``{"error": {"code", "message"}}``):

* ``GET  /health`` -- liveness, and what the cantrip is;
* ``GET  /openapi.json`` -- this API as an OpenAPI 3.1 document, generated from
  the pydantic models that validate the requests (:mod:`._api`);
* ``POST /sessions`` -- summon an entity: ``{"session_id", "entity_id"}`` (201);
* ``GET  /sessions`` -- the live sessions;
* ``GET  /sessions/{id}`` -- one session (a session in the loom file is resumed);
* ``POST /sessions/{id}/prompt`` -- ``{"prompt": ...}`` (also ``intent``,
  ``content``, text blocks): one cast; the answer is the cast's result, or,
  with ``Accept: text/event-stream`` or ``?stream=1``, a stream of its events
  ending with a ``result`` event; 409 while another prompt runs;
* ``POST /sessions/{id}/cancel`` -- cancel the running prompt, or the one the body
  names (``prompt_id``, ``idempotency_key``), or with ``{"next": true}`` the next one
  to start (recorded as ``cancelled``; the session stays): ``{"cancelled", "target"}``;
* ``GET  /sessions/{id}/thread`` -- the session's turns, root first;
* ``GET  /sessions/{id}/events`` -- server-sent events of every prompt of the
  session from now on (heartbeat comments keep idle connections open).

Under load and at shutdown (issue 24; :mod:`cantrip.protocols.middleware._lifecycle`):
``POST /sessions`` and ``POST /sessions/{id}/prompt`` accept an
``Idempotency-Key`` header (a repeat returns the recorded result, or joins the
running cast); every prompt gets an id at once (``Prompt-Id``, a stream's first
event) that a cancel can name, and a cancel says what it cancelled -- with nothing
running and nothing named, nothing; ``?cancel_on_disconnect=1``
cancels a streamed prompt whose client hangs up; too many running prompts, or a
server shutting down, get ``503`` with ``Retry-After``.

Before a request reaches a route, :mod:`._guard` has checked its Host, Origin,
token, content type, size and JSON; :mod:`._limits` bounds the sessions kept in
memory (idle ones are dropped and resumed from the loom when named again).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping
from typing import Any

import trio

from cantrip._approval import Decision, PauseError
from cantrip._cantrip import Cantrip
from cantrip._errors import CantripError
from cantrip._outcome import CastResult, result_dict
from cantrip._providers import ProviderScope
from cantrip._redact import get_logger
from cantrip.llm._stream import Event
from cantrip.protocols.a2a import _server as _a2a
from cantrip.protocols.a2a._handler import A2AFront
from cantrip.protocols.a2a._push import Pushes
from cantrip.protocols.agui._run import serve_agui
from cantrip.protocols.asgi._openapi import CancelRequest
from cantrip.protocols.asgi._requests import (
    idempotency_key,
    prompt_intent,
    read_body,
    until_disconnect,
)
from cantrip.protocols.asgi._responses import (
    HttpError,
    Receive,
    Scope,
    Send,
    end_body,
    heartbeat_s,
    sse,
    sse_comment,
)
from cantrip.protocols.http._shell import ServerShell, serve_asgi, start_prompt_stream
from cantrip.protocols.middleware._guard import Guard
from cantrip.protocols.middleware._lifecycle import Drain, ServeOptions
from cantrip.protocols.middleware._limits import SessionLimits, make_room
from cantrip.protocols.sessions._hub import (
    Prompt,
    Session,
    SessionError,
    SessionHub,
    event_dict,
    turn_dict,
)
from cantrip.protocols.sessions._idempotency import keyed_prompt_id
from cantrip.protocols.sessions._process import ProcessBackend
from cantrip.protocols.viewer._app import Viewer

log = get_logger("cantrip.http")

PROMPT_SCOPE_KEY = "cantrip.prompt"
"""Where a prompt request's scope carries its :class:`Prompt` from the moment it
arrives (the guard reads its body) to its route, so a cancel meanwhile is kept."""


class HttpApp(ServerShell):
    """The ASGI application: one cantrip, its sessions, its entities in this process."""

    def __init__(
        self,
        spell: Cantrip,
        options: ServeOptions | None = None,
        limits: SessionLimits | None = None,
    ) -> None:
        self.spell = spell
        self.options = options or ServeOptions()
        self.hub = SessionHub(
            spell,
            sticky_cancel_s=self.options.sticky_cancel_s,
            max_running=self.options.max_running,
        )
        self.limits = limits or SessionLimits()
        # the browser viewer at / and /api/, over the seam (it runs no casts: no nursery)
        self.viewer = Viewer.over(ProcessBackend(self.hub, None))
        # A2A (Agent Card + JSON-RPC) when the a2a-sdk extra is installed.
        self.pushes = Pushes(allow_private=self.options.a2a_push_private)
        self.a2a: A2AFront | None = None
        """A2A's card and endpoint over the session backend (made by the lifespan,
        where the backend's nursery is)."""
        self.drain = Drain()
        self._casts: trio.Nursery | None = None
        """Where prompts run while the server lives (set by its lifespan): a request
        waits on its cast but does not hold it, so a client that hangs up frees its
        connection at once and the cast still ends, recorded (issue 29)."""

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self.hub.aclose()

    async def shutdown(self) -> None:
        await self.drain.close(self.hub, self.options)

    @contextlib.asynccontextmanager
    async def _lifetime(self) -> AsyncIterator[None]:
        # The nursery the sessions' gate providers (MCP sessions) live in.
        providers = await ProviderScope.enter()
        self.hub.nursery = providers.nursery
        try:
            # A2A push notifications are delivered as long as we serve, in a nursery of
            # their own: the casts' nursery holds prompts only (what a drain waits for).
            async with trio.open_nursery() as background:
                if _a2a.available():  # its casts run in the providers' nursery
                    backend = ProcessBackend(self.hub, providers.nursery)
                    self.a2a = A2AFront(
                        self.spell, backend, pushes=self.pushes, admit=self._a2a_admit
                    )
                    await background.start(self.a2a.run)
                try:
                    async with trio.open_nursery() as casts:
                        self._casts = casts
                        try:
                            yield
                        finally:
                            self._casts = None
                            # the casts still running here are cut off; the entities
                            # close their providers before the providers' nursery goes
                            await self.aclose()
                finally:
                    background.cancel_scope.cancel()
        finally:
            self.hub.nursery = None
            await providers.aclose()

    async def _a2a_admit(self, session_id: str | None) -> None:
        """Room for the session in memory, as for the HTTP API."""
        adding = session_id is None or session_id not in self.hub.sessions
        await make_room(self.hub, self.limits, adding=adding)

    async def _shutting_down(self) -> None:
        await self.aclose()

    async def _before_route(self, scope: Scope, receive: Receive, send: Send) -> bool:
        if await self.viewer.dispatch(scope, receive, send):  # the browser viewer
            return True
        if self.a2a is not None and await self.a2a.dispatch(scope, receive, send):
            return True
        log.debug("%s %s", scope["method"], scope["path"])
        return False

    async def _agui(self, receive: Receive, send: Send) -> None:
        @contextlib.asynccontextmanager
        async def admitted() -> AsyncIterator[None]:
            await self._make_room(adding=True)
            yield

        async with contextlib.AsyncExitStack() as stack:
            casts = self._casts  # no lifespan: the request holds its cast
            if casts is None:
                casts = await stack.enter_async_context(trio.open_nursery())
            await serve_agui(
                ProcessBackend(self.hub, casts),
                receive,
                send,
                gate_names=self.hub.spell.circle.gate_names,
                admitted=admitted,
                drain=self.drain,
            )

    async def _create(self, key: str | None) -> tuple[dict[str, Any], bool]:
        await self._make_room(adding=True)
        session, created = self.hub.create(key)
        return _session_info(session), created

    async def _list(self) -> list[dict[str, Any]]:
        return [_session_info(s) for s in self.hub.sessions.values()]

    def _info(self, session: Session) -> dict[str, Any]:
        return _session_info(session)

    async def _read_prompt(self, session: Session, scope: Scope, receive: Receive) -> str:
        # From here until it starts (or fails) the prompt is arriving: a cancel that
        # names it, or an unnamed one, cuts it off as it starts.
        handle = _handle(scope, session)
        if handle not in session.arriving:
            session.arriving.append(handle)
        try:
            return prompt_intent(await read_body(receive))
        except BaseException:
            _depart(session, handle)
            raise

    async def _prompt_result(
        self,
        session: Session,
        intent: str,
        key: str | None,
        on_busy: str,
        scope: Scope,
        receive: Receive,
    ) -> dict[str, Any] | None:
        handle = _handle(scope, session)
        answer: dict[str, Any] = {}
        ended = trio.Event()

        async def run() -> None:
            try:
                outcome = await self._prompt(
                    session, intent, key=key, on_busy=on_busy, handle=handle
                )
                answer["result"] = {**result_dict(outcome, session), "prompt_id": handle.id}
            except HttpError as exc:
                answer["error"] = exc
            finally:
                _depart(session, handle)
                ended.set()

        if self._casts is None:  # no lifespan: the request holds its cast
            await run()
        else:  # the cast runs on if the client hangs up; its connection goes at once
            self._casts.start_soon(run)
            if not await _until_either(ended, receive):
                return None
        if "error" in answer:
            raise answer["error"]
        result: dict[str, Any] = answer["result"]
        return result

    async def _steer(self, session: Session, text: str) -> dict[str, Any]:
        try:
            return self.hub.steer(session, text)
        except SessionError as exc:
            raise self._session_error(exc) from None

    async def _pending_calls(self, session: Session) -> list[dict[str, Any]]:
        return [p.to_dict() for p in session.entity.pending]

    async def _cancel(self, session: Session, target: CancelRequest) -> dict[str, Any]:
        return self.hub.request_cancel(
            session,
            prompt_id=target.prompt_id,
            key=target.idempotency_key,
            next_prompt=target.next,
        )

    async def _turns(self, session: Session) -> list[dict[str, Any]]:
        return [turn_dict(t) for t in self.hub.history(session)]

    @contextlib.contextmanager
    def arriving(self, scope: Scope) -> Iterator[None]:
        """While a prompt's body is still arriving (read by the guard), it is known to
        its session (:attr:`Session.arriving`), so a cancel meanwhile -- unnamed, or
        naming its Idempotency-Key -- applies to it; the scope carries it on to the
        route, which hands out its id."""
        parts = [p for p in scope.get("path", "").split("/") if p]
        session = None
        if (
            scope.get("method") == "POST"
            and len(parts) == 3
            and parts[0:3:2]
            == [
                "sessions",
                "prompt",
            ]
        ):
            session = self.hub.sessions.get(parts[1])
        if session is None:
            yield
            return
        handle = _handle(scope, session)
        session.arriving.append(handle)
        try:
            yield
        finally:
            _depart(session, handle)

    async def _health_report(self) -> dict[str, Any]:
        return self._health()

    def _health(self) -> dict[str, Any]:
        circle = self.spell.circle
        return {
            "ok": True,
            "mode": "process",
            "running": self.hub.running,
            "cantrip": self.spell.id,
            "medium": circle.medium.name,
            "gates": list(circle.gate_names),
            "persistent": self.hub.persistent,
            "sessions": len(self.hub.sessions),
        }

    async def _answer(
        self, session: Session, pause_id: str, decision: Decision
    ) -> dict[str, Any] | None:
        try:
            outcome = await self.hub.answer(session, pause_id, decision)
        except PauseError as exc:
            raise HttpError(409, "pause_answered", str(exc)) from None
        except SessionError as exc:
            raise self._session_error(exc) from None
        return None if outcome is None else result_dict(outcome, session)

    async def _session(self, session_id: str) -> Session:
        await self._make_room(adding=session_id not in self.hub.sessions)
        try:
            session = self.hub.get(session_id)
        except SessionError as exc:
            raise self._session_error(exc) from None  # not_found: 404
        session.last_used = trio.current_time()
        return session

    async def _make_room(self, *, adding: bool) -> None:
        try:
            await make_room(self.hub, self.limits, adding=adding)
        except SessionError as exc:
            raise self._unavailable("too_many_sessions", exc.message) from None

    async def _prompt(
        self,
        session: Session,
        intent: str,
        on_event: Callable[[Event], None] | None = None,
        *,
        key: str | None = None,
        on_busy: str = "reject",
        handle: Prompt | None = None,
    ) -> CastResult | None:
        try:
            return await self.hub.prompt(
                session, intent, on_event=on_event, key=key, on_busy=on_busy, handle=handle
            )
        except SessionError as exc:
            raise self._session_error(exc) from None
        except CantripError as exc:
            raise HttpError(500, "cast_failed", f"the cast failed: {exc}") from None
        except Exception as exc:
            log.exception("session %s: the entity crashed", session.id)
            raise HttpError(500, "crashed", f"the entity crashed: {exc!r}") from None
        finally:
            session.last_used = trio.current_time()

    async def _prompt_stream(
        self,
        session: Session,
        intent: str,
        key: str | None,
        scope: Scope,
        receive: Receive,
        send: Send,
        cancel_on_disconnect: bool,
        on_busy: str,
    ) -> None:
        handle = _handle(scope, session)
        try:
            await self._stream_prompt(
                session, intent, key, handle, receive, send, cancel_on_disconnect, on_busy
            )
        finally:
            _depart(session, handle)

    async def _stream_prompt(
        self,
        session: Session,
        intent: str,
        key: str | None,
        handle: Prompt,
        receive: Receive,
        send: Send,
        cancel_on_disconnect: bool,
        on_busy: str,
    ) -> None:
        current = session.current
        try:
            joins = key is not None and (
                (current is not None and current.key == key)
                or self.hub.replay(session, intent, key) is not None
            )
        except SessionError as exc:  # the key was used for another prompt
            raise self._session_error(exc) from None
        if session.running is not None and not joins and on_busy == "reject":
            raise HttpError(409, "busy", f"session {session.id} is already running a prompt")
        if joins and current is not None and current.key == key:
            handle.id = current.id  # this request is that prompt
        await start_prompt_stream(send, handle.id, session.id, key)
        events_send, events = trio.open_memory_channel[Event](float("inf"))

        def sink(event: Event) -> None:
            # after a hang-up the stream is gone: the cast goes on, unwatched
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                events_send.send_nowait(event)

        final: dict[str, Any] = {}
        gone = trio.Event()

        async def run() -> None:
            async with events_send:
                if gone.is_set():
                    return  # hung up (asking to cancel) before the cast began
                try:
                    outcome = await self._prompt(
                        session,
                        intent,
                        on_event=None if joins else sink,
                        key=key,
                        on_busy=on_busy,
                        handle=handle,
                    )
                except HttpError as exc:
                    final["error"] = {"code": exc.code, "message": exc.message}
                    return
                final["result"] = {**result_dict(outcome, session), "prompt_id": handle.id}

        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                await until_disconnect(receive)
                gone.set()
                if cancel_on_disconnect and session.sink is sink:  # our cast runs: cancel it
                    log.info("session %s: the client hung up; cancelling its prompt", session.id)
                    self.hub.cancel(session)
                if self._casts is not None:
                    nursery.cancel_scope.cancel()  # stop streaming: the socket goes now

            nursery.start_soon(watch)
            # The cast runs in the server's own nursery when there is one, so a client
            # that hangs up is let go at once (hypercorn closes a connection only when
            # its request's task ends) while its cast runs on and is recorded.
            (self._casts or nursery).start_soon(run)
            async with events:
                async for event in events:
                    data = event_dict(event)
                    await sse(send, data["type"], data)
            nursery.cancel_scope.cancel()  # the watcher: the cast has ended
        if gone.is_set():
            return  # nobody to tell
        if "error" in final:
            await sse(send, "error", {"error": final["error"]})
        else:
            await sse(send, "result", final["result"])
        await end_body(send)

    async def _events(self, session: Session, receive: Receive, send: Send) -> None:
        subscription = session.subscribe()

        async def pump(closing: trio.CancelScope) -> None:
            async with subscription:
                while not closing.cancel_called:
                    with trio.move_on_after(heartbeat_s()) as idle:
                        event = await subscription.receive()
                    if idle.cancelled_caught:
                        await sse_comment(send, "idle")
                        continue
                    data = event_dict(event)
                    await sse(send, data["type"], data)

        await self._event_stream(receive, send, pump)


# -- helpers ------------------------------------------------------------------------


def _handle(scope: Scope, session: Session) -> Prompt:
    """The request's :class:`Prompt`: the one registered when it arrived, or a new one
    (kept in the scope from then on). A bad Idempotency-Key is left to the route."""
    handle = scope.get(PROMPT_SCOPE_KEY)
    if isinstance(handle, Prompt):
        return handle
    try:
        key = idempotency_key(scope)
    except HttpError:
        key = None
    handle = Prompt("", key)
    if key is not None:
        handle.id = keyed_prompt_id(session.entity_id, key)
    if isinstance(scope, MutableMapping):
        scope[PROMPT_SCOPE_KEY] = handle
    return handle


async def _until_either(ended: trio.Event, receive: Receive) -> bool:
    """Wait for ``ended`` or the client hanging up; True if ``ended`` came first."""
    async with trio.open_nursery() as nursery:

        async def hang_up() -> None:
            await until_disconnect(receive)
            nursery.cancel_scope.cancel()

        nursery.start_soon(hang_up)
        await ended.wait()
        nursery.cancel_scope.cancel()
    return ended.is_set()


def _depart(session: Session, handle: Prompt) -> None:
    """The prompt is no longer arriving (it started, failed, or was answered)."""
    if handle in session.arriving:
        session.arriving.remove(handle)


def _session_info(session: Session) -> dict[str, Any]:
    return {
        "session_id": session.id,
        "entity_id": session.entity_id,
        "running": session.running is not None,
        "turns": len(session.entity.turns),
    }


# -- serving --------------------------------------------------------------------------


async def serve_http(
    spell: Cantrip,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    options: ServeOptions | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
    guard: Guard | None = None,
    limits: SessionLimits | None = None,
    read_timeout_s: int = 30,
) -> None:
    """Serve the HTTP API with hypercorn's trio worker until ``shutdown_trigger``
    returns (or the task is cancelled); ``task_status`` gets the bound URLs.

    When ``shutdown_trigger`` returns, the server drains first (see
    :class:`~cantrip.protocols.middleware._lifecycle.Drain`): every open request is
    answered before hypercorn stops listening and closes connections.

    ``guard`` is the request policy (default: loopback names only, no token);
    it refuses to start on a non-loopback address without a token
    (:class:`~cantrip.protocols.middleware._guard.BindError`). ``read_timeout_s`` bounds
    each socket read, so a client that stops sending is dropped."""
    await trio.to_thread.run_sync(_a2a.available)  # the SDK's import, off the loop
    app = HttpApp(spell, options, limits)
    guard = guard if guard is not None else Guard(bind_host=host)
    guard.check_bind()
    try:
        await serve_asgi(
            app,
            _a2a.jsonrpc_refusals(guard.wrap(app, app.arriving)),
            host,
            port,
            shutdown_trigger=shutdown_trigger,
            read_timeout_s=read_timeout_s,
            task_status=task_status,
        )
    finally:
        await app.aclose()
